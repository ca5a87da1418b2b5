r"""The random-allocation accountant: the tighter of the Rényi and conditional-composition bounds.

Schuchardt & Kalinin (arXiv 2601.21636); digest ``notes/random-allocation.md`` §3.8. Both
accountants are sound upper bounds on the same privacy profile, so per direction the smaller
epsilon at the same delta is one too; the reported epsilon is the worst direction
(zero-out adjacency: remove = P with the example, add = the reverse).

Applies to :class:`~dpmf.sampling.BallsInBinsSampling` (``k`` epochs of ``b`` steps, each example in
one uniformly random step per epoch, reused) with a lower-triangular, entrywise non-negative encoder
``C`` (Lemma 2.8). ``noise_multiplier`` is ``sigma`` for ``C`` as given (clip norm 1). For
``C = I`` (DP-SGD; ``k`` epochs reduce to one at ``sigma / sqrt(k)``) both bounds run the fast
paths of :mod:`dpmf.accounting.allocation.identity` (the same bounds in ``O(A^2 log b)`` and
``O(b)``, nothing ``b x b`` built), at any ``b``.

>>> from dpmf.strategies import Identity
>>> from dpmf.sampling import BallsInBinsSampling
>>> r = account_allocation(Identity(8), BallsInBinsSampling(1, 8), 1.0, 1e-8, which="renyi")
>>> round(r.epsilon, 3), r.certified    # Feldman & Shenfeld's direct RDP bound: 4.036
(4.036, True)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from dpmf import validation as _v
from dpmf.accounting.guard import guarded
from dpmf.accounting.allocation.conditional import (DEFAULT_TEMPERATURES, composition_delta_lower_bound, conditional_cost,
                                                   conditional_epsilon, conditional_pairs)
from dpmf.accounting.allocation.dominating_pair import describe_strategy, gram_matrix, mixture_means, pair_problem
from dpmf.accounting.allocation.identity import identity_conditional_cost, identity_conditional_epsilon
from dpmf.accounting.allocation.noise_search import smallest_noise_and_report
from dpmf.accounting.allocation.renyi import DEFAULT_BUDGET, DEFAULT_MAX_BANDWIDTH, RenyiAllocation
from dpmf.accounting.reductions import identity_epochs_reduction
from dpmf.accounting.report import PrivacyReport
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.numerics import UNIT_ROUNDOFF
from dpmf.privacy.calibration import NoiseLimitExceeded, ProgressCallback, check_limit, smallest_noise
from dpmf.privacy.gdp import gaussian_epsilon
from dpmf.privacy.rdp import rdp_to_epsilon
from dpmf.sampling.schemes import BallsInBinsSampling
from dpmf.strategies.identity import Identity

__all__ = ["NAME", "supports", "AllocationProblem", "account_allocation", "calibrate_allocation", "noise_and_report",
           "epsilon_lower_bound"]

NAME = "allocation"
WHICH = ("combined", "renyi", "conditional")
#: Conditional composition is skipped in "combined" mode when its estimated time exceeds this
#: many seconds (:func:`~dpmf.accounting.allocation.conditional.conditional_cost`, which reads
#: the means: N = 1000 runs for banded strategies, e.g. about 5 s for BSR with 4 bands at k = 1 or
#: k = 10, and 17-25 s for a dense Toeplitz C at k = 10, b = 100; a dense C at k = 1, b = 1000
#: is estimated far above it); ``which="conditional"`` always runs, and so does the identity's
#: fast path (``O(b)``: about 30 s at b = 10^5), so ``method="auto"`` never skips it for DP-SGD.
DEFAULT_CONDITIONAL_BUDGET = 30.0


def supports(strategy, scheme) -> str | None:
    """``None`` when the accountant applies, else the reason it does not."""
    if not isinstance(scheme, BallsInBinsSampling):
        return f"random allocation needs BallsInBinsSampling, got {type(scheme).__name__}"
    if _is_identity(strategy, scheme):
        return None  # (C = I is lower triangular and >= 0: no need to build the means)
    return pair_problem(strategy, scheme)


def _is_identity(strategy, scheme) -> bool:
    """``C = I`` with one slot reused every epoch and matching sizes: the fast paths of
    :mod:`dpmf.accounting.allocation.identity` apply (after the epochs reduction)."""
    return (
        isinstance(strategy, Identity)
        and isinstance(scheme, BallsInBinsSampling)
        and scheme.reused_single_slot
        and strategy.n == scheme.steps
    )


@dataclass(frozen=True)
class AllocationProblem:
    """The sigma-independent parts: means (``b x N``), Gram matrix and the Rényi program's levels.

    For ``C = I`` (after the epochs reduction: one epoch of ``b`` steps) ``means`` and ``gram``
    are ``None`` and ``identity_steps = b``: both bounds then run the fast paths of
    :mod:`dpmf.accounting.allocation.identity` (the same bounds, nothing ``b x b`` built).
    """

    means: np.ndarray | None = field(repr=False)
    gram: np.ndarray | None = field(repr=False)
    epochs: int
    steps_per_epoch: int
    renyi: RenyiAllocation
    strategy: dict
    scheme: dict
    #: sigma is multiplied by this before the analysis (an exact reduction, :mod:`dpmf.accounting.reductions`)
    noise_scale: float = 1.0
    reduction: dict | None = None
    identity_steps: int | None = None
    #: results already computed on this problem, by (bound, analysed sigma, delta, options): a
    #: calibration evaluates the same noise in several modes (Renyi alone, then combined) and the
    #: report at its answer; both bounds are pure functions of these keys, so a hit is the same value
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def create(
        cls,
        strategy,
        scheme,
        *,
        bandwidth: int | None = None,
        orders=None,
        budget: float = DEFAULT_BUDGET,
        max_bandwidth: int = DEFAULT_MAX_BANDWIDTH,
    ) -> "AllocationProblem":
        if not isinstance(scheme, BallsInBinsSampling):
            raise UnsupportedConfigurationError(
                f"random allocation needs BallsInBinsSampling, got {type(scheme).__name__}"
            )
        why = pair_problem(strategy, scheme) if not scheme.reused_single_slot else None
        if why is not None:
            raise UnsupportedConfigurationError(why)
        n = getattr(strategy, "n", None)
        if n is not None and n != scheme.steps:
            raise InvalidParameterError(
                f"the strategy has n={n} steps but the scheme has steps={scheme.steps} (k * b must equal N)"
            )
        described = (describe_strategy(strategy), scheme.describe())
        reduction = identity_epochs_reduction(strategy, scheme)
        if reduction is not None:
            strategy, scheme = reduction.strategy, reduction.scheme
        scale = dict(
            noise_scale=1.0 if reduction is None else reduction.noise_scale,
            reduction=None if reduction is None else reduction.describe(),
        )
        if _is_identity(strategy, scheme) and scheme.epochs == 1 and bandwidth in (None, 1):
            renyi = RenyiAllocation.identity(scheme.steps, orders=orders)
            return cls(None, None, 1, scheme.steps, renyi, *described, **scale, identity_steps=scheme.steps)
        means = mixture_means(strategy, scheme.epochs, scheme.steps)
        gram = gram_matrix(means)
        renyi = RenyiAllocation.create(
            gram, bandwidth=bandwidth, orders=orders, budget=budget, max_bandwidth=max_bandwidth
        )
        return cls(means, gram, scheme.epochs, scheme.steps_per_epoch, renyi, *described, **scale)


def _memoized(problem: AllocationProblem, key: tuple, compute: Callable[[], dict]) -> dict:
    if key not in problem.memo:
        problem.memo[key] = compute()
    return dict(problem.memo[key])


def _renyi(problem: AllocationProblem, sigma: float, delta: float, conversion: str) -> dict:
    return _memoized(problem, ("renyi", sigma, delta, conversion), lambda: _renyi_epsilon(problem, sigma, delta, conversion))


def _renyi_epsilon(problem: AllocationProblem, sigma: float, delta: float, conversion: str) -> dict:
    out = problem.renyi.epsilon(sigma, delta)
    if conversion == "joint":  # the paper's Alg. 3: convert max(rho_remove, rho_add)
        rho_r, _ = problem.renyi.remove(sigma)
        rho = np.maximum(rho_r, problem.renyi.add(sigma))
        eps, order = rdp_to_epsilon(problem.renyi.orders, rho, delta)
        out = {**out, "epsilon": eps, "epsilon_by_direction": {"remove": eps, "add": eps}, "order": order}
    return out


@guarded(NAME, supports, hidden=('problem',))
def account_allocation(
    strategy,
    scheme,
    noise_multiplier: float,
    delta: float,
    *,
    which: str = "combined",
    bandwidth: int | None = None,
    orders=None,
    budget: float = DEFAULT_BUDGET,
    max_bandwidth: int = DEFAULT_MAX_BANDWIDTH,
    delta_e: float | None = None,
    temperatures=DEFAULT_TEMPERATURES,
    discretization: float | None = None,
    conditional_budget: float = DEFAULT_CONDITIONAL_BUDGET,
    renyi_conversion: str = "per-direction",
    callback: Callable[[int, int], None] | None = None,
    problem: AllocationProblem | None = None,
) -> PrivacyReport:
    """Epsilon of ``strategy`` under balls-in-bins ``scheme`` at ``delta`` (module docstring).

    Args:
      strategy: encoder ``C`` (``N x N``, lower triangular, ``C >= 0``): any dpmf strategy with
        ``encoder()``, a ``ToeplitzStrategy``/``BLT`` (kept structured), or an array.
      scheme: :class:`~dpmf.sampling.BallsInBinsSampling` with ``steps = N``.
      noise_multiplier: ``sigma > 0``.
      delta: target delta in (0, 1).
      which: ``"combined"`` (default; per direction the smaller of the two), ``"renyi"``
        (Sec. 3) or ``"conditional"`` (Sec. 4).
      bandwidth: effective bandwidth ``p`` of the Rényi program (default: automatic levels, see
        :meth:`RenyiAllocation.create`); must be in ``[1, b]``.
      orders: integer Rényi orders ``>= 2`` (default ``2..64``).
      budget: work budget per automatic bandwidth level.
      max_bandwidth: widest automatic bandwidth level.
      delta_e: conditional composition's failure budget (default ``delta / 2``).
      temperatures, discretization: see :func:`conditional_epsilon`.
      conditional_budget: in ``"combined"`` mode, conditional composition is skipped (and the
        report says so) when its estimated time exceeds this many seconds; never for ``C = I``,
        whose fast path (:mod:`dpmf.accounting.allocation.identity`) costs ``O(b)``. (It is also
        skipped, with the same epsilons, where a lower bound of its own shows it cannot go below
        the Rényi bound or the Gaussian cap: ``diagnostics["conditional"]["cannot_lower"]``.)
      renyi_conversion: ``"per-direction"`` (default, never looser) or ``"joint"`` (Alg. 3).
      callback: ``callback(step, steps)`` during conditional composition.
      problem: a precomputed :class:`AllocationProblem` (reused by calibration).

    Returns:
      A certified :class:`PrivacyReport`; diagnostics hold both accountants' epsilons, the Rényi
      order(s), bandwidth ``p`` and ``tau``, ``delta_E`` and timings.
    """
    start = time.perf_counter()
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    d = _v.open_unit("delta", delta)
    if which not in WHICH:
        raise InvalidParameterError(f"which must be one of {WHICH}, got {which!r}")
    if renyi_conversion not in ("per-direction", "joint"):
        raise InvalidParameterError(f"renyi_conversion must be 'per-direction' or 'joint', got {renyi_conversion!r}")
    if problem is None:
        problem = AllocationProblem.create(
            strategy, scheme, bandwidth=bandwidth, orders=orders, budget=budget, max_bandwidth=max_bandwidth
        )
    diag: dict = {"epochs": problem.epochs, "steps_per_epoch": problem.steps_per_epoch}
    if problem.reduction is not None:
        diag["reduction"] = problem.reduction
    analysed = sigma * problem.noise_scale
    by_dir = {"remove": math.inf, "add": math.inf}
    if which in ("combined", "renyi"):
        r = _renyi(problem, analysed, d, renyi_conversion)
        diag["renyi"] = r
        by_dir = {k: min(by_dir[k], v) for k, v in r["epsilon_by_direction"].items()}
    gauss = _gaussian_cap(problem, analysed, d) if which == "combined" else math.inf
    if which in ("combined", "conditional"):
        c = _conditional(problem, analysed, d, which, {k: min(v, gauss) for k, v in by_dir.items()}, delta_e=delta_e,
                         temperatures=temperatures, discretization=discretization, budget=conditional_budget,
                         callback=callback)
        diag["conditional"] = c
        if "epsilon_by_direction" in c:
            by_dir = {k: min(by_dir[k], v) for k, v in c["epsilon_by_direction"].items()}
    if which == "combined":
        # Revealing the slot (post-processing) leaves the Gaussian mechanism with sensitivity
        # max_i |m_i|: a valid bound on the same pair for both directions, and the cap that keeps
        # conditional composition (loose at small sigma: its per-step weights sum to well over one
        # participation) and the Renyi conversion from reporting more than no amplification.
        diag["gaussian_epsilon"] = gauss
        if gauss < max(by_dir.values()):
            diag["gaussian_cap"] = "revealing the slot: the Gaussian mechanism at sigma / max_i |m_i| was tighter"
        by_dir = {k: min(v, gauss) for k, v in by_dir.items()}
    diag["seconds"] = time.perf_counter() - start
    return PrivacyReport(
        epsilon=max(by_dir.values()),
        delta=d,
        noise_multiplier=sigma,
        method=NAME,
        certified=True,
        epsilon_by_direction=by_dir,
        strategy=problem.strategy,
        scheme=problem.scheme,
        diagnostics={"which": which, **diag},
    )


def _gaussian_cap(problem: AllocationProblem, analysed: float, d: float) -> float:
    """The Gaussian mechanism's epsilon at ``sigma / max_i |m_i|`` (the slot revealed: :func:`account_allocation`)."""
    if problem.identity_steps is not None:  # G = I_b: max_i |m_i|^2 = 1 (N = b steps)
        g_max = 1.0 * (1 + 2 * (problem.identity_steps + 2) * UNIT_ROUNDOFF)
    else:
        g_max = float(np.diag(problem.gram).max()) * (1 + 2 * (problem.means.shape[1] + 2) * UNIT_ROUNDOFF)
    return gaussian_epsilon(analysed / math.sqrt(g_max), d) if g_max > 0 else 0.0


def _pairs(problem: AllocationProblem, analysed: float, d: float, delta_e, temperatures, callback=None) -> dict:
    """:func:`conditional_pairs` of the problem at ``analysed`` (memoized in ``problem.memo``)."""
    key = ("conditional pairs", analysed, d, delta_e, tuple(np.ravel(temperatures).tolist()))
    return _memoized(problem, key, lambda: conditional_pairs(problem.means, analysed, d, delta_e=delta_e,
                                                             temperatures=temperatures, callback=callback))


def _conditional(problem: AllocationProblem, analysed: float, d: float, which: str, beat: dict, *, delta_e,
                 temperatures, discretization, budget: float, callback) -> dict:
    """Conditional composition's part of :func:`account_allocation` (its diagnostics entry): computed, or
    skipped -- for its estimated cost (``budget``, in ``"combined"`` mode), or, in ``"combined"`` mode,
    where its epsilon cannot be below ``beat`` (per direction, the smaller of the Renyi bound and the
    Gaussian cap already found): :func:`composition_delta_lower_bound` of its own pairs exceeds
    ``delta - delta_E`` at ``beat`` in both directions, so the epsilon it would read there is above
    ``beat`` and the combined epsilon is the same without it (its PLD builds and compositions, and
    dp_accounting's import, are not paid)."""
    b_id = problem.identity_steps
    if b_id is not None:
        cost = identity_conditional_cost(b_id)
    else:
        cost = conditional_cost(problem.means, None, 1 + len(tuple(temperatures)), gram=problem.gram)
    # (C = I: the fast path costs O(b), 30 s at b = 10^5; it always runs, so auto never
    # skips a bound it could have run)
    if not (which == "conditional" or b_id is not None or cost <= budget):
        return {"skipped": f"estimated time {cost:.3g} s > conditional_budget {budget:.3g} s"}
    common = dict(delta_e=delta_e, discretization=discretization, callback=callback)
    if b_id is not None:  # (every psi of the family is uniform here: temperatures do not matter)
        key = ("conditional", analysed, d, delta_e, discretization)
        return _memoized(problem, key, lambda: identity_conditional_epsilon(b_id, analysed, d, **common))
    temps = tuple(np.ravel(temperatures).tolist())
    prepared = _pairs(problem, analysed, d, delta_e, temperatures, callback)
    if which == "combined" and all(math.isfinite(v) for v in beat.values()):
        level = d - prepared["delta_e"]
        lower = {k: composition_delta_lower_bound(prepared["pairs"][k], analysed, v, k) for k, v in beat.items()}
        if all(lower[k] > level for k in beat):
            return {"skipped": "it cannot lower the bound: at the Renyi / Gaussian epsilon of each direction "
                               f"({', '.join(f'{k} {v:.6g}' for k, v in beat.items())}) its own pairs' delta is at "
                               f"least {', '.join(f'{lower[k]:.3g}' for k in beat)} > delta - delta_E = {level:.3g}",
                    "cannot_lower": dict(beat), "delta_e": prepared["delta_e"]}
    key = ("conditional", analysed, d, delta_e, discretization, temps)
    return _memoized(problem, key, lambda: conditional_epsilon(
        problem.means, analysed, d, temperatures=temperatures, prepared=prepared, **common))


@guarded(NAME, supports)
def calibrate_allocation(
    strategy,
    scheme,
    target_epsilon: float,
    delta: float,
    *,
    which: str = "combined",
    rel_tol: float = 1e-4,
    callback: ProgressCallback | None = None,
    **kwargs,
) -> float:
    """Smallest noise multiplier whose reported epsilon (:func:`account_allocation`) is ``<= target``.

    The Gram matrix and the program's shape are built once (:class:`AllocationProblem`), and each
    bound is evaluated at most once per noise. In ``"combined"`` mode the Rényi calibration runs
    first (cheap), to ``rel_tol / 100``; its answer ``sigma_R`` passes the combined bound too (it
    is never above the Rényi one). Conditional composition is then evaluated at ``sigma_R``: when
    neither it nor the Gaussian cap meets the target there in either direction, neither does at any
    smaller noise (both are non-increasing in the noise), so below ``sigma_R`` the combined bound
    passes exactly where the Rényi bound does and ``sigma_R`` is the answer (within ``rel_tol / 100``
    of the smallest passing noise). Otherwise a combined search starts from ``sigma_R``, whose
    answer can only be smaller. ``callback(sigma, epsilon)`` after each evaluation. Other keyword
    arguments go to :func:`account_allocation`.
    """
    return noise_and_report(strategy, scheme, target_epsilon, delta, which=which, rel_tol=rel_tol, callback=callback,
                            **kwargs)[0]


@guarded(NAME, supports)
def noise_and_report(
    strategy,
    scheme,
    target_epsilon: float,
    delta: float,
    *,
    rel_tol: float = 1e-4,
    callback: ProgressCallback | None = None,
    limit: float | None = None,
    **options,
) -> tuple[float, PrivacyReport]:
    """:func:`calibrate_allocation` for the dispatcher (the registry's ``fast_calibration``): the
    noise and the :func:`account_allocation` report at it (called with ``options``), computed from
    the bounds the search already evaluated there (not evaluated twice).

    ``limit``: only noises up to it are of interest (the noise another accountant reached):
    :class:`~dpmf.privacy.calibration.NoiseLimitExceeded` when the combined epsilon there is above
    the target -- first from a lower bound of it (:func:`epsilon_lower_bound`: small Rényi programs, no
    full one), then from the Rényi bound alone (when it passes, so does the combined bound and conditional
    composition is not run at the limit), else from the combined bound. The searches then run as
    without it (from the active :func:`~dpmf.privacy.calibration.search_hint`).
    """
    target = _v.positive("target_epsilon", target_epsilon)
    d = _v.open_unit("delta", delta)
    rel_tol = _v.positive("rel_tol", rel_tol)
    limit = None if limit is None else _v.positive("limit", limit)
    which = options.get("which", "combined")
    if which not in WHICH:
        raise InvalidParameterError(f"which must be one of {WHICH}, got {which!r}")
    build = {k: options[k] for k in ("bandwidth", "orders", "budget", "max_bandwidth") if k in options}
    problem = AllocationProblem.create(strategy, scheme, **build)

    def report(s: float, mode: str | None = None) -> PrivacyReport:
        mode_option = {} if mode is None else {"which": mode}
        return account_allocation(strategy, scheme, s, d, problem=problem, **{**options, **mode_option})

    def epsilon(s: float) -> float:
        return report(s).epsilon

    if limit is not None and which != "conditional":
        _refuse_by_lower_bound(problem, limit, d, target, options, callback)
    if which != "combined":
        return smallest_noise_and_report(epsilon, report, target, rel_tol=rel_tol, callback=callback, limit=limit)
    if limit is not None and report(limit, "renyi").epsilon > target:
        # (the Renyi bound fails at the limit: the combined one decides there)
        check_limit(epsilon, target, limit, callback=callback)
    renyi = smallest_noise(lambda s: report(s, "renyi").epsilon, target, callback=callback, rel_tol=rel_tol / 100)
    at_renyi = report(renyi.value)  # (the Renyi bound is memoized: this computes conditional composition only)
    diag = at_renyi.diagnostics
    others = [diag.get("gaussian_epsilon", math.inf)]
    cond = diag.get("conditional", {})
    if "cannot_lower" in cond:  # (skipped: above the Renyi bound; is it above the target too?)
        prepared = _pairs(problem, renyi.value * problem.noise_scale, d, options.get("delta_e"),
                          options.get("temperatures", DEFAULT_TEMPERATURES))
        if not all(composition_delta_lower_bound(prepared["pairs"][k], renyi.value * problem.noise_scale, target, k)
                   > d - prepared["delta_e"] for k in ("remove", "add")):
            cond = report(renyi.value, "conditional").diagnostics["conditional"]
    if "epsilon_by_direction" in cond:
        others += list(cond["epsilon_by_direction"].values())
    if min(others) > target:  # (they cannot help below renyi.value: the answer is the Renyi one)
        return renyi.value, at_renyi
    return smallest_noise_and_report(epsilon, report, target, rel_tol=rel_tol, callback=callback, initial=renyi.value)


def epsilon_lower_bound(problem: AllocationProblem, sigma: float, delta: float, above: float, *, which: str = "combined",
                        delta_e=None, temperatures=DEFAULT_TEMPERATURES,
                        conditional_budget: float = DEFAULT_CONDITIONAL_BUDGET) -> float | None:
    """A lower bound above ``above`` on the epsilon :func:`account_allocation` reports (``which``
    ``"combined"`` or ``"renyi"``, any Rényi options) at ``sigma``, or ``None`` where none is found
    cheaply; for ``C != I`` only (``C = I``'s programs are the cheap ones).

    Per direction ``k`` the report's epsilon is ``min(renyi_k, gaussian cap, conditional_k)`` (the last two
    in ``"combined"`` mode only, conditional composition where it runs), and the reported one the larger
    direction. ``L_k``: the Rényi remove epsilon's lower bound of small programs
    (:meth:`~dpmf.accounting.allocation.renyi.RenyiAllocation.remove_epsilon_lower_bound`) or the add
    direction's closed form; ``X_k = min(L_k, gaussian cap)``; conditional composition's epsilon is above
    ``X_k`` where :func:`composition_delta_lower_bound` of its own pairs exceeds ``delta - delta_E`` there
    (as when it is skipped in :func:`account_allocation`). The largest such ``X_k > above`` is returned."""
    if problem.identity_steps is not None:
        return None
    analysed = sigma * problem.noise_scale
    cap = _gaussian_cap(problem, analysed, delta) if which == "combined" else math.inf
    low = {"remove": min(problem.renyi.remove_epsilon_lower_bound(analysed, delta, above), cap)}
    low["add"] = min(problem.renyi.add_epsilon(analysed, delta), cap)
    low = {k: v for k, v in low.items() if v > above}
    runs = which == "combined" and conditional_cost(problem.means, None, 1 + len(tuple(temperatures)),
                                                     gram=problem.gram) <= conditional_budget
    if low and runs:
        prepared = _pairs(problem, analysed, delta, delta_e, temperatures)
        level = delta - prepared["delta_e"]
        low = {k: v for k, v in low.items()
               if composition_delta_lower_bound(prepared["pairs"][k], analysed, v, k) > level}
    return max(low.values(), default=None)


def _refuse_by_lower_bound(problem: AllocationProblem, limit: float, d: float, target: float, options: dict,
                           callback: ProgressCallback | None) -> None:
    """:class:`~dpmf.privacy.calibration.NoiseLimitExceeded` (its epsilon a lower bound) where
    :func:`epsilon_lower_bound` at ``limit`` is above ``target``: the search cannot pass there, and no
    full Rényi program or conditional composition is run to say so (README snippet's probe: ~0.5 CPU-s)."""
    keys = ("delta_e", "temperatures", "conditional_budget")
    low = epsilon_lower_bound(problem, limit, d, target, which=options.get("which", "combined"),
                              **{k: options[k] for k in keys if options.get(k) is not None})
    if low is None:
        return
    if callback is not None:
        callback(limit, low)
    raise NoiseLimitExceeded(
        f"epsilon at the largest noise of interest, noise_multiplier={limit:g}, is at least {low:g} > {target:g}: "
        "the smallest passing noise is larger", limit, low, lower_bound=True)
