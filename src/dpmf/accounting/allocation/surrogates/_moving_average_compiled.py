"""Compiled (numba) step of the moving-average program of
:mod:`dpmf.accounting.allocation.surrogates.moving_average` (private).

The table ``V`` holds, for every state (the ``w`` innovations the earlier slots still load on, each on
the discrete law's nodes, flattened with the oldest as the most significant digit) and every
partial-sum node, an upper bound on the value function. One step maps ``V_{s+1}`` to the
unnormalized ``sum_l p_l V_{s+1}(next state, u + x)`` at every node: the next state is the current
one shifted by the new innovation's node (exact: no interpolation across states), and ``u + x`` is
read by linear interpolation on the uniform partial-sum grid, one shift per (state, new node), so the
inner loop is a two-point stencil. Every term is a non-negative combination, so the caller's
relative factor covers the rounding.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from dpmf.numerics import UNIT_ROUNDOFF



@nb.njit(cache=True, nogil=True, inline="always")
def _base(idx, xs, a, c, m, w):  # pragma: no cover - compiled
    """``sum_j a_j x_{d_j} - c`` over the state's ``w`` digits (``d_0`` the oldest) and the sum of its
    terms' absolute values (the rounding of the summand's exponent, ``w + 2`` terms, is within ``8 u``
    of that plus the new innovation's term)."""
    base, size, pw = -c, abs(c), 1
    for j in range(w - 1, -1, -1):
        d = (idx // pw) % m
        pw *= m
        base += a[j] * xs[d]
        size += abs(a[j] * xs[d])
    return base, size


@nb.njit(cache=True, nogil=True, inline="always")
def _shift(x, h, nu, up):  # pragma: no cover - compiled
    """The summand ``x`` in partial-sum steps, split into whole steps and a fraction, rounded up
    (call) or down (put) past the rounding of every position ``n + x / h``."""
    if up:
        q = x / h * (1 + 4 * UNIT_ROUNDOFF) + 4 * UNIT_ROUNDOFF * (nu + 1.0)
    else:
        q = max(x / h * (1 - 4 * UNIT_ROUNDOFF) - 4 * UNIT_ROUNDOFF * (nu + 1.0), 0.0)
    if q >= nu:
        return nu, 0.0
    fq = int(q)
    return fq, q - fq


@nb.njit(cache=True, nogil=True)
def partial_sums(nu, h):  # pragma: no cover - compiled
    """The partial sums ``u_n = (n - (nu - 1)) h`` of the nodes and their absolute values, each the
    same float operations as at its use: the closed forms read them from arrays, and so vectorize."""
    uu, au = np.empty(nu), np.empty(nu)
    for n in range(nu):
        uu[n] = (n - (nu - 1)) * h
        au[n] = abs(uu[n])
    return uu, au


@nb.njit(cache=True, nogil=True, inline="always")
def _sort_by_start(st, A, P, k):  # pragma: no cover - compiled
    """Sort the first ``k`` entries of ``st`` (with ``A``, ``P``) ascending (insertion: ``k <= m``, and
    they arrive nearly sorted, descending)."""
    for i in range(1, k):
        s0, a0, p0 = st[i], A[i], P[i]
        j = i - 1
        while j >= 0 and st[j] > s0:
            st[j + 1], A[j + 1], P[j + 1] = st[j], A[j], P[j]
            j -= 1
        st[j + 1], A[j + 1], P[j + 1] = s0, a0, p0


@nb.njit(cache=True, nogil=True)
def call_step(V, Rn, Rs, xs, ps, a, c, h, m, w, factor, out, first, stride):  # pragma: no cover - compiled
    """Call: ``min(factor * sum_l p_l V_{s+1}(state', u + x) + 1e-290, R_s(state))`` with positions
    rounded up and the closed form ``u' + R_{s+1}(state')`` at ``u' >= 0`` (``u'`` clamped at 0 from
    below: ``V`` is non-decreasing with ``V(0) <= R``), into the rows of ``out`` of the states whose
    newer ``w - 1`` digits ``r`` are ``first, first + stride, ...`` (the caller runs ``stride`` such
    calls on threads: :func:`dpmf.resources.on_threads`; every row is the same whatever the split).

    The closed form past its first node is linear in the node: node ``l``'s term at ``n > lim_l`` is
    ``p_l (u_n + x_l + R_l + 4u (|u_n| + x_l + R_l))`` (``u_n + x_l > 0`` there: the shift ``fq`` is
    at most ``x_l / h`` plus ``~5 nu u``), so the terms of the nodes whose closed form has begun are
    summed as ``S_A + u_n (1 - 4u) S_P`` with ``S_A = sum p_l (x_l + R_l)(1 + 4u)`` and ``S_P = sum p_l``
    over those nodes -- one pass per run of nodes between starts instead of one per node (about half
    of the terms were closed forms). The cancellation of the two sums (``m`` positive terms each, a
    product, a difference) is within ``(m + 8) u (S_A + |u_n| S_P)``, charged at ``4 (m + 8) u`` times
    that: every node value is at least the per-node sum's (a few ``u`` relative more)."""
    ns, nu = V.shape
    low = m ** (w - 1)
    uus, aus = partial_sums(nu, h)
    acc = np.empty(nu)
    st = np.empty(m, dtype=np.int64)
    sa, sp = np.empty(m), np.empty(m)
    lin = 1 - 4 * UNIT_ROUNDOFF
    charge = 4 * (m + 8) * UNIT_ROUNDOFF
    # e^{a_w x_l} per new node, its exponent rounded up (8 u |.|); the summand is e^{base} times it
    grow = np.empty(m)
    for l in range(m):
        grow[l] = math.exp(a[w] * xs[l] + 8 * UNIT_ROUNDOFF * abs(a[w] * xs[l]))
    for r in range(first, low, stride):  # (the m states that differ in their oldest digit read the same m rows)
        for i in range(m):
            idx = i * low + r
            base, size = _base(idx, xs, a, c, m, w)
            # (one exp per state: e^{base + 8u size} (1 + 4u) e^{a_w x_l} rounded up -- two exps and a
            # product, each within u of exact, covered by 8u -- is the summand e^{base + a_w x_l} rounded up)
            ebase = math.exp(base + 8 * UNIT_ROUNDOFF * size) * (1 + 4 * UNIT_ROUNDOFF)
            acc[:] = 0.0
            k = 0
            for l in range(m):
                if ps[l] == 0.0:  # (no mass: no term, and no 0 * inf)
                    continue
                x = ebase * grow[l] * (1 + 8 * UNIT_ROUNDOFF)
                fq, f = _shift(x, h, nu, True)
                pl, vn, rn = ps[l], V[r * m + l, fq:], Rn[r * m + l]
                lim = max(nu - 1 - fq, 0)
                g0, g1 = pl * (1.0 - f), pl * f
                for n in range(lim):  # (on the row from the shift on: the loop vectorizes; same sums)
                    acc[n] += g0 * vn[n] + g1 * vn[n + 1]
                # the closed form's first node (u' may round to just below 0: clamped), then the rest as a run
                v = uus[lim] + x
                if v < 0.0:
                    v = 0.0
                acc[lim] += pl * (v + rn + 4 * UNIT_ROUNDOFF * (aus[lim] + x + rn))
                if lim + 1 < nu:
                    st[k], sa[k], sp[k] = lim + 1, pl * (x + rn) * (1 + 4 * UNIT_ROUNDOFF), pl
                    k += 1
            _sort_by_start(st, sa, sp, k)
            s_a, s_p = 0.0, 0.0
            for j in range(k):
                s_a += sa[j]
                s_p += sp[j]
                end = st[j + 1] if j + 1 < k else nu
                for n in range(st[j], end):  # (vectorizes)
                    acc[n] += (s_a + uus[n] * lin * s_p) + charge * (s_a + aus[n] * s_p)
            cap = Rs[idx]
            for n in range(nu):
                out[idx, n] = min(acc[n] * factor + 1e-290, cap)
    return out


@nb.njit(cache=True, nogil=True)
def put_step(V, xs, ps, a, c, h, m, w, factor, out, first, stride):  # pragma: no cover - compiled
    """Put: ``min(factor * sum_l p_l W_{s+1}(state', u + x) + 1e-290, -u)`` with summands and
    positions rounded down; ``W = 0`` at ``u' >= 0`` (node ``nu - 1``, ``u = 0``, holds 0); the rows of
    the states ``first, first + stride, ...`` (as :func:`call_step`)."""
    ns, nu = V.shape
    low = m ** (w - 1)
    acc = np.empty(nu)
    for r in range(first, low, stride):
        for i in range(m):
            idx = i * low + r
            base, size = _base(idx, xs, a, c, m, w)
            acc[:] = 0.0
            for l in range(m):
                if ps[l] == 0.0:
                    continue
                e = base + a[w] * xs[l]
                x = math.exp(e - 8 * UNIT_ROUNDOFF * (size + abs(a[w] * xs[l]))) * (1 - 4 * UNIT_ROUNDOFF)
                fq, f = _shift(x, h, nu, False)
                pl, vn = ps[l], V[r * m + l, fq:]
                g0, g1 = pl * (1.0 - f), pl * f
                for n in range(nu - 1 - fq):
                    acc[n] += g0 * vn[n] + g1 * vn[n + 1]
            for n in range(nu):
                out[idx, n] = min(acc[n] * factor + 1e-290, (nu - 1 - n) * h * (1 + 2 * UNIT_ROUNDOFF))
    return out
