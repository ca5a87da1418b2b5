"""The Monte Carlo accountant: epsilon estimates with confidence, and certified noise calibration.

Dong & Ganesh 2026 (``papers/001``): privacy losses of the dominating pair (Sec. 5, App. D, Thm. 6.1;
sampled by :mod:`dpmf.accounting.montecarlo.losses`), delta(eps) estimated by the hockey-stick mean
(Sec. 2.5) and, for certification, Algorithm 5 / Thm. A.1 (App. A).

* :func:`account_montecarlo` is an **estimate** (``certified=False``): per direction it reports the
  smallest epsilon whose Chernoff-Hoeffding *upper* confidence bound on delta is <= ``delta``
  (each direction at level ``(1 - confidence) / 2``, so both hold jointly with probability >=
  ``confidence``), plus how many samples it used and how many Algorithm 5 would need to certify
  this delta (:func:`~dpmf.accounting.montecarlo.certify.minimum_samples`).
* :func:`calibrate_montecarlo` runs Algorithm 5 over candidate noise multipliers with a fallback
  noise that a *proved* accountant certifies; only this path reports ``certified=True``, for
  ``(target_epsilon, delta)`` with the failure probability folded into delta (Thm. A.1).

Cost: the encoder is kept as its ``n x bandwidth`` bands (identity: ``n x 1``; Toeplitz: its
coefficients; only a dense strategy is ``n x n``); samples run in chunks, so memory is
``O(n * (bandwidth + chunk))`` whatever the sample count; time ``O(samples * n * bandwidth)``
(:mod:`dpmf.accounting.montecarlo.losses`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from dpmf import progress
from dpmf import validation as _v
from dpmf.accounting.guard import guarded
from dpmf.accounting.montecarlo import certify as _cert
from dpmf.accounting.montecarlo.run import DIRECTIONS, MonteCarloRun, RunCallback, Sampler, new_entropy
from dpmf.accounting.montecarlo.statistics import DEFAULT_RESOLUTION, DEFAULT_UPPER, kl_upper_confidence
from dpmf.accounting.report import PrivacyReport
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.files import check_output_file

NAME = "montecarlo"
EVR_NAME = "montecarlo-evr"
BOUND = "Chernoff-Hoeffding KL upper confidence bound on the mean of [0, 1] summands (Hoeffding 1963, Thm. 1)"


def supports(strategy, scheme) -> str | None:
    """``None`` when a privacy-loss sampler covers (strategy, scheme), else the reason."""
    try:
        from dpmf.accounting.montecarlo.losses import loss_sampler_support
    except ImportError as exc:  # pragma: no cover - depends on the installed build
        return f"the Monte Carlo loss sampler is not available ({exc})"
    return loss_sampler_support(strategy, scheme)


def check_supported(strategy, scheme, sampler: Sampler | None) -> None:
    """Raise :class:`UnsupportedConfigurationError` when no loss sampler covers the pair (skipped
    for an injected ``sampler``, which is the caller's responsibility)."""
    if sampler is None:
        why = supports(strategy, scheme)
        if why is not None:
            raise UnsupportedConfigurationError(f"Monte Carlo accounting does not apply: {why}")


#: More samples than any Monte Carlo run could draw (about 30 years at 10^6 samples per second).
MAX_SAMPLES = 1e15


def samples_to_estimate(delta: float, confidence: float = 0.99, directions: int = 2) -> int:
    """Fewest samples per direction for which a Monte Carlo epsilon at ``delta`` can be finite.

    With ``s`` samples the KL upper confidence bound on delta at level ``alpha = (1 -
    confidence) / directions`` is at least ``1 - alpha^(1/s)`` (no loss above epsilon at all), so
    epsilon is infinite unless ``s >= ln(1/alpha) / -ln(1 - delta)``.

    >>> samples_to_estimate(1e-3)
    5296
    """
    delta = _v.open_unit("delta", delta)
    alpha = (1.0 - _v.open_unit("confidence", confidence)) / _v.positive_int("directions", directions)
    need = math.log(1.0 / alpha) / -math.log1p(-delta)
    if need > MAX_SAMPLES:
        raise InvalidParameterError(
            f"delta={delta!r} is too small for a Monte Carlo estimate: it needs about {need:.3g} samples per "
            f"direction (more than {MAX_SAMPLES:.0e}); use a proved accountant or a larger delta"
        )
    s = max(1, math.ceil(need))
    while kl_upper_confidence(0.0, s, alpha) > delta:  # guard the closed form against rounding
        s += 1
    return s


@guarded(NAME, supports)
def account_montecarlo(
    strategy,
    scheme,
    noise_multiplier: float,
    delta: float,
    *,
    num_samples: int = 100_000,
    seed: int | None = None,
    confidence: float = 0.99,
    checkpoint=None,
    scheduler=None,
    workers: int | None = None,
    callback: RunCallback | None = None,
    sampler: Sampler | None = None,
    chunk_size: int = 10_000,
    resolution: float = DEFAULT_RESOLUTION,
    dataset_size: int | None = None,
) -> PrivacyReport:
    """Monte Carlo epsilon (an ESTIMATE, ``certified=False``) from ``num_samples`` losses per direction.

    ``epsilon_d = min{eps >= 0 : UCB_d(eps) <= delta}`` where ``UCB_d`` is the KL upper confidence
    bound of ``delta_d(eps) = E[(1 - e^{eps - L})_+]`` at level ``(1 - confidence)/2``; epsilon is
    the max over d in {remove, add}. ``seed=None`` draws OS entropy, recorded in the report.
    With ``checkpoint`` set, an existing checkpoint of the same configuration is continued.
    ``workers=k`` samples in ``k`` local processes, ``scheduler`` on a Dask cluster (same counts).
    ``dataset_size`` is passed to the sampler (truncated b-min-sep, App. D, needs it).

    >>> from dpmf.privacy import gaussian_epsilon
    >>> from dpmf.sampling import PoissonSampling
    >>> from dpmf.strategies import Identity
    >>> def gauss(strategy, scheme, sigma, m, rng, *, direction="remove"):  # one Gaussian step
    ...     y = rng.normal(1.0 if direction == "remove" else 0.0, sigma, m)
    ...     ll = (2 * y - 1) / (2 * sigma**2)
    ...     return ll if direction == "remove" else -ll
    >>> r = account_montecarlo(Identity(1), PoissonSampling(1.0, 1), 1.0, 1e-2, num_samples=100_000,
    ...                        seed=0, sampler=gauss)
    >>> exact = gaussian_epsilon(1.0, 1e-2, 1.0)
    >>> r.certified, exact <= r.epsilon < exact + 0.2
    (False, True)
    """
    start = time.perf_counter()
    sigma = _v.noise_scale("noise_multiplier", noise_multiplier)
    delta = _v.open_unit("delta", delta)
    conf = _v.open_unit("confidence", confidence)
    check_supported(strategy, scheme, sampler)
    run = open_run(
        strategy, scheme, sigma, num_samples, seed, chunk_size, checkpoint, sampler, resolution,
        sampler_options=_options(dataset_size),
    )
    run.report_defaults = {"delta": delta, "confidence": conf}
    before, cpu0 = run.samples_done, time.process_time()
    run.run(callback=callback, scheduler=scheduler, workers=workers)
    throughput = throughput_diagnostics(run.samples_done - before, time.process_time() - cpu0, scheduler, workers)
    return montecarlo_report(run, delta, conf, seconds=time.perf_counter() - start, extra=throughput)


def montecarlo_report(
    run: MonteCarloRun, delta: float, confidence: float, *, seconds: float | None = None, extra: dict | None = None
) -> PrivacyReport:
    """The (uncertified) report of a finished or partial run (used by the CLI ``report``);
    ``extra`` entries join its diagnostics (e.g. the samples per CPU-second of the call)."""
    delta = _v.open_unit("delta", delta)
    conf = _v.open_unit("confidence", confidence)
    alpha = (1.0 - conf) / len(run.config.directions)
    by_dir, point, ucb = {}, {}, {}
    for d, h in run.histograms.items():
        if h.total == 0:
            raise InvalidParameterError(f"the run has no {d}-direction samples yet")
        by_dir[d] = h.epsilon_upper_bound(delta, alpha)
        point[d] = h.epsilon_estimate(delta)
        ucb[d] = h.delta_upper_bound(by_dir[d], alpha) if math.isfinite(by_dir[d]) else 1.0
    eps = max(by_dir.values())
    try:
        needed = _cert.minimum_samples(delta)
    except InvalidParameterError:  # pragma: no cover - only for absurdly small delta
        needed = None
    diagnostics = {
        **run.to_dict(),
        "estimate": "Monte Carlo estimate, not a proof: epsilon from upper confidence bounds on delta",
        "confidence": conf,
        "bound": BOUND,
        "epsilon_point_estimate": max(point.values()),
        "epsilon_point_estimate_by_direction": point,
        "delta_upper_bound_by_direction": ucb,
        "samples_used": min(h.total for h in run.histograms.values()),
        "samples_needed_for_certification": needed,
        "complete": run.complete,
    }
    floor = min(kl_upper_confidence(0.0, h.total, alpha) for h in run.histograms.values())
    if floor > delta:
        try:
            need = samples_to_estimate(delta, conf, len(run.config.directions))
            more = f"at least {need:,} samples per direction are drawn"
        except InvalidParameterError:  # delta beyond any feasible run
            need, more = None, f"more than {MAX_SAMPLES:.0e} samples per direction are drawn"
        diagnostics["samples_needed_to_estimate"] = need
        diagnostics["warning"] = (
            f"too few samples: even with no privacy loss above epsilon the upper confidence bound on delta "
            f"is {floor:.3g} > delta = {delta:g}; epsilon is infinite until {more} "
            f"(this run has {min(h.total for h in run.histograms.values()):,})"
        )
    if seconds is not None:
        diagnostics["seconds"] = seconds
    diagnostics.update(extra or {})
    if set(by_dir) != set(DIRECTIONS):
        diagnostics["warning"] = f"only the {sorted(by_dir)} direction(s) were sampled: not an epsilon for both"
    return PrivacyReport(
        epsilon=eps,
        delta=delta,
        noise_multiplier=run.config.noise_multiplier,
        method=NAME,
        certified=False,
        epsilon_by_direction=by_dir,
        strategy=None if run.strategy is None else run.strategy.describe(),
        scheme=None if run.scheme is None else run.scheme.describe(),
        diagnostics=diagnostics,
    )


def _options(dataset_size) -> dict:
    return {} if dataset_size is None else {"dataset_size": _v.positive_int("dataset_size", dataset_size)}


def open_run(strategy, scheme, sigma, num_samples, seed, chunk_size, checkpoint, sampler,
             resolution=DEFAULT_RESOLUTION, spawn_key=(), sampler_options=None) -> MonteCarloRun:
    """A new run, or the run stored at ``checkpoint`` if that file exists and has this configuration
    (else :class:`InvalidParameterError` naming what differs)."""
    from pathlib import Path

    if checkpoint is not None:
        check_output_file(checkpoint, "checkpoint")  # before any sampling
    if checkpoint is not None and Path(checkpoint).exists():
        run = MonteCarloRun.load(checkpoint, sampler=sampler)
        want = {
            "noise_multiplier": sigma,
            "num_samples": _v.positive_int("num_samples", num_samples),
            "chunk_size": _v.positive_int("chunk_size", chunk_size),
            "resolution": resolution,
            "sampler_options": tuple(sorted((sampler_options or {}).items())),
        }
        have = {k: getattr(run.config, k) for k in want}
        if seed is not None:
            want["entropy"], have["entropy"] = int(seed), run.config.entropy
        mismatch = {k: (have[k], want[k]) for k in want if have[k] != want[k]}
        if run.scheme is not None and scheme is not None and run.scheme.describe() != scheme.describe():
            mismatch["scheme"] = (run.scheme.describe(), scheme.describe())
        if run.strategy is not None and strategy is not None and run.strategy.describe() != strategy.describe():
            mismatch["strategy"] = (run.strategy.describe(), strategy.describe())
        if mismatch:
            raise InvalidParameterError(
                f"checkpoint {checkpoint} belongs to another configuration: "
                + "; ".join(f"{k} is {a!r} there, {b!r} here" for k, (a, b) in mismatch.items())
            )
        run.strategy, run.scheme = strategy, scheme  # the caller's objects (same description)
        return run
    return MonteCarloRun(
        strategy, scheme, sigma, num_samples, seed=seed, chunk_size=chunk_size, checkpoint=checkpoint,
        sampler=sampler, resolution=resolution, upper=DEFAULT_UPPER, spawn_key=spawn_key,
        sampler_options=sampler_options,
    )


@dataclass(frozen=True)
class MonteCarloCalibration:
    """Outcome of Algorithm 5: the released noise multiplier and its certified report.

    Attribute names match :class:`dpmf.accounting.Calibration` (``noise_multiplier``, ``report``,
    ``evaluations`` = number of candidates verified).
    """

    noise_multiplier: float
    report: PrivacyReport
    evaluations: int
    candidates: tuple[float, ...] = ()
    verdicts: dict = field(default_factory=dict)
    fallback: bool = False


PILOT_KEY = 2**31 - 1
"""Spawn key of the pilot run (candidate ``i`` uses key ``i``; no calibration has 2**31 candidates)."""


#: Bisection steps of the pilot once its bracket is a factor 2 wide: 2^(1/2^8) < 1.003.
PILOT_BISECTIONS = 8
#: Candidates at or above the pilot in the default ladder (``pilot * ratio**j``, ``j = 0 .. 3``: the
#: top one 3% above it at ratio 1.01; the pilot's own error at delta 1e-6, a few tenths of a percent
#: of sigma, is well inside). Every candidate above the released one is verified (``2 s`` samples
#: each), so the ladder's height above the pilot is the verification's cost.
CANDIDATES_ABOVE_PILOT = 4
#: Below this many samples per direction the pilot runs with all of them and the ladder reaches
#: ``ratio**(num_candidates - 3)`` above it (the 2026-11 ladder: 9.4% at the defaults): with few
#: samples (large delta) the pilot's own error is several percent, and a ladder 3% high released the
#: fallback (docs/tutorials/montecarlo.md: 3.87 where 1.39 verifies). Such runs are cheap either way.
PRECISE_PILOT_SAMPLES = 10**6


def pilot_noise(
    strategy,
    scheme,
    target_epsilon: float,
    base_delta: float,
    upper: float,
    *,
    num_samples: int,
    seed: int,
    sampler: Sampler | None = None,
    chunk_size: int = 10_000,
    sampler_options: dict | None = None,
    scheduler=None,
    workers: int | None = None,
    callback: Callable[[int, int], None] | None = None,
) -> float:
    """Point estimate (NOT a guarantee) of the smallest noise whose estimated delta(target_epsilon),
    worst direction, is <= ``base_delta``; only used to place the candidates of Algorithm 5.

    Common random numbers: every evaluation uses the pilot stream (spawn key :data:`PILOT_KEY`),
    so the estimates of two noises differ by the noise, not by the draws. The bracket is found by
    halving from ``upper`` with ``num_samples // 4`` samples per evaluation (the noises it passes
    are far from the answer: a coarse estimate places them), then :data:`PILOT_BISECTIONS`
    log-bisections with ``num_samples``. ``callback(done, total)`` counts samples over both
    directions (``total`` known once the bracket is: halving steps so far plus the bisections).
    """
    eps = _v.positive("target_epsilon", target_epsilon)
    coarse = max(1, num_samples // 4)
    done = [0]
    bisections_left = [PILOT_BISECTIONS]

    def estimate(sig: float, m: int, bisecting: bool) -> float:
        base = done[0]
        if bisecting:
            bisections_left[0] -= 1
        after = bisections_left[0] * num_samples * len(DIRECTIONS)  # the bisections still to come

        def cb(d: int, total: int) -> None:
            if callback is not None:
                callback(base + d, base + total + after)

        run = MonteCarloRun(
            strategy, scheme, sig, m, seed=seed, chunk_size=chunk_size, sampler=sampler,
            spawn_key=(PILOT_KEY,), sampler_options=sampler_options,
        ).run(scheduler=scheduler, workers=workers, callback=cb)
        done[0] += run.samples_done
        return max(h.delta_estimate(eps) for h in run.histograms.values())

    hi = _v.positive("upper", upper)
    if estimate(hi, coarse, False) > base_delta:
        return hi
    lo = hi / 2
    for _ in range(30):
        if estimate(lo, coarse, False) > base_delta:
            break
        hi, lo = lo, lo / 2
    else:
        return lo
    for _ in range(PILOT_BISECTIONS):
        mid = math.sqrt(lo * hi)
        if estimate(mid, num_samples, True) <= base_delta:
            hi = mid
        else:
            lo = mid
    return hi


@guarded(NAME, supports)
def calibrate_montecarlo(
    strategy,
    scheme,
    target_epsilon: float,
    delta: float,
    *,
    candidates: Sequence[float] | None = None,
    num_candidates: int = 12,
    ratio: float = 1.01,
    pilot_samples: int | None = None,
    num_samples: int | None = None,
    base_delta: float | None = None,
    fallback_noise_multiplier: float | None = None,
    fallback: Callable[..., tuple[float, str]] | None = None,
    seed: int | None = None,
    scheduler=None,
    workers: int | None = None,
    callback: RunCallback | None = None,
    sampler: Sampler | None = None,
    chunk_size: int = 10_000,
    dataset_size: int | None = None,
) -> MonteCarloCalibration:
    """Certified noise calibration by Algorithm 5 (Estimate-Verify-Release without empty output).

    Guarantee (Thm. A.1): the released mechanism is ``(target_epsilon, delta)``-DP where
    ``delta >= delta_o = delta_i + q (1 - delta_i)``, ``q = exp(-s KL(delta' || delta_i))``: see
    :mod:`dpmf.accounting.montecarlo.certify`. Sample size: by default ``delta' = delta / 2`` and the
    smallest certifying ``s`` (:func:`~dpmf.accounting.montecarlo.certify.minimum_samples`); given
    ``num_samples``, the largest certifying ``delta'``. The fallback M_k is the smallest noise a proved
    accountant gives at ``(target_epsilon, delta_i)``: ``fallback(strategy, scheme, target_epsilon,
    delta_i) -> (noise, method name)``; :func:`dpmf.calibrate` (``method="montecarlo"``) passes
    :func:`dpmf.accounting.dispatch.certified_fallback`, the smallest noise over every proved
    accountant (this module does not import the dispatcher: the layering is one-way). A
    ``fallback_noise_multiplier`` you pass instead is the *caller's* claim of
    (target_epsilon, delta_i)-DP. One of the two is required.
    Candidates default to ``num_candidates`` powers of ``ratio`` (1.01 as in the paper) around a
    pilot estimate, ``pilot * ratio**j`` for ``j = a - num_candidates .. a - 1`` with ``a =``
    :data:`CANDIDATES_ABOVE_PILOT` (= 4, the top one ``ratio**3`` above the pilot: every verification
    costs ``2 s`` samples, and all those above the released one are verified; before 2026-12-02 the
    ladder reached ``ratio**9`` above, about 10 verifications where 4-6 are made now; below
    :data:`PRECISE_PILOT_SAMPLES` samples it still does, with a pilot of ``s`` samples, since a pilot
    that imprecise can miss a 3% ladder), kept below the fallback (:func:`pilot_noise` with
    ``pilot_samples`` per evaluation, default ``s // 4``, or ``s`` below that size; the pilot
    uses its own random stream, independent of every
    verification, so choosing candidates with it does not affect Thm. A.1). Each candidate uses independent randomness (spawn key = its index). ``callback(done,
    total)`` reports the samples of the candidate being verified (progress is also shown as
    :mod:`dpmf.progress` tasks: the pilot, then the verifications); verification goes from the largest
    candidate down and stops at the first failure (:func:`~dpmf.accounting.montecarlo.certify.
    estimate_verify_release`).
    """
    start, cpu0 = time.perf_counter(), time.process_time()
    eps = _v.positive("target_epsilon", target_epsilon)
    dt = _v.open_unit("delta", delta)
    check_supported(strategy, scheme, sampler)
    s, dp, od = _evr_samples(dt, num_samples, base_delta)
    if fallback_noise_multiplier is None:
        if fallback is None:
            raise InvalidParameterError(
                "calibrate_montecarlo needs a certified fallback noise (Algorithm 5's M_k): pass "
                "fallback=dpmf.accounting.dispatch.certified_fallback, or fallback_noise_multiplier with your "
                "own proof; dpmf.calibrate(..., method='montecarlo') supplies the certified one"
            )
        sigma_fb, fb_method = fallback(strategy, scheme, eps, od.delta)
    else:
        sigma_fb, fb_method = _v.positive("fallback_noise_multiplier", fallback_noise_multiplier), "given by caller"
    entropy = new_entropy() if seed is None else int(seed)
    job = dict(chunk_size=chunk_size, sampler=sampler, sampler_options=_options(dataset_size), scheduler=scheduler,
               workers=workers)
    pilot, pilot_samples_used = None, 0
    if candidates is None:
        k = _v.positive_int("num_candidates", num_candidates)
        r = _v.positive("ratio", ratio)
        if r <= 1:
            raise InvalidParameterError(f"ratio must be > 1, got {ratio!r}")
        cheap = s < PRECISE_PILOT_SAMPLES  # (the pilot's error can exceed the short ladder: the long one)
        n_pilot = (s if cheap else max(1, s // 4)) if pilot_samples is None else _v.positive_int(
            "pilot_samples", pilot_samples)
        with progress.task("Algorithm 5: pilot estimate (places the candidates)", unit="samples") as bar:
            def pilot_progress(done: int, total: int) -> None:
                bar.update(completed=done, total=total)

            pilot = pilot_noise(strategy, scheme, eps, dp, sigma_fb, num_samples=n_pilot, seed=entropy,
                                callback=pilot_progress, **job)
            pilot_samples_used = int(bar.completed)
        above = min(CANDIDATES_ABOVE_PILOT if not cheap else k - 2, k)
        cands = tuple(c for c in (pilot * r**j for j in range(above - k, above)) if c < sigma_fb)
    else:
        cands = tuple(float(c) for c in candidates)
    outcome, runs = _verify_candidates(strategy, scheme, cands, s, eps, dp, entropy, callback, job)
    sigma = sigma_fb if outcome.fallback else cands[outcome.index]
    samples = pilot_samples_used + sum(run.samples_done for run in runs.values())
    cpu = time.process_time() - cpu0
    report = PrivacyReport(
        epsilon=eps,
        delta=dt,
        noise_multiplier=sigma,
        method=EVR_NAME,
        certified=True,
        epsilon_by_direction={"remove": eps, "add": eps},
        strategy=strategy.describe() if strategy is not None else None,
        scheme=scheme.describe() if scheme is not None else None,
        diagnostics={
            "algorithm": "Estimate-Verify-Release without empty output (Dong & Ganesh 2026, Alg. 5, Thm. A.1)",
            "overall_delta": od.overall,
            "internal_delta": od.delta,
            "base_delta": dp,
            "failure_probability_bound": od.failure_probability,
            "samples_per_direction_per_candidate": s,
            "samples_used": s * 2 * len(outcome.verdicts),
            "samples_needed_for_certification": s,
            "pilot_samples_used": pilot_samples_used,
            "candidates": list(cands),
            "pilot_noise_multiplier": pilot,
            "verified": _verdicts(cands, outcome, runs, eps),
            "released_fallback": outcome.fallback,
            "fallback_noise_multiplier": sigma_fb,
            "fallback_method": fb_method,
            "seed_entropy": entropy,
            "seconds": time.perf_counter() - start,
            **throughput_diagnostics(samples, cpu, scheduler, workers),
        },
    )
    return MonteCarloCalibration(sigma, report, len(outcome.verdicts), cands, dict(outcome.verdicts), outcome.fallback)


def _evr_samples(dt: float, num_samples, base_delta):
    """``(s, delta', overall delta)`` of Algorithm 5 (see :func:`calibrate_montecarlo`)."""
    if num_samples is None:
        dp = dt / 2 if base_delta is None else _v.open_unit("base_delta", base_delta)
        s = _cert.minimum_samples(dt, dp)
    else:
        s = _v.positive_int("num_samples", num_samples)
        dp = _cert.base_delta_for(s, dt) if base_delta is None else _v.open_unit("base_delta", base_delta)
    od = _cert.overall_delta(s, dp)
    if od.overall > dt:
        raise InvalidParameterError(
            f"num_samples={s} with base_delta={dp!r} certifies only delta={od.overall:.4g} > {dt!r}; "
            f"use at least {_cert.minimum_samples(dt, dp)} samples"
        )
    return s, dp, od


def _verify_candidates(strategy, scheme, cands, s, eps, dp, entropy, callback, job):
    """Algorithm 5's verifications (fresh, independent stream per candidate: spawn key = its index),
    from the largest candidate down to the first failure, shown as one progress task whose total is
    the most it can take (every candidate)."""
    runs: dict[int, MonteCarloRun] = {}
    per = s * len(DIRECTIONS)
    with progress.task("Algorithm 5: verification (stops at the first failure)", total=per * len(cands),
                       unit="samples") as bar:

        def verifier(i: int, sigma_i: float) -> bool:
            base = per * len(runs)
            bar.update(completed=base, note=f"candidate {len(runs) + 1} of at most {len(cands)}, sigma {sigma_i:.6g}")

            def cb(done: int, total: int) -> None:
                bar.update(completed=base + done)
                if callback is not None:
                    callback(done, total)

            run = MonteCarloRun(strategy, scheme, sigma_i, s, seed=entropy, chunk_size=job["chunk_size"],
                                sampler=job["sampler"], spawn_key=(i,), sampler_options=job["sampler_options"])
            runs[i] = run.run(callback=cb, scheduler=job["scheduler"], workers=job["workers"])
            return _cert.verify(run.histograms, eps, dp)

        outcome = _cert.estimate_verify_release(cands, verifier)
        bar.update(total=bar.completed)  # what it took (the total was the most it could take)
        if not all(outcome.verdicts.values()):
            bar.end_as(f"done, stopped at the first failure ({len(runs)} of {len(cands)} candidates verified)")
    return outcome, runs


def _verdicts(cands, outcome, runs, eps) -> dict:
    return {
        f"{cands[i]:.10g}": {
            "passed": ok,
            "delta_estimate": {d: h.delta_estimate(eps) for d, h in runs[i].histograms.items()},
        }
        for i, ok in sorted(outcome.verdicts.items())
    }


def throughput_diagnostics(samples: int, cpu: float, scheduler, workers) -> dict:
    """Samples drawn and their rate per CPU-second of this process (the measure of the kernel on
    this machine); with worker processes or a cluster the work ran elsewhere, so only the count."""
    out = {"samples_drawn": int(samples), "cpu_seconds": cpu}
    if scheduler is None and (workers is None or workers <= 1) and cpu > 0:
        out["samples_per_cpu_second"] = samples / cpu
    else:
        out["samples_per_cpu_second"] = None
        out["throughput_note"] = "sampled in other processes: this process's CPU time does not measure it"
    return out


__all__ = [
    "NAME",
    "EVR_NAME",
    "supports",
    "account_montecarlo",
    "montecarlo_report",
    "open_run",
    "check_supported",
    "calibrate_montecarlo",
    "pilot_noise",
    "throughput_diagnostics",
    "MonteCarloCalibration",
]
