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
  ``[1]``) under Poisson sampling. Row ``i``, column ``j < i``, ``d = i - j``: the Gram entry of
  columns ``j'``, ``j`` over rows ``< i`` is ``H[d-1, i-1-j']`` with

      H[a, b] = sum_{w=0}^{min(a, b)} f(a - w) f(b - w) = H[a-1, b-1] + f(a) f(b),

  which is the dense path's incremental sum in the same order (each term is the same product, the
  running sum starts from the oldest row). So a column of ``H`` follows from the previous one in
  ``O(A)`` (``A = min(n, band) - 1`` rows of ``H`` are ever used), and the ``t`` largest entries
  of ``H[a, 0:i]`` (the top-t sums ``s``) are kept per ``a`` while ``i`` grows, by insertion into a
  descending list of length ``T = max t``. Time ``O(n A T + nnz)``, memory ``O(A T + nnz)``
  (``nnz`` = stored pairs: ``n (n + 1) / 2`` for a dense ``C``, ``~ n band`` for a banded one).
* :func:`tree_structure` -- the binary tree (:class:`~dpmf.strategies.BinaryTree`, any ``n``)
  under Poisson sampling, in closed form: the rows released before node ``(h, t)`` that touch its
  columns are exactly its descendants (rows are ordered by release step, lower level first), so
  for a column ``j`` of a node at level ``h >= 1``: ``||C_{<u, j}||^2 = h``, the Gram entry with
  ``j'`` is ``h - l(j, j')`` (``l`` the level of their lowest common ancestor, when ``< h``), and
  the top-t sum adds the values ``h, h-1, h-2, ...`` with the multiplicities ``1`` and the real
  sizes of the sibling blocks. All integers (the dense path is exact on 0/1 matrices too). Nodes
  with the same level and size have the same data. Time and memory ``O(n log n)``.

Anything else (dense matrices, BandMF, cyclic Poisson for the tree or a Toeplitz ``C``) returns
``None`` and the caller uses the dense reference path.
"""

from __future__ import annotations

import numpy as np

from dpmf.accounting.mmcc.tail_bounds import TailBoundStructure, _gamma, finish_pairs, union_bound

__all__ = ["structured_analyses", "toeplitz_structure", "tree_structure"]


def structured_analyses(strategy, scheme, delta1: float) -> list[tuple[str, TailBoundStructure]] | None:
    """The analyses MMCC needs for ``(strategy, scheme)`` computed from the strategy's structure,
    or ``None`` when there is no structured path (the caller then uses the dense encoder)."""
    from dpmf.sampling.schemes import PoissonSampling
    from dpmf.strategies.identity import Identity
    from dpmf.strategies.toeplitz import ToeplitzStrategy
    from dpmf.strategies.tree import BinaryTree

    if not isinstance(scheme, PoissonSampling) or scheme.steps != getattr(strategy, "n", None):
        return None
    q = scheme.sampling_prob
    if isinstance(strategy, Identity):
        return [("all rows", toeplitz_structure(np.ones(1), strategy.n, q, delta1))]
    if isinstance(strategy, ToeplitzStrategy):
        coefs = np.asarray(strategy.coefs, dtype=np.float64)
        if np.all(np.isfinite(coefs)) and np.all(coefs >= 0) and coefs[0] > 0:
            return [("all rows", toeplitz_structure(coefs, strategy.n, q, delta1))]
        return None
    if isinstance(strategy, BinaryTree):
        return [("all rows", tree_structure(strategy.n, q, delta1, strategy.scale))]
    return None


def _insert_descending(top: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Insert ``x[a]`` into each descending row ``top[a]`` (dropping the smallest)."""
    pos = np.count_nonzero(top > x[:, None], axis=1)[:, None]
    k = np.arange(top.shape[1])[None, :]
    shifted = np.empty_like(top)
    shifted[:, 0] = -np.inf
    shifted[:, 1:] = top[:, :-1]
    return np.where(k < pos, top, np.where(k == pos, x[:, None], shifted))


def toeplitz_structure(coefs: np.ndarray, n: int, sampling_prob: float, delta1: float) -> TailBoundStructure:
    """:func:`~dpmf.accounting.mmcc.tail_bounds.tail_bound_structure` of the ``n x n`` lower-
    triangular Toeplitz ``C`` with coefficients ``coefs`` (``>= 0``, ``coefs[0] > 0``), one unit per
    row, all columns (module docstring)."""
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
    total = int(offsets[-1])
    appearances = np.searchsorted(nzd, n - 1 - steps, side="right")  # rows touching column j
    pairs = int(np.sum(np.maximum(appearances - 1, 0)))
    events, delta_prime, z, tvals = union_bound(pairs, delta1, n, q)
    exact = bool(np.all(f == np.round(f))) and float(f.max(initial=0.0)) ** 2 * (n + 1) * (n + 1) < 2.0**52
    gam = 0.0 if exact else _gamma(n + n + 4)

    columns = np.empty(total, dtype=np.int64)
    sens = np.empty(total)
    gjj_flat = np.zeros(total)
    sv_flat = np.zeros(total)
    active = np.zeros(total, dtype=bool)
    counts_max = -1

    A = min(n, w) - 1  # rows a = d - 1 of H that are ever used
    T = int(tvals.max()) if pairs else 0
    fa = f[:A]
    pos_a = fa > 0
    hcol = np.zeros(A)
    pcol = np.zeros(A, dtype=bool)
    diag = np.zeros(A)
    K = np.zeros(A, dtype=np.int64)
    top = np.full((A, max(T, 1)), -np.inf)
    for i in range(n):
        if i >= 1 and A > 0:
            b = i - 1  # insert column b of H (column j' = i - 1 - b of C ... all earlier columns)
            fb = f[b]
            new = np.empty(A)
            new[0] = fa[0] * fb
            new[1:] = hcol[:-1] + fa[1:] * fb
            newp = np.empty(A, dtype=bool)
            newp[0] = pos_a[0] and fb > 0
            newp[1:] = pcol[:-1] | (pos_a[1:] & (fb > 0))
            hcol, pcol = new, newp
            if b < A:
                diag[b] = hcol[b]
            K += pcol
            if T > 0:
                top = _insert_descending(top, hcol)
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        d = nzd[: sizes[i]][::-1]  # lags in increasing column order
        columns[lo:hi] = i - d
        sens[lo:hi] = f[d]
        if d.size > 1:
            a = d[:-1] - 1  # the active (seen) entries: every lag >= 1
            kk = K[a]
            t = tvals[kk]
            counts_max = max(counts_max, int(kk.max()))
            tmax = int(t.max())
            if tmax > 0:
                csum = np.cumsum(top[a, :tmax], axis=1)
                sv = np.where(t > 0, csum[np.arange(a.size), np.maximum(t - 1, 0)], 0.0)
            else:
                sv = np.zeros(a.size)
            gjj_flat[lo : hi - 1] = diag[a]
            sv_flat[lo : hi - 1] = sv
            active[lo : hi - 1] = True
    return _assemble(
        q, delta1, delta_prime, z, events, offsets, columns, sens,
        active, gjj_flat, sv_flat, exact, gam, pairs, counts_max, tvals, "toeplitz",
    )


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
    info = {
        "pairs": pairs,
        "max_binomial_count": max(counts_max, 0),
        "max_threshold": int(tvals[counts_max]) if counts_max >= 0 else 0,
        "structured": kind,
    }
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
    gam = 0.0 if exact else _gamma(m + n + 4)
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
