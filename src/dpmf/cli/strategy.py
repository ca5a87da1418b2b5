"""``dpmf strategy``: build, save and inspect matrix-factorization strategies. Parse, call, print."""

from __future__ import annotations

import json
from enum import Enum
from typing import Optional

import numpy as np
import typer
from rich.table import Table

from dpmf.cli.console import _fail, out
from dpmf.errors import DPMFError, InvalidParameterError

app = typer.Typer(help="Build and inspect correlated-noise strategies (encoders C).", no_args_is_help=True)


class Schema(str, Enum):
    single = "single"
    fixed_epoch = "fixed-epoch"
    min_sep = "min-sep"


def _participation(schema: Schema, epochs: Optional[int], min_sep: Optional[int], n: int):
    from dpmf.strategies import FixedEpochParticipation, Participation

    if schema is Schema.single:
        return Participation(1, 1)
    if epochs is None:
        raise InvalidParameterError(f"--epochs is required with --participation {schema.value}")
    if schema is Schema.fixed_epoch:
        if n % epochs:
            raise InvalidParameterError(f"--epochs must divide the {n} steps for fixed-epoch participation")
        return FixedEpochParticipation(epochs, n // epochs)
    return Participation(epochs, min_sep if min_sep is not None else n // epochs)


@app.command()
def build(
    kind: str = typer.Argument(
        ..., help="identity, tree, sqrt-toeplitz, banded-toeplitz, banded, bsr, bisr, blt, optimal, fft or matrix."
    ),
    steps: int = typer.Option(..., "--steps", help="Number of steps n (rows of C)."),
    epochs: int = typer.Option(1, "--epochs", help="Epochs k the optimal strategy is optimized for."),
    bands: Optional[int] = typer.Option(None, "--bands", help="Bands for banded-toeplitz, banded, bsr, bisr."),
    buffers: int = typer.Option(2, "--buffers", help="Buffers for blt."),
    matrix: Optional[str] = typer.Option(None, "--matrix", help="For kind 'matrix': your encoder as a .npy file."),
    out_path: str = typer.Option(..., "--out", help="Where to write the strategy (.npz)."),
) -> None:
    """Build a strategy and save it. Example: dpmf strategy build optimal --steps 128 --epochs 2 --out opt.npz"""
    from dpmf.strategies import catalog

    try:
        mat = None
        if matrix is not None:
            try:
                mat = np.load(matrix, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise InvalidParameterError(f"--matrix: cannot read {matrix}: {exc}") from None
        strat = catalog.build(kind, steps, epochs=epochs, bands=bands, buffers=buffers, matrix=mat)
        catalog.save(strat, out_path)
    except DPMFError as exc:
        _fail(str(exc))
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
        strat = catalog.load(path)
        summary = catalog.summarize(strat, _participation(participation, epochs, min_sep, strat.n))
    except DPMFError as exc:
        _fail(str(exc))
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
    out.print(table)
