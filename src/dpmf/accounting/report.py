"""``PrivacyReport``: what an accountant says, with everything needed to check it later."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from dpmf._version import __version__

ADJACENCY = "zero-out (add or remove one example); epsilon is the worst of both directions"


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
        """A JSON-ready dict (infinite epsilons become the string ``"inf"``)."""
        return _jsonable(asdict(self))

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def summary(self) -> str:
        """One line for people."""
        tag = "certified upper bound" if self.certified else "ESTIMATE, not a proof"
        return (
            f"epsilon = {self.epsilon:.6g} at delta = {self.delta:.3g} "
            f"(noise multiplier {self.noise_multiplier:.6g}, method {self.method}, {tag})"
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
