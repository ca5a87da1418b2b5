"""MMCC and generalized MMCC: amplified (epsilon, delta) for any non-negative matrix mechanism.

Paper: Choquette-Choo, Ganesh, Steinke, Thakurta, "Privacy amplification for matrix mechanisms"
(ICLR 2024). Algorithm 1 (MMCC, Thm 4.3) for Poisson sampling and Algorithm 3 (generalized
MMCC, Thm D.1) for cyclic Poisson / b-min-sep sampling; digest ``notes/mmcc.md`` §3.1-3.4.

Mechanism: release ``C x + z``, ``z ~ N(0, sigma^2 I)``, clip norm 1 per step (DESIGN.md). For
each unit (a row of ``C``, or a block of ``b`` steps' rows), conditioned on all earlier outputs,
the release is dominated by the product mixture of Gaussians ``M_PMoG({p~_j}, {c_j})`` whose
probabilities ``p~`` are high-probability bounds on the posterior participation probabilities
(:mod:`.tail_bounds`; failure probability ``delta_1``); conditional composition (Thm 3.1/C.2)
composes the unit PLDs (:mod:`.rows`) and the result is ``(epsilon, delta_1 + delta_2)``-DP with
``epsilon`` read off the composed PLD at ``delta_2``. ``delta_1 = delta_split * delta``; when no
tail bound is needed (every column touched by a single unit, e.g. ``C = I`` or a banded ``C``
under generalized MMCC) ``delta_1 = 0`` and ``delta_2 = delta``.

Inputs and their release order (0-based steps):

* a square ``n x n`` ``C``: row ``i`` is released at step ``i``; adaptive inputs need ``C``
  lower-triangular (footnote 7 of the paper);
* an ``m x n`` ``C`` with ``m != n`` (e.g. :class:`~dpmf.strategies.BinaryTree`): rows are in
  release order, row ``i`` released at its last non-zero column; adaptive inputs need those to be
  non-decreasing;
* ``adaptive=False`` (non-adaptive inputs, any non-negative ``C``, Poisson only): the tail bounds
  count every column with a non-zero Gram entry, not only earlier ones (notes §3.2).

``C`` must be entrywise non-negative (Lemma C.3 needs it). Generalized MMCC (cyclic Poisson with
``cycle_length = b``, per-active-step probability ``q``): for the examples of phase ``k`` keep
columns ``k, k+b, ...``, group the rows released in steps ``[k + r b, k + (r+1) b)`` into
block ``r``, bound the posteriors at the block start and use block-column norms (Alg. 3/4). The
worst phase is reported (all phases are analysed unless ``C`` is Toeplitz or the identity, for
which phase 0 is the worst: another phase is phase 0 of a leading principal submatrix, which has
fewer rows and fewer tail events). ``cycle_length = 1`` is plain MMCC.

Diagnostics (issue item 5): ``max_probability_ratio`` (max ``p~/q``; about the factor by which
MMCC can overstate epsilon, paper Sec. 4), ``independent_rows_heuristic_epsilon`` (``p~ = q``
everywhere: what the rows would give if they were independent; a heuristic *estimate* of the
true epsilon, **not** a bound of either kind), ``delta1``/``delta2``, ``grid_step``
(``Delta_2``), ``discretization`` (the PLD loss grid; our mixture PLDs use an exact inverse by
Newton's method, so the paper's ``Delta_1`` search precision does not arise), rows computed vs
reused, seconds.

Cost as a function of ``n`` (steps; ``m`` rows of ``C``, ``nnz`` stored pairs = non-zero
entries of the analysed rows, ``T`` the largest binomial threshold, ~10-40 in practice):

* **setup** (sigma-free, once per accountant). Structured strategies under Poisson sampling
  (:mod:`.structured`, no dense matrix): ``Identity`` / Toeplitz / BLT / banded Toeplitz
  ``O(n A T + nnz)`` time and ``O(A T + nnz)`` memory with ``A = min(n, band)``, so
  ``O(n^2 T)`` / ``O(n^2)`` for a dense Toeplitz ``C`` (measured 0.7 / 1.7 / 5.6 s at n = 512 /
  1024 / 2048 for the square-root factorization, 16 / 63 / 251 MiB traced peak) and ``O(n b T)``
  / ``O(n b)`` for ``b`` bands; the binary tree ``O(n log n)`` time and memory (0.5 / 0.6 /
  1.5 s, under 6 MiB). Everything else (dense or BandMF matrices, cyclic Poisson) takes the dense
  reference path: ``O(m n^2)`` time and ``O(m n + n^2)`` memory (the encoder and its Gram
  matrix); pass ``structured=False`` to :class:`MMCCAccountant` to force it (the tests compare
  both, which agree bit for bit).
* **rows** (per sigma): one mixture PLD per *distinct* row (rows with equal rounded entries and
  equal tail-bound data share one, :func:`_unit_keys`): ``O(log n)`` distinct rows for the tree,
  ``n`` for a dense Toeplitz ``C`` (each ``O(n + K log K)`` for its sensitivity law on ``K``
  grid points, plus the mixture PLD on the loss grid), a handful for banded or identity; rows
  run in ``workers`` processes from :data:`~dpmf.accounting.mmcc.rows.PARALLEL_MIN_ROWS`
  distinct rows. The composition and epsilon are ``O(G log G)`` in the loss-grid size ``G``.
  Measured (sigma = 20 x column norm, p = 1/n, 2 cores shared with other jobs): tree 2048 in
  19 s wall, sqrt-Toeplitz 2048 in 104 s (``benchmarks/README.md``, MMCC). Memory of the rows
  is that of their PLDs (up to ~10^7 grid points for the widest tree rows at n = 2048).

Related F.5 uses of mixture-of-Gaussians PLDs (issue item 7) live in
:mod:`dpmf.privacy.random_sensitivity`: :func:`~dpmf.privacy.last_iterate_linear` (last-iterate
DP-SGD for linear losses) and :func:`~dpmf.privacy.group_dpsgd` (group privacy for DP-SGD).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dpmf import validation as _v
from dpmf.accounting.guard import guarded
from dpmf.accounting.mmcc.rows import DEFAULT_MERGE_BUDGET, compute_row_plds
from dpmf.accounting.mmcc.structured import structured_analyses
from dpmf.accounting.mmcc.tail_bounds import TailBoundStructure, tail_bound_structure
from dpmf.accounting.report import PrivacyReport
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.privacy.calibration import ProgressCallback, smallest_noise
from dpmf.privacy.pld import DEFAULT_DISCRETIZATION, PrivacyLossDistribution
from dpmf.privacy.product_mixtures import grid_indices
from dpmf.sampling.schemes import CyclicPoissonSampling, PoissonSampling
from dpmf.strategies.identity import Identity
from dpmf.strategies.toeplitz import ToeplitzStrategy
from dpmf.strategies.tree import BinaryTree

__all__ = ["NAME", "supports", "account_mmcc", "calibrate_mmcc", "MMCCAccountant", "DEFAULT_GRID_FRACTION"]

NAME = "mmcc"
#: Default ``grid_step`` (``Delta_2``) as a fraction of the largest entry of ``C`` (non-integer C).
DEFAULT_GRID_FRACTION = 0.01

RowCallback = Callable[[int, int], None]


# ============================================================================ inputs
def _matrix_of(strategy) -> tuple[np.ndarray, dict, bool]:
    """``(C, description, may_be_adaptive)`` of a strategy object or a plain matrix."""
    if isinstance(strategy, np.ndarray) or isinstance(strategy, (list, tuple)):
        C = _v.finite_array("strategy", strategy, ndim=2)
        return C, {"name": "matrix", "rows": int(C.shape[0]), "n": int(C.shape[1])}, True
    if not callable(getattr(strategy, "encoder", None)):
        raise InvalidParameterError(
            f"strategy must be a dpmf strategy with encoder() or a 2-D numpy matrix, got {type(strategy).__name__}"
        )
    from dpmf.accounting.cost import check_dense_fits

    check_dense_fits(strategy, "MMCC")  # before numpy's MemoryError (the dispatcher asks supports() first)
    C = _v.finite_array("strategy.encoder()", strategy.encoder(), ndim=2)
    return C, strategy.describe(), bool(getattr(strategy, "adaptive", True))


def _negative_entry(C: np.ndarray) -> str | None:
    """Why ``C`` is not entrywise non-negative (its most negative entry), or ``None``."""
    if np.any(C < 0):
        i, j = np.unravel_index(int(np.argmin(C)), C.shape)
        return f"MMCC needs a non-negative encoder C (paper Lemma C.3), but C[{i}, {j}] = {C[i, j]!r} < 0"
    return None


def _check_nonnegative(C: np.ndarray) -> None:
    why = _negative_entry(C)
    if why is not None:
        raise UnsupportedConfigurationError(why)


def _release_steps(C: np.ndarray) -> np.ndarray | None:
    """Release step of every row, or ``None`` when ``C`` is not in streaming (lower) form."""
    m, n = C.shape
    if m == n:
        if np.any(np.triu(C, 1) != 0):
            return None
        return np.arange(n)
    nz = C != 0
    last = np.where(nz.any(axis=1), n - 1 - np.argmax(nz[:, ::-1], axis=1), -1)
    rows = last >= 0
    if np.any(np.diff(last[rows]) < 0):
        return None
    return np.maximum.accumulate(np.maximum(last, 0))


def _order_problem(C: np.ndarray, adaptive: bool, cycle_length: int, release: np.ndarray | None) -> str | None:
    """Why the rows of ``C`` cannot be analysed in release order, or ``None``."""
    if (adaptive or cycle_length > 1) and release is None:
        why = "adaptive inputs" if adaptive else "the b-min-sep (cyclic Poisson) analysis"
        return (
            f"{why} need a lower-triangular C (square C: no entry above the diagonal; "
            f"m x n C: rows in release order, i.e. non-decreasing last non-zero column); "
            f"C of shape {C.shape} is not"
            + ("; pass adaptive=False if the inputs are fixed in advance" if adaptive and cycle_length == 1 else "")
        )
    return None


def supports(strategy, scheme, *, adaptive: bool = True) -> str | None:
    """``None`` when MMCC applies: Poisson or cyclic-Poisson sampling and a non-negative encoder
    in streaming form (lower-triangular, or rows in release order; any row order for non-adaptive
    inputs under Poisson sampling, ``adaptive=False``); else the reason."""
    if not isinstance(scheme, (PoissonSampling, CyclicPoissonSampling)):
        return f"MMCC needs Poisson or cyclic-Poisson sampling, not {type(scheme).__name__}"
    if isinstance(strategy, (Identity, BinaryTree)):  # non-negative, rows in release order
        return None
    if isinstance(strategy, ToeplitzStrategy):
        return None if np.all(strategy.coefs >= 0) else "MMCC needs a non-negative encoder C"
    if not (isinstance(strategy, np.ndarray) or callable(getattr(strategy, "encoder", None))):
        return "MMCC needs the encoder matrix (a strategy with encoder() or a numpy matrix)"
    try:
        C, _, may_be_adaptive = _matrix_of(strategy)
    except InvalidParameterError as exc:
        if isinstance(strategy, (np.ndarray, list, tuple)):  # a bad matrix is bad input, not a bad pair
            raise
        return str(exc)
    if _negative_entry(C) is not None:
        return _negative_entry(C)
    b = scheme.cycle_length if isinstance(scheme, CyclicPoissonSampling) else 1
    return _order_problem(C, adaptive and may_be_adaptive, b, _release_steps(C))


# ============================================================================ analyses
@dataclass(frozen=True)
class _Analysis:
    """One sigma-free MMCC analysis (one phase class for generalized MMCC)."""

    label: str
    structure: TailBoundStructure
    groups: tuple[tuple[int, int], ...]  # (representative unit, multiplicity)
    heuristic_groups: tuple[tuple[int, int], ...]
    num_units: int


def _unit_keys(struct: TailBoundStructure, grid_step: float) -> tuple[list, list]:
    """Reuse keys: units with equal keys have identical PLDs at every sigma."""
    keys, hkeys = [], []
    for u in range(struct.num_units):
        sl = struct.unit(u)
        c = struct.sensitivities[sl]
        if c.size == 0:
            keys.append(None)
            hkeys.append(None)
            continue
        if c.size == 1:
            val = c.copy()
            tag = "exact"
        else:
            val = grid_indices(c, grid_step).astype(np.float64)
            tag = "grid"
        rows = np.stack([val, struct.prior_norm[sl], struct.prior_norm_sq[sl], struct.signal[sl]], axis=1)
        order = np.lexsort(rows.T[::-1])
        keys.append((tag, rows[order].tobytes()))
        hkeys.append((tag, np.sort(val).tobytes()))
    return keys, hkeys


def _group(keys: list) -> tuple[tuple[int, int], ...]:
    first: dict = {}
    counts: dict = {}
    for u, k in enumerate(keys):
        if k is None:
            continue
        if k not in first:
            first[k] = u
            counts[k] = 0
        counts[k] += 1
    return tuple((first[k], counts[k]) for k in first)


#: Bytes per loss-grid point counted by :func:`_check_row_grid` (a low count: one float64 array
#: and a half; building a row PLD takes several, so only clear cases are refused).
_GRID_BYTES = 16.0


def _check_row_grid(row_sum: float, sigma: float, discretization: float) -> None:
    """Refuse, before numpy's ``MemoryError``, a row whose PLD loss grid cannot fit in memory.

    A row of total sensitivity ``S`` (sum of its entries) spans at least ``20 S / sigma`` in
    privacy loss when its sensitivity is nearly deterministic (posterior bounds near 1: the loss
    is ``S^2 / (2 sigma^2) +- 10 S / sigma``), i.e. ``20 S / (sigma * discretization)`` grid points.
    """
    from dpmf.resources import available_memory, format_bytes

    points = 20.0 * row_sum / (sigma * discretization)
    need = _GRID_BYTES * points
    avail = available_memory()
    if need > avail:
        raise InvalidParameterError(
            f"MMCC needs a dense loss grid of about {points:.3g} points ({format_bytes(need)}) for a row of "
            f"total sensitivity {row_sum:.6g} at noise multiplier {sigma!r}, more than the "
            f"{format_bytes(avail)} of memory available; use a larger noise multiplier, fewer steps or a "
            f"coarser discretization"
        )


def _structured_row_sum(strategy) -> float | None:
    """The largest row sum of a structured strategy's encoder, without building it (else ``None``)."""
    if isinstance(strategy, BinaryTree):
        return float(strategy.n) * float(strategy.scale)
    if isinstance(strategy, Identity):
        return 1.0
    if isinstance(strategy, ToeplitzStrategy):
        return float(np.sum(np.abs(strategy.coefs[: strategy.n])))
    return None


def _default_grid(analyses: list) -> float:
    """``Delta_2`` default: 1 when every unit sensitivity is an integer (exact: tree, 0/1 C),
    else ``DEFAULT_GRID_FRACTION`` times the largest unit sensitivity."""
    sens = np.concatenate([s.sensitivities for _, s in analyses])
    if sens.size == 0:
        return 1.0
    if np.all(sens == np.round(sens)):
        return 1.0
    return DEFAULT_GRID_FRACTION * float(sens.max())


class MMCCAccountant:
    """MMCC for one ``(C, scheme, delta)``, reusable across noise multipliers.

    ``structured=False`` forces the dense reference path even when the strategy has a structured
    one (:mod:`dpmf.accounting.mmcc.structured`; same result bit for bit, used as the oracle in
    tests). :attr:`structured` says which path was taken.

    Construction does all the sigma-independent work once: validation, release order, the
    incremental Gram matrices, column norms, binomial top-t sums and the union-bound split
    (:func:`~dpmf.accounting.mmcc.tail_bounds.tail_bound_structure`), the grid indices of ``C``
    and the grouping of rows whose PLDs coincide at every sigma (equal rounded entries and equal
    tail-bound data: tree symmetry, banded/Toeplitz tails, identity). :meth:`epsilon` and
    :meth:`report` then only evaluate ``p~(sigma)`` and the PLDs of the distinct rows.

    >>> from dpmf.strategies import Identity
    >>> acc = MMCCAccountant(Identity(1000), PoissonSampling(0.01, 1000), 1e-6)
    >>> round(acc.epsilon(1.0), 3)   # C = I is DP-SGD
    2.125
    """

    def __init__(
        self,
        strategy,
        scheme,
        delta: float,
        *,
        delta_split: float = 0.5,
        adaptive: bool = True,
        grid_step: float | None = None,
        discretization: float = DEFAULT_DISCRETIZATION,
        merge_budget: float = DEFAULT_MERGE_BUDGET,
        workers: int | None = None,
        scheduler: object = None,
        cache_dir: str | os.PathLike | None = None,
        structured: bool = True,
    ) -> None:
        start = time.perf_counter()
        self.delta = _v.open_unit("delta", delta)
        self.delta_split = _v.open_unit("delta_split", delta_split)
        self.discretization = _v.positive("discretization", discretization)
        self.merge_budget = _v.non_negative("merge_budget", merge_budget)
        if not isinstance(adaptive, (bool, np.bool_)):
            raise InvalidParameterError(f"adaptive must be True or False, got {adaptive!r}")
        if not isinstance(scheme, (PoissonSampling, CyclicPoissonSampling)):
            raise UnsupportedConfigurationError(
                f"MMCC needs PoissonSampling or CyclicPoissonSampling, got {type(scheme).__name__}"
            )
        if grid_step is not None:
            grid_step = _v.positive("grid_step", grid_step)
        self.scheme = scheme
        self.workers = workers
        self.scheduler = scheduler
        self.cache_dir = cache_dir
        b = scheme.cycle_length if isinstance(scheme, CyclicPoissonSampling) else 1
        self.cycle_length = b
        q = scheme.sampling_prob
        delta1 = self.delta_split * self.delta
        is_matrix = isinstance(strategy, (np.ndarray, list, tuple))
        fast = None
        if structured and not is_matrix:
            n_steps = getattr(strategy, "n", None)
            if isinstance(n_steps, (int, np.integer)) and n_steps != scheme.steps:
                raise InvalidParameterError(
                    f"the strategy has n={n_steps} steps (columns of C) but the sampling scheme has steps={scheme.steps}"
                )
            fast = structured_analyses(strategy, scheme, delta1)
        if fast is not None:
            # the strategy's structure gives the same analyses without the dense encoder
            self.strategy_description = strategy.describe()
            self.adaptive = bool(adaptive) and bool(getattr(strategy, "adaptive", True))
            self.structured = True
            self._finish_init(fast, grid_step, max(s.num_units for _, s in fast), start)
            return
        self.structured = False
        C, self.strategy_description, may_adapt = _matrix_of(strategy)
        adaptive = bool(adaptive) and may_adapt
        _check_nonnegative(C)
        m, n = C.shape
        if n != scheme.steps:
            raise InvalidParameterError(
                f"the strategy has n={n} steps (columns of C) but the sampling scheme has steps={scheme.steps}"
            )
        if not np.any(C > 0):
            raise InvalidParameterError("the encoder C is all zeros")
        self.adaptive = adaptive
        release = _release_steps(C)
        why = _order_problem(C, adaptive, b, release)
        if why is not None:
            raise UnsupportedConfigurationError(why)
        analyses = []
        if b == 1:
            units = [np.array([i]) for i in range(m) if np.any(C[i] > 0)]
            struct = tail_bound_structure(C, units, q, delta1)
            analyses.append(("all rows", struct))
        else:
            phases = [0] if isinstance(strategy, (Identity, ToeplitzStrategy)) else list(range(min(b, n)))
            for k in phases:
                cols = np.arange(k, n, b)
                blocks: dict[int, list[int]] = {}
                for i in range(m):
                    if release[i] >= k and np.any(C[i] > 0):
                        blocks.setdefault(int((release[i] - k) // b), []).append(i)
                units = [np.array(blocks[r]) for r in sorted(blocks)]
                struct = tail_bound_structure(C, units, q, delta1, columns=cols)
                analyses.append((f"phase {k}", struct))
        self._finish_init(analyses, grid_step, m, start)

    def _finish_init(self, analyses: list, grid_step: float | None, rows: int, start: float) -> None:
        if grid_step is None:
            grid_step = _default_grid(analyses)
        self.grid_step = grid_step
        self.analyses = tuple(self._analysis(label, struct) for label, struct in analyses)
        self.num_rows = rows
        self.setup_seconds = time.perf_counter() - start

    def _analysis(self, label: str, struct: TailBoundStructure) -> _Analysis:
        keys, hkeys = _unit_keys(struct, self.grid_step)
        return _Analysis(label, struct, _group(keys), _group(hkeys), struct.num_units)

    # ------------------------------------------------------------------ evaluation
    def _compose(
        self,
        struct: TailBoundStructure,
        groups,
        probs: np.ndarray,
        sigma: float,
        callback: RowCallback | None,
        description: str = "MMCC rows",
    ) -> tuple[PrivacyLossDistribution, dict]:
        tasks = []
        for u, _ in groups:
            sl = struct.unit(u)
            tasks.append((struct.sensitivities[sl], probs[sl]))
        if tasks:
            _check_row_grid(max(float(np.sum(c)) for c, _ in tasks), sigma, self.discretization)
        plds, backend = compute_row_plds(
            tasks,
            sigma,
            self.grid_step,
            self.discretization,
            merge_budget=self.merge_budget,
            workers=self.workers,
            scheduler=self.scheduler,
            callback=callback,
            cache_dir=self.cache_dir,
            description=description,
        )
        total: PrivacyLossDistribution | None = None
        for (_, count), pld in zip(groups, plds):
            if pld is None:
                continue
            part = pld.self_compose(count)
            total = part if total is None else total.compose(part)
        if total is None:
            total = PrivacyLossDistribution.identity(self.discretization)
        return total, backend

    def _evaluate(self, analysis: _Analysis, sigma: float, heuristic: bool, callback: RowCallback | None) -> dict:
        struct = analysis.structure
        delta1 = struct.delta1
        delta2 = self.delta - delta1
        probs = struct.probabilities(sigma)
        phase = "" if len(self.analyses) == 1 else f" ({analysis.label})"
        pld, backend = self._compose(struct, analysis.groups, probs, sigma, callback, f"MMCC rows{phase}")
        by_dir = pld.epsilon_by_direction(delta2)
        nontrivial = struct.prior_norm > 0
        out = {
            "label": analysis.label,
            "epsilon": max(by_dir.values()),
            "epsilon_by_direction": by_dir,
            "delta1": delta1,
            "delta2": delta2,
            "max_probability_ratio": float(np.max(probs / struct.sampling_prob)) if probs.size else 1.0,
            "nontrivial_pairs": int(np.count_nonzero(nontrivial)),
            "tail_events": struct.tail_events,
            "delta_prime": struct.delta_prime,
            "gaussian_quantile_z": struct.z,
            "units": analysis.num_units,
            "distinct_units_computed": len(analysis.groups),
            "units_reused": sum(c for _, c in analysis.groups) - len(analysis.groups),
            "backend": backend,
        }
        if heuristic:
            flat = np.full(struct.sensitivities.shape, struct.sampling_prob)
            hpld, _ = self._compose(struct, analysis.heuristic_groups, flat, sigma, None, f"MMCC heuristic rows{phase}")
            out["independent_rows_heuristic_epsilon"] = hpld.epsilon(self.delta)
        return out

    def epsilon(self, noise_multiplier: float) -> float:
        """MMCC epsilon at ``noise_multiplier`` (worst phase), without the heuristic."""
        sigma = _v.positive("noise_multiplier", noise_multiplier)
        return max(self._evaluate(a, sigma, False, None)["epsilon"] for a in self.analyses)

    def report(
        self, noise_multiplier: float, *, heuristic: bool = True, callback: RowCallback | None = None
    ) -> PrivacyReport:
        """The :class:`~dpmf.accounting.report.PrivacyReport` at ``noise_multiplier``.

        ``heuristic=True`` also computes the independent-rows heuristic (doubles the row work).
        ``callback(done, total)`` is called after each distinct row of each phase.
        """
        start = time.perf_counter()
        sigma = _v.positive("noise_multiplier", noise_multiplier)
        results = [self._evaluate(a, sigma, heuristic, callback) for a in self.analyses]
        worst = max(results, key=lambda r: r["epsilon"])
        diagnostics = {
            "algorithm": "MMCC (Alg. 1)" if self.cycle_length == 1 else "generalized MMCC (Alg. 3)",
            "adaptive": self.adaptive,
            "delta_split": self.delta_split,
            "delta1": worst["delta1"],
            "delta2": worst["delta2"],
            "grid_step": self.grid_step,
            "discretization": self.discretization,
            "merge_budget": self.merge_budget,
            "max_probability_ratio": worst["max_probability_ratio"],
            "rows": self.num_rows,
            "units": worst["units"],
            "distinct_units_computed": sum(r["distinct_units_computed"] for r in results),
            "units_reused": sum(r["units_reused"] for r in results),
            "tail_events": worst["tail_events"],
            "delta_prime": worst["delta_prime"],
            "worst_phase": worst["label"],
            "backend": worst["backend"],
            "setup_seconds": self.setup_seconds,
            "seconds": time.perf_counter() - start,
        }
        if heuristic:
            diagnostics["independent_rows_heuristic_epsilon"] = max(
                r["independent_rows_heuristic_epsilon"] for r in results
            )
            diagnostics["heuristic_note"] = (
                "independent-rows heuristic (p~ = q): an estimate of the true epsilon, not a bound"
            )
        if len(results) > 1:
            diagnostics["epsilon_by_phase"] = {r["label"]: r["epsilon"] for r in results}
        return PrivacyReport(
            epsilon=worst["epsilon"],
            delta=self.delta,
            noise_multiplier=sigma,
            method=NAME,
            certified=True,
            epsilon_by_direction=worst["epsilon_by_direction"],
            strategy=self.strategy_description,
            scheme=self.scheme.describe(),
            diagnostics=diagnostics,
        )


# ============================================================================ functions
@guarded(NAME, supports, pair_options=("adaptive",))
def account_mmcc(
    strategy,
    scheme,
    noise_multiplier: float,
    delta: float,
    *,
    delta_split: float = 0.5,
    adaptive: bool = True,
    grid_step: float | None = None,
    discretization: float = DEFAULT_DISCRETIZATION,
    merge_budget: float = DEFAULT_MERGE_BUDGET,
    heuristic: bool = True,
    workers: int | None = None,
    scheduler: object = None,
    callback: RowCallback | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> PrivacyReport:
    """MMCC report: ``(epsilon, delta)`` with ``delta = delta_1 + delta_2`` (module docstring).

    Args:
        strategy: a dpmf strategy with ``encoder()`` (Identity, ToeplitzStrategy, BinaryTree,
            DenseStrategy, ...) or a plain non-negative ``m x n`` numpy matrix ``C``.
        scheme: :class:`~dpmf.sampling.PoissonSampling` (Alg. 1) or
            :class:`~dpmf.sampling.CyclicPoissonSampling` (Alg. 3, worst phase).
        noise_multiplier: sigma of ``z ~ N(0, sigma^2 I)`` for ``C`` as given.
        delta: total delta; ``delta_1 = delta_split * delta`` pays for the tail bounds (0 when
            none are needed), ``delta_2 = delta - delta_1`` for the composed PLD.
        adaptive: inputs chosen adaptively (needs lower-triangular C); ``False`` accepts any C.
        grid_step: ``Delta_2``, the grid every entry of ``C`` is rounded up to (default: 1 when
            all entries (block norms) are integers, which is exact, else 0.01 times the largest;
            exact multiples stay put).
        discretization: loss grid of the PLDs.
        merge_budget: mass x grid steps each merged sensitivity point may move up
            (:func:`~dpmf.accounting.mmcc.rows.merge_upward`; 0 disables merging).
        heuristic: also compute the independent-rows heuristic (diagnostic only).
        workers, scheduler: see :mod:`dpmf.accounting.mmcc.rows`.
        callback: ``callback(done, total)`` after each distinct row.
        cache_dir: a directory where every finished row PLD is saved at once and from which
            saved rows are reloaded: run the same call again after an interruption and it
            resumes (bit-for-bit the same result; :class:`~dpmf.accounting.mmcc.rows.RowCache`).

    >>> from dpmf.strategies import Identity
    >>> r = account_mmcc(Identity(128), PoissonSampling(1 / 128, 128), 1.0, 1e-6)
    >>> round(r.epsilon, 4), r.diagnostics["delta1"]   # DP-SGD, paper App. F.5: 0.806
    (0.8064, 0.0)
    """
    row_sum = _structured_row_sum(strategy)
    if row_sum is not None:  # refuse a hopeless run before the sigma-free setup
        _check_row_grid(row_sum, _v.positive("noise_multiplier", noise_multiplier), _v.positive("discretization", discretization))
    acc = MMCCAccountant(
        strategy,
        scheme,
        delta,
        delta_split=delta_split,
        adaptive=adaptive,
        grid_step=grid_step,
        discretization=discretization,
        merge_budget=merge_budget,
        workers=workers,
        scheduler=scheduler,
        cache_dir=cache_dir,
    )
    return acc.report(noise_multiplier, heuristic=heuristic, callback=callback)


@guarded(NAME, supports, pair_options=("adaptive",))
def calibrate_mmcc(
    strategy,
    scheme,
    target_epsilon: float,
    delta: float,
    *,
    rel_tol: float = 1e-3,
    callback: ProgressCallback | None = None,
    delta_split: float = 0.5,
    adaptive: bool = True,
    grid_step: float | None = None,
    discretization: float = DEFAULT_DISCRETIZATION,
    merge_budget: float = DEFAULT_MERGE_BUDGET,
    workers: int | None = None,
    scheduler: object = None,
    cache_dir: str | os.PathLike | None = None,
) -> float:
    """Smallest noise multiplier (to ``rel_tol``) whose MMCC epsilon is ``<= target_epsilon``.

    Builds one :class:`MMCCAccountant` (all sigma-free work done once: Gram matrices, column
    norms, binomial top-t sums, grid indices, row grouping) and searches with
    :func:`dpmf.privacy.calibration.smallest_noise`; only ``p~(sigma)`` and the row PLDs are
    recomputed per evaluation. The returned sigma was evaluated and passes.
    ``callback(sigma, epsilon)`` is called per evaluation; the other options are those of
    :func:`account_mmcc`.
    """
    target = _v.positive("target_epsilon", target_epsilon)
    acc = MMCCAccountant(
        strategy,
        scheme,
        delta,
        delta_split=delta_split,
        adaptive=adaptive,
        grid_step=grid_step,
        discretization=discretization,
        merge_budget=merge_budget,
        workers=workers,
        scheduler=scheduler,
        cache_dir=cache_dir,
    )
    res = smallest_noise(acc.epsilon, target, rel_tol=rel_tol, callback=callback)
    if math.isnan(res.epsilon) or not res.epsilon <= target:  # pragma: no cover - by construction
        raise AssertionError("calibration returned a failing noise multiplier")
    return res.value
