"""Ghost rule for ``torch.nn.RNN``, ``GRU`` and ``LSTM`` (any number of layers, bidirectional,
``batch_first`` or not, with or without bias, ``proj_size``, given ``h0``/``c0`` or not).

Every weight of a recurrent layer enters its pre-activations linearly, once per step, so its
per-example gradient is a Linear's along the sequence. For one layer and direction with input rows
``x_{i,t}``, hidden states ``h_{i,t-1}`` and pre-activations ``u_t = W_ih x_t + b_ih``,
``v_t = W_hh h_{t-1} + b_hh`` (and, for a projected LSTM, ``h_t = W_hr m_t``):

    g(W_ih)_i = sum_t du_{i,t} x_{i,t}^T     g(b_ih)_i = sum_t du_{i,t}
    g(W_hh)_i = sum_t dv_{i,t} h_{i,t-1}^T   g(b_hh)_i = sum_t dv_{i,t}      g(W_hr)_i = sum_t dh_{i,t} m_{i,t}^T

where ``du, dv, dh`` are the gradients of the loss with respect to those pre-activations (for the GRU,
``dv`` is the gradient of ``W_hh h + b_hh`` itself, whose ``n`` block reaches the state through
``r * (.)``). The fused kernel PyTorch ran in the forward does not expose ``du, dv``, so the rule re-runs the
layer call in plain operations (:func:`~dpmf.training.torch.recurrent.recurrent_forward`, the same
equations, on the recorded input and initial state, with the weights detached) and asks autograd for
the gradients of the pre-activations at the recorded output gradients (``output``, ``h_n`` and, for the
LSTM, ``c_n``: any of them may carry gradient). One batched re-run and backward: no per-example loop,
no ``B x parameters`` tensor. Norms and clipped sums then come from
:func:`~dpmf.training.torch.ghost.linear.linear_parts` (Gram or materialized by cost, with its rounding
bound), so the norm bounds exactly what is summed: the recomputed ``(x, h, du, dv)``. The recomputation
agrees with the fused kernel to rounding (tested in float64); the clip bound does not depend on that.

Refused with a clear message: a ``PackedSequence`` input, unbatched (2-D) input, and dropout between
layers in training mode (a re-run cannot reproduce the masks; ``grad_sample_mode="functorch"`` can).
"""

from __future__ import annotations

from dpmf.errors import UnsupportedConfigurationError
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.ghost.linear import linear_parts
from dpmf.training.torch.ghost.materialized import combine
from dpmf.training.torch.ghost.registry import CALL_BATCH, LayerGradients, register_ghost_rule
from dpmf.training.torch.recurrent import RECURRENT_TYPES, check_unpacked, recurrent_forward, weight_names

torch = require_torch()

__all__ = ["recurrent_rule", "recurrent_batch"]


def _input_and_state(call):
    args, kwargs = call.args, call.kwargs
    x = args[0] if args else kwargs.get("input")
    hx = args[1] if len(args) > 1 else kwargs.get("hx")
    return x, hx


def recurrent_batch(module, args, kwargs) -> int:
    """The number of examples of a recurrent call: dim 0 of its input if ``batch_first``, else dim 1."""
    x = args[0] if args else kwargs.get("input")
    check_unpacked(module, x)
    if not isinstance(x, torch.Tensor) or x.ndim != 3:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise UnsupportedConfigurationError(
            f"{type(module).__name__} was called on an input of shape {shape}; ghost mode needs a batched input "
            "(batch, time, features) with batch_first=True, or (time, batch, features)"
        )
    return x.shape[0] if module.batch_first else x.shape[1]


def _renamed(part: LayerGradients, names: dict) -> LayerGradients:
    return LayerGradients(part.sq, lambda f: {names[k]: v for k, v in part.weighted_sum(f).items()})


def _part(A, G, weight_name, bias_name, trainable) -> LayerGradients | None:
    sub, names = {}, {}
    if weight_name in trainable:
        sub["weight"], names["weight"] = trainable[weight_name], weight_name
    if bias_name is not None and bias_name in trainable:
        sub["bias"], names["bias"] = trainable[bias_name], bias_name
    if not sub:
        return None
    return _renamed(linear_parts(A, G, sub), names)


@register_ghost_rule(*RECURRENT_TYPES)
def recurrent_rule(module, call, trainable):
    if module.training and module.dropout > 0 and module.num_layers > 1:
        raise UnsupportedConfigurationError(
            f"{type(module).__name__}(dropout={module.dropout}) in training mode draws dropout masks between its "
            "layers, which a re-run for per-example norms cannot reproduce; use grad_sample_mode='functorch', "
            "dropout=0 (e.g. dropout between separate single-layer modules), or eval mode"
        )
    x, hx = _input_and_state(call)
    w0 = next(iter(module.parameters()))
    work = torch.promote_types(w0.dtype, torch.float32)
    params = {n: p.detach().to(work) for n, p in module.named_parameters()}
    x = x.to(work)
    if hx is not None:
        hx = tuple(h.to(work) for h in hx) if isinstance(hx, (tuple, list)) else hx.to(work)
    record: list = []
    with torch.enable_grad():
        out = recurrent_forward(module, x, hx, record=record, params=params)
        flat = [out[0], *(out[1] if isinstance(out[1], tuple) else (out[1],))]
        pairs = [(o, g.to(work)) for o, g in zip(flat, call.grads) if g is not None]
        targets = []
        for _, _, rec in record:
            targets += [rec["gi"], *rec["gh"], *rec["hr"]]
        grads = torch.autograd.grad([o for o, _ in pairs], targets, [g for _, g in pairs], allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, targets)]
    parts, k = [], 0
    for layer, d, rec in record:
        names = weight_names(module, layer, d)
        T = len(rec["gh"])
        d_gi = grads[k]
        d_gh = torch.stack(grads[k + 1:k + 1 + T], 1)
        k += 1 + T + len(rec["hr"])
        pieces = [_part(rec["x"].detach(), d_gi, names["ih"], names.get("b_ih"), trainable),
                  _part(torch.stack(rec["h_in"], 1).detach(), d_gh, names["hh"], names.get("b_hh"), trainable)]
        if rec["hr"]:
            d_hr = torch.stack(grads[k - len(rec["hr"]):k], 1)
            pieces.append(_part(torch.stack(rec["m_in"], 1).detach(), d_hr, names["hr"], None, trainable))
        parts += [p for p in pieces if p is not None]
    return combine(parts)


for _t in RECURRENT_TYPES:
    CALL_BATCH[_t] = recurrent_batch
