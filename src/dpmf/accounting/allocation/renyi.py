r"""Rényi accountant for random allocation: the dynamic program of Alg. 1 and the add bound.

Schuchardt & Kalinin (arXiv 2601.21636), Sec. 3 and App. B.1/C; digest
``notes/random-allocation.md`` §3.1-§3.3 (typos T1, T4, T5, T15 corrected here).

**Remove direction** (Lemma 3.2, T1 corrected). For the pair of
:mod:`~dpmf.accounting.allocation.dominating_pair` with Gram matrix ``G`` (``b x b``),

    R_a(P || Q) = (1/(a-1)) [ log sum_{(r_1..r_a) in [b]^a} exp( sum_{j1 != j2} G_{r_j1 r_j2} / (2 s^2) )
                              - a log b ],

or, with per-step counts ``c_j`` (``sum_j c_j = a``),
``log a! + log sum_c prod_j (1/c_j!) exp( sum_j c_j (c_j - 1) G_jj / (2 s^2) + sum_{i<j} G_ij c_i c_j / s^2 )``
in place of the log of the tuple sum. When ``G`` is cyclically ``p``-banded the sum over ``c`` is a
cyclic chain: a dynamic program over positions ``0..b-1`` keeps the running total ``m`` and the
last ``p - 1`` counts, after fixing the first ``p - 1`` counts (the prefix) so that the pairs
closing the cycle can be added at the end (Alg. 1, updates T4/T5 corrected).

*Exactness.* The paper's closure adds ``G_{i, b-1-j} l_i r_j`` for *every* prefix position ``i``
and every last-window position ``b-1-j``; when ``b < 3p - 3`` some of those pairs lie within
distance ``p - 1`` and were already counted by the forward pass (T15: an over-estimate, still
sound). We add a closure pair only when its linear distance is ``>= p`` (``closure="exact"``,
the default), which makes the program exact for every cyclically ``p``-banded ``G`` with
``p <= b``; ``closure="paper"`` reproduces Alg. 1 literally (exact iff ``b >= 3p - 3``).

*One pass, every order.* The interaction terms do not depend on the order ``a``: the program run
up to a total of ``A`` counts yields the sum for every ``a <= A`` at once (read off at ``m = a``).

*Effective bandwidth* (App. B.1). For a non-banded (or widely banded) ``G`` the program runs on
``G^(p)`` (:func:`~dpmf.accounting.allocation.dominating_pair.band_truncation`) and adds
``a tau / (2 s^2)``: an upper bound. Cost: about ``b * C(A + 2p, 2p)`` log-sum-exp terms
(``O(b p A^{2p})`` in the paper's words); memory ``O(C(A + 2p - 1, 2p - 1))``.

**Add direction** (Lemma 3.4, AM-GM): ``R_a(Q || P) <= (1/(2 b s^2)) sum_j G_jj +
((a - 1)/(2 b^2 s^2)) sum_{ij} G_ij``.

**Conversion** (Thm. 3.1, Canonne-Kamath-Steinke) with
:func:`dpmf.privacy.rdp.rdp_to_epsilon`, separately per direction (each direction's bound is a
valid bound on its own hockey-stick divergence; taking the worst epsilon afterwards is never
looser than the paper's Alg. 3, which converts ``max(rho_remove, rho_add)``).

**Soundness of the floating point.** Each returned ``rho`` carries an allowance of
``(b + 16) * 4 ulp`` times the magnitudes summed in the log domain, which covers the rounding of
the log-sum-exp recursion and of the final cancellation ``log S + log a! - a log b``.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
import numpy as np
from scipy import special

from dpmf import progress
from dpmf import validation as _v
from dpmf.accounting.allocation._compiled import step_lse
from dpmf.accounting.allocation.dominating_pair import band_truncation, cyclic_bandwidth, cyclic_distance
from dpmf.accounting.allocation.identity import identity_remove_rdp
from dpmf.errors import InvalidParameterError
from dpmf.privacy.rdp import rdp_to_epsilon

__all__ = [
    "remove_rdp",
    "add_rdp",
    "transition_count",
    "RenyiAllocation",
    "DEFAULT_MAX_ORDER",
    "DEFAULT_BUDGET",
]

#: Largest Rényi order considered by default (integer orders 2..64, as in the digest's O5).
DEFAULT_MAX_ORDER = 64
#: Default work budget per bandwidth level: positions x transitions of the program per sigma.
DEFAULT_BUDGET = 2.0e7
#: Widest effective bandwidth tried automatically.
DEFAULT_MAX_BANDWIDTH = 6
_ULP = np.finfo(np.float64).eps
#: Orders for the closed-form add bound when the caller does not fix the orders.
_ADD_ORDERS = np.concatenate([np.arange(2.0, 257.0), [320.0, 384.0, 512.0, 768.0, 1024.0]])
#: Memory guard: largest program (transitions per position) built on request.
_MAX_TRANSITIONS = 3e7
#: Work (positions x transitions) of each of the small programs behind
#: :meth:`RenyiAllocation.remove_epsilon_lower_bound` (~0.01-0.03 CPU-s each)
LOWER_BOUND_BUDGET = 1.0e6


# --------------------------------------------------------------------------- the program's shape
def transition_count(bandwidth: int, max_order: int) -> int:
    """Transitions per position of the program in its steady state: ``C(A + 2p, 2p)``.

    (States ``(prefix, m, window)`` with ``sum(prefix) + sum(window) <= m <= A``, each with
    ``A - m + 1`` successors.)
    """
    return math.comb(max_order + 2 * bandwidth, 2 * bandwidth)


def _compositions(width: int, total: int) -> np.ndarray:
    """All vectors in N^width with sum <= total (rows)."""
    rows = np.zeros((1, 0), dtype=np.int64)
    for _ in range(width):
        sums = rows.sum(axis=1)
        reps = total - sums + 1
        base = np.repeat(rows, reps, axis=0)
        vals = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
        rows = np.concatenate([base, vals[:, None]], axis=1)
    return rows


@dataclass(frozen=True)
class _Step:
    src: np.ndarray  # source state of each transition (sorted by target), int32
    t: np.ndarray  # count added at the current position, int32
    src_window: np.ndarray  # window counts of each source state (states x (p-1)), float
    starts: np.ndarray  # first transition of each target state
    counts: np.ndarray  # transitions per target state
    targets: np.ndarray  # target states: columns (prefix..., m, window...)

    @functools.cached_property
    def closing(self) -> "_Closing":
        """The target states' sigma-independent parts read when the program ends at this step."""
        return _Closing.of(self.targets, (self.targets.shape[1] - 1) // 2)


@dataclass(frozen=True)
class _Closing:
    """Final states of the program: prefix and window counts (float) and the states grouped by
    their total ``m`` (``order`` sorts them by total; segment ``starts``/``counts``, ``totals``)."""

    pre: np.ndarray
    win: np.ndarray
    order: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    totals: np.ndarray

    @classmethod
    def of(cls, states: np.ndarray, w: int) -> "_Closing":
        totals = states[:, w]
        order = np.argsort(totals, kind="stable")
        tot_sorted = totals[order]
        starts = np.flatnonzero(np.r_[True, tot_sorted[1:] != tot_sorted[:-1]])
        counts = np.diff(np.r_[starts, tot_sorted.size])
        as_float = states.astype(np.float64)
        return cls(np.ascontiguousarray(as_float[:, :w]), np.ascontiguousarray(as_float[:, w + 1 :]), order,
                   starts, counts, tot_sorted[starts])


@dataclass(frozen=True)
class _Shape:
    width: int  # p - 1
    max_order: int
    initial: np.ndarray  # initial states (prefix..., m, window...)
    steps: tuple[_Step, ...]  # steps[j] is used at the j-th position; the last one repeats


@functools.lru_cache(maxsize=32)
def _shape(bandwidth: int, max_order: int) -> _Shape:
    w, amax = bandwidth - 1, max_order
    base = amax + 1
    if (2 * w + 1) * math.log(base) >= 62 * math.log(2):
        raise InvalidParameterError(
            f"bandwidth {bandwidth} with orders up to {max_order} is too large for the dynamic program"
        )
    weights = base ** np.arange(2 * w, -1, -1, dtype=np.int64)
    prefix = _compositions(w, amax)
    initial = np.concatenate([prefix, prefix.sum(axis=1, keepdims=True), prefix], axis=1)
    cur, cur_codes = initial, None
    steps: list[_Step] = []
    for _ in range(bandwidth + 1):
        m = cur[:, w]
        reps = amax - m + 1
        src = np.repeat(np.arange(cur.shape[0]), reps)
        t = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
        # a transition adds t to the total and shifts the window (prefix, m + t, window[1:], t): its code
        # (the target's digits in base amax + 1) is its source's code of those digits plus t times the
        # weights of the total and the newest window digit -- the same int64 sums as the target row's
        # (no row of all transitions is built: only the targets', once sorted)
        keep = np.concatenate([cur[:, :w + 1], cur[:, w + 2 :]], axis=1) if w else cur[:, :1]
        codes = (keep @ np.concatenate([weights[: w + 1], weights[w + 1 : 2 * w]]))[src]
        codes = codes + t * (weights[w] + (weights[2 * w] if w else 0))
        order = np.argsort(codes, kind="stable")  # (transitions grouped by target, targets ascending)
        sorted_codes = codes[order]
        starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        counts = np.diff(np.r_[starts, codes.size])
        uniq = sorted_codes[starts]
        first = order[starts]
        s, tf = cur[src[first]], t[first]
        if w:
            targets = np.concatenate([s[:, :w], (s[:, w] + tf)[:, None], s[:, w + 2 :], tf[:, None]], axis=1)
        else:
            targets = (s[:, 0] + tf)[:, None]
        steps.append(
            _Step(
                src=src[order].astype(np.int32),
                t=t[order].astype(np.int32),
                src_window=np.ascontiguousarray(cur[:, w + 1 :], dtype=np.float64),
                starts=starts,
                counts=counts,
                targets=targets,
            )
        )
        stable = cur_codes is not None and np.array_equal(uniq, cur_codes)
        cur, cur_codes = targets, uniq
        if stable:
            break
    return _Shape(w, amax, initial, tuple(steps))


def _segment_lse(vals: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    mx = np.maximum.reduceat(vals, starts)
    ex = np.exp(vals - np.repeat(mx, counts))
    return mx + np.log(np.add.reduceat(ex, starts))


def _log_sums(gp: np.ndarray, sigma: float, bandwidth: int, max_order: int, closure: str) -> np.ndarray:
    """``log sum_{c: sum c = m} prod_j (1/c_j!) exp(interactions)`` for ``m = 0..max_order``."""
    b = gp.shape[0]
    shape = _shape(bandwidth, max_order)
    w = shape.width
    inv_s2 = 1.0 / (sigma * sigma)
    init = shape.initial.astype(np.float64)
    pre = init[:, :w]
    # initial weights: pairs inside the prefix (positions 0..w-1) and the 1/l_i! factors
    f = -special.gammaln(pre + 1.0).sum(axis=1)
    for i in range(w):
        f += gp[i, i] * pre[:, i] * (pre[:, i] - 1.0) * 0.5 * inv_s2
        for j in range(i + 1, w):
            f += gp[i, j] * pre[:, i] * pre[:, j] * inv_s2
    counts = np.arange(max_order + 1, dtype=np.float64)
    t_pairs, log_t_fact = counts * (counts - 1.0) / 2.0, special.gammaln(counts + 1.0)
    for j, k in enumerate(range(w, b)):  # (b >= p > w: at least one step)
        st = shape.steps[min(j, len(shape.steps) - 1)]
        # v = f[src] + (G_kk t(t-1)/2 + t <window, G[k, k-w:k]>) / sigma^2 - log t!, log-sum-exp per
        # target; the window product per source state (h, in the kernel), the rest per count t (tab)
        tab = (float(gp[k, k]) * t_pairs) * inv_s2 - log_t_fact
        f = step_lse(f, st.src_window, np.ascontiguousarray(gp[k, k - w : k]), inv_s2, st.src, st.t, tab,
                     st.starts, st.counts)
    end = st.closing
    if w:
        pos = b - w + np.arange(w)  # positions of the window entries
        coupling = gp[:w][:, pos].copy()  # coupling[i, q] = G^(p)[i, pos_q]
        if closure == "exact":  # only pairs the forward pass did not count (distance >= p)
            coupling[(pos[None, :] - np.arange(w)[:, None]) < bandwidth] = 0.0
        pairs = np.zeros(f.size)  # sum_{i,q} coupling[i, q] l_i r_q (column by column: a matmul with
        for i, q in zip(*np.nonzero(coupling)):  # w <= 5 columns is ~30x slower here)
            pairs += coupling[i, q] * (end.pre[:, i] * end.win[:, q])
        f = f + pairs * inv_s2
    out = np.full(max_order + 1, -np.inf)
    out[end.totals] = _segment_lse(f[end.order], end.starts, end.counts)
    return out


def remove_rdp(
    gram: np.ndarray,
    noise_multiplier: float,
    bandwidth: int,
    max_order: int,
    *,
    closure: str = "exact",
) -> np.ndarray:
    r"""Upper bounds on ``R_a(P || Q)`` (remove direction) for every integer order ``a = 2..max_order``.

    Alg. 1 of the paper with the corrections of the module docstring, run once for all orders:

        rho(a) = (log S_a + log a! - a log b) / (a - 1) + a tau / (2 sigma^2),

    where ``S_a`` is the count-form sum of Lemma 3.2 over ``G^(p)`` (``p = bandwidth``). Exact
    (up to floating point, rounded up) when ``G`` is cyclically ``p``-banded, an upper bound
    otherwise.

    Args:
      gram: the ``b x b`` Gram matrix of the mixture means (entries >= 0).
      noise_multiplier: ``sigma > 0``.
      bandwidth: effective bandwidth ``p`` in ``[1, b]``.
      max_order: largest order (integer >= 2).
      closure: ``"exact"`` (default) or ``"paper"`` (Alg. 1 literally; see module docstring).

    Returns:
      float64 array ``rho`` of length ``max_order - 1``; ``rho[a - 2]`` is the bound at order ``a``.

    >>> import numpy as np
    >>> rho = remove_rdp(np.eye(100), 1.0, 1, 2)   # DP-SGD, b = 100: log(1 + (e - 1)/100)
    >>> round(float(rho[0]), 10)
    0.0170368632
    """
    g = _v.finite_array("gram", gram, ndim=2)
    if g.shape[0] != g.shape[1]:
        raise InvalidParameterError(f"gram must be square, got shape {g.shape}")
    if np.any(g < 0):
        raise InvalidParameterError(f"gram must have entries >= 0 (non-negative C), got min {float(g.min())!r}")
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    amax = _check_order("max_order", max_order)
    if closure not in ("exact", "paper"):
        raise InvalidParameterError(f"closure must be 'exact' or 'paper', got {closure!r}")
    gp, tau = band_truncation(g, bandwidth)
    return _remove_rdp(gp, tau, sigma, int(bandwidth), amax, closure)


def _remove_rdp(gp: np.ndarray, tau: float, sigma: float, p: int, amax: int, closure: str = "exact") -> np.ndarray:
    return _remove_rdp_slack(gp, tau, sigma, p, amax, closure)[0]


def _remove_rdp_slack(
    gp: np.ndarray, tau: float, sigma: float, p: int, amax: int, closure: str = "exact"
) -> tuple[np.ndarray, np.ndarray]:
    """``(rho, slack)``: the bounds of :func:`remove_rdp` and the rounding allowance each includes (the
    computed value before the allowance is within ``slack`` of the exact program's value)."""
    b = gp.shape[0]
    log_s = _log_sums(gp, sigma, p, amax, closure)[2:]
    a = np.arange(2, amax + 1, dtype=np.float64)
    lf, alb = special.gammaln(a + 1.0), a * math.log(b)
    with np.errstate(invalid="ignore", over="ignore"):
        rho = (log_s + lf - alb) / (a - 1.0)
        slack = (b + 16) * 4.0 * _ULP * (np.abs(log_s) + lf + alb) / (a - 1.0)
        rho = rho + slack + a * tau / (2.0 * sigma * sigma)
    rho = np.where(np.isnan(rho), np.inf, rho)
    return np.maximum(rho, 0.0), slack


def add_rdp(gram: np.ndarray, noise_multiplier: float, orders) -> np.ndarray:
    r"""Lemma 3.4: ``R_a(Q || P) <= sum_j G_jj / (2 b s^2) + (a - 1) sum_ij G_ij / (2 b^2 s^2)``.

    >>> import numpy as np
    >>> round(float(add_rdp(np.eye(100), 1.0, [2])[0]), 12)   # DP-SGD, b = 100: 1/2 + 1/200
    0.505
    """
    g = _v.finite_array("gram", gram, ndim=2)
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    a = np.asarray(orders, dtype=np.float64).reshape(-1)
    if a.size == 0 or np.any(~np.isfinite(a)) or np.any(a <= 1):
        raise InvalidParameterError(f"orders must all be finite and > 1, got {orders!r}")
    return _add_rdp(g, sigma, a)


def _add_rdp(g: np.ndarray, sigma: float, a: np.ndarray) -> np.ndarray:
    return _add_rdp_sums(float(np.trace(g)), float(g.sum()), g.shape[0], sigma, a)


def _add_rdp_sums(diag: float, total: float, b: int, sigma: float, a: np.ndarray) -> np.ndarray:
    """Lemma 3.4 from ``trace(G)``, ``sum(G)`` and ``b`` (``C = I``: ``b``, ``b``, ``b``)."""
    rho = diag / (2.0 * b * sigma**2) + (a - 1.0) * total / (2.0 * b * b * sigma**2)
    return rho * (1.0 + 8.0 * _ULP)  # rounding up


def _check_order(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) and not (
        isinstance(value, float) and value.is_integer()
    ):
        raise InvalidParameterError(f"{name} must be an integer Rényi order >= 2, got {value!r}")
    out = int(value)
    if out < 2:
        raise InvalidParameterError(f"{name} must be an integer Rényi order >= 2 (alpha >= 2), got {value!r}")
    return out


def _check_orders(orders) -> np.ndarray:
    arr = np.asarray(orders, dtype=np.float64).reshape(-1)
    if arr.size == 0 or np.any(~np.isfinite(arr)) or np.any(arr != np.floor(arr)):
        raise InvalidParameterError(f"orders must be integers >= 2 (the program needs integer alpha), got {orders!r}")
    if np.any(arr < 2):
        raise InvalidParameterError(f"orders must be integers >= 2 (alpha >= 2), got min {float(arr.min())!r}")
    return np.unique(arr.astype(np.int64))


# --------------------------------------------------------------------------- the accountant
@dataclass(frozen=True)
class _Level:
    bandwidth: int
    max_order: int
    gp: np.ndarray = field(repr=False)
    tau: float


@dataclass(frozen=True)
class RenyiAllocation:
    """The Rényi accountant for one Gram matrix, with its sigma-independent parts precomputed.

    ``levels`` are the (effective bandwidth ``p``, largest order) pairs the program runs at; at
    each order the smallest bound over the levels that reach it is used (each is a valid upper
    bound). Build with :meth:`create`, or :meth:`identity` for ``G = I_b`` (DP-SGD: nothing
    ``b x b`` is stored and the program is a power of one series,
    :func:`~dpmf.accounting.allocation.identity.identity_remove_rdp`, equal to the general
    program on ``I_b``).
    """

    gram: np.ndarray | None = field(repr=False)
    orders: np.ndarray
    levels: tuple[_Level, ...]
    true_bandwidth: int
    add_orders: np.ndarray = field(repr=False, default=None)
    #: ``b`` when ``G = I_b`` (then ``gram`` is ``None``)
    identity_steps: int | None = None

    @property
    def size(self) -> int:
        """``b``, the steps per epoch (the Gram matrix is ``b x b``)."""
        return int(self.identity_steps) if self.gram is None else int(self.gram.shape[0])

    @classmethod
    def identity(cls, b: int, *, orders=None) -> "RenyiAllocation":
        """The accountant for ``G = I_b`` (one bandwidth-1 level reaching every order)."""
        b = _v.positive_int("b", b)
        ords = _check_orders(np.arange(2, DEFAULT_MAX_ORDER + 1) if orders is None else orders)
        add_orders = ords.astype(np.float64) if orders is not None else np.union1d(ords, _ADD_ORDERS)
        level = _Level(1, int(ords.max()), None, 0.0)
        return cls(gram=None, orders=ords.astype(np.float64), levels=(level,), true_bandwidth=1,
                   add_orders=add_orders, identity_steps=b)

    def _add(self, sigma: float, orders: np.ndarray) -> np.ndarray:
        if self.gram is None:
            b = float(self.identity_steps)
            return _add_rdp_sums(b, b, int(b), sigma, orders)
        return _add_rdp(self.gram, sigma, orders)

    @classmethod
    def create(
        cls,
        gram: np.ndarray,
        *,
        bandwidth: int | None = None,
        orders=None,
        budget: float = DEFAULT_BUDGET,
        max_bandwidth: int = DEFAULT_MAX_BANDWIDTH,
    ) -> "RenyiAllocation":
        """Choose the levels.

        ``bandwidth=None`` (automatic): ``p = 1, 2, ...`` up to the true cyclic bandwidth of ``G``
        (or ``max_bandwidth``); level ``p`` runs up to the largest order whose cost
        ``b * C(A + 2p, 2p)`` stays within ``budget`` (level 1 always reaches every order). An
        explicit ``bandwidth`` runs that single level up to the largest requested order, whatever
        it costs.
        """
        g = _v.finite_array("gram", gram, ndim=2)
        b = g.shape[0]
        if g.shape != (b, b):
            raise InvalidParameterError(f"gram must be square, got shape {g.shape}")
        if np.any(g < 0):
            raise InvalidParameterError("gram must have entries >= 0 (non-negative C)")
        ords = _check_orders(np.arange(2, DEFAULT_MAX_ORDER + 1) if orders is None else orders)
        amax = int(ords.max())
        p_true = cyclic_bandwidth(g)
        if bandwidth is not None:
            p = _v.positive_int("bandwidth", bandwidth)
            if p > b:
                raise InvalidParameterError(
                    f"bandwidth must be an integer in [1, b={b}] (b = steps per epoch), got {p}"
                )
            if transition_count(p, amax) > _MAX_TRANSITIONS:
                raise InvalidParameterError(
                    f"bandwidth={p} with orders up to {amax} needs {transition_count(p, amax):.3g} program "
                    f"states x transitions (limit {_MAX_TRANSITIONS:.0e}); pass smaller orders or bandwidth"
                )
            gp, tau = band_truncation(g, p)
            levels = (_Level(p, amax, gp, tau),)
        else:
            budget = _v.positive("budget", budget)
            levels_l = []
            for p in range(1, min(p_true, _v.positive_int("max_bandwidth", max_bandwidth), b) + 1):
                if p == 1:
                    top = amax
                else:
                    top = 1
                    while top < amax and b * transition_count(p, top + 1) <= budget:
                        top += 1
                if top < 2 or (p > 1 and top < int(ords.min())):
                    break
                gp, tau = band_truncation(g, p)
                levels_l.append(_Level(p, top, gp, tau))
            levels = tuple(levels_l)
        # the add bound is closed form: with default orders it also gets a longer grid (valid for
        # every order > 1; more orders can only lower the converted epsilon)
        add_orders = ords.astype(np.float64) if orders is not None else np.union1d(ords, _ADD_ORDERS)
        return cls(
            gram=g, orders=ords.astype(np.float64), levels=levels, true_bandwidth=p_true, add_orders=add_orders
        )

    def remove(self, noise_multiplier: float, delta: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(rho_remove, bandwidth_used)`` at every order of :attr:`orders`.

        With ``delta``, levels that cannot lower the remove epsilon at ``delta`` are not run (their
        orders keep ``inf`` unless another level reaches them; :meth:`skippable` says when).
        """
        return self._remove(noise_multiplier, delta)[:2]

    def _remove(self, noise_multiplier: float, delta: float | None) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """:meth:`remove` and the bandwidths of the levels it ran."""
        sigma = _v.positive("noise_multiplier", noise_multiplier)
        best = np.full(self.orders.size, np.inf)
        used = np.zeros(self.orders.size, dtype=np.int64)
        b = self.size
        exact = self.exact_level
        # the exact level first: it may show that the others cannot help (only with delta)
        levels = list(self.levels) if delta is None or exact is None else [exact] + [
            lev for lev in self.levels if lev is not exact]
        # work per level ~ b * C(A + 2p, 2p) program terms (shown only when it takes over a second)
        work = [b * transition_count(lev.bandwidth, lev.max_order) for lev in levels]
        ran = []
        with progress.task("Renyi program (random allocation)", total=float(sum(work)), unit="program terms") as bar:
            for k, (lev, w) in enumerate(zip(levels, work)):
                ran.append(lev.bandwidth)
                bar.update(note=f"bandwidth {lev.bandwidth}, orders <= {lev.max_order}, sigma={sigma:.6g}")
                if self.gram is None:
                    rho = identity_remove_rdp(b, sigma, lev.max_order)
                else:
                    rho, slack = _remove_rdp_slack(lev.gp, lev.tau, sigma, lev.bandwidth, lev.max_order)
                reach = self.orders <= lev.max_order
                vals = np.full(self.orders.size, np.inf)
                vals[reach] = rho[self.orders[reach].astype(np.int64) - 2]
                better = vals < best
                best[better], used[better] = vals[better], lev.bandwidth
                bar.advance(w)
                if k == 0 and lev is exact and delta is not None and self.skippable(rho, slack, delta):
                    break
        return best, used, ran

    @property
    def exact_level(self) -> _Level | None:
        """The level whose program is exact (bandwidth = the true cyclic bandwidth, ``tau = 0``), if any."""
        return next((lev for lev in self.levels if lev.bandwidth == self.true_bandwidth and lev.tau == 0.0
                     and self.gram is not None), None)

    def skippable(self, rho_exact: np.ndarray, slack: np.ndarray, delta: float) -> bool:
        r"""Whether the levels other than the exact one cannot lower the remove epsilon at ``delta``.

        ``rho_exact[a - 2]`` is the exact level's bound at order ``a = 2..A`` (the exact ``R_a`` plus at
        most ``2 slack``: the allowance added and the rounding it covers). At orders ``a <= A`` no level
        is below the exact value, so the others can only help at orders ``a > A``. There the Rényi
        divergence is at least ``R_A`` (it is non-decreasing in the order; van Erven & Harremoës 2014,
        Thm. 3), so no bound at such an order is below ``rho_lo = max_a (rho_exact[a] - 2 slack[a])``,
        and (the conversion is non-decreasing in rho) no order ``a > A`` converts to less than
        ``min_{a > A} eps(a, rho_lo)``. When that is not below the epsilon of orders ``<= A`` the other
        levels are skipped: the reported epsilon is what running them would give (up to the rounding
        allowance).
        """
        top = rho_exact.size + 1  # A
        low = self.orders <= top
        if low.all():
            return True
        if not (np.isfinite(rho_exact).all() and np.isfinite(slack).all()):  # (an overflow proves nothing)
            return False
        eps_low, _ = rdp_to_epsilon(self.orders[low], rho_exact[self.orders[low].astype(np.int64) - 2], delta)
        rho_lo = float(np.max(np.maximum(rho_exact - 2.0 * slack, 0.0)))
        high = self.orders[~low]
        eps_high, _ = rdp_to_epsilon(high, np.full(high.size, rho_lo), delta)
        return math.isfinite(eps_low) and eps_high >= eps_low

    def remove_epsilon_lower_bound(self, noise_multiplier: float, delta: float, above: float = math.inf) -> float:
        r"""A lower bound on the remove epsilon :meth:`epsilon` reports at ``delta`` (any levels; also below the
        accountant's joint conversion of ``max(rho_remove, rho_add)``), from small programs only; it returns as
        soon as the bound exceeds ``above``.

        Every level's ``rho`` at order ``a`` is at least the Rényi divergence ``R_a`` of the pair (the exact
        level's is ``R_a``, the others add ``a tau / (2 s^2)`` to a Gram dominating ``G``), and the
        conversion is non-decreasing in ``rho`` order by order, so the epsilon of any ``L_a <= R_a`` is at
        most the reported one. Lower bounds ``L_a``: the count-form sum of Lemma 3.2 is non-decreasing in
        every ``G_ij`` (its exponents weigh them by ``c_i c_j >= 0``), so ``G`` with the entries at cyclic
        distance ``>= p`` set to 0 (all ``>= 0``) gives a smaller sum, and the program on it at bandwidth
        ``p`` is exact (less its rounding allowance, twice, as in :meth:`skippable`). Run up to order
        ``A`` only, ``R_a >= R_A`` for ``a > A`` (non-decreasing in the order) extends it to every order.
        The programs, each within :data:`LOWER_BOUND_BUDGET`: the diagonal (``p = 1``, every order at the
        README sizes) first, then the widest bandwidth (up to the true one and the widest level) that reaches
        order 3 (or the largest order); the larger
        ``L_a`` of the two at each order. On the README pairs the first is enough: bsr(32, 4) over 2 epochs
        at sigma 1.26797, 4.086 (the accountant's 4.230); bsr(100, 4) at 1.47281, 2.133 (2.345).
        """
        sigma = _v.positive("noise_multiplier", noise_multiplier)
        d = _v.open_unit("delta", delta)
        if self.gram is None:  # (G = I_b: the accountant's own program is the cheap one)
            return self.epsilon(sigma, d)["epsilon_by_direction"]["remove"]
        b, top = self.size, int(self.orders.max())
        low = np.zeros(self.orders.size)
        eps = 0.0
        for p, amax in self._lower_bound_programs(top):
            g = np.where(cyclic_distance(b) >= p, 0.0, self.gram)
            rho, slack = _remove_rdp_slack(g, 0.0, sigma, p, amax)
            with np.errstate(invalid="ignore", over="ignore"):
                at = (rho - 2.0 * slack) * (1.0 - 4.0 * _ULP)  # (the subtraction's rounding: down)
            at = np.maximum.accumulate(np.where(np.isfinite(at), np.maximum(at, 0.0), 0.0))  # (R_a rises with a)
            low = np.maximum(low, at[np.minimum(self.orders, amax).astype(np.int64) - 2])
            eps, _ = rdp_to_epsilon(self.orders, low, d)
            if eps > above:
                break
        return eps

    def add_epsilon(self, noise_multiplier: float, delta: float) -> float:
        """The add epsilon of :meth:`epsilon` (closed form: Lemma 3.4 over :attr:`add_orders`), alone."""
        sigma = _v.positive("noise_multiplier", noise_multiplier)
        d = _v.open_unit("delta", delta)
        return rdp_to_epsilon(self.add_orders, self._add(sigma, self.add_orders), d)[0]

    def _lower_bound_programs(self, top: int) -> list[tuple[int, int]]:
        """``(bandwidth, largest order)`` of :meth:`remove_epsilon_lower_bound`'s programs."""
        b = self.size

        def reach(p: int) -> int:  # (the largest order within the budget; 2 at least)
            amax = 2
            while amax < top and b * transition_count(p, amax + 1) <= LOWER_BOUND_BUDGET:
                amax += 1
            return amax

        out = [(1, reach(1))]
        widest = min(self.true_bandwidth, max((lev.bandwidth for lev in self.levels), default=1), b)
        wide = next(((p, reach(p)) for p in range(widest, 1, -1) if reach(p) >= min(3, top)), None)
        return out if wide is None else out + [wide]

    def add(self, noise_multiplier: float) -> np.ndarray:
        """``rho_add`` (Lemma 3.4) at every order of :attr:`orders`."""
        sigma = _v.positive("noise_multiplier", noise_multiplier)
        return self._add(sigma, self.orders)

    def epsilon(self, noise_multiplier: float, delta: float) -> dict:
        """Epsilon per direction at ``delta`` and the details (orders, bandwidths, tau)."""
        start = time.perf_counter()
        d = _v.open_unit("delta", delta)
        rho_r, used, ran = self._remove(noise_multiplier, d)
        rho_a = self._add(_v.positive("noise_multiplier", noise_multiplier), self.add_orders)
        eps_r, a_r = rdp_to_epsilon(self.orders, rho_r, d)
        eps_a, a_a = rdp_to_epsilon(self.add_orders, rho_a, d)
        i_r = int(np.searchsorted(self.orders, a_r)) if math.isfinite(a_r) else 0
        p_r = int(used[i_r]) if math.isfinite(a_r) else 0
        tau_r = next((lev.tau for lev in self.levels if lev.bandwidth == p_r), math.nan)
        return {
            "epsilon": max(eps_r, eps_a),
            "epsilon_by_direction": {"remove": eps_r, "add": eps_a},
            "order": {"remove": a_r, "add": a_a},
            "bandwidth": p_r,
            "tau": tau_r,
            "levels": [(lev.bandwidth, lev.max_order) for lev in self.levels],
            # (the others cannot lower the remove epsilon: RenyiAllocation.skippable)
            "levels_run": sorted(ran),
            "true_bandwidth": self.true_bandwidth,
            "seconds": time.perf_counter() - start,
        }

