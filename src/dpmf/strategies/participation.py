"""Participation schemas: how often, and how far apart, one example can contribute.

Used for sensitivity (multi-epoch MF paper, Sec. 2): an example participates in at most
``max_participations`` steps, any two at least ``min_sep`` steps apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpmf import validation as _v


@dataclass(frozen=True)
class Participation:
    """At most ``max_participations`` steps, consecutive ones at least ``min_sep`` apart.

    ``Participation(1, 1)`` is single participation; ``Participation(k, n // k)`` is the (k, b)
    fixed-epoch order; ``Participation(n, 1)`` is every step.
    """

    max_participations: int
    min_sep: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "max_participations", _v.positive_int("max_participations", self.max_participations)
        )
        object.__setattr__(self, "min_sep", _v.positive_int("min_sep", self.min_sep))

    @classmethod
    def single(cls) -> "Participation":
        return cls(1, 1)

    def describe(self) -> dict:
        return {"max_participations": self.max_participations, "min_sep": self.min_sep}
