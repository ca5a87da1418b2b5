"""One candidate of ``dpmf plan``: calibrated to the target, or pruned with a sound bound.

**Pruning.** A candidate is compared with ``threshold``, the best prefix RMSE of the earlier waves.
With ``r`` its prefix RMSE per unit noise, it could only beat the threshold with a noise below
``sigma_0 = threshold / r``. The calibration is told so (``dpmf.calibrate(...,
max_noise_multiplier=sigma_0)``): its accountants are evaluated once at ``sigma_0`` and, when
every one reports an epsilon above the target there, the candidate is *pruned* -- its calibrated
noise would be larger than ``sigma_0`` (epsilon is non-increasing in the noise), so its RMSE is
larger than the threshold and it cannot be the best row. Pruning decides only which rows are
calibrated precisely; it never makes a reported epsilon unsound or changes which row is best (a
search that passes ``sigma_0`` starts there, so a calibrated noise may differ from an unpruned
plan's within the calibration's tolerance, ``REL_TOL``), and a pruned row
says it is a bound. The check costs one evaluation, at a noise where the candidate is no better
than a row already found (accountants get cheaper as the noise grows).

**The optimal factorization** (dense, ``O(n^3)``) is the costly strategy to build. The plan stops
its Newton iterations at a relative duality gap of ``spec.gap`` (1% above 256 steps): the C it
returns is feasible and its sensitivity and epsilon are computed for that very C, so the row is as
sound as any other; the gap certifies that its RMSE is within about ``gap / 2`` of the optimum, and
the row's note says so. Bounds also prune it, cheapest first: ``sigma_1 * ||A||_* / sqrt(b n)``
(:func:`fixed_order_rmse_bound`, closed form, holds for *every* C under the fixed epoch order;
``sigma_1`` is the noise of a sensitivity-1 strategy), then, during the iterations,
``sigma_1 * sqrt(dual / n)`` (``dual`` the certified lower bound on the optimal loss): once a bound
is at least the threshold, the optimal factorization cannot beat the best row and is not built.
"""

from __future__ import annotations

import math
import time

from dpmf.planning.candidates import REL_TOL, Candidate, TrainingRun, optimal_strategy
from dpmf.planning.rows import PlanRow, dense_arrays
from dpmf.sampling.schemes import MinSepSampling


def fixed_order_rmse_bound(n: int, epochs: int) -> float:
    """A lower bound on ``sens(C) * rmse(C)`` (prefix-sum RMSE per unit noise at sensitivity 1) for
    *every* encoder C under the (k, b) fixed epoch order (k = ``epochs``, b = n // k):
    ``||A||_* / sqrt(b n)`` with ``A`` the prefix-sum matrix.

    Proof: with orthogonal unit contributions at the k steps of a pattern, ``sens(C)^2 >=
    sum_{i in pattern} X_ii`` (``X = C^T C``); summing over the b patterns, ``tr X <= b sens^2``. By
    Cauchy-Schwarz, ``tr(A^T A)^{1/2} = tr(X^{1/2} X^{-1/2} (A^T A)^{1/2}) <= sqrt(tr X tr(A^T A X^{-1}))``,
    so the loss ``tr(A^T A X^{-1}) >= ||A||_*^2 / (b sens^2)``, and ``rmse^2 = loss / n``. The
    singular values of the n x n prefix-sum matrix are ``1 / (2 sin((2j - 1) pi / (4n + 2)))``,
    ``j = 1..n``. (This is the dual function of the optimal factorization at ``U = c I``.)"""
    import numpy as np

    b = n // epochs
    j = np.arange(1, n + 1, dtype=np.float64)
    nuclear = float(np.sum(1.0 / (2.0 * np.sin((2 * j - 1) * np.pi / (4 * n + 2)))))
    return nuclear / math.sqrt(b * n) * (1 - 1e-12)


def make_row(cand: Candidate, run: TrainingRun, *, method, sigma, epsilon, certified, rmse, start, pruned=False,
         note="", report=None) -> PlanRow:
    """The row of ``cand``: with ``report`` (a calibration's) its options and both directions; the
    strategy spec whenever the strategy was built (a pruned optimal factorization may never be)."""
    import json

    built = cand.__dict__.get("strategy")  # (the cached_property, when it ran)
    spec = None if built is None else json.loads(json.dumps(built.describe()))
    options = report.options if report is not None else (cand.options or {})
    return PlanRow(
        strategy=cand.strategy_name,
        sampling=cand.sampling_name,
        method=method,
        noise_multiplier=float(sigma),
        epsilon=float(epsilon),
        certified=bool(certified),
        prefix_sum_rmse=float(rmse),
        rmse_per_example_in_batch=float(rmse) / run.batch_size,
        seconds=time.perf_counter() - start,
        pruned=pruned,
        label=cand.label,
        note=note,
        strategy_spec=spec,
        scheme_spec=json.loads(json.dumps(cand.scheme.describe())),
        recipe=cand.spec.key(),
        options=json.loads(json.dumps(dict(options))),
        epsilon_by_direction={} if report is None else {k: float(v) for k, v in report.epsilon_by_direction.items()},
        run=run.describe(),
        matrices=() if built is None else dense_arrays(built),
    )


def min_sep_note(cand: Candidate, run: TrainingRun) -> str:
    """The note of a b-min-sep row certified by the unamplified min-sep sensitivity bound: what it
    credits (nothing of the sampling) and what certifying the tighter Monte Carlo bound would cost
    (Algorithm 5 at this delta: the samples of one verification, from
    :func:`dpmf.accounting.montecarlo.certify.minimum_samples`, and the CPU time of a calibration,
    from :func:`dpmf.accounting.cost.accounting_cost`; both rough estimates)."""
    from dpmf.accounting.cost import accounting_cost
    from dpmf.accounting.montecarlo.certify import minimum_samples
    from dpmf.resources import format_seconds

    s = cand.scheme
    samples = minimum_samples(run.delta)
    cpu = accounting_cost(cand.strategy, s, method="montecarlo", calibrate=True, delta=run.delta).seconds
    return (
        f"certified by the min-sep sensitivity bound ({s.max_participations} participations at least {s.min_sep} "
        "steps apart; no credit for the sampling's randomness, the only proved b-min-sep bound that finishes in "
        f"seconds). Certifying the tighter Monte Carlo bound (Algorithm 5: dpmf montecarlo calibrate) would take "
        f"about {samples:,} samples per direction per verification and ~{format_seconds(cpu)} of CPU (an estimate; "
        "divide by the workers, Dask cluster or GPU it runs on)"
    )


def estimate_montecarlo(cand: Candidate, run: TrainingRun):
    """Monte Carlo row: smallest noise whose *estimated* epsilon (fixed seed, upper confidence
    bound) meets the target. An ESTIMATE (``certified=False``); certify a chosen configuration with
    ``dpmf calibrate --method montecarlo`` (Estimate-Verify-Release)."""
    from dpmf.accounting.dispatch import METHODS, Calibration
    from dpmf.privacy.calibration import smallest_noise

    m = METHODS["montecarlo"]

    def report(sigma: float):
        return m.run(cand.strategy, cand.scheme, sigma, run.delta, **(cand.options or {}))

    res = smallest_noise(lambda s: report(s).epsilon, run.epsilon, rel_tol=1e-3)
    return Calibration(res.value, report(res.value), res.evaluations)


def evaluate(cand: Candidate, run: TrainingRun, threshold: float = math.inf, *, callback=None) -> PlanRow:
    """The row of ``cand``: calibrated, or pruned when it provably cannot beat ``threshold``
    (a prefix RMSE; ``inf``: calibrate whatever it costs). ``callback(sigma, epsilon)`` after each
    evaluation of the calibration (:func:`dpmf.calibrate`'s; the plan's time budget keeps them)."""
    from dpmf.accounting.dispatch import calibrate
    from dpmf.privacy.calibration import NoiseLimitExceeded
    from dpmf.privacy.gdp import gdp_mu

    start = time.perf_counter()
    note = ""
    if cand.spec.kind == "optimal" and "strategy" not in cand.__dict__:
        sigma_1 = 1.0 / gdp_mu(run.epsilon, run.delta)  # noise of a sensitivity-1 strategy
        n = cand.spec.n
        closed = sigma_1 * fixed_order_rmse_bound(n, cand.spec.epochs) * (1 - 1e-9)
        if closed >= threshold:
            return make_row(
                cand, run, method="unamplified", sigma=sigma_1, epsilon=run.epsilon, certified=True, rmse=closed,
                start=start, pruned=True,
                note="closed-form bound for every factorization under this participation (nuclear norm)",
            )

        def bound(dual: float) -> float:  # a certified lower bound on the row's prefix RMSE
            return sigma_1 * math.sqrt(max(dual, 0.0) / n) * (1 - 1e-9)

        strategy, res = optimal_strategy(cand.spec, stop=lambda dual: bound(dual) >= threshold)
        if strategy is None:
            return make_row(
                cand, run, method="unamplified", sigma=sigma_1, epsilon=run.epsilon, certified=True,
                rmse=bound(res.dual), start=start, pruned=True,
                note=f"certified duality bound on the optimal factorization after {res.iterations} Newton iterations",
            )
        cand.__dict__["strategy"] = strategy
        if cand.spec.gap and cand.spec.gap > 1e-6:
            note = (
                f"Newton stopped at a {100 * res.rel_gap:.2g}% duality gap after {res.iterations} iterations: "
                f"prefix RMSE within {100 * (1 / math.sqrt(1 - min(res.rel_gap, 0.5)) - 1):.2g}% of the optimum "
                "(sensitivity and epsilon computed for this C)"
            )
    if cand.method == "montecarlo":
        cal = estimate_montecarlo(cand, run)
        per_sigma = cand.rmse_per_sigma()
    else:
        per_sigma = cand.rmse_per_sigma()
        limit = threshold / per_sigma if math.isfinite(threshold) and per_sigma > 0 else None
        try:
            cal = calibrate(
                cand.strategy, cand.scheme, run.epsilon, run.delta, method=cand.method, rel_tol=REL_TOL,
                max_noise_multiplier=limit, callback=callback, **(cand.options or {}),
            )
        except NoiseLimitExceeded as exc:  # (pruned: the row names the accountant that bounded it, not "auto")
            method = getattr(exc, "method", None) or cand.method
            return make_row(
                cand, run, method=method, sigma=exc.limit, epsilon=exc.epsilon, certified=True,
                rmse=exc.limit * per_sigma, start=start, pruned=True,
                note=f"epsilon {'>= ' if exc.lower_bound else ''}{exc.epsilon:.4g} > {run.epsilon:g} already at sigma {exc.limit:.4g}",
            )
    if cal.report.method == "unamplified" and isinstance(cand.scheme, MinSepSampling):
        note = min_sep_note(cand, run)
    return make_row(
        cand, run, method=cal.report.method, sigma=cal.noise_multiplier, epsilon=cal.report.epsilon,
        certified=cal.report.certified, rmse=cal.noise_multiplier * per_sigma, start=start, note=note,
        report=cal.report,
    )
