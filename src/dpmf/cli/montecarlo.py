"""``dpmf montecarlo``: long Monte Carlo accounting runs (run, resume, report) and certified
calibration (calibrate). Parse, call, print.

``run``/``resume``/``report`` print ESTIMATES (upper confidence bounds), never proofs; only
``calibrate`` (Algorithm 5) certifies. See :mod:`dpmf.accounting.montecarlo`.
"""

from __future__ import annotations

import json
from typing import Optional

import typer

from dpmf.cli.console import fail, cli_errors, err, note_workers, out, typer_app
from dpmf.cli.specs import FRESH_SLOTS, NUM_SELECTED, WARM_START, build_scheme, build_strategy, check_options_used
from dpmf.cli.specs import SamplingName as Sampling
from dpmf.errors import DPMFError, InvalidParameterError

app = typer_app(
    help="Monte Carlo privacy accounting (Dong & Ganesh 2026): resumable runs with checkpoints, "
    "optionally on a Dask cluster. Results are estimates with confidence, not proofs.",
    no_args_is_help=True,
)


_DELTA = typer.Option(..., "--delta", help="Target delta in (0, 1).")
_CONF = typer.Option(0.99, "--confidence", help="Joint confidence of the upper bounds (both directions).")
_SAVED_DELTA = typer.Option(None, "--delta", help="Target delta in (0, 1) (default: the one the run was started with).")
_SAVED_CONF = typer.Option(
    None, "--confidence", help="Joint confidence of the upper bounds (default: the run's, else 0.99)."
)
_SCHED = typer.Option(None, "--scheduler", help="Dask scheduler ADDRESS (e.g. tcp://host:8786); default: this machine.")
_WORKERS = typer.Option(None, "--workers", help="Local worker processes (default: this process); same counts as a serial run.")
_JSON = typer.Option(False, "--json", help="Print one JSON object instead of text.")


def _scheme(sampling, steps, sampling_prob, participation_rate, min_sep, warm_start, max_batch_size, epochs,
            num_selected=None, fresh_slots=False):
    return build_scheme(
        sampling, steps, sampling_prob=sampling_prob, participation_rate=participation_rate, min_sep=min_sep,
        warm_start=warm_start, max_batch_size=max_batch_size, epochs=epochs, partition="independent",
        num_selected=num_selected, fresh_slots=fresh_slots,
    )


def resume_command(checkpoint) -> str:
    """The command that continues a run: everything it needs (delta, confidence) is in the
    checkpoint, so the file name is the only argument."""
    import shlex

    return f"dpmf montecarlo resume {shlex.quote(str(checkpoint))}"


def _execute(run_fn, description: str, total: int, done: int, checkpoint):
    """Run ``run_fn(callback)`` with its progress shown (:mod:`dpmf.progress`: a bar on a terminal,
    timestamped lines otherwise); Ctrl-C leaves a consistent checkpoint."""
    from dpmf import progress
    from dpmf.cli.console import cli_progress

    try:
        with cli_progress(), progress.task(description, total=total, unit="samples") as bar:
            bar.update(completed=done)

            def callback(done: int, total: int) -> None:
                bar.update(completed=done, total=total)

            return run_fn(callback)
    except KeyboardInterrupt:
        where = f"; resume with: {resume_command(checkpoint)}" if checkpoint else " (no --checkpoint was set)"
        err.print(f"interrupted{where}", highlight=False, markup=False)
        raise typer.Exit(code=130)


def _sample_and_report(mc, description, checkpoint, scheduler, workers, delta, confidence):
    """Sample the run's missing chunks with progress shown, then its report with the samples per
    CPU-second of this command."""
    import time

    from dpmf.accounting.montecarlo.accountant import montecarlo_report, throughput_diagnostics

    before, cpu0 = mc.samples_done, time.process_time()
    _execute(lambda cb: mc.run(callback=cb, scheduler=scheduler, workers=workers), description, mc.samples_total,
             mc.samples_done, checkpoint)
    extra = throughput_diagnostics(mc.samples_done - before, time.process_time() - cpu0, scheduler, workers)
    return montecarlo_report(mc, delta, confidence, extra=extra)


def _report_settings(mc, delta, confidence):
    """--delta / --confidence given on the command line, else the ones the run was started with."""
    saved = getattr(mc, "report_defaults", {}) or {}
    if delta is None:
        delta = saved.get("delta")
        if delta is None:
            raise InvalidParameterError("--delta is required (this checkpoint does not record one)")
    if confidence is None:
        confidence = saved.get("confidence", 0.99)
    return delta, confidence


def _print_report(report, as_json: bool, checkpoint=None) -> None:
    if as_json:
        payload = report.to_dict()
        if checkpoint is not None:
            payload["checkpoint"] = str(checkpoint)
        out.print_json(json.dumps(payload))
        return
    d = report.diagnostics
    out.print(report.summary(), highlight=False)
    by = report.epsilon_by_direction
    out.print("  " + "   ".join(f"{k} direction: {v:.6g}" for k, v in by.items()), highlight=False)
    out.print(
        f"  point estimate {d['epsilon_point_estimate']:.6g}; upper confidence bound at confidence "
        f"{d['confidence']:g} ({'complete' if d['complete'] else 'PARTIAL'} run)",
        highlight=False,
    )
    needed = d.get("samples_needed_for_certification")
    out.print(
        f"  samples used: {d['samples_used']:,} per direction; certification (Algorithm 5) at this delta "
        f"needs {needed:,} per direction and candidate" if needed else f"  samples used: {d['samples_used']:,}",
        highlight=False,
    )
    out.print(f"  seed entropy: {d['seed_entropy']}", highlight=False)
    if "samples_drawn" in d:
        out.print(f"  {_throughput_line(d)}", highlight=False)
    if d.get("warning"):
        out.print(f"  warning: {d['warning']}", highlight=False)
    if checkpoint is not None:
        out.print(f"  checkpoint: {checkpoint}", highlight=False)


def _throughput_line(d: dict) -> str:
    rate = d.get("samples_per_cpu_second")
    text = f"{d['samples_drawn']:,} samples drawn in {d['cpu_seconds']:.1f} CPU-s"
    return text + (f" ({rate:,.0f} samples per CPU-second)" if rate else " (in other processes)")


@app.command()
def run(
    strategy: str = typer.Option("identity", "--strategy", help="Encoder C by name (see 'dpmf strategy build') or FILE.npz."),
    steps: int = typer.Option(..., "--steps", help="Number of training steps n."),
    bands: Optional[int] = typer.Option(None, "--bands", help="Bands for banded strategies."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Epochs (balls-in-bins; strategy optimization)."),
    sampling: Sampling = typer.Option(Sampling.min_sep, "--sampling", help="Batch sampler."),
    sampling_prob: Optional[float] = typer.Option(None, "--sampling-prob", help="p: per-step probability (b-min-sep: among available examples)."),
    participation_rate: Optional[float] = typer.Option(None, "--participation-rate", help="b-min-sep: marginal rate p0 instead of p."),
    min_sep: Optional[int] = typer.Option(None, "--min-sep", help="b (b-min-sep) or the cycle length (cyclic-poisson)."),
    warm_start: bool = WARM_START,
    max_batch_size: Optional[int] = typer.Option(None, "--max-batch-size", help="b-min-sep: truncate batches (App. D)."),
    dataset_size: Optional[int] = typer.Option(None, "--dataset-size", help="Number of examples (needed with --max-batch-size)."),
    num_selected: Optional[int] = NUM_SELECTED,
    fresh_slots: bool = FRESH_SLOTS,
    noise_multiplier: float = typer.Option(..., "--noise-multiplier", help="Noise std / clip norm (sigma) for C as given."),
    delta: float = _DELTA,
    samples: int = typer.Option(100_000, "--samples", help="Privacy-loss samples per direction."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed entropy (default: fresh OS entropy, recorded)."),
    confidence: float = _CONF,
    chunk_size: int = typer.Option(10_000, "--chunk-size", help="Samples per chunk (one checkpoint per chunk)."),
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="Checkpoint file (.npz); an existing one of the same run is continued."),
    scheduler: Optional[str] = _SCHED,
    workers: Optional[int] = _WORKERS,
    as_json: bool = _JSON,
) -> None:
    """Estimate epsilon by Monte Carlo, checkpointing after every chunk.

    Example: dpmf montecarlo run --strategy banded-toeplitz --bands 4 --steps 64 --sampling b-min-sep
    --min-sep 4 --participation-rate 0.05 --noise-multiplier 1 --delta 1e-3 --samples 100000
    --checkpoint mc.npz
    """
    from dpmf.accounting.montecarlo.accountant import (
        check_supported,
        montecarlo_report,
        open_run,
        samples_to_estimate,
    )
    from dpmf.accounting.montecarlo.statistics import DEFAULT_RESOLUTION
    from dpmf.files import check_output_file

    with cli_errors():
        _check_used(strategy, sampling, bands, epochs, sampling_prob, participation_rate, min_sep, warm_start,
                    max_batch_size, dataset_size, num_selected, fresh_slots)
        note_workers(workers)
        if checkpoint is not None:
            check_output_file(checkpoint, "--checkpoint")
        need = samples_to_estimate(delta, confidence)
        if samples < need:
            raise InvalidParameterError(
                f"--samples {samples:,} cannot give a finite epsilon at --delta {delta:g}: the {confidence:g} upper "
                f"confidence bound on delta stays above it even with no privacy loss; use --samples {need:,} or "
                "more (or a larger --delta)"
            )
        strat = build_strategy(strategy, steps, epochs=epochs, bands=bands)
        scheme = _scheme(sampling, steps, sampling_prob, participation_rate, min_sep, warm_start, max_batch_size, epochs,
                         num_selected, fresh_slots)
        check_supported(strat, scheme, None)
        options = {} if dataset_size is None else {"dataset_size": dataset_size}
        mc = open_run(strat, scheme, noise_multiplier, samples, seed, chunk_size, checkpoint, None,
                      DEFAULT_RESOLUTION, sampler_options=options)
        mc.report_defaults = {"delta": delta, "confidence": confidence}  # what 'resume FILE' reports
        if checkpoint is not None and not mc.samples_done:
            mc.save(checkpoint)  # the seed is on disk before the first chunk
        report = _sample_and_report(mc, "sampling privacy losses", checkpoint, scheduler, workers, delta, confidence)
    _print_report(report, as_json, checkpoint)


def _check_used(strategy, sampling, bands, epochs, sampling_prob, participation_rate, min_sep, warm_start,
                max_batch_size, dataset_size, num_selected=None, fresh_slots=False) -> None:
    check_options_used(
        strategy, sampling, **{"--bands": bands, "--epochs": epochs, "--sampling-prob": sampling_prob,
                               "--participation-rate": participation_rate, "--min-sep": min_sep,
                               "--warm-start": warm_start, "--max-batch-size": max_batch_size,
                               "--dataset-size": dataset_size, "--num-selected": num_selected,
                               "--fresh-slots": fresh_slots},
    )


@app.command()
def resume(
    checkpoint: str = typer.Argument(..., help="A checkpoint written by 'dpmf montecarlo run --checkpoint'."),
    delta: Optional[float] = _SAVED_DELTA,
    confidence: Optional[float] = _SAVED_CONF,
    scheduler: Optional[str] = _SCHED,
    workers: Optional[int] = _WORKERS,
    as_json: bool = _JSON,
) -> None:
    """Continue an interrupted run: compute exactly the missing chunks, then report (at the delta
    and confidence the run was started with, unless given)."""
    from dpmf.accounting.montecarlo.accountant import montecarlo_report
    from dpmf.accounting.montecarlo.run import MonteCarloRun

    from dpmf.files import check_output_file

    with cli_errors(hint="resume with fewer --workers, or on a machine with more memory"):
        check_output_file(checkpoint, "checkpoint")  # every chunk is saved to it: writable before the work
        mc = MonteCarloRun.load(checkpoint)
        delta, confidence = _report_settings(mc, delta, confidence)
        note_workers(workers)
        report = _sample_and_report(mc, "resuming", checkpoint, scheduler, workers, delta, confidence)
    _print_report(report, as_json, checkpoint)


@app.command()
def report(
    checkpoint: str = typer.Argument(..., help="A checkpoint (complete or partial)."),
    delta: Optional[float] = _SAVED_DELTA,
    confidence: Optional[float] = _SAVED_CONF,
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="Also print the delta interval at this epsilon."),
    as_json: bool = _JSON,
) -> None:
    """Report a checkpoint without sampling (a partial run is labelled PARTIAL)."""
    from dpmf.accounting.montecarlo.accountant import montecarlo_report
    from dpmf.accounting.montecarlo.run import MonteCarloRun

    try:
        mc = MonteCarloRun.load(checkpoint, read_only=True)
        delta, confidence = _report_settings(mc, delta, confidence)
        rep = montecarlo_report(mc, delta, confidence)
        intervals = None
        if epsilon is not None:
            intervals = {d: h.delta_interval(epsilon, confidence) for d, h in mc.histograms.items()}
    except DPMFError as exc:
        fail(str(exc))
    if as_json:
        payload = rep.to_dict()
        payload["checkpoint"] = checkpoint
        if intervals is not None:
            payload["delta_interval"] = {"epsilon": epsilon, **{d: list(v) for d, v in intervals.items()}}
        out.print_json(json.dumps(payload))
        return
    _print_report(rep, False, checkpoint)
    if intervals is not None:
        for d, (lo, est, hi) in intervals.items():
            out.print(
                f"  delta({epsilon:g}) {d}: estimate {est:.4g}, {confidence:g} interval [{lo:.4g}, {hi:.4g}]",
                highlight=False,
            )



@app.command()
def calibrate(
    strategy: str = typer.Option("identity", "--strategy", help="Encoder C by name or FILE.npz."),
    steps: int = typer.Option(..., "--steps", help="Number of training steps n."),
    bands: Optional[int] = typer.Option(None, "--bands", help="Bands for banded strategies."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Epochs (balls-in-bins; strategy optimization)."),
    sampling: Sampling = typer.Option(Sampling.min_sep, "--sampling", help="Batch sampler."),
    sampling_prob: Optional[float] = typer.Option(None, "--sampling-prob", help="p (see 'run')."),
    participation_rate: Optional[float] = typer.Option(None, "--participation-rate", help="b-min-sep: p0 instead of p."),
    min_sep: Optional[int] = typer.Option(None, "--min-sep", help="b (b-min-sep) or the cycle length (cyclic-poisson)."),
    warm_start: bool = WARM_START,
    max_batch_size: Optional[int] = typer.Option(None, "--max-batch-size", help="b-min-sep: truncate batches."),
    dataset_size: Optional[int] = typer.Option(None, "--dataset-size", help="Needed with --max-batch-size."),
    num_selected: Optional[int] = NUM_SELECTED,
    fresh_slots: bool = FRESH_SLOTS,
    epsilon: float = typer.Option(..., "--epsilon", help="Target epsilon."),
    delta: float = _DELTA,
    samples: Optional[int] = typer.Option(None, "--samples", help="Samples per direction and candidate (default: the fewest that certify --delta)."),
    candidates: int = typer.Option(12, "--candidates", help="Number of candidate noise multipliers (powers of 1.01)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed entropy (default: fresh OS entropy, recorded)."),
    chunk_size: int = typer.Option(10_000, "--chunk-size", help="Samples per chunk."),
    scheduler: Optional[str] = _SCHED,
    workers: Optional[int] = _WORKERS,
    as_json: bool = _JSON,
) -> None:
    """Certified noise calibration by Algorithm 5 (Estimate-Verify-Release, Dong & Ganesh 2026 App. A).

    The released noise multiplier is (epsilon, delta)-DP with the Monte Carlo failure probability
    folded into delta (Thm. A.1); a proved accountant supplies the fallback noise.
    """
    from dpmf.accounting.dispatch import certified_fallback
    from dpmf.accounting.montecarlo.accountant import calibrate_montecarlo

    try:
        _check_used(strategy, sampling, bands, epochs, sampling_prob, participation_rate, min_sep, warm_start,
                    max_batch_size, dataset_size, num_selected, fresh_slots)
        note_workers(workers)
        strat = build_strategy(strategy, steps, epochs=epochs, bands=bands)
        scheme = _scheme(sampling, steps, sampling_prob, participation_rate, min_sep, warm_start, max_batch_size, epochs,
                         num_selected, fresh_slots)
        from dpmf.cli.console import cli_progress

        with cli_progress():  # the library shows its stages: the pilot, then the verifications
            cal = calibrate_montecarlo(
                strat, scheme, epsilon, delta, num_candidates=candidates, num_samples=samples, seed=seed,
                scheduler=scheduler, workers=workers, chunk_size=chunk_size,
                dataset_size=dataset_size, fallback=certified_fallback,
            )
    except KeyboardInterrupt:
        err.print("interrupted (calibration keeps no checkpoint; rerun with the same --seed)")
        raise typer.Exit(code=130)
    except DPMFError as exc:
        fail(str(exc))
    if as_json:
        out.print_json(cal.report.to_json())
        return
    d = cal.report.diagnostics
    out.print(
        f"noise multiplier {cal.noise_multiplier:.6g} is ({epsilon:g}, {delta:g})-DP "
        f"(certified by Algorithm 5; {'fallback' if cal.fallback else 'verified candidate'})",
        highlight=False,
    )
    out.print(
        f"  {d['samples_per_direction_per_candidate']:,} samples per direction and candidate, "
        f"{cal.evaluations} candidates verified; failure probability bound {d['failure_probability_bound']:.3g} "
        f"folded into delta (overall {d['overall_delta']:.4g})",
        highlight=False,
    )
    out.print(
        f"  fallback {d['fallback_noise_multiplier']:.6g} ({d['fallback_method']}); seed entropy {d['seed_entropy']}",
        highlight=False,
    )
    out.print(f"  {_throughput_line(d)}", highlight=False)
    out.print(f"  adjacency: {cal.report.adjacency}", highlight=False)
