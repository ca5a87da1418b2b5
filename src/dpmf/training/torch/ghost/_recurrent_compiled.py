"""Compiled (numba) loops of the recurrent ghost rule (private): the LSTM cell recurrence and the
backward through time of ``RNN``, ``GRU`` and ``LSTM``, one layer and direction, on CPU arrays.

Why compiled: everything else of the rule is batched over all time steps (two GEMMs for the gate
pre-activations, the activations in one pass, :mod:`~dpmf.training.torch.ghost.recurrent_gates`);
what is left is sequential by nature -- ``c_t = f_t c_{t-1} + i_t g_t`` and the backward recurrence
``dh_{t-1} = dgates_t W_hh`` -- and as a Python loop of tensor operations it cost more than the plain
training step itself (issue 52: 8.7 ms of a 5.5 ms step, most of it per-operation overhead on
``32 x 64`` tensors). Here one call runs a whole direction: per step one product by ``W_hh`` (float32
where the CPU has AVX-512: :func:`~dpmf.training.torch.ghost._gemm_compiled.gemm`, 2-3x SciPy's OpenBLAS
here; else BLAS ``gemm`` through ``np.dot``, the caller holding BLAS to one thread) and one pass over the batch that
forms the gate gradients from the saved activations (no transcendental function: ``sigma' = s(1-s)``,
``tanh' = 1 - y^2`` from the values).

The formulas are :mod:`~dpmf.training.torch.ghost.recurrent_gates`' (its module docstring); arrays are
batch-major and C-contiguous, ``(B, T, .)``, all of one float dtype; ``reverse``: the direction runs
from ``t = T-1`` down to 0, so its backward runs from 0 up. Outputs are written into the arrays
passed (``dg``, ...); each backward returns the gradients reaching the initial states. The rounding
differs from the per-step tensor loop the rule runs on other devices only in the order of operations
(tested equal to rounding); the rule's norms bound exactly what these loops return, whatever their
rounding.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from dpmf.training.torch.ghost._gemm_compiled import product


@nb.njit(cache=True, nogil=True)
def lstm_cells(act, c0, reverse, c):  # pragma: no cover - compiled
    """``c[:, t] = f_t * c_{t-1} + i_t * g_t`` with the gate activations ``act = [i, f, g, o]`` ``(B, T, 4H)``
    (``sigma``, ``sigma``, ``tanh``, ``sigma`` of the pre-activations), ``c_{-1} = c0`` ``(B, H)``."""
    B, T, H = c.shape
    for b in range(B):
        prev = c0[b]
        for k in range(T):
            t = T - 1 - k if reverse else k
            ar, cr = act[b, t], c[b, t]
            for j in range(H):
                cr[j] = ar[H + j] * prev[j] + ar[j] * ar[2 * H + j]
            prev = cr


@nb.njit(cache=True, nogil=True, error_model="numpy")
def lstm_forward(x, w_ih_t, bias, w_t, reverse, fast, simd, act, c, tc, ys, c0, outb, bm):  # pragma: no cover - compiled
    """The LSTM forward of one layer and direction, keeping what its backward reads, time-major: ``x``
    ``(T, B, I)`` the layer's input, ``w_ih_t`` ``(I, 4H)``: ``W_ih`` transposed, ``bias`` ``(4H,)``: ``b_ih + b_hh``
    (empty: none); ``w_t`` ``(H, 4H)``: ``W_hh`` transposed; ``ys`` ``(T + 1, B, H)``: the states, ``h0`` given in
    ``ys[0]`` (``ys[T]`` for the reverse direction), the outputs written in the others (so ``h_t`` of step ``t``
    is ``ys[t + 1]``, the state it read ``ys[t]``; reversed: ``ys[t]`` and ``ys[t + 1]``); ``c0`` ``(B, H)``. The
    input part ``x W_ih^T + b`` of every step first, one product into ``act`` ``(T, B, 4H)``; then per step
    ``act[t] += h_{t-1} W_hh^T`` (one product) and the gate activations ``act = [i, f, g, o]`` in place
    (:func:`_sigmoid`; ``tanh(g) = 2 sigma(2 g) - 1``), ``c_t = f c_{t-1} + i g``, ``tc = tanh(c_t)``,
    ``h_t = o tc``. ``fast``: float32 arrays, whose exponentials are :func:`_sigmoid`'s vectorized ones
    (else ``math.exp``); ``simd``: the products by :func:`~dpmf.training.torch.ghost._gemm_compiled.gemm`
    (else ``np.dot``); ``bm``: the outputs also written batch-major into ``outb`` ``(B, T, H)`` (any strides:
    the direction's columns of a batch-first output). Every step works on whole ``(B, .)`` blocks in flat
    loops."""
    T, B, G = act.shape
    H = G // 4
    I = x.shape[2]
    dt = act.dtype
    a2 = act.reshape(T * B, G)
    if bias.size:
        for r in range(T * B):
            row = a2[r]
            for j in range(G):
                row[j] = bias[j]
    product(x.reshape(T * B, I), w_ih_t, a2, bias.size > 0, simd)
    scale = np.ones(B * G, dt)  # 2 on the g blocks: tanh(g) = 2 sigma(2 g) - 1
    for b in range(B):
        scale[b * G + 2 * H:b * G + 3 * H] = 2
    two = np.full(B * H, 2, dt)
    for k in range(T):
        t = T - 1 - k if reverse else k
        h_prev = ys[t + 1] if reverse else ys[t]
        h_new = ys[t] if reverse else ys[t + 1]
        c_prev = c0 if k == 0 else c[t + 1 if reverse else t - 1]
        a = act[t]
        product(h_prev, w_t, a, True, simd)
        af = a.reshape(B * G)
        _sigmoid(af, af, scale, fast, True)
        ct = c[t]
        for b in range(B):
            ar, cpr, cr = a[b], c_prev[b], ct[b]
            for j in range(H):
                cr[j] = ar[H + j] * cpr[j] + ar[j] * ar[2 * H + j]
        _sigmoid(ct.reshape(B * H), tc[t].reshape(B * H), two, fast, False)
        tct = tc[t]
        for b in range(B):
            ar, tr, hr = a[b], tct[b], h_new[b]
            for j in range(H):
                hr[j] = ar[3 * H + j] * tr[j]
            if bm:
                ob = outb[b, t]
                for j in range(H):
                    ob[j] = hr[j]


@nb.njit(cache=True, nogil=True)
def _copy(src, dst):  # pragma: no cover - compiled
    """``dst[:] = src`` (1-D, contiguous; a loop: numba's slice assignment is a generic one)."""
    for j in range(src.size):
        dst[j] = src[j]


@nb.njit(cache=True, nogil=True, error_model="numpy")  # (no zero-division check: the loops vectorize)
def _sigmoid(src, dst, scale, fast, same):  # pragma: no cover - compiled
    """``dst = 2 sigma(2 src) - 1`` where ``scale`` is 2, ``sigma(src)`` where it is 1 (1-D, contiguous, ``scale``
    as long; ``same``: ``dst`` is ``src``): the gates' activations, and ``tanh`` as ``2 sigma(2 x) - 1``.
    ``fast`` (float32): :func:`_sigmoid_one` (vectorized; one loop, in place where ``same``: with ``dst`` the very
    ``src`` a two-array loop would fail the compiler's overlap check and run unvectorized). Else ``math.exp``."""
    n = src.size
    if not fast:
        for j in range(n):
            s = 1.0 / (1.0 + math.exp(-(scale[j] * src[j])))
            dst[j] = s * scale[j] - (scale[j] - 1.0)
    elif same:
        for j in range(n):
            dst[j] = _sigmoid_one(dst[j], scale[j])
    else:
        for j in range(n):
            dst[j] = _sigmoid_one(src[j], scale[j])


@intrinsic
def _f32_from_bits(typingctx, i):
    """The float32 whose bits are the int32 ``i`` (an LLVM bitcast: vectorizes)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@nb.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _sigmoid_one(x, sc):  # pragma: no cover - compiled
    """``sigma(x)`` (``sc`` 1) or ``2 sigma(2 x) - 1`` (``sc`` 2) in float32: ``exp(-v)`` as ``2^q p(r)``,
    ``q = floor(v log2(e) + 1/2)``, ``r = v - q ln 2`` (ln 2 in two parts, Cody and Waite), ``p`` the polynomial
    of Cephes' ``expf`` (relative error about 1 ulp), ``2^q`` built in the exponent bits -- no call, so a loop
    of it vectorizes (numba has no vector ``exp`` without Intel's SVML); ``v`` clamped to ``[-87, 88]``, where
    ``sigma`` is 1 or below ``1e-38`` (its float32 value to rounding); NaN stays NaN."""
    v = -(sc * x)
    v = min(max(v, np.float32(-87.0)), np.float32(88.0))
    q = np.floor(v * np.float32(1.44269504) + np.float32(0.5))
    r = v - q * np.float32(0.693359375) + q * np.float32(2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    e = (p * r * r + r + np.float32(1.0)) * _f32_from_bits((np.int32(q) + np.int32(127)) << 23)
    s = np.float32(1.0) / (np.float32(1.0) + e)
    return s * sc - (sc - np.float32(1.0)) if x == x else x


@nb.njit(cache=True, nogil=True)
def lstm_bptt(dout, dh0, dc0, act, c, tc, c0, w_hh, w_hr, proj, reverse, simd, dg, dhr):  # pragma: no cover
    """LSTM backward through time: ``dg`` ``(B, T, 4H)`` the gate pre-activation gradients, ``dhr``
    ``(B, T, H_out)`` the gradients of ``h_t = W_hr m_t`` (``proj``; else untouched). ``dout``: the
    gradient reaching the direction's outputs ``(B, T, H_out)``; ``dh0``, ``dc0``: reaching ``h_n``, ``c_n``;
    ``act``: the gate activations (:func:`lstm_cells`); ``tc = tanh(c)``; ``w_hh`` ``(4H, H_out)``, ``w_hr``
    ``(H_out, H)``. Returns ``(dh, dc)``: the gradients reaching the initial states ``h0``, ``c0``."""
    B, T, Ho = dout.shape
    H = c.shape[2]
    dh = dh0.copy()
    dc = dc0.copy()
    dm = np.empty((B, H), dout.dtype)
    v = np.empty((B, 4 * H), dout.dtype)
    for k in range(T):
        t = k if reverse else T - 1 - k
        tp = t + 1 if reverse else t - 1  # the step before t in the direction's order
        _add_rows(dh, dout, t)
        if proj:
            for b in range(B):
                dhr[b, t] = dh[b]
            product(dh, w_hr, dm, False, simd)
        else:
            dm[:] = dh
        for b in range(B):
            ar, y, dcb, a, vr = act[b, t], tc[b, t], dc[b], dm[b], v[b]
            cp = c0[b] if k == T - 1 else c[b, tp]
            i, f, gr, o = ar[:H], ar[H:2 * H], ar[2 * H:3 * H], ar[3 * H:]
            vi, vf, vg, vo = vr[:H], vr[H:2 * H], vr[2 * H:3 * H], vr[3 * H:]
            for j in range(H):  # dc += dm o (1 - tanh(c)^2)
                dcb[j] += a[j] * (o[j] - o[j] * y[j] * y[j])
            for j in range(H):  # dc g i (1 - i)
                vi[j] = dcb[j] * (gr[j] * (i[j] - i[j] * i[j]))
            for j in range(H):  # dc c_{t-1} f (1 - f)
                vf[j] = dcb[j] * (cp[j] * (f[j] - f[j] * f[j]))
            for j in range(H):  # dc i (1 - g^2)
                vg[j] = dcb[j] * (i[j] - i[j] * gr[j] * gr[j])
            for j in range(H):  # dm tanh(c) o (1 - o)
                vo[j] = a[j] * (y[j] * (o[j] - o[j] * o[j]))
            for j in range(H):  # dc_{t-1} = dc f
                dcb[j] *= f[j]
            dg[b, t] = vr
        product(v, w_hh, dh, False, simd)
    return dh, dc


@nb.njit(cache=True, nogil=True)
def lstm_bptt_tm(dout, dh0, dc0, act, c, tc, c0, w_hh, reverse, simd, dg):  # pragma: no cover - compiled
    """:func:`lstm_bptt` without projection on the time-major arrays :func:`lstm_forward` keeps: ``dout``
    ``(T, B, H)`` (any strides: the direction's columns of the output gradient, batch-first or not), ``act`` ``(T, B, 4H)``, ``c``, ``tc`` ``(T, B, H)``, ``c0``, ``dh0``, ``dc0`` ``(B, H)``; writes
    ``dg`` ``(T, B, 4H)`` (each step one ``(B, 4H)`` block, the left factor of that step's product by ``W_hh``).
    Returns ``(dh, dc)``: the gradients reaching ``h0``, ``c0``."""
    T, B, H = dout.shape
    dh = dh0.copy()
    dc = dc0.copy()
    for k in range(T):
        t = k if reverse else T - 1 - k
        for b in range(B):
            r, g = dh[b], dout[t, b]
            for j in range(H):
                r[j] += g[j]
        cp = c0 if k == T - 1 else c[t + 1 if reverse else t - 1]
        a, y, v = act[t], tc[t], dg[t]
        for b in range(B):
            for j in range(H):  # dc += dh o (1 - tanh(c)^2)
                o = a[b, 3 * H + j]
                dc[b, j] += dh[b, j] * (o - o * y[b, j] * y[b, j])
            for j in range(H):  # dc g i (1 - i)
                i = a[b, j]
                v[b, j] = dc[b, j] * (a[b, 2 * H + j] * (i - i * i))
            for j in range(H):  # dc c_{t-1} f (1 - f)
                f = a[b, H + j]
                v[b, H + j] = dc[b, j] * (cp[b, j] * (f - f * f))
            for j in range(H):  # dc i (1 - g^2)
                g = a[b, 2 * H + j]
                v[b, 2 * H + j] = dc[b, j] * (a[b, j] - a[b, j] * g * g)
            for j in range(H):  # dh tanh(c) o (1 - o)
                o = a[b, 3 * H + j]
                v[b, 3 * H + j] = dh[b, j] * (y[b, j] * (o - o * o))
            for j in range(H):  # dc_{t-1} = dc f
                dc[b, j] *= a[b, H + j]
        product(v, w_hh, dh, False, simd)
    return dh, dc


@nb.njit(cache=True, nogil=True)
def gru_bptt(dout, dh0, rz, n, ghn, h_in, w_hh, reverse, simd, dgi, dgh):  # pragma: no cover - compiled
    """GRU backward through time: ``dgi`` ``(B, T, 3H)`` the gradients of ``W_ih x_t + b_ih``, ``dgh`` those
    of ``W_hh h_{t-1} + b_hh`` (its ``n`` block times ``r``). ``rz`` ``(B, T, 2H)``: ``r, z``; ``n``; ``ghn``: the
    ``n`` block of ``W_hh h_{t-1} + b_hh``; ``h_in``: the state each step read; ``w_hh`` ``(3H, H)``. Returns the
    gradient reaching the initial state ``h0``."""
    B, T, H = dout.shape
    one = np.ones(1, dout.dtype)[0]  # (a literal 1 would make float32 arithmetic float64)
    dh = dh0.copy()
    dz = np.empty((B, H), dout.dtype)
    w = np.empty((B, 3 * H), dout.dtype)
    for k in range(T):
        t = k if reverse else T - 1 - k
        _add_rows(dh, dout, t)
        for b in range(B):
            a, rzr, nr, gh, hr, vr, wr, dzb = dh[b], rz[b, t], n[b, t], ghn[b, t], h_in[b, t], dgi[b, t], w[b], dz[b]
            r, z = rzr[:H], rzr[H:]
            vrr, vz, vn, wn = vr[:H], vr[H:2 * H], vr[2 * H:], wr[2 * H:]
            for j in range(H):  # dn = dh (1 - z)(1 - n^2)
                vn[j] = a[j] * ((one - z[j]) * (one - nr[j] * nr[j]))
            for j in range(H):  # dn v_n r (1 - r)
                vrr[j] = vn[j] * (gh[j] * (r[j] - r[j] * r[j]))
            for j in range(H):  # dh (h_{t-1} - n) z (1 - z)
                vz[j] = a[j] * ((hr[j] - nr[j]) * (z[j] - z[j] * z[j]))
            for j in range(H):
                dzb[j] = a[j] * z[j]
            wr[:2 * H] = vr[:2 * H]
            for j in range(H):  # dv's n block: dn r
                wn[j] = vn[j] * r[j]
            dgh[b, t] = wr
        product(w, w_hh, dh, False, simd)
        dh += dz
    return dh


@nb.njit(cache=True, nogil=True)
def rnn_bptt(dout, dh0, y, relu, w_hh, reverse, simd, dg):  # pragma: no cover - compiled
    """Elman RNN backward through time: ``dg`` ``(B, T, H)`` the pre-activation gradients, from the
    outputs ``y`` (``tanh' = 1 - y^2``; ``relu' = [y > 0]``); ``w_hh`` ``(H, H)``. Returns the gradient reaching
    the initial state ``h0``."""
    B, T, H = dout.shape
    dh = dh0.copy()
    v = np.empty((B, H), dout.dtype)
    for k in range(T):
        t = k if reverse else T - 1 - k
        _add_rows(dh, dout, t)
        for b in range(B):
            a, yr, vr = dh[b], y[b, t], v[b]
            if relu:
                for j in range(H):
                    vr[j] = a[j] if yr[j] > 0 else a[j] * 0
            else:
                for j in range(H):
                    vr[j] = a[j] - a[j] * yr[j] * yr[j]
            dg[b, t] = vr
        product(v, w_hh, dh, False, simd)
    return dh


@nb.njit(cache=True, nogil=True)
def _add_rows(dh, dout, t):  # pragma: no cover - compiled
    """``dh += dout[:, t]``."""
    for b in range(dh.shape[0]):
        a, d = dh[b], dout[b, t]
        for j in range(dh.shape[1]):
            a[j] += d[j]


@nb.njit(cache=True, nogil=True, fastmath={"reassoc"})
def kept_products(G, X, Hs, bias, time_major, g_t, simd, P, out):  # pragma: no cover - compiled
    """The per-example gradients of a recurrent layer's ``W_ih``, ``W_hh`` and biases and their norms, one
    example at a time (its products and norms while they are in cache): ``P[b] = A_b^T G_b`` ``(C, R)``
    with ``A_b = [x_t, h_t, 1]`` ``(T, C)`` (``X``, ``Hs``: the inputs and the states each step read; the
    column of ones only with ``bias``), ``G`` the gate gradients, all ``(B, T, .)`` or ``(T, B, .)``
    (``time_major``); one product per example (``simd``: the vector kernel, else BLAS on one thread). ``out[b, k]`` for
    each segment ``k`` of ``A``'s columns (``x``, ``h``, the ones): ``(||P[b, seg]|| + g_t s)^2`` with
    ``s = sum_t ||g_t|| ||a_{t, seg}||`` -- the computed product errs by at most ``g_t = gamma_T`` times
    ``|A_b|^T |G_b|`` entrywise, whose norm is at most ``s`` -- every square and sum in float64 (the squares
    of float32 numbers are exact there). Sums of squares are sums of non-negative terms, so their float64
    error bound (relative ``gamma_n``) holds in any order of summation (reassociation allowed, so the loops
    vectorize); the caller adds it."""
    if time_major:
        T, B, R = G.shape
    else:
        B, T, R = G.shape
    I, H = X.shape[2], Hs.shape[2]
    C = I + H + (1 if bias else 0)
    ab = np.empty((T, C), P.dtype)
    gb = np.empty((T, R), P.dtype)
    gn = np.empty(T)
    for b in range(B):
        for t in range(T):
            x, h, g, a = (X[t, b], Hs[t, b], G[t, b], ab[t]) if time_major else (X[b, t], Hs[b, t], G[b, t], ab[t])
            for j in range(I):
                a[j] = x[j]
            for j in range(H):
                a[I + j] = h[j]
            if bias:
                a[C - 1] = 1
            r = gb[t]
            for j in range(R):  # (a loop: numba's slice assignment is a generic one)
                r[j] = g[j]
        product(ab.T, gb, P[b], False, simd)
        for t in range(T):
            gn[t] = np.sqrt(_sum_sq(gb[t]))
        for k in range(3 if bias else 2):
            lo, hi = (0, I) if k == 0 else ((I, I + H) if k == 1 else (C - 1, C))
            s = 0.0
            for t in range(T):
                s += gn[t] * np.sqrt(_sum_sq(ab[t, lo:hi]))
            n = np.sqrt(_sum_sq(P[b, lo:hi].reshape(-1))) + g_t * s
            out[b, k] = n * n


@nb.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _sum_sq(v):  # pragma: no cover - compiled
    """``sum_j v_j^2`` in float64 of a contiguous 1-D array (a loop on its own vectorizes)."""
    acc = 0.0
    for j in range(v.size):
        x = np.float64(v[j])
        acc += x * x
    return acc
