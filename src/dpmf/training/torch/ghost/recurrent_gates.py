"""The gate pre-activation gradients of one recorded ``nn.RNN``/``GRU``/``LSTM`` call, for the ghost rule
(:mod:`~dpmf.training.torch.ghost.recurrent`): every weight's per-example gradient is a sum over time of
outer products of these with the layer's inputs or states (a Linear along the sequence).

The equations are PyTorch's (:mod:`~dpmf.training.torch.recurrent`). Per layer and direction, with
``x_t`` its input, ``h_{t-1}`` the state step ``t`` read (``h0`` at the direction's first step, else the
neighbouring output), ``u_t = W_ih x_t + b_ih`` and ``v_t = W_hh h_{t-1} + b_hh``:

1. *Outputs*: the top layer's outputs are the recorded call's ``output`` (the rule checks that it was not
   modified in place since the forward); a lower layer's are PyTorch's own kernel run again on that
   layer alone (``torch.lstm`` / ``gru`` / ``rnn_*``, one layer, no autograd). So every ``h_{t-1}`` is
   known before any gate is formed.
2. *Gates*, batched over all steps (no loop): RNN needs none (``act'`` from the outputs); GRU
   ``r, z = sigma(u + v)``, ``n = tanh(u_n + r v_n)`` from two GEMMs; LSTM ``[i, f, g, o]`` from two GEMMs
   and the cell recurrence ``c_t = f c_{t-1} + i g`` (the one loop of the forward: elementwise).
3. *Backward through time*, with ``dh`` the gradient reaching ``h_t`` (from the output at ``t`` and from
   step ``t + 1``), derivatives from the saved values (``sigma' = s (1 - s)``, ``tanh' = 1 - y^2``,
   ``relu' = [y > 0]``):

   * RNN: ``du_t = dv_t = dh act'``, ``dh_{t-1} = dv_t W_hh``;
   * GRU: ``dn = dh (1 - z)(1 - n^2)``, ``du = [dn v_n r (1 - r), dh (h_{t-1} - n) z (1 - z), dn]``,
     ``dv = du * [1, 1, r]``; ``dh_{t-1} = dh z + dv W_hh``;
   * LSTM: ``dm = dh W_hr`` (projected; ``dh`` is then the gradient of ``W_hr m_t``) or ``dh``;
     ``dc = dc_{t+1} + dm o (1 - tanh(c_t)^2)``; ``du = dv = [dc g i (1-i), dc c_{t-1} f (1-f), dc i (1-g^2),
     dm tanh(c_t) o (1-o)]``; ``dc_{t-1} = dc f``, ``dh_{t-1} = dv W_hh``;

   and a lower layer's output receives ``sum over directions du W_ih``. On CPU the two sequential loops
   (cell recurrence, backward through time) are compiled (:mod:`~dpmf.training.torch.ghost._recurrent_compiled`,
   BLAS on one thread); elsewhere they run as per-step tensor operations with the same formulas.

In the loop an LSTM without projection skips steps 1-2: its forward was the rule's own
(:func:`lstm_forward_kept`, which keeps the activations and cells, time-major ``(T, B, .)``, so each step's
block is contiguous for the compiled loops and the per-step products), and :func:`lstm_backward_kept` runs
step 3 on them.

The same backward gives the layer's input and initial-state gradients (:func:`gates_and_input_gradients`:
``d_input = sum over directions du W_ih`` of the first layer, ``d_h0``/``d_c0`` what each recurrence carries
past its first step): in the loop it *is* the layer's backward
(:class:`~dpmf.training.torch.ghost.recurrent._OwnBackward`). All tensors batch-major ``(B, T, .)`` and contiguous. Tested equal to autograd through PyTorch's own
layers (float64 per-example references, every option) and the compiled loops equal to the tensor loops.
The norms need no agreement beyond rounding: they bound exactly the tensors returned here.
"""

from __future__ import annotations

from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.recurrent import cell_kind, check_unpacked, weight_names

torch = require_torch()
F = torch.nn.functional

__all__ = ["gate_gradients", "gates_and_input_gradients", "rerun_layer", "own_lstm_applies", "lstm_forward_kept",
           "lstm_backward_kept"]

#: PyTorch's fused recurrent functions (what ``nn.RNN``/``GRU``/``LSTM`` call), by :func:`cell_kind`
_KERNELS = {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu"}


def _weights(module, layer: int, direction: int, params) -> dict:
    w = {"b_ih": None, "b_hh": None, "hr": None}
    for role, name in weight_names(module, layer, direction).items():
        w[role] = params[name]
    return w


def rerun_layer(module, layer: int, x, h0, c0, params):
    """Layer ``layer``'s output ``(B, T, D * H_out)`` for the batch-major input ``x``, both directions, by
    PyTorch's own kernel on that layer alone (no dropout, no autograd); ``h0``, ``c0``: its ``(D, B, .)``
    initial states; ``params``: the module's parameters by name."""
    D = 2 if module.bidirectional else 1
    kind = cell_kind(module)
    roles = ("ih", "hh", "b_ih", "b_hh", "hr")
    flat = []
    for d in range(D):
        names = weight_names(module, layer, d)
        flat += [params[names[r]] for r in roles if r in names]
    fn = getattr(torch, _KERNELS[kind])
    hx = (h0.contiguous(), c0.contiguous()) if kind == "LSTM" else h0.contiguous()
    with torch.no_grad():
        return fn(x, hx, flat, module.bias, 1, 0.0, False, module.bidirectional, True)[0]


def _shifted(y, h0, reverse: bool):
    """The state each step read: ``h0`` at the direction's first step, else the neighbouring output."""
    if reverse:
        return torch.cat((y[:, 1:], h0.unsqueeze(1)), 1)
    return torch.cat((h0.unsqueeze(1), y[:, :-1]), 1)


def _tanh_(t):
    """``tanh(t)`` in place as ``2 sigma(2 t) - 1`` (the same function; PyTorch's CPU ``tanh`` took 6x the
    time of its ``sigmoid``; absolute rounding error about ``2u``)."""
    return t.mul_(2).sigmoid_().mul_(2).sub_(1)


def _states(kind, w, x, y, h0, c0, reverse: bool, compiled: bool) -> dict:
    """Step 2 of the module docstring for one layer and direction: input ``x``, outputs ``y`` (both
    ``(B, T, .)`` contiguous), initial states ``h0``, ``c0``."""
    st = {"x": x, "h_in": _shifted(y, h0, reverse), "y": y}
    if kind.startswith("RNN"):
        return st
    H = w["hh"].shape[0] // (4 if kind == "LSTM" else 3)
    B, T = x.shape[:2]
    h_in = st["h_in"]
    if kind == "GRU":
        gi = _linear(x, w["ih"], w["b_ih"], compiled)
        gh = _linear(h_in, w["hh"], w["b_hh"], compiled)
        st["rz"] = rz = torch.sigmoid(gi[..., :2 * H] + gh[..., :2 * H])
        st["ghn"] = ghn = gh[..., 2 * H:].contiguous()
        st["n"] = _tanh_(torch.addcmul(gi[..., 2 * H:], rz[..., :H], ghn))
        return st
    bias = None if w["b_ih"] is None else w["b_ih"] + w["b_hh"]
    pre = _linear(x, w["ih"], bias, compiled)
    _linear(h_in, w["hh"], None, compiled, into=pre)
    pre[..., 2 * H:3 * H].mul_(2)  # act = [i, f, g, o]: tanh(g) = 2 sigma(2 g) - 1
    st["act"] = act = pre.sigmoid_()
    act[..., 2 * H:3 * H].mul_(2).sub_(1)
    st["c0"] = c0 = c0.contiguous()
    c = x.new_empty(B, T, H)
    if compiled:
        from dpmf.training.torch.ghost._recurrent_compiled import lstm_cells

        lstm_cells(act.numpy(), c0.numpy(), reverse, c.numpy())
    else:
        ig = act[..., :H] * act[..., 2 * H:3 * H]
        f = act[..., H:2 * H]
        prev = c0
        for t in (range(T - 1, -1, -1) if reverse else range(T)):
            c[:, t] = prev = torch.addcmul(ig[:, t], f[:, t], prev)
    st["c"] = c
    st["tc"] = tc = _tanh_(c.clone())
    st["m"] = act[..., 3 * H:] * tc if w["hr"] is not None else None
    return st


def _through_time_tensors(kind, w, st, dout, dh, dc, reverse: bool) -> dict:
    """Step 3 of the module docstring as per-step tensor operations (any device)."""
    B, T = dout.shape[:2]
    G = w["ih"].shape[0]
    dgi = dout.new_empty(B, T, G)
    dgh = dout.new_empty(B, T, G) if kind == "GRU" else dgi
    proj = kind == "LSTM" and w["hr"] is not None
    dhr = dout.new_empty(B, T, dout.shape[2]) if proj else None
    W_hh = w["hh"]
    H = st["c"].shape[2] if kind == "LSTM" else dout.shape[2]
    for t in (range(T) if reverse else range(T - 1, -1, -1)):
        dh = dh + dout[:, t]
        if kind == "GRU":
            r, z, n = st["rz"][:, t, :H], st["rz"][:, t, H:], st["n"][:, t]
            kn = dh * ((1 - z) * (1 - n * n))
            vr = kn * (st["ghn"][:, t] * r * (1 - r))
            vz = dh * ((st["h_in"][:, t] - n) * z * (1 - z))
            dgi[:, t] = torch.cat((vr, vz, kn), -1)
            dgh[:, t] = v = torch.cat((vr, vz, kn * r), -1)
            dh = dh * z + v @ W_hh
        elif kind == "LSTM":
            a, tc = st["act"][:, t], st["tc"][:, t]
            i, f, g, o = a[:, :H], a[:, H:2 * H], a[:, 2 * H:3 * H], a[:, 3 * H:]
            first = t == (T - 1 if reverse else 0)
            cp = st["c0"] if first else st["c"][:, t + 1 if reverse else t - 1]
            if proj:
                dhr[:, t] = dh
                dm = dh @ w["hr"]
            else:
                dm = dh
            d = dc + dm * (o * (1 - tc * tc))
            dgi[:, t] = v = torch.cat((d * (g * i * (1 - i)), d * (cp * f * (1 - f)), d * (i * (1 - g * g)),
                                       dm * (tc * o * (1 - o))), -1)
            dc = d * f
            dh = v @ W_hh
        else:
            y = st["y"][:, t]
            act = (y > 0).to(y.dtype) if kind == "RNN_RELU" else 1 - y * y
            dgi[:, t] = v = dh * act
            dh = v @ W_hh
    return {"dgi": dgi, "dgh": dgh, "dhr": dhr, "dh0": dh, "dc0": dc}


def _through_time_compiled(kind, w, st, dout, dh, dc) -> dict:
    """Step 3 by the compiled loops (CPU; the caller holds BLAS to one thread)."""
    from dpmf.training.torch.ghost._recurrent_compiled import gru_bptt, lstm_bptt, rnn_bptt

    B, T = dout.shape[:2]
    G = w["ih"].shape[0]
    dgi = dout.new_empty(B, T, G)
    dgh = dout.new_empty(B, T, G) if kind == "GRU" else dgi
    n = lambda t: t.detach().contiguous().numpy()  # noqa: E731  (views; copies only of strided tensors)
    rev = st["reverse"]
    simd = _simd(dout)
    if kind == "GRU":
        dh0 = gru_bptt(n(dout), n(dh), n(st["rz"]), n(st["n"]), n(st["ghn"]), n(st["h_in"]), n(w["hh"]), rev, simd,
                       dgi.numpy(), dgh.numpy())
        return {"dgi": dgi, "dgh": dgh, "dhr": None, "dh0": torch.from_numpy(dh0), "dc0": None}
    if kind == "LSTM":
        proj = w["hr"] is not None
        dhr = dout.new_empty(B, T, dout.shape[2]) if proj else dout.new_empty(1, 1, 1)
        w_hr = w["hr"] if proj else dout.new_empty(1, 1)
        dh0, dc0 = lstm_bptt(n(dout), n(dh), n(dc), n(st["act"]), n(st["c"]), n(st["tc"]), n(st["c0"]),
                             n(w["hh"]), n(w_hr), proj, rev, simd, dgi.numpy(), dhr.numpy())
        return {"dgi": dgi, "dgh": dgi, "dhr": dhr if proj else None, "dh0": torch.from_numpy(dh0),
                "dc0": torch.from_numpy(dc0)}
    dh0 = rnn_bptt(n(dout), n(dh), n(st["y"]), kind == "RNN_RELU", n(w["hh"]), rev, simd, dgi.numpy())
    return {"dgi": dgi, "dgh": dgi, "dhr": None, "dh0": torch.from_numpy(dh0), "dc0": None}


def _compiles(x) -> bool:
    """Whether the compiled loops take tensors like ``x`` (CPU, float32 or float64)."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)


def gate_gradients(module, input, hx, grad_output, grad_h_n, grad_c_n, params: dict, *, output=None,
                   compiled: bool | None = None) -> list:
    """The list of :func:`gates_and_input_gradients` alone (same arguments)."""
    return gates_and_input_gradients(module, input, hx, grad_output, grad_h_n, grad_c_n, params, output=output,
                                     compiled=compiled, inputs=False)[0]


def gates_and_input_gradients(module, input, hx, grad_output, grad_h_n, grad_c_n, params: dict, *, output=None,
                              compiled: bool | None = None, inputs: bool = True) -> tuple:
    """Per layer and direction, ``(layer, direction, tensors)`` with the inputs and pre-activation
    gradients whose outer products over time are the per-example weight gradients: ``x``/``dgi``
    (``W_ih``, ``b_ih``), ``h_in``/``dgh`` (``W_hh``, ``b_hh``; ``h_in`` the state each step read),
    ``m``/``dhr`` (``W_hr``), all batch-major ``(B, T, .)`` and contiguous (module docstring).

    ``input``: batched 3-D, in the layer's layout; ``hx`` as the layer takes it; ``grad_*``: the gradients
    that reached ``output``, ``h_n``, ``c_n`` (``None``: zero), in the layer's layout; ``params``: the
    module's parameters by name (in the working precision); ``output``: the call's recorded (unmodified)
    output, or ``None`` to run the top layer again too; ``compiled``: the compiled loops (default: where
    they apply, CPU float32/float64) or the tensor loops.

    Returns ``(that list, (d_input, d_h0, d_c0))``: with it, the gradients reaching the call's input (in
    its layout; ``None`` unless ``inputs``) and initial states ``(L * D, B, .)`` (``d_c0`` ``None`` but for
    the LSTM) -- the layer's backward, from the same backward through time: ``d_input = sum over
    directions du W_ih`` of the first layer, ``d_h0``, ``d_c0`` what each direction's recurrence carries
    past its first step."""
    check_unpacked(module, input)
    kind = cell_kind(module)
    lstm = kind == "LSTM"
    bf = module.batch_first
    x = (input if bf else input.transpose(0, 1)).contiguous()
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
    compiled = _compiles(x) if compiled is None else compiled
    with torch.no_grad(), _one_blas_thread(compiled):
        saved, layer_in = [], x
        for layer in range(L):
            span = slice(layer * D, (layer + 1) * D)
            if layer == L - 1 and output is not None:
                y = output if bf else output.transpose(0, 1)
            else:
                y = rerun_layer(module, layer, layer_in, h0[span], c0[span] if lstm else None, params)
            for d in range(D):
                k = layer * D + d
                w = _weights(module, layer, d, params)
                st = _states(kind, w, layer_in, y[..., d * H_out:(d + 1) * H_out].contiguous(), h0[k],
                             c0[k] if lstm else None, bool(d), compiled)
                st["reverse"] = bool(d)
                saved.append((w, st))
            layer_in = y.contiguous()
        result, (dx, dh0, dc0) = _backward(kind, module, saved, x, grad_output, grad_h_n, grad_c_n, compiled,
                                           inputs)
    if dx is not None and not bf:
        dx = dx.transpose(0, 1)
    return result, (dx, dh0, dc0)


def _backward(kind, module, saved, x, grad_output, grad_h_n, grad_c_n, compiled, inputs: bool) -> tuple:
    """Step 3 of the module docstring for every layer and direction, from the top layer down: ``(the list of
    :func:`gate_gradients`, (d_input batch-major or None, d_h0, d_c0))``."""
    lstm = kind == "LSTM"
    B, T = x.shape[:2]
    D = 2 if module.bidirectional else 1
    L = module.num_layers
    H = module.hidden_size
    H_out = module.proj_size if lstm and module.proj_size > 0 else H
    if grad_output is None:
        dout = x.new_zeros(B, T, D * H_out)
    else:
        dout = grad_output if module.batch_first else grad_output.transpose(0, 1)
    result, dh0, dc0 = [None] * (L * D), [None] * (L * D), [None] * (L * D)
    for layer in range(L - 1, -1, -1):
        d_below = None
        for d in range(D):
            k = layer * D + d
            w, st = saved[k]
            dh = grad_h_n[k] if grad_h_n is not None else x.new_zeros(B, H_out)
            dc = (grad_c_n[k] if grad_c_n is not None else x.new_zeros(B, H)) if lstm else None
            part = dout[..., d * H_out:(d + 1) * H_out].contiguous()
            if compiled:
                g = _through_time_compiled(kind, w, st, part, dh, dc)
            else:
                g = _through_time_tensors(kind, w, st, part, dh, dc, st["reverse"])
            result[k] = (layer, d, {"x": st["x"], "dgi": g["dgi"], "h_in": st["h_in"], "dgh": g["dgh"],
                                    "m": st.get("m"), "dhr": g["dhr"]})
            dh0[k], dc0[k] = g["dh0"], g["dc0"]
            if layer or inputs:
                d_below = _below(g["dgi"], w["ih"], d_below, compiled and _simd(x))
        dout = d_below
    return result, (dout, torch.stack(dh0), torch.stack(dc0) if lstm else None)


def _one_blas_thread(compiled: bool):
    """BLAS on one thread around the compiled loops (their per-step ``gemm`` of ``B x 4H`` by ``4H x H``:
    a threaded OpenBLAS took 10x the CPU time at ``B = 64``, ``H = 64``); nothing otherwise."""
    import contextlib

    if not compiled:
        return contextlib.nullcontext()
    from dpmf.resources import one_blas_thread

    return one_blas_thread()


# ------------------------------------------------------------------ the LSTM's own forward (loop form)
def own_lstm_applies(module, x) -> bool:
    """Whether :func:`lstm_forward_kept` runs this LSTM call: CPU float32/float64 (compiled), no projection."""
    return cell_kind(module) == "LSTM" and module.proj_size == 0 and _compiles(x)


def lstm_forward_kept(module, input, hx, weights) -> tuple:
    """The forward of an ``nn.LSTM`` call (no projection, no dropout between layers), compiled, keeping
    what its backward reads (:func:`lstm_backward_kept`), so no gate is formed again: ``(output, h_n, c_n,
    saved)`` with ``output``, ``h_n``, ``c_n`` as PyTorch's ``torch.lstm`` returns them (new tensors: nothing
    the caller may modify aliases ``saved``) and ``saved`` per layer and direction the time-major ``(T, B, .)``
    input ``x``, states ``ys`` (``(T + 1, B, H)``: ``h0`` and the outputs; the state each step read is a view
    of it), gate activations ``act``, cells ``c`` and ``tanh(c)`` ``tc`` (compiled:
    :func:`~dpmf.training.torch.ghost._recurrent_compiled.lstm_forward`; the input part of the
    pre-activations one batched product). ``input``, ``hx``: as the layer passes them to ``torch.lstm``
    (``hx = (h0, c0)``, ``(L * D, B, H)``); ``weights``: its flat weight list (``w_ih, w_hh[, b_ih, b_hh]`` per
    layer and direction)."""
    from dpmf.training.torch.ghost._recurrent_compiled import lstm_forward

    D = 2 if module.bidirectional else 1
    L, H = module.num_layers, module.hidden_size
    per = 4 if module.bias else 2
    x = (input.transpose(0, 1) if module.batch_first else input).contiguous()
    T, B = x.shape[:2]
    h0, c0 = hx
    fast = x.dtype == torch.float32
    simd = _simd(x)
    saved, h_n, c_n = [], [], []
    direct = module.batch_first  # (the top layer's outputs written batch-first by the kernel: no transposed copy)
    with torch.no_grad(), _one_blas_thread(True):
        layer_in = x
        for layer in range(L):
            outs = []
            top = direct and layer == L - 1
            outb = x.new_empty(B, T, D * H) if top else x.new_empty(1, 1, 1)
            for d in range(D):
                k = layer * D + d
                w = weights[k * per:(k + 1) * per]
                bias = (w[2] + w[3]) if per == 4 else x.new_empty(0)
                act, c = x.new_empty(T, B, 4 * H), x.new_empty(T, B, H)
                tc, ys = x.new_empty(T, B, H), x.new_empty(T + 1, B, H)
                ys[T if d else 0] = h0[k]
                c0k = c0[k].contiguous()
                lstm_forward(layer_in.numpy(), w[0].t().contiguous().numpy(), bias.numpy(), w[1].t().contiguous().numpy(),
                             bool(d), fast, simd, act.numpy(), c.numpy(), tc.numpy(), ys.numpy(), c0k.numpy(),
                             (outb[..., d * H:(d + 1) * H] if top else outb).numpy(), top)
                saved.append({"x": layer_in, "ys": ys, "act": act, "c": c, "tc": tc, "c0": c0k, "w_ih": w[0],
                              "w_hh": w[1], "reverse": bool(d)})
                outs.append(ys[:T] if d else ys[1:])
                h_n.append(ys[0] if d else ys[T])
                c_n.append(c[0] if d else c[T - 1])
            if top:
                break
            layer_in = outs[0] if D == 1 else torch.cat(outs, 2)
        out = outb if direct else (layer_in.clone() if D == 1 else layer_in)  # (never a view of ``saved``)
    return out, torch.stack(h_n), torch.stack(c_n), saved


def lstm_backward_kept(module, saved, grad_output, grad_h_n, grad_c_n, inputs: bool = True) -> tuple:
    """The backward of a :func:`lstm_forward_kept` call from what it kept (compiled:
    :func:`~dpmf.training.torch.ghost._recurrent_compiled.lstm_bptt_tm`), as :func:`gates_and_input_gradients`
    returns it, but with every tensor of the list *time-major* ``(T, B, .)`` (``"time_major": True``): the
    gate gradients and the input and initial-state gradients (``d_input`` in the layer's layout, ``None``
    unless ``inputs``)."""
    from dpmf.training.torch.ghost._recurrent_compiled import lstm_bptt_tm

    D = 2 if module.bidirectional else 1
    L, H = module.num_layers, module.hidden_size
    T, B = saved[0]["act"].shape[:2]
    x0 = saved[0]["x"]
    simd = _simd(x0)
    if grad_output is None:
        dout = x0.new_zeros(T, B, D * H)
    else:
        dout = grad_output.transpose(0, 1) if module.batch_first else grad_output
    result, dh0, dc0 = [None] * (L * D), [None] * (L * D), [None] * (L * D)
    with torch.no_grad(), _one_blas_thread(True):
        for layer in range(L - 1, -1, -1):
            d_below = None
            for d in range(D):
                k = layer * D + d
                st = saved[k]
                dh = grad_h_n[k].contiguous() if grad_h_n is not None else x0.new_zeros(B, H)
                dc = grad_c_n[k].contiguous() if grad_c_n is not None else x0.new_zeros(B, H)
                part = dout[..., d * H:(d + 1) * H]  # (a view: the kernel reads any strides)
                dg = x0.new_empty(T, B, 4 * H)
                dh0_k, dc0_k = lstm_bptt_tm(part.numpy(), dh.numpy(), dc.numpy(), st["act"].numpy(), st["c"].numpy(),
                                            st["tc"].numpy(), st["c0"].numpy(), st["w_hh"].numpy(), st["reverse"],
                                            simd, dg.numpy())
                ys = st["ys"]
                result[k] = (layer, d, {"x": st["x"], "dgi": dg, "h_in": ys[1:] if d else ys[:T], "dgh": dg, "m": None,
                                        "dhr": None, "time_major": True})
                dh0[k], dc0[k] = torch.from_numpy(dh0_k), torch.from_numpy(dc0_k)
                if layer or inputs:
                    d_below = _below(dg, st["w_ih"], d_below, simd)
            dout = d_below
    dx = None
    if inputs:
        dx = dout.transpose(0, 1) if module.batch_first else dout
    return result, (dx, torch.stack(dh0), torch.stack(dc0))


def _simd(x) -> bool:
    """Whether the compiled loops' products on tensors like ``x`` are
    :func:`~dpmf.training.torch.ghost._gemm_compiled.gemm` (float32 on a CPU with AVX-512), not ``np.dot``."""
    from dpmf.training.torch.ghost._gemm_compiled import applies

    return x.dtype == torch.float32 and applies()


def _below(dg, w_ih, acc, simd: bool):
    """``dg W_ih`` ``(T, B, I)`` (the gradient reaching the layer's input from one direction), added into ``acc``
    where given (the other direction's)."""
    if not simd:
        below = dg @ w_ih
        return below if acc is None else acc.add_(below)
    from dpmf.training.torch.ghost._gemm_compiled import gemm

    T, B, G = dg.shape
    out = dg.new_empty(T, B, w_ih.shape[1]) if acc is None else acc
    gemm(dg.view(T * B, G).numpy(), w_ih.contiguous().numpy(), out.view(T * B, -1).numpy(), acc is not None)
    return out


def _linear(x, w, b, compiled: bool, into=None):
    """``x W^T + b`` ``(B, T, R)`` for contiguous ``x`` ``(B, T, C)`` (``b`` None: no bias; ``into``: added into that
    tensor instead), by :func:`~dpmf.training.torch.ghost._gemm_compiled.gemm` where :func:`_simd` applies to the
    compiled loops' tensors, else by PyTorch."""
    if not (compiled and _simd(x)):
        if into is None:
            return F.linear(x, w, b)
        return into.view(-1, into.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]), w.t()).view_as(into)
    from dpmf.training.torch.ghost._gemm_compiled import gemm

    out = into
    if out is None:
        out = x.new_empty(*x.shape[:-1], w.shape[0])
        if b is not None:
            out.copy_(b.expand_as(out))
    acc = into is not None or b is not None
    gemm(x.reshape(-1, x.shape[-1]).numpy(), w.t().contiguous().numpy(), out.view(-1, out.shape[-1]).numpy(), acc)
    return out
