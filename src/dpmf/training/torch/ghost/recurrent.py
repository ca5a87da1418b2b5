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
recomputes them (:func:`~dpmf.training.torch.ghost.recurrent_gates.gate_gradients`) from the recorded
input, initial state, *output* (the top layer's hidden states: read, not recomputed; an output
modified in place after the forward is refused, as a modified input is) and the gradients that
reached ``output``, ``h_n`` and, for the LSTM, ``c_n`` (any of them may carry gradient): the gates from
batched products, the backward through time compiled. One batched pass: no per-example loop, no
``B x parameters`` tensor.

Norms and clipped sums. RNN and LSTM (``du = dv``): where they fit in memory (:class:`_Kept`), the
per-example gradients of ``W_ih``, ``W_hh`` and both biases of a layer and direction are materialized at
once, ``[x, h_{t-1}, 1]^T du`` per example (compiled, one product per example, float64 norms with the
product's rounding bound), and the clipped sum is one matrix-vector product of that same tensor: cheaper
than Grams plus book-keeping for a recurrent layer's long sequences and small weights. Otherwise, and
for the GRU (whose groups of one weight measured faster so), each weight is a Linear along the sequence
(``U = du`` or ``dv``, ``V`` its input rows ``x`` or ``h_{t-1}``; :mod:`~dpmf.training.torch.ghost.sequence`:
Gram, kept or materialized by cost, with its rounding bound), and every bias of a layer and direction is
the materialized ``sum_t du_t`` (formed once for ``b_ih`` and ``b_hh`` of an RNN or LSTM). So the norm
bounds exactly what is summed: the recomputed ``(x, h, du, dv)``. A recurrent layer called twice in one forward (or a weight shared) is
joined with its cross terms like any repeated layer, from the same per-parameter contributions
(:mod:`~dpmf.training.torch.ghost.joint`). The recomputation agrees with autograd through the fused
kernel to rounding (tested in float64); the clip bound does not depend on that.

The backward through time runs once per step. In the loop (``loss.backward()``), where ghost mode runs
layers on detached weights (``GhostClipper._detach``; for these layers also the list of weights PyTorch's
kernel reads), a recurrent call runs on detached inputs too -- PyTorch's fused kernel then records no
graph -- and its outputs are joined to its inputs by :class:`_OwnBackward`, whose backward is this rule's
(:func:`~dpmf.training.torch.ghost.recurrent_gates.gates_and_input_gradients`: the gate gradients, and from
them the gradients of the input, ``h0`` and ``c0``); the rule then takes those gate gradients instead of
forming them again (where they came from exactly the output gradients its call holds). PyTorch's own
backward of the layer, which repeats the backward through time and forms the weight gradients ghost mode
discards, does not run. An LSTM without projection goes further (:class:`_OwnForward`): its forward is the
rule's own too (:func:`~dpmf.training.torch.ghost.recurrent_gates.lstm_forward_kept`, compiled, time-major:
``nn.LSTM.forward`` runs unchanged and hands its ``torch.lstm`` call over through a tensor subclass of the
detached input), which keeps the gate activations and cells, so the backward
(:func:`~dpmf.training.torch.ghost.recurrent_gates.lstm_backward_kept`) forms no gate again. Its outputs are
PyTorch's to rounding (float32: a vectorized exponential of about 1 ulp, tested against the layer). Where
that does not apply (not CPU float32/float64, autocast, packed or unbatched
input, :meth:`GhostClipper.clipped_sum`, ``clipper.plain()``), nothing is detached: PyTorch's kernel and
backward run as they are and the rule forms the gate gradients itself. Tested equal to the float64 per-example reference in both.

Refused with a clear message: a ``PackedSequence`` input, unbatched (2-D) input, dropout between
layers in training mode (a re-run cannot reproduce the masks; ``grad_sample_mode="functorch"`` can),
an output modified in place after the forward, and a ``batch_first=False`` call with as many time
steps as examples, whose layout shapes cannot tell
(:func:`~dpmf.training.torch.recurrent.check_layout`; :func:`~dpmf.training.torch.recurrent.time_first`
declares it).
"""

from __future__ import annotations

from dpmf.errors import UnsupportedConfigurationError
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.ghost.joint import Factored, PerExample
from dpmf.training.torch.ghost.recurrent_gates import (
    gate_gradients,
    gates_and_input_gradients,
    lstm_backward_kept,
    lstm_forward_kept,
    own_lstm_applies,
)
from dpmf.training.torch.ghost.registry import CALL_BATCH, LayerGradients, register_ghost_rule
from dpmf.training.torch.ghost.sequence import F64, factors_toward_zero, gamma, sequence_parts
from dpmf.training.torch.recurrent import RECURRENT_TYPES, cell_kind, check_layout, check_unpacked, weight_names

torch = require_torch()

__all__ = ["recurrent_rule", "recurrent_batch"]


def _input_and_state(call):
    return _arguments(call.args, call.kwargs)


def _arguments(args, kwargs):
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


class _Group:
    """The parameters of one layer and direction that share the gradient factor ``G`` ``(B, T, R)``: at most
    one weight (``columns`` ``[(name, A)]``, ``A`` ``(B, T, C)`` its input rows: a Linear along the sequence,
    :func:`~dpmf.training.torch.ghost.sequence.sequence_parts`) and biases (``[(name, None)]``), whose
    per-example gradients are all the same ``sum_t g_t``, materialized once
    (:class:`~dpmf.training.torch.ghost.joint.PerExample`, float64 norms)."""

    def __init__(self, G, columns) -> None:
        self.G, self.columns = G, columns
        weights = [(n, A) for n, A in columns if A is not None]
        self.weight = weights[0] if weights else None
        self.biases = [n for n, A in columns if A is None]
        self._parts = None
        self._bias = {}

    def without_rows(self, bad) -> "_Group":
        keep = lambda t: torch.where(bad.view(-1, 1, 1), torch.zeros((), dtype=t.dtype, device=t.device), t)  # noqa: E731
        return _Group(keep(self.G), [(n, None if A is None else keep(A)) for n, A in self.columns])

    def tensors(self) -> list:
        return [self.G] + ([self.weight[1]] if self.weight else [])

    def bias(self, param) -> PerExample:
        """``sum_t g_t`` in ``param``'s working precision (one tensor for ``b_ih`` and ``b_hh``)."""
        work = torch.promote_types(param.dtype, torch.float32)
        if work not in self._bias:
            self._bias[work] = PerExample(self.G.to(work).sum(1))
        return self._bias[work]

    def parts(self, trainable):
        """``(sq, summed)``: the squared norms over the group's parameters, float64 ``(B,)``, and the
        weight's clipped sum ``summed(f, dtype)`` (``None`` without a weight)."""
        if self._parts is None:
            sq, summed = None, None
            if self.weight:
                sq, summed = sequence_parts(self.weight[1], self.G, self.G.dtype)
            for name in self.biases:
                b = self.bias(trainable[name]).sq_alone()
                sq = b if sq is None else sq + b
            self._parts = (sq, summed)
        return self._parts

    def weighted_sum(self, f, trainable) -> dict:
        """``{name: sum_i f_i g_{i,name}}`` over the group's parameters."""
        out = {name: self.bias(trainable[name]).weighted_sum(f, trainable[name]) for name in self.biases}
        if self.weight:
            name = self.weight[0]
            out[name] = self.parts(trainable)[1](f, trainable[name].dtype)
        return out

    def contributions(self, trainable) -> dict:
        """Per parameter (for joint use: a layer called twice, a shared weight): the weight's is
        :class:`~dpmf.training.torch.ghost.joint.Factored` (``U = G``, ``V = A``, as a Linear's), a bias's
        the materialized ``sum_t g_t``."""
        out = {name: self.bias(trainable[name]) for name in self.biases}
        if self.weight:
            name, A = self.weight
            out[name] = Factored(self.G, A, work=torch.promote_types(trainable[name].dtype, torch.float32))
        return out


class _Kept:
    """The parameters of one layer and direction of an RNN or LSTM, which share the gate gradient ``G``
    ``(B, T, R)`` (or time-major ``(T, B, R)``): ``W_ih`` (inputs ``x``), ``W_hh`` (states ``h_{t-1}``) and the
    biases (``columns`` as :class:`_Group`'s, with two weights), with their per-example gradients
    *materialized* at once: ``P_i = [x, h, 1]_i^T G_i`` ``(B, C, R)``, one product per example (the column of
    ones gives ``sum_t g_t``, every bias's gradient), their norms from ``P`` itself and the clipped sum
    ``sum_i f_i P_i`` one matrix-vector product of that same ``P``. Where ``P`` fits (:meth:`applies`) this is
    cheaper than the Gram form plus book-keeping: the per-example products cost what one book-keeping
    product costs, and no Gram or second product is formed (a recurrent layer's sequences are long and
    its weights small; measured, issue 52: the LSTM step 3.3x -> 3.0x its plain step, in-process A/B).

    Norms (compiled, :func:`~dpmf.training.torch.ghost._recurrent_compiled.kept_products`): per parameter
    ``(||P_i|| + gamma_T s_i)^2`` with ``s_i = sum_t ||g_{i,t}|| ||a_{i,t}||``, everything in float64, so an
    upper bound of the exact ``||G_i^T A_i||^2`` (:mod:`~dpmf.training.torch.ghost.sequence`, "Materialized
    form"), inflated by the float64 rounding of those sums; the clipped sum is of the very ``P`` whose
    norms were taken."""

    #: ``P`` is kept where it has at most this many times the floats of ``G`` and the inputs it is formed from
    KEEP_RATIO = 4

    @classmethod
    def applies(cls, G, columns, time_major: bool = False) -> bool:
        """Two weights sharing ``G`` (RNN, LSTM: ``W_ih`` and ``W_hh``, where one product replaces two
        Grams and two book-keeping products; a GRU's groups of one weight each measured faster in the Gram
        form, 1.55x against 1.71x its plain step), CPU float32/float64 (the compiled norms), and ``P`` small
        enough (:data:`KEEP_RATIO`)."""
        B, T, R = (G.shape[1], G.shape[0], G.shape[2]) if time_major else G.shape
        if (G.device.type != "cpu" or G.dtype not in (torch.float32, torch.float64) or B == 0
                or sum(A is not None for _, A in columns) != 2
                or any(A is not None and A.dtype != G.dtype for _, A in columns)):
            return False
        widths = [A.shape[2] for _, A in columns if A is not None]
        C = sum(widths) + (1 if len(widths) < len(columns) else 0)
        return B * R * C <= cls.KEEP_RATIO * B * T * (R + sum(widths))

    def __init__(self, G, columns, time_major: bool = False) -> None:
        self.G, self.columns, self.time_major = G, columns, time_major
        self._P = self._sq = None

    def without_rows(self, bad) -> "_Kept":
        rows = bad.view(1, -1, 1) if self.time_major else bad.view(-1, 1, 1)
        keep = lambda t: torch.where(rows, torch.zeros((), dtype=t.dtype, device=t.device), t)  # noqa: E731
        return _Kept(keep(self.G), [(n, None if A is None else keep(A)) for n, A in self.columns], self.time_major)

    def tensors(self) -> list:
        """``G`` and the inputs, batch-major (views)."""
        out = [self.G] + [A for _, A in self.columns if A is not None]
        return [t.transpose(0, 1) for t in out] if self.time_major else out

    def _form(self):
        """``P`` and the norms in one compiled pass
        (:func:`~dpmf.training.torch.ghost._recurrent_compiled.kept_products`: each example's products and
        norms while they are in cache; no joined copy of the inputs)."""
        from dpmf.resources import one_blas_thread
        from dpmf.training.torch.ghost._gemm_compiled import applies as gemm_applies
        from dpmf.training.torch.ghost._recurrent_compiled import kept_products

        G = self.G.contiguous()
        (n_x, X), (n_h, Hs) = [(n, A) for n, A in self.columns if A is not None]
        X, Hs = X.contiguous(), Hs.contiguous()
        biases = [n for n, A in self.columns if A is None]
        B = G.shape[1] if self.time_major else G.shape[0]
        T, R = (G.shape[0] if self.time_major else G.shape[1]), G.shape[2]
        I, H = X.shape[2], Hs.shape[2]
        C = I + H + (1 if biases else 0)
        P = G.new_empty(B, C, R)
        seg = torch.empty(B, 3 if biases else 2, dtype=F64)
        with one_blas_thread():
            kept_products(G.numpy(), X.numpy(), Hs.numpy(), bool(biases), self.time_major, gamma(T, G.dtype),
                          G.dtype == torch.float32 and gemm_applies(), P.numpy(), seg.numpy())
        seg *= 1 + 2 * gamma(R * C + R + C + T + 16, F64)  # (the float64 sums' rounding)
        self._P, self._bounds = P, [0, I, I + H, C]
        self._which = {n_x: 0, n_h: 1, **{n: 2 for n in biases}}
        self._sq = seg[:, list(self._which.values())].sum(1)

    def parts(self, trainable):
        """``(sq, None)``: the squared norms over the group's parameters, float64 ``(B,)``."""
        if self._P is None:
            self._form()
        return self._sq, None

    def weighted_sum(self, f, trainable) -> dict:
        """``{name: sum_i f_i P_{i,name}}`` over the group's parameters, from the kept ``P``."""
        if self._P is None:
            self._form()
        P = self._P
        B, C, R = P.shape
        flat = torch.mv(P.reshape(B, -1).t(), factors_toward_zero(f.to(P.device), P.dtype)).view(C, R)
        out = {}
        for name, k in self._which.items():
            part = flat[self._bounds[k] : self._bounds[k + 1]].t()  # (R, width): the weight; (R, 1): a bias
            out[name] = part.contiguous().to(trainable[name].dtype).view_as(trainable[name])
        return out

    def contributions(self, trainable) -> dict:
        """Per parameter, as :class:`_Group`'s (joint use is rare: formed from ``G`` and the inputs)."""
        G, *_ = self.tensors()
        out = {}
        for name, A in self.columns:
            work = torch.promote_types(trainable[name].dtype, torch.float32)
            if A is not None and self.time_major:
                A = A.transpose(0, 1)
            out[name] = (PerExample(G.to(work).sum(1)) if A is None else Factored(G, A, work=work))
        return out


def _groups(kind, rec, names, trainable) -> list:
    """The groups of one layer and direction (``rec``: its tensors from
    :func:`~dpmf.training.torch.ghost.recurrent_gates.gate_gradients`), trainable parameters only: a
    :class:`_Kept` per gradient factor where it applies, else :class:`_Group` s. RNN and LSTM: ``du = dv``, so
    ``W_ih``, ``W_hh`` and both biases share ``G`` (the biases one sum ``sum_t du_t``)."""
    time_major = rec.get("time_major", False)

    def group(G, columns):
        cols = [(names[role], A) for role, A in columns if role in names and names[role] in trainable]
        if not cols:
            return []
        if _Kept.applies(G, cols, time_major):
            return [_Kept(G, cols, time_major)]
        if time_major:  # (the Gram form reads batch-major tensors)
            G = G.transpose(0, 1).contiguous()
            cols = [(n, None if A is None else A.transpose(0, 1).contiguous()) for n, A in cols]
        weights = [c for c in cols if c[1] is not None]
        biases = [c for c in cols if c[1] is None]
        if not weights:
            return [_Group(G, biases)]
        return [_Group(G, [weights[0]] + biases)] + [_Group(G, [w]) for w in weights[1:]]

    if kind == "GRU":
        out = group(rec["dgi"], [("ih", rec["x"]), ("b_ih", None)]) + group(
            rec["dgh"], [("hh", rec["h_in"]), ("b_hh", None)])
    else:
        out = group(rec["dgi"], [("ih", rec["x"]), ("hh", rec["h_in"]), ("b_ih", None), ("b_hh", None)])
    if rec["dhr"] is not None:
        out += group(rec["dhr"], [("hr", rec["m"])])
    return out


def _recorded_output(module, call):
    """The call's output sequence, checked unmodified since the forward (the rule reads its hidden states)."""
    out = call.outputs[0] if call.outputs else None
    if out is None or call.output_versions is None or out._version != call.output_versions[0]:
        raise UnsupportedConfigurationError(
            f"the output of a {type(module).__name__} was modified in place after the forward (an in-place "
            "operation such as out.relu_() or dropout(..., inplace=True) on it); ghost clipping reads its hidden "
            "states from it: use the out-of-place version"
        )
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
    out = _recorded_output(module, call)
    kind = cell_kind(module)
    shared = _OwnBackward.gates_of(call)
    if shared is not None:  # the layer's own backward formed them (own_backward): not again
        groups = []
        for layer, d, rec in shared:
            groups += _groups(kind, rec, weight_names(module, layer, d), trainable)
        return _layer_gradients(groups, trainable, call, module)
    w0 = next(iter(module.parameters()))
    work = torch.promote_types(w0.dtype, torch.float32)
    params = {n: p.detach().to(work) for n, p in module.named_parameters()}
    x = x.to(work)
    if hx is not None:
        hx = tuple(h.to(work) for h in hx) if isinstance(hx, (tuple, list)) else hx.to(work)
    grads = [None if g is None else g.to(work) for g in call.grads] + [None, None]
    groups = []
    for layer, d, rec in gate_gradients(module, x, hx, grads[0], grads[1], grads[2], params,
                                        output=out.detach().to(work)):
        groups += _groups(kind, rec, weight_names(module, layer, d), trainable)
    return _layer_gradients(groups, trainable, call, module)


def _gradients(groups, trainable) -> LayerGradients:
    """Norms added over the groups (formed when first read), clipped sums split per parameter, and the
    per-parameter contributions for joint use."""
    def sq():
        out = groups[0].parts(trainable)[0]
        for g in groups[1:]:
            out = out + g.parts(trainable)[0]
        return out

    def weighted_sum(f):
        sums = {}
        for g in groups:
            sums.update(g.weighted_sum(f, trainable))
        return sums

    def contributions():
        out = {}
        for g in groups:
            out.update(g.contributions(trainable))
        return out

    # kept per-example gradients: contributions only for a joined call; Gram groups: formed now, so that the
    # clipper forms the norms of many layers' Gram pairs at once (sequence.gram_norms)
    kept = any(isinstance(g, _Kept) for g in groups)
    return LayerGradients(sq, weighted_sum, contributions=contributions if kept else contributions())


def _layer_gradients(groups, trainable, call, module) -> LayerGradients:
    """Norms from the recomputed tensors as they are; clipped sums with any example whose tensors are not
    finite set to 0 (its norm is then inf or NaN, so its clip factor is 0 anyway: ``0 * inf`` must not
    poison the sum). The rows are zeroed here, on the recomputed batch-first tensors, because the
    clipper's own zeroing of such examples works along dim 0, which is not the batch of every tensor a
    recurrent call holds (``(T, B, d)`` inputs, ``(L*D, B, H)`` states)."""
    B = call.batch
    if not call.versions and _ambiguous(module, call):
        raise UnsupportedConfigurationError(
            f"{type(module).__name__} saw a non-finite gradient with nonfinite='skip', and its call has another "
            "dimension of the batch's size (time steps with batch_first=False, or layers x directions for the "
            "states), so the examples to drop cannot be told apart; use batch_first=True and another batch size, "
            "or nonfinite='raise'"
        )
    if not groups:  # (no trainable parameter: the clipper calls no rule)
        return LayerGradients(torch.zeros(B, dtype=F64), lambda f: {})
    device = groups[0].G.device
    raw = _gradients(groups, trainable)
    raw_sq = raw.sq
    if bool(torch.isfinite(raw_sq).all()):  # a non-finite entry of A or G makes its example's norm inf/NaN
        return raw
    bad = torch.zeros(B, dtype=torch.bool, device=device)
    for g in groups:
        for t in g.tensors():
            bad |= ~torch.isfinite(t).flatten(1).all(1)
    bad |= ~torch.isfinite(raw_sq).to(device)
    clean = _gradients([g.without_rows(bad) for g in groups], trainable)
    sq = torch.where(bad.to(raw_sq.device), torch.full_like(raw_sq, float("nan")), raw_sq)
    # joint use (the layer called twice) takes norms from the contributions: keep the non-finite ones in
    # the first pass, so the example is seen; the clipper's second pass (a cleaned copy) sums the clean ones
    joint = clean if not call.versions else raw
    return LayerGradients(sq, clean.weighted_sum, contributions=lambda: joint.contributions)


def _ambiguous(module, call) -> bool:
    """Whether a tensor of this call has a dim 0 of the batch's size that is not the batch."""
    B = call.batch
    x, hx = _input_and_state(call)
    L = module.num_layers * (2 if module.bidirectional else 1)
    state = hx is not None or any(g is not None for g in call.grads[1:])
    return (not module.batch_first and x.shape[0] == B) or (state and L == B)


class _OwnBackward(torch.autograd.Function):
    """``(module, params, x, h0, c0, anchor, *outputs) -> aliases of outputs``: the recurrent call's outputs,
    computed already (by PyTorch's fused kernel, on detached inputs and weights: no graph), joined to its
    inputs ``x``, ``h0``, ``c0`` by the rule's own backward through time
    (:func:`~dpmf.training.torch.ghost.recurrent_gates.gates_and_input_gradients`), which forms the gate
    gradients the rule needs and the gradients of the inputs and initial states from them. The gate
    gradients are kept on the node (``dpmf_gates``, with the output gradients they came from) for the
    rule, so the backward through time runs once per step. ``anchor``: a 0-dim leaf requiring gradient,
    so the node exists when no input needs a gradient (it is given none). Nothing is saved with
    ``save_for_backward`` (the inputs and outputs are kept as detached aliases, which share their version
    counters): an output modified in place before the backward is run again here, and refused by the rule."""

    @staticmethod
    def forward(ctx, module, params, kept, x, h0, c0, anchor, *outputs):
        ctx.set_materialize_grads(False)
        det = lambda t: None if t is None else t.detach()  # noqa: E731  (aliases: no graph kept through the node)
        ctx.module, ctx.params, ctx.x, ctx.h0, ctx.c0 = module, params, x.detach(), det(h0), det(c0)
        ctx.out, ctx.out_version = outputs[0], outputs[0]._version
        ctx.kept = kept  # what the rule's own forward kept (_OwnForward), or None
        ctx.n_outputs = len(outputs)
        ctx.dpmf_gates = None
        return tuple(o.detach() for o in outputs)

    @staticmethod
    def backward(ctx, *grads):
        module, h0, c0 = ctx.module, ctx.h0, ctx.c0
        dc_n = grads[2] if len(grads) > 2 else None
        need = ctx.needs_input_grad
        if ctx.kept is not None:  # the forward was the rule's own: its gates are kept, not formed again
            gates, (dx, dh0, dc0) = lstm_backward_kept(module, ctx.kept, grads[0], grads[1], dc_n, inputs=need[3])
        else:
            hx = None if h0 is None else ((h0, c0) if c0 is not None else h0)
            out = ctx.out if ctx.out._version == ctx.out_version else None  # (None: run again; the rule refuses)
            gates, (dx, dh0, dc0) = gates_and_input_gradients(module, ctx.x, hx, grads[0], grads[1], dc_n, ctx.params,
                                                              output=out, inputs=need[3])
        ctx.dpmf_gates = (grads, gates)
        return (None, None, None, dx if need[3] else None, dh0 if need[4] else None,
                dc0 if need[5] else None, None) + (None,) * ctx.n_outputs

    @staticmethod
    def gates_of(call):
        """The gate gradients :class:`_OwnBackward` formed for ``call`` (its first output's node, or the node
        under the clipper's link), if they came from exactly the gradients the call holds; else None."""
        node = getattr(call.outputs[0], "grad_fn", None) if call.outputs else None
        for _ in range(2):
            if node is None:
                return None
            got = getattr(node, "dpmf_gates", None)
            if got is not None:
                grads, gates = got
                return gates if _same_tensors(grads, call.grads) else None
            node = node.next_functions[0][0] if node.next_functions else None
        return None


def _same_tensors(a, b) -> bool:
    """Whether two lists hold the same tensors (the same memory, shape and strides; None for None)."""
    b = list(b) + [None] * (len(a) - len(b))
    return len(a) == len(b) and all(
        (x is None and y is None) or (x is not None and y is not None and x.data_ptr() == y.data_ptr()
                                      and x.shape == y.shape and x.stride() == y.stride() and x.dtype == y.dtype)
        for x, y in zip(a, b))


class _OwnInput(torch.Tensor):
    """The (detached) input of an LSTM call whose forward is the rule's own (:class:`_OwnForward`): PyTorch's
    ``nn.LSTM.forward`` runs as it is (its checks, its zero initial states) and calls ``torch.lstm`` on it,
    which this subclass hands to its :class:`_OwnForward`; every other operation is PyTorch's own, on plain
    tensors."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.lstm and len(args) == 9 and isinstance(args[0], _OwnInput):
                return args[0].dpmf_own(*args, **kwargs)
            return func(*args, **kwargs)


class _OwnForward:
    """The forward of one LSTM call in the loop, run by the rule itself
    (:func:`~dpmf.training.torch.ghost.recurrent_gates.lstm_forward_kept`) in place of PyTorch's fused
    kernel: the same outputs (to rounding), with the gate activations and cells *kept* (``kept``) for the
    backward (:class:`_OwnBackward`), which then forms no gate again. ``kept`` stays None if the call never
    reached ``torch.lstm`` (then the backward forms the gates as it does for PyTorch's kernel)."""

    def __init__(self, module) -> None:
        self.module = module
        self.kept = None

    def input(self, x):
        view = x.as_subclass(_OwnInput)
        view.dpmf_own = self
        return view

    def __call__(self, input, hx, weights, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        m = self.module
        if (bool(has_biases) != m.bias or num_layers != m.num_layers or bool(bidirectional) != m.bidirectional
                or bool(batch_first) != m.batch_first or (dropout and train and num_layers > 1)):
            return torch.lstm(input.as_subclass(torch.Tensor), hx, weights, has_biases, num_layers, dropout, train,
                              bidirectional, batch_first)  # (not the call own_backward saw: PyTorch's kernel)
        out, h_n, c_n, self.kept = lstm_forward_kept(m, input.as_subclass(torch.Tensor), hx, weights)
        return out, h_n, c_n


def own_backward(module, args, kwargs):
    """The loop's forward of a recurrent layer, before the clipper detaches its weights
    (``GhostClipper._detach``): ``(finish, args, kwargs)`` -- the call runs on detached inputs and weights
    (PyTorch's fused kernel records no graph) and ``finish(output)`` joins its outputs to the inputs by
    :class:`_OwnBackward`; or None where the rule's backward does not apply (then nothing is detached and
    the fused kernel and its backward run as they are): not CPU float32/float64 with one
    dtype, a packed or unbatched input, dropout between layers in training mode (refused by the rule), under
    autocast, inside a ``torch.func`` transform."""
    x, hx = _arguments(args, kwargs)
    lstm = isinstance(module, torch.nn.LSTM)
    states = () if hx is None else (tuple(hx) if isinstance(hx, (tuple, list)) else (hx,))
    if (not isinstance(x, torch.Tensor) or x.ndim != 3 or x.device.type != "cpu"
            or x.dtype not in (torch.float32, torch.float64) or len(states) != (2 if lstm and hx is not None else
                                                                              (1 if hx is not None else 0))
            or any(not isinstance(t, torch.Tensor) or t.dtype != x.dtype or t.ndim != 3 for t in states)
            or any(w is not None and w.dtype != x.dtype for w in module._flat_weights)
            or (module.training and module.dropout > 0 and module.num_layers > 1)
            or torch.is_autocast_enabled("cpu") or torch._C._functorch.is_functorch_wrapped_tensor(x)):
        return None
    h0 = states[0] if states else None
    c0 = states[1] if lstm and states else None
    new_hx = None if hx is None else (tuple(t.detach() for t in states) if lstm else h0.detach())
    own = _OwnForward(module) if own_lstm_applies(module, x) else None
    x_in = x.detach() if own is None else own.input(x.detach())
    new_args, new_kwargs = _with_inputs(args, kwargs, x_in, new_hx)

    def finish(output):
        out, state = output
        outputs = (out, *state) if lstm else (out, state)
        anchor = torch.zeros((), dtype=x.dtype, requires_grad=True)
        kept = None if own is None else own.kept
        # the weights as the backward forms the gates again (not needed where the forward kept them)
        params = None if kept is not None else {n: p.detach() for n, p in module.named_parameters()}
        joined = _OwnBackward.apply(module, params, kept, x, h0, c0, anchor, *outputs)
        return (joined[0], (joined[1], joined[2])) if lstm else (joined[0], joined[1])

    return finish, new_args, new_kwargs


def _with_inputs(args, kwargs, x, hx):
    """The call's ``(args, kwargs)`` with its input and state replaced."""
    args, kwargs = list(args), dict(kwargs)
    if args:
        args[0] = x
    else:
        kwargs["input"] = x
    if len(args) > 1:
        args[1] = hx
    elif "hx" in kwargs:
        kwargs["hx"] = hx
    return tuple(args), kwargs


recurrent_rule.own_backward = own_backward
recurrent_rule.detachable = True

for _t in RECURRENT_TYPES:
    CALL_BATCH[_t] = recurrent_batch
