"""``PrivacyReport``: what an accountant says, with everything needed to check it later.

Two things every serialized report carries, each defined once here:

* :data:`ADJACENCY`, the one sentence saying which neighbouring datasets the guarantee is for
  (the ``adjacency`` field, printed by :meth:`PrivacyReport.summary`; its earlier wordings, which
  older reports carry, in :data:`ADJACENCY_VERSIONS`);
* a ``digest`` (:func:`report_digest`): a sha256 over a canonical JSON of the fields that describe
  the mechanism and the claim (:data:`DIGEST_KEYS`), written by :meth:`PrivacyReport.to_dict`.
  ``dpmf verify`` recomputes it to say whether a saved report was edited since it was produced.
  It detects edits, not forgery: anyone can recompute a digest for an edited report (it is not a
  signature).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Callable, Mapping

from dpmf._version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from dpmf.privacy.tradeoff import PrivacyCurve, TradeOff

_ZERO_OUT = (
    "zero-out: neighbouring datasets have the same size and differ in one example, whose contribution "
    "is zeroed out in one of them (add or remove; epsilon is the worst of both directions), so the "
    "dataset size is public and a normalizer computed from len(dataset) is sound; where the size must "
    "stay private, pass a public normalizer= to "
)
#: Every wording of the zero-out adjacency sentence dpmf has written, by version, oldest first. A
#: report carries the wording of the dpmf that wrote it, covered by its digest, so a report written
#: before a rewording still verifies as written (NOT EDITED); only the words changed, never the
#: adjacency. 1: until 2026-12 (it named the deprecated ``build_plan``); 2: ``make_private`` / ``RunSpec``.
ADJACENCY_VERSIONS = {
    1: _ZERO_OUT + "make_private / build_plan",
    2: _ZERO_OUT + "make_private (its RunSpec records it)",
}
#: The adjacency every dpmf epsilon is for, said once (DESIGN.md): every report states it.
ADJACENCY = ADJACENCY_VERSIONS[max(ADJACENCY_VERSIONS)]

#: The adjacency of a multi-attribution (user-level) report: what its epsilon is for instead.
USER_ADJACENCY = (
    "fixed-graph user level (multi-attribution; Dong & Ganesh 2026 Sec. 6, Ganesh et al. 2025): the "
    "attribution graph is public, every user has at most max_user_examples examples, and neighbouring "
    "datasets differ in all examples of one user, zeroed out in one of them (add or remove; epsilon is the "
    "worst of both directions)"
)

#: The report fields that describe the mechanism and the claim, covered by the ``digest``
#: (``target_epsilon`` is the claim of a calibration report, ``dpmf calibrate --json``).
DIGEST_KEYS = (
    "epsilon",
    "delta",
    "noise_multiplier",
    "method",
    "certified",
    "epsilon_by_direction",
    "strategy",
    "scheme",
    "options",
    "diagnostics",
    "adjacency",
    "target_epsilon",
)
DIGEST_PREFIX = "sha256:"
#: The :class:`PrivacyReport` fields kept in memory only (never serialized, not in the digest).
IN_MEMORY = ("curve", "curve_source")


def report_digest(report: Mapping) -> str:
    """``"sha256:<hex>"`` over the canonical JSON (sorted keys, no spaces) of the report dict's
    :data:`DIGEST_KEYS` that are present (values as :meth:`PrivacyReport.to_dict` writes them, so
    the digest of a report read back from its JSON is the digest it was written with).

    Edit detection only, not a signature: it tells an edited report from the one that was produced,
    it cannot tell who produced it.
    """
    canonical = {k: jsonable(report[k]) for k in DIGEST_KEYS if k in report}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return DIGEST_PREFIX + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class PrivacyReport:
    """An (epsilon, delta) guarantee and how it was obtained.

    ``certified`` is True only when ``epsilon`` is a proven upper bound (every dpmf accountant so
    far); estimates such as Monte Carlo before certification say False. ``epsilon_by_direction``
    holds the remove (P = with the example) and add (P = without) values.
    """

    epsilon: float
    delta: float
    noise_multiplier: float
    method: str
    certified: bool
    epsilon_by_direction: dict[str, float]
    strategy: dict
    scheme: dict
    diagnostics: dict = field(default_factory=dict)
    #: The value-affecting options the method was called with (execution options such as workers
    #: are not recorded): with ``strategy``, ``scheme``, ``noise_multiplier``, ``delta`` and
    #: ``method`` they recompute this report (:func:`dpmf.accounting.verify`).
    options: dict = field(default_factory=dict)
    adjacency: str = ADJACENCY
    dpmf_version: str = __version__
    #: In memory only (never serialized, not compared, not in the digest): what the accountant
    #: proved in its strongest form -- its pessimistic PLD, an exact GDP mu, or ``None`` when it has
    #: only the (epsilon, delta) pair (:class:`~dpmf.privacy.tradeoff.PrivacyCurve`). Used by
    #: :meth:`tradeoff` and :func:`dpmf.compose`; a report read back from JSON has none until it is
    #: recomputed from its description (:func:`dpmf.accounting.verify_report`).
    curve: "PrivacyCurve | None" = field(default=None, repr=False, compare=False)
    #: In memory only, like :attr:`curve`: a function building the curve on first use of
    #: :attr:`privacy_curve` (an accountant whose PLD costs more than its epsilon: ``allocation_pld``),
    #: so a caller who never composes or asks for a trade-off never pays for it.
    curve_source: "Callable[[], PrivacyCurve | None] | None" = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # a multi-attribution scheme's epsilon is user-level: say so unless an adjacency was given
        if self.adjacency == ADJACENCY and isinstance(self.scheme, Mapping) and self.scheme.get(
            "max_user_examples"
        ) is not None:
            object.__setattr__(self, "adjacency", USER_ADJACENCY)

    def to_dict(self) -> dict:
        """A JSON-ready dict (infinite epsilons become the string ``"inf"``), with the ``digest`` of
        its description and claim (:func:`report_digest`; a caller that adds a claim such as
        ``target_epsilon`` recomputes it). The in-memory :attr:`curve` is not written."""
        d = jsonable({f.name: getattr(self, f.name) for f in fields(self) if f.name not in IN_MEMORY})
        d["digest"] = report_digest(d)
        return d

    @property
    def privacy_curve(self) -> "PrivacyCurve":
        """:attr:`curve`, or -- when the method carries none -- the curve of the (epsilon, delta)
        claim alone (a sound but weaker f-DP statement)."""
        from dpmf.privacy.tradeoff import PrivacyCurve

        if self.curve is None and self.curve_source is not None:  # built once, on first use
            object.__setattr__(self, "curve", self.curve_source())
            object.__setattr__(self, "curve_source", None)
        if self.curve is not None:
            return self.curve
        return PrivacyCurve.from_epsilon_delta(
            self.epsilon, self.delta,
            note=f"the {self.method} report carries only its (epsilon, delta) claim (no PLD or GDP in this object)",
        )

    def tradeoff(self, fpr=None, *, symmetric: bool = False) -> "TradeOff":
        """f-DP: the largest true-positive rate any membership test can reach at each false-positive
        rate ``fpr`` (a number or an array in [0, 1]; default a grid from 1e-6 to 1), i.e.
        ``1 - f(fpr)`` for the trade-off function ``f`` this report proves, the worst of the add and
        remove directions. It is an upper bound (pessimistic: never more privacy than proved):
        from the report's PLD where its method has one, the exact Gaussian curve where the mechanism
        is exactly GDP (``result.mu``), else the bound implied by (epsilon, delta) alone --
        ``result.bound`` says which. An audit's empirical (FPR, TPR) must lie below it
        (:func:`dpmf.plots.tradeoff_plot`). The two orders of a pair (the test's null is "without the
        example", or "with it") are bounded separately and the larger TPR kept, which need not be
        concave; ``symmetric=True`` gives the concave curve of the worst delta of both directions
        instead (at least as large: the proper symmetric trade-off function ``1 - tpr`` that an f-DP
        audit's hypothesis needs).

        >>> import dpmf
        >>> r = dpmf.account(dpmf.strategies.Identity(10), dpmf.sampling.FixedOrderSampling(1, 10), 5.0, 1e-6)
        >>> t = r.tradeoff(0.01)
        >>> t.kind, round(t.mu, 4), round(t.tpr, 4)   # the Gaussian mechanism: Phi(Phi^-1(0.01) + 0.2)
        ('gdp', 0.2, 0.0167)
        """
        from dpmf.privacy.tradeoff import TradeOff

        return TradeOff.of(self.privacy_curve, fpr, certified=self.certified, symmetric=symmetric)

    def gdp_mu(self) -> tuple[float | None, str]:
        """``(mu, note)``: the exact GDP mu when the mechanism is exactly mu-GDP (the matrix mechanism
        without amplification: ``mu = sensitivity / sigma``, and compositions of such runs:
        ``sqrt(sum mu_i^2)``), else ``(None, why not)``."""
        from dpmf.privacy.tradeoff import gdp_mu_of

        return gdp_mu_of(self.privacy_curve)

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def summary(self) -> str:
        """For people: the claim on one line, then the adjacency it is for (:data:`ADJACENCY`)."""
        tag = "certified upper bound" if self.certified else "ESTIMATE, not a proof"
        return (
            f"epsilon = {self.epsilon:.6g} at delta = {self.delta:.3g} "
            f"(noise multiplier {self.noise_multiplier:.6g}, method {self.method}, {tag})\n"
            f"  adjacency: {self.adjacency}"
        )


def jsonable(obj):
    """``obj`` as plain JSON values, as reports are written: dataclasses and dicts as dicts (keys as
    strings), tuples as lists, numpy scalars as Python numbers, non-finite floats as ``"inf"``,
    ``"-inf"``, ``"nan"`` (JSON has none)."""
    if is_dataclass(obj) and not isinstance(obj, type):  # (as dataclasses.asdict did)
        return jsonable({f.name: getattr(obj, f.name) for f in fields(obj)})
    if isinstance(obj, float) and not math.isfinite(obj):
        return "inf" if obj > 0 else ("-inf" if obj < 0 else "nan")
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item"):  # numpy scalars
        return jsonable(obj.item())
    return obj


def pld_report(pld, *, delta: float, noise_multiplier: float, method: str, strategy, scheme, note: str,
               diagnostics: Mapping, start: float) -> PrivacyReport:
    """The certified report of an accountant whose answer is one pessimistic PLD ``pld``:
    ``epsilon = max over directions of eps(delta)``, the PLD carried as the report's curve (so
    :func:`dpmf.compose` composes it as a PLD), ``diagnostics`` plus the seconds since ``start``
    (a :func:`time.perf_counter` reading)."""
    from dpmf.privacy.tradeoff import PrivacyCurve  # (lazy: report.py stays light)

    by_dir = pld.epsilon_by_direction(delta)
    eps = max(by_dir.values())
    curve = PrivacyCurve.from_pld(pld, epsilon=eps, delta=delta, note=note)
    return PrivacyReport(
        epsilon=eps,
        delta=delta,
        noise_multiplier=noise_multiplier,
        method=method,
        certified=True,
        epsilon_by_direction=by_dir,
        strategy=strategy.describe(),
        scheme=scheme.describe(),
        diagnostics={**diagnostics, "seconds": time.perf_counter() - start},
        curve=curve,
    )
