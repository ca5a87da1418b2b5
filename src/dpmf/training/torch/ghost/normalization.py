"""Ghost rules for ``LayerNorm``, ``GroupNorm`` and ``RMSNorm``: their per-example gradients are small
(``B x`` the affine parameters), so they are materialized from the recomputed normalized input
``xhat`` (from the stored input and the layer's ``eps``, never from the output: dividing by the scale
is unstable near 0), in the working precision (at least float32, as autograd forms them). The norm
is taken in float64 of the very tensors that are summed, so the clip bound holds for them exactly as
in the per-example-gradient modes:

* LayerNorm over the last ``k`` dims: ``g_gamma,i = sum_t xhat_{i,t} * g_{i,t}``, ``g_beta,i = sum_t g_{i,t}``;
* GroupNorm on ``(B, C, *)``: ``xhat`` per (example, group); per channel, summed over positions;
* RMSNorm: ``xhat = x / sqrt(mean(x^2) + eps)`` over the normalized dims (``eps=None``: the dtype's eps).

For large inputs on the CPU (:func:`~dpmf.training.torch.ghost.sequence.compiled_form`), LayerNorm and RMSNorm
over one last dim form both sums in one compiled pass over ``x`` and ``g``
(:func:`~dpmf.training.torch.ghost._norms_compiled.norm_affine_grads`: the statistics and the sums in
float64, ``xhat`` never stored), float64 per-example gradients (about half the time of the tensor form).
"""

from __future__ import annotations

from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.ghost.materialized import from_per_example
from dpmf.training.torch.ghost.registry import register_ghost_rule
from dpmf.training.torch.ghost.sequence import compiled_form, in_dtype

torch = require_torch()


def _affine(xhat, g, trainable, reduce_dims, shape):
    """Per-example ``gamma``/``beta`` gradients: ``xhat * g`` and ``g`` summed over ``reduce_dims``."""

    def per_example(t):
        t = t.sum(reduce_dims) if reduce_dims else t  # (sum over () would sum everything)
        return t.reshape(g.shape[0], *shape)

    per = {}
    if "weight" in trainable:  # (xhat is the rule's own fresh tensor: multiplied in place where shapes agree)
        per["weight"] = per_example(xhat.mul_(g) if xhat.shape == g.shape and xhat.dtype == g.dtype else xhat * g)
    if "bias" in trainable:
        per["bias"] = per_example(g)
    return from_per_example(per, trainable)


def _over_last_dims(module, call):
    """``(x, g, normalized dims, summed dims)`` in the working precision for a layer normalizing its last dims, or None."""
    x = call.input
    k = len(module.normalized_shape)
    if not isinstance(x, torch.Tensor) or x.ndim < k + 1:
        return None
    work = _work(x)
    return in_dtype(x, work), in_dtype(call.grad_output, work), tuple(range(x.ndim - k, x.ndim)), tuple(range(1, x.ndim - k))


def _work(x):
    """The working precision: the input's, at least float32."""
    return torch.promote_types(x.dtype, torch.float32)


def _last_dims_rule(module, call, trainable, normalize, eps=None, center=True):
    """The rule of a layer normalizing over its last ``len(normalized_shape)`` dims (LayerNorm,
    RMSNorm): ``normalize(x, dims)`` gives the normalized input, then the affine parameters' sums. With
    ``eps`` (one normalized dim, CPU): the compiled pass of the module docstring (``center``: LayerNorm's
    mean subtracted)."""
    got = _over_last_dims(module, call)
    if got is None:
        return None
    xw, gw, dims, summed = got
    if eps is not None and len(dims) == 1 and xw.shape == gw.shape and compiled_form(xw, gw) and xw.numel():
        return _compiled_affine(xw, gw, trainable, float(eps), center)
    return _affine(normalize(xw, dims), gw, trainable, summed, tuple(module.normalized_shape))


def _compiled_affine(xw, gw, trainable, eps: float, center: bool):
    from dpmf.training.torch.ghost._norms_compiled import norm_affine_grads

    B, D = xw.shape[0], xw.shape[-1]
    wg = torch.empty(B, D, dtype=torch.float64)
    bg = torch.empty(B, D, dtype=torch.float64)
    norm_affine_grads(xw.reshape(B, -1, D).contiguous().numpy(), gw.reshape(B, -1, D).contiguous().numpy(), eps,
                      center, wg.numpy(), bg.numpy())
    per = {}
    if "weight" in trainable:
        per["weight"] = wg
    if "bias" in trainable:
        per["bias"] = bg
    return from_per_example(per, trainable)


def _unit_affine(shape, like):
    """Weight 1 and bias 0 of ``shape`` for ``like``'s dtype and device (cached: the same tensors every call)."""
    key = (tuple(shape), like.dtype, like.device)
    got = _UNIT.get(key)
    if got is None:
        got = _UNIT[key] = (torch.ones(shape, dtype=like.dtype, device=like.device),
                            torch.zeros(shape, dtype=like.dtype, device=like.device))
    return got


_UNIT: dict = {}


@register_ghost_rule(torch.nn.LayerNorm)
def layer_norm_rule(module, call, trainable):
    # the normalized input, as the layer forms it (one fused pass), times 1 plus 0 (exact): PyTorch's CPU kernel
    # with affine parameters took 54 us at a ViT's (32, 17, 128) where the one without took 79 (issue 52)
    def normalize(xw, dims):
        shape = tuple(module.normalized_shape)
        return torch.nn.functional.layer_norm(xw, shape, *_unit_affine(shape, xw), eps=module.eps)

    return _last_dims_rule(module, call, trainable, normalize, eps=module.eps)


@register_ghost_rule(torch.nn.GroupNorm)
def group_norm_rule(module, call, trainable):
    x = call.input
    if not isinstance(x, torch.Tensor) or x.ndim < 2:
        return None
    B, C = x.shape[0], x.shape[1]
    xw, gw = x.to(_work(x)), call.grad_output.to(_work(x))
    grouped = xw.reshape(B, module.num_groups, -1)
    mean = grouped.mean(2, keepdim=True)
    var = grouped.var(2, unbiased=False, keepdim=True)
    xhat = ((grouped - mean) / torch.sqrt(var + module.eps)).reshape(B, C, -1)
    return _affine(xhat, gw.reshape(B, C, -1), trainable, (2,), (C,))


# the clipper may run these layers on detached parameters (their outputs are plain tensors)
layer_norm_rule.detachable = True
group_norm_rule.detachable = True

if hasattr(torch.nn, "RMSNorm"):

    @register_ghost_rule(torch.nn.RMSNorm)
    def rms_norm_rule(module, call, trainable):
        eps = module.eps if module.eps is not None else torch.finfo(call.input.dtype).eps
        return _last_dims_rule(module, call, trainable,
                               lambda xw, dims: xw / torch.sqrt((xw * xw).mean(dims, keepdim=True) + eps),
                               eps=eps, center=False)

    rms_norm_rule.detachable = True
