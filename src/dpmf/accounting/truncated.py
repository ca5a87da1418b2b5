r"""Truncated (and padded) Poisson and cyclic Poisson sampling: sound PLD accounting.

Samplers: :class:`~dpmf.sampling.PoissonSampling` and :class:`~dpmf.sampling.CyclicPoissonSampling`
with ``max_batch_size = B`` (a batch larger than ``B`` is cut to a uniform subset of size ``B``, every
batch padded with zero-weight examples; Chua et al. 2024, "Scalable DP-SGD: shuffling vs. Poisson
subsampling"). Papers: Ganesh 2025, "Tighter privacy analysis for truncated Poisson sampling"
(arXiv 2508.15089: reveal to the adversary whether a round was truncated) and Dong & Ganesh 2026
(paper 001) App. D, Lemma D.1 and Cor. D.2 (the worst case of a truncated round). Zero-out adjacency:
the dataset size ``m`` is public and the zeroed example keeps its slot (it is sampled and truncated
like any other), so the truncation events have the same law under both datasets.

**Analysis** (one *round* = one step in which the target example can be sampled; DP-SGD: every step,
``pool = m - 1`` other examples; cyclic Poisson with ``b = cycle_length``: the ``ceil(steps / b)``
steps of the target's group, ``pool`` = the largest group size minus one, and a b-banded ``C >= 0``
with ``bands <= b`` so that the rounds touch disjoint output blocks, as in the untruncated cyclic
reduction). Let ``r ~ Binomial(pool, q)`` be the number of *other* examples sampled in the round and
``I = 1{r >= B}`` (the round truncates if the target is sampled). ``I`` is revealed to the adversary
(post-processing: a sound over-approximation). With ``Delta`` the largest column norm of ``C``:

* ``I = 0``: nothing is cut; the round is the Poisson-subsampled Gaussian ``((1-q) N(0) + q N(Delta),
  N(0))``.
* ``I = 1``: also reveal the uniform ``B``-subset ``S`` of the sampled others and ``u in S`` (their law
  does not depend on ``r``); the target survives with some probability ``s <= q`` and then replaces
  ``u``. Relative to ``sum(S)`` the round is ``((1-s) N(0) + s N(g - g_u), (1-s) N(0) + s N(-g_u))``
  with ``||g - g_u|| <= 2 Delta``, ``||g_u|| <= Delta`` (Lemma D.1 / Cor. D.2's ``x = 2``, ``y = -1``).
  By joint convexity of the hockey-stick divergence over the target's coin, this pair is dominated
  (every ``H_alpha``, both directions) by ``B_q``: "with probability ``q`` a Gaussian of sensitivity
  ``3 Delta``, else nothing" -- the same pair as ``s -> q`` (loose by the survival factor
  ``E[B/(r+1) | r >= B] < 1`` and by ``3`` against Cor. D.2's ``2`` vs ``-1``; left for a tighter
  analysis).
* ``B_q`` also dominates the ``I = 0`` pair (``q H(N(Delta), N(0)) <= q H(N(3 Delta), N(0))``), so the
  per-round PLD ``(1 - tau) PLD_0 + tau PLD(B_q)`` only grows with ``tau``: any **upper bound**
  ``tau >= P[Binomial(pool, q) >= B]`` is sound (:func:`binomial_tail_upper`). The rounds compose
  (adaptive composition of dominating pairs).

``B >= pool + 1`` gives ``tau = 0``: exactly the untruncated accountant (DP-SGD's PLD, resp. the
cyclic reduction). When truncation is rare (``tau`` ~ 1e-9, the production case of paper 001 Sec.
7.4) the truncated epsilon is within discretization of the untruncated one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from dpmf import validation as _v
from dpmf.accounting.guard import guarded
from dpmf.accounting.report import PrivacyReport, pld_report
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.privacy.gaussian_plds import discretization_diagnostics, gaussian, step_discretization, subsampled_gaussian
from dpmf.privacy.pld import DEFAULT_DISCRETIZATION, PrivacyLossDistribution
from dpmf.sampling.schemes import CyclicPoissonSampling, PoissonSampling
from dpmf.strategies.identity import Identity

__all__ = [
    "NAME",
    "TruncationAnalysis",
    "account_truncated",
    "binomial_tail_upper",
    "supports",
    "truncated_round_pld",
    "truncation_analysis",
    "truncation_refusal",
]

NAME = "truncated_pld"

#: Relative margin put on every computed binomial tail (both float64 evaluations agree far better).
TAIL_MARGIN = 1e-6

ANALYSIS = (
    "truncated Poisson, truncation revealed (Ganesh 2025; Dong & Ganesh 2026 Lemma D.1): a round "
    "truncates with probability <= tau (upper bound on P[Binomial(pool, q) >= max_batch_size]); "
    "untruncated rounds are the subsampled Gaussian, truncated ones are dominated by a Gaussian of "
    "sensitivity 3 x column norm run with probability q"
)


def truncation_refusal(scheme, method: str) -> str | None:
    """The reason accountant ``method`` refuses a truncated Poisson / cyclic Poisson scheme, or
    ``None`` when ``scheme`` has no ``max_batch_size`` (methods that ignore truncation would
    certify the wrong mechanism)."""
    if isinstance(scheme, (PoissonSampling, CyclicPoissonSampling)) and scheme.max_batch_size is not None:
        return (
            f"{method} does not analyse truncated batches (max_batch_size={scheme.max_batch_size}); "
            f"use method='{NAME}'"
        )
    return None


def binomial_tail_upper(trials: int, prob: float, k: int) -> float:
    """An upper bound on ``P[Binomial(trials, prob) >= k]``, pessimistic by construction.

    Two float64 evaluations are taken: SciPy's ``binom.sf`` (regularized incomplete beta) and, when
    ``k`` is above the mode, our own sum of the log-pmf terms ``k, k+1, ...`` (``gammaln``) closed by
    the geometric bound ``term * rho / (1 - rho)`` (the ratio ``rho_j = (trials-j)/(j+1) *
    prob/(1-prob)`` of consecutive terms decreases past the mode). The larger of the two, times
    ``1 + TAIL_MARGIN``, capped at 1, is returned: both evaluations are accurate to ~1e-9 relative
    (``gammaln`` of arguments up to 1e9), far inside the margin.

    >>> round(binomial_tail_upper(10, 0.5, 10) / 0.5 ** 10, 6)
    1.000001
    """
    from scipy import special, stats

    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or int(trials) < 0:
        raise InvalidParameterError(f"trials must be an integer >= 0, got {trials!r}")
    n = int(trials)
    q = _v.probability("prob", prob, allow_zero=True)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InvalidParameterError(f"k must be an integer, got {k!r}")
    k = int(k)
    if k <= 0:
        return 1.0
    if k > n or q == 0.0:
        return 0.0
    if q == 1.0:
        return 1.0
    values = [float(stats.binom.sf(k - 1, n, q))]
    if k > (n + 1) * q:  # past the mode: direct sum with a geometric remainder
        log_ratio_q = math.log(q) - math.log1p(-q)
        j = np.arange(k, min(n, k + 200_000) + 1, dtype=np.float64)
        logpmf = (
            special.gammaln(n + 1.0) - special.gammaln(j + 1.0) - special.gammaln(n - j + 1.0)
            + j * math.log(q) + (n - j) * math.log1p(-q)
        )
        top = float(logpmf.max())
        total = float(np.exp(logpmf - top).sum())
        last = j[-1]
        if last < n:
            rho = (n - last) / (last + 1.0) * math.exp(log_ratio_q)
            total += math.exp(logpmf[-1] - top) * rho / (1.0 - rho) if rho < 1 else math.inf
        values.append(math.exp(top) * total)
    return min(1.0, max(values) * (1.0 + TAIL_MARGIN))


@dataclass(frozen=True)
class TruncationAnalysis:
    """The sigma-free part of the analysis: ``rounds`` rounds, each a truncated subsampled Gaussian
    with probability ``sampling_prob``, ``pool`` other examples in the target's pool, column norm
    ``sensitivity`` and truncation probability at most ``truncation_bound``."""

    rounds: int
    sampling_prob: float
    pool: int
    max_batch_size: int
    sensitivity: float
    truncation_bound: float

    def describe(self) -> dict:
        return {
            "analysis": ANALYSIS,
            "rounds": self.rounds,
            "sampling_prob": self.sampling_prob,
            "pool": self.pool,
            "max_batch_size": self.max_batch_size,
            "column_norm": self.sensitivity,
            "truncation_probability_bound": self.truncation_bound,
        }


def _column_norm(strategy, cycle: int) -> float | str:
    """Largest column norm of a non-negative lower-triangular ``C`` with ``bands <= cycle``, or the
    reason it does not qualify."""
    if isinstance(strategy, Identity):
        return 1.0
    from dpmf.accounting.montecarlo.losses import strategy_bands  # (lazy: montecarlo imports this module)
    from dpmf.errors import DPMFError

    try:
        bands = strategy_bands(strategy)
    except DPMFError as exc:
        return str(exc)
    if bands.w > cycle:
        what = "Poisson sampling needs a diagonal C (1 band)" if cycle == 1 else (
            f"cyclic Poisson needs bands <= cycle_length={cycle}"
        )
        return f"truncated accounting: {what}; C has {bands.w} bands"
    return float(math.sqrt(float(np.max(bands.sq))))


def _pool_and_rounds(scheme) -> tuple[int, int] | str:
    m = scheme.dataset_size
    if m is None:
        return (
            "truncated accounting needs the scheme's dataset_size (the number of examples, public under "
            "zero-out adjacency): pass dataset_size=... to the scheme"
        )
    if isinstance(scheme, PoissonSampling):
        return m - 1, scheme.steps
    if scheme.partition != "equal":
        return (
            "truncated cyclic Poisson is accounted for partition='equal' (public group sizes); with "
            "'independent' the target's group size is random and shared by its rounds"
        )
    b = scheme.cycle_length
    if m < b:
        return f"dataset_size={m} must be >= cycle_length={b} for partition='equal'"
    return -(-m // b) - 1, -(-scheme.steps // b)


def supports(strategy, scheme) -> str | None:
    """``None`` when this method applies: truncated Poisson with a diagonal ``C >= 0`` or truncated
    cyclic Poisson (equal partition) with a banded ``C >= 0``, ``bands <= cycle_length``, and the
    scheme's ``dataset_size`` set; else the reason."""
    if not isinstance(scheme, (PoissonSampling, CyclicPoissonSampling)):
        return f"the truncated accountant covers Poisson and cyclic Poisson sampling, not {type(scheme).__name__}"
    if scheme.max_batch_size is None:
        return "the scheme has no max_batch_size (untruncated: use the pld or mmcc accountant)"
    pr = _pool_and_rounds(scheme)
    if isinstance(pr, str):
        return pr
    cycle = scheme.cycle_length if isinstance(scheme, CyclicPoissonSampling) else 1
    norm = _column_norm(strategy, cycle)
    return norm if isinstance(norm, str) else None


def truncation_analysis(strategy, scheme) -> TruncationAnalysis:
    """The :class:`TruncationAnalysis` of a supported pair (module docstring)."""
    why = supports(strategy, scheme)
    if why is not None:
        raise UnsupportedConfigurationError(f"method {NAME!r} does not apply: {why}")
    pool, rounds = _pool_and_rounds(scheme)
    cycle = scheme.cycle_length if isinstance(scheme, CyclicPoissonSampling) else 1
    q, B = float(scheme.sampling_prob), int(scheme.max_batch_size)
    return TruncationAnalysis(rounds, q, pool, B, float(_column_norm(strategy, cycle)), binomial_tail_upper(pool, q, B))


def _mixture(plds_and_weights) -> PrivacyLossDistribution:
    """The PLD of a round whose branch ``i`` (revealed to the adversary) has probability ``w_i``."""
    (acc, w_acc), *rest = [(p.to_dp_accounting(), w) for p, w in plds_and_weights if w > 0]
    for pld, w in rest:
        total = w_acc + w
        acc = acc.compute_mixture(pld, w_acc / total)
        w_acc = total
    return PrivacyLossDistribution.from_dp_accounting(acc)


def truncated_round_pld(
    noise_multiplier: float,
    sampling_prob: float,
    truncation_bound: float,
    sensitivity: float = 1.0,
    *,
    discretization: float = DEFAULT_DISCRETIZATION,
) -> PrivacyLossDistribution:
    """PLD of one truncated round: ``(1 - tau)`` the subsampled Gaussian ``(q, Delta)``,
    ``tau (1 - q)`` nothing and ``tau q`` the Gaussian of sensitivity ``3 Delta`` (module docstring).
    Pessimistic: each component is a pessimistic PLD and ``delta(eps)`` of a mixture is the same
    mixture of the components' ``delta(eps)``."""
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    q = _v.probability("sampling_prob", sampling_prob)
    tau = _v.probability("truncation_bound", truncation_bound, allow_zero=True)
    delta_c = _v.positive("sensitivity", sensitivity)
    base = subsampled_gaussian(sigma, q, delta_c, discretization=discretization)
    if tau == 0.0:
        return base
    parts = [(base, 1.0 - tau), (PrivacyLossDistribution.identity(discretization), tau * (1.0 - q))]
    parts.append((gaussian(sigma, 3.0 * delta_c, discretization=discretization), tau * q))
    return _mixture(parts)


def round_discretization(noise_multiplier: float, analysis: TruncationAnalysis, discretization: float) -> float:
    """The grid of :func:`truncated_round_pld` at this noise: ``discretization`` where both of its
    Gaussian parts fit, else a coarser one (:func:`~dpmf.privacy.gaussian_plds.step_discretization`,
    the rule every PLD accountant follows)."""
    parts = [(noise_multiplier, analysis.sampling_prob, analysis.sensitivity)]
    if analysis.truncation_bound > 0:
        parts.append((noise_multiplier, 1.0, 3.0 * analysis.sensitivity))
    return step_discretization(discretization, parts)


@guarded(NAME, supports)
def account_truncated(
    strategy,
    scheme,
    noise_multiplier: float,
    delta: float,
    *,
    discretization: float = DEFAULT_DISCRETIZATION,
) -> PrivacyReport:
    """Report for truncated (padded) Poisson / cyclic Poisson sampling (module docstring): the
    composition of ``rounds`` :func:`truncated_round_pld` rounds. ``diagnostics["analysis"]`` says
    which analysis was used, with the truncation probability bound, pool, rounds and column norm."""
    start = time.perf_counter()
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    a = truncation_analysis(strategy, scheme)
    requested = _v.positive("discretization", discretization)
    discretization = round_discretization(sigma, a, requested)
    pld = truncated_round_pld(
        sigma, a.sampling_prob, a.truncation_bound, a.sensitivity, discretization=discretization
    ).self_compose(a.rounds)
    return pld_report(
        pld, delta=delta, noise_multiplier=sigma, method=NAME, strategy=strategy, scheme=scheme,
        note=f"pessimistic PLD of {a.rounds} truncated Poisson rounds (q = {a.sampling_prob:g}, max batch "
             f"{a.max_batch_size}, truncation probability <= {a.truncation_bound:.3g})",
        diagnostics={**a.describe(), **discretization_diagnostics(requested, discretization)}, start=start,
    )
