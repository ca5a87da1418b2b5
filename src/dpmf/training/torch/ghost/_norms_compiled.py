"""Compiled (numba) float64 reductions of ghost mode's norms and small sums (private), on the CPU.

Each reads float32 (or float64) rows and accumulates in float64 without forming a float64 copy of them:

* :func:`row_dots`: ``out[i] = sum_j a[i, j] b[i, j]`` -- the float64 contraction of two Grams
  (:func:`~dpmf.training.torch.ghost.sequence.contract`; products of float32 numbers are exact in float64)
  and, with ``a`` = ``b``, the squared norms of per-example rows
  (:func:`~dpmf.training.torch.ghost.sequence.per_example_norms`);
* :func:`weighted_rows`: ``out[j] = sum_i f[i] r[i, j]`` (:func:`~dpmf.training.torch.ghost.sequence.per_example_sums`);
* :func:`column_sums`: ``sum_i r[i, j]`` and ``sum_i |r[i, j]|`` (:func:`~dpmf.training.torch.ghost.sequence.rows_sum_and_abs`,
  the check that a broadcast parameter's per-example gradients add up to autograd's);
* :func:`norm_affine_grads`: a LayerNorm's / RMSNorm's per-example weight and bias gradients from its input
  and output gradient in one pass (:mod:`~dpmf.training.torch.ghost.normalization`), without forming the
  normalized input.

Used for large tensors (:func:`~dpmf.training.torch.ghost.sequence.compiled_form`: more than 2^17 entries):
there the tensor forms' float64 copies (GPT-2's ``T = 128`` Grams: 2 MB each, twice per layer) were fresh
memory that the allocator returned to the system and took back every step, paying page faults. Small ones
keep the tensor forms, whose copies the allocator reuses (loading numba costs ~40 MB of memory: a small
model's private step would exceed 1.5x its plain memory; issue 52).

Float64 sums may be reassociated (``fastmath={"reassoc"}``, so the loops vectorize): the rounding bounds
of :mod:`~dpmf.training.torch.ghost.sequence` hold for any summation order. No other fast-math flag: an
``inf`` or ``NaN`` (an overflowed float32 Gram, retried in float64) must come through as it is.
"""

from __future__ import annotations

import numba as nb
import numpy as np

_FAST = {"reassoc"}


@nb.njit(cache=True, nogil=True, fastmath=_FAST)
def row_dots(a, b, out):  # pragma: no cover - compiled
    """``out[i] = sum_j a[i, j] b[i, j]`` in float64; ``a``, ``b``: ``(B, N)`` float arrays, ``out`` float64 ``(B,)``."""
    B, N = a.shape
    for i in range(B):
        s = 0.0
        for j in range(N):
            s += np.float64(a[i, j]) * np.float64(b[i, j])
        out[i] = s


@nb.njit(cache=True, nogil=True, fastmath=_FAST)
def weighted_rows(r, f, out):  # pragma: no cover - compiled
    """``out[j] = sum_i f[i] r[i, j]`` in float64; ``r``: ``(B, N)`` float array, ``f`` float64 ``(B,)``,
    ``out`` float64 ``(N,)``."""
    B, N = r.shape
    for j in range(N):
        out[j] = 0.0
    for i in range(B):
        fi = np.float64(f[i])
        for j in range(N):
            out[j] += fi * np.float64(r[i, j])


@nb.njit(cache=True, nogil=True, fastmath=_FAST)
def column_sums(r, out, out_abs):  # pragma: no cover - compiled
    """``out[j] = sum_i r[i, j]``, ``out_abs[j] = sum_i |r[i, j]|`` in float64; ``r``: ``(B, N)`` float array."""
    B, N = r.shape
    for j in range(N):
        out[j] = 0.0
        out_abs[j] = 0.0
    for i in range(B):
        for j in range(N):
            x = np.float64(r[i, j])
            out[j] += x
            out_abs[j] += abs(x)


@nb.njit(cache=True, nogil=True, fastmath=_FAST)
def norm_affine_grads(x, g, eps, center, wg, bg):  # pragma: no cover - compiled
    """Per-example gradients of a last-dim normalization's affine parameters, in float64: for each example
    ``b`` and position ``t``, ``xhat = (x - m) / sqrt(v + eps)`` over the last dim (``center``: ``m`` the mean,
    ``v`` the biased variance, as LayerNorm; else ``m = 0``, ``v`` the mean square, as RMSNorm), then
    ``wg[b] = sum_t xhat g`` and ``bg[b] = sum_t g``. ``x``, ``g``: ``(B, T, D)`` float arrays; ``wg``, ``bg``:
    float64 ``(B, D)``."""
    B, T, D = x.shape
    for b in range(B):
        for j in range(D):
            wg[b, j] = 0.0
            bg[b, j] = 0.0
        for t in range(T):
            m = 0.0
            if center:
                for j in range(D):
                    m += np.float64(x[b, t, j])
                m /= D
            v = 0.0
            for j in range(D):
                d = np.float64(x[b, t, j]) - m
                v += d * d
            r = 1.0 / np.sqrt(v / D + eps)
            for j in range(D):
                gj = np.float64(g[b, t, j])
                wg[b, j] += (np.float64(x[b, t, j]) - m) * r * gj
                bg[b, j] += gj
