"""The ``dpmf`` command line: parse, call the library, print. No math here.

Commands: ``account`` (epsilon of a configuration), ``calibrate`` (noise for a target epsilon),
``plan`` (rank every configuration for a training run).
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
import typing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from dpmf._version import __version__
from dpmf.cli.console import cli_errors, cli_progress, err, note_workers, out, typer_app
from dpmf.cli.specs import (
    FRESH_SLOTS,
    NUM_SELECTED,
    WARM_START,
    SamplingName,
    build_scheme,
    build_strategy,
    check_options_used,
    is_strategy_file,
)
from dpmf.errors import DPMFError, InvalidParameterError, UnsupportedConfigurationError
from dpmf.files import check_output_dir

app = typer_app(
    name="dpmf",
    help=(
        "Differentially private training with correlated noise (DP-MF, DP-FTRL, BandMF) and "
        "its privacy accounting with amplification.\n\n"
        "Every epsilon is for zero-out adjacency, the worst of the add and remove directions, "
        "and is a proven upper bound unless the output says ESTIMATE."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


#: ``dpmf plan --budget`` default (seconds): the library's, :data:`dpmf.planning.budget.DEFAULT_BUDGET`.
DEFAULT_PLAN_BUDGET = 25.0  # (tests/cli check it equals the library's; a literal keeps `import dpmf.cli` light)


class MethodName(str, Enum):
    auto = "auto"
    pld = "pld"
    unamplified = "unamplified"
    mmcc = "mmcc"
    allocation_pld = "allocation_pld"
    truncated_pld = "truncated_pld"
    allocation = "allocation"
    montecarlo = "montecarlo"


def _version_callback(value: bool) -> None:
    if value:
        out.print(f"dpmf {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Optional[bool] = typer.Option(
        None, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """dpmf command line."""
    from dpmf.cli.console import progress_settings

    with cli_errors():
        progress_settings()  # a bad DPMF_PROGRESS / DPMF_PROGRESS_INTERVAL is refused before any work


def _build(strategy: str, sampling: SamplingName, steps, bands, force: bool, **scheme_options):
    """(strategy, scheme) from the options: unused options refused, a strategy file's size used
    when --steps is not given, and the cost of building the strategy checked before it starts."""
    from dpmf.accounting.cost import check_cost, strategy_build_cost

    strat = None
    if is_strategy_file(strategy):
        strat = build_strategy(strategy, steps)
        steps = strat.n
    elif steps is None:
        raise InvalidParameterError("--steps is required")
    scheme = build_scheme(sampling, steps, **scheme_options)  # missing and bad values first (cheap)
    check_options_used(
        strategy, sampling, **{"--bands": bands, "--epochs": scheme_options.get("epochs"),
                               "--sampling-prob": scheme_options.get("sampling_prob"),
                               "--min-sep": scheme_options.get("min_sep"),
                               "--warm-start": scheme_options.get("warm_start"),
                               "--max-batch-size": scheme_options.get("max_batch_size"),
                               "--dataset-size": scheme_options.get("dataset_size"),
                               "--num-selected": scheme_options.get("num_selected"),
                               "--fresh-slots": scheme_options.get("fresh_slots")},
    )
    if strat is not None:
        return strat, scheme
    epochs = scheme_options.get("epochs") or 1
    check_cost(strategy_build_cost(strategy, steps, epochs=epochs, bands=bands), force=force,
               hint="use fewer --steps")
    return build_strategy(strategy, steps, epochs=epochs, bands=bands), scheme


def _check_run_cost(strat, scheme, noise_multiplier, method, samples, force, *, target_epsilon=None,
                    delta=None) -> None:
    """Refuse, before it starts, a run estimated to take more than 10 minutes or more memory
    than the machine has (unless --force); say what to expect when it takes over a minute. For a
    calibration the estimate follows the search to where ``target_epsilon`` and ``delta`` end it."""
    from dpmf.accounting.cost import accounting_cost, check_cost

    est = accounting_cost(strat, scheme, noise_multiplier, method=method, calibrate=target_epsilon is not None,
                          num_samples=samples, target_epsilon=target_epsilon, delta=delta)
    check_cost(est, force=force, hint="use fewer --steps" + (" or a larger --noise-multiplier" if
                                                             target_epsilon is None else ""))
    _note_cost(est)


def _note_workers(method: MethodName, workers: int, *, calibrating: bool) -> None:
    """The note that --workers is capped at the CPUs (:func:`note_workers`), unless ``method`` does
    not take --workers at all: then ``dpmf.account`` refuses the option, and that error is the only
    line (an ignored option is an error, README)."""
    from dpmf.accounting.dispatch import METHODS

    m = METHODS.get(method.value)
    if m is None or "workers" in m.accepts(calibrating):
        note_workers(workers)


def _note_cost(est) -> None:
    if est.seconds > 60:
        err.print(f"note: this will take {est.describe()} (a rough estimate)", highlight=False)


_QUIET = typer.Option(False, "--quiet", "-q", help="No progress on stderr (also: environment DPMF_PROGRESS=off).")


def _check_montecarlo_samples(samples, delta) -> None:
    """``--method montecarlo`` at --delta: refuse up front a sample count whose estimate can only be
    infinite, saying how many samples it needs."""
    from dpmf import validation as _v
    from dpmf.accounting.montecarlo.accountant import samples_to_estimate

    s = 100_000 if samples is None else _v.positive_int("num_samples", samples)
    need = samples_to_estimate(delta)
    if s < need:
        raise InvalidParameterError(
            f"--samples {s:,} cannot give a finite Monte Carlo epsilon at --delta {delta:g}: the 99% upper "
            f"confidence bound on delta stays above it even with no privacy loss; use --samples {need:,} or "
            "more (or a larger --delta)"
        )


def _check_options(strat, scheme, method: MethodName, opts: dict, cache_dir, *, calibrating: bool) -> None:
    """Before the work: an option that the method(s) this run uses would ignore is refused
    (:func:`dpmf.accounting.dispatch.check_options`; under ``auto`` decided by the methods auto
    actually runs for this pair, as ``--method pld`` would), and only then is ``--cache-dir``
    created, so a refused run leaves no empty folder behind."""
    from dpmf.accounting.dispatch import check_options

    check_options(strat, scheme, method.value, opts, calibrating=calibrating)
    if cache_dir is not None:
        check_output_dir(cache_dir, "--cache-dir")  # before the work


def _interrupted(cache_dir, strat=None, scheme=None, method: str = "auto") -> None:
    """Ctrl-C during account/calibrate: say how to resume where a run can resume (MMCC saves its
    finished rows in --cache-dir); for the other accountants, just that it was interrupted."""
    try:
        from dpmf.accounting.dispatch import selected_methods

        mmcc = "mmcc" in selected_methods(strat, scheme, method)
    except Exception:  # (only deciding which message to print)
        mmcc = method == "mmcc"
    if mmcc and cache_dir is not None:
        err.print(
            f"interrupted; every finished MMCC row is saved in {cache_dir}: run the same command again "
            f"(with --cache-dir {cache_dir}) to resume where it stopped",
            highlight=False,
        )
    elif mmcc:
        err.print("interrupted (nothing saved; add --cache-dir DIR to make an MMCC run resumable)", highlight=False)
    else:
        err.print("interrupted", highlight=False)
    raise typer.Exit(code=130)


_STRATEGY = typer.Option(
    "identity",
    "--strategy",
    help="Encoder C: identity (DP-SGD, independent noise), tree, sqrt-toeplitz, banded-toeplitz, banded, bsr, "
    "bisr, band-inv (BandInvMF: banded C^-1; these five need --bands), blt, optimal, fft, or a FILE.npz from "
    "'dpmf strategy build'.",
)
_SAMPLING = typer.Option(
    SamplingName.poisson,
    "--sampling",
    help="Batch sampler: poisson (each example joins each step with --sampling-prob); cyclic-poisson "
    "(examples split into --min-sep groups, group t mod b active at step t, Poisson with --sampling-prob "
    "inside it); b-min-sep (Poisson over the examples that did not join in the last --min-sep - 1 steps; "
    "per-step rate p0 = 1/(1/p + b - 1)); balls-in-bins (each example --num-selected random steps per epoch, "
    "the same every epoch or --fresh-slots, --epochs); fixed-order (shuffle once, same order for --epochs epochs; no amplification).",
)
_STEPS = typer.Option(None, "--steps", help="Number of training steps (columns of C).")
_Q = typer.Option(
    None, "--sampling-prob", help="Sampling probability p in (0, 1]: per step (poisson), per active step "
    "(cyclic-poisson) or per available example (b-min-sep).",
)
_EPOCHS = typer.Option(None, "--epochs", help="Epochs for fixed-order / balls-in-bins sampling (must divide --steps).")
_MIN_SEP = typer.Option(
    None, "--min-sep", help="b: steps between two participations: the cycle length of cyclic-poisson (the "
    "library's cycle_length) or the min-sep of b-min-sep (min_sep)."
)
_WARM = WARM_START
_FORCE = typer.Option(
    False, "--force", help="Run even when the up-front estimate says it would take more than 10 minutes "
    "or more memory than this machine has."
)
_MAXB = typer.Option(
    None, "--max-batch-size", help="poisson, cyclic-poisson, b-min-sep: truncate/pad batches to this size."
)
_DATASET = typer.Option(
    None, "--dataset-size", help="with --max-batch-size: number of examples (needed to account truncation)."
)
_BANDS = typer.Option(None, "--bands", help="Bands of banded-toeplitz / banded / bsr / bisr strategies, of C^-1 for band-inv.")
_DELTA = typer.Option(..., "--delta", help="Target delta in (0, 1), e.g. 1e-6 (well below 1/dataset size).")
_METHOD = typer.Option(
    MethodName.auto,
    "--method",
    help="Accountant: auto = tightest valid proven bound; pld (DP-SGD, Poisson); truncated_pld (DP-SGD, Poisson "
    "with --max-batch-size); unamplified (no credit for sampling); mmcc (any non-negative C, Poisson or cyclic "
    "Poisson); allocation_pld (balls-in-bins: the random-allocation PLD, with its correlated-C members); allocation "
    "(balls-in-bins, Renyi + conditional composition); montecarlo (an ESTIMATE unless calibrated with "
    "certification).",
)
_SAMPLES = typer.Option(None, "--samples", help="Monte Carlo: number of privacy-loss samples.")
_SEED = typer.Option(None, "--seed", help="Monte Carlo: seed (default: drawn from the OS and reported).")
_WORKERS = typer.Option(None, "--workers", help="MMCC / Monte Carlo: worker processes (rows / sample chunks).")
_SCHEDULER = typer.Option(None, "--scheduler", help="MMCC / Monte Carlo: Dask scheduler address (tcp://host:port).")
_CACHE = typer.Option(
    None,
    "--cache-dir",
    help="MMCC: save every finished row PLD in this directory and reload saved rows, so the same "
    "command run again after an interruption resumes where it stopped (same result).",
)
_JSON = typer.Option(False, "--json", help="Print one JSON object instead of text.")


def _opt(name: str, annotation: object, default: object) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


#: The options ``account`` and ``calibrate`` share (one per :class:`RunOptions` field), in the order
#: ``--help`` lists them: the configuration, then (after each command's own noise or epsilon
#: option) from ``delta`` on the accountant and output.
_RUN_OPTIONS = dict(
    strategy=_STRATEGY, sampling=_SAMPLING, steps=_STEPS, sampling_prob=_Q, epochs=_EPOCHS, min_sep=_MIN_SEP,
    warm_start=_WARM, max_batch_size=_MAXB, dataset_size=_DATASET, num_selected=NUM_SELECTED,
    fresh_slots=FRESH_SLOTS, bands=_BANDS, delta=_DELTA, method=_METHOD, samples=_SAMPLES, seed=_SEED,
    workers=_WORKERS, scheduler=_SCHEDULER, cache_dir=_CACHE, force=_FORCE, as_json=_JSON, quiet=_QUIET,
)


@dataclass(frozen=True)
class RunOptions:
    """The parsed options :data:`_RUN_OPTIONS` (one field each)."""

    strategy: str
    sampling: SamplingName
    steps: Optional[int]
    sampling_prob: Optional[float]
    epochs: Optional[int]
    min_sep: Optional[int]
    warm_start: bool
    max_batch_size: Optional[int]
    dataset_size: Optional[int]
    num_selected: Optional[int]
    fresh_slots: bool
    bands: Optional[int]
    delta: float
    method: MethodName
    samples: Optional[int]
    seed: Optional[int]
    workers: Optional[int]
    scheduler: Optional[str]
    cache_dir: Optional[Path]
    force: bool
    as_json: bool
    quiet: bool

    def method_options(self) -> dict:
        """Method-specific options; each accountant takes the ones it knows (``dpmf.account``)."""
        return {"num_samples": self.samples, "seed": self.seed, "workers": self.workers,
                "scheduler": self.scheduler, "cache_dir": self.cache_dir}


def _run_command(*own: inspect.Parameter, last: tuple = ()):
    """Decorator: the command takes the shared options around its ``own`` (and, at the end,
    ``last``) and its body gets them as one :class:`RunOptions` first argument."""

    hints = typing.get_type_hints(RunOptions)
    shared = [_opt(name, hints[name], option) for name, option in _RUN_OPTIONS.items()]
    split = list(_RUN_OPTIONS).index("delta")

    def wrap(body):
        @functools.wraps(body)
        def command(**kwargs):
            run = RunOptions(**{name: kwargs.pop(name) for name in _RUN_OPTIONS})
            return body(run, **kwargs)

        command.__signature__ = inspect.Signature([*shared[:split], *own, *shared[split:], *last])
        return command

    return wrap


def _prepare(run: RunOptions, *, calibrating: bool):
    """``(strategy, scheme, method options)`` of a run, with the workers checked and noted."""
    from dpmf import validation as _v

    strat, scheme = _build(
        run.strategy, run.sampling, run.steps, run.bands, run.force, sampling_prob=run.sampling_prob,
        epochs=run.epochs, min_sep=run.min_sep, warm_start=run.warm_start, max_batch_size=run.max_batch_size,
        dataset_size=run.dataset_size, num_selected=run.num_selected, fresh_slots=run.fresh_slots,
    )
    if run.workers is not None:
        _v.positive_int("workers", run.workers)  # before any progress line
        _note_workers(run.method, run.workers, calibrating=calibrating)
    return strat, scheme, run.method_options()


def _execute(run: RunOptions, strat, scheme, opts: dict, work, *, calibrating: bool):
    """Refuse options the run would ignore, then ``work()`` with progress; Ctrl-C says how to resume."""
    _check_options(strat, scheme, run.method, opts, run.cache_dir, calibrating=calibrating)
    try:
        with cli_progress(run.quiet):  # (long accountants -- MMCC rows, Monte Carlo, searches -- report progress)
            return work()
    except KeyboardInterrupt:
        _interrupted(run.cache_dir, strat, scheme, run.method.value)


@app.command()
@_run_command(
    _opt("noise_multiplier", float, typer.Option(..., "--noise-multiplier", help="Noise std / clip norm (sigma).")),
    last=(_opt("plot", Optional[str], typer.Option(
        None, "--plot", help="Also save the f-DP trade-off curve (largest TPR of any membership test at each "
        "FPR, from the report's PLD) to this image file, e.g. curve.png (its folder must exist)."
    )),),
)
def account(run: RunOptions, noise_multiplier: float, plot: Optional[str]) -> None:
    """Epsilon of a training configuration at a given noise multiplier.

    Example: dpmf account --sampling poisson --sampling-prob 0.01 --steps 1000
    --noise-multiplier 1.0 --delta 1e-6
    """
    from dpmf import validation as _v

    with cli_errors():
        _v.positive("noise_multiplier", noise_multiplier)  # plain numbers first: no imports needed
        _v.open_unit("delta", run.delta)
        strat, scheme, opts = _prepare(run, calibrating=False)
        from dpmf.accounting import account as _account

        if run.method is MethodName.montecarlo:
            _check_montecarlo_samples(run.samples, run.delta)
        if plot is not None:
            from dpmf.files import check_output_file

            check_output_file(plot, "--plot", plot=True)  # before the work
        _check_run_cost(strat, scheme, noise_multiplier, run.method.value, run.samples, run.force)
        report = _execute(run, strat, scheme, opts, lambda: _account(
            strat, scheme, noise_multiplier, run.delta, method=run.method.value, force=run.force, **opts
        ), calibrating=False)
        if plot is not None:
            from dpmf.plots import tradeoff_plot

            tradeoff_plot(report, path=plot)
    if plot is not None:
        plotted = f"trade-off curve ({report.tradeoff(0.5).bound}) written to {plot}"
    if run.as_json:
        if plot is not None:
            err.print(plotted, highlight=False, markup=False)
        out.print_json(report.to_json())
        return
    out.print(report.summary(), highlight=False)
    d = report.epsilon_by_direction
    out.print(f"  remove direction: {d['remove']:.6g}   add direction: {d['add']:.6g}", highlight=False)
    _print_notes(report, "warning", "noise_ceiling", "discretization_note", "looseness_note")
    if plot is not None:
        out.print(plotted, highlight=False, markup=False)


def _print_notes(report, *keys: str) -> None:
    """``report.diagnostics[key]`` for each key it has, one line each (``warning:`` or ``note:``)."""
    for key in keys:
        if report.diagnostics.get(key):
            out.print(f"  {'warning' if key == 'warning' else 'note'}: {report.diagnostics[key]}", highlight=False)


@app.command()
@_run_command(_opt("epsilon", float, typer.Option(..., "--epsilon", help="Target epsilon (> 0).")))
def calibrate(run: RunOptions, epsilon: float) -> None:
    """Smallest noise multiplier whose reported epsilon is at most --epsilon.

    Example: dpmf calibrate --sampling poisson --sampling-prob 0.01 --steps 1000
    --epsilon 1 --delta 1e-6
    """
    from dpmf import validation as _v

    delta = run.delta
    with cli_errors():
        _v.positive("target_epsilon", epsilon)  # plain numbers first: no imports needed
        _v.open_unit("delta", delta)
        strat, scheme, opts = _prepare(run, calibrating=True)
        from dpmf.accounting import calibrate as _calibrate

        _check_run_cost(strat, scheme, None, run.method.value, run.samples, run.force, target_epsilon=epsilon,
                        delta=delta)
        cal = _execute(run, strat, scheme, opts, lambda: _calibrate(
            strat, scheme, epsilon, delta, method=run.method.value, force=run.force, **opts
        ), calibrating=True)
    if run.as_json:
        from dpmf.accounting.report import report_digest

        payload = cal.report.to_dict()
        payload["target_epsilon"] = epsilon
        payload["evaluations"] = cal.evaluations
        payload["digest"] = report_digest(payload)  # the target is part of the claim
        out.print_json(json.dumps(payload))
        return
    out.print(
        f"noise multiplier {cal.noise_multiplier:.6g} gives epsilon {cal.report.epsilon:.6g} <= {epsilon:g} "
        f"at delta {delta:g} (method {cal.report.method}, {cal.evaluations} evaluations)",
        highlight=False,
    )
    out.print(f"  adjacency: {cal.report.adjacency}", highlight=False)
    _print_notes(cal.report, "at_smallest_noise", "discretization_note")


_PLAN_HELP = """Rank every mechanism dpmf supports for a training run (the main job).

Each (strategy, sampler, accountant) is calibrated to the target (epsilon, delta) and ranked by the
RMSE the noise causes in the prefix sums of the gradient sums (lower is better). The defaults
describe a CIFAR-10-sized run: 50,000 examples, batch 500, 5 epochs, epsilon 2, delta 1e-6.

The words of the output:

"""


def _plan_help() -> str:
    from dpmf.planning.legend import legend_paragraphs

    return _PLAN_HELP + "\n\n".join(legend_paragraphs())


@app.command(help=_plan_help())
def plan(
    dataset_size: int = typer.Option(50_000, "--dataset-size", help="Number of training examples."),
    batch_size: int = typer.Option(500, "--batch-size", help="(Expected) batch size."),
    epochs: int = typer.Option(5, "--epochs", help="Passes over the data."),
    epsilon: float = typer.Option(2.0, "--epsilon", help="Target epsilon."),
    delta: float = typer.Option(1e-6, "--delta", help="Target delta."),
    as_json: bool = _JSON,
    plot: Optional[str] = typer.Option(None, "--plot", help="Also save a PNG bar chart to this file (its folder must exist)."),
    export: Optional[Path] = typer.Option(
        None, "--export", help="Also write the chosen row (the best; --rank for another) as JSON to this file, for "
        "make_private(plan=FILE) (a dense strategy's matrix goes next to it as <sha256>.npz)."
    ),
    rank: Optional[int] = typer.Option(None, "--rank", help="With --export: the rank of the row to write (1 = best, the default)."),
    mmcc: bool = typer.Option(
        True, "--mmcc/--no-mmcc", help="Rank MMCC rows (banded Toeplitz band sweep and the tree under Poisson "
        "sampling, up to 2048 steps); on by default."
    ),
    montecarlo_samples: Optional[int] = typer.Option(
        None, "--montecarlo-samples", help="Also rank b-min-sep rows by Monte Carlo with this many samples "
        "(ESTIMATES; needs at least ~5.3/delta samples, e.g. 5,296 at delta 1e-3; checked before anything runs)."
    ),
    prune: bool = typer.Option(
        True, "--prune/--no-prune", help="Skip the precise calibration of a candidate that provably cannot beat "
        "a row already certified (one evaluation decides; shown as a lower bound). --no-prune calibrates "
        "every one (slower; same best row)."
    ),
    cache_dir: Optional[Path] = typer.Option(
        None, "--cache-dir", help="Keep finished rows here, so the same plan again is instant (default: "
        "$DPMF_CACHE_DIR, $XDG_CACHE_HOME/dpmf or ~/.cache/dpmf)."
    ),
    no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the cache."),
    scheduler: Optional[str] = typer.Option(
        None, "--scheduler",
        help="Dask scheduler ADDRESS (tcp://host:port): run each wave's candidates there (same rows as a local run; "
        "the waves run whole, so --budget does not apply).",
    ),
    workers: Optional[int] = typer.Option(None, "--workers", help="Local worker processes for each wave's candidates (same rows as one process)."),
    budget: Optional[float] = typer.Option(
        None, "--budget", help=f"Seconds (default {DEFAULT_PLAN_BUDGET:g}) after which the costly candidates (MMCC, "
        "BandMF under balls-in-bins, the optimal factorization) are stopped: each keeps the smallest noise it "
        "certified so far (a cut row, which can only move up), and the output names what was cut. Every costly "
        "candidate gets its first answer (a certified noise, or pruned) before any is refined, and one still "
        "without an answer at the deadline runs on for up to 1.4x the budget more (a busy machine). Not with "
        "--thorough.", show_default=False,
    ),
    thorough: bool = typer.Option(False, "--thorough", help="No time budget: calibrate every candidate fully (not "
                                  "with --budget)."),
    force: bool = _FORCE,
    quiet: bool = _QUIET,
) -> None:
    """Rank every mechanism dpmf supports for a training run (its help: :func:`_plan_help`)."""
    with cli_errors():
        from dpmf.planner import TrainingRun
        from dpmf.planning.budget import resolve_budget

        limit = resolve_budget(budget, thorough, names=("--budget", "--thorough"))
        if scheduler is not None:  # (a cluster runs every wave whole: no budget)
            if budget is not None:
                raise InvalidParameterError("--budget applies to a local plan: with --scheduler every wave runs whole "
                                            "on the cluster (leave --budget out)")
            limit = None
        _check_plan_outputs(plot, export, rank)
        run = TrainingRun(dataset_size, batch_size, epochs, epsilon, delta, montecarlo_samples, mmcc)
        cache = _plan_cache(cache_dir, no_cache, workers)
        _check_plan_cost(run, limit, mmcc, montecarlo_samples, force)
        rows, shown = _plan_rows(run, cache, limit, as_json, quiet, scheduler=scheduler, prune=prune,
                                 workers=workers, force=force)
        exported = _plan_outputs(run, rows, cache, plot, export, rank)
    if as_json:
        _print_plan_json(run, rows, exported)
    else:
        _print_plan_text(run, rows, shown, cache, plot, exported)


def _check_plan_outputs(plot, export, rank) -> None:
    """``--plot``, ``--export`` and ``--rank`` checked before minutes of calibration."""
    from dpmf.files import check_output_file

    if plot:
        check_output_file(plot, "--plot", plot=True)
    if rank is not None and export is None:
        raise InvalidParameterError("--rank chooses the row --export writes: pass --export FILE too")
    if export is not None:
        from dpmf import validation as _v

        _v.positive_int("--rank", 1 if rank is None else rank)
        check_output_file(export, "--export")


def _plan_cache(cache_dir, no_cache: bool, workers):
    """The plan cache (``None`` with ``--no-cache``): ``--cache-dir`` checked before the work; a bad
    DPMF_CACHE_DIR is refused; an unwritable default folder is noted once. (``--workers`` is
    checked and noted first.)"""
    from dpmf.planning.cache import PlanCache, check_cache_dir, default_plan_cache

    if workers is not None:
        from dpmf import validation as _v

        _v.positive_int("workers", workers)
        note_workers(workers)
    if no_cache:
        return None
    if cache_dir is not None:
        check_cache_dir(cache_dir, "--cache-dir")  # before the work
        return PlanCache(cache_dir)
    cache, note = default_plan_cache()
    if note:
        err.print(f"note: {note}", highlight=False, markup=False)
    return cache


def _check_plan_cost(run, limit, mmcc: bool, montecarlo_samples, force: bool) -> None:
    """The up-front cost check: the quick waves always run whole, only the costly wave stops at the
    budget (``limit``; ``None``: no budget), so the estimate checked is the quick part in full plus
    the costly part up to the budget, and the note gives the full estimate when the budget cuts it."""
    from dpmf.accounting.cost import check_cost, format_seconds, plan_cost
    from dpmf.planning.budget import budgeted_cost

    full = plan_cost(run.steps, epochs=run.epochs, mmcc=mmcc, montecarlo_samples=montecarlo_samples)
    est = budgeted_cost(full, limit)
    hint = "plan fewer steps (--epochs, or a larger --batch-size)"
    if limit is not None:
        hint += "; --budget stops only the costly candidates, the quick ones always run whole"
    check_cost(est, force=force, hint=hint)
    if est.seconds < full.seconds and full.seconds > 60:
        err.print(f"note: a full plan would take {full.describe()} (a rough estimate); --budget {limit:g} stops the "
                  f"costly candidates, so this one takes about {format_seconds(est.seconds)}, and the output names "
                  "what the budget cut", highlight=False)
    else:
        _note_cost(est)


def _plan_rows(run, cache, limit, as_json: bool, quiet: bool, **options):
    """``(rows, shown)``: the plan's rows (a ``PlanResult``) and the tables already printed: on a
    terminal, the certified ranking of the quick waves at once while the costly candidates run;
    into a pipe or file nothing early (the table is printed once, at the end)."""
    from dpmf.planner import PlanResult, plan as _plan
    from dpmf.planning.budget import answer_grace

    shown: list = []

    def first(rows, pending: int) -> None:
        until = (f"until {limit:g} s after the start (--budget; one without any answer by then up to "
                 f"{limit + answer_grace(limit):g} s; --thorough: no limit)")
        if not _interactive():
            err.print(f"{pending} costly candidates still running, {until}; the table follows when they end",
                      highlight=False)
            return
        shown.append(list(rows))
        out.print(plan_table(run, rows))
        err.print(f"{pending} costly candidates still running, {until}; the table above is certified, and the final "
                  "one is printed below it (labelled) if they change it", highlight=False)

    try:
        with cli_progress(quiet):
            rows = _plan(run, cache=cache, budget=limit, thorough=limit is None,
                         on_first=first if limit is not None and not as_json else None, **options)
        if not isinstance(rows, PlanResult):  # (a plain list of rows: nothing was cut)
            rows = PlanResult(rows, budget=limit)
    except KeyboardInterrupt:
        where = f"; finished rows are saved in {cache.folder}: run the same command again to resume" if cache else ""
        err.print(f"interrupted{where}", highlight=False)
        raise typer.Exit(code=130)
    if not any(not r.pruned for r in rows):  # (the library refuses it too: never an empty success)
        raise UnsupportedConfigurationError(
            "the plan has no row: no candidate could be ranked" + "".join(f"; {c.strategy} / {c.sampling}: {c.reason}"
                                                                          for c in rows.cut[:1]))
    return rows, shown


def _interactive() -> bool:
    """Whether standard output is a terminal (the early table is shown only there)."""
    return out.is_terminal


def _plan_outputs(run, rows, cache, plot, export, rank):
    """The cache's notes, the ``--plot`` and the ``--export`` (the line that says so, or ``None``)."""
    from dpmf.planner import plot_plan

    if cache is not None:
        for line in cache.ignored:
            err.print(f"note: {line}", highlight=False, markup=False)
    if plot:
        plot_plan(run, [r for r in rows if not r.pruned], plot)
    return _export_row(rows, export, rank) if export is not None else None


def _print_plan_json(run, rows, exported) -> None:
    from dataclasses import asdict

    payload = {
        "run": {**run.__dict__, "steps": run.steps, "sampling_prob": run.sampling_prob},
        "rows": [{"rank": k, **r.to_dict()} for k, r in enumerate((r for r in rows if not r.pruned), 1)],
        "pruned": [{"rank": None, **r.to_dict()} for r in rows if r.pruned],
        "budget": rows.budget,
        "cut": [asdict(c) for c in rows.cut],
        "counts": rows.counts() if hasattr(rows, "counts") else None,
        "seconds": rows.seconds,
    }
    out.print_json(json.dumps(payload))
    if exported:
        err.print(exported, highlight=False, markup=False, soft_wrap=True)


def _print_plan_text(run, rows, shown: list, cache, plot, exported) -> None:
    if not shown or shown[0] != list(rows):  # (the first table again only when the costly wave changed it)
        if shown:
            out.print("the final ranking, after the costly candidates (it replaces the table above):", highlight=False)
        out.print(plan_table(run, rows))
    estimate = any(not r.certified for r in rows if not r.pruned)
    out.print(
        "prefix RMSE: root-mean-square noise on the running sums of clipped gradients (clip norm 1); "
        "RMSE/batch divides by the batch size." + (" ESTIMATE: Monte Carlo, not a proof." if estimate else ""),
        highlight=False,
    )
    _print_legend(rows)
    for r in rows:
        if r.note and not r.pruned:
            out.print(f"{r.strategy}: {r.note}", highlight=False)
    if any(r.pruned for r in rows):
        out.print("pruned, and the bound that rules each out:", highlight=False)
        for r in rows:
            if r.pruned:
                out.print(f"  {r.strategy} / {r.sampling} ({r.method}): {r.note}", highlight=False)
    _print_cut(rows)
    out.print(rows.summary(), highlight=False)
    hits = sum(r.cached for r in rows)
    if hits:
        out.print(f"{hits} of {len(rows)} rows from the cache ({cache.folder}; --no-cache recomputes)", highlight=False)
    if plot:
        out.print(f"plot written to {plot}")
    if exported:
        out.print(exported, highlight=False, markup=False, soft_wrap=True)  # (one line: a path to copy)


def _print_legend(rows) -> None:
    """The legend under the table (:mod:`dpmf.planning.legend`): the words it shows, each explained,
    the explanations wrapped beside their terms."""
    from rich.table import Table

    from dpmf.planning.legend import LEGEND, terms_used

    grid = Table.grid(padding=(0, 1, 0, 0))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for term in terms_used(rows, rows.cut):
        grid.add_row(f"  {term}:", LEGEND[term])
    out.print("legend:", highlight=False)
    out.print(grid, highlight=False)


def _print_cut(rows) -> None:
    """What has no calibrated row: candidates skipped (memory, a worker that died), the rows the
    time budget stopped early (certified, can only move up) and the candidates it stopped before
    any certified noise."""
    for c in rows.cut:
        if not c.by_budget:
            out.print(f"{c.strategy} / {c.sampling} ({c.method}): {c.reason}", highlight=False)
    cut_rows = [r for r in rows if r.cut]
    if not cut_rows and not any(c.by_budget for c in rows.cut):
        return
    out.print(f"cut by the time budget ({rows.budget:g} s; dpmf plan --thorough calibrates everything, or raise "
              "--budget):", highlight=False)
    for r in cut_rows:
        out.print(f"  {r.strategy} / {r.sampling}: noise {r.noise_multiplier:.4g} certified, not yet the smallest "
                  "(a full calibration can only lower its RMSE and move it up)", highlight=False)
    for c in (c for c in rows.cut if c.by_budget):
        out.print(f"  {c.strategy} / {c.sampling} ({c.method}): not ranked, no noise certified within the budget "
                  f"({c.evaluations} evaluations); it could rank anywhere", highlight=False)


def _export_row(rows, path: Path, rank: Optional[int]) -> str:
    """Write the ranked row ``rank`` (default 1) for ``--export``; the line that says so."""
    from dpmf.planner import export_row

    ranked = [r for r in rows if not r.pruned]
    k = 1 if rank is None else rank
    if not ranked:
        raise UnsupportedConfigurationError("--export: the plan has no ranked row to write")
    if not 1 <= k <= len(ranked):
        raise InvalidParameterError(f"--rank must be between 1 and {len(ranked)} (the ranked rows), got {k}")
    row = ranked[k - 1]
    written = export_row(row, path, rank=k)
    extra = f" (and its matrix in {', '.join(str(p) for p in written[1:])})" if len(written) > 1 else ""
    tag = "" if row.certified else "; an ESTIMATE: make_private refuses it until certified"
    return (f"row {k} ({row.strategy} / {row.sampling}, {row.method}, sigma {row.noise_multiplier:.6g}) written to "
            f"{path}{extra}{tag}: train it with make_private(..., plan={str(path)!r})")


def plan_table(run, rows) -> "PlanTable":
    """The ranking, laid out for the width it is printed at (:class:`PlanTable`)."""
    return PlanTable(run, rows)


class PlanTable:
    """The ranking of ``dpmf plan`` as a rich renderable that picks its layout from the width it is
    printed at, so that every number, name and rank is shown whole at any width:

    * one line per row (strategy, sampling and accountant in their own columns) when that fits;
    * else two-line rows (strategy over sampling, accountant over ESTIMATE/pruned), which fit 80
      columns for every row dpmf produces;
    * else a compact list: per row, the rank and names on one line, then ``sigma 2.37  epsilon 2
      ...`` items, wrapped between items (never inside one).

    A pruned row shows lower bounds (``>``) and no epsilon; an estimate says ESTIMATE."""

    _NUMBERS = ("sigma", "epsilon", "prefix\nRMSE", "RMSE/\nbatch")

    def __init__(self, run, rows) -> None:
        self.run = run
        self.rows = list(rows)

    def title(self) -> str:
        r = self.run
        return (f"dpmf plan: {r.dataset_size} examples, batch {r.batch_size}, {r.epochs} epochs "
                f"({r.steps} steps), target (epsilon={r.epsilon:g}, delta={r.delta:g})")

    def cells(self):
        """Per row: (rank, strategy, sampling, accountant, status, sigma, epsilon, RMSE, RMSE/batch)."""
        rank = 0
        for r in self.rows:
            if getattr(r, "pruned", False):
                yield ("", r.strategy, r.sampling, r.method, "pruned", f">{r.noise_multiplier:.3g}", "-",
                       f">{r.prefix_sum_rmse:.3g}", f">{r.rmse_per_example_in_batch:.3g}")
                continue
            rank += 1
            status = "ESTIMATE" if not r.certified else ("cut" if getattr(r, "cut", False) else "")
            yield (str(rank), r.strategy, r.sampling, r.method, status,
                   f"{r.noise_multiplier:.4g}", f"{r.epsilon:.4g}", f"{r.prefix_sum_rmse:.4g}",
                   f"{r.rmse_per_example_in_batch:.4g}")

    def _table(self, one_line: bool) -> Table:
        from rich import box

        table = Table(title=self.title(), box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0, 0, 1))
        table.add_column("#", justify="right", no_wrap=True)
        if one_line:
            for name in ("strategy", "sampling", "accountant"):
                table.add_column(name, no_wrap=True)
        else:
            table.add_column("strategy\nsampling", no_wrap=True)
            table.add_column("accountant", no_wrap=True)
        for name in self._NUMBERS:
            table.add_column(name, justify="right", no_wrap=True)
        cells = list(self.cells())
        for i, (rank, strategy, sampling, method, status, *numbers) in enumerate(cells):
            if one_line:  # (a gap between the ranked rows and the pruned ones)
                gap = bool(rank) and i + 1 < len(cells) and not cells[i + 1][0]
                table.add_row(rank, strategy, sampling, method + (f", {status}" if status else ""), *numbers,
                              end_section=gap)
            else:
                table.add_row(rank, f"{strategy}\n{sampling}", method + (f"\n{status}" if status else ""), *numbers,
                              end_section=True)
        return table

    def compact(self, width: int) -> list[str]:
        """The narrow layout as plain lines (items wrapped between, never inside, at ``width``)."""
        import textwrap

        lines = textwrap.wrap(self.title(), max(width, 20), break_on_hyphens=False, break_long_words=False)
        labels = ("sigma", "epsilon", "prefix RMSE", "RMSE/batch")
        for rank, strategy, sampling, method, status, *numbers in self.cells():
            lines.append("")
            head = f"{rank or '-':>2}  {strategy} / {sampling}"
            lines += [head] if len(head) <= width else [f"{rank or '-':>2}  {strategy} /", f"    {sampling}"]
            items = [method + (f", {status}" if status else "")] + [f"{k} {v}" for k, v in zip(labels, numbers)]
            line = "   "
            for item in items:
                if line.strip() and len(line) + 2 + len(item) > width:
                    lines.append(line)
                    line = "   "
                line += f"  {item}" if line.strip() else f" {item}"
            lines.append(line)
        return lines

    def __rich_console__(self, console, options):
        from rich.measure import Measurement
        from rich.text import Text

        width = options.max_width
        for one_line in (True, False):
            table = self._table(one_line)
            if Measurement.get(console, options.update_width(10**6), table).maximum <= width:
                yield table
                return
        yield Text("\n".join(self.compact(width)), no_wrap=True, overflow="ignore")


def _register_subcommands() -> None:
    from dpmf.cli.individual import app as individual_app
    from dpmf.cli.montecarlo import app as montecarlo_app
    from dpmf.cli.strategy import app as strategy_app
    from dpmf.cli.compose import compose as compose_command
    from dpmf.cli.verify import verify as verify_command

    app.add_typer(individual_app, name="individual")
    app.add_typer(strategy_app, name="strategy")
    app.add_typer(montecarlo_app, name="montecarlo")
    app.command("verify")(verify_command)
    app.command("compose")(compose_command)
    from dpmf.cli.audit import register as register_audit  # dpmf audit takes account's options (above)

    register_audit(app, build=_build, options=dict(
        strategy=_STRATEGY, sampling=_SAMPLING, steps=_STEPS, sampling_prob=_Q, epochs=_EPOCHS, min_sep=_MIN_SEP,
        warm_start=_WARM, max_batch_size=_MAXB, dataset_size=_DATASET, num_selected=NUM_SELECTED,
        fresh_slots=FRESH_SLOTS, bands=_BANDS, delta=_DELTA, method=_METHOD,
        force=_FORCE, json=_JSON, quiet=_QUIET))


_register_subcommands()


def run() -> None:
    """Console entry point: every usage error is one line on stderr and exit status 2."""
    try:  # typer >= 0.16 vendors click; older versions use click itself
        from typer._click import exceptions as cx
    except ImportError:  # pragma: no cover
        from click import exceptions as cx
    no_args = getattr(cx, "NoArgsIsHelpError", ())
    abort = getattr(cx, "Abort", ())
    try:
        rv = app(standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(getattr(exc, "exit_code", 0))
    except no_args as exc:  # the help text, as for --help
        print(str(exc.format_message()))
        sys.exit(0)
    except abort:
        err.print("aborted")
        sys.exit(1)
    except cx.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        err.print(f"[bold red]error:[/] {exc.format_message()}{hint}", highlight=False, markup=True)
        sys.exit(2)
    except DPMFError as exc:  # pragma: no cover - commands catch their own
        err.print(f"error: {exc}")
        sys.exit(2)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    run()
