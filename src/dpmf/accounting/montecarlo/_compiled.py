"""Compiled (numba) stages of the Monte Carlo privacy-loss samplers (private).

Why compiled: the vectorized numpy path (``_loss_kernels.py``) draws its normals at ~16 ns each
(``Generator.standard_normal``) and makes ~10 array passes per step of the dynamic program; those
two dominate its profile (n = 1024, 32 bands: ~40 us per sample). Here

1. :func:`minsep_outputs` draws the outputs ``y`` one sample at a time (ziggurat normals at
   ~3.5 ns, ``_xoshiro.py``) and adds the participations' columns (the renewal chain of
   Alg. 1/2 of Dong & Ganesh 2026);
2. ``d = C^T y`` stays a blocked BLAS product (``Bands.dots_sm``, near the machine's peak);
3. :func:`minsep_dp` runs the backward recursion of Thm 5.1 Eq. (1) (0-based) for all samples at
   once, SIMD over samples::

       f_i = (1 - p) f_{i+1} + p e^{llr_i} f_{i+b},   f_i = 1 for i >= n,
       llr_i = (d_i - ||c_i||^2 / 2) / sigma^2,

   ``ln P/Q = ln f_0`` (cold start) or ``ln((f_0 + p sum_{i=1}^{b-1} f_i) / (1 + (b-1) p))``
   (warm start), with the rescaling rule and log-space fallback of ``backward_dp``.

Same recursion and rules as the numpy path, so both give the same loss for the same ``y`` up to
rounding (tests check it); only the random streams differ (xoshiro256++ seeded by the caller's
generator). The mode mixtures (p = 1, balls-in-bins) only need ``_xoshiro.fill_normal`` /
``fill_indices``.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from dpmf.accounting.montecarlo._xoshiro import geometric, normal, uniform

__all__ = ["minsep_outputs", "minsep_exponents", "exponents", "minsep_dp"]

_GROUP = 8  # samples whose exponents are written together (one 64-byte row piece of X)
_FLOOR = -700.0  # exponents are floored here before exp (no subnormals; e^-700 ~ 1e-304)


@nb.njit(cache=True)
def _dp_log_column(X, s, log_q, b, warm, log_p):
    """The recursion in log space for sample (column) ``s`` of exponents ``X`` (the fallback)."""
    n = X.shape[0]
    F = np.zeros(n + b)  # ln f_i = 0 for i >= n
    for i in range(n - 1, -1, -1):
        t2 = X[i, s] + F[i + b]
        if log_q > -math.inf:
            t1 = F[i + 1] + log_q
            m = max(t1, t2)
            F[i] = m + math.log1p(math.exp(-abs(t1 - t2)))
        else:
            F[i] = t2
    if not warm:
        return F[0]
    top = F[0]
    for j in range(1, b):
        top = max(top, F[j] + log_p)
    acc = math.exp(F[0] - top)
    for j in range(1, b):
        acc += math.exp(F[j] + log_p - top)
    return top + math.log(acc) - math.log1p((b - 1) * math.exp(log_p))


@nb.njit(cache=True, nogil=True, fastmath={"contract"})
def minsep_dp(X, E, p, b, warm, F, out):
    """``out[s] = ln P/Q`` from time-major exponents ``X[i, s] = a d_i - h_i`` (floored at -700)
    and ``E = exp(X)``; ``F`` is scratch of shape ``(n + b, S)``.

    The recursion runs for all samples at once (the inner loops are over samples: SIMD), in
    rescaled linear space: ``F[i] = f_i`` (``f_i = 1`` for ``i >= n``), and after every block of
    ``b`` steps each sample's live window ``F[lo : lo + b]`` is divided by its maximum (the scale
    kept in log space). Within a block each ``f_i`` is a sum of non-negative terms with at most one
    new factor ``E_i``; a sample whose block maximum leaves ``[1e-80, 1e290]`` or whose window
    spans more than 200 orders of magnitude is recomputed in log space (:func:`_dp_log_column`) --
    the rule of ``_loss_kernels.backward_dp``.
    """
    n, S = X.shape
    q = 1.0 - p
    log_q = math.log1p(-p) if p < 1.0 else -math.inf
    log_p = math.log(p)
    for j in range(n, n + b):
        for s in range(S):
            F[j, s] = 1.0
    off = np.zeros(S)
    bad = np.zeros(S, dtype=np.bool_)
    top = np.empty(S)
    low = np.empty(S)
    i = n - 1
    while i >= 0:
        lo = max(i - b + 1, 0)
        for j in range(i, lo - 1, -1):
            for s in range(S):
                F[j, s] = q * F[j + 1, s] + E[j, s] * F[j + b, s]
        for s in range(S):
            top[s] = F[lo, s]
            low[s] = F[lo, s]
        for j in range(lo + 1, lo + b):
            for s in range(S):
                v = F[j, s]
                top[s] = max(top[s], v)
                low[s] = min(low[s], v)
        for s in range(S):
            t = top[s]
            ok = t <= 1e290 and t >= 1e-80 and low[s] >= t * 1e-200
            if not ok:
                bad[s] = True
                t = 1.0
            top[s] = 1.0 / t
            off[s] += math.log(t)
        for j in range(lo, lo + b):
            for s in range(S):
                F[j, s] *= top[s]
        i = lo - 1
    for s in range(S):
        if bad[s]:
            out[s] = _dp_log_column(X, s, log_q, b, warm, log_p)
        elif not warm:
            out[s] = off[s] + math.log(F[0, s])
        else:
            rest = 0.0
            for j in range(1, b):
                rest += F[j, s]
            out[s] = off[s] + math.log(F[0, s] + p * rest) - math.log1p((b - 1) * p)


@nb.njit(cache=True, nogil=True, fastmath={"contract"})
def exponents(D, a, h):
    """In place: ``D[i, s] = max(a D[i, s] - h[i], -700)`` (time-major ``D = C^T y``): the
    exponents ``ln p + llr_i`` of the recursion, floored as in ``backward_dp``."""
    n, S = D.shape
    for i in range(n):
        hi = h[i]
        for s in range(S):
            v = a * D[i, s] - hi
            D[i, s] = v if v > _FLOOR else _FLOOR


@nb.njit(inline="always")
def _draw_output(y, colsT, coefs, toeplitz, w, sigma, p, log_q, b, warm, warm_norm, remove, s0, s1, s2, s3):
    """One output ``y`` (length ``n``) in place: ``n`` normals, then (``remove``) the participations'
    columns; returns the new state. The one definition of the stream, shared by the kernels."""
    n = y.size
    for j in range(n):
        z, s0, s1, s2, s3 = normal(s0, s1, s2, s3)
        y[j] = sigma * z
    if not remove:
        return s0, s1, s2, s3
    t = 0
    if warm and b > 1:
        u, s0, s1, s2, s3 = uniform(s0, s1, s2, s3)
        v = u * warm_norm
        if v >= 1.0:
            t = 1 + min(b - 2, nb.int64((v - 1.0) / p))
    while True:
        if p < 1.0:
            g, s0, s1, s2, s3 = geometric(log_q, s0, s1, s2, s3)
            if g > n:
                break
            t += g - 1
        if t >= n:
            break
        for k in range(min(w, n - t)):
            y[t + k] += coefs[k] if toeplitz else colsT[k, t]
        t += b
    return s0, s1, s2, s3


@nb.njit(cache=True, nogil=True)
def minsep_outputs(colsT, coefs, toeplitz, sigma, p, b, warm, remove, state, Y):
    """Draw outputs ``y`` into the rows of ``Y`` (sample-major ``(S, n)``): ``y = sigma z`` under Q,
    ``C x + sigma z`` under P (``remove``); ``state`` (four uint64, xoshiro256++) advances in place.

    Participations ``x`` (P): the start state is 0 (cold) or drawn from the stationary law
    ``(1, p, ..., p) / (1 + (b - 1) p)`` (warm); then the renewal chain of Alg. 1/2: the next
    participation is ``Geometric(p) - 1`` steps after the example becomes available, and it is
    barred for the ``b - 1`` steps after each participation. ``C[i + k, i]`` is ``coefs[k]``
    (``toeplitz``) or ``colsT[k, i]``.
    """
    S, n = Y.shape
    w = coefs.size if toeplitz else colsT.shape[0]
    log_q = math.log1p(-p) if p < 1.0 else -math.inf
    warm_norm = 1.0 + (b - 1) * p
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    for s in range(S):
        s0, s1, s2, s3 = _draw_output(Y[s], colsT, coefs, toeplitz, w, sigma, p, log_q, b, warm, warm_norm, remove,
                                      s0, s1, s2, s3)
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3


@nb.njit(cache=True, nogil=True, fastmath={"contract"})
def minsep_exponents(colsT, coefs, toeplitz, sigma, p, b, warm, remove, state, a, h, X):
    """The fused first stage: for each sample ``s`` (column of the time-major ``X``, shape
    ``(n, S)``) draw ``y`` exactly as :func:`minsep_outputs` does (same stream, same values), form
    ``d = C^T y`` (``d_i = sum_k C[i + k, i] y_{i+k}``, ``w`` multiply-adds per step, vectorized
    over ``i``) and store the floored exponents ``max(a d_i - h_i, -700)`` (:func:`exponents`).

    Replaces outputs + blocked BLAS ``C^T y`` + exponents (three passes over ``n x S`` and a
    product that multiplies the band's zero triangles) by one pass in L1: the sums run in another
    order than BLAS's, so ``d`` agrees with it to rounding (tests: 1e-12 relative), not bit for bit.
    """
    n, S = X.shape
    w = coefs.size if toeplitz else colsT.shape[0]
    log_q = math.log1p(-p) if p < 1.0 else -math.inf
    warm_norm = 1.0 + (b - 1) * p
    y = np.empty(n)
    D = np.empty((_GROUP, n))  # d of _GROUP samples, written to X as contiguous rows of _GROUP
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    for g0 in range(0, S, _GROUP):
        G = min(_GROUP, S - g0)
        for g in range(G):
            s0, s1, s2, s3 = _draw_output(y, colsT, coefs, toeplitz, w, sigma, p, log_q, b, warm, warm_norm,
                                          remove, s0, s1, s2, s3)
            d = D[g]
            if toeplitz:
                c0 = coefs[0]
                for i in range(n):
                    d[i] = c0 * y[i]
                for k in range(1, w):
                    ck = coefs[k]
                    for i in range(n - k):
                        d[i] += ck * y[i + k]
            else:
                for i in range(n):
                    d[i] = colsT[0, i] * y[i]
                for k in range(1, w):
                    for i in range(n - k):
                        d[i] += colsT[k, i] * y[i + k]
        for i in range(n):
            hi = h[i]
            row = X[i]
            for g in range(G):
                v = a * D[g, i] - hi
                row[g0 + g] = v if v > _FLOOR else _FLOOR
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3
