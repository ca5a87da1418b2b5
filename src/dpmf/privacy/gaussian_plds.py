"""PLDs of the Gaussian and the Poisson-subsampled Gaussian mechanisms.

Both delegate to ``dp_accounting.pld`` where it is exact and pessimistic (connect-the-dots
discretization, Doroshenko et al. 2022). Conventions (DESIGN.md): the mechanism adds
``N(0, sigma^2)`` to a query of L2 sensitivity ``sensitivity``; the subsampled version includes the
example with probability ``sampling_prob`` (Poisson sampling, zero-out adjacency). The remove
direction (P = with the example) is the worse one for subsampling; both are kept.
"""

from __future__ import annotations

import math

from dpmf import validation as _v
from dpmf._lazy import LazyModule
from dpmf.privacy.pld import DEFAULT_DISCRETIZATION, PrivacyLossDistribution

_dpa_pld = LazyModule("dp_accounting.pld.privacy_loss_distribution")  # loaded on first use
_dpa_mech = LazyModule("dp_accounting.pld.privacy_loss_mechanism")
_dpa_pmf = LazyModule("dp_accounting.pld.pld_pmf")


def gaussian(
    noise_multiplier: float, sensitivity: float = 1.0, *, discretization: float = DEFAULT_DISCRETIZATION
) -> PrivacyLossDistribution:
    """PLD of ``f(D) + N(0, sigma^2)`` for a query of L2 sensitivity ``sensitivity``.

    For a single Gaussian the exact profile is also available in closed form:
    :func:`dpmf.privacy.gaussian_epsilon`.
    """
    return subsampled_gaussian(noise_multiplier, 1.0, sensitivity, discretization=discretization)


def subsampled_gaussian(
    noise_multiplier: float,
    sampling_prob: float,
    sensitivity: float = 1.0,
    *,
    discretization: float = DEFAULT_DISCRETIZATION,
    max_points: float | None = None,
) -> PrivacyLossDistribution:
    """PLD of one Poisson-subsampled Gaussian step (one DP-SGD step); ``sampling_prob = 1`` is
    the plain Gaussian mechanism.

    The dominating pair is ``N(0, sigma^2)`` vs ``(1-q) N(0, sigma^2) + q N(s, sigma^2)``; it is the
    mixture of Gaussians with sensitivities ``[0, s]`` and probabilities ``[1-q, q]``, built here
    with dp_accounting's closed-form inverse privacy loss.

    Valid noise range: a noise multiplier whose one-step loss grid would have more than
    ``max_points`` (default :data:`MAX_STEP_GRID_POINTS`) points raises
    :class:`~dpmf.errors.NoiseTooSmallError` naming the smallest one that fits and the coarser
    discretization that would (:func:`check_step_grid`; the accountants pick that grid themselves,
    :func:`step_discretization`); above :func:`saturation_noise` the PLD is
    computed at that noise (more noise is post-processing, so it is still a pessimistic PLD, and
    the whole loss is then far inside one grid step).
    """
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    q = _v.probability("sampling_prob", sampling_prob)
    sens = _v.positive("sensitivity", sensitivity)
    disc = _v.positive("discretization", discretization)
    check_step_grid(sigma, q, sens, disc, max_points=max_points)
    sigma = min(sigma, saturation_noise(sens, disc))
    remove = _connect_the_dots_pmf(sigma, q, sens, disc, "remove")
    if q == 1.0:
        return PrivacyLossDistribution.from_dp_accounting(_dpa_pld.PrivacyLossDistribution(remove))
    add = _connect_the_dots_pmf(sigma, q, sens, disc, "add")
    return PrivacyLossDistribution.from_dp_accounting(_dpa_pld.PrivacyLossDistribution(remove, add))


#: Most points one direction of one step's PLD may have on its privacy-loss grid. The grid spans
#: the step's loss between dp_accounting's truncation bounds, about ``u^2 / 2 + 8 u`` for
#: ``u = sensitivity / sigma`` (twice that at ``sampling_prob = 1``), in steps of
#: ``discretization``: it grows like ``1 / sigma^2``. Building a step and composing it cost about
#: 1e-5 s and 400 bytes per point (dp_accounting's composition bounds scan the grid at 40 orders
#: per direction; measured on 2 cores: 1.4e6 points 23 s and 0.5 GiB at sigma = 0.1, q = 0.01,
#: T = 10; 3.6e6 points 60 s and 1.6 GiB at sigma = 0.05), so 2^20 points is about half a minute
#: and half a GiB. A smaller noise is refused at once (sigma < 0.12 at q = 0.01 and the default
#: discretization; epsilon there is in the hundreds) instead of running for many minutes.
MAX_STEP_GRID_POINTS = 2**20

#: :func:`saturation_noise` puts the whole one-step privacy loss within this fraction of a grid step.
_SATURATION_FRACTION = 1e-4


def saturation_noise(sensitivity: float, discretization: float) -> float:
    """The noise above which a step's PLD is computed at this noise instead.

    The one-step privacy loss is at most about ``10 s / sigma`` in absolute value; at
    ``sigma >= 10 s / (1e-4 * discretization)`` it is within 1e-4 of one grid step, so the
    pessimistic grid cannot tell larger noises apart -- while their variances (``sigma^2``) leave
    float64's range near ``sigma = 1e154``. Computing a larger noise at this one is sound: adding
    noise is post-processing, so the PLD at the smaller noise dominates."""
    return 10.0 * sensitivity / (_SATURATION_FRACTION * discretization)


def step_grid_points(noise_multiplier: float, sampling_prob: float, sensitivity: float = 1.0, *,
                     discretization: float = DEFAULT_DISCRETIZATION) -> float:
    """Points on the loss grid of one direction of :func:`subsampled_gaussian` (the larger one):
    ``(upper - lower) / discretization + 1`` between dp_accounting's connect-the-dots truncation
    bounds; ``inf`` when the loss leaves float64's range (noise near 1e-154 and below)."""
    return step_width(noise_multiplier, sampling_prob, sensitivity) / discretization + 1


def step_width(noise_multiplier: float, sampling_prob: float, sensitivity: float = 1.0) -> float:
    """Width of one step's privacy-loss range (the larger direction) between dp_accounting's
    connect-the-dots truncation bounds; ``inf`` when the loss leaves float64's range."""
    import warnings

    import numpy as np

    mech = _dpa_mech
    width = 0.0
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for adjacency in (mech.AdjacencyType.REMOVE, mech.AdjacencyType.ADD):
            try:
                loss = mech.GaussianPrivacyLoss(
                    noise_multiplier, sensitivity=sensitivity, pessimistic_estimate=True,
                    sampling_prob=sampling_prob, adjacency_type=adjacency,
                )
                b = loss.connect_dots_bounds()
                w = float(b.epsilon_upper) - float(b.epsilon_lower)
            except (ArithmeticError, ValueError):
                return math.inf
            if not math.isfinite(w):
                return math.inf
            width = max(width, w)
    return width


#: When the requested grid does not fit :data:`MAX_STEP_GRID_POINTS` (or an accountant's own
#: budget), the coarser grid is chosen so that one step's loss range has at most this many
#: points: the loss there spans tens to thousands, so a step of 1/65536 of it moves epsilon by a
#: relative ~1e-5 per composed step at most (measured: paper 001 Sec. 7.4's truncated run, 29
#: rounds, epsilon 10.0837 at 2e-4 and 8e-4 alike; DP-SGD at sigma 0.1, q 0.05, 100 steps 793.651
#: at 1e-3 and 1e-2), while one evaluation takes about a second instead of half a minute.
COARSE_STEP_GRID_POINTS = 2**16


def grid_discretization(discretization: float, width: float, *, max_points: float | None = None,
                        coarse_points: float | None = None, fit_width: float | None = None) -> float:
    """THE rule every accountant built on the PLD grid follows to choose its discretization.

    ``width`` is the widest loss range one of its PLDs spans before composition (one step, one
    round, one MMCC row). When ``width / discretization + 1 <= max_points`` (default
    :data:`MAX_STEP_GRID_POINTS`) the requested ``discretization`` is used (so nothing changes
    where the finest grid fits); otherwise the smallest ``discretization * 2^k`` with at most
    ``coarse_points`` (default :data:`COARSE_STEP_GRID_POINTS`, never above ``max_points``)
    points. Power-of-two multiples keep PLDs on different grids composable exactly
    (:meth:`~dpmf.privacy.pld.PrivacyLossDistribution.regrid`). A coarser grid is still
    pessimistic (every loss rounded up): only the tightness changes. A ``width`` that is not
    finite (the loss leaves float64's range) fits no grid: the caller refuses it
    (:func:`step_discretization` raises :class:`~dpmf.errors.NoiseTooSmallError`).
    ``fit_width`` (default ``width``): the width the ``max_points`` test uses, when an accountant's
    budget was stated for another estimate of it (MMCC's memory rule).
    """
    limit = float(MAX_STEP_GRID_POINTS if max_points is None else max_points)
    coarse = min(float(COARSE_STEP_GRID_POINTS if coarse_points is None else coarse_points), limit)
    if not math.isfinite(width):
        raise ArithmeticError(f"a privacy-loss range of width {width!r} fits no grid")
    if (width if fit_width is None else fit_width) / discretization + 1 <= limit:
        return discretization
    k = max(0, math.ceil(math.log2(width / ((coarse - 1) * discretization))))
    d = discretization * 2.0**k
    while width / d + 1 > coarse:
        d *= 2.0
    if d > MAX_DISCRETIZATION:
        raise ArithmeticError(
            f"a privacy-loss range of width {width:.3g} needs a grid step of {d:.3g}, above {MAX_DISCRETIZATION:g} "
            "(dp_accounting's PMFs need exp(discretization) in float64)"
        )
    return d


#: The coarsest loss grid a PLD can have: dp_accounting's connect-the-dots PMFs divide by
#: ``expm1(discretization)``, which leaves float64's range above 709.
MAX_DISCRETIZATION = 700.0


def step_discretization(discretization: float, components, *, max_points: float | None = None) -> float:
    """:func:`grid_discretization` for PLDs built from subsampled Gaussian steps: ``components`` are
    ``(noise_multiplier, sampling_prob, sensitivity)`` of every kind of step that will be composed
    (each must be representable on the grid returned). Raises
    :class:`~dpmf.errors.NoiseTooSmallError` only for a noise whose loss leaves float64's range
    (no grid represents it), naming the smallest noise that any grid does."""
    from dpmf.errors import NoiseTooSmallError

    disc = _v.positive("discretization", discretization)
    limit = float(MAX_STEP_GRID_POINTS if max_points is None else max_points)
    used = disc
    for sigma, q, sens in components:
        u = sens / sigma
        if math.isfinite(u) and _rough_step_width(u) / disc <= limit / 2:
            continue  # (clearly fits at the requested grid: no need for the exact bounds)
        try:
            used = max(used, grid_discretization(disc, step_width(sigma, q, sens), max_points=limit))
        except ArithmeticError:
            smallest = _smallest_representable_noise(q, sens, disc, limit)
            raise NoiseTooSmallError(
                f"noise_multiplier {sigma!r} is too small for any privacy-loss grid: one subsampled Gaussian step "
                f"(sensitivity {sens:g}, sampling probability {q:g}) spans a privacy-loss range of about "
                f"(sensitivity / noise)^2 = {u * u:.3g}, which needs a grid step above {MAX_DISCRETIZATION:g} (the "
                f"coarsest float64 PLDs allow, at {COARSE_STEP_GRID_POINTS:,} points); use noise_multiplier >= "
                f"{smallest:.4g}",
                smallest,
            ) from None
    return used


def _bisect_smallest(ok, lo: float, hi: float) -> float:
    """The smallest ``sigma`` in ``(lo, hi]`` with ``ok(sigma)`` (``ok`` monotone, ``ok(hi)`` true):
    bisection in ``log sigma`` to 1e-6 relative, then rounded up to 4 significant digits where that
    still passes (``hi`` otherwise)."""
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-6 * hi:
            break
    digits = 10 ** (math.floor(math.log10(hi)) - 3)
    up = math.ceil(hi / digits) * digits
    return up if ok(up) else hi


def _smallest_representable_noise(q: float, sens: float, disc: float, limit: float) -> float:
    """The smallest noise multiplier (rounded up to 4 significant digits) for which
    :func:`step_discretization` finds a grid (bisection in ``log sigma``: the loss range shrinks
    as the noise grows)."""

    def ok(sigma: float) -> bool:
        try:
            grid_discretization(disc, step_width(sigma, q, sens), max_points=limit)
        except ArithmeticError:
            return False
        return True

    hi = sens
    while not ok(hi):
        hi *= 2.0
    lo = hi / 2.0
    while ok(lo) and lo > 1e-300:
        hi, lo = lo, lo / 2.0
    return _bisect_smallest(ok, lo, hi)


def discretization_diagnostics(requested: float, used: float, budget: str | None = None) -> dict:
    """The report fields that say which grid was used: ``{"discretization": used}``, plus, when it is
    coarser than ``requested``, ``discretization_requested`` and a ``discretization_note`` (printed
    by the CLI) saying that a finer grid could tighten the bound."""
    out: dict = {"discretization": used}
    if used != requested:
        why = budget or f"{MAX_STEP_GRID_POINTS:,} points per step, about half a minute"
        out["discretization_requested"] = requested
        out["discretization_note"] = (
            f"accounted on a coarser privacy-loss grid (discretization {used:g}, not {requested:g}): at this noise "
            f"the finer grid would not fit the time/memory budget ({why}); every rounding is still upward, so "
            f"the bound is sound, and a finer grid (more time and memory) could tighten it slightly"
        )
    return out


def _rough_step_width(u: float) -> float:
    """A quick estimate of one step's loss range at ``u = sensitivity / sigma`` (see
    :data:`MAX_STEP_GRID_POINTS`; dp_accounting's exact range is within a factor 2 of it)."""
    return 2.0 * (0.5 * u * u + 10.0 * u)


def check_step_grid(noise_multiplier: float, sampling_prob: float, sensitivity: float = 1.0,
                    discretization: float = DEFAULT_DISCRETIZATION, *,
                    max_points: float | None = None) -> None:
    """Raise :class:`~dpmf.errors.NoiseTooSmallError` when one step's loss grid would have more than
    ``max_points`` (default :data:`MAX_STEP_GRID_POINTS`) points, naming the smallest noise
    multiplier that fits and why (the valid range follows from the grid: its width grows like
    ``(sensitivity / sigma)^2 / 2``). Cheap: a closed-form estimate first, dp_accounting's bounds
    only near the limit."""
    from dpmf.errors import NoiseTooSmallError

    limit = float(MAX_STEP_GRID_POINTS if max_points is None else max_points)
    u = sensitivity / noise_multiplier
    if math.isfinite(u) and _rough_step_width(u) / discretization <= limit / 2:
        return  # (clearly fits: no need for the exact bounds)
    points = step_grid_points(noise_multiplier, sampling_prob, sensitivity, discretization=discretization)
    if points <= limit:
        return
    smallest = _smallest_fitting_noise(sampling_prob, sensitivity, discretization, limit)
    need = f"{points:.3g} points" if math.isfinite(points) else "more points than float64 can hold (the loss overflows)"
    coarser = ""
    if math.isfinite(points):
        width = (points - 1) * discretization
        coarser = f", or discretization={grid_discretization(discretization, width, max_points=limit):g}"
    raise NoiseTooSmallError(
        f"noise_multiplier {noise_multiplier!r} is too small for the PLD of a subsampled Gaussian step "
        f"(sensitivity {sensitivity:g}, sampling probability {sampling_prob:g}): its privacy-loss grid would "
        f"need {need} at discretization {discretization:g} (it grows like (sensitivity / noise)^2 / "
        f"(2 discretization)), more than the {int(limit):,} that can be built and composed in about half a "
        f"minute; use noise_multiplier >= {smallest:.4g}{coarser} (the accountants choose such a coarser "
        "grid themselves: dpmf.account)",
        smallest,
    )


def _smallest_fitting_noise(q: float, sens: float, disc: float, limit: float) -> float:
    """The smallest noise multiplier (rounded up to 4 significant digits) whose one-step grid has
    at most ``limit`` points; the grid shrinks as the noise grows, so a bisection finds it."""

    def fits(sigma: float) -> bool:
        return step_grid_points(sigma, q, sens, discretization=disc) <= limit

    u = -10.0 + math.sqrt(100.0 + 2.0 * limit * disc / 2.0)  # (_rough_step_width(u) = limit * disc)
    hi = sens / max(u, 1e-300)
    while not fits(hi):
        hi *= 2.0
    lo = hi
    while fits(lo) and lo > 1e-300:
        lo /= 2.0
    return _bisect_smallest(fits, lo, hi)


def _connect_the_dots_pmf(sigma: float, q: float, sens: float, disc: float, direction: str):
    """dp_accounting's pessimistic connect-the-dots PMF of one direction, with the inverse privacy
    loss evaluated for the whole grid at once.

    ``dp_accounting.pld.from_gaussian_mechanism`` (connect the dots, Doroshenko et al. 2022)
    evaluates ``delta(eps_j) = mu_upper_cdf(x_j) - exp(eps_j) mu_lower_cdf(x_j)`` on the grid
    ``eps_j = j * disc`` between its truncation bounds, with ``x_j`` the inverse privacy loss, one
    grid point at a time in Python (~0.5 s for q = 0.01, sigma = 1). Here the same closed forms are
    evaluated with the same floating-point operations on arrays:

    * remove: ``L'(eps) = log(exp(eps) / q + 1 - 1/q)`` (the loss without subsampling) for
      ``eps > log(1 - q)``, ``x = -s/2 - L' sigma^2 / s`` (``+inf`` at ``eps ~ log(1 - q)``);
      ``delta = 1 - exp(eps)`` below;
    * add: ``L'(eps) = -log(exp(-eps) / q + 1 - 1/q)`` for ``eps < -log(1 - q)``,
      ``x = s/2 - L' sigma^2 / s`` (``-inf`` at ``eps ~ -log(1 - q)``); ``delta = 0`` above.

    The grid, the truncation bounds, the CDFs and the PMF construction are dp_accounting's own
    (``GaussianPrivacyLoss``, ``create_pmf_pessimistic_connect_dots_fixed_gap``), so the PMF is
    the one ``from_gaussian_mechanism`` returns (a test checks it to the last few ulps).
    """
    import numpy as np

    mech_mod = _dpa_mech
    adjacency = mech_mod.AdjacencyType.REMOVE if direction == "remove" else mech_mod.AdjacencyType.ADD
    loss = mech_mod.GaussianPrivacyLoss(
        sigma, sensitivity=sens, pessimistic_estimate=True, sampling_prob=q, adjacency_type=adjacency
    )
    bounds = loss.connect_dots_bounds()
    lo = math.floor(bounds.epsilon_lower / disc)
    hi = math.ceil(bounds.epsilon_upper / disc)
    eps = np.arange(lo, hi + 1) * disc
    deltas = np.zeros_like(eps)
    var_over_s = sigma**2 / sens
    if q == 1.0:
        inverse = np.full(eps.shape, True)
        without = eps
        shift = -0.5 * sens if direction == "remove" else 0.5 * sens
        x = shift - without * var_over_s
    elif direction == "remove":
        edge = math.log(1 - q)
        inverse = eps > edge
        deltas[~inverse] = -np.expm1(eps[~inverse])
        e = eps[inverse]
        x = -0.5 * sens - _log_exp_over_q_plus(e, q) * var_over_s
        x[_isclose(e, edge)] = math.inf
    else:
        edge = -math.log(1 - q)
        inverse = eps < edge
        e = eps[inverse]
        x = sens + (-0.5 * sens + _log_exp_over_q_plus(-e, q) * var_over_s)
        x[_isclose(e, edge)] = -math.inf
    e = eps[inverse]
    deltas[inverse] = loss.mu_upper_cdf(x) - np.exp(e + loss.mu_lower_log_cdf(x))
    deltas = np.clip(deltas, 0, 1)
    return _dpa_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(disc, lo, hi, deltas)


def _log_exp_over_q_plus(b, q: float):
    """``log(exp(b) / q + 1 - 1/q)`` for ``b > log(1 - q)`` -- dp_accounting's
    ``log_a_times_exp_b_plus_c(1/q, b, 1 - 1/q)`` (``d + log1p(-exp(log(1/q - 1) - d))`` with
    ``d = b + log(1/q)``), elementwise."""
    import numpy as np

    a = 1 / q
    c = 1 - 1 / q
    d = b + np.log(a)
    if c == 0:
        return d
    return d + np.log1p(-np.exp(np.log(-c) - d))


def _isclose(values, target: float):
    """``math.isclose(v, target)`` elementwise (relative tolerance 1e-9)."""
    import numpy as np

    return np.abs(values - target) <= 1e-9 * np.maximum(np.abs(values), abs(target))
