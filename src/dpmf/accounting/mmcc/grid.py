"""The loss grid of MMCC's row PLDs: the requested discretization while the widest row's grid fits
in memory, else a coarser power-of-two multiple (pessimistic: every loss still rounded up). Shared by
the accountant (:mod:`.accountant`) and the cost model (:mod:`dpmf.accounting.cost`), which sizes a
run's time and memory by the grid chosen here."""

from __future__ import annotations

import math


#: Peak bytes per loss-grid point of a whole MMCC run (row mixtures' quadrature nodes, both
#: directions' PMFs, the compositions' FFT buffers), measured: BinaryTree(16), q 1/16, sigma 0.5
#: peaked at 2.5 GiB for a widest-row grid of 1.66e7 points (150 bytes a point), so 160.
GRID_BYTES = 160.0

#: Share of the available memory one MMCC run may plan for (the rest for the caller and its peers).
MEMORY_SHARE = 0.5



def row_discretization(row_sum: float, sigma: float, discretization: float, entry: float | None = None,
                       sampling_prob: float = 1.0) -> float:
    """The loss grid of every row PLD at this noise: ``discretization`` while the widest row's grid
    fits in memory, else a coarser one (:func:`~dpmf.privacy.gaussian_plds.grid_discretization`,
    the rule every PLD accountant follows), never a refusal short of float64's range.

    Fit test: the widest row's grid -- both directions' loss levels, about ``2 (u^2 / 2 + 10 u)``
    for ``u = S / sigma`` and a row of total sensitivity ``S`` (sum of its entries), at least one
    step's width -- at :data:`GRID_BYTES` per point (the whole run's peak, measured) must fit in
    :data:`MEMORY_SHARE` of the memory available; and a one-entry row of the largest entry
    ``entry`` at probability ``sampling_prob`` (the subsampled Gaussian) must fit its own point
    limit. When either fails, the grid is the finest power-of-two multiple with at most
    ``COARSE_STEP_GRID_POINTS`` (2^16) points over the same width, the coarse grid every PLD
    accountant takes (pessimistic: the epsilon is sound and a little larger; BinaryTree(256) at
    sigma 0.5: 264988 on grid 6.55 in 2 CPU-s, 264320 on a 2^22-point grid in 14 CPU-s). Until 2026-12-02 the test counted ``20 u`` points at 16 bytes, so BinaryTree(256) at sigma 0.5 (``u = 512``: 2.7e9
    points at 1e-4) planned for 1e8 points and was killed for memory at 22 GiB.
    """
    from dpmf.errors import NoiseTooSmallError
    from dpmf.privacy.gaussian_plds import (COARSE_STEP_GRID_POINTS, MAX_DISCRETIZATION, MAX_STEP_GRID_POINTS,
                                            grid_discretization, step_grid_points, step_width)
    from dpmf.resources import available_memory

    points_budget = MEMORY_SHARE * available_memory() / GRID_BYTES
    u = row_sum / sigma
    # a mixture row's grid spans both directions' loss levels: about 2 (u^2 / 2 + 10 u) for u = S / sigma
    width = max(step_width(sigma, 1.0, row_sum), 2.0 * (0.5 * u * u + 10.0 * u))
    # the step rule of a one-entry row (largest entry, probability q): the subsampled Gaussian's limit
    step_fits = entry is None or step_grid_points(sigma, sampling_prob, entry, discretization=discretization) <= (
        MAX_STEP_GRID_POINTS)
    if math.isfinite(width) and width / discretization + 1 <= points_budget and step_fits:
        return discretization
    try:
        return grid_discretization(discretization, width, max_points=points_budget, fit_width=math.inf)
    except ArithmeticError:
        # the loss range grows like (S / sigma)^2: the noise at which the coarsest grid holds it
        smallest = row_sum / math.sqrt(MAX_DISCRETIZATION * COARSE_STEP_GRID_POINTS / 2.0)
        raise NoiseTooSmallError(
            f"noise_multiplier {sigma!r} is too small for any privacy-loss grid: an MMCC row of total sensitivity "
            f"{row_sum:.6g} spans a privacy-loss range of about (S / noise)^2 = {u * u:.3g}, which needs a grid step "
            f"above {MAX_DISCRETIZATION:g} (the coarsest float64 PLDs allow); use a noise multiplier >= "
            f"{smallest:.4g}",
            smallest,
        ) from None


def row_grid(row_sum: float, sigma: float, discretization: float = 1e-4) -> tuple[float, float]:
    """``(grid step, points)`` of the widest row's PLD at this noise: the step
    :func:`row_discretization` chooses and the points of the row's loss range
    ``2 (u^2 / 2 + 10 u)``, ``u = S / sigma``, on it (the cost model sizes time and memory by them)."""
    step = row_discretization(row_sum, sigma, discretization)
    u = row_sum / sigma
    return step, 2.0 * (0.5 * u * u + 10.0 * u) / step + 1.0


#: Coarsest grid :func:`checked_coarse_grid` tries, as a multiple of the requested one.
COARSEST_FACTOR = 64
#: Agreement two grids ``H`` and ``2 H`` must show (relative) for ``H``'s epsilon to be reported in
#: place of the requested grid's: a connect-the-dots PLD's epsilon converges like the grid squared,
#: so ``H``'s differs from the requested grid's by about a third of that (below 1e-6, the agreement the
#: stored references hold).
GRID_CHECK_REL = 5e-7
#: Most work the coarse grids may cost before the requested grid is taken after all, as a fraction
#: of that grid's (a grid ``k`` times coarser costs about ``1 / k`` of it).
GRID_CHECK_BUDGET = 0.5
#: Fewest loss-grid points of the widest row (both directions, :func:`row_grid`'s count) at which the
#: coarse grids are tried: below it a row's fixed work (its sensitivity law, tail points, tables)
#: outweighs its grid, so two coarse passes cost ~30% of the requested grid's (MMCC BandMF-16 x 500
#: at sigma 4, epsilon 11.5: 0.6 -> 0.8 CPU-s, and no coarse grid agrees at that epsilon).
GRID_CHECK_MIN_POINTS = 2**18


def worth_checking(row_sum: float, sigma: float, discretization: float) -> bool:
    """Whether :func:`checked_coarse_grid` is tried: the widest row's grid (``2 (u^2 / 2 + 10 u)`` loss
    levels for ``u = S / sigma``) has at least :data:`GRID_CHECK_MIN_POINTS` points."""
    u = row_sum / sigma
    return 2.0 * (0.5 * u * u + 10.0 * u) / discretization >= GRID_CHECK_MIN_POINTS


def checked_coarse_grid(epsilon_at, fine: float, *, coarsest: int = COARSEST_FACTOR,
                        rel: float = GRID_CHECK_REL, budget: float = GRID_CHECK_BUDGET):
    """``(factor, value)`` of the coarsest grid ``factor x fine`` (a power of two, at least 2) whose
    epsilon agrees with the next coarser grid's to ``rel`` (relative), or ``None`` when none does
    within ``budget``: then the caller evaluates ``fine`` itself. ``epsilon_at(grid) -> (epsilon,
    value)`` evaluates one grid (every grid's epsilon is a sound upper bound: losses are rounded
    up; this only decides which one is reported).

    Search: ``coarsest`` and half of it first; while the pair ``(k, 2k)`` disagrees by ``d``, the
    next pair is the coarsest ``(j, 2j)`` that the grid-squared law predicts to agree
    (``d (j / k)^2 <= rel``), if its work fits the budget. A case whose epsilon is decided by the
    discretization (small epsilon, a fine grid needed) spends ~5% of the fine grid's work here;
    MMCC BandMF-16 x 500 at sigma 1 (epsilon ~3467) is reported from 32x the requested grid, 1.3e-7
    relative from the requested grid's epsilon."""
    values: dict = {}
    spent = [0.0]

    def at(k: int):
        if k not in values:
            values[k] = epsilon_at(fine * k)
            spent[0] += 1.0 / k
        return values[k]

    k = coarsest // 2
    if k < 2:
        return None
    at(coarsest)
    at(k)
    while True:
        e, e2 = float(at(k)[0]), float(at(2 * k)[0])
        if not (math.isfinite(e) and math.isfinite(e2)):
            return None
        d = abs(e2 - e)
        if d <= rel * abs(e):
            return k, values[k][1]
        if not rel * abs(e) > 0:
            return None
        j = min(k // 2, 2 ** math.floor(math.log2(max(k * math.sqrt(rel * abs(e) / d), 1.0))))
        if j < 2:
            return None
        extra = (1.0 / j if j not in values else 0.0) + (1.0 / (2 * j) if 2 * j not in values else 0.0)
        if spent[0] + extra > budget:
            return None
        k = j
