"""The sampling probability that gives a target expected batch size after the warm start.

b-min-sep (Dong & Ganesh 2026, Algs. 1-2) draws every *available* example with probability ``p``;
an example that joins is barred for the next ``b - 1`` steps, so the expected batch is below
``p m``. After the warm start it is the stationary value ``m p0`` with ``p0 = 1 / (1/p + b - 1)``
(Sec. 3), and ``p = p0 / (1 - p0 (b - 1))`` is the closed-form answer
(:func:`~dpmf.sampling.sampling_prob_for_rate`).

Multi-attribution b-min-sep (Alg. 3) bars the whole user-sharing neighbourhood of every *interim*
draw, so the rate depends on the graph and has no closed form. Sec. 7.3 runs the sampler for a
warm-up (2000 batches, training on the last 1000) and binary-searches ``p`` until the empirical
batch size matches. :func:`calibrate_sampling_prob` does that search on the public graph (it reads
no data, so it costs no privacy): the batch size after ``warmup_steps`` is estimated by simulating
Alg. 3 (a compiled loop, the same law as :meth:`MultiAttributionMinSepSampling.batches`) and
averaging ``measure_steps`` batches; the search is regula falsi on common random numbers (one seed
for every ``p``), started from the single-attribution answer, which is a lower bound (with the same
coins, a multi-attribution batch is a subset of the single-attribution one: every example barred
there is barred here). The result carries the estimate at the returned ``p`` and its standard
error (batch means over blocks of ``max(10 min_sep, 50)`` steps): it is an estimate, and says so.

>>> from dpmf.sampling import calibrate_sampling_prob
>>> cal = calibrate_sampling_prob(100, 8, num_examples=10_000)
>>> round(cal.sampling_prob, 6), cal.method
(0.010753, 'stationary')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpmf import validation as _v
from dpmf.errors import CalibrationError, InvalidParameterError
from dpmf.sampling.schemes import Attribution, participation_rate, sampling_prob_for_rate

__all__ = ["SamplingProbCalibration", "calibrate_sampling_prob", "simulated_batch_sizes"]


@dataclass(frozen=True)
class SamplingProbCalibration:
    """A sampling probability ``p`` and the expected batch size it gives after the warm start.

    ``method="stationary"``: closed form (single attribution, warm start: exact, ``std_error = 0``).
    ``method="simulation"``: ``batch_size`` is the mean of ``measure_steps`` simulated batches after
    ``warmup_steps`` (an *estimate*, ``std_error`` its batch-means standard error; ``seed`` recorded).
    """

    sampling_prob: float
    target_batch_size: float
    batch_size: float
    std_error: float
    method: str
    min_sep: int
    num_examples: int
    warmup_steps: int | None = None
    measure_steps: int | None = None
    evaluations: int = 0
    seed: int | None = None

    @property
    def relative_error(self) -> float:
        """``batch_size / target - 1`` (of the estimate)."""
        return self.batch_size / self.target_batch_size - 1.0

    def describe(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def calibrate_sampling_prob(
    target_batch_size: float,
    min_sep: int,
    *,
    num_examples: int | None = None,
    attribution=None,
    warmup_steps: int | None = None,
    measure_steps: int = 2000,
    seed: int | None = None,
    rel_tol: float = 1e-3,
) -> SamplingProbCalibration:
    """``p`` whose expected batch size after the warm start is ``target_batch_size``.

    Single attribution (``num_examples=m``): ``p = p0 / (1 - p0 (b - 1))`` with ``p0 = target / m``
    (warm-start b-min-sep, Dong & Ganesh 2026 Sec. 3; needs ``target <= m / b``).

    Multi-attribution (``attribution``: an :class:`~dpmf.sampling.Attribution` or one iterable of
    users per example, after contribution bounding): Sec. 7.3's search (module docstring) over
    simulations of Alg. 3 with ``warmup_steps`` discarded and ``measure_steps`` averaged, until the
    estimate is within ``rel_tol`` of the target. ``seed`` (required) seeds every simulation.
    Raises :class:`~dpmf.errors.CalibrationError` when no ``p`` reaches the target (the graph bars
    too much: the largest batch seen is named).
    """
    target = _v.positive("target_batch_size", target_batch_size)
    b = _v.positive_int("min_sep", min_sep)
    if (num_examples is None) == (attribution is None):
        raise InvalidParameterError(
            "pass exactly one of num_examples (single attribution, closed form) and attribution "
            "(multi-attribution, simulated)"
        )
    if attribution is None:
        m = _v.positive_int("num_examples", num_examples)
        p = _single_prob(target, m, b)
        return SamplingProbCalibration(p, target, participation_rate(p, b) * m, 0.0, "stationary", b, m)
    from dpmf.sampling.bounding import as_attribution

    att = as_attribution(attribution)
    m = att.num_examples
    if warmup_steps is None or isinstance(warmup_steps, bool) or not isinstance(warmup_steps, (int, np.integer)) \
            or warmup_steps < 0:
        raise InvalidParameterError(
            f"warmup_steps must be an integer >= 0 for a multi-attribution calibration (the batches generated and "
            f"discarded before training, the scheme's warmup_steps; Sec. 7.3 used 1000), got {warmup_steps!r}"
        )
    steps = _v.positive_int("measure_steps", measure_steps)
    if seed is None or isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidParameterError(f"seed must be an integer >= 0 (the simulations' seed), got {seed!r}")
    tol = _v.positive("rel_tol", rel_tol)
    evals = 0

    def f(p: float) -> np.ndarray:
        nonlocal evals
        evals += 1
        return simulated_batch_sizes(att, p, b, int(warmup_steps), steps, int(seed))

    lo = _single_prob(target, m, b)  # multi-attribution batches are subsets: f(lo) <= target
    sizes = f(lo)
    flo = float(sizes.mean())
    best = (abs(flo - target), lo, sizes)
    if abs(flo - target) > tol * target:
        hi, fhi = lo, flo
        largest = flo
        while fhi < target:
            if hi >= 1.0:
                raise CalibrationError(
                    f"no sampling probability gives an expected batch of {target:g} after {warmup_steps} warm-up steps "
                    f"with min_sep={b} on this graph ({m} examples): the largest simulated mean was {largest:.4g}; "
                    "lower the target or min_sep, or bound contributions harder (max_neighbourhood)"
                )
            lo, flo = hi, fhi
            hi = min(1.0, 2.0 * hi)
            sizes = f(hi)
            fhi = float(sizes.mean())
            largest = max(largest, fhi)
        best = min(best, (abs(fhi - target), hi, sizes), key=lambda t: t[0])
        side = 0
        for _ in range(60):  # Illinois regula falsi on the CRN estimates
            if best[0] <= tol * target or hi - lo <= 1e-9 * hi:
                break
            p = hi - (fhi - target) * (hi - lo) / (fhi - flo) if fhi != flo else 0.5 * (lo + hi)
            if not lo < p < hi:
                p = 0.5 * (lo + hi)
            sizes = f(p)
            fp = float(sizes.mean())
            best = min(best, (abs(fp - target), p, sizes), key=lambda t: t[0])
            if fp < target:
                lo, flo = p, fp
                if side == -1:
                    fhi = target + (fhi - target) / 2
                side = -1
            else:
                hi, fhi = p, fp
                if side == 1:
                    flo = target + (flo - target) / 2
                side = 1
    _, p, sizes = best
    return SamplingProbCalibration(float(p), target, float(sizes.mean()), _batch_means_se(sizes, b), "simulation", b,
                                   m, int(warmup_steps), steps, evals, int(seed))


def _single_prob(target: float, m: int, b: int) -> float:
    if target > m / b:
        raise InvalidParameterError(
            f"target_batch_size={target:g} is above num_examples / min_sep = {m}/{b} = {m / b:g}, the largest expected "
            "batch b-min-sep can have (each example joins at most once every min_sep steps)"
        )
    return sampling_prob_for_rate(target / m, b)


def _batch_means_se(sizes: np.ndarray, b: int) -> float:
    """Standard error of the mean of a stationary series by batch means over blocks of ``max(10 b, 50)``
    steps (a user's barring couples batches for about ``b`` steps; long blocks keep the error honest)."""
    block = max(10 * b, 50)
    k = sizes.size // block
    if k < 2:
        return math.nan
    means = sizes[: k * block].reshape(k, block).mean(axis=1)
    return float(means.std(ddof=1) / math.sqrt(k))


def simulated_batch_sizes(attribution, sampling_prob: float, min_sep: int, warmup_steps: int, steps: int,
                          seed: int) -> np.ndarray:
    """Batch sizes of ``steps`` steps of multi-attribution b-min-sep (Alg. 3) after ``warmup_steps``.

    Same law as :meth:`~dpmf.sampling.MultiAttributionMinSepSampling.batches` (a compiled loop with
    its own generator seeded by ``seed``; not the same draws): each step every example enters the
    interim sample with probability ``p``; it joins the batch unless one of its users had an
    interim example in the previous ``b - 1`` steps; then every user of an interim example is
    barred for the next ``b - 1`` steps. For a one-user-per-example graph this is cold-start
    b-min-sep (Alg. 1).
    """
    from dpmf.sampling.bounding import as_attribution

    att = attribution if isinstance(attribution, Attribution) else as_attribution(attribution)
    p = _v.probability("sampling_prob", sampling_prob)
    return _kernel()(int(seed), p, _v.positive_int("min_sep", min_sep), int(warmup_steps),
                     _v.positive_int("steps", steps), att.example_ptr, att.user_of, att.num_users)


_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        import numba as nb

        _KERNEL = nb.njit(cache=True)(_alg3_sizes)
    return _KERNEL


def _alg3_sizes(seed, p, b, warmup, steps, ex_ptr, user_of, num_users):
    np.random.seed(seed)
    m = ex_ptr.size - 1
    until = np.zeros(num_users, dtype=np.int64)  # user u is barred at steps t < until[u]
    interim = np.empty(m, dtype=np.int64)
    out = np.empty(steps, dtype=np.float64)
    log_q = math.log1p(-p) if p < 1.0 else -math.inf
    for t in range(warmup + steps):
        k = 0
        size = 0
        e = -1
        while True:  # the interim sample by geometric gaps: O(m p) draws per step
            if p >= 1.0:
                e += 1
            else:
                e += 1 + int(math.floor(math.log(1.0 - np.random.random()) / log_q))
            if e >= m:
                break
            interim[k] = e
            k += 1
            free = True
            for j in range(ex_ptr[e], ex_ptr[e + 1]):
                if until[user_of[j]] > t:
                    free = False
                    break
            if free:
                size += 1
        if b > 1:
            for i in range(k):
                e = interim[i]
                for j in range(ex_ptr[e], ex_ptr[e + 1]):
                    until[user_of[j]] = t + b
        if t >= warmup:
            out[t - warmup] = size
    return out
