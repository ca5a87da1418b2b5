"""``dpmf strategy``: build, save and inspect matrix-factorization strategies. Parse, call, print."""

from __future__ import annotations

import json
from enum import Enum
from typing import Optional

import typer
from rich.table import Table

from dpmf.cli.console import fail, out, typer_app
from dpmf.errors import DPMFError, InvalidParameterError
from dpmf.files import check_output_file, read_array

app = typer_app(help="Build and inspect correlated-noise strategies (encoders C).", no_args_is_help=True)


class Schema(str, Enum):
    single = "single"
    fixed_epoch = "fixed-epoch"
    min_sep = "min-sep"


def _participation(schema: Schema, epochs: Optional[int], min_sep: Optional[int], n: int):
    from dpmf.strategies import FixedEpochParticipation, Participation

    if schema is Schema.single:
        return Participation(1, 1)
    from dpmf import validation as _v

    if epochs is None:
        raise InvalidParameterError(f"--epochs is required with --participation {schema.value}")
    epochs = _v.positive_int("epochs", epochs)
    if min_sep is not None:
        min_sep = _v.positive_int("min_sep", min_sep)
    if schema is Schema.fixed_epoch:
        if n % epochs:
            raise InvalidParameterError(f"--epochs must divide the {n} steps for fixed-epoch participation")
        return FixedEpochParticipation(epochs, n // epochs)
    return Participation(epochs, min_sep if min_sep is not None else n // epochs)


class Solver(str, Enum):
    newton = "newton"
    fixed_point = "fixed-point"


class Constraints(str, Enum):
    nonneg = "nonneg"
    orthogonal = "orthogonal"
    all_signs = "all_signs"


def _learning_rates(value: Optional[str], cooldown: Optional[int], steps: int):
    """``--learning-rates`` (a .npy file or comma-separated numbers) or ``--cooldown``."""
    from dpmf.strategies.workloads import linear_cooldown

    if value is not None and cooldown is not None:
        raise InvalidParameterError("give either --learning-rates or --cooldown, not both")
    if cooldown is not None:
        return linear_cooldown(steps, cooldown)
    if value is None:
        return None
    if value.endswith((".npy", ".npz")):
        return read_array(value, "learning-rate file (--learning-rates)")
    try:
        import numpy as np

        return np.array([float(x) for x in value.split(",")])
    except ValueError:
        raise InvalidParameterError(
            f"--learning-rates must be a .npy file or comma-separated numbers, got {value!r}"
        ) from None


@app.command()
def build(
    kind: str = typer.Argument(
        ..., help="identity, tree, sqrt-toeplitz, banded-toeplitz, banded, bsr, bisr, band-inv, blt, optimal, fft or matrix."
    ),
    steps: Optional[int] = typer.Option(
        None, "--steps", help="Number of steps n (rows of C); required except for kind 'matrix' (the matrix's size)."
    ),
    epochs: int = typer.Option(1, "--epochs", help="Epochs k the optimal, blt, banded-toeplitz, band-inv strategy is for."),
    bands: Optional[int] = typer.Option(None, "--bands", help="Bands for banded-toeplitz, banded, bsr, bisr; of C^-1 for band-inv."),
    buffers: int = typer.Option(2, "--buffers", help="Buffers for blt."),
    matrix: Optional[str] = typer.Option(None, "--matrix", help="For kind 'matrix': your encoder as a .npy file."),
    momentum: float = typer.Option(
        0.0, "--momentum", help="Workload: SGD with momentum beta in [0, 1) (optimal is optimized for it)."
    ),
    learning_rates: Optional[str] = typer.Option(
        None, "--learning-rates", help="Workload: per-step learning-rate multipliers (> 0), .npy or 'a,b,c,...'."
    ),
    cooldown: Optional[int] = typer.Option(
        None, "--cooldown", help="Workload: learning rate 1 then a linear cooldown to 0.05 over this many last steps."
    ),
    solver: Solver = typer.Option(
        Solver.newton, "--solver", help="optimal: newton (multi-epoch dual) or fixed-point (single epoch, §4.4)."
    ),
    constraints: Constraints = typer.Option(
        Constraints.nonneg, "--constraints",
        help="optimal with newton: nonneg (Eq. 35), orthogonal, all_signs (scalar); band-inv: nonneg (C >= 0) or all_signs.",
    ),
    out_path: str = typer.Option(..., "--out", help="Where to write the strategy (.npz; its folder must exist)."),
    force: bool = typer.Option(
        False, "--force", help="Build even when the up-front estimate says it would take more than 10 minutes "
        "or more memory than this machine has."
    ),
) -> None:
    """Build a strategy and save it. Example: dpmf strategy build optimal --steps 128 --epochs 2 --out opt.npz

    With --momentum / --learning-rates / --cooldown the workload is SGD with momentum and that
    schedule (A = tri(n) diag(lr) M_beta); 'optimal' is optimized for it, every kind records it so
    that 'dpmf strategy show' reports the error on it."""
    from dpmf.strategies import catalog

    try:
        check_output_file(out_path, "--out", suffixes=(".npz",))  # before any work; '--strategy' needs .npz
        mat = None
        if matrix is not None:
            if kind != "matrix":
                raise InvalidParameterError(f"--matrix is only used with kind 'matrix', not {kind!r}")
            mat = read_array(matrix, "matrix file (--matrix)")
            if mat.ndim != 2 or mat.shape[0] != mat.shape[1]:
                raise InvalidParameterError(f"--matrix {matrix}: expected a square n x n encoder, got shape {mat.shape}")
            if steps is None:
                steps = mat.shape[0]
            elif steps != mat.shape[0]:
                raise InvalidParameterError(f"--steps {steps} does not match the {mat.shape[0]} x {mat.shape[0]} matrix")
        elif kind == "matrix":
            raise InvalidParameterError("kind 'matrix' needs --matrix FILE.npy (the n x n lower-triangular encoder)")
        if steps is None:
            raise InvalidParameterError(f"--steps is required for kind {kind!r}")
        from dpmf.accounting.cost import check_cost, strategy_build_cost

        check_cost(strategy_build_cost(kind, steps, epochs=epochs, bands=bands), force=force, hint="use fewer --steps")
        lr = _learning_rates(learning_rates, cooldown, steps)
        workload = catalog.workload_spec(steps, momentum, lr)
        with out.status(f"building {kind} for {steps} steps ...") as status:

            def progress(iteration, loss, gap):
                status.update(f"optimizing: iteration {iteration}, loss {loss:.6g}, gap {gap:.2e}")

            strat = catalog.build(
                kind,
                steps,
                epochs=epochs,
                bands=bands,
                buffers=buffers,
                matrix=mat,
                workload=workload,
                solver=solver.value,
                constraints=constraints.value,
                callback=progress,
            )
        catalog.save(strat, out_path, workload=workload)
    except DPMFError as exc:
        fail(str(exc))
    except MemoryError:
        fail("out of memory building the strategy; use fewer --steps")
    out.print(f"wrote {strat.describe()['name']} strategy for {steps} steps to {out_path}", highlight=False)


@app.command()
def show(
    path: str = typer.Argument(..., help="A strategy file written by 'dpmf strategy build'."),
    participation: Schema = typer.Option(Schema.single, "--participation", help="single, fixed-epoch or min-sep."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Participations k (fixed-epoch, min-sep)."),
    min_sep: Optional[int] = typer.Option(None, "--min-sep", help="Minimum separation b (min-sep; default n/k)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Sensitivity under a participation schema, and the prefix-sum RMSE and max error per unit
    noise multiplier with the strategy normalized to sensitivity 1."""
    from dpmf.strategies import catalog

    try:
        strat, workload = catalog.read(path)
        summary = catalog.summarize(strat, _participation(participation, epochs, min_sep, strat.n), workload)
    except DPMFError as exc:
        fail(str(exc))
    if as_json:
        out.print_json(json.dumps(summary))
        return
    table = Table(title=f"{summary['strategy']['name']} strategy, n = {strat.n}")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    exact = "exact" if summary["sensitivity_exact"] else "upper bound"
    table.add_row("sensitivity", f"{summary['sensitivity']:.6g} ({exact}, {summary['sensitivity_method']})")
    table.add_row("prefix-sum RMSE per unit sigma (sens. 1)", f"{summary['rmse']:.6g}")
    table.add_row("max error per unit sigma (sens. 1)", f"{summary['max_error']:.6g}")
    if "workload" in summary:
        w = summary["workload"]
        table.add_row("workload", f"momentum {w['momentum']:g}" + (", learning-rate schedule" if w["learning_rates"] else ""))
        table.add_row("workload RMSE per unit sigma (sens. 1)", f"{summary['workload_rmse']:.6g}")
        table.add_row("workload max error per unit sigma (sens. 1)", f"{summary['workload_max_error']:.6g}")
        table.add_row("workload total error sqrt(loss) (sens. 1)", f"{summary['workload_total_error']:.6g}")
    out.print(table)
