"""The composition report built from parts already recomputed (shared by :func:`dpmf.compose` and
:func:`dpmf.accounting.verify_report`, which re-checks a saved composition from its parts).

See :mod:`dpmf.accounting.composition` for what composition means and how each part enters.
"""

from __future__ import annotations

import math

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


def _number(x) -> float:
    return math.inf if x == "inf" else float(x)


def composition_report(parts: list[tuple[PrivacyReport, int, dict]], delta: float | None = None, *,
                       discretization: float | None = None) -> PrivacyReport:
    """The :class:`PrivacyReport` of running each ``(report, times, info)`` part ``times`` times
    (``info``: where the part came from, recorded in the diagnostics). ``delta`` defaults to the sum
    of the parts' deltas."""
    from dpmf.privacy.tradeoff import compose_curves

    curves = [rep.privacy_curve for rep, _, _ in parts]
    counts = [k for _, k, _ in parts]
    rows = [{"report": rep.to_dict(), "times": k, **info} for rep, k, info in parts]
    composed, hows = compose_curves(curves, counts, discretization=discretization)
    if delta is None:
        d = math.fsum(k * float(r["report"]["delta"]) for r, k in zip(rows, counts))
        if not d < 1:
            raise InvalidParameterError(f"the parts' deltas add up to {d:g} >= 1: pass delta= (a number in (0, 1))")
        delta_note = "the sum of the parts' deltas (the default: what basic composition spends)"
    else:
        d = _v.open_unit("delta", delta)
        delta_note = "given"
    not_tight = {}
    for i, (r, how) in enumerate(zip(rows, hows), 1):
        r["composed_as"] = how
        if how.startswith("NOT tight"):
            not_tight[f"part {i}: {r['report']['method']} ({r.get('source', '?')})"] = how

    if composed.kind == "gdp":
        from dpmf.privacy.gdp import gdp_epsilon

        eps = gdp_epsilon(composed.mu, d) if composed.mu > 0 else 0.0
        by_dir = {"remove": eps, "add": eps}
    else:
        ((pld, offset),) = composed.plds
        by_dir = pld.epsilon_by_direction(d - offset) if d > offset else {"remove": math.inf, "add": math.inf}
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
        if composed.plds[0][1]:
            diagnostics["delta_offset"] = composed.plds[0][1]
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
        curve=composed,
    )
