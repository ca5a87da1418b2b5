"""``torch.nn.RNN``, ``GRU`` and ``LSTM`` re-stated in plain tensor operations, for per-example work.

PyTorch runs its recurrent layers through fused kernels (``_VF.lstm``, mkldnn, cuDNN) that
``torch.func.vmap`` cannot batch (``nn.RNN``/``nn.GRU`` fail under ``vmap`` with a broadcast error;
``nn.LSTM`` falls back to a per-example loop) and whose backward cannot be re-entered per example.
This module computes the same function with ``F.linear`` and pointwise operations, step by step, so

* the functorch clipper (:mod:`~dpmf.training.torch.grad_sample`) can ``vmap`` the whole model:
  :func:`plain_recurrent` swaps the forward of every recurrent layer of a model for
  :func:`recurrent_forward` while per-example gradients are taken (the user's model is unchanged);
* the ghost rule (:mod:`~dpmf.training.torch.ghost.recurrent`) can re-run one layer call and read the
  gradients of the gate pre-activations, from which every weight's per-example gradient is a sum of
  outer products over time (a Linear along the sequence).

The equations are PyTorch's (``torch.nn.RNN``/``GRU``/``LSTM`` documentation; ``sigma`` the logistic
function, ``*`` elementwise), per layer ``l`` and direction, at step ``t``, with ``x_t`` the layer's
input (the previous layer's output, dropout applied between layers in training mode):

* RNN: ``h_t = act(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)``, ``act`` tanh or relu;
* GRU: ``[i_r, i_z, i_n] = W_ih x_t + b_ih``, ``[h_r, h_z, h_n] = W_hh h_{t-1} + b_hh``,
  ``r = sigma(i_r + h_r)``, ``z = sigma(i_z + h_z)``, ``n = tanh(i_n + r * h_n)``, ``h_t = (1 - z) * n + z * h_{t-1}``;
* LSTM: ``[i, f, g, o] = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh``, ``c_t = sigma(f) * c_{t-1} + sigma(i) * tanh(g)``,
  ``m_t = sigma(o) * tanh(c_t)``, ``h_t = W_hr m_t`` with ``proj_size > 0``, else ``h_t = m_t``.

The reverse direction of a bidirectional layer runs the same cell from ``t = T-1`` down to ``0`` with its
own weights (suffix ``_reverse``); the output concatenates both directions' ``h_t``. Packed sequences
(:class:`torch.nn.utils.rnn.PackedSequence`) are refused with a message that says what to pass instead.
"""

from __future__ import annotations

import contextlib
import types

from dpmf.errors import UnsupportedConfigurationError
from dpmf.training.torch._deps import require_torch

torch = require_torch()
F = torch.nn.functional

__all__ = ["RECURRENT_TYPES", "recurrent_forward", "weight_names", "plain_recurrent", "is_plain_recurrent", "check_unpacked"]

#: the layer types re-stated here (a subclass counts only if it keeps their ``forward``)
RECURRENT_TYPES = (torch.nn.RNN, torch.nn.GRU, torch.nn.LSTM)


def is_plain_recurrent(module) -> bool:
    """True for an ``nn.RNN``/``GRU``/``LSTM`` (or a subclass that keeps its ``forward``)."""
    for cls in RECURRENT_TYPES:
        if isinstance(module, cls):
            return type(module).forward is cls.forward
    return False


def check_unpacked(module, x, name: str = "") -> None:
    """Refuse a :class:`~torch.nn.utils.rnn.PackedSequence` input (clear error, naming the layer)."""
    if isinstance(x, torch.nn.utils.rnn.PackedSequence):
        where = f"layer {name!r} ({type(module).__name__})" if name else type(module).__name__
        raise UnsupportedConfigurationError(
            f"{where} was called on a PackedSequence; per-example clipping of recurrent layers needs a padded "
            "tensor (batch, time, features) with batch_first=True, or (time, batch, features): pass the padded "
            "batch and read each example's output at its own last position (out[arange(B), lengths - 1]) or "
            "mask the padded steps in the loss instead of packing"
        )


def weight_names(module, layer: int, direction: int) -> dict:
    """``{role: parameter name}`` of one layer and direction (roles ``ih``, ``hh``, ``b_ih``, ``b_hh``, ``hr``)."""
    sfx = f"_l{layer}" + ("_reverse" if direction else "")
    names = {"ih": "weight_ih" + sfx, "hh": "weight_hh" + sfx}
    if module.bias:
        names.update(b_ih="bias_ih" + sfx, b_hh="bias_hh" + sfx)
    if getattr(module, "proj_size", 0) > 0:
        names["hr"] = "weight_hr" + sfx
    return names


def _weights(module, layer: int, direction: int, params) -> dict:
    w = {"b_ih": None, "b_hh": None, "hr": None}
    for role, name in weight_names(module, layer, direction).items():
        w[role] = params[name] if params is not None and name in params else getattr(module, name)
    return w


def _kind(module) -> str:
    if isinstance(module, torch.nn.LSTM):
        return "LSTM"
    if isinstance(module, torch.nn.GRU):
        return "GRU"
    return "RNN_RELU" if module.nonlinearity == "relu" else "RNN_TANH"


def _linear(x, w, b, leaf: bool):
    """``x W^T + b``; with ``leaf`` a tensor that requires grad even if nothing before it does."""
    z = F.linear(x, w, b)
    if leaf and not z.requires_grad:
        z.requires_grad_()
    return z


def _direction(kind, w, xs, h, c, reverse: bool, record):
    """One layer, one direction over ``xs`` (B, T, d): ``(outputs (B, T, H_out), h_T, c_T)``.

    ``record`` (None, or a dict filled here): the pre-activation tensors whose gradients give the
    per-example weight gradients -- ``gi`` (B, T, G) with input ``xs``, ``gh`` (T tensors (B, G)) with
    inputs ``h_{t-1}``, and for a projected LSTM ``hr`` (T tensors (B, P)) with inputs ``m_t``."""
    leaf = record is not None
    T = xs.shape[1]
    gi = _linear(xs, w["ih"], w["b_ih"], leaf)
    order = range(T - 1, -1, -1) if reverse else range(T)
    outs = [None] * T
    gh_list, h_in, hr_list, m_in = [], [], [], []
    for t in order:
        gh = _linear(h, w["hh"], w["b_hh"], leaf)
        if leaf:
            gh_list.append(gh)
            h_in.append(h)
        x_t = gi[:, t]
        if kind == "GRU":
            i_r, i_z, i_n = x_t.chunk(3, -1)
            h_r, h_z, h_n = gh.chunk(3, -1)
            r = torch.sigmoid(i_r + h_r)
            z = torch.sigmoid(i_z + h_z)
            n = torch.tanh(i_n + r * h_n)
            h = (1 - z) * n + z * h
        elif kind == "LSTM":
            i, f, g, o = (x_t + gh).chunk(4, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            m = torch.sigmoid(o) * torch.tanh(c)
            if w["hr"] is not None:
                h = _linear(m, w["hr"], None, leaf)
                if leaf:
                    hr_list.append(h)
                    m_in.append(m)
            else:
                h = m
        else:
            pre = x_t + gh
            h = torch.tanh(pre) if kind == "RNN_TANH" else torch.relu(pre)
        outs[t] = h
    if record is not None:
        record.update(gi=gi, x=xs, gh=gh_list, h_in=h_in, hr=hr_list, m_in=m_in)
    return torch.stack(outs, 1), h, c


def recurrent_forward(module, input, hx=None, *, record: list | None = None, params: dict | None = None):
    """What ``module(input, hx)`` returns, for an ``nn.RNN``/``GRU``/``LSTM``, in plain operations.

    ``record``: a list that receives, per layer and direction (``(layer, direction, dict)``), the
    pre-activation tensors of :func:`_direction` (then every pre-activation requires grad, so their
    gradients can be asked of autograd even when nothing upstream requires grad). ``params``: tensors
    to use instead of the module's parameters of those names (e.g. detached copies)."""
    check_unpacked(module, input)
    kind = _kind(module)
    lstm = kind == "LSTM"
    batched = input.dim() == 3
    x = input if batched else input.unsqueeze(0 if module.batch_first else 1)
    if not module.batch_first:
        x = x.transpose(0, 1)
    B = x.shape[0]
    D = 2 if module.bidirectional else 1
    H = module.hidden_size
    H_out = module.proj_size if lstm and module.proj_size > 0 else H
    L = module.num_layers
    if hx is None:
        h0 = torch.zeros(L * D, B, H_out, dtype=x.dtype, device=x.device)
        c0 = torch.zeros(L * D, B, H, dtype=x.dtype, device=x.device) if lstm else None
    else:
        h0, c0 = (hx if lstm else (hx, None))
        if not batched:
            h0 = h0.unsqueeze(1)
            c0 = c0.unsqueeze(1) if c0 is not None else None
    layer_in = x
    hs, cs = [], []
    for layer in range(L):
        outs = []
        for d in range(D):
            k = layer * D + d
            rec = {} if record is not None else None
            out, h, c = _direction(kind, _weights(module, layer, d, params), layer_in, h0[k],
                                   c0[k] if lstm else None, bool(d), rec)
            if record is not None:
                record.append((layer, d, rec))
            outs.append(out)
            hs.append(h)
            cs.append(c)
        layer_in = outs[0] if D == 1 else torch.cat(outs, -1)
        if layer < L - 1 and module.dropout > 0 and module.training:
            layer_in = F.dropout(layer_in, module.dropout, True)
    out = layer_in if module.batch_first else layer_in.transpose(0, 1)
    h_n = torch.stack(hs, 0)
    c_n = torch.stack(cs, 0) if lstm else None
    if not batched:
        out = out.squeeze(0 if module.batch_first else 1)
        h_n = h_n.squeeze(1)
        c_n = c_n.squeeze(1) if lstm else None
    return (out, (h_n, c_n)) if lstm else (out, h_n)


@contextlib.contextmanager
def plain_recurrent(model):
    """Inside, every ``nn.RNN``/``GRU``/``LSTM`` of ``model`` runs :func:`recurrent_forward` (same
    function, plain operations that ``torch.func.vmap`` batches); the original forwards come back on exit."""
    swapped = [m for m in model.modules() if is_plain_recurrent(m) and "forward" not in m.__dict__]
    for m in swapped:
        m.forward = types.MethodType(recurrent_forward, m)
    try:
        yield swapped
    finally:
        for m in swapped:
            m.__dict__.pop("forward", None)
