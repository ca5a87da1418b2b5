"""Layer gradients from small materialized per-example gradients (biases, normalization layers,
the fallback): ``n_i^2 = sum_p ||g_{i,p}||^2`` and ``sum_i f_i g_{i,p}`` from the same tensors."""

from __future__ import annotations

from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.ghost.joint import PerExample
from dpmf.training.torch.ghost.registry import LayerGradients
from dpmf.training.torch.ghost.sequence import F64, rows_sq_norms

torch = require_torch()

__all__ = ["from_per_example", "combine"]


def from_per_example(per_example: dict, params: dict) -> LayerGradients:
    """``per_example[name]``: ``(B, *param.shape)`` per-example gradients (any float dtype; the norms
    are taken in float64, the sum in float64 then cast to the parameter's dtype)."""
    batch = next(iter(per_example.values())).shape[0]
    device = next(iter(params.values())).device
    sq = torch.zeros(batch, dtype=F64, device=device)
    for g in per_example.values():
        if batch:
            sq += rows_sq_norms(g.to(F64))

    def weighted_sum(f):
        out = {}
        for name, g in per_example.items():
            p = params[name]
            if batch == 0:
                out[name] = torch.zeros_like(p)
            else:
                out[name] = torch.tensordot(f.to(device), g.to(F64), dims=1).to(p.dtype)
        return out

    return LayerGradients(sq, weighted_sum, contributions={n: PerExample(g) for n, g in per_example.items()})


def combine(parts: list) -> LayerGradients:
    """The layer gradients of disjoint parameter sets of one layer, added."""
    sq = parts[0].sq
    for p in parts[1:]:
        sq = sq + p.sq

    def weighted_sum(f):
        out = {}
        for p in parts:
            out.update(p.weighted_sum(f))
        return out

    return LayerGradients(sq, weighted_sum)
