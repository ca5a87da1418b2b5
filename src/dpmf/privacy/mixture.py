"""Mixture-of-Gaussians (MoG) mechanisms: a Gaussian mechanism whose sensitivity is random.

Definition (MMCC paper, Defs. 4.1-4.2; ``notes/mmcc.md`` §2.6). Without the example the output is
``N(0, sigma^2)``; with it, a sensitivity ``c`` is drawn (``c = c_i`` with probability ``p_i``,
``c_i >= 0``) and the output is ``N(c, sigma^2)``. The Poisson-subsampled Gaussian is
``c in {0, 1}``, ``p = {1-q, q}``; MMCC's rows, group-level DP-SGD and last-iterate analyses
(App. F.5) are mixtures with many components.

Conventions (this module uses the paper's orientation, mixture at ``+c``):

* remove direction, P = with, Q = without:
  ``L(x) = log sum_i p_i exp((2 c_i x - c_i^2) / (2 sigma^2))``, increasing and convex in ``x``;
* add direction, P = without, Q = with: the loss is ``-L(x)`` with ``x ~ N(0, sigma^2)``.

dp_accounting's ``MixtureGaussianPrivacyLoss`` mirrors the remove mixture to ``-c``; its remove
loss at ``x`` equals ours at ``-x``; the add losses agree.

How the PLD is built (fast and pessimistic)
-------------------------------------------
On the loss grid ``eps_j = j * Delta`` we need the inverse losses ``x_j = L^{-1}(eps_j)`` for the
whole grid at once. ``L`` is convex and increasing, so (1) a monotone table of ``L`` on a few
thousand points gives, by chord interpolation, starting points to the *left* of every root, and
(2) vectorized Newton steps then overshoot once to the right and converge monotonically. No
per-point bisection. ``L`` and ``L'`` come from the compiled kernels of :mod:`._mixture_compiled`
(Horner's rule when the sensitivities lie on a lattice, as MMCC's rows do).

Between consecutive thresholds, each loss interval ``(eps_j, eps_{j+1}]`` carries P-mass ``a_j``
and Q-mass ``b_j``: the Gaussian's from normal tails (the smaller one, so they keep relative
accuracy), the mixture's as ``int phi e^L`` by Gauss-Legendre with a proved error bound, each raised
by it (:func:`_quadrature_masses`; never below the true mass, tested against 40-digit arithmetic). Its mass is split between the two end points so that *both* the P- and the
Q-mass are preserved: ``v = (a - e^{eps_j} b) e^Delta / (e^Delta - 1)`` goes to ``eps_{j+1}``,
``a - v`` to ``eps_j``. This is exactly the connect-the-dots PMF (its hockey-stick curve is the
chord of the true one in ``e^eps``, which lies above it by convexity), so it dominates the exact
PLD. Mass below the grid goes to the lowest point; of the mass above it,
``delta(eps_max) <= 1e-22`` goes to ``+inf``; when the add-direction loss is bounded
(``c_0 = 0``: it never exceeds ``-log p_0``) the last interval instead ends at the grid point
above that bound and nothing goes to ``+inf`` (otherwise composition would charge that mass to
every delta: 4.5e-4 in epsilon after 1000 DP-SGD steps). A relative ``1e-9`` of each interval's mass is
moved to the upper end point on top of the split to cover floating-point error in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from dpmf import validation as _v
from dpmf.errors import NumericalError
from dpmf.privacy.pld import DEFAULT_DISCRETIZATION, PrivacyLossDistribution, dense_pmf

#: Standard-normal quantile beyond which mass is treated as tail (Phi(-10) ~ 7.6e-24).
TAIL_Z = 10.0
#: Extra relative mass moved to the upper end point of each interval (floating-point cover).
SPLIT_SLACK = 1e-9
#: Points x components evaluated per chunk (bounds memory to ~64 MB of float64).
_CHUNK = 1 << 22


@dataclass(frozen=True)
class GaussianMixture:
    """A validated mixture-of-Gaussians mechanism (see the module docstring).

    Components with zero probability are dropped and equal sensitivities merged; ``create``
    validates. ``sensitivities`` are sorted increasingly.
    """

    sensitivities: np.ndarray
    probabilities: np.ndarray
    noise_multiplier: float
    lattice: float = 0.0  # > 0: the sensitivities are (nearly) multiples of it (a hint, checked)

    @classmethod
    def create(cls, sensitivities, probabilities, noise_multiplier: float, lattice: float | None = None) -> "GaussianMixture":
        """Validate and normalize: ``c_i >= 0`` finite, ``p_i in [0, 1]`` summing to 1, ``sigma > 0``.
        ``lattice`` (optional): a step the sensitivities are multiples of (MMCC rows: the product
        mixture's grid), which lets the PLD use the faster lattice evaluator
        (:mod:`dpmf.privacy._mixture_compiled`); it is checked, and ignored when it does not hold."""
        sigma = _v.positive("noise_multiplier", noise_multiplier)
        lattice = 0.0 if lattice is None else _v.positive("lattice", lattice)
        c, p = _v.distribution("sensitivities", sensitivities, "probabilities", probabilities)
        keep = p > 0
        c, p = c[keep], p[keep]
        uniq, inverse = np.unique(c, return_inverse=True)
        merged = np.bincount(inverse, weights=p, minlength=uniq.size)
        uniq, merged = _prune_upward(uniq, merged / merged.sum())
        return cls(uniq, merged, sigma, lattice)

    # ------------------------------------------------------------- standardized units
    @property
    def _s(self) -> np.ndarray:
        return self.sensitivities / self.noise_multiplier

    @property
    def _a(self) -> np.ndarray:
        s = self._s
        return np.log(self.probabilities) - 0.5 * s * s

    @property
    def is_trivial(self) -> bool:
        """True when every sensitivity is 0 (the mechanism reveals nothing)."""
        return bool(self.sensitivities[-1] == 0)

    @property
    def min_loss(self) -> float:
        """Infimum of the remove-direction loss: ``log p_0`` if ``c_0 = 0``, else ``-inf``."""
        return float(np.log(self.probabilities[0])) if self.sensitivities[0] == 0 else -math.inf

    # ------------------------------------------------------------- losses
    def privacy_loss(self, x, direction: str = "remove") -> np.ndarray:
        """Privacy loss at output ``x`` (original units) in the given direction."""
        u = np.asarray(x, dtype=np.float64) / self.noise_multiplier
        loss = _lse(u, self._a, self._s)[0]
        if direction == "remove":
            return loss
        if direction == "add":
            return -loss
        raise _v.InvalidParameterError(f"direction must be 'remove' or 'add', got {direction!r}")

    def inverse_privacy_loss(self, losses) -> np.ndarray:
        """``x`` (original units) with remove-direction loss ``L(x) = loss``, vectorized.

        Losses must exceed :attr:`min_loss`.
        """
        target = np.asarray(losses, dtype=np.float64)
        if np.any(target <= self.min_loss):
            raise _v.InvalidParameterError(f"losses must exceed the minimum loss {self.min_loss!r}")
        return _inverse_loss(self._a, self._s, target) * self.noise_multiplier

    # ------------------------------------------------------------- exact profile
    def delta(self, epsilon: float, direction: str | None = None) -> float:
        """Exact hockey-stick divergence at ``epsilon`` (worst direction unless one is named)."""
        epsilon = _v.non_negative("epsilon", epsilon)
        if direction is None:
            return max(self.delta(epsilon, "remove"), self.delta(epsilon, "add"))
        if self.is_trivial:
            return 0.0
        s, p = self._s, self.probabilities
        if direction == "remove":
            if epsilon <= self.min_loss:
                return -math.expm1(epsilon)
            u = float(_inverse_loss(self._a, s, np.array([epsilon]))[0])
            val = float(np.dot(p, special.ndtr(s - u))) - math.exp(epsilon) * special.ndtr(-u)
        elif direction == "add":
            if -epsilon <= self.min_loss:
                return 0.0
            y = float(_inverse_loss(self._a, s, np.array([-epsilon]))[0])
            val = special.ndtr(y) - math.exp(epsilon) * float(np.dot(p, special.ndtr(y - s)))
        else:
            raise _v.InvalidParameterError(f"direction must be 'remove' or 'add', got {direction!r}")
        return min(1.0, max(0.0, float(val)))

    # ------------------------------------------------------------- PLD
    def pld(self, discretization: float = DEFAULT_DISCRETIZATION) -> PrivacyLossDistribution:
        """The pessimistic PLD (both directions) on the grid ``k * discretization``."""
        disc = _v.positive("discretization", discretization)
        if self.is_trivial:
            return PrivacyLossDistribution.identity(disc)
        remove, add = self._pmfs(disc)
        return PrivacyLossDistribution(remove, add)

    def _pmfs(self, disc: float):
        """Both directions' PMFs from one shared set of thresholds.

        The remove direction needs ``L^{-1}(j Delta)``, the add direction ``L^{-1}(-j Delta)``:
        the same lattice of loss levels. We solve and integrate once over the union.
        """
        a, s, p = self._a, self._s, self.probabilities
        lo_u, hi_u = _mixture_tail_points(s, p)  # remove: P = mixture
        l_lo, l_hi = _lse(np.array([lo_u, hi_u]), a, s)[0]
        y_lo, y_hi = -TAIL_Z, TAIL_Z  # add: P = N(0, 1)
        l_ylo, l_yhi = _lse(np.array([y_lo, y_hi]), a, s)[0]
        floor_idx = math.floor(self.min_loss / disc) + 1 if math.isfinite(self.min_loss) else -(1 << 62)
        # remove grid j*disc, add grid j*disc (its L-levels are -j*disc); all L-levels > min_loss
        jr_lo, jr_hi = max(math.floor(l_lo / disc), floor_idx), math.ceil(l_hi / disc)
        ja_lo, ja_hi = math.floor(-l_yhi / disc), min(math.ceil(-l_ylo / disc), -floor_idx)
        i0, i1 = min(jr_lo, -ja_hi), max(jr_hi, -ja_lo)
        levels = np.arange(i0, i1 + 1) * disc
        lo, hi = min(lo_u, y_lo), max(hi_u, y_hi)
        evaluate = _compiled_loss(a, s, self.lattice / self.noise_multiplier, lo, hi)
        u = _inverse_loss(a, s, levels, table_range=(lo, hi), evaluate=evaluate)
        _, g_mid, _ = _gaussian_interval_masses(u)
        m_mid = _quadrature_masses(u, s, p, evaluate)

        # remove: P = mixture, Q = N(0, 1), grid j in [jr_lo, jr_hi] = union block [r0, r1]
        r0, r1 = jr_lo - i0, jr_hi - i0
        m_below, _ = _point_tails(u[r0], s, p)
        _, m_above = _point_tails(u[r1], s, p)
        _, g_above = _point_tails(u[r1], np.zeros(1), np.ones(1))
        eps_r = levels[r0 : r1 + 1]
        probs, inf_mass = _connect_the_dots(eps_r, disc, m_below, m_mid[r0:r1], m_above, g_mid[r0:r1], g_above)
        remove = dense_pmf(jr_lo, probs, inf_mass, disc)

        # add: P = N(0, 1), Q = mixture; add loss j*disc sits at union index -j - i0 (reversed)
        a0, a1 = -ja_hi - i0, -ja_lo - i0
        _, g_above_a1 = _point_tails(u[a1], np.zeros(1), np.ones(1))
        g_below_a0, _ = _point_tails(u[a0], np.zeros(1), np.ones(1))
        m_below_a0, _ = _point_tails(u[a0], s, p)
        eps_a = np.arange(ja_lo, ja_hi + 1) * disc
        p_mid_a, q_mid_a = g_mid[a0:a1][::-1], m_mid[a0:a1][::-1]
        p_top, q_top = g_below_a0, m_below_a0
        if math.isfinite(self.min_loss) and ja_hi == -floor_idx:
            # the add loss never exceeds -log p_0 <= (1 - floor_idx) * disc: the remaining mass is
            # one more interval ending at that grid point, not mass at +inf. Only when the grid
            # reaches -floor_idx: otherwise (the tail point cut the grid lower) that point is more
            # than one step above the last one, and appending it would place the interval's mass one
            # step up instead of at its end (optimistic); the mass (P-mass below the tail point,
            # <= Phi(-TAIL_Z)) then stays at +inf, which is pessimistic.
            eps_a = np.append(eps_a, (1 - floor_idx) * disc)
            p_mid_a, q_mid_a = np.append(p_mid_a, p_top), np.append(q_mid_a, q_top)
            p_top, q_top = 0.0, 0.0
        probs, inf_mass = _connect_the_dots(eps_a, disc, g_above_a1, p_mid_a, p_top, q_mid_a, q_top)
        add = dense_pmf(ja_lo, probs, inf_mass, disc)
        return remove, add


def mixture_of_gaussians(
    sensitivities,
    probabilities,
    noise_multiplier: float,
    *,
    discretization: float = DEFAULT_DISCRETIZATION,
    lattice: float | None = None,
) -> PrivacyLossDistribution:
    """Pessimistic PLD of the mixture-of-Gaussians mechanism, both adjacency directions.

    Parameters mirror dp_accounting's ``from_mixture_gaussian_mechanism(standard_deviation,
    sensitivities, sampling_probs)``: ``sensitivities`` ``c_i >= 0``, ``probabilities`` ``p_i``
    summing to 1, Gaussian noise with standard deviation ``noise_multiplier``. ``lattice``: a step
    the sensitivities are multiples of, if known (a speed hint, checked; :meth:`GaussianMixture.create`).

    >>> pld = mixture_of_gaussians([0, 1], [0.99, 0.01], 1.0).self_compose(1000)
    >>> round(pld.epsilon(1e-6), 3)   # DP-SGD, q = 0.01, sigma = 1, 1000 steps
    2.125
    """
    mech = GaussianMixture.create(sensitivities, probabilities, noise_multiplier, lattice)
    return mech.pld(discretization)


# ============================================================================ numerics
#: Mass that pruning may move up on each side of the support (changes any delta by <= this, upward).
PRUNE_MASS = 1e-24


def _prune_upward(c: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop negligible components by moving their mass to a *larger* sensitivity.

    The lowest components holding together <= ``PRUNE_MASS`` go into the next kept component; the
    highest components (below the maximum) holding <= ``PRUNE_MASS`` go into the maximum one. The
    result stochastically dominates the input (MMCC Cor. B.3), so its PLD dominates too; any delta
    grows by at most ``2 * PRUNE_MASS``. The maximum sensitivity is always kept.
    """
    if c.size <= 2:
        return c, p
    low = np.cumsum(p)
    i_lo = int(np.searchsorted(low, PRUNE_MASS, side="right"))  # p[:i_lo] sum <= PRUNE_MASS
    high = np.cumsum(p[-2::-1])  # masses of p[-2], p[-3], ... accumulated from the top
    n_hi = int(np.searchsorted(high, PRUNE_MASS, side="right"))  # p[-1-n_hi:-1] sum <= PRUNE_MASS
    i_hi = c.size - 1 - n_hi  # exclusive end of the kept middle block
    if i_lo >= i_hi:
        return c, p
    mid_c, mid_p = c[i_lo:i_hi].copy(), p[i_lo:i_hi].copy()
    mid_p[0] += p[:i_lo].sum()
    top_p = p[i_hi:].sum()
    return np.append(mid_c, c[-1]), np.append(mid_p, top_p)


def _lse(u: np.ndarray, a: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``L(u) = logsumexp_i(a_i + s_i u)`` and ``L'(u) = sum_i softmax_i * s_i``, chunked."""
    u = np.asarray(u, dtype=np.float64)
    flat = u.ravel()
    loss = np.empty_like(flat)
    slope = np.empty_like(flat)
    step = max(1, _CHUNK // max(1, a.size))
    for start in range(0, flat.size, step):
        chunk = flat[start : start + step]
        z = a[None, :] + chunk[:, None] * s[None, :]
        zmax = z.max(axis=1, keepdims=True)
        w = np.exp(z - zmax)
        tot = w.sum(axis=1)
        loss[start : start + step] = zmax[:, 0] + np.log(tot)
        slope[start : start + step] = (w @ s) / tot
    return loss.reshape(u.shape), slope.reshape(u.shape)


#: Points of the monotone table that starts Newton's method (a start left of the root suffices;
#: more points only save Newton steps, which cost the same per target as a table point): at least
#: this many, and one per ``_TARGETS_PER_TABLE_POINT`` targets up to ``_TABLE_POINTS_MAX`` (a row of
#: MMCC BandMF-16 x 500 at sigma 1, 8.8e5 levels: the chord start is then ~1e-7 from the root and
#: Newton takes ~1.5 fewer steps, 0.12 -> 0.085 s).
_TABLE_POINTS = 2049
_TABLE_POINTS_MAX = 65537
_TARGETS_PER_TABLE_POINT = 16


def _inverse_loss(
    a: np.ndarray, s: np.ndarray, target: np.ndarray, table_range: tuple[float, float] | None = None,
    evaluate=None,
) -> np.ndarray:
    """Solve ``L(u) = target`` for every entry (standardized units), vectorized Newton.

    Start: chord interpolation in a monotone table of ``L`` (left of the root, by convexity),
    then Newton steps: the first overshoots to the right of the root, later ones decrease
    monotonically onto it. Each step is clamped to the table bracket. ``evaluate(u) -> (L, L')``
    (default :func:`_lse`; :func:`_compiled_loss` for PLDs).
    """
    target = np.asarray(target, dtype=np.float64)
    if evaluate is None:
        def evaluate(x):
            return _lse(x, a, s)
    if s.size == 1 or np.all(s == s[0]):  # single Gaussian: L is linear
        return (target - _logsumexp(np.ravel(a))) / s[0]
    lo, hi = table_range if table_range is not None else _bracket(a, s, target)
    lo, hi = _widen(a, s, target, lo, hi)
    grid = np.linspace(lo, hi, max(_TABLE_POINTS, min(_TABLE_POINTS_MAX, target.size // _TARGETS_PER_TABLE_POINT + 1)))
    table = evaluate(grid)[0]
    table = np.maximum.accumulate(table)  # enforce monotone against round-off
    u = np.interp(target, table, grid)
    idx = np.clip(np.searchsorted(table, target, side="left"), 1, grid.size - 1)
    left, right = grid[idx - 1], grid[idx]
    kernel = getattr(evaluate, "kernel", None)
    if kernel is not None and target.ndim == 1:
        # the same steps compiled, a block of points at a time (no numpy pass per step)
        from dpmf.privacy._mixture_compiled import newton_inverse

        if not newton_inverse(np.ascontiguousarray(target), u, left, right, *kernel):
            raise NumericalError("inverse privacy loss: Newton iteration did not converge")
        return u
    active = np.ones(target.shape, dtype=bool)
    for _ in range(60):
        ua = u[active]
        val, der = evaluate(ua)
        resid = val - target[active]
        with np.errstate(divide="ignore", invalid="ignore"):
            new = ua - resid / der
        new = np.where(np.isfinite(new), new, ua)
        new = np.clip(new, left[active], right[active])
        moved = np.abs(new - ua)
        u[active] = new
        # Done when the loss matched to a few ulps, or the step was below 1e-9: Newton's quadratic
        # convergence then leaves an error of order 1e-18 (harmless next to float rounding).
        still = (moved > 1e-9 * np.maximum(1.0, np.abs(new))) & (
            np.abs(resid) > 8 * np.finfo(float).eps * np.maximum(1.0, np.abs(target[active]))
        )
        idx_active = np.flatnonzero(active)
        active[idx_active[~still]] = False
        if not active.any():
            return u
    raise NumericalError("inverse privacy loss: Newton iteration did not converge")


def _bracket(a: np.ndarray, s: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    return float(-TAIL_Z - 1.0), float(s[-1] + TAIL_Z + 1.0)


def _widen(a, s, target, lo, hi):
    """Grow ``[lo, hi]`` until ``L(lo) <= min(target)`` and ``L(hi) >= max(target)``."""
    tmin, tmax = float(np.min(target)), float(np.max(target))
    width = max(1.0, hi - lo)
    for _ in range(200):
        llo, lhi = _lse(np.array([lo, hi]), a, s)[0]
        if llo <= tmin and lhi >= tmax:
            return lo, hi
        if llo > tmin:
            lo -= width
        if lhi < tmax:
            hi += width
        width *= 2
    raise NumericalError("inverse privacy loss: could not bracket the target losses")


def _mixture_tail_points(s: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """``(lo, hi)`` with mixture mass below ``lo`` and above ``hi`` each <= ``Phi(-TAIL_Z)``.

    Bisection on the mixture tails (not ``s_max + z``), so a far component with negligible
    probability does not stretch the loss grid. The mass outside is handled pessimistically by
    the caller (below: to the lowest grid point; above: split by ``delta(eps_max)`` to +inf).
    """
    log_tau = float(special.log_ndtr(-TAIL_Z))
    log_p = np.log(p)

    def log_upper(u: float) -> float:
        return _logsumexp(log_p + special.log_ndtr(s - u))

    def log_lower(u: float) -> float:
        return _logsumexp(log_p + special.log_ndtr(u - s))

    def bisect(f, lo: float, hi: float, want_low_side: bool) -> float:
        # f is monotone; return the end of [lo, hi] on the safe side after narrowing. The end
        # only places the grid, so 1e-9 (standardized units) is ample; the invariant holds at
        # every step, so stopping early is as sound as running to float resolution.
        for _ in range(80):
            if hi - lo <= 1e-9 * max(1.0, abs(lo), abs(hi)):
                break
            mid = 0.5 * (lo + hi)
            if (f(mid) <= log_tau) == want_low_side:
                hi = mid
            else:
                lo = mid
        return hi if want_low_side else lo

    hi = bisect(log_upper, s[0] - TAIL_Z, s[-1] + TAIL_Z, True)  # smallest hi with upper <= tau
    lo = bisect(log_lower, s[0] - TAIL_Z, s[-1] + TAIL_Z, False)  # largest lo with lower <= tau
    return lo, hi


def _gaussian_interval_masses(z: np.ndarray) -> tuple[float, np.ndarray, float]:
    """Standard-normal masses below ``z[0]``, in each ``[z_j, z_{j+1}]``, and above ``z[-1]``.

    Each mass is formed from the smaller tail ``ndtr(-|z|)``, so it keeps relative accuracy in
    both tails (no ``1 - 1`` cancellation).
    """
    tail = special.ndtr(-np.abs(z))
    neg = z < 0
    lo_t, hi_t = tail[:-1], tail[1:]
    both_neg = neg[1:]  # z_j < z_{j+1} < 0 (z increasing)
    both_pos = ~neg[:-1]
    mid = np.where(both_neg, hi_t - lo_t, np.where(both_pos, lo_t - hi_t, 1.0 - lo_t - hi_t))
    mid = np.maximum(mid, 0.0)
    below = float(tail[0] if neg[0] else 1.0 - tail[0])
    above = float(tail[-1] if not neg[-1] else 1.0 - tail[-1])
    return below, mid, above


#: Largest ``(lattice span + 1) / components`` at which :func:`_compiled_loss` uses Horner's rule
#: (one fused multiply-add per lattice point against one exponential per component).
_LATTICE_DENSITY = 8
#: Most centers x lattice points (the coefficient table of the lattice evaluator, float64).
_LATTICE_TABLE = 1 << 22


def _compiled_loss(a: np.ndarray, s: np.ndarray, h: float, lo: float, hi: float):
    """``evaluate(u) -> (L(u), L'(u))`` by the compiled kernels (:mod:`._mixture_compiled`): Horner's
    rule on the lattice ``s_i = s_0 + d_i h`` when ``h > 0`` fits the sensitivities (to 1e-9
    relative) densely enough, with centers covering ``[lo, hi]``; else one exponential per
    component. Both agree with :func:`_lse` to rounding (tests)."""
    from dpmf.privacy._mixture_compiled import direct_loss, lattice_loss, lattice_loss_values

    a = np.ascontiguousarray(a, dtype=np.float64)
    s = np.ascontiguousarray(s, dtype=np.float64)
    plan, h = _lattice_plan(a, s, h, lo, hi) if h > 0 and s.size > 1 else (None, h)

    def evaluate(u, slope: bool = True):
        u = np.ascontiguousarray(u, dtype=np.float64)
        flat = u.ravel()
        loss, slopes = np.empty_like(flat), np.empty_like(flat)
        if plan is None:
            direct_loss(flat, a, s, loss, slopes)
        else:
            centers, beta, mc = plan
            (lattice_loss if slope else lattice_loss_values)(flat, centers, beta, mc, h, float(s[0]), a, s, loss, slopes)
        return loss.reshape(u.shape), (slopes.reshape(u.shape) if slope else None)

    # (the same rule's arguments, for the compiled Newton steps of :func:`_inverse_loss`)
    if plan is None:
        evaluate.kernel = (np.zeros(0), np.zeros((1, 1)), np.zeros(0), 1.0, float(s[0]), a, s)
    else:
        evaluate.kernel = (plan[0], plan[1], plan[2], float(h), float(s[0]), a, s)
    return evaluate


def _lattice_plan(a: np.ndarray, s: np.ndarray, h: float, lo: float, hi: float):
    """``((centers, beta, M) or None, step)`` of the lattice evaluator (``None`` when the lattice does
    not fit; module :mod:`._mixture_compiled`): ``beta[c, d] = exp(a_d + d step centers[c] - M_c)``,
    ``step`` the coarsest lattice of the points that is a multiple of ``h`` (so a mixture gives
    the same numbers whichever multiple of its lattice the caller names)."""
    from dpmf.privacy._mixture_compiled import SPAN

    d = np.rint((s - s[0]) / h)
    if not np.all(np.abs(s - s[0] - d * h) <= 1e-9 * max(1.0, float(s[-1]))):
        return None, h
    di = d.astype(np.int64)
    step = int(np.gcd.reduce(di))  # the coarsest lattice of these points: the same PLD on any finer one
    if step > 1:
        di //= step
        h *= step
    dmax = int(di[-1])
    if dmax < 1 or dmax + 1 > _LATTICE_DENSITY * s.size:
        return None, h
    reach = SPAN / (h * dmax)
    count = max(1, int(math.ceil((hi - lo) / reach)) + 1)
    if count * (dmax + 1) > _LATTICE_TABLE:
        return None, h
    centers = lo + reach * np.arange(count)
    z = a[None, :] + (di * h)[None, :] * centers[:, None]
    mc = z.max(axis=1)
    beta = np.zeros((count, dmax + 1))
    beta[:, di] = np.exp(z - mc[:, None])
    return (centers, beta, mc), h


def _quadrature_masses(u: np.ndarray, s: np.ndarray, p: np.ndarray, evaluate) -> np.ndarray:
    """Masses of the mixture ``sum_i p_i N(s_i, 1)`` in each ``[u_j, u_{j+1}]`` (``u`` increasing):
    ``int phi e^L`` by Gauss-Legendre on sub-intervals, or exactly per component for an interval too
    wide for them; each raised by the rule's error bound (:mod:`._mixture_compiled`)."""
    from dpmf.privacy._mixture_compiled import (accumulate_masses, exact_masses, quadrature_nodes, quadrature_parts,
                                                quadrature_size)

    u = np.ascontiguousarray(u, dtype=np.float64)
    out = np.zeros(max(0, u.size - 1))
    if u.size < 2:
        return out
    parts = quadrature_parts(u, float(s[-1]))
    size = int(quadrature_size(parts))
    nodes, weights, owner = np.empty(size), np.empty(size), np.empty(size, dtype=np.int64)
    quadrature_nodes(u, parts, nodes, weights, owner)
    exact_masses(u, parts, np.ascontiguousarray(s, dtype=np.float64), np.ascontiguousarray(p, dtype=np.float64), out)
    loss, _ = evaluate(nodes, slope=False)
    accumulate_masses(nodes, weights, loss, owner, out)
    return out


def _point_tails(u: float, s: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """``(mass below u, mass above u)`` of the mixture ``sum_i p_i N(s_i, 1)``, from log tails."""
    log_p = np.log(p)
    below = math.exp(_logsumexp(log_p + special.log_ndtr(u - s)))
    above = math.exp(_logsumexp(log_p + special.log_ndtr(s - u)))
    return below, above


def _logsumexp(x: np.ndarray) -> float:
    """``log(sum(exp(x)))`` of a 1-D array (no scipy call overhead: this sits in bisection loops)."""
    m = float(np.max(x))
    if not math.isfinite(m):
        return m
    return m + math.log(float(np.sum(np.exp(x - m))))


def _connect_the_dots(eps, disc, p_below, p_mid, p_above, q_mid, q_above):
    """Connect-the-dots masses on the grid ``eps`` from interval P/Q masses (module docstring)."""
    probs = np.zeros(eps.size)
    probs[0] += p_below
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        qt = np.where(q_mid > 0, np.exp(eps[:-1] + np.log(np.where(q_mid > 0, q_mid, 1.0))), 0.0)
    factor = math.exp(disc) / math.expm1(disc)
    upper = (p_mid - qt) * factor + SPLIT_SLACK * p_mid
    upper = np.clip(np.nan_to_num(upper, nan=0.0, posinf=0.0), 0.0, p_mid)
    upper = np.where(qt == 0, p_mid, upper)  # Q-mass underflowed: all to the upper end
    probs[:-1] += p_mid - upper
    probs[1:] += upper
    log_top_q = eps[-1] + math.log(q_above) if q_above > 0 else -math.inf
    top_q = math.exp(log_top_q) if log_top_q < 700.0 else math.inf  # e^eps Q-mass (no OverflowError)
    inf_mass = min(p_above, max(0.0, p_above - top_q) + SPLIT_SLACK * p_above)
    probs[-1] += p_above - inf_mass
    return probs, inf_mass
