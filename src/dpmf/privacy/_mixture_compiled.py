"""Compiled (numba) kernels of the mixture-of-Gaussians PLD (private; :mod:`dpmf.privacy.mixture`).

The loss of a mixture in standardized units is ``L(u) = log sum_i exp(alpha_i + s_i u)`` with
``alpha_i = log p_i - s_i^2 / 2``. Building a PLD needs ``L`` and ``L'`` at every loss level of the
grid (Newton's method for the thresholds) and the mixture mass between consecutive thresholds:
``G x K`` work for ``G`` grid points and ``K`` components (MMCC rows: ``G ~ 2.5e5``, ``K ~ 400``),
which the profile of an MMCC evaluation (BandMF-16 x 500 steps) found to be ~80% of its time.

Two evaluators of ``(L, L')`` at a sorted array of points:

* :func:`direct_loss`: ``K`` exponentials per point (a one-pass log-sum-exp, rescaled when the
  maximum grows), any sensitivities;
* :func:`lattice_loss`: sensitivities on a lattice, ``s_i = s_0 + d_i h`` with integer ``d_i``
  (MMCC rows: the product mixture's grid): ``exp(alpha_i + s_i u) = exp(s_0 u + M_c) beta_{c,d_i}
  rho^{d_i}`` with ``rho = exp(h (u - c))`` for a *center* ``c`` near ``u``, so ``sum_i`` is a
  polynomial in ``rho`` with non-negative coefficients ``beta_{c,d} = exp(alpha_d + d h c - M_c)``
  (``M_c = max_d (alpha_d + d h c)``, so every ``beta <= 1``), evaluated by Horner's rule: two
  fused multiply-adds per component instead of an exponential, vectorized over a block of points
  that share a center. Overflow cannot occur: with ``|u - c| h D <= SPAN`` (``D`` the largest
  ``d``) every term is ``<= e^SPAN`` and the sum ``>= e^-SPAN``; a point farther from every center
  is evaluated by :func:`direct_loss`'s rule. Horner's rule on non-negative terms has no
  cancellation: relative error ``<= 2 D u`` (``u = 2^-53``), the order of the log-sum-exp's own
  (``exp`` of arguments of size ~50 carries ~1e-14 relative error).

Interval masses (:func:`gauss_legendre_masses`): the mixture density is ``phi(u) e^{L(u)}`` (the
likelihood ratio times the Gaussian density), so the mass between thresholds is
``int phi(u) e^{L(u)} du``, computed by 4-point Gauss-Legendre on sub-intervals of
``tau = width (max|u| + s_max + 1) / 2 <= TAU_MAX``. Error: ``g = phi e^L`` is analytic with
``|g(z)| <= e^2 g(x)`` on the disk of radius ``r = 1 / (|x| + s_max + 1)`` (``L' <= s_max``), so
Cauchy's estimate bounds ``|g^(8)| <= 8! e^2 g / r^8`` and the rule's error is at most
``0.043 tau^8 (1 + 2 tau)`` relative: ``< 3e-14`` at ``TAU_MAX = 0.03``; an interval with
``tau <= TAU_GL2 = 4e-4`` (most of them on fine loss grids) takes the 2-point rule, whose bound by
the same argument is ``0.66 tau^4 (1 + 2 tau) < 2e-14`` (half the nodes); each mass is then raised
by ``GL_SLACK = 1e-13`` relative (pessimistic). An interval that would need more than
``MAX_PARTS`` sub-intervals (far in a tail, or at a huge noise) is summed exactly instead, per
component from the smaller normal tails (:func:`exact_masses`; no cancellation on a wide interval). Previously each mass was a difference of normal
CDFs per component (``K`` ``ndtr`` calls per point), whose cancellation in the middle of the
distribution left ~1e-12 relative error; the quadrature is more accurate and ~10x cheaper.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

#: Points per block sharing one center in :func:`lattice_loss` (a few KiB: stays in L1).
BLOCK = 256
#: Largest ``|u - c| h D`` at which a point uses center ``c`` (terms stay within ``e^(+-SPAN)``).
SPAN = 100.0
#: Largest ``tau`` of a Gauss-Legendre sub-interval (relative error ``< 3e-14``, module docstring).
TAU_MAX = 0.03
#: Largest ``tau`` integrated by the 2-point rule (relative error ``<= 0.66 tau^4 (1 + 2 tau) < 2e-14``).
TAU_GL2 = 4e-4
#: Relative amount every interval mass is raised by (covers the rule's error bound).
GL_SLACK = 1e-13
#: Most sub-intervals of one interval; a wider one (a wide interval far in a tail, or every interval
#: at a huge noise, where the loss grid has a few levels) is summed exactly per component.
MAX_PARTS = 64

_GL_NODES = np.array([-0.8611363115940526, -0.3399810435848563, 0.3399810435848563, 0.8611363115940526])
_GL_WEIGHTS = np.array([0.3478548451374538, 0.6521451548625461, 0.6521451548625461, 0.3478548451374538])
_GL2_NODES = np.array([-1.0 / math.sqrt(3.0), 1.0 / math.sqrt(3.0)])  # (weights 1)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@nb.njit(cache=True, nogil=True)
def _direct_point(x, alpha, s):  # pragma: no cover - compiled
    """``(L(x), L'(x))`` by a one-pass log-sum-exp over the components."""
    mx = alpha[0] + s[0] * x
    acc = 1.0
    acc_s = s[0]
    for i in range(1, alpha.size):
        v = alpha[i] + s[i] * x
        if v <= mx:
            w = math.exp(v - mx)
            acc += w
            acc_s += w * s[i]
        else:
            w = math.exp(mx - v)
            acc = acc * w + 1.0
            acc_s = acc_s * w + s[i]
            mx = v
    return mx + math.log(acc), acc_s / acc


@nb.njit(cache=True, nogil=True)
def direct_loss(u, alpha, s, loss, slope):  # pragma: no cover - compiled
    """``loss[j], slope[j] = L(u[j]), L'(u[j])`` with ``K`` exponentials per point."""
    for j in range(u.size):
        loss[j], slope[j] = _direct_point(u[j], alpha, s)


@nb.njit(cache=True, nogil=True, fastmath={"contract"})
def _horner_block(u, start, stop, c, center, beta, h, s0, mc, loss, slope, p, dp, rho, want_slope):  # pragma: no cover
    """Horner's rule for the points ``u[start:stop]`` around center ``c`` (module docstring); the
    derivative's recurrence only when ``want_slope`` (the loss is the same either way)."""
    m = stop - start
    dmax = beta.shape[1] - 1
    top = beta[c, dmax]
    for ell in range(m):
        rho[ell] = math.exp(h * (u[start + ell] - center))
        p[ell] = top
        dp[ell] = 0.0
    if want_slope:
        for d in range(dmax - 1, -1, -1):
            b = beta[c, d]
            for ell in range(m):
                dp[ell] = dp[ell] * rho[ell] + p[ell]
                p[ell] = p[ell] * rho[ell] + b
    else:
        for d in range(dmax - 1, -1, -1):
            b = beta[c, d]
            for ell in range(m):
                p[ell] = p[ell] * rho[ell] + b
    for ell in range(m):
        x = u[start + ell]
        loss[start + ell] = s0 * x + mc[c] + math.log(p[ell])
        if want_slope:
            slope[start + ell] = s0 + h * rho[ell] * dp[ell] / p[ell]


@nb.njit(cache=True, nogil=True)
def _lattice_into(u, n, centers, beta, mc, h, s0, alpha, s, loss, slope, p, dp, rho, want_slope=True):  # pragma: no cover
    """:func:`lattice_loss` of ``u[:n]`` with the caller's scratch arrays ``p``, ``dp``, ``rho``
    (``slope`` untouched by the Horner blocks unless ``want_slope``)."""
    dmax = beta.shape[1] - 1
    reach = SPAN / (h * dmax)
    c0 = centers[0]
    step = centers[1] - centers[0] if centers.size > 1 else 1.0
    last = centers.size - 1
    for start in range(0, n, BLOCK):
        stop = min(n, start + BLOCK)
        mid = 0.5 * (u[start] + u[stop - 1])
        c = min(last, max(0, int(round((mid - c0) / step)))) if centers.size > 1 else 0
        ok = True
        for j in range(start, stop):
            if not abs(u[j] - centers[c]) <= reach:  # (NaN too)
                ok = False
                break
        if ok:
            _horner_block(u, start, stop, c, centers[c], beta, h, s0, mc, loss, slope, p, dp, rho, want_slope)
            continue
        for j in range(start, stop):  # a spread-out block: each point on its own
            cj = min(last, max(0, int(round((u[j] - c0) / step)))) if centers.size > 1 else 0
            if abs(u[j] - centers[cj]) <= reach:
                _horner_block(u, j, j + 1, cj, centers[cj], beta, h, s0, mc, loss, slope, p, dp, rho, want_slope)
            else:
                loss[j], slope[j] = _direct_point(u[j], alpha, s)


@nb.njit(cache=True, nogil=True)
def lattice_loss(u, centers, beta, mc, h, s0, alpha, s, loss, slope):  # pragma: no cover - compiled
    """``(L, L')`` at the points ``u`` (sorted for speed, any order is correct) of a lattice mixture
    by Horner's rule around the nearest center (module docstring); ``alpha``, ``s`` serve the points
    farther than ``SPAN`` from every center."""
    p = np.empty(BLOCK)
    dp = np.empty(BLOCK)
    rho = np.empty(BLOCK)
    _lattice_into(u, u.size, centers, beta, mc, h, s0, alpha, s, loss, slope, p, dp, rho, True)


@nb.njit(cache=True, nogil=True)
def lattice_loss_values(u, centers, beta, mc, h, s0, alpha, s, loss, slope):  # pragma: no cover - compiled
    """:func:`lattice_loss`'s ``L`` alone (the same values; Horner's rule without the derivative's
    recurrence: half the multiply-adds). ``slope`` is scratch (set only where a point falls back to
    the direct rule)."""
    p = np.empty(BLOCK)
    dp = np.empty(BLOCK)
    rho = np.empty(BLOCK)
    _lattice_into(u, u.size, centers, beta, mc, h, s0, alpha, s, loss, slope, p, dp, rho, False)


#: Most Newton steps per point in :func:`newton_inverse` (the numpy loop's limit).
NEWTON_STEPS = 60


@nb.njit(cache=True, nogil=True)
def newton_inverse(target, u, left, right, centers, beta, mc, h, s0, alpha, s):  # pragma: no cover
    """Newton's method for ``L(u) = target`` in place, a block of ``BLOCK`` points at a time: the
    steps of :func:`dpmf.privacy.mixture._inverse_loss` (start ``u`` left of the root, step clamped
    to ``[left, right]``, done when the step is below ``1e-9 max(1, |u|)`` or the residual below 8
    ulps of ``max(1, |target|)``), evaluated by :func:`lattice_loss`'s rule (``centers.size == 0``:
    the direct rule). Returns ``False`` when a point did not converge in :data:`NEWTON_STEPS`."""
    n = u.size
    p = np.empty(BLOCK)
    dp = np.empty(BLOCK)
    rho = np.empty(BLOCK)
    ub = np.empty(BLOCK)
    lb = np.empty(BLOCK)
    sb = np.empty(BLOCK)
    idx = np.empty(BLOCK, dtype=np.int64)
    eps = 2.220446049250313e-16
    for start in range(0, n, BLOCK):
        m = 0
        for j in range(start, min(n, start + BLOCK)):
            idx[m] = j
            m += 1
        for _ in range(NEWTON_STEPS):
            for k in range(m):
                ub[k] = u[idx[k]]
            if centers.size > 0:
                _lattice_into(ub, m, centers, beta, mc, h, s0, alpha, s, lb, sb, p, dp, rho, True)
            else:
                for k in range(m):
                    lb[k], sb[k] = _direct_point(ub[k], alpha, s)
            keep = 0
            for k in range(m):
                j = idx[k]
                old = ub[k]
                resid = lb[k] - target[j]
                new = old - resid / sb[k]
                if not math.isfinite(new):
                    new = old
                new = min(max(new, left[j]), right[j])
                u[j] = new
                if abs(new - old) > 1e-9 * max(1.0, abs(new)) and abs(resid) > 8 * eps * max(1.0, abs(target[j])):
                    idx[keep] = j
                    keep += 1
            m = keep
            if m == 0:
                break
        if m > 0:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def _tau(a, b, smax):  # pragma: no cover - compiled
    return 0.5 * (b - a) * (max(abs(a), abs(b)) + smax + 1.0)


@nb.njit(cache=True, nogil=True)
def quadrature_parts(u, smax):  # pragma: no cover - compiled
    """How every ``[u_j, u_{j+1}]`` is integrated (module docstring): ``-1`` one 2-point rule
    (``tau <= TAU_GL2``), ``k > 0`` ``k`` sub-intervals of the 4-point rule (``tau / k <= TAU_MAX``),
    0 where more than ``MAX_PARTS`` would be needed (a wide interval far in a tail: its mass is
    summed exactly instead, :func:`exact_masses`)."""
    parts = np.zeros(u.size - 1, dtype=np.int64)
    for j in range(u.size - 1):
        tau = _tau(u[j], u[j + 1], smax)
        if tau <= TAU_GL2:
            parts[j] = -1
            continue
        k = max(1.0, math.ceil(tau / TAU_MAX))
        parts[j] = int(k) if k <= MAX_PARTS else 0
    return parts


@nb.njit(cache=True, nogil=True)
def quadrature_size(parts):  # pragma: no cover - compiled
    """Nodes :func:`quadrature_nodes` places for ``parts``."""
    total = 0
    for m in parts:
        total += 2 if m < 0 else 4 * m
    return total


@nb.njit(cache=True, nogil=True)
def quadrature_nodes(u, parts, nodes, weights, owner):  # pragma: no cover - compiled
    """Fill ``nodes`` / ``weights`` (Gauss-Legendre: 2 nodes for ``parts == -1``, 4 per
    sub-interval for ``parts > 0``) and ``owner`` (the interval of each node)."""
    k = 0
    for j in range(u.size - 1):
        m = parts[j]
        if m == 0:
            continue
        if m < 0:
            half = 0.5 * (u[j + 1] - u[j])
            mid = u[j] + half
            for r in range(2):
                nodes[k] = mid + half * _GL2_NODES[r]
                weights[k] = half
                owner[k] = j
                k += 1
            continue
        width = (u[j + 1] - u[j]) / m
        half = 0.5 * width
        for q in range(m):
            mid = u[j] + q * width + half
            for r in range(4):
                nodes[k] = mid + half * _GL_NODES[r]
                weights[k] = half * _GL_WEIGHTS[r]
                owner[k] = j
                k += 1


@nb.njit(cache=True, nogil=True)
def exact_masses(u, parts, s, p, out):  # pragma: no cover - compiled
    """``out[j] = sum_i p_i (Phi(u_{j+1} - s_i) - Phi(u_j - s_i))`` for the intervals with
    ``parts == 0``, each difference formed from the smaller tails (no ``1 - 1`` cancellation)."""
    r2 = 1.0 / math.sqrt(2.0)
    for j in range(u.size - 1):
        if parts[j] != 0:
            continue
        total = 0.0
        for i in range(s.size):
            za = u[j] - s[i]
            zb = u[j + 1] - s[i]
            if zb <= 0.0:  # both below: Phi(zb) - Phi(za)
                d = 0.5 * math.erfc(-zb * r2) - 0.5 * math.erfc(-za * r2)
            elif za >= 0.0:  # both above: Q(za) - Q(zb)
                d = 0.5 * math.erfc(za * r2) - 0.5 * math.erfc(zb * r2)
            else:  # straddling 0
                d = 1.0 - 0.5 * math.erfc(-za * r2) - 0.5 * math.erfc(zb * r2)
            total += p[i] * max(d, 0.0)
        out[j] = total


@nb.njit(cache=True, nogil=True)
def accumulate_masses(nodes, weights, loss, owner, out):  # pragma: no cover - compiled
    """``out[j] += sum_nodes w phi(x) e^{L(x)}`` over the nodes of interval ``j``, then every mass is
    raised by ``GL_SLACK`` relative."""
    for k in range(nodes.size):
        x = nodes[k]
        out[owner[k]] += weights[k] * math.exp(loss[k] - 0.5 * x * x) * _INV_SQRT_2PI
    for j in range(out.size):
        out[j] *= 1.0 + GL_SLACK
