"""Ghost rule for ``torch.nn.Embedding``: norms by index counting, the clipped sum by ``index_add``.

Example ``i`` looks up rows ``x_{i,t}`` and receives output gradients ``g_{i,t}``; its gradient of row
``v`` is ``sum_{t: x_{i,t} = v} g_{i,t}``, so

    ||grad_i||^2 = sum_v ||sum_{t: x_{i,t} = v} g_{i,t}||^2,

computed by grouping the (example, token) pairs and summing their rows in float64 (``O(B T d)``, no
``T x T`` Gram). Positions holding ``padding_idx`` get no gradient and are dropped. The clipped sum
adds ``f_i g_{i,t}`` into row ``x_{i,t}``. ``sparse=True`` changes only the layout of autograd's own
gradient, not its values, so the rule covers it (the clipped sum is dense, as the noise is).
``max_norm`` and ``scale_grad_by_freq`` change the gradient: those layers go to the fallback. As a
:class:`~dpmf.training.torch.ghost.joint.Factored` contribution with one-hot rows, a lookup's cross
terms with a tied ``Linear`` (GPT-2's ``lm_head``) or a second lookup are exact.
"""

from __future__ import annotations

from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.ghost.joint import Factored, from_contributions
from dpmf.training.torch.ghost.registry import LayerGradients, register_ghost_rule

torch = require_torch()


@register_ghost_rule(torch.nn.Embedding)
def embedding_rule(module, call, trainable) -> LayerGradients | None:
    if module.max_norm is not None or module.scale_grad_by_freq:
        return None
    ids, g = call.input, call.grad_output
    if not isinstance(ids, torch.Tensor) or ids.ndim < 2:
        return None  # unbatched: the fallback decides
    B = ids.shape[0]
    idx = ids.reshape(B, -1)
    G = g.reshape(B, -1, module.embedding_dim)
    keep = None if module.padding_idx is None else idx != module.padding_idx
    work = torch.promote_types(trainable["weight"].dtype, torch.float32)
    return from_contributions({"weight": Factored(idx, G, rows=module.num_embeddings, keep=keep, work=work)},
                              trainable)


# the clipper may run these layers on detached parameters (their outputs are plain tensors)
embedding_rule.detachable = True
