"""``torch.nn.RNN``, ``GRU`` and ``LSTM`` re-stated in plain tensor operations, for per-example work.

PyTorch runs its recurrent layers through fused kernels (``_VF.lstm``, mkldnn, cuDNN) that
``torch.func.vmap`` cannot batch (``nn.RNN``/``nn.GRU`` fail under ``vmap`` with a broadcast error;
``nn.LSTM`` falls back to a per-example loop) and whose backward cannot be re-entered per example.
This module computes the same function with ``F.linear`` and pointwise operations, step by step, so

* the functorch clipper (:mod:`~dpmf.training.torch.grad_sample`) can ``vmap`` the whole model:
  :func:`plain_recurrent` swaps the forward of every recurrent layer of a model for
  :func:`recurrent_forward` while per-example gradients are taken (the user's model is unchanged);
* the ghost rule (:mod:`~dpmf.training.torch.ghost.recurrent`) gets, from :func:`gate_gradients`, the
  gradients of the gate pre-activations of one recorded layer call (a forward without autograd that keeps
  the gate activations, then the backward through time by hand), from which every weight's
  per-example gradient is a sum of outer products over time (a Linear along the sequence).

Backward through time (derivatives from the saved outputs: ``sigma' = s (1 - s)``, ``tanh' = 1 - y^2``,
``relu' = [y > 0]``), with ``dh`` the gradient reaching ``h_t`` (from the output at ``t`` and from step
``t + 1``) and ``u, v`` the input and hidden pre-activations:

* RNN: ``du_t = dv_t = dh * act'``, ``dh_{t-1} = dv_t W_hh``;
* GRU: ``dn = dh (1 - z) (1 - n^2)``, ``du = [dr', dz', dn]``, ``dv = [dr', dz', dn * r]`` with
  ``dr' = dn * h_n * r (1 - r)``, ``dz' = dh (h_{t-1} - n) z (1 - z)``; ``dh_{t-1} = dh z + dv W_hh``;
* LSTM: ``dm = dh W_hr`` (projected; ``dh`` is then the gradient of ``W_hr m_t``) or ``dh``;
  ``dc = dc_{t+1} + dm o (1 - tanh(c_t)^2)``; ``du = dv = [dc g i(1-i), dc c_{t-1} f(1-f), dc i (1-g^2),
  dm tanh(c_t) o(1-o)]``; ``dc_{t-1} = dc f``, ``dh_{t-1} = dv W_hh``;

and a lower layer's output receives ``sum over directions du W_ih``. Tested equal to autograd through
PyTorch's own layers (float64 per-example references, every option).

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


def _direction(kind, w, xs, h, c, reverse: bool):
    """One layer, one direction over ``xs`` (B, T, d): ``(outputs (B, T, H_out), h_T, c_T)``."""
    T = xs.shape[1]
    gi = F.linear(xs, w["ih"], w["b_ih"])
    outs = [None] * T
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        gh = F.linear(h, w["hh"], w["b_hh"])
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
            h = torch.sigmoid(o) * torch.tanh(c)
            if w["hr"] is not None:
                h = F.linear(h, w["hr"])
        else:
            pre = x_t + gh
            h = torch.tanh(pre) if kind == "RNN_TANH" else torch.relu(pre)
        outs[t] = h
    return torch.stack(outs, 1), h, c


def recurrent_forward(module, input, hx=None, *, params: dict | None = None):
    """What ``module(input, hx)`` returns, for an ``nn.RNN``/``GRU``/``LSTM``, in plain operations
    (differentiable, and batched by ``torch.func.vmap``). ``params``: tensors to use instead of the
    module's parameters of those names."""
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
            out, h, c = _direction(kind, _weights(module, layer, d, params), layer_in, h0[k],
                                   c0[k] if lstm else None, bool(d))
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


# ---------------------------------------------------------------------------- gate gradients (ghost rule)
def _states(kind, w, xs, h, c, reverse: bool) -> dict:
    """Forward of one layer and direction (no autograd), keeping what the backward through time needs."""
    B, T = xs.shape[:2]
    gi = F.linear(xs, w["ih"], w["b_ih"])
    H_out = h.shape[-1]
    st = {"x": xs, "h_in": xs.new_empty(B, T, H_out), "out": xs.new_empty(B, T, H_out)}
    if kind == "GRU":
        H = H_out
        st.update(r=xs.new_empty(B, T, H), z=xs.new_empty(B, T, H), n=xs.new_empty(B, T, H),
                  ghn=xs.new_empty(B, T, H))
    elif kind == "LSTM":
        H = c.shape[-1]
        st.update(a=xs.new_empty(B, T, 4 * H), tc=xs.new_empty(B, T, H), c_in=xs.new_empty(B, T, H))
        if w["hr"] is not None:
            st["m"] = xs.new_empty(B, T, H)
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        st["h_in"][:, t] = h
        gh = F.linear(h, w["hh"], w["b_hh"])
        if kind == "GRU":
            i_r, i_z, i_n = gi[:, t].chunk(3, -1)
            h_r, h_z, h_n = gh.chunk(3, -1)
            r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
            n = torch.tanh(i_n + r * h_n)
            st["r"][:, t], st["z"][:, t], st["n"][:, t], st["ghn"][:, t] = r, z, n, h_n
            h = (1 - z) * n + z * h
        elif kind == "LSTM":
            pre = gi[:, t] + gh
            i, f, g, o = pre.chunk(4, -1)
            i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
            st["a"][:, t] = torch.cat((i, f, g, o), -1)
            st["c_in"][:, t] = c
            c = f * c + i * g
            tc = torch.tanh(c)
            st["tc"][:, t] = tc
            h = o * tc
            if w["hr"] is not None:
                st["m"][:, t] = h
                h = F.linear(h, w["hr"])
        else:
            pre = gi[:, t] + gh
            h = torch.tanh(pre) if kind == "RNN_TANH" else torch.relu(pre)
        st["out"][:, t] = h
    return st


def _through_time(kind, w, st, dout, dh, dc, reverse: bool) -> dict:
    """Backward through time of one layer and direction: the gradients of the pre-activations
    ``u_t = W_ih x_t + b_ih`` (``dgi``), ``v_t = W_hh h_{t-1} + b_hh`` (``dgh``) and, projected LSTM,
    of ``h_t = W_hr m_t`` (``dhr``), each ``(B, T, .)`` in time order."""
    B, T = dout.shape[:2]
    G = w["ih"].shape[0]
    dgi = dout.new_empty(B, T, G)
    dgh = dout.new_empty(B, T, G) if kind == "GRU" else dgi  # RNN/LSTM: u_t and v_t are added, same gradient
    dhr = dout.new_empty(B, T, dout.shape[2]) if kind == "LSTM" and w["hr"] is not None else None
    W_hh = w["hh"]
    for t in (range(T) if reverse else range(T - 1, -1, -1)):
        dh = dh + dout[:, t]
        if kind == "GRU":
            r, z, n, ghn, h_prev = st["r"][:, t], st["z"][:, t], st["n"][:, t], st["ghn"][:, t], st["h_in"][:, t]
            dpn = dh * (1 - z) * (1 - n * n)
            d_r = dpn * ghn * r * (1 - r)
            d_z = dh * (h_prev - n) * z * (1 - z)
            dgi[:, t] = torch.cat((d_r, d_z, dpn), -1)
            dgh[:, t] = v = torch.cat((d_r, d_z, dpn * r), -1)
            dh = dh * z + v @ W_hh
        elif kind == "LSTM":
            if dhr is not None:
                dhr[:, t] = dh
                dm = dh @ w["hr"]
            else:
                dm = dh
            i, f, g, o = st["a"][:, t].chunk(4, -1)
            tc = st["tc"][:, t]
            dc = dc + dm * o * (1 - tc * tc)
            dgi[:, t] = v = torch.cat((dc * g * i * (1 - i), dc * st["c_in"][:, t] * f * (1 - f),
                                       dc * i * (1 - g * g), dm * tc * o * (1 - o)), -1)
            dc = dc * f
            dh = v @ W_hh
        else:
            h = st["out"][:, t]
            v = dh * (1 - h * h) if kind == "RNN_TANH" else dh * (h > 0)
            dgi[:, t] = v
            dh = v @ W_hh
    return {"dgi": dgi, "dgh": dgh, "dhr": dhr}


def gate_gradients(module, input, hx, grad_output, grad_h_n, grad_c_n, params: dict) -> list:
    """Per layer and direction, ``(layer, direction, tensors)`` with the inputs and pre-activation
    gradients whose outer products over time are the per-example weight gradients: ``x``/``dgi``
    (``W_ih``, ``b_ih``), ``h_in``/``dgh`` (``W_hh``, ``b_hh``; ``h_in`` the state each step read),
    ``m``/``dhr`` (``W_hr``), all batch-first ``(B, T, .)``.

    A forward without autograd that keeps the gate activations, then the backward through time of
    :func:`recurrent_forward`'s equations by hand (the derivatives of ``sigma`` and ``tanh`` from their
    outputs), layer by layer from the top, at the gradients that reached ``output``, ``h_n`` and ``c_n``
    (``None``: zero). ``input``: batched 3-D, in the layer's layout; ``hx`` as the layer takes it."""
    check_unpacked(module, input)
    kind = _kind(module)
    lstm = kind == "LSTM"
    x = input if module.batch_first else input.transpose(0, 1).contiguous()
    B, T = x.shape[:2]
    D = 2 if module.bidirectional else 1
    H = module.hidden_size
    H_out = module.proj_size if lstm and module.proj_size > 0 else H
    L = module.num_layers
    if hx is None:
        h0 = x.new_zeros(L * D, B, H_out)
        c0 = x.new_zeros(L * D, B, H) if lstm else None
    else:
        h0, c0 = (hx if lstm else (hx, None))
    with torch.no_grad():
        saved, layer_in = [], x
        for layer in range(L):
            for d in range(D):
                k = layer * D + d
                w = _weights(module, layer, d, params)
                saved.append((w, _states(kind, w, layer_in, h0[k], c0[k] if lstm else None, bool(d))))
            outs = [saved[layer * D + d][1]["out"] for d in range(D)]
            layer_in = outs[0] if D == 1 else torch.cat(outs, -1)
        if grad_output is None:
            dout = x.new_zeros(B, T, D * H_out)
        else:
            dout = grad_output if module.batch_first else grad_output.transpose(0, 1)
        result = [None] * (L * D)
        for layer in range(L - 1, -1, -1):
            d_below = None
            for d in range(D):
                k = layer * D + d
                w, st = saved[k]
                dh = grad_h_n[k] if grad_h_n is not None else x.new_zeros(B, H_out)
                dc = (grad_c_n[k] if grad_c_n is not None else x.new_zeros(B, H)) if lstm else None
                g = _through_time(kind, w, st, dout[..., d * H_out:(d + 1) * H_out], dh, dc, bool(d))
                result[k] = (layer, d, {"x": st["x"], "dgi": g["dgi"], "h_in": st["h_in"], "dgh": g["dgh"],
                                        "m": st.get("m"), "dhr": g["dhr"]})
                if layer:
                    below = g["dgi"] @ w["ih"]
                    d_below = below if d_below is None else d_below + below
            dout = d_below
    return result
