r"""The pessimistic PLD that an ``allocation_pld`` report carries, valid at *every* delta, so that
:func:`dpmf.compose` composes the report as a PLD (tight) instead of through its (epsilon, delta).

**Why the report's own computation is not such a PLD.** :func:`~dpmf.accounting.allocation.pld.
allocation_pld_epsilon` computes the law of the allocation pair's likelihood ratio on windows fitted
to the report's delta and charges the cut tails to that delta: it proves the epsilon at that delta.

**What is carried instead** (:mod:`~dpmf.accounting.allocation.pld_compose`, steps a-b, per
direction): the grid sum law gives an upper bound ``d(gamma)`` on one copy's hockey-stick curve
``H_gamma`` at *every* ``gamma > 0`` -- the windows' cut mass is charged as a constant ``c`` (a bound
on the cut part of ``E[(S - gamma)_+]`` at the window's lowest ``gamma``, hence at every larger one;
add: ``gamma c``), below the window the law's hockey stick is linear in ``gamma`` and the raised mass
only adds, linear interpolation of the convex tables between grid points lies above them, and
``d`` is replaced by its running minimum and by 1 where larger (the true ``H`` is non-increasing and
``<= 1``). The lower convex hull of ``{(0, 1)} U {(gamma_j, d_j)}`` on ``gamma_j = e^{j Delta}`` is
then the hockey-stick curve of a proper pair that dominates the copy's pair at every ``gamma``
(connect the dots, Doroshenko et al. PoPETs 2022); its P-law is a pmf on the uniform loss grid
``j Delta`` plus a mass at ``+inf``, i.e. exactly a pessimistic dp_accounting PMF. The two
directions are separate PMFs (a PLD's remove and add laws need not come from one pair).

**Compositions.** Fresh slots and ``k``-of-``t`` are (bounded by) products of copies of 1-of-``m``
allocation (:mod:`~dpmf.accounting.allocation.pld_compose`, reductions 2-3); the product's P-law is
the convolution of the copies' laws, computed by dp_accounting's pessimistic composition.

**Correlated strategies.** Every reduction of :mod:`.correlated`, :mod:`.fresh_correlated` and
:mod:`.k_of_t_correlated` bounds *both hockey-stick curves at every gamma* by those of the identity's
pair at another ``(sigma, t)`` (Jensen and convex order hold for every convex integrand, and the
epochs/blocks decorrelation for every gamma), so that member's PLD is carried. A Markov surrogate
member has no PLD: when it gave the reported epsilon, the best identity-pair member is carried
instead (a weaker but sound curve; the report's diagnostics say so).

**Two profiles, one hull.** A profile fitted to a tiny delta reaches far into the tail but its grid
is coarse where moderate deltas are decided (measured: 10 compositions 1.6% above the fresh-slot
answer); one fitted to the report's delta is fine there but its charges make the mass at ``+inf``
about ``BUDGET * delta``. Both bound ``H_gamma`` at every ``gamma``, so their pointwise minimum does,
and its hull is carried (:func:`~dpmf.accounting.allocation.pld_compose.one_copy_law`): profiles
for ``BUDGET * delta / copies`` and ``BUDGET * min(delta, DELTA_FLOOR) / copies``. The carried law
is useful at every delta down to :data:`DELTA_FLOOR`; below it the PLD is still sound (its epsilon
may be infinite).
"""

from __future__ import annotations

import math

from dpmf.accounting.allocation import pld_compose
from dpmf.privacy.dp_pld import dense_pmf
from dpmf.privacy.gdp import gaussian_epsilon
from dpmf.privacy.pld import PrivacyLossDistribution

__all__ = ["DELTA_FLOOR", "LOSS_STEP", "identity_pld"]

#: The carried PLD is useful (finite, tight) at every delta down to this one.
DELTA_FLOOR = 1e-12
#: Loss-grid spacing of the carried PLD (the hull's chords are its only looseness: measured in tests).
LOSS_STEP = 1e-3


def _copy_pld(eta: float, m: int, delta_smalls, rel_tol: float, max_points: int) -> PrivacyLossDistribution:
    pmfs = {}
    for direction in ("remove", "add"):
        lo, p, p_inf = pld_compose.one_copy_law(direction, eta, m, delta_smalls, LOSS_STEP, rel_tol=rel_tol,
                                                max_points=max_points)
        pmfs[direction] = dense_pmf(lo, p, p_inf, LOSS_STEP)
    return PrivacyLossDistribution(remove=pmfs["remove"], add=pmfs["add"])


def identity_pld(noise_multiplier: float, steps: int, delta: float, *, epochs: int = 1, num_selected: int = 1,
                 fresh_slots: bool = False, rel_tol: float, max_points: int) -> PrivacyLossDistribution | None:
    """The pessimistic PLD (both directions, every delta) of the identity's allocation pair that
    :func:`~dpmf.accounting.allocation.pld.allocation_pld_epsilon` bounds with the same arguments:
    one copy of 1-of-``t`` at ``sigma / sqrt(E)`` (reused slots), or the composition of the copies of
    :func:`~dpmf.accounting.allocation.pld_compose.split_k_of_t` (``E`` times each for fresh slots).
    ``None`` where that function answers with the Gaussian mechanism for want of a grid (its epsilon 0
    or above 300)."""
    sigma, t, k, sel = float(noise_multiplier), int(steps), int(epochs), int(num_selected)
    fresh = bool(fresh_slots) and k > 1
    sigma_eff = sigma if fresh else sigma / math.sqrt(k)
    eps_gauss = gaussian_epsilon(sigma_eff, delta)
    if eps_gauss == 0.0 or eps_gauss > 300:
        return None
    parts = [(m, c * (k if fresh else 1)) for m, c in pld_compose.split_k_of_t(t, sel)]
    copies = sum(c for _, c in parts)
    smalls = (pld_compose.BUDGET * float(delta) / copies, pld_compose.BUDGET * min(float(delta), DELTA_FLOOR) / copies)
    total = None
    for m, c in parts:
        part = _copy_pld(1.0 / sigma_eff**2, m, smalls, rel_tol, max_points).self_compose(c)
        total = part if total is None else total.compose(part)
    return total
