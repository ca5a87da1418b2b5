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

Layout. dpmf's examples lie along dim 0 of the model's inputs; a layer with ``batch_first=False`` reads
its batch from dim 1 of its input. When the input's first two sizes are both the batch size (time steps
= examples), shapes cannot tell a ``(time, batch, features)`` input from a ``(batch, time, features)``
batch passed without transposing, which would mix examples inside the layer and clip nothing per
example. :func:`check_layout` refuses that call in every mode (ghost, functorch) with one
:class:`~dpmf.errors.InvalidParameterError`, unless the layer was declared time-first with
:func:`time_first` (a model that does transpose its batch). ``batch_first=True`` layers read the batch
from dim 0, as every other layer does, and need nothing.
"""

from __future__ import annotations

import contextlib
import types

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.training.torch._deps import require_torch

torch = require_torch()
F = torch.nn.functional

__all__ = ["RECURRENT_TYPES", "recurrent_forward", "weight_names", "plain_recurrent", "is_plain_recurrent", "check_unpacked",
           "time_first", "check_layout"]

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


#: the attribute :func:`time_first` sets on a layer
TIME_FIRST = "dpmf_time_first"


def time_first(layer):
    """Declare that ``layer`` (an ``nn.RNN``/``GRU``/``LSTM`` with ``batch_first=False``) is called on
    ``(time, batch, features)`` inputs, i.e. that the model transposes its batch before the layer, so a
    batch whose size equals the number of time steps is not refused as ambiguous
    (:func:`check_layout`). Returns ``layer``: ``self.rnn = time_first(torch.nn.LSTM(3, 8))``.

    Declare only what the model does: a declared layer fed an untransposed ``(batch, time, features)``
    batch of that size mixes examples, and its clipping then bounds nothing per example.
    """
    if not isinstance(layer, RECURRENT_TYPES):
        raise InvalidParameterError(
            f"time_first() takes a torch.nn.RNN, GRU or LSTM, got {type(layer).__name__}"
        )
    if layer.batch_first:
        raise InvalidParameterError(
            f"time_first() was given a {type(layer).__name__} with batch_first=True, which reads (batch, time, "
            "features) and needs no declaration; declare only batch_first=False layers called on (time, batch, features)"
        )
    setattr(layer, TIME_FIRST, True)
    return layer


def check_layout(module, x, batch, name: str = "", *, per_example: bool = False) -> None:
    """Refuse a call of a ``batch_first=False`` recurrent layer whose layout shapes cannot tell (see the
    module's *Layout*): its 3-D input has time steps = examples = ``batch > 1``, and the layer was not
    declared :func:`time_first`. ``per_example``: ``x`` is one example's view as a batch of 1 (inside
    ``torch.func.vmap``), whose first two sizes are then ``(batch, 1)`` or ``(1, batch)``. A few integer
    comparisons: no cost of note per call."""
    if (module.batch_first or not batch or batch < 2 or not isinstance(x, torch.Tensor) or x.ndim != 3
            or getattr(module, TIME_FIRST, False)):
        return
    a, b = x.shape[0], x.shape[1]
    if not ((a, b) in ((batch, 1), (1, batch)) if per_example else a == b == batch):
        return
    where = f"layer {name!r} ({type(module).__name__}(batch_first=False))" if name else (
        f"{type(module).__name__}(batch_first=False)")
    declare = f"dpmf.training.torch.time_first(model.{name})" if name else "dpmf.training.torch.time_first(layer)"
    raise InvalidParameterError(
        f"{where} was called on an input of shape {(batch, batch, x.shape[2])} for a batch of {batch} examples: "
        "with as many time steps as examples, shapes cannot tell (time, batch, features), which the layer reads, "
        "from a (batch, time, features) batch passed without transposing, which would mix examples inside the "
        "layer. Build the layer with batch_first=True and pass (batch, time, features); or, if the model does "
        f"transpose its batch to (time, batch, features), declare it once: {declare}"
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


def _checked_forward(name: str, batch: int | None):
    """:func:`recurrent_forward` behind :func:`check_layout` of one example's view (``batch``: the
    clipped batch's size; None: no check)."""

    def forward(self, input, hx=None):
        if batch is not None:
            check_layout(self, input, batch, name, per_example=True)
        return recurrent_forward(self, input, hx)

    return forward


@contextlib.contextmanager
def plain_recurrent(model, batch: int | None = None):
    """Inside, every ``nn.RNN``/``GRU``/``LSTM`` of ``model`` runs :func:`recurrent_forward` (same
    function, plain operations that ``torch.func.vmap`` batches); the original forwards come back on exit.
    ``batch``: the size of the batch whose examples run one at a time inside (each a batch of 1); a
    layer whose layout that batch makes ambiguous is refused (:func:`check_layout`)."""
    named = [(n, m) for n, m in model.named_modules() if is_plain_recurrent(m) and "forward" not in m.__dict__]
    swapped = [m for _, m in named]
    for n, m in named:
        m.forward = types.MethodType(_checked_forward(n, batch), m)
    try:
        yield swapped
    finally:
        for m in swapped:
            m.__dict__.pop("forward", None)


# ---------------------------------------------------------------------------- gate gradients (ghost rule)
def _states(kind, w, xs, h, c, reverse: bool) -> dict:
    """Forward of one layer and direction (no autograd), keeping what the backward through time needs:
    the outputs ``out``, the states each step read ``h_in``, and the derivative factors of every step,
    formed for all steps at once after the loop (only the recurrence itself runs step by step)."""
    B, T = xs.shape[:2]
    gi = F.linear(xs, w["ih"], w["b_ih"])
    H_out = h.shape[-1]
    h0 = h
    out = xs.new_empty(B, T, H_out)
    st = {"x": xs, "out": out}
    if kind == "GRU":
        H = H_out
        rz, n_all, ghn = xs.new_empty(B, T, 2 * H), xs.new_empty(B, T, H), xs.new_empty(B, T, H)
    elif kind == "LSTM":
        H = c.shape[-1]
        pre_all, c_all = xs.new_empty(B, T, 4 * H), xs.new_empty(B, T, H)
        c_in0 = c
        m_all = xs.new_empty(B, T, H) if w["hr"] is not None else None
    else:
        pre_all = xs.new_empty(B, T, H_out)
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        gh = F.linear(h, w["hh"], w["b_hh"])
        if kind == "GRU":
            s = torch.sigmoid(gi[:, t, :2 * H] + gh[:, :2 * H])
            rz[:, t] = s
            r, z = s[:, :H], s[:, H:]
            ghn[:, t] = h_n = gh[:, 2 * H:]
            n_all[:, t] = n = torch.tanh(gi[:, t, 2 * H:] + r * h_n)
            h = n + z * (h - n)
        elif kind == "LSTM":
            pre_all[:, t] = pre = gi[:, t] + gh
            s = torch.sigmoid(pre)
            c = s[:, H:2 * H] * c + s[:, :H] * torch.tanh(pre[:, 2 * H:3 * H])
            c_all[:, t] = c
            h = s[:, 3 * H:] * torch.tanh(c)
            if m_all is not None:
                m_all[:, t] = h
                h = F.linear(h, w["hr"])
        else:
            pre_all[:, t] = pre = gi[:, t] + gh
            h = torch.tanh(pre) if kind == "RNN_TANH" else torch.relu(pre)
        out[:, t] = h
    # the state step t read: h0 at the first step of the direction, else the neighbouring output
    if reverse:
        st["h_in"] = torch.cat((out[:, 1:], h0.unsqueeze(1)), 1)
    else:
        st["h_in"] = torch.cat((h0.unsqueeze(1), out[:, :-1]), 1)
    if kind == "GRU":  # du = [dpn Kr, dh Kz, dpn], dpn = dh Kn; dv = du * [1, 1, r]
        r, z = rz[..., :H], rz[..., H:]
        Kn = (1 - z) * (1 - n_all * n_all)
        st["P"] = torch.cat((Kn * ghn * r * (1 - r), (st["h_in"] - n_all) * z * (1 - z), Kn), -1)
        st["R"] = torch.cat((torch.ones_like(rz), r), -1)
        st["z"] = z
    elif kind == "LSTM":  # dc += dm Kc; du = [dc, dc, dc, dm] * P; dc_{t-1} = dc f
        s = torch.sigmoid(pre_all)
        i, f, o = s[..., :H], s[..., H:2 * H], s[..., 3 * H:]
        g = torch.tanh(pre_all[..., 2 * H:3 * H])
        c_in = torch.cat((c_all[:, 1:], c_in0.unsqueeze(1)), 1) if reverse else torch.cat(
            (c_in0.unsqueeze(1), c_all[:, :-1]), 1)
        tc = torch.tanh(c_all)
        st["Kc"] = o * (1 - tc * tc)
        st["P"] = torch.cat((g * i * (1 - i), c_in * f * (1 - f), i * (1 - g * g), tc * o * (1 - o)), -1)
        st["f"] = f
        st["m"] = m_all
    else:
        st["P"] = 1 - out * out if kind == "RNN_TANH" else (pre_all > 0).to(out.dtype)
    return st


def _through_time(kind, w, st, dout, dh, dc, reverse: bool) -> dict:
    """Backward through time of one layer and direction: the gradients of the pre-activations
    ``u_t = W_ih x_t + b_ih`` (``dgi``), ``v_t = W_hh h_{t-1} + b_hh`` (``dgh``) and, projected LSTM,
    of ``h_t = W_hr m_t`` (``dhr``), each ``(B, T, .)`` in time order (module docstring)."""
    B, T = dout.shape[:2]
    G = w["ih"].shape[0]
    dgi = dout.new_empty(B, T, G)
    dhr = dout.new_empty(B, T, dout.shape[2]) if kind == "LSTM" and w["hr"] is not None else None
    W_hh, P = w["hh"], st["P"]
    for t in (range(T) if reverse else range(T - 1, -1, -1)):
        dh = dh + dout[:, t]
        if kind == "GRU":
            dgi[:, t] = v = torch.cat((dh, dh, dh), -1) * P[:, t]
            dh = dh * st["z"][:, t] + (v * st["R"][:, t]) @ W_hh
        elif kind == "LSTM":
            if dhr is not None:
                dhr[:, t] = dh
                dm = dh @ w["hr"]
            else:
                dm = dh
            dc = dc + dm * st["Kc"][:, t]
            dgi[:, t] = v = torch.cat((dc, dc, dc, dm), -1) * P[:, t]
            dc = dc * st["f"][:, t]
            dh = v @ W_hh
        else:
            dgi[:, t] = v = dh * P[:, t]
            dh = v @ W_hh
    dgh = dgi * st["R"] if kind == "GRU" else dgi  # RNN/LSTM: u_t and v_t are added, same gradient
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
