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
``r * (.)``). The fused kernel PyTorch ran in the forward does not expose ``du, dv``, so the rule
recomputes them from the recorded input, initial state and the gradients that reached ``output``,
``h_n`` and, for the LSTM, ``c_n`` (any of them may carry gradient):
:func:`~dpmf.training.torch.recurrent.gate_gradients` runs the layer's equations forward without
autograd, keeping the gate activations, and the backward through time by hand. One batched pass: no
per-example loop, no ``B x parameters`` tensor. Norms and clipped sums then come from
the same factored contributions as a Linear's (:mod:`~dpmf.training.torch.ghost.joint`: Gram or
materialized by cost, with its rounding bound; a recurrent layer called twice in one forward is joined
with its cross terms like any repeated layer), so the norm bounds exactly what is summed: the recomputed ``(x, h, du, dv)``. The recomputation
agrees with autograd through the fused kernel to rounding (tested in float64); the clip bound does not
depend on that.

Refused with a clear message: a ``PackedSequence`` input, unbatched (2-D) input, dropout between
layers in training mode (a re-run cannot reproduce the masks; ``grad_sample_mode="functorch"`` can),
and a ``batch_first=False`` call with as many time steps as examples, whose layout shapes cannot tell
(:func:`~dpmf.training.torch.recurrent.check_layout`; :func:`~dpmf.training.torch.recurrent.time_first`
declares it).
"""

from __future__ import annotations

from dpmf.errors import UnsupportedConfigurationError
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.ghost.joint import Factored, PerExample, from_contributions
from dpmf.training.torch.ghost.registry import CALL_BATCH, LayerGradients, register_ghost_rule
from dpmf.training.torch.recurrent import RECURRENT_TYPES, check_layout, check_unpacked, gate_gradients, weight_names

torch = require_torch()

__all__ = ["recurrent_rule", "recurrent_batch"]


def _input_and_state(call):
    args, kwargs = call.args, call.kwargs
    x = args[0] if args else kwargs.get("input")
    hx = args[1] if len(args) > 1 else kwargs.get("hx")
    return x, hx


def recurrent_batch(module, args, kwargs, *, name: str = "", model_batch: int | None = None) -> int:
    """The number of examples of a recurrent call: dim 0 of its input if ``batch_first``, else dim 1; a
    time-first call with as many time steps as the model's ``model_batch`` examples is refused
    (:func:`~dpmf.training.torch.recurrent.check_layout`)."""
    x = args[0] if args else kwargs.get("input")
    check_unpacked(module, x, name)
    if not isinstance(x, torch.Tensor) or x.ndim != 3:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise UnsupportedConfigurationError(
            f"{type(module).__name__} was called on an input of shape {shape}; ghost mode needs a batched input "
            "(batch, time, features) with batch_first=True, or (time, batch, features)"
        )
    check_layout(module, x, model_batch or x.shape[1], name)  # (no model batch seen: the call's own)
    return x.shape[0] if module.batch_first else x.shape[1]


def _contributions(pieces, trainable) -> dict:
    """``{parameter name: contribution}``: a weight's per-example gradient ``sum_t g_t a_t^T`` is
    :class:`~dpmf.training.torch.ghost.joint.Factored` (``U = G``, ``V = A``, as a Linear's), a bias's
    ``sum_t g_t`` is materialized (:class:`~dpmf.training.torch.ghost.joint.PerExample`)."""
    out = {}
    for A, G, weight, bias in pieces:
        if weight in trainable:
            out[weight] = Factored(G, A, work=torch.promote_types(trainable[weight].dtype, torch.float32))
        if bias is not None and bias in trainable:
            out[bias] = PerExample(G.to(torch.promote_types(trainable[bias].dtype, torch.float32)).sum(1))
    return out


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
    grads = [None if g is None else g.to(work) for g in call.grads] + [None, None]
    pieces = []  # (A, G, weight name, bias name): one Linear along time each
    for layer, d, rec in gate_gradients(module, x, hx, grads[0], grads[1], grads[2], params):
        names = weight_names(module, layer, d)
        pieces.append((rec["x"], rec["dgi"], names["ih"], names.get("b_ih")))
        pieces.append((rec["h_in"], rec["dgh"], names["hh"], names.get("b_hh")))
        if rec["dhr"] is not None:
            pieces.append((rec["m"], rec["dhr"], names["hr"], None))
    return _layer_gradients(pieces, trainable, call, module)


def _layer_gradients(pieces, trainable, call, module) -> LayerGradients:
    """Norms from the recomputed tensors as they are; clipped sums with any example whose tensors are not
    finite set to 0 (its norm is then inf or NaN, so its clip factor is 0 anyway: ``0 * inf`` must not
    poison the sum). The rows are zeroed here, on the recomputed batch-first tensors, because the
    clipper's own zeroing of such examples works along dim 0, which is not the batch of every tensor a
    recurrent call holds (``(T, B, d)`` inputs, ``(L*D, B, H)`` states)."""
    B = call.batch
    device = pieces[0][0].device
    if not call.versions and _ambiguous(module, call):
        raise UnsupportedConfigurationError(
            f"{type(module).__name__} saw a non-finite gradient with nonfinite='skip', and its call has another "
            "dimension of the batch's size (time steps with batch_first=False, or layers x directions for the "
            "states), so the examples to drop cannot be told apart; use batch_first=True and another batch size, "
            "or nonfinite='raise'"
        )
    raw = from_contributions(_contributions(pieces, trainable), trainable)
    if bool(torch.isfinite(raw.sq).all()):  # a non-finite entry of A or G makes its example's norm inf/NaN
        return raw
    bad = torch.zeros(B, dtype=torch.bool, device=device)
    for A, G, _, _ in pieces:
        bad |= ~torch.isfinite(A).flatten(1).all(1) | ~torch.isfinite(G).flatten(1).all(1)
    bad |= ~torch.isfinite(raw.sq).to(device)
    keep = lambda t: torch.where(bad.view(-1, *([1] * (t.ndim - 1))), torch.zeros((), dtype=t.dtype, device=t.device), t)  # noqa: E731
    clean = from_contributions(_contributions([(keep(A), keep(G), w, b) for A, G, w, b in pieces], trainable),
                               trainable)
    sq = torch.where(bad.to(raw.sq.device), torch.full_like(raw.sq, float("nan")), raw.sq)
    # joint use (the layer called twice) takes norms from the contributions: keep the non-finite ones in
    # the first pass, so the example is seen; the clipper's second pass (a cleaned copy) sums the clean ones
    joint = clean.contributions if not call.versions else raw.contributions
    return LayerGradients(sq, clean.weighted_sum, contributions=joint)


def _ambiguous(module, call) -> bool:
    """Whether a tensor of this call has a dim 0 of the batch's size that is not the batch."""
    B = call.batch
    x, hx = _input_and_state(call)
    L = module.num_layers * (2 if module.bidirectional else 1)
    state = hx is not None or any(g is not None for g in call.grads[1:])
    return (not module.batch_first and x.shape[0] == B) or (state and L == B)


for _t in RECURRENT_TYPES:
    CALL_BATCH[_t] = recurrent_batch
