"""``dpmf.compose``: the privacy of several runs on the same data (hyperparameter tuning, stages).

Runs with independent randomness on the same dataset compose (Dong, Roth & Su 2019, Thm 3.2;
for PLDs, the convolution of the privacy-loss distributions per adjacency direction). Each part
enters in the strongest form its report proves (:class:`~dpmf.privacy.tradeoff.PrivacyCurve`):

* a method with a pessimistic PLD (``pld`` i.e. DP-SGD, ``truncated_pld``, ``mmcc``,
  ``allocation_pld``): **tight**,
  its PLD is composed (dp_accounting's FFT convolution, pessimistic; MMCC's ``delta_1`` of each part
  adds up: conditional composition). PLDs on different grids are first put on the coarsest grid with
  every loss rounded up. A curve that is the worst of several PLDs (MMCC with several phases: each
  phase's PLD bounds the examples of that phase) is composed choice by choice, one PLD per run, and
  the worst kept (:func:`~dpmf.accounting.composed.composition_report`; up to
  :data:`~dpmf.accounting.composed.MAX_ALTERNATIVES` choices, beyond which it enters as below);
* ``unamplified`` (the Gaussian mechanism): **exact**, as GDP (``mu = sqrt(sum mu_i^2)`` when every
  part is GDP, else as its Gaussian PLD);
* a method that proves only ``(epsilon, delta)``: **not tight**, the part enters as the pair that
  dominates every ``(epsilon, delta)``-DP mechanism (its optimal composition, Kairouz, Oh &
  Viswanath 2015; never looser than basic composition ``(sum eps_i, sum delta_i)``). The result's
  diagnostics name these parts and the bound used. These have no PLD to carry: ``allocation``
  proves Renyi-DP bounds (conditional composition), which give ``(epsilon, delta)`` but no loss
  distribution; ``montecarlo`` certifies one ``(epsilon, delta)`` by a hypothesis test on sampled
  losses (Estimate-Verify-Release).

``allocation_pld`` computes its epsilon on windows fitted to the report's delta; the PLD it carries
is a separate one valid at every delta (:mod:`~dpmf.accounting.allocation.pld_curve`: the grid's
hockey-stick bound at every ``gamma``, turned into a dominating pair by connect-the-dots), built on
first use (``report.privacy_curve``) so that accounting alone does not pay for it. For a correlated
``C`` it is the PLD of the identity-pair reduction member; when a Markov surrogate (no PLD) gave the
report's epsilon, the best member that has one is carried (looser; ``diagnostics["pld_curve"]``);
the composition is then also computed with that part entering through its (epsilon, delta) claim,
and the smaller epsilon kept (:func:`~dpmf.accounting.composed.composition_report`; both are sound).

**Sound inputs only.** A report object made in this process carries its curve (attached by its
accountant) and is used as is. A report read from disk (a path, JSON text or dict, as written by
``dpmf account --json``, ``dpmf calibrate --json`` or a training run's ``privacy.report().to_json()``)
is **recomputed from its description** (strategy, scheme, noise multiplier, delta, method and
options: :func:`~dpmf.accounting.verify.verify_report`), never trusted for a stored number; one that
cannot be recomputed is refused. A composition report (method ``"composition"``) is recomputed from
its parts. Whether each file's own claim held and whether it was edited is recorded.

Hyperparameter tuning: releasing the best of ``k`` runs of one configuration costs at most the
``k``-fold composition: ``compose([report], times=k)`` (or ``compose([report] * k)``). Runs on
disjoint data do not compose (their worst part bounds them): do not use this for them.

>>> import dpmf
>>> r = dpmf.account(dpmf.strategies.Identity(100), dpmf.sampling.PoissonSampling(0.05, 100), 2.0, 1e-6)
>>> c = dpmf.compose([r], times=4, delta=1e-6)
>>> c.method, c.diagnostics["tight"], round(c.epsilon, 3)
('composition', True, 2.556)
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from dpmf import validation as _v
from dpmf.accounting.composed import NAME, composition_report
from dpmf.accounting.report import PrivacyReport
from dpmf.errors import InvalidParameterError

__all__ = ["compose", "NAME"]


def _canonical(d: Mapping) -> str:
    return json.dumps(d, sort_keys=True, default=str)


def _load(item) -> tuple[PrivacyReport | dict, str]:
    """``(report object or dict, where it came from)``."""
    from dpmf.accounting.verify import load_report

    if isinstance(item, PrivacyReport):
        return item, "in memory"
    where = str(item) if isinstance(item, (str, Path)) and not str(item).lstrip().startswith("{") else "a report dict"
    return load_report(item), where


def _rebuilt(d: dict, where: str, search_dir, matrices, workers) -> tuple[PrivacyReport, dict]:
    """The report recomputed from its description, and what was found about the file."""
    from dpmf.accounting.dispatch import METHODS
    from dpmf.accounting.verify import verify_report

    method = d.get("method")
    if workers is not None and not (method == NAME or (method in METHODS and "workers" in METHODS[method].run_options)):
        workers = None  # (this part is recomputed in this process)
    try:
        v = verify_report(d, search_dir=search_dir, matrices=matrices, workers=workers)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"{where}: cannot compose this report soundly: {exc}") from None
    info = {"recomputed": True, "claim_held": v.holds, "edited": v.edited}
    if not v.holds:
        info["claim_problem"] = v.message
    return v.report, info


def compose(
    reports: Iterable[PrivacyReport | Mapping | str | Path],
    delta: float | None = None,
    *,
    times: int | Sequence[int] | None = None,
    discretization: float | None = None,
    search_dir: str | Path | None = None,
    matrices=None,
    workers: int | None = None,
) -> PrivacyReport:
    """The privacy of running every report's mechanism on the same data (module docstring).

    Args:
      reports: :class:`PrivacyReport` objects, report dicts, JSON text or paths to report files
        (files are recomputed from their descriptions, never trusted).
      delta: the delta of the composed epsilon; default the sum of the parts' deltas (each counted
        ``times``), the delta basic composition would spend, capped below 1.
      times: how many runs of each report (an int for all, or one per report; default 1): ``k``
        runs of one configuration for hyperparameter tuning.
      discretization: the loss grid of the composition (default the coarsest of the parts').
      search_dir, matrices: where dense strategy matrices referenced by a file are found
        (:func:`~dpmf.accounting.verify.verify_report`); workers: for recomputing MMCC / Monte Carlo.

    Returns:
      A :class:`PrivacyReport` with ``method="composition"``, its PLD or GDP curve attached
      (``tradeoff()``), ``certified`` only if every part is; ``diagnostics["parts"]`` lists each part
      (its report, times, how it was composed and where it came from), ``diagnostics["tight"]`` is
      False when some part entered only through its (epsilon, delta) (``diagnostics["not_tight"]``
      says which and why). ``noise_multiplier`` is the smallest of the parts' (a composition has no
      single one); ``strategy`` and ``scheme`` list the parts'.
    """
    if isinstance(reports, (PrivacyReport, Mapping, str, Path)):
        reports = [reports]
    items = list(reports)
    if not items:
        raise InvalidParameterError("reports must name at least one report to compose")
    if times is None:
        counts = [1] * len(items)
    elif isinstance(times, numbers.Integral) and not isinstance(times, bool):
        counts = [_v.positive_int("times", times)] * len(items)
    elif isinstance(times, (list, tuple)) or (hasattr(times, "__iter__") and not isinstance(times, (str, bytes))):
        counts = [_v.positive_int("times", t) for t in times]
        if len(counts) != len(items):
            raise InvalidParameterError(f"times must be one number or one per report ({len(items)}), got {len(counts)}")
    else:
        raise InvalidParameterError(f"times must be an integer >= 1 or one per report, got {times!r}")

    # group repeats (the same object, or equal report dicts) so each is recomputed once and self-composed
    groups: list[list] = []  # [report-or-dict, where, count]
    for item, k in zip(items, counts):
        obj, where = _load(item)
        for g in groups:
            same_dict = isinstance(obj, dict) and isinstance(g[0], dict) and _canonical(g[0]) == _canonical(obj)
            if g[0] is obj or same_dict:
                g[2] += k
                break
        else:
            groups.append([obj, where, k])

    parts = []
    for obj, where, k in groups:
        if isinstance(obj, PrivacyReport):  # made in this process: used as given (its curve, or its claim)
            rep, info = obj, {"recomputed": False}
        else:
            rep, info = _rebuilt(obj, where, search_dir, matrices, workers)
        parts.append((rep, k, {"source": where, **info}))
    return composition_report(parts, delta, discretization=discretization)


