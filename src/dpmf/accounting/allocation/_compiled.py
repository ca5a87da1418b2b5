"""Compiled (numba) step of the Rényi program of :mod:`dpmf.accounting.allocation.renyi` (private).

Why compiled: one step of the count-form dynamic program maps every transition ``i`` (a source
state and a count ``t``) to

    v_i = f[src_i] + (G_kk t_i (t_i - 1) / 2 + t_i <window_i, G[k, k-w:k]>) / sigma^2 - log t_i!

and every target state to the log-sum-exp of its segment of ``v``. In numpy that is a matrix-vector
product, ~8 array passes and two ``reduceat`` calls with their temporaries; the profile of an
allocation calibration (BandMF, 32 steps, 4 bands) spent ~80% of its time there. Here it is one
loop over segments that recomputes ``v`` in a max pass and a sum pass and allocates nothing.

Same formula, same order of terms up to the ``w <= 5`` products of the window dot product, so the
result equals the numpy path to a few ulps; the caller's slack (``(b + 16) 4 ulp`` relative, in
``renyi._remove_rdp``) covers the rounding of either. A NaN propagates to the output (the caller
turns a NaN bound into ``inf``).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np


@nb.njit(cache=True, nogil=True)
def step_lse(f, src, t, t_pairs, log_t_fact, window, g_row, g_kk, inv_s2, starts, counts):  # pragma: no cover - compiled
    out = np.empty(starts.size)
    w = window.shape[1]
    for s in range(starts.size):
        a = starts[s]
        e = a + counts[s]
        mx = -math.inf
        for i in range(a, e):
            inter = 0.0
            for q in range(w):
                inter += window[i, q] * g_row[q]
            v = f[src[i]] + (g_kk * t_pairs[i] + t[i] * inter) * inv_s2 - log_t_fact[i]
            if v > mx or v != v:
                mx = v
                if v != v:
                    break
        if mx != mx or mx == -math.inf:
            out[s] = mx
            continue
        acc = 0.0
        for i in range(a, e):
            inter = 0.0
            for q in range(w):
                inter += window[i, q] * g_row[q]
            acc += math.exp(f[src[i]] + (g_kk * t_pairs[i] + t[i] * inter) * inv_s2 - log_t_fact[i] - mx)
        out[s] = mx + math.log(acc)
    return out
