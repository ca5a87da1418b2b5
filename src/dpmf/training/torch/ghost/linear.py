"""Ghost rule for ``torch.nn.Linear`` on inputs of any rank ``(B, ..., d_in)``.

All middle dimensions are flattened into one sequence axis ``T`` (a ``(B, H, T, d)`` input is a
sequence of ``H T`` rows), so the weight gradient of example ``i`` is ``G_i^T A_i`` and
:mod:`~dpmf.training.torch.ghost.sequence` gives its norm (Gram or materialized, by cost) and the
clipped sum ``(f * G)^T A``. The bias gradient ``sum_t g_{i,t}`` is summed first (``B x d_out``, as autograd forms it) rather than
through the Gram of ``G``: cheaper and free of cancellation; its norm is taken in float64 of that very
tensor, which is also what is summed.
"""

from __future__ import annotations

from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.ghost.joint import Factored, PerExample, from_contributions
from dpmf.training.torch.ghost.materialized import combine, from_per_example
from dpmf.training.torch.ghost.registry import LayerGradients, register_ghost_rule
from dpmf.training.torch.ghost.sequence import sequence_sq_norms, sequence_weighted_sum

torch = require_torch()


def linear_parts(A, G, trainable: dict, weight_shape=None) -> LayerGradients:
    """Weight (``G^T A``, reshaped to ``weight_shape``) and bias (``sum_t G``) parts for ``A``:
    ``(B, T, d_in)``, ``G``: ``(B, T, d_out)``; only the names present in ``trainable``."""
    parts = []
    if "weight" in trainable:
        w = trainable["weight"]
        work = torch.promote_types(w.dtype, torch.float32)
        sq = sequence_sq_norms(A, G, work)

        def weight_sum(f, A=A, G=G, w=w):
            return {"weight": sequence_weighted_sum(A, G, f.to(A.device), w.dtype).reshape(weight_shape or w.shape)}

        parts.append(LayerGradients(sq, weight_sum))
    if "bias" in trainable:
        work = torch.promote_types(trainable["bias"].dtype, torch.float32)
        parts.append(from_per_example({"bias": G.to(work).sum(1)}, {"bias": trainable["bias"]}))
    return combine(parts)


@register_ghost_rule(torch.nn.Linear)
def linear_rule(module, call, trainable):
    x, g = call.input, call.grad_output
    if not isinstance(x, torch.Tensor) or x.ndim < 2:
        return None  # an unbatched call: the fallback decides
    B = x.shape[0]
    A = x.reshape(B, -1, module.in_features)
    G = g.reshape(B, -1, module.out_features)
    contributions = {}
    if "weight" in trainable:  # grad W = G^T A = sum_t g_t a_t^T: U = G, V = A
        contributions["weight"] = Factored(G, A, work=torch.promote_types(trainable["weight"].dtype, torch.float32))
    if "bias" in trainable:
        contributions["bias"] = PerExample(G.to(torch.promote_types(trainable["bias"].dtype, torch.float32)).sum(1))
    return from_contributions(contributions, trainable)


# the clipper may run these layers on detached parameters (their outputs are plain tensors)
linear_rule.detachable = True
