"""Vectorized numerical kernels of the Monte Carlo privacy-loss samplers (private).

The dynamic program works on *time-major* arrays of shape ``(n, S)``: row ``i`` holds step ``i``
of ``S`` independent samples, so the backward recursion of Dong & Ganesh (2026), Thm 5.1 /
Eq. (1), walks contiguous rows while every operation is vectorized over the samples. Outputs
``y`` are drawn *sample-major* ``(S, n)`` (a participation's column is then a contiguous write)
and the BLAS product ``C^T y`` returns them time-major.

* :class:`Bands` -- a non-negative lower-triangular encoder ``C`` held by its ``w`` non-zero
  diagonals (``cols[i, k] = C[i + k, i]``), built from a Toeplitz coefficient vector or a dense
  matrix; ``dots`` / ``dots_sm`` compute ``d_i = <c_i, y_{i:i+w}>`` (``d = C^T y``) by blocked
  BLAS products (``2 n (w + 31)`` flops per sample), ``add_columns_sm`` / ``add_matvec_sm``
  add the means ``C x`` of the participations to sample-major outputs.
* :func:`logaddexp` -- ``log(e^a + e^b)`` from SIMD ``exp``/``log1p`` (numpy's own ufunc is
  several times slower); :func:`log_mix` -- ``log((1 - p) + p e^l)``.
* :func:`backward_dp` -- Eq. (1) with a circular buffer of ``b`` rows, plus the warm-start
  corollary ``(f_1 + p sum_{i=2}^b f_i) / (1 + (b - 1) p)``: rescaled linear space with a
  log-space fallback (:func:`backward_dp_log`, the reference).

All arithmetic is float64; nothing here validates its inputs (``losses.py`` does).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["Bands", "logaddexp", "log_mix", "backward_dp", "backward_dp_log", "logsumexp_rows", "banded_matvec"]

_BLOCK = 32  # output rows per BLAS block of C^T y


def _block_rows(w: int) -> int:
    """Output rows per BLAS block: each costs ``L + w - 1`` multiply-adds per row, so small
    ``L`` wastes fewer flops on the zero triangles of the band; ``L >= _BLOCK`` keeps BLAS busy."""
    return _BLOCK  # measured: 32-64 rows are fastest for w = 32 .. 256


class Bands:
    """Banded lower-triangular ``C`` (``n x n``): ``cols[i, k] = C[i + k, i]`` for ``k < w``.

    ``toeplitz`` holds the coefficient vector when every full column is the same (then the BLAS
    blocks of the interior are one shared matrix).
    """

    def __init__(self, cols: np.ndarray, toeplitz: np.ndarray | None = None) -> None:
        self.cols = np.ascontiguousarray(cols, dtype=np.float64)
        self.n, self.w = self.cols.shape
        self.toeplitz = toeplitz
        # ||c_i||^2 (the last w-1 columns are cut by the end of the horizon)
        self.sq = np.einsum("ik,ik->i", self.cols, self.cols)
        self._blocks: list[tuple[int, int, int, np.ndarray]] | None = None

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_coefs(cls, coefs: np.ndarray, n: int) -> "Bands":
        c = np.asarray(coefs, dtype=np.float64)[:n]
        nz = np.flatnonzero(c)
        w = int(nz[-1]) + 1 if nz.size else 1
        c = c[:w]
        cols = np.zeros((n, w))
        cols[:] = c
        # column i only has rows i .. n-1
        for k in range(1, w):
            cols[n - k :, k] = 0.0
        return cls(cols, toeplitz=c.copy())

    @classmethod
    def from_dense(cls, C: np.ndarray) -> "Bands":
        n = C.shape[0]
        i, j = np.nonzero(C)
        w = int((i - j).max()) + 1 if i.size else 1
        cols = np.zeros((n, w))
        for k in range(w):
            cols[: n - k, k] = np.diagonal(C, -k)
        return cls(cols)

    def dense(self) -> np.ndarray:
        """The ``n x n`` matrix (for tests and small n)."""
        C = np.zeros((self.n, self.n))
        for k in range(self.w):
            idx = np.arange(self.n - k)
            C[idx + k, idx] = self.cols[: self.n - k, k]
        return C

    # ----------------------------------------------------------------- products
    def _block_list(self) -> list[tuple[int, int, int, np.ndarray]]:
        """``(a, e, r, MT)`` with ``d[a:e] = MT @ y[a:r]`` where ``MT = C[a:r, a:e].T``."""
        if self._blocks is None:
            L = _block_rows(self.w)
            blocks = []
            shared: dict[tuple[int, int], np.ndarray] = {}
            for a in range(0, self.n, L):
                e = min(a + L, self.n)
                r = min(e + self.w - 1, self.n)
                interior = self.toeplitz is not None and r == e + self.w - 1
                key = (e - a, r - a)
                if interior and key in shared:
                    blocks.append((a, e, r, shared[key]))
                    continue
                MT = np.zeros((e - a, r - a))
                for k in range(self.w):
                    j = np.arange(a, min(e, r - k))
                    MT[j - a, j + k - a] = self.cols[j, k]
                if interior:
                    shared[key] = MT
                blocks.append((a, e, r, MT))
            self._blocks = blocks
        return self._blocks

    def dots(self, y: np.ndarray) -> np.ndarray:
        """``d = C^T y`` for time-major ``y`` of shape ``(n, S)``: ``d_i = <c_i, y_{i:i+w}>``."""
        if self.w == 1:
            return self.cols[:, :1] * y
        out = np.empty_like(y)
        for a, e, r, M in self._block_list():
            np.matmul(M, y[a:r], out=out[a:e])
        return out

    def dots_sm(self, y: np.ndarray) -> np.ndarray:
        """``d = C^T y`` for *sample-major* ``y`` of shape ``(S, n)``; returns time-major ``(n, S)``."""
        if self.w == 1:
            return np.ascontiguousarray((y * self.cols[:, 0]).T)
        out = np.empty((self.n, y.shape[0]))
        for a, e, r, M in self._block_list():
            np.matmul(M, y[:, a:r].T, out=out[a:e])
        return out

    def add_matvec_sm(self, y: np.ndarray, x: np.ndarray) -> None:
        """``y += (C x)`` row by row for sample-major ``x, y`` of shape ``(S, n)``."""
        if self.w == 1:
            y += x * self.cols[:, 0]
            return
        for a, e, r, M in self._block_list():
            y[:, a:r] += x[:, a:e] @ M

    def add_columns_sm(self, y: np.ndarray, t: np.ndarray, s: np.ndarray, coef: np.ndarray | float = 1.0) -> None:
        """``y[s_j, :] += coef_j * c_{t_j}`` for sample-major ``y`` ``(S, n)`` (contiguous writes).

        The pairs must have distinct ``s`` (one participation per sample per call).
        """
        if t.size == 0:
            return
        vals = self.cols[t]
        if not np.isscalar(coef):
            vals = vals * np.asarray(coef)[:, None]
        elif coef != 1.0:
            vals = vals * coef
        if self.w == 1:
            y[s, t] += vals[:, 0]
            return
        cols = t[:, None] + np.arange(self.w)[None, :]
        ok = cols < self.n
        if ok.all():
            y[s[:, None], cols] += vals
        else:
            rows = np.broadcast_to(s[:, None], cols.shape)
            y[rows[ok], cols[ok]] += vals[ok]


def logaddexp(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, tmp: np.ndarray | None = None) -> np.ndarray:
    """``log(exp(a) + exp(b))`` elementwise: ``max + log1p(exp(-|a - b|))``.

    Exact up to rounding; ``a = -inf`` (or ``b``) gives the other argument. Not both ``-inf``.
    """
    if out is None:
        out = np.empty(np.broadcast_shapes(np.shape(a), np.shape(b)))
    if tmp is None:
        tmp = np.empty_like(out)
    np.subtract(a, b, out=tmp)
    np.maximum(a, b, out=out)
    np.abs(tmp, out=tmp)
    np.negative(tmp, out=tmp)
    np.exp(tmp, out=tmp)
    np.log1p(tmp, out=tmp)
    np.add(out, tmp, out=out)
    return out


def log_mix(llr: np.ndarray, p: float) -> np.ndarray:
    """``log((1 - p) + p * exp(llr))`` (the log-likelihood ratio of one subsampled step)."""
    if p == 1.0:
        return np.array(llr, dtype=np.float64, copy=True)
    return logaddexp(math.log1p(-p), llr + math.log(p))


def logsumexp_rows(x: np.ndarray) -> np.ndarray:
    """``log(sum_i exp(x[i]))`` over axis 0 of a 2-d array (finite entries)."""
    m = x.max(axis=0)
    return m + np.log(np.exp(x - m).sum(axis=0))


def backward_dp(
    log_part: np.ndarray,
    log_stay: float,
    sep: int,
    *,
    warm_log_p: float | None = None,
    affine: tuple[float, np.ndarray] | None = None,
) -> np.ndarray:
    """``ln f_0`` (cold) or the warm-start mixture of Eq. (1) of Dong & Ganesh (2026).

    With ``affine = (a, h)`` the first argument holds ``d`` and the exponents are
    ``a * d[i] - h[i]`` (computed block by block, so the full array is never rewritten).

    Same result as :func:`backward_dp_log` (up to rounding), about 4x faster: the recursion runs
    on ``f`` itself (three multiply-adds per step) and the buffer is rescaled to max 1 after every
    ``sep`` steps, the scale kept in log space. Within one block every ``f_i`` is a sum of
    non-negative terms with at most one factor ``e^{log_part}``, so nothing overflows unless a
    ``log_part`` exceeds ~690. A sample whose block maximum leaves ``[1e-80, 1e290]`` or whose
    block values span more than 200 orders of magnitude (where an underflowed term could matter)
    is recomputed in log space. Exponents are floored at -700 before ``exp`` (no subnormals);
    such a term is below ``1e-304`` while every kept value is above ``1e-280``.
    """
    n, S = log_part.shape
    q = math.exp(log_stay) if math.isfinite(log_stay) else 0.0
    buf = np.ones((sep, S))
    off = np.zeros(S)
    bad = np.zeros(S, dtype=bool)
    E = np.empty((min(sep, n), S))
    tmp = np.empty(S)
    i = n - 1
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        while i >= 0:
            lo = max(i - sep + 1, 0)
            e = E[: i + 1 - lo]
            if affine is None:
                np.maximum(log_part[lo : i + 1], -700.0, out=e)
            else:
                np.multiply(log_part[lo : i + 1], affine[0], out=e)
                e -= affine[1][lo : i + 1, None]
                np.maximum(e, -700.0, out=e)
            np.exp(e, out=e)
            for j in range(i, lo - 1, -1):
                slot = buf[j % sep]  # holds f_{j+sep}; becomes f_j
                if q:
                    np.multiply(buf[(j + 1) % sep], q, out=tmp)  # before slot changes (sep = 1)
                    np.multiply(slot, e[j - lo], out=slot)
                    slot += tmp
                else:
                    np.multiply(slot, e[j - lo], out=slot)
            top = buf.max(axis=0)
            low = buf.min(axis=0)
            bad |= ~((top <= 1e290) & (top >= 1e-80) & (low >= top * 1e-200))
            top[bad] = 1.0
            buf /= top
            off += np.log(top)
            i = lo - 1
        if warm_log_p is None:
            out = off + np.log(buf[0])
        else:
            p = math.exp(warm_log_p)
            rest = buf[1:].sum(axis=0) if sep > 1 else 0.0
            out = off + np.log(buf[0] + p * rest) - math.log1p((sep - 1) * p)
    if bad.any():
        lp = log_part[:, bad]
        if affine is not None:
            lp = affine[0] * lp - affine[1][:, None]
        out[bad] = backward_dp_log(lp, log_stay, sep, warm_log_p=warm_log_p)
    return out


def backward_dp_log(
    log_part: np.ndarray,
    log_stay: float,
    sep: int,
    *,
    warm_log_p: float | None = None,
) -> np.ndarray:
    """``ln f_0`` (cold) or the warm-start mixture of Eq. (1) of Dong & Ganesh (2026), log space.

    ``f_i = e^{log_stay} f_{i+1} + e^{log_part[i]} f_{i+sep}`` with ``f_i = 1`` for ``i >= n``
    (0-based; the paper's ``f_{i+1}``). ``log_stay = ln(1 - p)`` (``-inf`` for ``p = 1``) and
    ``log_part[i] = ln p + llr_i`` give Thm 5.1; other choices give Thm 6.1 and App. B/D.
    ``warm_log_p = ln p`` returns ``ln((f_0 + p sum_{i=1}^{sep-1} f_i) / (1 + (sep - 1) p))``.
    Memory: a circular buffer of ``sep`` rows.
    """
    n, S = log_part.shape
    buf = np.zeros((sep, S))
    t1 = np.empty(S)
    t2 = np.empty(S)
    tmp = np.empty(S)
    stay_finite = math.isfinite(log_stay)
    for i in range(n - 1, -1, -1):
        far = buf[i % sep]  # ln f_{i+sep}
        if stay_finite:
            np.add(buf[(i + 1) % sep], log_stay, out=t1)
            np.add(log_part[i], far, out=t2)
            logaddexp(t1, t2, out=far, tmp=tmp)
        else:
            np.add(log_part[i], far, out=far)
    if warm_log_p is None:
        return buf[0].copy()
    # slot i % sep holds ln f_i for i = 0 .. sep-1 (0 where i >= n: f = 1 past the horizon)
    rows = np.array([buf[i % sep] for i in range(sep)])
    rows[1:] += warm_log_p
    return logsumexp_rows(rows) - math.log1p((sep - 1) * math.exp(warm_log_p))


def banded_matvec(bands: Bands, x: np.ndarray) -> np.ndarray:
    """``C x`` for time-major ``x`` of shape ``(n, S)`` (blocked BLAS, the transpose of ``dots``)."""
    if bands.w == 1:
        return bands.cols[:, :1] * x
    out = np.zeros_like(x)
    for a, e, r, MT in bands._block_list():  # noqa: SLF001 - same module family
        out[a:r] += MT.T @ x[a:e]
    return out
