r"""The privacy curve an ``allocation_pld`` report carries: a pessimistic PLD valid at *every* delta.

``allocation_pld``'s epsilon is read off grid laws whose windows are fitted to the report's delta,
so the epsilon itself proves nothing at another delta, and :func:`dpmf.compose` could only compose
it through its ``(epsilon, delta)`` pair. This module builds, for the same pair, the loss law of a
*proper dominating pair* (:mod:`~dpmf.accounting.allocation.pld_compose`, steps a-c): one copy's
privacy profile bounded at every ``gamma`` by the grid sum law plus its charges (the window rules
of :mod:`~dpmf.accounting.allocation.grid` hold for every ``gamma``, not just the answer's), the lower
convex hull of those points (connect the dots, Doroshenko et al., PoPETs 2022: the hockey-stick
curve of a pair that dominates the copy's pair at every ``gamma``), and for fresh slots / ``k`` of
``t`` the pessimistic composition of such laws. The report's delta only places the windows, i.e.
where the PLD is tight; it is sound everywhere. Composing it further with dp_accounting's FFT
convolution stays pessimistic: the delta of a composition is a non-negative functional,
non-decreasing in every factor's masses and losses, so entrywise upper bounds on the masses
(the composition laws' FFT allowances) and losses rounded up (the regridding of
:func:`dpmf.compose`) only increase it.

Which pair (the reductions are pair-level, so each member's pair dominates the strategy's pair at
every ``gamma``, both directions; :mod:`~dpmf.accounting.allocation.correlated`):

* DP-SGD (``C = I``): the exact pair (one epoch at ``sigma / sqrt(E)`` for reused slots; the
  composition of 1-of-``m`` copies for fresh slots and ``k`` of ``t``);
* another ``C``: the identity pair of the reduction member (orthogonal or spectral groups, fresh
  or ``k``-of-``t`` reductions) with the smallest epsilon at the report's delta. A Markov member
  has no PLD here; when one decided the report's epsilon the carried PLD is the best identity
  member's (looser at the report's delta, still sound; its note says so);
* where the report fell back to the Gaussian mechanism (one step per epoch, or a grid beyond float
  range), its GDP curve at ``mu = sqrt(E k) / sigma`` (revealing the slots is post-processing).

Building the PLD costs about one more accounting (one grid sum law per direction and add reach),
so a report holds a builder and pays it only when its curve is asked for
(:attr:`~dpmf.accounting.report.PrivacyReport.privacy_curve`, :func:`dpmf.compose`).
"""

from __future__ import annotations

import math

from dpmf.accounting.allocation import pld_compose
from dpmf.privacy.dp_pld import dense_pmf
from dpmf.privacy.gdp import gaussian_epsilon

__all__ = ["DELTA_FIT_FACTOR", "identity_pair_curve", "report_curve_builder"]

#: The carried PLD's windows are fitted to this fraction of the report's delta (tight from there up).
DELTA_FIT_FACTOR = 1e-3


def _parts(sigma: float, t: int, epochs: int, num_selected: int, fresh_slots: bool):
    """``(eta, parts)`` of the identity pair, as :func:`~.pld.allocation_pld_epsilon` splits it."""
    fresh = bool(fresh_slots) and epochs > 1
    sigma_eff = sigma if fresh else sigma / math.sqrt(epochs)
    rounds = epochs if fresh else 1
    return 1.0 / sigma_eff**2, [(m, c * rounds) for m, c in pld_compose.split_k_of_t(t, num_selected)]


def identity_pair_curve(sigma: float, t: int, delta: float, *, epochs: int = 1, num_selected: int = 1,
                        fresh_slots: bool = False, rel_tol: float, max_points: int, note: str = ""):
    """The :class:`~dpmf.privacy.tradeoff.PrivacyCurve` (one pessimistic PLD, both directions) of
    DP-SGD under ``num_selected``-of-``t`` random allocation over ``epochs`` epochs at noise
    ``sigma``; windows fitted to ``delta`` (module docstring)."""
    from dpmf.privacy.pld import PrivacyLossDistribution
    from dpmf.privacy.tradeoff import PrivacyCurve

    eta, parts = _parts(sigma, t, epochs, num_selected, fresh_slots)
    eps_gauss = gaussian_epsilon(1.0 / math.sqrt(eta * num_selected), delta)
    if eps_gauss == 0.0 or eps_gauss > 300:  # (as allocation_pld_epsilon: no grid beyond float range)
        return PrivacyCurve.gaussian(math.sqrt(epochs * num_selected) / sigma, exact=False,
                                     note="the Gaussian mechanism revealing the slots (a bound)")
    # (windows and cut budgets at DELTA_FIT_FACTOR x delta: the mass sent to +inf stays far below delta, so
    # the curve also answers at deltas well below the report's, as a composition's parts need)
    laws = pld_compose.composition_loss_laws(eta, parts, delta * DELTA_FIT_FACTOR, rel_tol=rel_tol,
                                             max_points=max_points)
    pmfs = {d: dense_pmf(law.lo, law.p, p_inf, step) for d, (law, p_inf, step) in laws.items()}
    pld = PrivacyLossDistribution(remove=pmfs["remove"], add=pmfs["add"])
    steps = ", ".join(f"{d} {laws[d][2]:g}" for d in ("remove", "add"))
    return PrivacyCurve.from_pld(
        pld, note=note or f"pessimistic PLD of the random-allocation pair (loss grid {steps}; tight near delta {delta:.3g})")


def _member(out: dict):
    """``(label, slots, noise scale squared)`` of the identity member with the smallest epsilon."""
    rows = [r for r in out.get("reductions", ()) if "noise_scale_sq" in r and r.get("epsilon") is not None]
    best = min(rows, key=lambda r: r["epsilon"])
    return best["bound"], best["slots"], best["noise_scale_sq"], best["epsilon"]


def report_curve_builder(scheme, correlated: bool, sigma: float, delta: float, out: dict, *, rel_tol: float,
                         max_points: int):
    """A zero-argument function building (once) the curve of an ``allocation_pld`` report whose
    :func:`~.pld._epsilon` result is ``out`` (module docstring), or ``None`` when there is none."""
    from dpmf.privacy.tradeoff import PrivacyCurve

    epochs, sel = scheme.epochs, getattr(scheme, "num_selected", 1)
    fresh = bool(getattr(scheme, "fresh_slots", False)) and epochs > 1
    cache: list = []

    def build():
        if cache:
            return cache[0]
        if not correlated:
            if "note" in out:  # (the Gaussian mechanism's epsilon: t = 1 or beyond float range)
                curve = PrivacyCurve.gaussian(math.sqrt(epochs * sel) / sigma, exact=False,
                                              note="the Gaussian mechanism revealing the slots (a bound)")
            else:
                curve = identity_pair_curve(sigma, scheme.steps_per_epoch, delta, epochs=epochs, num_selected=sel,
                                            fresh_slots=fresh, rel_tol=rel_tol, max_points=max_points)
        else:
            label, slots, scale_sq, eps = _member(out)
            note = f"pessimistic PLD of the identity pair of the reduction '{label}' ({slots} slots at sigma / " \
                   f"sqrt({scale_sq:.6g}))"
            if eps > out["epsilon"] * (1 + 1e-12):
                note += f"; the report's epsilon came from a Markov member (no PLD): this curve gives {eps:.6g} there"
            # (the members' own epochs / selection: as correlated.reduced_epsilon called them)
            if sel > 1:
                kw = {"epochs": epochs if fresh else 1, "fresh_slots": fresh, "num_selected": sel}
            elif fresh:
                kw = {"epochs": epochs, "fresh_slots": True}
            else:
                kw = {}
            curve = identity_pair_curve(sigma / math.sqrt(scale_sq), slots, delta, rel_tol=rel_tol,
                                        max_points=max_points, note=note, **kw)
        cache.append(curve)
        return curve

    return build
