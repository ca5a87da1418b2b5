"""Compiled (numba) step of the Markov-surrogate dynamic program of
:mod:`dpmf.accounting.allocation.surrogates.markov_fit` (private).

One step maps the table ``V_{i+1}`` (chain nodes x partial-sum nodes) to the unnormalized
``sum_k w_k V_{i+1}(z', u + x)`` at every node: for each chain node and innovation point, the next
chain state ``z'`` and the summand ``x`` are computed (both rounded up), ``V_{i+1}`` is read by
bilinear interpolation at the rounded-up position (closed form ``w + R(z')`` beyond ``u = 0``, the
bound ``w_+ + R(z')`` above the chain grid, the first row below it). Every term is a non-negative
combination, so the caller's relative factor covers the rounding (module docstring of
:mod:`~dpmf.accounting.allocation.surrogates.markov_fit`). In numpy the same pass needs ~10 temporaries of
``n_z m n_u`` floats per step.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from dpmf.numerics import UNIT_ROUNDOFF



@nb.njit(cache=True, nogil=True, inline="always")
def _corner_weights(wk, ph, th):  # pragma: no cover - compiled
    """The four-point stencil's weights: ``wk`` split bilinearly by the partial-sum fraction ``ph``
    and the chain-node fraction ``th`` (corners (0,0), (1,0), (0,1), (1,1) in (node, sum))."""
    th1 = 1.0 - th
    return wk * (1.0 - ph) * th1, wk * (1.0 - ph) * th, wk * ph * th1, wk * ph * th


@nb.njit(cache=True, nogil=True, inline="always")
def _stencil(o, v0, v1, lim, c00, c10, c01, c11):  # pragma: no cover - compiled
    """``o[l] += c00 v0[l] + c10 v1[l] + c01 v0[l + 1] + c11 v1[l + 1]`` for ``l < lim`` (rows ``a`` and
    ``a + 1`` from the shift on): on 1-d row views the loop vectorizes (the 2-d indexing did not: ~7x
    slower), and every element is the same sum in the same order as before (bit-identical)."""
    for l in range(lim):
        o[l] += c00 * v0[l] + c10 * v1[l] + c01 * v0[l + 1] + c11 * v1[l + 1]


@nb.njit(cache=True, nogil=True)
def step(V, Rn, xs, ws, alpha, beta, c, rho, s, z_lo, dz, h, sl_hi, offs, initial):  # pragma: no cover - compiled
    nz, nu = V.shape
    nout = 1 if initial else nz
    out = np.zeros((nout, nu))
    z_hi = z_lo + (nz - 1) * dz
    # the closed forms read the node positions from arrays (the same float operations as at their use),
    # so their loops vectorize (they ran scalar); bit-identical
    uus, aus = np.empty(nu), np.empty(nu)
    for l in range(nu):
        uus[l] = (l - (nu - 1)) * h
        aus[l] = abs(uus[l])
    top = float(nu - 1)
    # the closed forms past u' = 0, one linear run per innovation point (_closed_forms)
    t_lim = np.empty(xs.size, dtype=np.int64)
    t_b, t_w = np.empty(xs.size), np.empty(xs.size)
    hh = h * (1 + 4 * UNIT_ROUNDOFF)
    tailf = 1 + 4 * (2 * xs.size + 16) * UNIT_ROUNDOFF
    # the summand x = e^{alpha z - c} e^{beta xi} (1 + 8u), each exponent rounded up past its own
    # rounding (two products and a difference: 8u and 4u of their magnitudes) and each exp within 2u:
    # one exp per chain node and per innovation point instead of one per pair (c = inf: x = 0)
    ez, ex = np.zeros(nout), np.empty(xs.size)
    if not math.isinf(c):
        for j in range(nout):
            az = alpha * (0.0 if initial else z_lo + j * dz)
            ez[j] = math.exp(az - c + 8 * UNIT_ROUNDOFF * (abs(az) + abs(c)))
    for k in range(xs.size):
        bx = beta * xs[k]
        ex[k] = math.exp(bx + 4 * UNIT_ROUNDOFF * abs(bx))
    for j in range(nout):
        z = 0.0 if initial else z_lo + j * dz
        oj = out[j]  # (1-d row views: the loops over l vectorize; the same sums, bit-identical)
        nt = 0
        for k in range(xs.size):
            wk = ws[k]
            xi = xs[k]
            x = ez[j] * ex[k] * (1 + 8 * UNIT_ROUNDOFF)
            zp = rho * z + s * xi
            zp = zp + 8 * UNIT_ROUNDOFF * (abs(rho * z) + abs(s * xi)) + 1e-300
            q = x / h * (1 + 2 * UNIT_ROUNDOFF)
            if zp > z_hi:
                rz = 0.0
                for d in range(sl_hi.size):
                    rz += math.exp(sl_hi[d] * zp * (1 + 2 * UNIT_ROUNDOFF) + offs[d])
                rz *= 1 + 4 * (sl_hi.size + 8) * UNIT_ROUNDOFF
                for l in range(nu):
                    v = uus[l] + x
                    if v < 0.0:
                        v = 0.0
                    v += 4 * UNIT_ROUNDOFF * (aus[l] + x)
                    oj[l] += wk * (v + rz)
                continue
            if zp < z_lo:
                zp = z_lo
            t = (zp - z_lo) / dz
            t = t + 4 * UNIT_ROUNDOFF * (t + (abs(zp) + abs(z_lo)) / dz + 1.0)
            a = int(t)
            if a > nz - 2:
                a = nz - 2
            th = t - a
            if th > 1.0:
                th = 1.0
            th1 = 1.0 - th
            rmix = th1 * Rn[a] + th * Rn[a + 1]
            # one shift for every l, rounded up past (l + q)(1 + 4u) + 4u for all l < nu
            qb = q * (1 + 4 * UNIT_ROUNDOFF) + 4 * UNIT_ROUNDOFF * (nu + 1.0)
            if qb >= nu:
                fq = nu
                ph = 0.0
            else:
                fq = int(qb)
                ph = qb - fq
            c00, c10, c01, c11 = _corner_weights(wk, ph, th)
            lim = nu - 1 - fq  # l < lim: both nodes inside the table
            if lim < 0:
                lim = 0
            _stencil(oj, V[a, fq:], V[a + 1, fq:], lim, c00, c10, c01, c11)
            # (l >= lim: w + R(z') at u' = (l + qb - top) h >= 0, i.e. the value at lim plus (l - lim) h)
            t_lim[nt] = lim
            t_b[nt] = wk * ((lim + qb - top) * h + rmix + 4 * UNIT_ROUNDOFF * (lim + qb + 1.0) * h)
            t_w[nt] = wk
            nt += 1
        _closed_forms(oj, t_lim, t_b, t_w, nt, hh, tailf)
    return out


@nb.njit(cache=True, nogil=True)
def _closed_forms(o, lims, bs, ws, nt, hh, tailf):  # pragma: no cover - compiled
    """``o[l] += sum_t (b_t + w_t hh (l - lim_t)) tailf`` over the terms ``t`` with ``lim_t <= l``: each
    innovation point's closed form past ``u' = 0`` (:func:`step`; ``b_t`` its value at ``lim_t``,
    ``hh = h (1 + 4u)`` covering the positions' rounding as the per-element form did).

    Where the starts fall as ``t`` grows (the summand grows with the innovation: the usual case) the
    terms are summed as runs between consecutive starts, ``S_b + hh (C + S_w (l - s))`` with ``C`` the
    active terms' ``sum w_t (s - lim_t)`` at the run's start ``s`` -- every part a sum of non-negative
    terms, ``2 n_t + 6`` roundings at most, which ``tailf = 1 + 4 (2 n_t + 16) u`` covers -- in one
    pass per run instead of one per term (the closed forms were 15-30% of a step's updates); else
    term by term, the same bound."""
    nu = o.size
    falling = True
    for t in range(1, nt):
        if lims[t] > lims[t - 1]:
            falling = False
            break
    if not falling:
        for t in range(nt):
            ot = o[lims[t]:]
            b, wh = bs[t], ws[t] * hh
            for l in range(nu - lims[t]):
                ot[l] += (b + wh * l) * tailf
        return
    s_b, s_w, c = 0.0, 0.0, 0.0
    s = lims[nt - 1] if nt else nu
    for t in range(nt - 1, -1, -1):
        start = lims[t]
        c += s_w * (start - s)
        s = start
        s_b += bs[t]
        s_w += ws[t]
        end = lims[t - 1] if t > 0 else nu
        if end <= start:
            continue
        ot = o[start:end]
        for l in range(end - start):  # (vectorizes)
            ot[l] += (s_b + hh * (c + s_w * l)) * tailf


@nb.njit(cache=True, nogil=True)
def step_put(P, wn, z_lo, dz, xs, ws, alpha, beta, c, rho, s, h):  # pragma: no cover - compiled
    """One step of the put program: ``sum_k ws_k P(w', u + x)`` at every node, ``w' = w^rho e^{alpha s xi_k}``
    and ``x = w e^{beta xi_k - c}`` rounded *down*; bilinear in ``(w, u)`` (node values non-increasing),
    ``0`` beyond ``u = 0``, the last row above the ``w`` grid, the bound ``(-u')_+`` below it."""
    nw, nu = P.shape
    out = np.zeros((nw, nu))
    for j in range(nw):
        zj = z_lo + j * dz
        oj = out[j]  # (a 1-d row view: the loops over l vectorize; bit-identical)
        for k in range(xs.size):
            wk = ws[k]
            xi = xs[k]
            zp = rho * zj + s * xi
            zp = zp - 8 * UNIT_ROUNDOFF * (abs(rho * zj) + abs(s * xi)) - 1e-300
            wp = math.exp(alpha * zp) * (1 - 8 * UNIT_ROUNDOFF)
            x = wn[j] * math.exp(beta * xi - c) * (1 - 8 * UNIT_ROUNDOFF)
            q = x / h * (1 - 2 * UNIT_ROUNDOFF)
            if wp < wn[0]:
                for l in range(nu):
                    uu = (l - (nu - 1)) * h
                    v = -(uu + x)
                    if v > 0.0:
                        oj[l] += wk * (v + 4 * UNIT_ROUNDOFF * (abs(uu) + x))
                continue
            if wp >= wn[nw - 1]:
                a = nw - 2
                th = 1.0
            else:
                t = (zp - z_lo) / dz
                a = int(t)
                if a > nw - 2:
                    a = nw - 2
                while a > 0 and wp < wn[a]:
                    a -= 1
                while a < nw - 2 and wp > wn[a + 1]:
                    a += 1
                th = (wp - wn[a]) / (wn[a + 1] - wn[a])
                th = th * (1 - 4 * UNIT_ROUNDOFF) - 4 * UNIT_ROUNDOFF
                if th < 0.0:
                    th = 0.0
                if th > 1.0:
                    th = 1.0
            # one shift for every l, rounded down below (l + q)(1 - 4u) - 4u for all l < nu
            qb = q * (1 - 4 * UNIT_ROUNDOFF) - 4 * UNIT_ROUNDOFF * (nu + 1.0)
            if qb < 0.0:
                qb = 0.0
            if qb >= nu:
                continue  # u' >= 0 everywhere: the put is 0
            fq = int(qb)
            ph = qb - fq
            c00, c10, c01, c11 = _corner_weights(wk, ph, th)
            lim = nu - 1 - fq  # l < lim: both nodes inside the table; beyond, u' >= 0 and the put is 0
            if lim < 0:
                lim = 0
            _stencil(oj, P[a, fq:], P[a + 1, fq:], lim, c00, c10, c01, c11)
    return out


@nb.njit(cache=True, nogil=True)
def finish_call(acc, factor, charge, R):  # pragma: no cover - compiled
    """In place, the call program's end of a step (``markov_programs.call_bound_table``): ``acc factor +
    charge_j + 1e-290``, capped at ``R_j``, then made non-decreasing in ``u`` (axis 1) and in ``z``
    (axis 0) by running maxima -- the same float operations, in the same order per element, as the
    numpy expression it replaces (max is exact), so the table is bit-identical; one pass, no
    temporaries."""
    nz, nu = acc.shape
    for j in range(nz):
        row = acc[j]
        cj, rj = charge[j], R[j]
        run = -np.inf
        for l in range(nu):
            v = row[l] * factor + cj + 1e-290
            if v > rj:
                v = rj
            if v > run:
                run = v
            row[l] = run
    for j in range(1, nz):
        row, prev = acc[j], acc[j - 1]
        for l in range(nu):
            if prev[l] > row[l]:
                row[l] = prev[l]
    return acc


@nb.njit(cache=True, nogil=True)
def finish_put(acc, factor, low_tail, neg_u):  # pragma: no cover - compiled
    """In place, the put program's end of a step (``markov_programs.put_bound_table``): ``acc factor +
    low_tail (-u)_+ + 1e-290``, capped at ``(-u)_+``, then made non-increasing in ``u`` and in ``w`` by
    running maxima from the high ends (bit-identical to the numpy expression, as :func:`finish_call`)."""
    nw, nu = acc.shape
    for j in range(nw):
        row = acc[j]
        run = -np.inf
        for l in range(nu - 1, -1, -1):
            v = row[l] * factor + low_tail * neg_u[l] + 1e-290
            if v > neg_u[l]:
                v = neg_u[l]
            if v > run:
                run = v
            row[l] = run
    for j in range(nw - 2, -1, -1):
        row, nxt = acc[j], acc[j + 1]
        for l in range(nu):
            if nxt[l] > row[l]:
                row[l] = nxt[l]
    return acc


@nb.njit(cache=True, nogil=True, inline="always")
def _scaled_at(lo, hi, z):  # pragma: no cover - compiled
    """``coef * z`` rounded toward the larger value, ``coef`` within ``[lo, hi]`` (``markov_programs._scaled``)."""
    if z >= 0:
        return hi * z * (1 + 2 * UNIT_ROUNDOFF)
    return lo * z * (1 - 2 * UNIT_ROUNDOFF)


@nb.njit(cache=True, nogil=True)
def call_extras(z, alpha, zc_lo, zc_hi, offset, lm, i, b, ci, a0_half, a0_tail, half, tail):  # pragma: no cover - compiled
    """The call program's per-step inputs besides the table (``markov_programs.call_bound_table``), as the
    numpy helpers there compute them: ``off_next = _shifted(offset, lm, i + 1, b - 1 - i)``; the tail
    charge ``_tail_charge`` of the summand (``zc = alpha``, offset ``-ci``, ``a^2/2`` rounded up
    ``a0_half``, ``Phi(a - L)`` ``a0_tail``) and of the ``b - 1 - i`` remaining terms (``zc_lo/hi[d + 1]``,
    ``off_next[d]``, ``half[d]``, ``tail[d]``); the remaining mean ``R`` of ``_remaining_mean`` over the
    ``b - i`` terms from ``i`` (offsets ``_shifted(offset, lm, i, b - i)``). The same float operations per
    term; the sums run in index order (numpy's are pairwise: the allowances, ``(1 + 4 (terms + 8) u)`` and
    ``1 + 1e-9``, bound either), and ``exp`` is LLVM's (within an ulp, as numpy's)."""
    nt = b - 1 - i
    terms = b - i
    off_next = np.empty(nt)
    for d in range(nt):
        o, l = offset[d], lm[i + 1 + d]
        off_next[d] = o + l + 4 * UNIT_ROUNDOFF * (abs(o) + abs(l))
    off_r = np.empty(terms)
    for d in range(terms):
        o, l = offset[d], lm[i + d]
        off_r[d] = o + l + 4 * UNIT_ROUNDOFF * (abs(o) + abs(l))
    rfac = 1 + 4 * (terms + 8) * UNIT_ROUNDOFF
    charge, R = np.empty(z.size), np.empty(z.size)
    for j in range(z.size):
        zj = z[j]
        acc = math.exp(_scaled_at(alpha, alpha, zj) + (-ci) + a0_half) * a0_tail
        for d in range(nt):
            acc += math.exp(_scaled_at(zc_lo[d + 1], zc_hi[d + 1], zj) + off_next[d] + half[d]) * tail[d]
        charge[j] = acc * (1 + 1e-9) + 1e-300
        r = 0.0
        for d in range(terms):
            r += math.exp(_scaled_at(zc_lo[d], zc_hi[d], zj) + off_r[d])
        R[j] = r * rfac + 1e-300
    return off_next, charge, R
