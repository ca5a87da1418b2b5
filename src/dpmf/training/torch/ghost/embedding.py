"""Ghost rule for ``torch.nn.Embedding``: norms by index counting, the clipped sum by ``index_add``.

Example ``i`` looks up rows ``x_{i,t}`` and receives output gradients ``g_{i,t}``; its gradient of row
``v`` is ``sum_{t: x_{i,t} = v} g_{i,t}``, so

    ||grad_i||^2 = sum_v ||sum_{t: x_{i,t} = v} g_{i,t}||^2,

computed by grouping the (example, token) pairs and summing their rows in float64 (``O(B T d)``, no
``T x T`` Gram). Positions holding ``padding_idx`` get no gradient and are dropped. The clipped sum
adds ``f_i g_{i,t}`` into row ``x_{i,t}``. ``max_norm``, ``scale_grad_by_freq`` and ``sparse=True``
change the gradient: those layers go to the fallback.
"""

from __future__ import annotations

from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.clipping import toward_zero
from dpmf.training.torch.ghost.registry import LayerGradients, register_ghost_rule
from dpmf.training.torch.ghost.sequence import F64

torch = require_torch()


@register_ghost_rule(torch.nn.Embedding)
def embedding_rule(module, call, trainable) -> LayerGradients | None:
    if module.max_norm is not None or module.scale_grad_by_freq or module.sparse:
        return None
    ids, g = call.input, call.grad_output
    if not isinstance(ids, torch.Tensor) or ids.ndim < 2:
        return None  # unbatched: the fallback decides
    w = trainable["weight"]
    B = ids.shape[0]
    V, d = module.num_embeddings, module.embedding_dim
    idx = ids.reshape(B, -1)
    G = g.reshape(B, -1, d)
    example = torch.arange(B, device=idx.device).unsqueeze(1).expand_as(idx)
    keep = torch.ones_like(idx, dtype=torch.bool) if module.padding_idx is None else idx != module.padding_idx
    rows = idx[keep]
    owner = example[keep]
    grads = G[keep]  # (K, d), in the gradient's dtype
    key = owner * V + rows
    uniq, inverse = torch.unique(key, return_inverse=True)
    grouped = torch.zeros(uniq.shape[0], d, dtype=F64, device=G.device).index_add_(0, inverse, grads.to(F64))
    sq = torch.zeros(B, dtype=F64, device=G.device).index_add_(0, uniq // V, (grouped * grouped).sum(1))

    def weighted_sum(f):
        scale = toward_zero(f.to(G.device), w.dtype)[owner].unsqueeze(1)
        out = torch.zeros_like(w).index_add_(0, rows, grads.to(w.dtype) * scale)
        return {"weight": out}

    return LayerGradients(sq, weighted_sum)
