r"""Exact reductions between configurations, used by every accountant that owns the pair.

**Identity under balls-in-bins, k epochs.** With :class:`~dpmf.sampling.BallsInBinsSampling` an
example keeps the same slot ``j`` in each of the ``k`` epochs, so with ``C = I`` its contribution is
``e_{j}, e_{j+b}, ..., e_{j+(k-1)b}``. Given the other examples' (public, zero-out adjacency)
inputs, the ``k`` releases of a slot are ``k`` independent ``N(mu_j, sigma^2)`` with the same mean;
their average is a sufficient statistic (Fisher-Neyman), distributed ``N(mu_j, sigma^2 / k)``, and
the remaining orthogonal contrasts do not depend on ``j``. The privacy loss of the whole run is
therefore *equal in law* to that of one epoch of ``b`` steps at noise ``sigma / sqrt(k)``: the
privacy profiles coincide, in both directions. Accountants use the one-epoch problem (``k`` times
fewer steps), never a composition of ``k`` one-epoch bounds, which would be looser.

>>> from dpmf.strategies import Identity
>>> from dpmf.sampling import BallsInBinsSampling
>>> red = identity_epochs_reduction(Identity(12), BallsInBinsSampling(epochs=4, steps=12))
>>> red.strategy.n, red.scheme.epochs, red.scheme.steps, red.noise_scale
(3, 1, 3, 0.5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpmf.sampling.schemes import BallsInBinsSampling
from dpmf.strategies.identity import Identity

__all__ = ["Reduction", "identity_epochs_reduction"]


@dataclass(frozen=True)
class Reduction:
    """An equivalent configuration: account ``strategy`` under ``scheme`` at ``noise_scale * sigma``."""

    strategy: object
    scheme: object
    noise_scale: float
    reason: str

    def describe(self) -> dict:
        return {
            "reason": self.reason,
            "strategy": self.strategy.describe(),
            "scheme": self.scheme.describe(),
            "noise_scale": self.noise_scale,
        }


def identity_epochs_reduction(strategy, scheme) -> Reduction | None:
    """The one-epoch equivalent of the identity under ``k > 1`` epochs of balls-in-bins with the
    slots *reused* (one slot, or ``num_selected`` slots, the same every epoch), else ``None``
    (module docstring). With ``num_selected = s`` reused slots the same argument holds slot by
    slot: each of the ``s`` chosen steps of an epoch is released ``k`` times with the same mean, so
    the run is one epoch of ``s``-of-``b`` allocation at ``sigma / sqrt(k)``. Fresh slots
    (``fresh_slots=True``) are a composition of ``k`` independent epochs, not this reduction."""
    if not (isinstance(strategy, Identity) and isinstance(scheme, BallsInBinsSampling) and scheme.epochs > 1):
        return None
    if scheme.fresh_slots:
        return None
    k, b, s = scheme.epochs, scheme.steps_per_epoch, scheme.num_selected
    what = "the same slot" if s == 1 else f"the same {s} slots"
    return Reduction(
        Identity(b),
        BallsInBinsSampling(epochs=1, steps=b, num_selected=s),
        1.0 / math.sqrt(k),
        f"identity, {k} epochs with {what} each epoch = one epoch of {b} steps at sigma / sqrt({k}) "
        "(the slot average is a sufficient statistic)",
    )
