"""The Markov surrogate's programs: the call and put bound tables of a chain's slot sum (a dynamic
program over chain state and partial sum, every discretization step an upper bound), the tables with
a shared factor or anchor mixed over its law, the threads they run on, and the epsilon search over a
surrogate's tables (:func:`markov_epsilon`, any :class:`~dpmf.accounting.allocation.surrogates.protocol.Surrogate`).

Part of the Markov surrogate (:mod:`.markov_fit` has the argument; design note
``docs/notes/allocation-surrogates.md``, *the call program*, *the put program*, *floating point*).
The compiled loops are :mod:`._markov_compiled` (loaded when a program first runs).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from dpmf.accounting.allocation.surrogates.protocol import Surrogate
from dpmf.accounting.allocation.surrogates.quadrature import mp_spread, spread, spread_on
from dpmf.errors import NumericalError
from dpmf.memo import BoundedMemo
from dpmf.numerics import UNIT_ROUNDOFF
from dpmf.resources import on_threads

__all__ = [
    "call_bound_table",
    "put_bound_table",
    "ring_table",
    "factor_half_width",
    "on_threads",
    "puts_at",
    "calls_at",
    "markov_epsilon",
]

#: Half-width ``L`` of the innovation grid (standard units) and its number of cells.
_XI_HALF = 7.0
_XI_CELLS = 96
#: Stretch of the innovation grid (points denser at 0; :func:`~.quadrature.points`).
_XI_STRETCH = 2.0
#: The chain's grid ``[z_lo, z_hi]`` (standard units) and its nodes.
_Z_LO, _Z_HI, _Z_NODES = -6.0, 9.0, 90
#: Partial-sum nodes per window.
_U_NODES = 600
#: The shared factor's grid (:func:`ring_table`): half-width (standard units) and cells.
_W_HALF, _W_CELLS, _W_STRETCH = 8.0, 12, 2.0
#: ... centred at ``+-`` this many times the largest loading (over sigma): the tilt of ``W`` on the
#: events that set delta (any centre is sound; measured on bsr(128, 4) over 2 epochs: 0 -> 2 moves
#: epsilon 4.806 -> 4.707 at sigma 1 and 0.9784 -> 0.9764 at sigma 2).
_W_SHIFT = 2.0
#: The anchored ring's mixing nodes: ``w_cells + 1`` sinh-stretched points (stretch ``_A_STRETCH``)
#: around ``_A_SHIFT`` times the largest covariance of a log-summand with ``Z_0``, reaching
#: ``_A_SCALE`` below zero and the half-width above (mirrored for the put); measured on bsr(256, 4)
#: over 4 epochs at sigma 2 (any nodes are sound).
_A_SHIFT, _A_SCALE, _A_STRETCH = 1.5, 3.0, 1.0


def _compiled_step(name: str = "step"):
    """The compiled kernel ``step``, ``step_put``, ``finish_call``, ``finish_put`` or ``call_extras`` (imported here: numba
    loads only when a program runs)."""
    from dpmf.accounting.allocation.surrogates._markov_compiled import call_extras, finish_call, finish_put, step, step_put

    return {"step": step, "step_put": step_put, "finish_call": finish_call, "finish_put": finish_put,
            "call_extras": call_extras}[name]


def _chain_constants(alpha: float, beta: float, rho: float, s: float, b: int):
    """``c`` (rounded down); per distance ``d = 0..b``: ``rho^d`` rounded down and up, and
    ``log E[X_{i+d} | Z_i = z] - alpha rho^d z = alpha^2 v_d / 2 + beta^2 / 2 - c`` rounded up, with
    ``v_d = Var(Z_{i+d} | Z_i) = s^2 sum_{e<d} rho^{2e}`` (a sum of non-negative terms)."""
    c = 0.5 * (alpha * alpha + beta * beta) * (1 - 8 * UNIT_ROUNDOFF)
    d = np.arange(b + 1, dtype=np.float64)
    pw = rho**d
    pw_lo, pw_hi = pw * (1 - 4 * UNIT_ROUNDOFF * (d + 2)), pw * (1 + 4 * UNIT_ROUNDOFF * (d + 2))
    v = np.concatenate([[0.0], np.cumsum(s * s * pw[:-1] ** 2)]) * (1 + 4 * UNIT_ROUNDOFF * (d + 4))
    offset = 0.5 * alpha * alpha * v + 0.5 * beta * beta - c
    offset = offset + 8 * UNIT_ROUNDOFF * (0.5 * alpha * alpha * v + 0.5 * beta * beta + c)  # (a sum of three terms)
    return c, pw_lo, pw_hi, offset


def _scaled(coef_lo: np.ndarray, coef_hi: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``coef * z`` rounded toward the larger value, for ``coef >= 0`` known within ``[lo, hi]``."""
    zz = z[:, None]
    return np.where(zz >= 0, coef_hi[None, :] * zz * (1 + 2 * UNIT_ROUNDOFF), coef_lo[None, :] * zz * (1 - 2 * UNIT_ROUNDOFF))


def _remaining_mean(alpha, pw_lo, pw_hi, offset, z: np.ndarray, terms: int) -> np.ndarray:
    """``R(z) = sum_{d < terms} exp(alpha rho^d z + offset_d)``, rounded up."""
    if terms <= 0:
        return np.zeros_like(z)
    e = _scaled(alpha * pw_lo[:terms], alpha * pw_hi[:terms], z) + offset[None, :terms]
    return np.exp(e).sum(axis=1) * (1 + 4 * (terms + 8) * UNIT_ROUNDOFF) + 1e-300


def _tail_charge(z_coef_lo, z_coef_hi, a, offs, z: np.ndarray) -> np.ndarray:
    """``sum_t E[exp(z_coef_t z + a_t xi + offs_t); xi > L]`` per node ``z``
    (``E[e^{a xi}; xi > L] = e^{a^2/2} Phi(a - L)``), rounded up."""
    expo = _scaled(z_coef_lo, z_coef_hi, z) + offs[None, :] + 0.5 * a[None, :] ** 2 * (1 + 4 * UNIT_ROUNDOFF)
    return (np.exp(expo) * special.ndtr(a - _XI_HALF)[None, :]).sum(axis=1) * (1 + 1e-9) + 1e-300


def _shifted(offset: np.ndarray, log_mult: np.ndarray, start: int, terms: int) -> np.ndarray:
    """``offset[d] + log_mult[start + d]`` for ``d < terms``, rounded up (``log_mult`` already is)."""
    lm = log_mult[start : start + terms]
    return offset[:terms] + lm + 4 * UNIT_ROUNDOFF * (np.abs(offset[:terms]) + np.abs(lm))


def _read_row(V: np.ndarray, pos: float) -> np.ndarray | None:
    """Row ``pos`` (in node units) of a table convex and non-decreasing along axis 0, by linear
    interpolation (an upper bound between nodes); the position rounded up; below the grid the first
    row; ``None`` above it."""
    pos = pos * (1 + 4 * UNIT_ROUNDOFF) + 4 * UNIT_ROUNDOFF
    if pos <= 0:
        return V[0].copy()
    j = int(pos)
    if j >= V.shape[0] - 1:
        return V[-1].copy() if pos <= V.shape[0] - 1 else None
    f = pos - j
    return (1 - f) * V[j] + f * V[j + 1]


def call_bound_table(sur, sigma: float, b: int, k_max: float, *, u_nodes: int = _U_NODES,
                     z_nodes: int = _Z_NODES, xi_cells: int = _XI_CELLS, log_mult=None, z0=None):
    """Strikes ``K_l = l h`` (``0 .. k_max``) and upper bounds ``C~(K_l) >= E(T' - K_l)_+`` for the
    surrogate at noise ``sigma`` (module docstring). ``log_mult`` (rounded up): the summand at chain
    position ``i`` is multiplied by ``e^{log_mult[i]}`` (the shared factor given its value,
    :func:`ring_table`). ``z0``: the chain started at ``Z_0 = z0`` (the anchored ring given its
    anchor) instead of ``Z_0 ~ N(0, 1)``: ``V_0`` read at ``z0`` by linear interpolation (an upper
    bound: ``V_0`` is convex and non-decreasing in ``z``; above the grid, ``V_0 <= R_0(z0)``)."""
    step, finish = _compiled_step(), _compiled_step("finish_call")
    alpha, betas = sur.alpha / sigma, sur.betas(b) / sigma
    rho, s = sur.rho, sur.s
    xs, ws = spread(_XI_HALF, xi_cells, _XI_STRETCH)
    # (the offsets log E[X_j | Z_i] - alpha rho^d z = alpha^2 v_d / 2 + beta_j^2 / 2 - c_j do not depend
    # on beta_j but through rounding: computed at the largest beta, plus a margin for the rest)
    _, pw_lo, pw_hi, offset = _chain_constants(alpha, float(betas.max()), rho, s, b)
    offset = offset + 8 * UNIT_ROUNDOFF * (alpha * alpha + float(betas.max()) ** 2)
    c_pos = 0.5 * (alpha * alpha + betas * betas) * (1 - 8 * UNIT_ROUNDOFF)
    lm = np.zeros(b + 1) if log_mult is None else np.concatenate([np.asarray(log_mult, dtype=np.float64), [0.0]])
    z = np.linspace(_Z_LO, _Z_HI, z_nodes)
    dz = (_Z_HI - _Z_LO) / (z_nodes - 1)
    h = k_max / (u_nodes - 1)
    factor = 1 + 4 * (xs.size + 16) * UNIT_ROUNDOFF
    V = np.zeros((z_nodes, u_nodes))  # V_b(z, u) = u_+ = 0 on u <= 0
    R_next = np.zeros(z_nodes)
    # the parts of each step's tail charge and remaining mean that do not depend on the step (elementwise
    # the same floats as per step); the step's own (offsets, sums over its terms) are compiled (call_extras)
    extras = _compiled_step("call_extras")
    sl_hi, zc_lo, zc_hi = alpha * pw_hi[:b], alpha * pw_lo, alpha * pw_hi
    a_rest = alpha * pw_hi[:b] * s * (1 + 2 * UNIT_ROUNDOFF)
    half_rest, tail_rest = 0.5 * a_rest**2 * (1 + 4 * UNIT_ROUNDOFF), special.ndtr(a_rest - _XI_HALF)
    a_first = betas * (1 + 2 * UNIT_ROUNDOFF)
    half_first, tail_first = 0.5 * a_first**2 * (1 + 4 * UNIT_ROUNDOFF), special.ndtr(a_first - _XI_HALF)
    for i in range(b - 1, -1, -1):
        nt = b - 1 - i  # R_{i+1} has b - 1 - i terms
        c = c_pos[i]
        ci = c - lm[i] - 4 * UNIT_ROUNDOFF * (c + abs(lm[i]))  # (X_i = e^{alpha z + beta_i xi - c_i}, c_i rounded down)
        beta = float(betas[i])
        # xi > L: h(xi) <= X_i + R_{i+1}(rho z + s xi), exponentials in xi (X_i first): the charge; R = R_i
        off_next, charge, R = extras(z, alpha, zc_lo, zc_hi, offset, lm, i, b, ci, float(half_first[i]),
                                     float(tail_first[i]), half_rest, tail_rest)
        acc = step(V, R_next, xs, ws, alpha, beta, ci, rho, s, _Z_LO, dz, h, sl_hi[:nt], off_next, False)
        # acc factor + charge + 1e-290, capped at R, running maxima along u then z (compiled, in place)
        V = finish(acc, factor, charge, R)
        R_next = R
    off0 = _shifted(offset, lm, 0, b)
    if z0 is not None:
        calls = _read_row(V, (float(z0) - _Z_LO) / dz)
        if calls is None:  # (above the grid: V_0(z0, u) <= R_0(z0) for u <= 0)
            R0 = _remaining_mean(alpha, pw_lo, pw_hi, off0, np.array([float(z0)]), b)[0]
            calls = np.full(u_nodes, R0)
        calls = np.maximum.accumulate(calls * (1 + 4 * UNIT_ROUNDOFF))
        return (u_nodes - 1 - np.arange(u_nodes))[::-1] * h, calls[::-1].copy()
    # Z_0 ~ N(0, 1): one more spread with no summand (c = +inf: X = 0, z' = xi)
    acc = step(V, R_next, xs, ws, 0.0, 0.0, math.inf, 0.0, 1.0, _Z_LO, dz, h, alpha * pw_hi[:b], off0, True)
    charge0 = _tail_charge(np.zeros(b), np.zeros(b), alpha * pw_hi[:b] * (1 + 2 * UNIT_ROUNDOFF), off0, np.zeros(1))
    calls = np.maximum.accumulate(acc[0] * factor + charge0[0] + 1e-290)  # non-decreasing in u = -K
    return (u_nodes - 1 - np.arange(u_nodes))[::-1] * h, calls[::-1].copy()


def put_bound_table(sur, sigma: float, b: int, k_max: float, *, u_nodes: int = _U_NODES,
                    z_nodes: int = _Z_NODES, xi_cells: int = _XI_CELLS, log_mult=None, z0=None):
    """Strikes ``K_l = l h`` (``0 .. k_max``) and upper bounds ``P~(K_l) >= E(K_l - T')_+`` (module
    docstring, *the put program*): the state is ``w = e^{alpha Z}`` and the innovation
    ``eta = e^{kappa xi}`` (``kappa = max(alpha s, beta)``), in which the put value is convex.
    ``log_mult`` (rounded *down*): per-position multipliers of the summands, as in
    :func:`call_bound_table`. ``z0``: the chain started at ``Z_0 = z0``: ``W_0`` read at
    ``w = e^{alpha z0}`` by linear interpolation in ``w`` (``W_0`` is convex and non-increasing in
    ``w``; the position rounded down; below the grid the bound ``(-u)_+``, above it the last row)."""
    step, finish = _compiled_step("step_put"), _compiled_step("finish_put")
    alpha, betas = sur.alpha / sigma, sur.betas(b) / sigma
    rho, s = sur.rho, sur.s
    xs, _ = spread(_XI_HALF, xi_cells, _XI_STRETCH)
    kappa = max(alpha * s, float(betas.max()))  # (every beta_i / kappa <= 1: the integrand stays convex in eta)
    ws = mp_spread(xs, kappa)
    # (c_i rounded up: smaller summands, larger puts)
    c_pos = 0.5 * (alpha * alpha + betas * betas) * (1 + 8 * UNIT_ROUNDOFF)
    lm = np.zeros(b) if log_mult is None else np.asarray(log_mult, dtype=np.float64)
    z_lo, z_hi = _Z_LO - 1.0, _Z_HI
    dz = (z_hi - z_lo) / (z_nodes - 1)
    zn = z_lo + dz * np.arange(z_nodes)
    wn = np.exp(alpha * zn)
    h = k_max / (u_nodes - 1)
    neg_u = (u_nodes - 1 - np.arange(u_nodes)) * h * (1 + 2 * UNIT_ROUNDOFF)  # (-u)_+ at the nodes, rounded up
    low_tail = float(special.ndtr(-_XI_HALF)) * (1 + 1e-9)
    factor = 1 + 4 * (xs.size + 16) * UNIT_ROUNDOFF
    P = np.broadcast_to(neg_u, (z_nodes, u_nodes)).copy()  # P_b(w, u) = (-u)_+
    for i in range(b - 1, -1, -1):
        c = c_pos[i]
        ci = c - lm[i] + 4 * UNIT_ROUNDOFF * (c + abs(lm[i]))  # (rounded up)
        acc = step(P, wn, z_lo, dz, xs, ws, alpha, float(betas[i]), ci, rho, s, h)
        # acc factor + low_tail (-u)_+ + 1e-290, capped at (-u)_+, non-increasing in u (axis 1) and in w
        # (axis 0): running maxima from the high ends (compiled, in place)
        P = finish(acc, factor, low_tail, neg_u)
    if z0 is not None:
        w_read = math.exp(alpha * float(z0)) * (1 - 4 * UNIT_ROUNDOFF)
        j = int(np.searchsorted(wn, w_read, side="right")) - 1  # wn[j] <= w_read < wn[j + 1]
        if j < 0:
            puts = neg_u.copy()
        elif j >= z_nodes - 1:
            puts = P[-1].copy()
        else:
            f = (w_read - wn[j]) / (wn[j + 1] - wn[j])
            f = min(max(f * (1 - 4 * UNIT_ROUNDOFF) - 4 * UNIT_ROUNDOFF, 0.0), 1.0)  # (toward the smaller w: larger puts)
            puts = (1 - f) * P[j] + f * P[j + 1]
        puts = np.minimum(puts * (1 + 4 * UNIT_ROUNDOFF) + 1e-290, neg_u)
        puts = np.maximum.accumulate(puts[::-1])
        return np.arange(u_nodes) * h, puts
    # w_0 = e^{alpha Z_0}: spread onto the w nodes, mass below the grid charged with (-u)_+
    w0 = mp_spread(zn, alpha)
    below = float(special.ndtr(z_lo)) * (1 + 1e-9)
    # (+ 8 u K: the float nodes wn differ from e^{alpha z_k} by ~u relative, and for a convex,
    # non-increasing W >= 0 with W(0, u) <= K, w |W'(w)| <= K)
    puts = (w0 @ P) * factor + below * neg_u + 8 * UNIT_ROUNDOFF * neg_u + 1e-290
    puts = np.maximum.accumulate(puts[::-1])  # non-decreasing in K
    return np.arange(u_nodes) * h, puts


def ring_table(sur, sigma: float, n: int, kind: str, k_max: float, *, w_cells: int = _W_CELLS,
                w_half: float = _W_HALF, w_stretch: float = _W_STRETCH, w_shift: float = _W_SHIFT, stop=None, **grid):
    """The call (``kind = "call"``) or put table (as :func:`call_bound_table`, :func:`put_bound_table`)
    of the surrogate with its shared factor ``W ~ N(0, 1)``: given ``W = w`` the summand at position
    ``i`` is the chain's times ``e^{a_i w - a_i^2 / 2}`` (``a_i`` the loadings over ``sigma``), and
    the tables given ``w`` are mixed over ``W``'s law (module docstring, *the shared factor*):

    * call: convex and non-decreasing in ``w`` (``T`` is a sum of exponentials of ``w`` with
      non-negative coefficients): ``W`` spread onto the nodes ``x_k`` with each cell's mean kept
      (:func:`~.quadrature.spread`; the mass below ``-L`` at ``-L``), the mass above ``L`` charged with
      ``E[(T - K)_+; W > L] <= E[T; W > L] = sum_i E[X_i] Phi(a_i - L)`` (``E[X_i] <= 1``);
    * put: convex in ``eta = e^{kappa w}`` (``kappa = max a_i``; each ``e^{a_i w} = eta^{a_i/kappa}``
      is concave in ``eta``, so ``K - T`` is convex) and non-increasing: ``eta`` spread onto
      ``e^{kappa x_k}`` with ``E[eta; cell]`` kept, the mass above the top node at the top, the mass
      below ``-L`` charged with the strike ``K`` (a put is at most its strike).

    ``stop = (strike, value)``: ``None`` is returned as soon as the mixing nodes computed so far prove
    that the table's bound at ``strike`` (:func:`calls_at` / :func:`puts_at` of the returned table)
    exceeds ``value`` (:func:`_mixed_tables`); otherwise the table is the same, bit for bit."""
    anchored = sur.anchor is not None
    if anchored:  # the mixing variable is the chain's own Z_0: its covariance with log X_i is c_i + e_i
        a = sur.anchor_loadings(n) / sigma * (1 + 4 * UNIT_ROUNDOFF)
        c_lo = sur.start_covariances(n) / sigma * (1 - 4 * UNIT_ROUNDOFF)
        c_hi = sur.start_covariances(n, lower=False) / sigma * (1 + 4 * UNIT_ROUNDOFF)
        cov = (c_hi + a) * (1 + 2 * UNIT_ROUNDOFF)
    else:
        a = sur.loadings(n) / sigma * (1 + 4 * UNIT_ROUNDOFF)  # (rounded up; the check used the rounded-down loadings)
        c_lo = c_hi = np.zeros(n)
        cov = a
    # nodes centred where the factor matters: up for the call (large sums), down for the put
    if not anchored:
        xs, ps = spread(w_half, w_cells, w_stretch, w_shift * float(a.max()) * (1 if kind == "call" else -1))
    else:  # the points snapped to the program's z nodes (its V_0 is then read at a node)
        center = _A_SHIFT * float(cov.max())
        t = np.linspace(-1.0, 1.0, w_cells + 1)
        lo_w, hi_w = center + _A_SCALE, w_half - center  # (half-widths below / above the centre)
        xs = center + np.where(t < 0, lo_w, hi_w) * (np.sinh(_A_STRETCH * t) / math.sinh(_A_STRETCH) if _A_STRETCH else t)
        xs = xs if kind == "call" else -xs[::-1]
        z_nodes = grid.get("z_nodes", _Z_NODES)
        z_lo = _Z_LO if kind == "call" else _Z_LO - 1.0
        dz = (_Z_HI - z_lo) / (z_nodes - 1)
        k = np.unique(np.clip(np.rint((xs - z_lo) / dz), 0, z_nodes - 1))
        xs, ps = spread_on(tuple(float(x) for x in z_lo + dz * k))
    if kind == "put":
        ps = mp_spread(xs, float(cov.max()) * (1 + 4 * UNIT_ROUNDOFF))
    def node(x):
        # given the mixing variable = x: X_i's extra factor e^{a_i x - a_i^2 / 2 - a_i c_i} (the last
        # term, Var(Y'_i) - gamma_0 = a_i^2 + 2 a_i c_i, only for the anchored ring)
        lm = a * x - 0.5 * a * a
        err = 4 * UNIT_ROUNDOFF * (np.abs(a * x) + 0.5 * a * a + a * c_hi)
        pinned = {"z0": x} if anchored else {}
        if kind == "call":
            return call_bound_table(sur, sigma, n, k_max, log_mult=lm - a * c_lo + err, **pinned, **grid)
        return put_bound_table(sur, sigma, n, k_max, log_mult=lm - a * c_hi - err, **pinned, **grid)

    hint = (sur, n, kind, xs.size, tuple(sorted(grid.items())))  # (which nodes matter most: computed first)
    results = on_threads(node, xs) if stop is None else _mixed_tables(node, xs, ps, kind, stop, hint)
    if results is None:
        return None
    table, strikes = None, results[0][0]
    for p, (_, vals) in zip(ps, results):  # (summed in node order: the same on any number of threads)
        table = p * vals if table is None else table + p * vals
    table = table * (1 + 4 * (xs.size + 4) * UNIT_ROUNDOFF)
    if kind == "call":  # (above the last point xs[-1]: E[X_i; x > L] = Phi(Cov(log X_i, x) - L))
        return strikes, table + float(np.sum(special.ndtr(cov - xs[-1]))) * (1 + 1e-9) * (1 + 32 * UNIT_ROUNDOFF) + 1e-300
    return strikes, table + float(special.ndtr(xs[0])) * (1 + 1e-9) * strikes * (1 + 2 * UNIT_ROUNDOFF) + 1e-290


#: Relative margin of an early exit (:func:`_mixed_tables`, :func:`markov_epsilon`): far above the float
#: error of the partial sums it compares (a few dozen ``u``), far below any margin that matters.
_EXIT_MARGIN = 1e-9


def _mixed_tables(node, xs, ps, kind: str, stop, hint=None) -> list | None:
    """``[node(x) for x in xs]`` (the tables given each mixing node), or ``None`` once the nodes
    computed so far prove that the mixed table's bound at ``strike`` exceeds ``value``
    (``stop = (strike, value)``). Nodes run a batch (one per CPU) at a time, those that added the most
    to the reading the last time first (:func:`_node_order`; else the heaviest weight first).

    Why the partial sum is a lower bound of the final bound: :func:`ring_table` returns
    ``T = (sum_k p_k t_k)(1 + g) + c`` with every weight ``p_k >= 0``, every node table ``t_k >= 0``,
    ``g >= 0`` and the charge ``c >= 0``; :func:`calls_at` / :func:`puts_at` read a table at a strike
    by the same linear interpolation (weights ``1 - f, f >= 0``, from the strike grid, which every node
    shares) times ``1 + 4u`` (or the last node, or ``inf`` beyond a put table), so the reading of ``T``
    is at least ``sum_k p_k (reading of t_k)`` over *all* nodes, hence over those computed so far, in
    any order. The float sums of a few dozen non-negative terms are within ``~30 u`` of the exact ones:
    :data:`_EXIT_MARGIN` covers them. So ``None`` only where the whole table's reading is above
    ``value`` -- where the caller would find the member cannot win (tests: the same answers with and
    without ``stop``). The order only decides how soon that is proved: the tables returned are summed
    in node order by the caller, the same bits in any order."""
    from dpmf.resources import available_cpus

    strike, value = stop
    read = calls_at if kind == "call" else puts_at
    order = _node_order(hint, ps)
    cpus = max(1, available_cpus())
    # (where the exit came after `needed` nodes the last time, the batches end there: no node past it
    # computed beside the last one needed -- CPU time that the exit would throw away)
    needed = None if hint is None else _NODES_NEEDED.get(hint)
    results: list = [None] * len(xs)
    shares = np.full(len(xs), np.nan)
    lower, done = 0.0, 0
    try:
        while done < len(order):
            batch = min(cpus, needed - done) if needed is not None and done < needed else cpus
            part = order[done : done + batch]
            done += len(part)
            for k, res in zip(part, on_threads(node, [xs[k] for k in part])):
                results[k] = res
                shares[k] = float(ps[k]) * float(read(res[0], res[1], strike))
                lower += shares[k]
            if lower * (1 - _EXIT_MARGIN) > value:  # (the fewest of these nodes, in order, that prove it)
                _remember_needed(hint, 1 + int(np.argmax(np.cumsum(shares[order[:done]]) * (1 - _EXIT_MARGIN) > value)))
                return None
        _remember_needed(hint, None)
        return results
    finally:
        _remember_order(hint, shares)


#: What each node of a mixed table added to its reading the last time (:func:`_mixed_tables`), by
#: ``(surrogate, slots, kind, nodes, grid)`` and by ``(kind, nodes, grid)`` for a member not seen yet:
#: only the *order* in which nodes are computed (an early exit comes sooner when the nodes that carry the
#: reading -- above the weights' centre for a call at a far strike -- come first), never a result.
#: On the README snippet's near-root evaluations: the ring family's picked member exits after 7 of 13
#: nodes instead of 10, its coarse ranking's members after 1-2 of 7 instead of 2-4.
_NODE_SHARES: dict = {}
_NODE_SHARES_MAX = 512


#: How many nodes the last exit of a member's table needed (``None``: no exit), by the key of
#: :data:`_NODE_SHARES`: only where the batches of :func:`_mixed_tables` end.
_NODES_NEEDED: dict = {}


def _remember_needed(hint, done: int | None) -> None:
    if hint is not None:
        if len(_NODES_NEEDED) >= _NODE_SHARES_MAX:
            _NODES_NEEDED.clear()
        _NODES_NEEDED[hint] = done


def _node_order(hint, ps) -> list[int]:
    """The nodes in the order :func:`_mixed_tables` computes them: by the share each added to the
    reading of the last table of the same member (or of any member of the same shape), largest first;
    nodes without a share (not computed then) after those with one, heaviest weight first."""
    key = range(len(ps))
    known = None if hint is None else (_NODE_SHARES.get(hint) or _NODE_SHARES.get(hint[2:]))
    if known is None or len(known) != len(ps):
        return sorted(key, key=lambda k: (-float(ps[k]), k))
    return sorted(key, key=lambda k: (math.isnan(known[k]), -(0.0 if math.isnan(known[k]) else known[k]),
                                      -float(ps[k]), k))


def _remember_order(hint, shares: np.ndarray) -> None:
    """Keep the shares computed (:func:`_node_order`); a node not computed keeps its share of before."""
    if hint is None or np.all(np.isnan(shares)):
        return
    if len(_NODE_SHARES) >= _NODE_SHARES_MAX:
        _NODE_SHARES.clear()
    old = _NODE_SHARES.get(hint)
    new = tuple(float(v) if not math.isnan(v) or old is None or len(old) != len(shares) else old[k]
                for k, v in enumerate(shares))
    _NODE_SHARES[hint] = _NODE_SHARES[hint[2:]] = new


def factor_half_width(sur, sigma: float, delta: float) -> float:
    """``L`` for the shared factor's grid: the part above ``L`` (charged in closed form) costs at most
    about ``1e-3 delta`` per slot: ``L = max a_i / sigma + Phi^-1(1 - 1e-3 delta)``, within ``[4, 8]``
    (any ``L`` is sound; it only sets the charge)."""
    if sur.anchor is not None:
        a = (sur.alpha + max(sur.anchor)) / sigma
    else:
        a = float(sur.loadings(max(2, 2 * sur.ring[2])).max()) / sigma
    return min(8.0, max(4.0, a + float(special.ndtri(1 - 1e-3 * delta)) if delta < 1 else 4.0))


def puts_at(strikes: np.ndarray, puts: np.ndarray, k) -> np.ndarray:
    """Linear interpolation of the (convex, non-decreasing) put bound at strikes ``k`` (array),
    position rounded up; ``inf`` beyond the table."""
    h = strikes[1] - strikes[0]
    pos = np.asarray(k, dtype=np.float64) / h * (1 + 8 * UNIT_ROUNDOFF) + 8 * UNIT_ROUNDOFF
    last = puts.size - 1
    j = np.minimum(np.floor(pos), last - 1).astype(np.int64)
    f = pos - j
    val = ((1 - f) * puts[j] + f * puts[np.minimum(j + 1, last)]) * (1 + 4 * UNIT_ROUNDOFF)
    return np.where(pos > last, np.inf, val)


def calls_at(strikes: np.ndarray, calls: np.ndarray, k) -> np.ndarray:
    """Linear interpolation of the (convex, non-increasing) call bound at strikes ``k`` (array; an
    upper bound between nodes; the position is rounded toward the smaller strike); beyond the table
    the call is at most its last node value (non-increasing)."""
    h = strikes[1] - strikes[0]
    pos = np.maximum(np.asarray(k, dtype=np.float64) / h * (1 - 8 * UNIT_ROUNDOFF) - 8 * UNIT_ROUNDOFF, 0.0)
    last = calls.size - 1
    j = np.minimum(np.floor(pos), last - 1).astype(np.int64)
    f = np.minimum(pos - j, 1.0)
    val = ((1 - f) * calls[j] + f * calls[j + 1]) * (1 + 4 * UNIT_ROUNDOFF)
    return np.where(pos >= last, calls[-1], val)


def _interp_put(strikes: np.ndarray, puts: np.ndarray, k: float) -> float:
    """:func:`puts_at` at one strike."""
    return float(puts_at(strikes, puts, k))


def _interp_call(strikes: np.ndarray, calls: np.ndarray, k: float, b: int) -> float:
    """:func:`calls_at` at one strike."""
    return float(calls_at(strikes, calls, k))


def _tables_below(sur: Surrogate, sigma: float, parts, delta: float, kind: str, *, n_fn, mult: float, k_max, grid):
    """``[(n, w, table), ...]`` of the ``kind`` tables of ``parts`` for :func:`markov_epsilon`, or ``None``
    once the tables computed (whole or in part) prove that its check at ``eps_hi`` fails:
    ``sum_parts w mult reading(table, n_fn(n)) / n > delta`` (``mult``: ``1`` for the call, ``e^eps_hi``
    for the put; then the direction is ``inf``, the member cannot win). The sum's terms are non-negative,
    so the parts done are a lower bound of it, and each table is told (``stop``) how much of ``delta``
    is left (a surrogate whose table mixes nodes stops it early, :func:`_mixed_tables`; the others
    ignore it). Where no exit is proved the tables are those computed without it, bit for bit."""
    read = calls_at if kind == "call" else puts_at
    out, lower = [], 0.0
    for n, w in parts:
        if lower * (1 - _EXIT_MARGIN) > delta:
            return None
        strike = n_fn(n)
        value = (delta - lower * (1 - _EXIT_MARGIN)) * n / (w * mult) if w > 0 else math.inf
        table = sur.table(sigma, n, kind, k_max(n), delta, stop=(strike, value), **grid)
        if table is None:
            return None
        out.append((n, w, table))
        lower += w * mult * float(read(table[0], table[1], strike)) / n
    return out


def markov_epsilon(sur: Surrogate, sigma: float, parts, delta: float, eps_hi: float, *,
                   directions=("remove", "add"), below: float | None = None, **grid) -> dict:
    """The smallest epsilon (both directions) the surrogate's call and put tables certify, searched
    in ``[0, eps_hi]``; a direction is ``inf`` if ``eps_hi`` is not certified (the member cannot win).

    ``parts``: ``b`` (one sum of ``b`` slots) or ``[(n, weight), ...]`` (the Jensen mixture over
    residue classes, :func:`~.markov_fit.class_grams`). remove: ``sum w C~_n(n e^eps) / n <= delta``; add:
    ``sum w e^eps P~_n(n e^-eps) / n <= delta``. ``directions``: the ones to compute (the others are
    left out of ``epsilon_by_direction``, and ``epsilon`` is the largest computed).

    ``below`` (``<= eps_hi``): a direction is also ``inf`` when ``below`` is not certified -- its
    epsilon would be above ``below`` (the check is non-increasing in epsilon) -- and its tables stop
    as soon as that is proved (:func:`_tables_below`). The tables' strike grids still follow
    ``eps_hi``, so a direction that is not ``inf`` has the epsilon it has without ``below``, bit for
    bit (:func:`~.markov_ring.pick` ranks a family this way).

    Memoized (:data:`_RESULTS`) by every input: a calibration runs the members that mattered at a
    noise twice there (to steer its search, then the whole accountant: :mod:`..pld`), bit for bit the
    same result."""
    parts = [(int(n), float(w)) for n, w in parts] if isinstance(parts, (list, tuple)) else [(int(parts), 1.0)]
    key = (sur, float(sigma), tuple(parts), float(delta), float(eps_hi), tuple(directions),
           None if below is None else float(below), tuple(sorted(grid.items())))
    return _RESULTS.get(key, lambda: _markov_epsilon(sur, sigma, parts, delta, eps_hi, directions, below, grid),
                        copy_out=True)


#: :func:`markov_epsilon`'s last results (small dicts) by their inputs (the surrogates are frozen:
#: equal members hash equal).
_RESULTS = BoundedMemo(256)


def _markov_epsilon(sur: Surrogate, sigma: float, parts: list, delta: float, eps_hi: float, directions, below,
                    grid: dict) -> dict:
    e_stop = eps_hi if below is None else min(float(below), eps_hi)
    calls = (_tables_below(sur, sigma, parts, delta, "call", n_fn=lambda n: n * math.exp(e_stop), mult=1.0,
                           k_max=lambda n: n * math.exp(eps_hi) * 1.02, grid=grid) if "remove" in directions else [])
    puts = (_tables_below(sur, sigma, parts, delta, "put", n_fn=lambda n: n / math.exp(e_stop), mult=math.exp(e_stop),
                          k_max=lambda n: n * 1.0001, grid=grid) if "add" in directions else [])

    def rem(e):
        return sum(w * _interp_call(st, ca, n * math.exp(e), n) / n for n, w, (st, ca) in calls) * (1 + 4 * (len(calls) + 1) * UNIT_ROUNDOFF)

    def add(e):
        ee = math.exp(e)
        return sum(w * ee * _interp_put(ps, pu, n / ee) / n for n, w, (ps, pu) in puts) * (1 + 4 * (len(puts) + 2) * UNIT_ROUNDOFF)

    out = {}
    for name, fn in (("remove", rem), ("add", add)):
        if name not in directions:
            continue
        # (None: proved above, tables cut short)
        if (calls if name == "remove" else puts) is None or fn(eps_hi) > delta or (e_stop < eps_hi and fn(e_stop) > delta):
            out[name] = math.inf
            continue
        lo, hi = 0.0, eps_hi
        if fn(0.0) <= delta:
            out[name] = 0.0
            continue
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if fn(mid) <= delta else (mid, hi)
        if fn(hi) > delta:  # (cannot happen: hi is always a point that passed)
            raise NumericalError(f"markov_epsilon: bisection end {hi} not certified")
        out[name] = hi
    return {"epsilon": max(out.values()), "epsilon_by_direction": out}
