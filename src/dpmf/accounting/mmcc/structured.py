"""MMCC tail-bound structures of structured encoders, without the dense ``C`` or its Gram matrix.

Paper: Choquette-Choo et al., "Privacy amplification for matrix mechanisms" (ICLR 2024), Alg. 2
and App. F.3/F.4; digest ``notes/mmcc.md`` §3.2, §3.5 and §4.1/§4.3. The reference computation is
:func:`~dpmf.accounting.mmcc.tail_bounds.tail_bound_structure` on the dense encoder (an incremental
``n x n`` Gram matrix and a partial sort of every unit's Gram rows: ``O(m n^2)`` time, ``O(m n)``
memory). The functions here return **the same** :class:`TailBoundStructure`, bit for bit (the same
float operations in the same order; tested against the dense path in
``tests/accounting/test_mmcc_scale.py``), from the strategy's parameters:

* :func:`toeplitz_structure` -- a lower-triangular Toeplitz ``C`` (``ToeplitzStrategy``, its
  ``BLTStrategy`` subclass, banded Toeplitz such as BSR/BISR, and ``Identity`` = coefficients
  ``[1]``) under Poisson sampling (and cyclic Poisson with cycle 1, the same analysis). Row ``i``,
  column ``j < i``, ``d = i - j``: the Gram entry of columns ``j'``, ``j`` over rows ``< i`` is
  ``H[d-1, i-1-j']`` with

      H[a, b] = sum_{w=0}^{min(a, b)} f(a - w) f(b - w) = H[a-1, b-1] + f(a) f(b),

  which is the dense path's incremental sum in the same order (each term is the same product, the
  running sum starts from the oldest row). So a column of ``H`` follows from the previous one in
  ``O(A)`` (``A = min(n, band) - 1`` rows of ``H`` are ever used), and the ``t`` largest entries
  of ``H[a, 0:i]`` (the top-t sums ``s``) are kept per ``a`` while ``i`` grows, by insertion into a
  descending list of length ``T = max t``. The result is a compact :class:`ToeplitzRows`: the
  sensitivity and ``a``, ``a^2`` of an entry depend on its lag only, and its ``s`` changes at a
  few rows per lag, so only the changes are stored and the rows are rebuilt one at a time when the
  accountant streams them. Time ``O(n A T)``, memory ``O(A T + n + changes)``: for the square-root
  factorization ~10 changes per lag (measured: 9.5k / 21k / 40k at n = 1024 / 2048 / 4096), so
  ``O(n T)`` in all; at most ``nnz`` (``n (n + 1) / 2`` for a dense ``C``) for coefficients whose
  top lists keep changing. Measured setup (square root, tracemalloc, scipy already imported):
  peak 8.9 / 9.9 / 11.7 MiB and 0.5 / 1.3 / 3.4 s at n = 1024 / 2048 / 4096, against 63 / 251 /
  1001 MiB and 0.6 / 1.5 / 6.1 s with the flat per-entry arrays (``benchmarks/README.md``).
* :func:`toeplitz_cyclic_structure` -- the same Toeplitz strategies under cyclic Poisson with
  cycle ``b >= 2`` (generalized MMCC, Alg. 3/4, Thm D.1; phase 0 only, the worst for Toeplitz
  ``C``, as the dense path): reduced columns ``0, b, 2b, ...``, unit ``r`` = rows ``[r b, (r+1) b)``.
  The Gram entries are ``H`` sampled at rows and columns ``e b - 1`` (``e`` = a column's age in
  blocks), the block norms depend on the age only (plus the shorter last block) and are summed in
  arrays of the dense block's shape, so numpy adds them in the same order. Flat
  :class:`TailBoundStructure` of ``nnz <= R (R + 1) / 2`` pairs, ``R = ceil(n / b)``: time
  ``O(n A + R E T)``, memory ``O(A + E T + nnz)`` (``E = min(R, A / b)``), i.e. ``O(n^2 / b^2)``
  for a dense ``C`` and ``O(n band / b^2)`` for a banded one.
* :func:`tree_structure` -- the binary tree (:class:`~dpmf.strategies.BinaryTree`, any ``n``)
  under Poisson sampling, in closed form: the rows released before node ``(h, t)`` that touch its
  columns are exactly its descendants (rows are ordered by release step, lower level first), so
  for a column ``j`` of a node at level ``h >= 1``: ``||C_{<u, j}||^2 = h``, the Gram entry with
  ``j'`` is ``h - l(j, j')`` (``l`` the level of their lowest common ancestor, when ``< h``), and
  the top-t sum adds the values ``h, h-1, h-2, ...`` with the multiplicities ``1`` and the real
  sizes of the sibling blocks. All integers (the dense path is exact on 0/1 matrices too). Nodes
  with the same level and size have the same data. Time and memory ``O(n log n)``.
* :func:`tree_cyclic_structures` -- the binary tree under cyclic Poisson with cycle ``b >= 2``,
  every phase ``k < b`` (the tree is not Toeplitz), the same closed form with the ancestors of a
  column completed before the unit's first step. ``O(n L / b)`` pairs per phase (``L = log2 n``),
  time ``O(n L (L + T))`` and memory ``O(n L)`` over all phases.

Cyclic Poisson with ``b = 1`` is plain MMCC (one unit per row, as in the dense path) and uses the
Poisson functions. Anything else (dense matrices, BandMF) returns ``None`` and the caller uses the
dense reference path. The cyclic structures are tested bit for bit against the dense path over
many ``(n, b, strategy, q, delta)``: ``n`` not divisible by ``b``, ``b = 1``, ``b = n``, ``b > n``,
bands longer than the cycle, zero runs longer than the cycle, integer and non-integer coefficients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpmf.accounting.mmcc.tail_bounds import (
    TailBoundStructure,
    UnitOffsets,
    block_norms_up,
    finish_pairs,
    posterior_bounds,
    rounding_gamma,
    union_bound,
)
from dpmf.numerics import UNIT_ROUNDOFF
from dpmf.resources import check_allocation

__all__ = ["structured_analyses", "toeplitz_structure", "toeplitz_cyclic_structure", "tree_structure", "tree_cyclic_structures", "ToeplitzRows"]


def structured_analyses(strategy, scheme, delta1: float) -> tuple[list[tuple[str, TailBoundStructure]], int] | None:
    """``(analyses, rows)``: the analyses MMCC needs for ``(strategy, scheme)`` computed from the
    strategy's structure and the number of rows of ``C``, or ``None`` when there is no structured
    path (the caller then uses the dense encoder)."""
    from dpmf.sampling.schemes import CyclicPoissonSampling, PoissonSampling
    from dpmf.strategies.identity import Identity
    from dpmf.strategies.toeplitz import ToeplitzStrategy
    from dpmf.strategies.tree import BinaryTree

    if not isinstance(scheme, (PoissonSampling, CyclicPoissonSampling)) or scheme.steps != getattr(strategy, "n", None):
        return None
    q = scheme.sampling_prob
    n = int(strategy.n)
    coefs = None
    if isinstance(strategy, Identity):
        coefs = np.ones(1)
    elif isinstance(strategy, ToeplitzStrategy):
        coefs = np.asarray(strategy.coefs, dtype=np.float64)
        if not (np.all(np.isfinite(coefs)) and np.all(coefs >= 0) and coefs.size and coefs[0] > 0):
            return None
    check_allocation(1, n, "MMCC's structured rows (a few numbers per step)", copies=8)
    if isinstance(scheme, CyclicPoissonSampling) and scheme.cycle_length > 1:
        if coefs is None:
            if isinstance(strategy, BinaryTree):  # every phase (the tree is not Toeplitz)
                return tree_cyclic_structures(n, scheme.cycle_length, q, delta1, strategy.scale), tree_rows(n)
            return None
        # phase 0 only, as the dense path does for Toeplitz C (module docstring of the accountant)
        return [("phase 0", toeplitz_cyclic_structure(coefs, n, scheme.cycle_length, q, delta1))], n
    if coefs is not None:
        return [("all rows", toeplitz_structure(coefs, n, q, delta1))], n
    if isinstance(strategy, BinaryTree):
        return [("all rows", tree_structure(n, q, delta1, strategy.scale))], tree_rows(n)
    return None


def tree_rows(n: int) -> int:
    """Number of rows (kept nodes) of the binary-tree encoder over ``n`` steps."""
    from dpmf.strategies.tree import tree_nodes

    return int(tree_nodes(n).shape[0])


def _structure_info(pairs: int, counts_max: int, tvals: np.ndarray, kind: str) -> dict:
    """The ``info`` of a structure: union-bound pairs, the largest binomial count seen and its
    threshold, and which structured path built it."""
    return {
        "pairs": pairs,
        "max_binomial_count": max(counts_max, 0),
        "max_threshold": int(tvals[counts_max]) if counts_max >= 0 else 0,
        "structured": kind,
    }


def _next_h_column(hcol: np.ndarray, pcol: np.ndarray, fa: np.ndarray, pos_a: np.ndarray, fb: float):
    """Column ``b + 1`` of ``H[a, b] = H[a-1, b-1] + f(a) f(b)`` (and of its positivity pattern)
    from column ``b``, with ``fb = f(b + 1)``: the dense path's running sum, term by term."""
    new = np.empty(fa.size)
    new[0] = fa[0] * fb
    new[1:] = hcol[:-1] + fa[1:] * fb
    newp = np.empty(fa.size, dtype=bool)
    newp[0] = pos_a[0] and fb > 0
    newp[1:] = pcol[:-1] | (pos_a[1:] & (fb > 0))
    return new, newp


def _insert_descending(top: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Insert ``x[a]`` into each descending row ``top[a]`` (dropping the smallest)."""
    return _insert_descending_pos(top, x)[0]


def _insert_descending_pos(top: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_insert_descending` and the insertion position of every row (``>= top.shape[1]``:
    the row is unchanged)."""
    pos = np.count_nonzero(top > x[:, None], axis=1)
    k = np.arange(top.shape[1])[None, :]
    shifted = np.empty_like(top)
    shifted[:, 0] = -np.inf
    shifted[:, 1:] = top[:, :-1]
    p = pos[:, None]
    return np.where(k < p, top, np.where(k == p, x[:, None], shifted)), pos


@dataclass(frozen=True)
class ToeplitzRows(UnitOffsets):
    """The :class:`~dpmf.accounting.mmcc.tail_bounds.TailBoundStructure` of a lower-triangular
    Toeplitz ``C`` (one unit per row, all columns) stored by lag, not by entry.

    Row ``i`` holds the lags ``d <= i`` with ``f(d) > 0`` (``lags``, ascending), its entries in
    increasing column order (decreasing lag). Its sensitivity ``f(d)`` and its ``a``, ``a^2``
    (``H[d-1, d-1]`` rounded) depend on the lag only; its top-t sum ``s`` depends on the row too,
    but only changes at a few rows per lag (when the binomial threshold grows or a new Gram entry
    enters the lag's top list), so only those changes are stored (``change_row``/``change_pos``/
    ``change_value``, sorted by row). :meth:`iter_units` replays them and yields the rows one at a
    time, bit for bit the rows of the flat structure. Memory ``O(n + changes)``: for the square-
    root factorization a few values per lag (measured: see ``info["signal_changes"]``), at most
    ``nnz`` for adversarial coefficients. The flat arrays (``columns``, ``sensitivities``,
    ``prior_norm``, ``prior_norm_sq``, ``signal``, :meth:`probabilities`) are built on demand,
    in ``O(nnz)`` memory: for tests and small ``n`` only; the accountant never asks for them.
    """

    sampling_prob: float
    delta1: float
    delta_prime: float
    z: float
    tail_events: int
    offsets: np.ndarray
    coefs: np.ndarray
    lags: np.ndarray
    lag_a: np.ndarray
    lag_a2: np.ndarray
    change_row: np.ndarray
    change_pos: np.ndarray
    change_value: np.ndarray
    nontrivial_pairs: int
    info: dict = field(default_factory=dict)

    def iter_units(self, units=None):
        """Yield ``(u, sensitivities, a, a^2, s)`` of every row (or of the sorted ``units``)."""
        wanted = None if units is None else iter(units)
        nxt = None if wanted is None else next(wanted, None)
        sens_pos = self.coefs[self.lags]
        cur = np.zeros(self.lags.size)
        rows, pos, vals = self.change_row, self.change_pos, self.change_value
        p = 0
        for i in range(self.num_units):
            if wanted is not None and nxt is None:
                return
            q = int(np.searchsorted(rows, i, side="right"))
            if q > p:
                cur[pos[p:q]] = vals[p:q]
                p = q
            if wanted is not None and i != nxt:
                continue
            k = int(self.offsets[i + 1] - self.offsets[i])
            yield (i, sens_pos[:k][::-1].copy(), self.lag_a[:k][::-1].copy(), self.lag_a2[:k][::-1].copy(),
                   cur[:k][::-1].copy())
            if wanted is not None:
                nxt = next(wanted, None)

    def sensitivity_summary(self) -> tuple[float, bool]:
        c = self.coefs[self.lags]
        if self.num_units == 0 or c.size == 0:
            return 0.0, True
        c = c[self.lags < self.num_units]
        return float(c.max()), bool(np.all(c == np.round(c)))

    # -- flat views, O(nnz): tests and small n only
    def _flat(self, index: int) -> np.ndarray:
        parts = [row[index] for row in self.iter_units()]
        return np.concatenate(parts) if parts else np.zeros(0)

    @property
    def columns(self) -> np.ndarray:
        parts = [u - self.lags[: self.offsets[u + 1] - self.offsets[u]][::-1] for u in range(self.num_units)]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    @property
    def sensitivities(self) -> np.ndarray:
        return self._flat(1)

    @property
    def prior_norm(self) -> np.ndarray:
        return self._flat(2)

    @property
    def prior_norm_sq(self) -> np.ndarray:
        return self._flat(3)

    @property
    def signal(self) -> np.ndarray:
        return self._flat(4)

    def probabilities(self, noise_multiplier: float) -> np.ndarray:
        return posterior_bounds(self.sampling_prob, self.z, self.prior_norm, self.prior_norm_sq, self.signal,
                                noise_multiplier)


def toeplitz_structure(coefs: np.ndarray, n: int, sampling_prob: float, delta1: float) -> ToeplitzRows:
    """:func:`~dpmf.accounting.mmcc.tail_bounds.tail_bound_structure` of the ``n x n`` lower-
    triangular Toeplitz ``C`` with coefficients ``coefs`` (``>= 0``, ``coefs[0] > 0``), one unit per
    row, all columns (module docstring), as a compact :class:`ToeplitzRows`."""
    n = int(n)
    q = float(sampling_prob)
    f = np.zeros(n)
    c = np.asarray(coefs, dtype=np.float64)[:n]
    f[: c.size] = c
    nzd = np.flatnonzero(f > 0)  # lags d with a non-zero coefficient (nzd[0] = 0)
    w = int(nzd[-1]) + 1
    steps = np.arange(n)
    sizes = np.searchsorted(nzd, steps, side="right")  # entries of row i: lags d <= i
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(sizes)
    appearances = np.searchsorted(nzd, n - 1 - steps, side="right")  # rows touching column j
    pairs = int(np.sum(np.maximum(appearances - 1, 0)))
    events, delta_prime, z, tvals = union_bound(pairs, delta1, n, q)
    exact = bool(np.all(f == np.round(f))) and float(f.max(initial=0.0)) ** 2 * (n + 1) * (n + 1) < 2.0**52
    gam = 0.0 if exact else rounding_gamma(n + n + 4)

    A = min(n, w) - 1  # rows a = d - 1 of H that are ever used
    T = int(tvals.max()) if pairs else 0
    fa = f[:A]
    pos_a = fa > 0
    hcol = np.zeros(A)
    pcol = np.zeros(A, dtype=bool)
    diag = np.zeros(A)
    K = np.zeros(A, dtype=np.int64)
    top = np.full((A, max(T, 1)), -np.inf)
    la = nzd[1:] - 1  # H rows of the lags d >= 1 (positions 1.. of nzd)
    t_old = np.full(la.size, -1, dtype=np.int64)
    ch_row, ch_pos, ch_val = [], [], []
    for i in range(1, n):
        if A == 0:
            break
        b = i - 1  # insert column b of H (column j' = i - 1 - b of C ... all earlier columns)
        hcol, pcol = _next_h_column(hcol, pcol, fa, pos_a, f[b])
        if b < A:
            diag[b] = hcol[b]
        K += pcol
        if T > 0:
            top, ins = _insert_descending_pos(top, hcol)
        # the top-t sums of the lags present in row i (d <= i) that changed: the lag is new, its
        # threshold t moved, or the new Gram entry landed among its first t
        present = int(np.searchsorted(nzd, i, side="right")) - 1  # lags at positions 1..present
        if present <= 0:
            continue
        ap = la[:present]
        t = tvals[K[ap]]
        dirty = (t != t_old[:present])
        if T > 0:
            dirty |= ins[ap] < t
        idx = np.flatnonzero(dirty)
        if idx.size == 0:
            continue
        t_old[:present] = t
        tt = t[idx]
        tmax = int(tt.max())
        if tmax > 0:
            csum = np.cumsum(top[ap[idx], :tmax], axis=1)
            sv = np.where(tt > 0, csum[np.arange(idx.size), np.maximum(tt - 1, 0)], 0.0)
        else:
            sv = np.zeros(idx.size)
        ch_row.append(np.full(idx.size, i, dtype=np.int64))
        ch_pos.append(idx + 1)
        ch_val.append(sv)
    counts_max = int(K[la].max()) if la.size and n >= 2 else -1
    # finish (round) per lag and per change, with the same element-wise operations as the flat path
    lag_a = np.zeros(nzd.size)
    lag_a2 = np.zeros(nzd.size)
    if la.size:
        lag_a[1:], lag_a2[1:], _ = finish_pairs(diag[la], np.zeros(la.size), exact, gam)
    sv_raw = np.concatenate(ch_val) if ch_val else np.zeros(0)
    change_value = finish_pairs(np.ones(sv_raw.size), sv_raw, exact, gam)[2] if sv_raw.size else sv_raw
    nontrivial = int(np.sum((n - nzd[1:]) * (lag_a[1:] > 0)))
    info = {**_structure_info(pairs, counts_max, tvals, "toeplitz"), "signal_changes": int(sv_raw.size)}
    return ToeplitzRows(
        sampling_prob=q,
        delta1=float(delta1) if pairs else 0.0,
        delta_prime=delta_prime,
        z=z,
        tail_events=events,
        offsets=offsets,
        coefs=f,
        lags=nzd,
        lag_a=lag_a,
        lag_a2=lag_a2,
        change_row=np.concatenate(ch_row) if ch_row else np.zeros(0, np.int64),
        change_pos=np.concatenate(ch_pos) if ch_pos else np.zeros(0, np.int64),
        change_value=change_value,
        nontrivial_pairs=nontrivial,
        info=info,
    )

def _norms_from_squares(sq: np.ndarray, integer: bool, rows: int) -> np.ndarray:
    """The two branches of :func:`~dpmf.accounting.mmcc.tail_bounds.block_norms_up` applied to
    column sums of squares ``sq`` of a block with ``rows`` rows (``integer``: every entry of the
    dense block is an integer below 2^20), element by element (the same float operations)."""
    if integer:
        norms = np.sqrt(sq)
        exact = (norms == np.round(norms)) & (norms * norms == sq)
        return np.where(exact, norms, np.nextafter(norms, np.inf))
    gam = rounding_gamma(rows + 4)
    up = np.nextafter(np.sqrt(sq * (1.0 + gam)) * (1.0 + 2 * UNIT_ROUNDOFF), np.inf)
    return np.where(sq > 0, up, 0.0)


def toeplitz_cyclic_structure(
    coefs: np.ndarray, n: int, cycle_length: int, sampling_prob: float, delta1: float
) -> TailBoundStructure:
    """Generalized MMCC (Alg. 3/4, Thm D.1) for phase 0 of cyclic Poisson with cycle ``b``: the
    structure the dense path builds with ``tail_bound_structure(C, units, q, delta1,
    columns=arange(0, n, b))`` and unit ``r`` = rows ``[r b, min((r+1) b, n))``, without ``C``.

    Column ``c`` (step ``c b``) has *age* ``e = r - c`` at unit ``r``; its Gram entry with the
    column of age ``e'`` over the rows before the unit is ``H[e b - 1, e' b - 1]`` (``H`` of
    :func:`toeplitz_structure`, stepped column by column and sampled every ``b`` columns), and its
    block sensitivity is the rounded-up norm of ``f(e b), ..., f(e b + L - 1)`` (``L`` rows in the
    block), summed over an array of the dense block's shape ``(L, R)`` so numpy adds in the same
    order. Time ``O(n A + R E T + R^2)``, memory ``O(A + E T + nnz)`` with ``R = ceil(n / b)``
    units, ``A = min(n, band)``, ``E = min(R, A / b)`` ages with a non-zero block and ``nnz <=
    R (R + 1) / 2`` stored pairs.
    """
    n = int(n)
    b = int(cycle_length)
    q = float(sampling_prob)
    f = np.zeros(n)
    c = np.asarray(coefs, dtype=np.float64)[:n]
    f[: c.size] = c
    R = -(-n // b)
    w = int(np.flatnonzero(f > 0)[-1]) + 1
    fp = np.zeros(R * b + b)  # f padded: lags >= n never occur in a real row (they stay 0)
    fp[:n] = f

    # -- unit sensitivities: full blocks depend on the age only, the last block may be shorter
    L_last = n - (R - 1) * b
    ok_int = (f == np.round(f)) & (np.abs(f) < 2.0**20)
    first_bad = int(np.argmin(ok_int)) if not ok_int.all() else n  # first lag breaking the integer test
    ages = np.arange(R)

    def block_values(L: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Sensitivity of age e (e = 0..R-1) for a block of L rows: raw for L = 1, else the
        norms for the integer and the float branch."""
        if L == 1:
            return fp[ages * b], None, None
        F = fp[ages[None, :] * b + np.arange(L)[:, None]]  # (L, R), C-contiguous like the dense block
        sq = np.sum(F * F, axis=0)
        return sq, _norms_from_squares(sq, True, L), _norms_from_squares(sq, False, L)

    full = block_values(b) if R > 1 or L_last == b else None
    last = block_values(L_last)

    def unit_values(r: int) -> np.ndarray:
        """Sensitivities of unit r indexed by age e = 0..r (column c = r - e)."""
        L = b if r < R - 1 else L_last
        raw, vint, vflt = full if r < R - 1 else last
        if L == 1:
            return raw[: r + 1]
        # the dense block holds lags e b + w (e <= r, w < L); the integer test covers all of them
        if L == b:
            integer = first_bad >= min(n, (r + 1) * b)
        else:
            lags = (ages[: r + 1, None] * b + np.arange(L)[None, :]).ravel()
            integer = bool(np.all(ok_int[lags[lags < n]]))
        return (vint if integer else vflt)[: r + 1]

    # -- union bound: appearances of every column (units r >= c with a positive entry)
    pos_full = (full[0] if b == 1 else full[1]) > 0 if full is not None else np.zeros(R, dtype=bool)
    pos_last = (last[0] if L_last == 1 else last[1]) > 0
    cum_full = np.concatenate([[0], np.cumsum(pos_full)])
    cols = np.arange(R)
    appearances = cum_full[np.maximum(R - 1 - cols, 0)] + pos_last[R - 1 - cols]
    pairs = int(np.sum(np.maximum(appearances - 1, 0)))
    events, delta_prime, z, tvals = union_bound(pairs, delta1, R, q)
    exact = bool(np.all(f == np.round(f))) and float(f.max(initial=0.0)) ** 2 * (n + 1) * (R + 1) < 2.0**52
    gam = 0.0 if exact else rounding_gamma(n + R + 4)

    # -- H stepped column by column (rows a < A), sampled at rows a_e = e b - 1 and columns e' b - 1
    A = min(n, w) - 1
    E = min(R - 1, A // b)  # ages e = 1..E can have a non-zero block entry
    T = int(tvals.max()) if pairs else 0
    fa = f[:A]
    pos_a = fa > 0
    hcol = np.zeros(A)
    pcol = np.zeros(A, dtype=bool)
    rows_e = np.arange(1, E + 1) * b - 1
    diag = np.zeros(E + 1)
    K = np.zeros(E + 1, dtype=np.int64)  # index by age (K[0] unused)
    top = np.full((E + 1, max(T, 1)), -np.inf)

    offsets = np.zeros(R + 1, dtype=np.int64)
    cols_l, sens_l, act_l, gjj_l, sv_l = [], [], [], [], []
    counts_max = -1
    bcol = -1  # last column of H computed
    for r in range(R):
        if r >= 1 and A > 0:
            while bcol < r * b - 1:
                bcol += 1
                hcol, pcol = _next_h_column(hcol, pcol, fa, pos_a, f[bcol])
            if E > 0:
                e_new = r  # column c = 0 has age r: its samples H[e b - 1, r b - 1] join every list
                if e_new <= E:
                    diag[e_new] = hcol[rows_e[e_new - 1]]
                K[1:] += pcol[rows_e]
                if T > 0:
                    top[1:] = _insert_descending(top[1:], hcol[rows_e])
        vals_by_age = unit_values(r)
        e_nz = np.flatnonzero(vals_by_age > 0)[::-1]  # ascending column c = r - e
        colsr = r - e_nz
        sens = vals_by_age[e_nz]
        act = e_nz > 0
        gjj = np.zeros(e_nz.size)
        sv = np.zeros(e_nz.size)
        if act.any():
            ea = e_nz[act]
            kk = K[ea]
            t = tvals[kk]
            counts_max = max(counts_max, int(kk.max()))
            tmax = int(t.max())
            if tmax > 0:
                csum = np.cumsum(top[ea, :tmax], axis=1)
                sv[act] = np.where(t > 0, csum[np.arange(ea.size), np.maximum(t - 1, 0)], 0.0)
            gjj[act] = diag[ea]
        offsets[r + 1] = offsets[r] + e_nz.size
        cols_l.append(colsr)
        sens_l.append(sens)
        act_l.append(act)
        gjj_l.append(gjj)
        sv_l.append(sv)
    cat = lambda xs, dt=np.float64: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    return _assemble(
        q, delta1, delta_prime, z, events, offsets, cat(cols_l, np.int64), cat(sens_l),
        cat(act_l, bool), cat(gjj_l), cat(sv_l), exact, gam, pairs, counts_max, tvals, "toeplitz-cyclic",
    )


def tree_cyclic_structures(
    n: int, cycle_length: int, sampling_prob: float, delta1: float, scale: float = 1.0
) -> list[tuple[str, TailBoundStructure]]:
    """Generalized MMCC (Alg. 3/4, Thm D.1) of the binary tree under cyclic Poisson with cycle
    ``b >= 2``: one structure per phase ``k = 0 .. min(b, n) - 1``, each the one the dense path
    builds (columns ``k, k + b, ...``; unit ``r`` = the nodes released in steps ``[k + r b, k +
    (r+1) b)``), in closed form.

    Column ``j`` (reduced column ``c``, ``j = k + c b``) at unit ``r`` (``S = k + r b``): the rows
    before the unit that cover ``j`` are its ancestors with ``stop <= S``, the levels ``h < H_j``
    (stops grow with the level); the Gram entry with ``j'`` counts the common ones, ``max(0, H_j -
    l)`` with ``l`` the level of their lowest common ancestor, and is the float sum of that many
    ``scale^2`` (as the dense path adds them); the ``j'`` with a given ``l`` are the reduced
    columns before ``S`` in the sibling block at level ``l - 1``. The unit's sensitivity is the
    rounded-up norm of ``scale`` times the number of its nodes covering ``j``. Time ``O(n L^2 +
    n L T)`` and memory ``O(n L / b)`` per phase (``L = log2 n`` levels), ``O(n L (L + T))`` time
    in all; no matrix.
    """
    from dpmf.strategies.tree import tree_nodes

    n = int(n)
    b = int(cycle_length)
    q = float(sampling_prob)
    scale = float(scale)
    nodes = tree_nodes(n)
    m = nodes.shape[0]
    L = int(nodes[:, 0].max())
    release = nodes[:, 4]
    sq1 = scale * scale
    g = np.zeros(m + 2)
    for k_ in range(1, g.size):
        g[k_] = g[k_ - 1] + sq1
    hs = np.arange(L + 1)
    int_scale = scale == round(scale) and abs(scale) < 2.0**20
    out = []
    for k in range(min(b, n)):
        R = -(-(n - k) // b)
        cols = k + np.arange(R, dtype=np.int64) * b
        stops = np.minimum(((cols[:, None] >> hs) + 1) << hs, n)  # (R, L+1), non-decreasing in h
        unit_of = (stops - 1 - k) // b  # unit of each ancestor node of each column
        appearances = 1 + np.count_nonzero(np.diff(unit_of, axis=1) > 0, axis=1)
        pairs = int(np.sum(appearances - 1))
        events, delta_prime, z, tvals = union_bound(pairs, delta1, R, q)
        exact = scale == round(scale) and sq1 * (m + 1) * (R + 1) < 2.0**52
        gam = 0.0 if exact else rounding_gamma(m + R + 4)
        offsets = np.zeros(R + 1, dtype=np.int64)
        cols_l, sens_l, act_l, gjj_l, sv_l = [], [], [], [], []
        counts_max = -1
        for r in range(R):
            S = k + r * b
            lo_row, hi_row = np.searchsorted(release, [S, S + b])
            rows_in = int(hi_row - lo_row)
            first = int(nodes[lo_row:hi_row, 2].min())  # the block's nodes cover [first, S + b)
            c0 = max(0, -(-(first - k) // b))
            c1 = min(R, -(-(min(S + b, n) - k) // b))
            cc = np.arange(c0, c1)
            st = stops[cc]
            H = np.count_nonzero(st <= S, axis=1)
            cnt = np.count_nonzero(st <= S + b, axis=1) - H  # the unit's nodes covering column j
            if R == 1:  # one column: the dense block is (rows, 1), which numpy sums pairwise
                sub = np.zeros((rows_in, 1))
                blk = nodes[lo_row:hi_row]
                sub[(blk[:, 2] <= cols[0]) & (cols[0] < blk[:, 3]), 0] = scale
                vals = sub[0] if rows_in == 1 else block_norms_up(sub)
                vals = vals[cc]
            elif rows_in == 1:
                vals = np.where(cnt > 0, scale, 0.0)
            else:
                vals = _norms_from_squares(g[cnt], int_scale, rows_in)
            keep = vals > 0
            cc, H, vals = cc[keep], H[keep], vals[keep]
            act = cc < r
            gjj = np.zeros(cc.size)
            sv = np.zeros(cc.size)
            if act.any():
                ca, Ha = cc[act], H[act]
                ja = cols[ca]
                # multiplicity of each lowest-common-ancestor level l among the columns before S
                mult = np.zeros((ca.size, L + 1), dtype=np.int64)
                mult[:, 0] = 1
                for l in range(1, L + 1):
                    lo = ((ja >> (l - 1)) ^ 1) << (l - 1)
                    hi = lo + (1 << (l - 1))
                    a0 = np.maximum(0, -((k - lo) // b))
                    a1 = np.minimum(r, -((k - hi) // b))
                    mult[:, l] = np.where(l < Ha, np.maximum(0, a1 - a0), 0)
                Kc = mult.sum(axis=1)
                t = tvals[Kc]
                counts_max = max(counts_max, int(Kc.max()))
                cum = np.cumsum(mult, axis=1)
                acc = np.zeros(ca.size)
                for kk in range(int(t.max(initial=0))):
                    level = np.count_nonzero(cum <= kk, axis=1)  # l of the kk-th largest value
                    acc = acc + np.where(kk < t, g[np.maximum(Ha - level, 0)], 0.0)
                gjj[act] = g[Ha]
                sv[act] = acc
            offsets[r + 1] = offsets[r] + cc.size
            cols_l.append(cc)
            sens_l.append(vals)
            act_l.append(act)
            gjj_l.append(gjj)
            sv_l.append(sv)
        cat = lambda xs, dt=np.float64: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
        struct = _assemble(
            q, delta1, delta_prime, z, events, offsets, cat(cols_l, np.int64), cat(sens_l),
            cat(act_l, bool), cat(gjj_l), cat(sv_l), exact, gam, pairs, counts_max, tvals, "tree-cyclic",
        )
        out.append((f"phase {k}", struct))
    return out


def _assemble(q, delta1, delta_prime, z, events, offsets, columns, sens, active, gjj, sv, exact, gam, pairs,
              counts_max, tvals, kind: str) -> TailBoundStructure:
    """The :class:`TailBoundStructure` from the per-entry pair sums (``finish_pairs`` on the
    active entries, zeros elsewhere), shared by the Toeplitz and tree paths."""
    total = active.size
    prior_norm = np.zeros(total)
    prior_sq = np.zeros(total)
    signal = np.zeros(total)
    if active.any():
        prior_norm[active], prior_sq[active], signal[active] = finish_pairs(gjj[active], sv[active], exact, gam)
    info = _structure_info(pairs, counts_max, tvals, kind)
    return TailBoundStructure(
        sampling_prob=q,
        delta1=float(delta1) if pairs else 0.0,
        delta_prime=delta_prime,
        z=z,
        tail_events=events,
        offsets=offsets,
        columns=columns,
        sensitivities=sens,
        prior_norm=prior_norm,
        prior_norm_sq=prior_sq,
        signal=signal,
        info=info,
    )


def tree_structure(n: int, sampling_prob: float, delta1: float, scale: float = 1.0) -> TailBoundStructure:
    """:func:`~dpmf.accounting.mmcc.tail_bounds.tail_bound_structure` of the binary-tree encoder
    over ``n`` steps with entries ``scale`` (rows in release order, one unit per row; module
    docstring). A Gram entry shared by ``k`` rows is the float sum of ``k`` products
    ``scale * scale`` added one by one, as in the dense path (exact integers for ``scale = 1``)."""
    from dpmf.strategies.tree import tree_nodes

    n = int(n)
    q = float(sampling_prob)
    scale = float(scale)
    nodes = tree_nodes(n)  # (level, index, start, stop, release), in release order
    m = nodes.shape[0]
    levels = int(nodes[:, 0].max())
    sizes = nodes[:, 3] - nodes[:, 2]
    offsets = np.zeros(m + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(sizes)
    total = int(offsets[-1])
    pairs = total - n  # every column is in L + 1 nodes; all but its first appearance are pairs
    events, delta_prime, z, tvals = union_bound(pairs, delta1, n, q)
    exact = scale == round(scale) and scale**2 * (m + 1) * (n + 1) < 2.0**52
    gam = 0.0 if exact else rounding_gamma(m + n + 4)
    g = np.zeros(levels + 2)  # g[k]: Gram entry of two columns sharing k earlier rows
    sq = scale * scale
    for k in range(1, levels + 2):
        g[k] = g[k - 1] + sq

    cache: dict[tuple[int, int], np.ndarray] = {}
    counts_max = -1

    def node_signal(h: int, size: int) -> np.ndarray:
        """Top-t sums per column of a level-``h`` node with ``size`` real steps (``h >= 1``)."""
        nonlocal counts_max
        r = np.arange(size, dtype=np.int64)  # column offset inside the node; steps >= size are virtual
        K = np.minimum(size - ((r >> (h - 1)) << (h - 1)), 1 << (h - 1))  # real size of j's child block
        counts_max = max(counts_max, int(K.max()))
        t = tvals[K]
        # columns j' sharing exactly h - l earlier rows with j (l = level of their common
        # ancestor): l = 0 is j itself, l >= 1 the real part of the sibling block at level l - 1
        mult = np.ones((size, h), dtype=np.int64)
        for l in range(1, h):
            sib = ((r >> (l - 1)) ^ 1) << (l - 1)
            mult[:, l] = np.clip(size - sib, 0, 1 << (l - 1))
        cum = np.cumsum(mult, axis=1)
        # descending Gram values summed one by one, as the dense path's cumsum of its sorted top-t
        acc = np.zeros(size)
        for k in range(int(t.max(initial=0))):
            level = np.count_nonzero(cum <= k, axis=1)  # l of the k-th largest value
            acc = acc + np.where(k < t, g[h - np.minimum(level, h - 1)], 0.0)
        return acc

    cols_l, act_l, gjj_l, sv_l = [], [], [], []
    for h, _, start, stop, _ in nodes.tolist():
        size = stop - start
        cols_l.append(np.arange(start, stop, dtype=np.int64))
        if h == 0:  # a leaf: no earlier row touches its column
            act_l.append(np.zeros(size, dtype=bool))
            gjj_l.append(np.zeros(size))
            sv_l.append(np.zeros(size))
            continue
        key = (h, size)
        if key not in cache:
            cache[key] = node_signal(h, size)
        act_l.append(np.ones(size, dtype=bool))
        gjj_l.append(np.full(size, g[h]))
        sv_l.append(cache[key])
    active = np.concatenate(act_l)
    gjj = np.concatenate(gjj_l)
    sv = np.concatenate(sv_l)
    return _assemble(
        q, delta1, delta_prime, z, events, offsets, np.concatenate(cols_l), np.full(total, scale),
        active, gjj, sv, exact, gam, pairs, counts_max, tvals, "tree",
    )
