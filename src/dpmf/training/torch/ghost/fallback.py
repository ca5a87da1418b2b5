"""Per-example gradients of one layer's own parameters with ``torch.func``: the fallback for layers
without a ghost rule (and configurations a rule declines).

From what the layer saw in the forward (its arguments) and the gradients that reached its outputs,
example ``i``'s gradient is the vector-Jacobian product of the layer applied to example ``i`` alone
(its batched arguments sliced to a batch of 1), with respect to the layer's own trainable
parameters, at the output gradient of example ``i``:

    g_i = vjp(theta -> layer(theta; x_i), G_i)

computed with ``vmap`` over the examples in chunks. Tensor arguments whose dim 0 is the batch size are
batched; the others are passed as they are. Only the layer is re-run (its sub-layers with their
parameters fixed), so the per-example gradients exist for this layer alone. Valid when the layer
treats examples independently (what per-example clipping needs anyway); a layer whose output has no
batch dimension is refused.
"""

from __future__ import annotations

from dpmf.errors import UnsupportedConfigurationError
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.batch import flat_tensors
from dpmf.training.torch.ghost.materialized import from_per_example

torch = require_torch()

__all__ = ["fallback_gradients"]

#: floats of per-example gradients per vmap chunk
CHUNK_FLOATS = 1 << 23


def fallback_gradients(module, call, trainable: dict, name: str):
    """:class:`~dpmf.training.torch.ghost.registry.LayerGradients` of ``module``'s own ``trainable``
    parameters from per-example vector-Jacobian products (module docstring)."""
    func = torch.func
    B = call.batch
    names = list(trainable)
    if B == 0:
        return from_per_example({n: torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
                                 for n, p in trainable.items()}, trainable)
    outs = call.outputs
    keep = [k for k, t in enumerate(outs) if call.grads[k] is not None]
    if not keep:
        return from_per_example({n: torch.zeros((B, *p.shape), dtype=p.dtype, device=p.device)
                                 for n, p in trainable.items()}, trainable)
    for k in keep:
        if outs[k].ndim == 0 or outs[k].shape[0] != B:
            raise UnsupportedConfigurationError(
                f"layer {name!r} ({type(module).__name__}) has no ghost rule and an output without the batch "
                f"dimension (shape {tuple(outs[k].shape)}, batch {B}); per-example gradients need batch-first "
                "outputs: use grad_sample_mode='functorch'"
            )
    cot = tuple(call.grads[k] for k in keep)

    def batched(v):
        return isinstance(v, torch.Tensor) and v.ndim >= 1 and v.shape[0] == B

    args, kwargs = call.args, call.kwargs
    arg_dims = tuple(0 if batched(a) else None for a in args)
    kw_names = sorted(kwargs)
    kw_vals = tuple(kwargs[k] for k in kw_names)
    kw_dims = tuple(0 if batched(v) else None for v in kw_vals)
    params = {n: p.detach() for n, p in trainable.items()}

    def one(example_args, example_kw, cotangent):
        a = tuple(x.unsqueeze(0) if d == 0 else x for x, d in zip(example_args, arg_dims))
        kv = {k: (v.unsqueeze(0) if d == 0 else v) for k, v, d in zip(kw_names, example_kw, kw_dims)}

        def forward(p):
            out = func.functional_call(module, p, a, kv, strict=False)
            flat = flat_tensors(out)
            return tuple(flat[k] for k in keep)

        _, pullback = func.vjp(forward, params)
        (grads,) = pullback(tuple(c.unsqueeze(0) for c in cotangent))
        return grads

    per_floats = max(1, sum(p.numel() for p in params.values()))
    step = max(1, CHUNK_FLOATS // per_floats)
    pieces = {n: [] for n in names}
    mapped = func.vmap(one, in_dims=(arg_dims, kw_dims, tuple(0 for _ in cot)), randomness="error")
    for lo in range(0, B, step):
        sl = slice(lo, lo + step)
        chunk_args = tuple(a[sl] if d == 0 else a for a, d in zip(args, arg_dims))
        chunk_kw = tuple(v[sl] if d == 0 else v for v, d in zip(kw_vals, kw_dims))
        try:
            grads = mapped(chunk_args, chunk_kw, tuple(c[sl] for c in cot))
        except (RuntimeError, NotImplementedError) as exc:
            if "randomness" in str(exc):
                raise UnsupportedConfigurationError(
                    f"layer {name!r} ({type(module).__name__}) has no ghost rule and draws random numbers in its "
                    "forward (dropout inside it), so re-running it per example would not reproduce the forward; "
                    "move the dropout out of the layer or use grad_sample_mode='functorch'"
                ) from exc
            first = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else type(exc).__name__
            raise UnsupportedConfigurationError(
                f"layer {name!r} ({type(module).__name__}) has no ghost rule, and its per-example gradients could "
                f"not be computed by re-running it per example under torch.func.vmap ({type(exc).__name__}: "
                f"{first}); give it a rule with dpmf.training.torch.ghost.register_ghost_rule, replace it by "
                "layers that have one, or use grad_sample_mode='functorch'"
            ) from exc
        for n in names:
            pieces[n].append(grads[n])
    per_example = {n: torch.cat(pieces[n]) for n in names}
    return from_per_example(per_example, trainable)
