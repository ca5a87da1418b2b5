"""The composition report built from parts already recomputed (shared by :func:`dpmf.compose` and
:func:`dpmf.accounting.verify_report`, which re-checks a saved composition from its parts).

See :mod:`dpmf.accounting.composition` for what composition means and how each part enters.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter

from dpmf import validation as _v
from dpmf.accounting.report import PrivacyReport
from dpmf.errors import InvalidParameterError

__all__ = ["NAME", "composition_report", "composition_parts"]

NAME = "composition"


def composition_parts(d: dict) -> tuple[list[dict], list[int]]:
    """``(part report dicts, times)`` of a saved composition report (``diagnostics["parts"]``)."""
    parts = (d.get("diagnostics") or {}).get("parts")
    try:
        reports = [dict(p["report"]) for p in parts]
        times = [_v.positive_int("times", p.get("times", 1)) for p in parts]
    except (TypeError, KeyError, ValueError, AttributeError):
        raise InvalidParameterError("a composition report must list its parts (diagnostics['parts'])") from None
    if not reports:
        raise InvalidParameterError("a composition report must list its parts (diagnostics['parts'])")
    return reports, times


#: Most combinations of alternatives (one PLD per part, e.g. per MMCC phase) composed one by one;
#: beyond this, a part that is the worst of several PLDs enters through its (epsilon, delta).
MAX_ALTERNATIVES = 64


def _compose(curves: list, counts: list[int], discretization: float | None):
    """:func:`~dpmf.privacy.tradeoff.compose_curves`, also tight for a part whose curve is the worst of
    several PLDs (multi-phase MMCC: each phase's PLD dominates the pairs whose differing example is in
    that phase). For every neighbouring pair, each run of such a part is dominated by *one* of its
    PLDs; the runs are independent, so the composition is dominated by the convolution of the chosen
    PLDs, and the worst over every choice (with repetition: the ``k`` runs of a part may each pick any
    of its PLDs) dominates it -- the result is again "the worst of these PLDs". Each choice is composed
    on one grid, so the result's epsilon at any delta is the largest of theirs."""
    from dpmf.privacy.pld import DEFAULT_DISCRETIZATION
    from dpmf.privacy.tradeoff import PrivacyCurve, compose_curves

    multi = [c.kind == "pld" and len(c.plds) > 1 for c in curves]
    if not any(multi):
        return compose_curves(curves, counts, discretization=discretization)
    choices = [list(itertools.combinations_with_replacement(range(len(c.plds)), k)) if m else [None]
               for c, k, m in zip(curves, counts, multi)]
    n = math.prod(len(ch) for ch in choices)
    if n > MAX_ALTERNATIVES:  # (each part enters through its (epsilon, delta): not tight, said so)
        return compose_curves(curves, counts, discretization=discretization)
    if discretization is None:
        grids = [c.discretization for c in curves if c.discretization is not None]
        discretization = max(grids) if grids else DEFAULT_DISCRETIZATION
    pairs, hows = [], None
    for combo in itertools.product(*choices):
        sub, sub_counts = [], []
        for c, k, pick in zip(curves, counts, combo):
            if pick is None:
                sub.append(c)
                sub_counts.append(k)
            else:
                for j, times in sorted(Counter(pick).items()):
                    sub.append(PrivacyCurve.from_pld([c.plds[j]]))
                    sub_counts.append(times)
        composed, sub_hows = compose_curves(sub, sub_counts, discretization=discretization)
        pairs.extend(composed.plds)
        if hows is None:
            hows = sub_hows
    hows = _hows(curves, multi, hows, n)
    return PrivacyCurve.from_pld(pairs, note=f"composition: the worst of {n} compositions of PLDs; " + "; ".join(hows)), hows


def _hows(curves, multi, sub_hows, n) -> list[str]:
    """How each part entered, from the first choice's list (one entry per part: there every
    multi-PLD part picked its PLD 0 for all its runs)."""
    return [
        f"tight (the worst of its {len(c.plds)} pessimistic PLDs: every choice of one per run composed as "
        f"PLDs, {n} compositions)" if m else how
        for c, m, how in zip(curves, multi, sub_hows)
    ]


def _number(x) -> float:
    return math.inf if x == "inf" else float(x)


def _by_direction(composed, d: float) -> dict:
    """Epsilon per direction of a composed curve at ``d`` (the worst over its PLDs)."""
    if composed.kind == "gdp":
        from dpmf.privacy.gdp import gdp_epsilon

        eps = gdp_epsilon(composed.mu, d) if composed.mu > 0 else 0.0
        return {"remove": eps, "add": eps}
    by_dir = {"remove": -math.inf, "add": -math.inf}  # the worst over the curve's PLDs (usually one)
    for pld, offset in composed.plds:
        e = pld.epsilon_by_direction(d - offset) if d > offset else {"remove": math.inf, "add": math.inf}
        by_dir = {key: max(by_dir[key], e[key]) for key in by_dir}
    return by_dir


#: A part whose PLD's epsilon at its own delta exceeds its (epsilon, delta) claim by more than this
#: factor (an allocation_pld report whose epsilon came from a member without a PLD) is also tried
#: through its claim.
CLAIM_MARGIN = 1.01


def _best_composition(curves: list, counts: list[int], discretization, d: float):
    """``(curve, hows, epsilon by direction)``: :func:`_compose`, and -- when some part's PLD is looser
    than its own (epsilon, delta) claim by more than :data:`CLAIM_MARGIN` (its PLD bounds a weaker
    pair than the one its epsilon came from) -- also the composition with those parts entering
    through their claim; the smaller epsilon at ``d`` is kept (each is a sound bound)."""
    from dpmf.privacy.tradeoff import PrivacyCurve

    composed, hows = _compose(curves, counts, discretization)
    by_dir = _by_direction(composed, d)
    looser = [c.kind == "pld" and len(c.plds) == 1 and c.epsilon is not None and c.delta
              and c.epsilon_at(c.delta) > CLAIM_MARGIN * c.epsilon for c in curves]
    if any(looser):
        alt_curves = [PrivacyCurve.from_epsilon_delta(c.epsilon, c.delta, note=f"its claim (its PLD is looser: {c.note})")
                      if lo else c for c, lo in zip(curves, looser)]
        alt, alt_hows = _compose(alt_curves, counts, discretization)
        alt_by = _by_direction(alt, d)
        if max(alt_by.values()) < max(by_dir.values()):
            return alt, alt_hows, alt_by
    return composed, hows, by_dir


def composition_report(parts: list[tuple[PrivacyReport, int, dict]], delta: float | None = None, *,
                       discretization: float | None = None) -> PrivacyReport:
    """The :class:`PrivacyReport` of running each ``(report, times, info)`` part ``times`` times
    (``info``: where the part came from, recorded in the diagnostics). ``delta`` defaults to the sum
    of the parts' deltas."""
    curves = [rep.privacy_curve for rep, _, _ in parts]
    counts = [k for _, k, _ in parts]
    rows = [{"report": rep.to_dict(), "times": k, **info} for rep, k, info in parts]
    if delta is None:
        d = math.fsum(k * float(r["report"]["delta"]) for r, k in zip(rows, counts))
        if not d < 1:
            raise InvalidParameterError(f"the parts' deltas add up to {d:g} >= 1: pass delta= (a number in (0, 1))")
        delta_note = "the sum of the parts' deltas (the default: what basic composition spends)"
    else:
        d = _v.open_unit("delta", delta)
        delta_note = "given"
    composed, hows, by_dir = _best_composition(curves, counts, discretization, d)
    not_tight = {}
    for i, (r, how) in enumerate(zip(rows, hows), 1):
        r["composed_as"] = how
        if how.startswith("NOT tight"):
            not_tight[f"part {i}: {r['report']['method']} ({r.get('source', '?')})"] = how

    eps_parts = [_number(r["report"]["epsilon"]) for r in rows]
    diagnostics = {
        "parts": rows,
        "runs": sum(counts),
        "tight": not not_tight,
        "bound": composed.bound,
        "delta_choice": delta_note,
        "basic_composition": {  # what adding up the parts' claims would say, for comparison
            "epsilon": math.fsum(k * e for e, k in zip(eps_parts, counts)),
            "delta": math.fsum(k * float(r["report"]["delta"]) for r, k in zip(rows, counts)),
        },
    }
    if composed.kind == "pld":
        diagnostics["discretization"] = composed.discretization
        offsets = [o for _, o in composed.plds]
        if max(offsets):
            diagnostics["delta_offset"] = max(offsets)
        if len(composed.plds) > 1:
            diagnostics["alternatives"] = len(composed.plds)
    else:
        diagnostics["mu_gdp"] = composed.mu
    if not_tight:
        diagnostics["not_tight"] = not_tight
    return PrivacyReport(
        epsilon=max(by_dir.values()),
        delta=d,
        noise_multiplier=min(float(r["report"]["noise_multiplier"]) for r in rows),
        method=NAME,
        certified=all(r["report"]["certified"] for r in rows),
        epsilon_by_direction=by_dir,
        strategy={"name": NAME, "parts": [r["report"]["strategy"] for r in rows]},
        scheme={"name": NAME, "parts": [r["report"]["scheme"] for r in rows]},
        diagnostics=diagnostics,
        options={"times": counts, **({"discretization": discretization} if discretization else {})},
        # (the claim recorded on the curve: a curve that is the worst of several PLDs can still enter a
        # further composition through it)
        curve=dataclasses.replace(composed, epsilon=max(by_dir.values()), delta=d),
    )
