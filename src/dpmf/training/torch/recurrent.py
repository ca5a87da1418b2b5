"""``torch.nn.RNN``, ``GRU`` and ``LSTM`` re-stated in plain tensor operations, for per-example work.

PyTorch runs its recurrent layers through fused kernels (``_VF.lstm``, mkldnn, cuDNN) that
``torch.func.vmap`` cannot batch (``nn.RNN``/``nn.GRU`` fail under ``vmap`` with a broadcast error;
``nn.LSTM`` falls back to a per-example loop) and whose backward cannot be re-entered per example.
This module computes the same function with ``F.linear`` and pointwise operations, step by step, so

* the functorch clipper (:mod:`~dpmf.training.torch.grad_sample`) can ``vmap`` the whole model:
  :func:`plain_recurrent` swaps the forward of every recurrent layer of a model for
  :func:`recurrent_forward` while per-example gradients are taken (the user's model is unchanged);
* the ghost rule (:mod:`~dpmf.training.torch.ghost.recurrent`) shares its equations, weight names
  (:func:`weight_names`) and kinds (:func:`cell_kind`); its gate gradients are formed in
  :mod:`~dpmf.training.torch.ghost.recurrent_gates`.

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

__all__ = ["RECURRENT_TYPES", "recurrent_forward", "weight_names", "cell_kind", "plain_recurrent", "is_plain_recurrent", "check_unpacked",
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


def cell_kind(module) -> str:
    """``"LSTM"``, ``"GRU"``, ``"RNN_TANH"`` or ``"RNN_RELU"``: which equations ``module`` runs."""
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
    kind = cell_kind(module)
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
