"""Layer gradients from small materialized per-example gradients (biases, normalization layers,
the fallback): ``n_i^2 = sum_p ||g_{i,p}||^2`` and ``sum_i f_i g_{i,p}`` from the same tensors."""

from __future__ import annotations

from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.ghost.joint import PerExample, from_contributions
from dpmf.training.torch.ghost.registry import LayerGradients

torch = require_torch()

__all__ = ["from_per_example", "combine"]


def from_per_example(per_example: dict, params: dict) -> LayerGradients:
    """``per_example[name]``: ``(B, *param.shape)`` per-example gradients (any float dtype; the norms
    are taken in float64, the sum in float64 then cast to the parameter's dtype), as
    :class:`~dpmf.training.torch.ghost.joint.PerExample` contributions: their norms are formed when read,
    so the clipper forms those of many layers at once
    (:func:`~dpmf.training.torch.ghost.sequence.per_example_norms`)."""
    return from_contributions({n: PerExample(g) for n, g in per_example.items()}, params)


def combine(parts: list) -> LayerGradients:
    """The layer gradients of disjoint parameter sets of one layer, added (the norms formed when read)."""

    def sq():
        out = parts[0].sq
        for p in parts[1:]:
            out = out + p.sq
        return out

    def weighted_sum(f):
        out = {}
        for p in parts:
            out.update(p.weighted_sum(f))
        return out

    return LayerGradients(sq, weighted_sum)
