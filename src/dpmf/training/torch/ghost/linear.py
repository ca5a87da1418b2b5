"""Ghost rule for ``torch.nn.Linear`` on inputs of any rank ``(B, ..., d_in)``.

All middle dimensions are flattened into one sequence axis ``T`` (a ``(B, H, T, d)`` input is a
sequence of ``H T`` rows), so the weight gradient of example ``i`` is ``G_i^T A_i`` and
:mod:`~dpmf.training.torch.ghost.sequence` gives its norm (Gram or materialized, by cost) and the
clipped sum ``(f * G)^T A``. The bias gradient ``sum_t g_{i,t}`` is summed first (``B x d_out``, as autograd forms it) rather than
through the Gram of ``G``: cheaper and free of cancellation; its norm is taken in float64 of that very
tensor, which is also what is summed. Except on short sequences (``1 < T <= FOLD_BIAS_T``) in the Gram form
for a call whose norms are its own: there the bias is folded into the weight's Gram norm (the input
``[A, 1]``: one contraction ``<G Gᵀ, A Aᵀ + 1>`` and its rounding bound for ``d_in + 1`` columns) and its
clipped sum taken from the book-keeping product's scaled output gradients (``sum_{i,t} f_i g_{i,t}``):
no per-example bias tensor, norm or product (a ViT step's 24 such biases, issue 52).
"""

from __future__ import annotations

from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.ghost.joint import Factored, PerExample, from_contributions
from dpmf.training.torch.ghost.materialized import combine, from_per_example
from dpmf.training.torch.ghost.registry import LayerGradients, register_ghost_rule
from dpmf.training.torch.ghost.sequence import (
    BMM_GRAM_T,
    norm_plan,
    sequence_sq_norms,
    sequence_weighted_sum,
)

torch = require_torch()

#: positions up to which a Linear layer's bias is folded into its weight's Gram norm (:func:`_folds`; a ViT's
#: 25 biases took ~3.6 ms of its step as separate per-example norms and sums, issue 52)
FOLD_BIAS_T = BMM_GRAM_T


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
    w_work = torch.promote_types(trainable["weight"].dtype, torch.float32) if "weight" in trainable else None
    work = torch.promote_types(trainable["bias"].dtype, torch.float32) if "bias" in trainable else None
    fold = w_work is not None and work == w_work and _folds(A.shape[1], A.shape[2], G.shape[2], A.device)
    if "weight" in trainable:  # grad W = G^T A = sum_t g_t a_t^T: U = G, V = A
        contributions["weight"] = Factored(G, A, work=w_work, ones=fold)
    if "bias" in trainable:
        if fold:  # its per-example rows formed only if read (a joined call)
            contributions["bias"] = PerExample(lambda: G.to(work).sum(1), folded_into=contributions["weight"])
        else:
            contributions["bias"] = PerExample(G.to(work).sum(1))
    return from_contributions(contributions, trainable)


def _folds(T: int, d_in: int, d_out: int, device) -> bool:
    """Whether a layer with a weight and a bias trainable in one working precision has the bias's norm folded
    into the weight's Gram contraction (the input ``[A, 1]``,
    :func:`~dpmf.training.torch.ghost.sequence.sequence_parts` ``ones``): ``1 < T <= FOLD_BIAS_T`` (the
    fold's rounding bound grows with ``T``: at ViT's 17 positions its norms are ~2e-6 relative above the
    separate ones) and the Gram form. Only for a call whose norms are its own: a joined call (tied or
    repeated parameters) takes the separate contributions."""
    return 1 < T <= FOLD_BIAS_T and norm_plan(T, d_in, d_out, syrk=device.type == "cpu") == "gram"


# the clipper may run these layers on detached parameters (their outputs are plain tensors)
linear_rule.detachable = True
