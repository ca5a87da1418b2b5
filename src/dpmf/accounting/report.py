"""``PrivacyReport``: what an accountant says, with everything needed to check it later.

Two things every serialized report carries, each defined once here:

* :data:`ADJACENCY`, the one sentence saying which neighbouring datasets the guarantee is for
  (the ``adjacency`` field, printed by :meth:`PrivacyReport.summary`);
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
from dataclasses import asdict, dataclass, field
from typing import Mapping

from dpmf._version import __version__

#: The adjacency every dpmf epsilon is for, said once (DESIGN.md): every report states it.
ADJACENCY = (
    "zero-out: neighbouring datasets have the same size and differ in one example, whose contribution "
    "is zeroed out in one of them (add or remove; epsilon is the worst of both directions), so the "
    "dataset size is public and a normalizer computed from len(dataset) is sound; where the size must "
    "stay private, pass a public normalizer= to make_private / build_plan"
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


def report_digest(report: Mapping) -> str:
    """``"sha256:<hex>"`` over the canonical JSON (sorted keys, no spaces) of the report dict's
    :data:`DIGEST_KEYS` that are present (values as :meth:`PrivacyReport.to_dict` writes them, so
    the digest of a report read back from its JSON is the digest it was written with).

    Edit detection only, not a signature: it tells an edited report from the one that was produced,
    it cannot tell who produced it.
    """
    canonical = {k: _jsonable(report[k]) for k in DIGEST_KEYS if k in report}
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

    def to_dict(self) -> dict:
        """A JSON-ready dict (infinite epsilons become the string ``"inf"``), with the ``digest`` of
        its description and claim (:func:`report_digest`; a caller that adds a claim such as
        ``target_epsilon`` recomputes it)."""
        d = _jsonable(asdict(self))
        d["digest"] = report_digest(d)
        return d

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


def _jsonable(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return "inf" if obj > 0 else ("-inf" if obj < 0 else "nan")
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item"):  # numpy scalars
        return _jsonable(obj.item())
    return obj
