"""Ghost rule for ``torch.nn.Conv1d`` / ``Conv2d`` through unfolding (im2col).

Unfolding the (padded) input turns a convolution into a Linear on a sequence: example ``i`` has
``A_i`` of shape ``T x (C_in k / groups)`` (``k`` the kernel volume, ``T`` the output positions) and
``G_i`` of shape ``T x (C_out / groups)`` per group, so the weight gradient of group ``j`` is
``G_{i,j}^T A_{i,j}`` and :mod:`~dpmf.training.torch.ghost.sequence` applies (Gram or materialized by
cost). With ``groups > 1`` the squared norms of the groups are added (the weight is block-diagonal: one
Gram over all channels would count blocks that are not parameters). Non-zero ``padding_mode`` and
``padding="same"`` are applied as an explicit pad first, as the layer itself does. Conv1d is Conv2d
on a height-1 image.
"""

from __future__ import annotations

from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.ghost.linear import linear_parts
from dpmf.training.torch.ghost.materialized import combine
from dpmf.training.torch.ghost.registry import LayerGradients, register_ghost_rule

torch = require_torch()
F = torch.nn.functional

#: unfolded inputs and output gradients of at most this many floats together are made contiguous once (a
#: ViT's patch embedding: 0.16 M); larger ones stay views, copied a chunk of examples at a time where a product
#: needs it (:func:`~dpmf.training.torch.ghost.sequence.sequence_weighted_sum`), so a large convolution's
#: step holds no second copy of them (issue 52: the copies once saved 1.5% of a ViT step)
CONTIGUOUS_FLOATS = 1 << 18


def _explicit_padding(module, x, spatial: int):
    """``x`` padded as the layer pads it, and the (zero) padding left for unfold."""
    if module.padding_mode != "zeros":
        return F.pad(x, module._reversed_padding_repeated_twice, mode=module.padding_mode), (0,) * spatial
    if isinstance(module.padding, str):
        if module.padding == "valid":
            return x, (0,) * spatial
        pads = []  # "same": total d (k - 1) per dim, the extra one on the right (as torch does)
        for d, k in zip(reversed(module.dilation), reversed(module.kernel_size)):
            total = d * (k - 1)
            pads += [total // 2, total - total // 2]
        return F.pad(x, pads), (0,) * spatial
    return x, tuple(module.padding)


@register_ghost_rule(torch.nn.Conv1d, torch.nn.Conv2d)
def conv_rule(module, call, trainable) -> LayerGradients | None:
    x, g = call.input, call.grad_output
    spatial = 1 if isinstance(module, torch.nn.Conv1d) else 2
    if not isinstance(x, torch.Tensor) or x.ndim != spatial + 2:
        return None  # unbatched input: the fallback decides
    x, padding = _explicit_padding(module, x, spatial)
    kernel, stride, dilation = module.kernel_size, module.stride, module.dilation
    if spatial == 1:  # Conv1d as Conv2d on a height-1 image
        x, g = x.unsqueeze(2), g.unsqueeze(2)
        kernel, stride, dilation, padding = (1, *kernel), (1, *stride), (1, *dilation), (0, *padding)
    B = x.shape[0]
    cols = F.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)  # (B, C_in k, T)
    T = cols.shape[2]
    groups = module.groups
    G = g.reshape(B, module.out_channels, T)
    d_in, d_out = cols.shape[1] // groups, module.out_channels // groups
    parts = []
    small = cols.numel() + G.numel() <= CONTIGUOUS_FLOATS
    for j in range(groups):
        A_j = cols[:, j * d_in : (j + 1) * d_in].transpose(1, 2)
        G_j = G[:, j * d_out : (j + 1) * d_out].transpose(1, 2)
        if small:  # one copy each, read by the Grams and the book-keeping product alike
            A_j, G_j = A_j.contiguous(), G_j.contiguous()
        parts.append(linear_parts(A_j, G_j, trainable, weight_shape=(d_out, d_in)))
    return combine_groups(parts, trainable, module)


def combine_groups(parts, trainable, module) -> LayerGradients:
    """Add the groups' squared norms; stack their clipped sums into the layer's weight and bias."""
    if len(parts) == 1:
        only = parts[0]

        def weighted_sum(f):
            out = only.weighted_sum(f)
            if "weight" in out:
                out["weight"] = out["weight"].reshape(module.weight.shape)
            return out

        return LayerGradients(only.sq, weighted_sum)
    sq = combine(parts).sq

    def weighted_sum(f):
        sums = [p.weighted_sum(f) for p in parts]
        out = {}
        if "weight" in trainable:
            out["weight"] = torch.cat([s["weight"] for s in sums], 0).reshape(module.weight.shape)
        if "bias" in trainable:
            out["bias"] = torch.cat([s["bias"] for s in sums], 0)
        return out

    return LayerGradients(sq, weighted_sum)


# the clipper may run these layers on detached parameters (their outputs are plain tensors)
conv_rule.detachable = True
