"""Compiled (numba) kernels of the allocation accountants (private): the Rényi program's step
(:mod:`dpmf.accounting.allocation.renyi`) and the two-point PMF rows of the identity's
conditional bound (:func:`two_point_rows`, :mod:`dpmf.accounting.allocation.identity`).

Why compiled: one step of the count-form dynamic program maps every transition ``i`` (a source
state ``src_i`` and the count ``t_i`` added at position ``k``) to

    v_i = f[src_i] + (G_kk t_i (t_i - 1) / 2 + t_i <window(src_i), G[k, k-w:k]>) / sigma^2 - log t_i!

and every target state to the log-sum-exp of its segment of ``v``. The window product depends on
the source state only and the rest on ``t`` only: the kernel forms
``h[s] = <window(s), G[k, k-w:k]> / sigma^2`` once per source state, the caller passes
``tab[t] = G_kk t (t - 1) / (2 sigma^2) - log t!`` per count, and per transition
``v_i = (f[src_i] + t_i h[src_i]) + tab[t_i]``: two gathers and two int32 reads (the profile of an
allocation calibration -- BandMF, 32 steps, 4 bands -- spent most of its time here, bound by memory
traffic: the former layout read ~56 bytes per transition, twice). The log-sum-exp is one pass
(``acc`` rescaled when the maximum grows); nothing is allocated per segment.

Rounding (covered by the caller's allowance ``(b + 16) 4 ulp (|log S_a| + log a! + a log b)``, in
``renyi._remove_rdp``, as the former two-pass loop was): per transition ``2w + 6`` roundings of
non-negative interaction terms, of ``log t!`` and of the running sum (``2w + 4`` before), at most 16
for ``w <= 5``, against the 16 extra positions of the allowance; per segment of ``n`` terms at most
``3n + 2`` (``n`` additions, ``n - 1`` rescales of two roundings each, the exponentials and the log;
``2n + 2`` before), and only segments of ``n <= a + 1`` terms reach order ``a``: at most
``3a + 5`` unit roundoffs ``u = ulp / 2`` per position, against the allowance's
``8u a log b >= 5.5 a u`` per position (``b >= 2``). A NaN propagates to the output (the caller
turns a NaN bound into ``inf``).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np


@nb.njit(cache=True, nogil=True)
def step_lse(f, src_window, g_row, inv_s2, src, t, tab, starts, counts):  # pragma: no cover - compiled
    """``out[s] = log sum_{i in segment s} exp((f[src_i] + t_i h[src_i]) + tab[t_i])`` with
    ``h = (src_window @ g_row) inv_s2`` (module docstring)."""
    h = np.empty(src_window.shape[0])
    for j in range(src_window.shape[0]):
        inter = 0.0
        for q in range(src_window.shape[1]):
            inter += src_window[j, q] * g_row[q]
        h[j] = inter * inv_s2
    out = np.empty(starts.size)
    for s in range(starts.size):
        a = starts[s]
        n = counts[s]
        j = src[a]
        ti = t[a]
        mx = f[j] + ti * h[j] + tab[ti]
        acc = 1.0  # sum of exp(v - mx) so far (one pass: rescaled when the maximum grows)
        for i in range(a + 1, a + n):
            j = src[i]
            ti = t[i]
            v = f[j] + ti * h[j] + tab[ti]
            if v <= mx:
                acc += math.exp(v - mx)
            elif v > mx:
                acc = acc * math.exp(mx - v) + 1.0
                mx = v
            else:  # NaN (in v or in mx)
                mx = math.nan
                break
        if n == 1 or mx != mx or mx == -math.inf:
            out[s] = mx
        else:
            out[s] = mx + math.log(acc)
    return out


@nb.njit(cache=True, nogil=True)
def _ndtr_neg_abs(x):  # pragma: no cover - compiled
    """``Phi(-|x|)``, the smaller tail (``ndtr(-|x|)`` of scipy, via ``erfc``)."""
    return 0.5 * math.erfc(abs(x) * 0.7071067811865476)


@nb.njit(cache=True, nogil=True)
def _interval_mass(lo, hi, t_lo, t_hi):  # pragma: no cover - compiled
    if hi < 0:
        m = t_hi - t_lo
    elif lo >= 0:
        m = t_lo - t_hi
    else:
        m = 1.0 - t_lo - t_hi
    return m if m > 0 else 0.0


@nb.njit(cache=True, nogil=True)
def _upper_share(exp_eps, p, q, factor, slack):  # pragma: no cover - compiled
    qt = exp_eps * q  # e^eps Q-mass (inf when e^eps overflows: then the share is 0, as in numpy)
    if qt == 0.0:
        return p
    up = (p - qt) * factor + slack * p
    if up != up or up == math.inf:
        up = 0.0
    return min(max(up, 0.0), p)


@nb.njit(cache=True, nogil=True)
def two_point_rows(lam, first, n, s, disc, sign, slack, out, u_first, u_last):  # pragma: no cover - compiled
    """Interval masses and connect-the-dots splits of two-point mixture PMFs, row by row.

    Row ``r``: the mixture ``(1 - lam) N(0, 1) + lam N(s, 1)`` against ``N(0, 1)`` on the loss
    grid ``(first + k) disc``, ``k < n``; ``sign = +1``: remove (P = mixture, remove-loss levels
    ``(first + k) disc``), ``-1``: add (P = N(0, 1), remove-loss levels ``-(first + k) disc``). For
    each grid interval the P- and Q-masses (from the smaller normal tails) are split between its end
    points as :func:`dpmf.privacy.mixture._connect_the_dots` does; ``out[r, :n]`` receives them
    (the caller adds the masses outside the grid). The inverse loss is closed form. Same arithmetic
    as the numpy expressions in ``allocation/identity.py``, up to the order of a few additions.
    """
    factor = math.exp(disc) / math.expm1(disc)
    c = 0.5 * s * s
    for r in range(lam.size):
        lm = lam[r]
        ll = math.log(lm)
        u_prev = 0.0
        t0_prev = 0.0
        t1_prev = 0.0
        exp_prev = 0.0
        for k in range(n[r]):
            eps_k = (first[r] + k) * disc
            level = sign * eps_k
            u = (math.log(math.expm1(level) + lm) - ll + c) / s
            t0 = _ndtr_neg_abs(u)
            t1 = _ndtr_neg_abs(u - s)
            if k == 0:
                u_first[r] = u
            else:
                if sign > 0:
                    g = _interval_mass(u_prev, u, t0_prev, t0)
                    g1 = _interval_mass(u_prev - s, u - s, t1_prev, t1)
                else:
                    g = _interval_mass(u, u_prev, t0, t0_prev)
                    g1 = _interval_mass(u - s, u_prev - s, t1, t1_prev)
                m = (1.0 - lm) * g + lm * g1
                if sign > 0:
                    up = _upper_share(exp_prev, m, g, factor, slack)
                    out[r, k - 1] += m - up
                else:
                    up = _upper_share(exp_prev, g, m, factor, slack)
                    out[r, k - 1] += g - up
                out[r, k] += up
            exp_prev = math.exp(eps_k)
            u_prev = u
            t0_prev = t0
            t1_prev = t1
        u_last[r] = u_prev
