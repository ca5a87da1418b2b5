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
fewer rows and fewer tail events). ``cycle_length = 1`` is plain MMCC. Toeplitz strategies and
the binary tree get these analyses from their structure, without the encoder
(:mod:`.structured`).

Diagnostics (issue item 5): ``max_probability_ratio`` (max ``p~/q``; about the factor by which
MMCC can overstate epsilon, paper Sec. 4), ``independent_rows_heuristic_epsilon`` (``p~ = q``
everywhere: what the rows would give if they were independent; a heuristic *estimate* of the
true epsilon, **not** a bound of either kind), ``delta1``/``delta2``, ``grid_step``
(``Delta_2``), ``discretization`` (the PLD loss grid; our mixture PLDs use an exact inverse by
Newton's method, so the paper's ``Delta_1`` search precision does not arise), rows computed vs
reused, seconds.

Cost as a function of ``n`` (steps; ``m`` rows of ``C``, ``nnz`` stored pairs = non-zero
entries of the analysed rows, ``T`` the largest binomial threshold, ~10-40 in practice):

* **setup** (sigma-free, once per accountant). Structured strategies (:mod:`.structured`, no
  dense matrix, no Gram matrix, bit for bit the dense path's structure):

  - Poisson sampling (and cyclic Poisson with cycle 1): ``Identity`` / Toeplitz / BLT / banded
    Toeplitz ``O(n A T)`` time with ``A = min(n, band)`` and ``O(A T + n + changes)`` memory
    (a compact by-lag structure, :class:`~dpmf.accounting.mmcc.structured.ToeplitzRows`;
    ``changes`` ~10 per lag for the square-root factorization, ``<= nnz`` in the worst case):
    measured 8.9 / 9.9 / 11.7 MiB traced peak at n = 1024 / 2048 / 4096 for the square root (was
    63 / 251 / 1001 MiB with per-entry arrays); the binary tree ``O(n log n)`` time and memory.
  - cyclic Poisson, cycle ``b >= 2`` (generalized MMCC): Toeplitz family, phase 0, ``O(n A + R^2
    T)`` time and ``O(A T + R^2)`` memory for ``R = ceil(n / b)`` units (``O(R band / b)`` pairs
    when banded); the tree, all ``b`` phases, ``O(n log^2 n + n log n T)`` time, ``O(n log n / b)``
    memory per phase.

  Everything else (dense or BandMF matrices) takes the dense reference path: ``O(m n^2)`` time and
  ``O(m n + n^2)`` memory (the encoder and its Gram matrix); pass ``structured=False`` to
  :class:`MMCCAccountant` to force it (the tests compare both, which agree bit for bit). The
  sigma-free grouping of rows (:func:`_unit_keys`) streams the units and keeps a 32-byte digest
  per unit (``O(m)`` memory) plus at most :data:`_KEY_BYTES_BUDGET` bytes of representative
  units to confirm equal digests byte for byte.
* **rows** (per sigma): one mixture PLD per *distinct* row (rows with equal rounded entries and
  equal tail-bound data share one, :func:`_unit_keys`): ``O(log n)`` distinct rows for the tree,
  ``n`` for a dense Toeplitz ``C`` (each ``O(n + K log K)`` for its sensitivity law on ``K``
  grid points, plus the mixture PLD on the loss grid), a handful for banded or identity; rows
  run in ``workers`` processes from :data:`~dpmf.accounting.mmcc.rows.PARALLEL_MIN_ROWS`
  distinct rows. The rows are streamed from the structure (``p~(sigma)`` computed per row) with
  at most :data:`~dpmf.accounting.mmcc.rows.PROCESS_WINDOW` rows per worker in flight
  (:func:`~dpmf.accounting.mmcc.rows.iter_row_plds`), so the inputs take ``O(n)`` memory, not
  ``O(nnz)`` (a dense Toeplitz ``C`` used to hold ``p~`` and the row inputs for all ``n (n + 1) /
  2`` pairs); the row PLDs are kept and composed in order at the end (a few KiB each for
  sqrt-Toeplitz, up to ~10^7 grid points for the widest tree rows at n = 2048). The composition
  and epsilon are ``O(G log G)`` in the loss-grid size ``G``. Measured (sigma = 20 x column
  norm, p = 1/n, 2 cores, ``benchmarks/bench_mmcc.py``): tree 2048 in 26-28 s wall (712 MiB
  traced peak, the tree rows' PLDs), sqrt-Toeplitz 2048 in 85 s on a quiet machine (32 MiB traced
  peak; 266 MiB before the by-lag structure and the streamed rows), ``benchmarks/README.md``.

Related F.5 uses of mixture-of-Gaussians PLDs (issue item 7) live in
:mod:`dpmf.privacy.random_sensitivity`: :func:`~dpmf.privacy.last_iterate_linear` (last-iterate
DP-SGD for linear losses) and :func:`~dpmf.privacy.group_dpsgd` (group privacy for DP-SGD).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dpmf import validation as _v
from dpmf.accounting.guard import check_pair, guarded, recorded_options
from dpmf.accounting.mmcc.grid import GRID_CHECK_REL, checked_coarse_grid, row_discretization, worth_checking
from dpmf.accounting.mmcc.rows import DEFAULT_MERGE_BUDGET, iter_row_plds
from dpmf.accounting.mmcc.structured import structured_analyses
from dpmf.accounting.mmcc.tail_bounds import TailBoundStructure, posterior_bounds, tail_bound_structure
from dpmf.accounting.report import PrivacyReport
from dpmf.accounting.truncated import truncation_refusal
from dpmf.errors import InvalidParameterError, NumericalError, UnsupportedConfigurationError
from dpmf.privacy.calibration import ProgressCallback, smallest_noise
from dpmf.privacy.gaussian_plds import discretization_diagnostics
from dpmf.privacy.pld import DEFAULT_DISCRETIZATION, PrivacyLossDistribution, COARSEN_OTHER_DIRECTION, composed_epsilon
from dpmf.privacy.product_mixtures import grid_indices
from dpmf.sampling.schemes import CyclicPoissonSampling, PoissonSampling
from dpmf.strategies.identity import Identity
from dpmf.strategies.toeplitz import ToeplitzStrategy
from dpmf.strategies.tree import BinaryTree

__all__ = [
    "NAME",
    "supports",
    "account_mmcc",
    "probe_mmcc",
    "noise_and_report",
    "calibrate_mmcc",
    "MMCCAccountant",
    "DEFAULT_GRID_FRACTION",
]

NAME = "mmcc"
#: Default ``grid_step`` (``Delta_2``) as a fraction of the largest entry of ``C`` (non-integer C).
DEFAULT_GRID_FRACTION = 0.01

RowCallback = Callable[[int, int], None]


#: Most PLD grid points (both directions, all phases) a report keeps for its f-DP curve.
_CURVE_MAX_POINTS = 2**23


def _curve(results: list[dict], epsilon: float, delta: float):
    """The report's :class:`~dpmf.privacy.tradeoff.PrivacyCurve`: each phase's composed PLD with its
    ``delta_1`` (conditional composition: ``(eps, delta_PLD(eps) + delta_1)``-DP for every ``eps``), the
    worst over phases; ``None`` when they would take too much memory."""
    from dpmf.privacy.tradeoff import PrivacyCurve

    if any(r["pld"] is None for r in results):
        return None
    points = sum(r["pld"].pmf("remove")[1].size * (1 if r["pld"].symmetric else 2) for r in results)
    if points > _CURVE_MAX_POINTS:
        return None
    return PrivacyCurve.from_pld(
        [(r["pld"], r["delta1"]) for r in results], epsilon=epsilon, delta=delta,
        note="MMCC: the composed PLD of the rows" + (f", worst of {len(results)} phases" if len(results) > 1 else "")
        + " (conditional composition: delta_1 added to every delta)",
    )


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
    if truncation_refusal(scheme, "MMCC") is not None:
        return truncation_refusal(scheme, "MMCC")
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
    structure: TailBoundStructure  # or a compact structure with the same unit-wise interface
    groups: tuple[tuple[int, int], ...]  # (representative unit, multiplicity)
    heuristic_groups: tuple[tuple[int, int], ...]
    num_units: int
    row_sums: np.ndarray  # total sensitivity of every unit
    largest_entry: float = 0.0  # largest entry of any unit


def _key_bytes(c: np.ndarray, a: np.ndarray, a2: np.ndarray, s: np.ndarray, grid_step: float) -> tuple[str, bytes, bytes]:
    """``(tag, bytes of the sorted (value, a, a^2, s) rows, bytes of the sorted values)`` of a unit:
    the data its PLD (and its heuristic PLD) depends on."""
    if c.size == 1:
        val = c.copy()
        tag = "exact"
    else:
        val = grid_indices(c, grid_step).astype(np.float64)
        tag = "grid"
    rows = np.stack([val, a, a2, s], axis=1)
    order = np.lexsort(rows.T[::-1])
    return tag, rows[order].tobytes(), np.sort(val).tobytes()


#: Bytes of representative units kept during :func:`_unit_keys` to confirm equal digests at once;
#: beyond it, equal digests are confirmed by a second streaming pass (:func:`_confirm_groups`).
_KEY_BYTES_BUDGET = 8 * 2**20


def _unit_keys(struct, grid_step: float) -> tuple[list, list, np.ndarray, float]:
    """Reuse keys (units with equal keys have identical PLDs at every sigma) and the total
    sensitivity of every unit (sigma-free, for :func:`~dpmf.accounting.mmcc.grid.row_discretization`).

    A key is ``(tag, size, SHA-256 of the unit's sorted (value, a, a^2, s) rows)``, about 40 bytes
    whatever the unit's size, so the keys of a dense Toeplitz ``C`` take ``O(n)`` memory, not
    ``O(n^2)``; the units are streamed (``iter_units``). Equal digests are confirmed byte for
    byte (against the representative's bytes, kept up to :data:`_KEY_BYTES_BUDGET`, else by
    :func:`_confirm_groups`): the grouping is exact, it does not rest on the hash.
    """
    keys: list = []
    hkeys: list = []
    row_sums = np.zeros(struct.num_units)
    largest = [0.0]
    kept: tuple[dict, dict] = ({}, {})
    budget = _KEY_BYTES_BUDGET
    unconfirmed = [False, False]
    for u, c, a, a2, s in struct.iter_units():
        if c.size == 0:
            keys.append(None)
            hkeys.append(None)
            continue
        row_sums[u] = float(np.sum(c))
        largest[0] = max(largest[0], float(np.max(c)))
        tag, full, vals = _key_bytes(c, a, a2, s, grid_step)
        for which, (out, data) in enumerate(((keys, full), (hkeys, vals))):
            k = (tag, c.size, hashlib.sha256(data).digest())
            out.append(k)
            reps = kept[which]
            if k not in reps:
                reps[k] = data if len(data) <= budget else None
                budget -= len(data) if reps[k] is not None else 0
            elif reps[k] is None:
                unconfirmed[which] = True
            elif reps[k] != data:  # pragma: no cover - a SHA-256 collision
                raise NumericalError(f"MMCC unit {u} shares a SHA-256 digest with an earlier, different unit")
    del kept
    for which, ks in ((1, keys), (2, hkeys)):
        if unconfirmed[which - 1]:
            _confirm_groups(struct, ks, which, grid_step)
    return keys, hkeys, row_sums, largest[0]


def _confirm_groups(struct, ks: list, which: int, grid_step: float) -> None:
    """Check that units with equal digests have equal bytes (a second streaming pass holding the
    bytes of the representatives that have duplicates only). A mismatch would be a SHA-256
    collision: refuse rather than merge."""
    first: dict = {}
    rep_of = {}
    for u, k in enumerate(ks):
        if k is None:
            continue
        if k in first:
            rep_of[u] = first[k]
        else:
            first[k] = u
    reps = set(rep_of.values())
    held: dict[int, bytes] = {}
    for u, c, a, a2, s in struct.iter_units(sorted(reps | set(rep_of))):
        data = _key_bytes(c, a, a2, s, grid_step)[which]
        if u in reps:
            held[u] = data
        if u in rep_of and held[rep_of[u]] != data:  # pragma: no cover - a SHA-256 collision
            raise NumericalError(f"MMCC units {rep_of[u]} and {u} share a SHA-256 digest but differ")


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
    summaries = [s.sensitivity_summary() for _, s in analyses]
    if all(m == 0.0 for m, _ in summaries):
        return 1.0
    if all(integer for _, integer in summaries):
        return 1.0
    return DEFAULT_GRID_FRACTION * max(m for m, _ in summaries)


def _grid_diagnostics(requested: float, fine: float, used: float) -> dict:
    """The report's grid fields: :func:`~dpmf.privacy.gaussian_plds.discretization_diagnostics` for a
    grid coarsened to fit the memory; for a grid coarsened because it was checked
    (:func:`~dpmf.accounting.mmcc.grid.checked_coarse_grid`), ``discretization_check`` says so."""
    out = discretization_diagnostics(requested, fine, "a loss grid per row that fits in the memory available")
    if used != fine:
        out["discretization"] = used
        out["discretization_requested"] = requested
        out["discretization_check"] = (
            f"accounted on the privacy-loss grid {used:g} (requested {requested:g}): the grid {2 * used:g} gave the "
            f"same epsilon to {GRID_CHECK_REL:g} relative, and the discretization error shrinks like the grid squared, "
            "so the requested grid's epsilon agrees to about a third of that; every rounding is upward (sound)")
    return out


#: MMCC's epsilon over its independent-rows estimate above which a report says MMCC is loose.
LOOSE_RATIO = 3.0
#: Agreement of two coarse grids at which the independent-rows heuristic (an estimate, not a bound,
#: shown to 4 digits) is read from the coarser pair's finer grid: 1e-5 relative, where the bound's
#: grids must agree to :data:`~dpmf.accounting.mmcc.grid.GRID_CHECK_REL`. At 5e-7 the heuristic's
#: smaller epsilon often agreed on no coarse grid and took the requested one: 8.7 of 12.4 CPU-s of
#: MMCC on BinaryTree(16), q 1/16, sigma 0.5 (2026-12-03).
HEURISTIC_GRID_REL = 1e-5


def looseness_note(epsilon: float, heuristic: float, ratio: float, cycle_length: int) -> str | None:
    """A note when MMCC's (sound) epsilon is over :data:`LOOSE_RATIO` times its independent-rows
    estimate (not a bound): most of such a gap is the theorem's posterior tail bounds (``p~`` up to
    ``max_probability_ratio`` times ``q``; MMCC is near-tight only as epsilon -> 0, paper Sec. 4),
    which no accountant option removes (``docs/notes/mmcc-slack.md`` measures it). For a banded
    ``C``, cyclic Poisson sampling with cycle >= bands is accounted without tail bounds."""
    if not (heuristic > 0 and epsilon > LOOSE_RATIO * heuristic):
        return None
    hint = ("" if cycle_length > 1 else "; for a banded strategy, cyclic Poisson sampling (cycle >= bands) is "
            "accounted without tail bounds, and `dpmf plan` compares the samplers")
    return (f"MMCC's bound is {epsilon / heuristic:.1f}x its independent-rows estimate ({heuristic:.4g}, an estimate, "
            f"not a bound): the posterior tail bounds (up to {ratio:.3g}x the sampling probability) make it loose "
            f"at this noise{hint}")


class MMCCAccountant:
    """MMCC for one ``(C, scheme, delta)``, reusable across noise multipliers.

    ``check_grids=False`` reports the requested loss grid's epsilon, never a checked coarser one
    (:meth:`_epsilon`).

    ``structured=False`` forces the dense reference path even when the strategy has a structured
    one (:mod:`dpmf.accounting.mmcc.structured`: Identity, Toeplitz/BLT/banded Toeplitz and the
    binary tree, under Poisson and cyclic Poisson sampling; same result bit for bit, used as the
    oracle in tests). :attr:`structured` says which path was taken.

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
        check_grids: bool = True,
    ) -> None:
        start = time.perf_counter()
        self.check_grids = bool(check_grids)
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
            analyses, rows = fast
            self._finish_init(analyses, grid_step, rows, start)
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
        keys, hkeys, row_sums, largest = _unit_keys(struct, self.grid_step)
        return _Analysis(label, struct, _group(keys), _group(hkeys), struct.num_units, row_sums, largest)

    # ------------------------------------------------------------------ evaluation
    def _rows(
        self,
        analysis: _Analysis,
        groups,
        sigma: float,
        heuristic: bool,
        callback: RowCallback | None,
        description: str = "MMCC rows",
        known: dict | None = None,
        only: list[int] | None = None,
        disc: float | None = None,
    ) -> tuple[list, dict, float]:
        """The PLDs of ``groups`` as ``[(row PLD, count), ...]`` (group order), computed. The units are
        streamed from the structure (``p~`` computed per unit), so their entries are never all held
        at once. Also returns ``max p~/q`` over the representatives computed here (= over all
        units: equal keys, equal ``p~``).

        ``known`` (group index -> row PLD) holds rows already computed at this sigma (they are not
        recomputed, and the ones computed here are added to it); ``only`` restricts the work to
        those group indices and the parts to the known rows (a *partial* composition, for
        :meth:`probe`). ``disc``: the loss grid (default :meth:`discretization_at`; ``known`` rows are on it)."""
        struct = analysis.structure
        q = struct.sampling_prob
        known = {} if known is None else known
        todo = [k for k in (range(len(groups)) if only is None else sorted(only)) if k not in known]
        reps = [groups[k][0] for k in todo]
        disc = self.discretization_at(sigma) if disc is None else disc
        ratio = [1.0]

        def tasks():
            # yield in group order: buffer the (few) units streamed ahead of their turn
            ahead: dict[int, tuple] = {}
            stream = struct.iter_units(sorted(reps))
            for u in reps:
                while u not in ahead:
                    v, c, a, a2, s = next(stream)
                    if heuristic:
                        p = np.full(c.shape, q)
                    else:
                        p = posterior_bounds(q, struct.z, a, a2, s, sigma)
                        if p.size:
                            ratio[0] = max(ratio[0], float(np.max(p / q)))
                    ahead[v] = (c, p)
                yield ahead.pop(u)

        info: dict = {}
        for j, pld in iter_row_plds(
            tasks(),
            len(todo),
            sigma,
            self.grid_step,
            disc,
            merge_budget=self.merge_budget,
            workers=self.workers,
            scheduler=self.scheduler,
            callback=callback,
            cache_dir=self.cache_dir,
            description=description,
            info=info,
        ):
            known[todo[j]] = pld
        return [(known[k], count) for k, (_, count) in enumerate(groups) if known.get(k) is not None], info, ratio[0]

    def _epsilon(self, analysis: _Analysis, groups, sigma: float, delta: float, heuristic: bool,
                 callback: RowCallback | None, description: str, known: dict | None = None, keep_points: int = 0,
                 rel: float = GRID_CHECK_REL):
        """``(ComposedEpsilon, info, ratio, grid)``: :meth:`_rows` composed by
        :func:`~dpmf.privacy.pld.composed_epsilon` (only the direction that decides the epsilon on
        the fine grid, unless ``keep_points`` asks for the PLD), after the rows: row PLDs are small
        next to the rows' inputs, and composing while the row processes run would only compete with
        them for the cores.

        The loss grid: the coarsest power-of-two multiple of the requested one whose epsilon agrees
        with the next coarser grid's (:func:`~dpmf.accounting.mmcc.grid.checked_coarse_grid`: the
        discretization error shrinks like the grid squared, so it is then the requested grid's to
        ~2e-7 relative; every grid's epsilon is a sound upper bound), else the requested grid
        (:meth:`discretization_at`), reusing ``known`` rows (computed there by :meth:`probe`). The
        coarse grids are not tried for several phases (their PLDs form the report's curve, on one
        grid), when the widest row's grid is small (:func:`~dpmf.accounting.mmcc.grid.worth_checking`),
        when the requested grid is already coarsened (memory) or when rows are checkpointed
        (``cache_dir``: a resumed run is the same run); they compute their rows without
        ``callback``, which then sees the reported grid's rows (replayed when a coarse grid is reported).
        ``rel`` is the agreement the coarse grids must show (:data:`HEURISTIC_GRID_REL` for the
        independent-rows heuristic, an estimate)."""
        fine = self.discretization_at(sigma)

        def at(grid: float, rows: dict | None = None, call: RowCallback | None = None):
            parts, info, ratio = self._rows(analysis, groups, sigma, heuristic, call, description, rows, disc=grid)
            if not parts:
                parts = [(PrivacyLossDistribution.identity(grid), 1)]
            result = composed_epsilon([p for p, _ in parts], [c for _, c in parts], delta, keep_points=keep_points)
            return result.epsilon, (result, info, ratio, grid)

        checked = None
        if (self.check_grids and fine == self.discretization and self.cache_dir is None and len(self.analyses) == 1
                and worth_checking(self._widest_row(), sigma, fine)):
            checked = checked_coarse_grid(at, fine, rel=rel)
        if checked is None:
            return at(fine, known, callback)[1]
        if callback is not None:
            for done in range(1, len(groups) + 1):
                callback(done, len(groups))
        return checked[1]

    def _evaluate(
        self,
        analysis: _Analysis,
        sigma: float,
        heuristic: bool,
        callback: RowCallback | None,
        known: tuple[dict, float] | None = None,
    ) -> dict:
        struct = analysis.structure
        delta1 = struct.delta1
        delta2 = self.delta - delta1
        phase = "" if len(self.analyses) == 1 else f" ({analysis.label})"
        rows, known_ratio = known if known is not None else ({}, 1.0)  # (rows a probe computed)
        composed, backend, ratio, grid = self._epsilon(
            analysis, analysis.groups, sigma, delta2, False, callback, f"MMCC rows{phase}", known=rows,
            keep_points=_CURVE_MAX_POINTS,
        )
        ratio = max(ratio, known_ratio)
        by_dir = composed.epsilon_by_direction
        out = {
            "label": analysis.label,
            "epsilon": max(by_dir.values()),
            "epsilon_by_direction": by_dir,
            "delta1": delta1,
            "delta2": delta2,
            "max_probability_ratio": ratio,
            "nontrivial_pairs": struct.nontrivial_pairs,
            "tail_events": struct.tail_events,
            "delta_prime": struct.delta_prime,
            "gaussian_quantile_z": struct.z,
            "units": analysis.num_units,
            "distinct_units_computed": len(analysis.groups),
            "units_reused": sum(c for _, c in analysis.groups) - len(analysis.groups),
            "backend": backend,
            "bounded_directions": composed.bounded,
            "discretization": grid,
            "pld": composed.pld,  # (not a diagnostic: the report's curve, below; None if a direction is bounded only)
        }
        if heuristic:
            out["independent_rows_heuristic_epsilon"] = self._heuristic_epsilon(analysis, sigma)
        return out

    def _heuristic_epsilon(self, analysis: _Analysis, sigma: float) -> float:
        """The independent-rows heuristic's epsilon of one phase (``p~ = q``; an estimate)."""
        phase = "" if len(self.analyses) == 1 else f" ({analysis.label})"
        composed, _, _, _ = self._epsilon(analysis, analysis.heuristic_groups, sigma, self.delta, True, None,
                                       f"MMCC heuristic rows{phase}", rel=HEURISTIC_GRID_REL)
        return composed.epsilon

    def _widest_row(self) -> float:
        """The largest sensitivity sum of a unit over every phase (0 when there is none)."""
        return max((float(np.max(a.row_sums)) for a in self.analyses if a.row_sums.size), default=0.0)

    def discretization_at(self, noise_multiplier: float) -> float:
        """The loss grid of the rows at this noise (:func:`~dpmf.accounting.mmcc.grid.row_discretization`
        for the widest row of every phase): the requested :attr:`discretization` unless that cannot fit in memory."""
        widest = self._widest_row()
        if widest <= 0:
            return self.discretization
        entry = max(a.largest_entry for a in self.analyses)
        return row_discretization(widest, noise_multiplier, self.discretization, entry, self.scheme.sampling_prob)

    def epsilon(self, noise_multiplier: float) -> float:
        """MMCC epsilon at ``noise_multiplier`` (worst phase), without the heuristic."""
        sigma = _v.positive("noise_multiplier", noise_multiplier)
        return max(self._evaluate(a, sigma, False, None)["epsilon"] for a in self.analyses)

    def report(
        self,
        noise_multiplier: float,
        *,
        heuristic: bool = True,
        callback: RowCallback | None = None,
        _known: dict | None = None,
    ) -> PrivacyReport:
        """The :class:`~dpmf.accounting.report.PrivacyReport` at ``noise_multiplier``.

        ``heuristic=True`` also computes the independent-rows heuristic (doubles the row work).
        ``callback(done, total)`` is called after each distinct row of each phase.
        """
        start = time.perf_counter()
        sigma = _v.positive("noise_multiplier", noise_multiplier)
        known = _known or {}
        results = [self._evaluate(a, sigma, heuristic, callback, known.get(i)) for i, a in enumerate(self.analyses)]
        worst = max(results, key=lambda r: r["epsilon"])
        diagnostics = {
            "algorithm": "MMCC (Alg. 1)" if self.cycle_length == 1 else "generalized MMCC (Alg. 3)",
            "adaptive": self.adaptive,
            "delta_split": self.delta_split,
            "delta1": worst["delta1"],
            "delta2": worst["delta2"],
            "grid_step": self.grid_step,
            **_grid_diagnostics(self.discretization, self.discretization_at(sigma), worst["discretization"]),
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
            note = looseness_note(worst["epsilon"], diagnostics["independent_rows_heuristic_epsilon"],
                                  worst["max_probability_ratio"], self.cycle_length)
            if note:
                diagnostics["looseness_note"] = note
        if len(results) > 1:
            diagnostics["epsilon_by_phase"] = {r["label"]: r["epsilon"] for r in results}
        if worst["bounded_directions"]:
            diagnostics["bounded_directions"] = (
                f"epsilon_by_direction[{worst['bounded_directions'][0]!r}] is an upper bound, composed on a "
                f"{COARSEN_OTHER_DIRECTION}x coarser grid (losses rounded up): that direction is not the worst one")
        curve = _curve(results, worst["epsilon"], self.delta)
        if curve is None:
            diagnostics["curve"] = (f"the {len(results)} phases' PLDs are too large to keep in memory together; "
                                    "tradeoff() and compose() use the (epsilon, delta) claim")
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
            curve=curve,
        )


    #: Fractions of a phase's row work (entries per row as the cost) after which :meth:`probe`
    #: checks its partial composition.
    PROBE_FRACTIONS = (1 / 16, 1 / 4, 1 / 2)

    def probe(self, noise_multiplier: float, target_epsilon: float) -> PrivacyReport | float:
        """The report at ``noise_multiplier`` (without the heuristic), or -- as soon as part of the
        rows shows it -- a lower bound on its epsilon that is already above ``target_epsilon``.

        Rows are computed cheapest first (entries per row as the cost). After each fraction of a
        phase's work in :data:`PROBE_FRACTIONS` the rows computed so far are composed and their
        epsilon is read at ``delta_2 + m tau`` (the direction :func:`~dpmf.privacy.pld.composed_epsilon`
        composes on the fine grid; ``m`` the compositions made, ``tau`` the tail mass
        each may move to +inf). Composing more rows can only raise delta(eps) (the composed pair
        projects onto the partial one: post-processing), so, up to those truncations, the full
        composition's delta at that epsilon exceeds ``delta_2``: MMCC's epsilon at this noise is
        at least the partial one. When no check fires, the rows already computed are reused and
        the full report is the same, bit for bit, as :meth:`report` (same rows, same order).
        """
        from dpmf.privacy.pld import DEFAULT_TAIL_MASS_TRUNCATION

        sigma = _v.positive("noise_multiplier", noise_multiplier)
        target = _v.positive("target_epsilon", target_epsilon)
        known: dict[int, tuple[dict, float]] = {}
        for i, a in enumerate(self.analyses):
            struct = a.structure
            size = np.array([struct.offsets[u + 1] - struct.offsets[u] for u, _ in a.groups], dtype=np.float64)
            order = np.argsort(size, kind="stable")
            cum = np.cumsum(size[order]) / max(float(size.sum()), 1.0)
            rows: dict = {}
            ratio = 1.0
            done = 0
            for frac in self.PROBE_FRACTIONS:
                upto = int(np.searchsorted(cum, frac, side="right"))
                if upto <= done or upto >= len(order):
                    continue
                phase = "" if len(self.analyses) == 1 else f" ({a.label})"
                parts, _, r = self._rows(
                    a, a.groups, sigma, False, None, f"MMCC rows{phase} (probe)", known=rows,
                    only=[int(k) for k in order[:upto]],
                )
                ratio = max(ratio, r)
                done = upto
                if not parts:
                    continue
                compositions = sum(max(int(c), 1) for k, (_, c) in enumerate(a.groups) if rows.get(k) is not None)
                slack = 2 * compositions * DEFAULT_TAIL_MASS_TRUNCATION
                delta2 = self.delta - struct.delta1
                if delta2 + slack < 1:
                    # (a lower bound needs a direction composed on the fine grid: a coarse one is an upper bound)
                    composed = composed_epsilon([p for p, _ in parts], [c for _, c in parts], delta2 + slack)
                    eps = max(v for d, v in composed.epsilon_by_direction.items() if d not in composed.bounded)
                    if eps > target:
                        return float(eps)
            known[i] = (rows, ratio)
        return self.report(sigma, heuristic=False, _known=known)

    def calibrate(
        self,
        target_epsilon: float,
        *,
        rel_tol: float = 1e-3,
        callback: ProgressCallback | None = None,
        heuristic: bool = False,
    ) -> tuple[float, PrivacyReport, int]:
        """``(noise_multiplier, report, evaluations)``: the smallest noise multiplier (to
        ``rel_tol``, :func:`dpmf.privacy.calibration.smallest_noise`) whose epsilon is ``<=
        target_epsilon``, and the report at it -- the one the search computed there (every
        evaluation is a full report, and the search always evaluates the noise it returns), so
        nothing is recomputed after the search. ``heuristic=True`` adds the independent-rows
        heuristic to that report (its rows only). The fields of
        :class:`dpmf.accounting.dispatch.Calibration`, for an ``own_calibration`` hook.
        ``callback(sigma, epsilon)`` is called per evaluation.
        """
        target = _v.positive("target_epsilon", target_epsilon)
        reports: dict[float, PrivacyReport] = {}

        def epsilon_of(sigma: float) -> float:
            if sigma not in reports:
                reports[sigma] = self.report(sigma, heuristic=False)
            return reports[sigma].epsilon

        res = smallest_noise(epsilon_of, target, rel_tol=rel_tol, callback=callback)
        if math.isnan(res.epsilon) or not res.epsilon <= target:  # pragma: no cover - by construction
            raise AssertionError("calibration returned a failing noise multiplier")
        report = reports[res.value] if res.value in reports else self.report(res.value, heuristic=False)
        if heuristic:
            report = self.add_heuristic(report)
        return res.value, report, len(reports)

    def add_heuristic(self, report: PrivacyReport) -> PrivacyReport:
        """``report`` (from :meth:`report` with ``heuristic=False``) with the independent-rows
        heuristic added, computing only the heuristic rows (not the bound's rows again)."""
        sigma = report.noise_multiplier
        values = [self._heuristic_epsilon(a, sigma) for a in self.analyses]
        diagnostics = {
            **report.diagnostics,
            "independent_rows_heuristic_epsilon": max(values),
            "heuristic_note": "independent-rows heuristic (p~ = q): an estimate of the true epsilon, not a bound",
        }
        return dataclasses.replace(report, diagnostics=diagnostics)


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
    if row_sum is not None:  # refuse a hopeless run (loss beyond float64) before the sigma-free setup
        row_discretization(row_sum, _v.positive("noise_multiplier", noise_multiplier),
                            _v.positive("discretization", discretization))
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
    :func:`account_mmcc`. :meth:`MMCCAccountant.calibrate` also returns the report at that sigma.
    """
    target = _v.positive("target_epsilon", target_epsilon)  # bad input: before the setup
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
    return acc.calibrate(target, rel_tol=rel_tol, callback=callback)[0]


def probe_mmcc(
    strategy,
    scheme,
    noise_multiplier: float,
    delta: float,
    target_epsilon: float,
    *,
    heuristic: bool = False,
    **options,
) -> PrivacyReport | float:
    """For ``dpmf.calibrate``'s one evaluation at a bound (the registry's ``probe``): the MMCC
    report at ``noise_multiplier``, or a lower bound (> ``target_epsilon``) on its epsilon found
    from the cheapest rows (:meth:`MMCCAccountant.probe`). ``options`` are those of
    :func:`calibrate_mmcc` (``heuristic`` is accepted and ignored: a probe computes no
    diagnostics). Not a privacy claim when it returns a float: only "MMCC cannot certify the
    target at this noise"."""
    check_pair(NAME, supports, strategy, scheme, {k: options[k] for k in ("adaptive",) if k in options})
    acc = MMCCAccountant(strategy, scheme, delta, **options)
    out = acc.probe(noise_multiplier, target_epsilon)
    if isinstance(out, PrivacyReport):
        out = dataclasses.replace(out, options=recorded_options(options))
    return out


def noise_and_report(
    strategy,
    scheme,
    target_epsilon: float,
    delta: float,
    *,
    rel_tol: float = 1e-3,
    callback: ProgressCallback | None = None,
    **options,
) -> tuple[float, PrivacyReport]:
    """:func:`calibrate_mmcc` for the dispatcher (the registry's ``fast_calibration``): the noise
    and the report the search computed there, with the independent-rows heuristic added from its
    own rows only (:meth:`MMCCAccountant.calibrate`), so the answer is not evaluated twice."""
    check_pair(NAME, supports, strategy, scheme, {k: options[k] for k in ("adaptive",) if k in options})
    target = _v.positive("target_epsilon", target_epsilon)
    acc = MMCCAccountant(strategy, scheme, delta, **options)
    sigma, report, _ = acc.calibrate(target, rel_tol=rel_tol, callback=callback, heuristic=True)
    return sigma, dataclasses.replace(report, options=recorded_options(options))

