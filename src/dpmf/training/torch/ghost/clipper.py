"""``GhostClipper``: per-example clipping from one forward and one backward, without per-example
gradient tensors for the layers that have a ghost rule (``grad_sample_mode="ghost"``).

Stages (DESIGN.md, "per-example work"):

1. *capture* -- a forward hook on every layer that owns trainable parameters records its inputs, and a
   tensor hook on each of its outputs records the output gradient during the backward;
2. *norms* -- when the backward ends (a callback queued on the autograd engine), every layer's rule
   (:mod:`~dpmf.training.torch.ghost.registry`) returns an upper bound of each example's squared
   gradient norm over its parameters; layers without a rule use per-example gradients of that layer
   alone (:mod:`~dpmf.training.torch.ghost.fallback`); ``n_i = sqrt(sum over layers)``, float64;
3. *clip factors* -- :func:`~dpmf.training.torch.clipping.clip_factors` (``min(1, C (1 - margin) / n_i)``);
4. *clipped sum* -- each rule forms ``sum_i f_i g_i`` for its layer (book-keeping: ``(f * G)^T A`` for
   Linear and convolutions, ``index_add`` for embeddings), then the captured tensors are released.

Loss reduction: with ``loss_reduction="mean"`` the captured gradients are ``(1/B) dL_i/ds`` for the
``B`` examples of that backward, so norms are multiplied by ``B`` and the clipped sum is
``sum_i f_i B (1/B) g_i = sum_i f_i g_i``: the *sum* of clipped per-example gradients, as in the other
modes. The loss must be a sum or a mean over examples of per-example losses (a token-level mean over
the whole batch couples examples and is not covered by per-example clipping).

Two ways to use it: :meth:`GhostClipper.clipped_sum` (``inputs, targets``: it runs the forward and the
backward itself) and the loop users already have (``loss = criterion(model(x), y); loss.backward()``)
followed by :meth:`GhostClipper.collect`, which returns what the backwards since the last call formed.

Shared parameters: a layer called several times in one forward, or a parameter owned by several
layers (tied input/output embeddings), gets the norm of the *sum* of its contributions, cross terms
included (:mod:`~dpmf.training.torch.ghost.joint`): every call's contribution from its rule (the
fallback's per-example gradients for rules that give none), joined per parameter.

Direct reads: a parameter of a layer with a rule that the forward also reads outside the layer's call
(``logits = h @ self.embed.weight.t()``, ``F.linear(h, self.lin.weight)``) is replaced in its layer by a
tracked alias for the model's forward (the layer's own calls get the parameter back), so those reads
give per-example contributions (:class:`~dpmf.training.torch.ghost.broadcast.DirectReads`; in the loop the
alias is installed on the parameter's first read, so a forward that reads none forms none), joined
with the layer's like tied weights; a read that cannot be split per example is refused, naming the
parameter, and in the loop a gradient that reached such a parameter some other way is refused too.

Inputs shared by the batch: inside the model's forward, a layer whose main input has a leading
dimension of 1 while the model's batch is ``B`` (GPT-2's position ids), or an Embedding called on 1-D
ids of another length than ``B``, runs on that input expanded to ``B`` rows (its output rows are then
per example; the broadcast that followed is unchanged). 1-D ids as long as the batch are taken as
per-example ids (a label embedding): pass position ids with a leading batch dimension.

Loop speed: inside the model's forward (and only when this is the model's only clipper), layers with
built-in rules run on detached copies of their parameters, so the loop's ``backward()`` does not form
the batch weight gradients that the book-keeping sums replace; ``.grad`` of those parameters stays
``None`` until ``optimizer.step()`` writes the noisy clipped sum. :meth:`GhostClipper.clipped_sum`
does not detach (it differentiates with respect to the parameters). The detached layers' outputs stay
linked to their parameters (:mod:`~dpmf.training.torch.ghost.detached`), so ``torch.autograd.grad``
(or ``backward(inputs=...)``) with respect to those parameters is refused with a dpmf error rather than
torch's "not used in the graph" or missing gradients; for plain gradients of such a model run the
forward inside ``with clipper.plain():`` (``run.optimizer.clipper``).

Refused rather than computed wrong (clear errors): a layer whose input has another number of rows
than the model's batch (naming it), a captured input modified in place before the backward, a second
backward through the same forward, BatchNorm in training mode, non-finite gradients.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.batch import batch_size_of, flat_tensors, split_batch
from dpmf.training.torch.clipping import ClippedGradients, Clipper, check_nonfinite, check_scalar_loss, check_weights, clip_factors, setup_clipper
from dpmf.training.torch.ghost import broadcast, conv, embedding, hf, linear, normalization, recurrent  # noqa: F401  (register the rules)
from dpmf.training.torch.ghost.detached import DetachedParameters, capture_grad
from dpmf.training.torch.ghost.fallback import fallback_gradients
from dpmf.training.torch.ghost.joint import Factored, PerExample, joint_sq_norms, joint_weighted_sum
from dpmf.training.torch.ghost.registry import (
    CALL_BATCH,
    LayerCall,
    LayerGradients,
    apply_rule,
    rule_for,
)
from dpmf.training.torch.ghost.sequence import F64, gamma, gram_norms, per_example_norms, per_example_sums, step_cache
from dpmf.training.torch.ghost.tracking import param_of

torch = require_torch()

__all__ = ["GhostClipper", "BatchResult", "model_loss"]


#: model -> the GhostClippers attached to it: parameters are detached (GhostClipper._detach) only by a
#: model's only clipper (another one, or an autograd.grad over the parameters, would not see them)
_ATTACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

#: layers whose forward uses their sub-layers' parameters without calling them (MultiheadAttention
#: reads ``out_proj.weight`` directly): one unit with all their parameters, through the fallback
WHOLE_LAYERS = (torch.nn.MultiheadAttention,)


@dataclass
class _Unit:
    """A layer owning trainable parameters: its rule (or None: fallback) and where its sums go."""

    name: str
    module: Any
    rule: Callable | None
    trainable: dict  # local name -> parameter
    index: dict  # local name -> position in GhostClipper.params
    calls: list = field(default_factory=list)  # this forward's calls (several: a layer reused)
    fell_back: bool = False  # a call went to the fallback (the rule declined it)
    detachable: bool = False  # a built-in rule: the forward may use detached parameters (see _unit_pre_hook)
    swapped: dict | None = None  # name -> what was in the module, while its own call runs on another tensor
    detached: bool = False  # the call in progress runs on detached parameters
    tracked: bool = False  # no rule: parameters broadcast over the batch are followed (ghost.broadcast)
    bias_table: bool = False  # always called without a batch dimension (T5's relative_attention_bias)
    capture: Any = None  # the tracked parameters of the call in progress
    flat_weights: Any = None  # a torch RNN's list of its weights, while the call in progress runs detached
    own: Any = None  # the rule's own backward for the call in progress (its rule's ``own_backward``)
    batch_of: Any = None  # registry.CALL_BATCH's function for its type, where it has a rule (registry.call_batch)


@dataclass
class BatchResult:
    """What one backward formed: clipped sums (one per trainable parameter, ``None`` = zero), norms, ``B``."""

    sums: list
    norms: Any
    batch: int


def _without_rows(call: LayerCall, bad) -> LayerCall:
    """A copy of ``call`` whose float tensors have the ``bad`` examples' rows set to 0."""
    B = call.batch

    def clean(t):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.ndim >= 1 and t.shape[0] == B:
            return torch.where(bad.to(t.device).view(-1, *([1] * (t.ndim - 1))), torch.zeros((), dtype=t.dtype,
                               device=t.device), t)
        return t

    return LayerCall(tuple(clean(a) for a in call.args), {k: clean(v) for k, v in call.kwargs.items()},
                     call.outputs, [None if g is None else clean(g) for g in call.grads], B, versions=[],
                     shared=None if call.shared is None else call.shared.without_rows(bad))


def _contributions(lg: LayerGradients) -> list:
    """A layer's contributions (:mod:`~dpmf.training.torch.ghost.joint`), lists flattened; [] if it gives none
    or has not formed them (a rule's contributions formed only for a joined call: ``LayerGradients``)."""
    out = []
    for c in (lg.formed_contributions or {}).values():
        out.extend(c if isinstance(c, list) else [c])
    return out


def _joint_sum(contributions, param, f) -> dict:
    return {"p": joint_weighted_sum(contributions, f, param)}


def _sequence_first(module) -> bool:
    """Whether a layer is a known sequence-first one (``MultiheadAttention(batch_first=False)``)."""
    return isinstance(module, torch.nn.MultiheadAttention) and not module.batch_first


def _release(call: LayerCall) -> None:
    """Drop a finished call's tensors. The tensor hook on each output holds the call, and the call held
    the output: a cycle through autograd's C++ hook storage that Python's collector cannot see, which
    kept every step's activations alive (a leak of the whole step's tensors per step)."""
    call.args, call.kwargs, call.outputs, call.grads, call.versions = (), {}, [], [], []
    if call.shared is not None:
        call.shared.release()
        call.shared = None


def _wrapped(t) -> bool:
    return torch._C._functorch.is_functorch_wrapped_tensor(t)


def model_loss(output):
    """The loss a model returned: a scalar tensor, ``output.loss`` or ``output["loss"]``."""
    if isinstance(output, torch.Tensor):
        loss = output
    elif isinstance(output, dict) and "loss" in output:
        loss = output["loss"]
    elif getattr(output, "loss", None) is not None:
        loss = output.loss
    else:
        raise InvalidParameterError(
            f"loss_fn=None needs a model that returns its loss (a scalar tensor, .loss or ['loss']); "
            f"it returned {type(output).__name__}: pass loss_fn=..."
        )
    return check_scalar_loss(loss)


class GhostClipper(Clipper):
    """Per-example clipping by ghost norms and book-keeping (module docstring).

    Args:
        module: the model. Every sub-module owning trainable parameters is a *layer*: Linear,
            Conv1d/2d, Embedding (also ``sparse=True``), LayerNorm, GroupNorm, RMSNorm, Hugging Face
            ``Conv1D`` and RMSNorm-like classes have ghost rules; any other uses per-example gradients
            of that layer only. Layers may share parameters (tied weights), be called several
            times, and have their parameters read directly in the forward (``h @ embed.weight.t()``).
            Inputs must be batch-first (inputs shared by the batch are expanded to it).
        loss_fn: ``loss_fn(output, targets) -> scalar`` over the batch (reduced as ``loss_reduction``
            says), ``loss_fn(output)`` when there are no targets, or ``None`` when the model returns
            its loss (used by :meth:`clipped_sum`; the loop mode never calls it).
        max_grad_norm: the clip norm ``C``.
        loss_reduction: ``"mean"`` or ``"sum"``: how the batch loss reduces the per-example losses.
        chunk_size: :meth:`clipped_sum` runs forward and backward on at most this many examples at once.
        nonfinite: ``"raise"`` (default: an example with a NaN/inf gradient raises
            :class:`~dpmf.errors.NumericalError`) or ``"skip"`` (it contributes 0, counted in
            :attr:`skipped_nonfinite`).
    """

    mode = "ghost"
    loop_form = True

    def __init__(self, module, loss_fn: Callable | None, max_grad_norm: float, *, loss_reduction: str = "mean",
                 chunk_size: int | None = None, nonfinite: str = "raise") -> None:
        setup = setup_clipper(module, loss_fn, max_grad_norm, chunk_size, loss_reduction, nonfinite,
                              loss_fn_optional=True)
        self.nonfinite, self.skipped_nonfinite = setup.nonfinite, 0
        self.loss_guard: list = []
        self.module, self.loss_fn, self.loss_reduction = module, loss_fn, loss_reduction
        self.max_grad_norm, self.chunk_size, self.margin = setup.max_grad_norm, setup.chunk_size, setup.margin
        self.param_names, self.params, self._batchnorms = setup.param_names, setup.params, setup.batchnorms
        self.units = self._find_units()
        self._suspended = False
        self._queued = False
        self._weights = None
        self._results: list[BatchResult] = []
        self._error: Exception | None = None
        self._handles = [u.module.register_forward_hook(functools.partial(self._forward_hook, u), with_kwargs=True)
                         for u in self.units]
        self._handles += [u.module.register_forward_pre_hook(functools.partial(self._unit_pre_hook, u),
                                                             with_kwargs=True)
                          for u in self.units if not isinstance(u.module, WHOLE_LAYERS)]
        self._model_batch: int | None = None
        # first, so that the model's own layer hooks (a model that owns parameters itself) see its batch
        self._handles.append(module.register_forward_pre_hook(self._model_pre_hook, with_kwargs=True, prepend=True))
        self._handles.append(module.register_forward_hook(self._model_post_hook, always_call=True))
        self._in_model = 0  # inside the model's own forward (nesting depth)
        self._detach_ok = True
        _ATTACHED.setdefault(module, weakref.WeakSet()).add(self)
        self._alone = True  # this is the model's only clipper (read at each forward's start: _model_pre_hook)
        self._touched: set[int] = set()
        self._direct = None  # the forward in progress: reads of rule layers' parameters (DirectReads)
        self._direct_pending: list = []  # forwards finished, their backward to come
        self._direct_places: dict[int, list] = {}  # parameter position -> [(rule layer, name)]
        for u in self.units:
            if u.rule is not None and not isinstance(u.module, WHOLE_LAYERS):
                for n, k in u.index.items():
                    if u.module._parameters.get(n) is u.trainable[n]:
                        self._direct_places.setdefault(k, []).append((u.module, n))
        self._param_grads: dict = {}
        self._undetached: set[int] = set()  # parameters of calls captured on the parameters themselves
        self._units_of: dict[int, list] = {}
        for u in self.units:
            for k in u.index.values():
                self._units_of.setdefault(k, []).append(u)
        self._shared = {k for k, us in self._units_of.items() if len(us) > 1}
        # parameters whose layers all run on detached copies in the loop: any gradient they receive came
        # through the direct reads' aliases (checked at the backward's end: nothing else reached them)
        self._watched = {k for k, us in self._units_of.items() if all(u.detachable for u in us)}
        #: direct places aliased on first read (broadcast.DirectReads.watch): parameters whose layers all run
        #: on detached copies in the loop (no rule's own backward, which detaches only where it applies), so
        #: a read that bypassed the watch is refused (_check_unfollowed), never missed
        self._lazy_direct = {k for k in self._direct_places if k in self._watched
                             and not any(getattr(u.rule, "own_backward", None) for u in self._units_of[k])}
        self._direct_entries = [(k, self.params[k], places) for k, places in self._direct_places.items()]
        self._lazy_groups = broadcast.watch_groups([e for e in self._direct_entries if e[0] in self._lazy_direct])
        self._handles += [p.register_hook(functools.partial(self._param_hook, k)) for k, p in enumerate(self.params)]
        # detached layers' outputs linked to their parameters: autograd.grad on them refused (ghost.detached)
        self._detached = DetachedParameters([p for k, p in enumerate(self.params)
                                             if any(u.detachable for u in self._units_of.get(k, ()))],
                                            [u.name for u in self.units if u.detachable], self._refused_backward)

    # ------------------------------------------------------------------ layers
    def _find_units(self) -> list[_Unit]:
        position = {id(p): k for k, p in enumerate(self.params)}
        units: list[_Unit] = []
        inside: list[str] = []  # prefixes of layers that own their sub-layers' parameters
        for name, m in self.module.named_modules(remove_duplicate=False):
            if any(name.startswith(prefix + ".") for prefix in inside):
                continue
            whole = isinstance(m, WHOLE_LAYERS)
            if whole:
                inside.append(name)
            own = {n: p for n, p in m.named_parameters(recurse=whole, remove_duplicate=False) if p.requires_grad}
            if not own:
                continue
            if any(u.module is m for u in units):
                continue
            rule = None if whole else rule_for(m)
            unit = _Unit(name or type(m).__name__, m, rule, own, {n: position[id(p)] for n, p in own.items()})
            unit.detachable = (rule is not None and getattr(rule, "detachable", False)
                               and all(m._parameters.get(n) is p for n, p in own.items()))
            unit.tracked, unit.bias_table = rule is None and not whole, broadcast.is_bias_table(name, m)
            unit.batch_of = CALL_BATCH.get(type(m)) if rule_for(m) is not None else None
            units.append(unit)
        return units

    def covered_layers(self) -> dict:
        """``{layer name: "ghost" | "fallback"}``: how each layer's per-example norms are computed.
        ``"fallback"``: the layer has no rule, or its rule declined one of the calls seen so far (an
        ``Embedding(max_norm=...)``, an RMSNorm-like layer whose output did not match the formula)."""
        return {u.name: ("ghost" if (u.rule is not None or u.tracked) and not u.fell_back else "fallback")
                for u in self.units}

    def fallback_layers(self) -> list:
        """Names of the layers whose per-example norms use per-example gradients (:meth:`covered_layers`)."""
        return [name for name, how in self.covered_layers().items() if how == "fallback"]

    def diagnostics(self) -> dict:
        """``{"ghost_fallback_layers": [...]}`` for the training report (:meth:`fallback_layers`)."""
        return {"ghost_fallback_layers": self.fallback_layers()}

    def shared_parameters(self) -> dict:
        """``{parameter name: [layer names]}`` for parameters owned by more than one layer (tied weights)."""
        out = {}
        for k, us in self._units_of.items():
            if len(us) > 1:
                out[self.param_names[k]] = [u.name for u in us]
        return out

    # ------------------------------------------------------------------ capture
    def _capturing(self) -> bool:
        return not self._suspended and torch.is_grad_enabled()

    def _model_pre_hook(self, module, args, kwargs):
        """A new forward of the whole model: captures that never saw a backward are stale (e.g. an
        evaluation forward with gradients enabled); drop them. Records the batch size of the model's
        input (dim 0 of its first tensor), which every layer's call must share."""
        for u in self.units:  # a forward that raised inside a layer left its parameters detached
            self._restore(u)
        self._in_model += 1
        self._alone = len(_ATTACHED.get(self.module, ())) == 1
        if not self._capturing():
            return
        tensors = [t for t in flat_tensors((args, kwargs)) if t.ndim >= 1]
        if any(_wrapped(t) for t in tensors):
            return  # another clipper's per-example re-run (its fallback on this very module) under vmap
        self._model_batch = tensors[0].shape[0] if tensors else None
        for u in self.units:
            if u.calls and all(g is None for c in u.calls for g in c.grads):
                for c in u.calls:
                    c.stale = True
                    _release(c)
                u.calls = []
        if self._in_model == 1 and self._model_batch is not None:
            self._install_direct(self._model_batch)

    def _install_direct(self, batch: int) -> None:
        """Rule layers' parameters replaced by tracked aliases for this forward (:class:`broadcast.DirectReads`):
        reads outside the layers' own calls are followed. Forwards that never saw a backward are dropped."""
        self._drop_direct()
        if self._direct_places:
            self._direct = d = broadcast.DirectReads(batch)
            if self._detach_ok and self._alone:  # (the layers run detached)
                d.install_all([e for e in self._direct_entries if e[0] not in self._lazy_direct])
                d.watch(self._lazy_groups)
            else:
                d.install_all(self._direct_entries)

    def _drop_direct(self) -> None:
        for d in self._direct_pending + ([self._direct] if self._direct is not None else []):
            d.release()
        self._direct, self._direct_pending = None, []

    def _model_post_hook(self, module, args, output):
        self._in_model = max(0, self._in_model - 1)
        if self._in_model == 0:
            self._detached.forward_done()
        if self._in_model == 0 and self._direct is not None:
            for u in self.units:  # (a forward that raised inside a layer left its swap)
                self._restore(u)
            self._direct.uninstall()
            self._direct.unwatch()
            self._direct_pending.append(self._direct)
            self._direct = None

    def _unit_pre_hook(self, unit: _Unit, module, args, kwargs):
        """Before a layer's forward inside the model's forward: detach its parameters (:meth:`_detach`),
        expand an input shared by the batch (:meth:`_expand`)."""
        if not self._capturing() or not (self._in_model or self._recomputing()):
            return None
        if unit.detachable and unit.swapped is None and self._detach_ok and self._alone:
            own = getattr(unit.rule, "own_backward", None)  # (a rule with one detaches only where it applies)
            got = None if own is None else own(module, args, kwargs)
            if own is None or got is not None:
                self._detach(unit)
            if got is not None:  # the call runs on detached inputs; the forward hook joins them by the rule's backward
                unit.own, args, kwargs = got
                return args, kwargs
        elif unit.rule is not None and unit.swapped is None and any(
                param_of(module._parameters.get(n))[0] is not None for n in unit.trainable):
            self._detach(unit, detach=False)  # its own call on the parameters, not on the aliases of direct reads
        if (unit.tracked and unit.swapped is None and self._model_batch
                and self._alone):  # (two clippers would swap each other's)
            unit.capture = broadcast.ParamCapture(unit.trainable, self._model_batch)
            unit.swapped = unit.capture.swap(module)
        return None if unit.bias_table else self._expand(unit, module, args, kwargs)

    def _detach(self, unit: _Unit, detach: bool = True) -> None:
        """A layer with a built-in rule runs on *detached* copies of its parameters (same storage), so
        autograd does not form their (batch) gradients -- one GEMM per layer that ghost mode would
        discard: the book-keeping sums replace it. The forward hook puts the parameters back; where the
        layer's input needs no gradient (the first layers), its output is made to require one through
        a 0-dim zero leaf, so that the backward still reaches it. ``.grad`` of such parameters stays
        ``None`` after ``backward()``; ``optimizer.step()`` writes the noisy clipped sum there.
        ``detach=False``: the parameters themselves (in place of the aliases that follow direct reads)."""
        unit.swapped, unit.detached = {}, detach
        held = unit.module._parameters  # (read as held: not through a first-read watch, DirectReads.watch)
        for n, p in unit.trainable.items():
            unit.swapped[n] = dict.__getitem__(held, n)
            held[n] = p.detach() if detach else p
        names = unit.module.__dict__.get("_flat_weights_names")  # (no Module.__getattr__ miss per call)
        if names is not None:  # torch's RNNs run on this list of their weights (and its weak references)
            m = unit.module
            unit.flat_weights = (m._flat_weights, m._flat_weight_refs)
            m._flat_weights = [dict.__getitem__(held, n) if n in unit.trainable else w
                               for n, w in zip(names, m._flat_weights)]
            m._flat_weight_refs = [None if w is None else weakref.ref(w) for w in m._flat_weights]

    @staticmethod
    def _restore(unit: _Unit) -> None:
        if unit.swapped is not None:
            for n, p in unit.swapped.items():
                unit.module._parameters[n] = p
            unit.swapped, unit.detached = None, False
        if unit.flat_weights is not None:
            (unit.module._flat_weights, unit.module._flat_weight_refs), unit.flat_weights = unit.flat_weights, None
        unit.own = None

    def _expand(self, unit: _Unit, module, args, kwargs):
        """A layer whose main input is shared by the batch (dim 0 of size 1 while the model's batch is
        ``B > 1``, e.g. GPT-2's position ids; or, for an Embedding, 1-D ids of another length than
        ``B``) runs on that input expanded to ``B`` rows: its output then holds one (identical) row per
        example, which the broadcast that followed uses exactly as before, and its gradient arrives per
        example. Without this, the gradient of the shared output would be the sum over the batch."""
        B = self._model_batch
        if not B or type(module) in CALL_BATCH:
            return None  # (a layer with its own batch convention, e.g. time-first recurrent input)
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor) or x.ndim == 0 or _wrapped(x):
            return None
        if x.shape[0] == 1 and B > 1:
            new = x.expand(B, *x.shape[1:])
        elif (x.ndim == 1 and x.shape[0] != B and not x.is_floating_point() and not x.is_complex()
              and isinstance(module, torch.nn.Embedding)):
            new = x.unsqueeze(0).expand(B, x.shape[0])
        else:
            return None
        if args:
            return (new, *args[1:]), kwargs
        return args, {**kwargs, "input": new}

    def _recomputing(self) -> bool:
        """A layer's forward outside the model's forward but inside a backward: activation checkpointing
        (``torch.utils.checkpoint``) recomputing a block to unpack its saved tensors."""
        return not self._in_model and torch._C._current_graph_task_id() != -1

    def _recomputed(self, unit: _Unit) -> None:
        """A recomputed call is not captured: the original forward's call is the one whose output
        gradients this backward delivers (non-reentrant checkpointing backpropagates through the original
        graph, with the recomputed tensors unpacked into it), so norms and sums are those of the run
        without checkpointing. Its detach and expansion repeat the original's (the same tensors must be
        saved). Reentrant checkpointing ran the original forward without gradients: nothing was captured."""
        if not unit.calls:
            raise UnsupportedConfigurationError(
                f"layer {unit.name!r} was recomputed inside the backward but its forward was not recorded: "
                "reentrant activation checkpointing (torch.utils.checkpoint(..., use_reentrant=True)) runs the "
                "forward without gradients and backpropagates a second graph, which ghost clipping cannot join; "
                "use use_reentrant=False (Hugging Face: gradient_checkpointing_kwargs={'use_reentrant': False})"
            )

    def _forward_hook(self, unit: _Unit, module, args, kwargs, output):
        detached = unit.swapped is not None and unit.detached
        own = unit.own
        self._restore(unit)
        capture, unit.capture = unit.capture, None
        if own is not None:
            output = own(output)  # (the rule's backward joins the outputs to the inputs)
        if not self._capturing():
            return output if own is not None else None
        if detached:
            output = self._linked(output)  # (requires grad through the token where the input did not)
        if self._recomputing():
            self._recomputed(unit)
            return output if detached else None
        if self._batchnorms and any(m.training for m in self._batchnorms):
            raise UnsupportedConfigurationError(
                "BatchNorm in training mode mixes examples, so per-example gradients do not exist; "
                "replace it (e.g. torch.nn.GroupNorm) or put it in eval mode"
            )
        Tensor = torch.Tensor
        args = tuple([a.detach() if isinstance(a, Tensor) else a for a in args])
        if kwargs:
            kwargs = {k: v.detach() if isinstance(v, Tensor) else v for k, v in kwargs.items()}
            first = flat_tensors((args, kwargs))
        else:
            kwargs = {}
            first = flat_tensors(args)
        if any(_wrapped(t) for t in first):
            return  # inside a torch.func transform (another clipper's vmap): not this backward's forward
        if not detached:
            self._undetached.update(unit.index.values())
        batch = first[0].shape[0] if first and first[0].ndim >= 1 else 0
        if unit.batch_of is not None:  # (registry.call_batch: a layer with its own batch convention)
            batch = unit.batch_of(module, args, kwargs, name=unit.name, model_batch=self._model_batch)
        model_batch = self._model_batch
        shared = (capture is None and unit.rule is not None and model_batch and type(module) not in CALL_BATCH
                  and (unit.bias_table or batch != model_batch) and broadcast.OutputCapture.trackable(output))
        batch = model_batch if shared else batch  # a call shared by the batch (a bias table)
        outputs = flat_tensors(output)
        call = LayerCall(args, kwargs, outputs, [None] * len(outputs), batch,
                         versions=[(t, t._version) for t in first], shared=capture)
        for k, t in enumerate(outputs):
            if t.requires_grad:
                hook = functools.partial(self._grad_hook, unit, call, k)
                if not (detached and capture_grad(t, hook)):  # (a linked output: its link node calls it)
                    t.register_hook(hook)
        unit.calls.append(call)
        if shared:
            output, call.shared = broadcast.OutputCapture.track_outputs(output, batch)
            return output
        return output if detached else None

    def _linked(self, output):
        """A detached layer's floating output tensors (a tensor, or tuples of them: a recurrent layer's
        ``(out, (h_n, c_n))``) joined to this forward's token (:mod:`~dpmf.training.torch.ghost.detached`)."""
        if isinstance(output, torch.Tensor):
            return self._detached.link(output) if output.is_floating_point() else output
        if isinstance(output, tuple) and type(output) is tuple:
            return tuple(self._linked(o) for o in output)
        return output

    def _grad_hook(self, unit, call, k, grad):
        if broadcast.pulling():
            return  # a per-example pull-back through this layer's output (ghost.tracking), not the backward
        if call.done or call.stale:
            raise UnsupportedConfigurationError(
                f"a backward reached layer {unit.name!r} through a forward that was already used (a second "
                "backward through the same forward, or two forwards before one backward); run one forward "
                "and one backward per (micro-)batch"
            )
        call.grads[k] = grad.detach()
        if not self._queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
            self._queued = True

    def _param_hook(self, k, grad):
        """Every parameter that receives a gradient must belong to a layer whose call was captured."""
        if grad is None:
            return  # a detached layer's parameter in backward(): no gradient formed (ghost.detached)
        self._touched.add(k)
        captured = bool(self._direct_pending) and not self._suspended  # a captured forward awaits this backward
        if captured and k in self._watched and self._detach_ok:
            self._param_grads[k] = grad if k not in self._param_grads else self._param_grads[k] + grad
        if not self._queued and (self._capturing() or captured):  # (grad mode is off inside a backward)
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
            self._queued = True

    def _on_backward_end(self) -> None:
        self._queued = False
        for u in self.units:  # a checkpoint's recomputation stops once it has what it saves, maybe inside a
            self._restore(u)  # layer whose forward hook then never runs: its parameters are still detached
        touched, self._touched = self._touched, set()
        direct_reads, self._direct_pending = self._direct_pending, []
        param_grads, self._param_grads = self._param_grads, {}
        undetached, self._undetached = self._undetached, set()
        try:
            direct, totals = self._direct_parts(direct_reads)
            self._check_unfollowed(param_grads, undetached, totals)
        except UnsupportedConfigurationError:
            self._drop_calls()
            raise
        for k in sorted(touched):
            us = self._units_of[k]
            if k not in direct and not any(g is not None for u in us for c in u.calls for g in c.grads):
                self._drop_calls()
                raise UnsupportedConfigurationError(
                    f"parameter {self.param_names[k]!r} received a gradient, but no call of its layer "
                    f"{' / '.join(repr(u.name) for u in us)} was seen in this forward and no read of it in the "
                    "model's forward (it was used outside the model's forward -- a term of the loss --, through a "
                    "reference the layer does not hold, or with gradients disabled in the layer); ghost norms "
                    "cannot cover it: use grad_sample_mode='functorch'"
                )
        calls = []
        for u in self.units:
            got = [c for c in u.calls if any(g is not None for g in c.grads)]
            if got:
                calls.append((u, got))
        pending = [c for u in self.units for c in u.calls]
        for u in self.units:
            for c in u.calls:
                c.done = True
            u.calls = []
        try:
            if calls or direct:
                device_type = self.params[0].device.type
                with torch.autocast(device_type, enabled=False):  # norms and sums never in reduced precision
                    self._results.append(self._finish(calls, direct))
        finally:
            for c in pending:
                _release(c)

    def _refused_backward(self) -> None:
        """A backward refused inside the engine (ghost.detached): its queued end never runs; this step's
        captures are dropped, as by ``zero_grad``."""
        self._queued = False
        self._touched, self._param_grads, self._undetached = set(), {}, set()
        self.discard()

    def _drop_calls(self) -> None:
        for u in self.units:
            for c in u.calls:
                _release(c)
            u.calls = []

    def _direct_parts(self, direct_reads: list) -> tuple:
        """``({parameter position: contributions}, {position: gradient through the aliases})`` of the reads
        of rule layers' parameters outside their calls (:class:`broadcast.DirectReads`); a read not
        followed per example is refused, naming it."""
        out: dict[int, list] = {}
        totals: dict = {}
        try:
            device_type = self.params[0].device.type
            with torch.autocast(device_type, enabled=False):
                for d in direct_reads:
                    for k in d.used():
                        parts, why = d.parts(k, self.params[k])
                        if why is not None:
                            raise self._direct_refusal(k, why)
                        out.setdefault(k, []).extend(parts)
                        total = d.sources[k].total
                        if total is not None:
                            totals[k] = total if k not in totals else totals[k] + total
        finally:
            for d in direct_reads:
                d.release()
        return out, totals

    def _check_unfollowed(self, param_grads: dict, undetached: set, totals: dict) -> None:
        """In the loop, a parameter whose layers ran on detached copies receives gradient only through the
        aliases of its direct reads: anything more came from a use dpmf did not see (a term of the loss
        outside the model's forward, a reference to the parameter that its layer does not hold)."""
        for k, g in param_grads.items():
            if k in undetached:
                continue
            t = totals.get(k)
            if t is None:
                unfollowed = bool(g.ne(0).any())
            else:
                tol = 4 * gamma(16, g.dtype)
                unfollowed = bool(((g - t).abs() > tol * (g.abs() + t.abs())).any())
            if unfollowed:
                raise UnsupportedConfigurationError(
                    f"parameter {self.param_names[k]!r} received a gradient from a use that ghost clipping did not "
                    "see: not a call of its layer and not a read of it inside the model's forward (a term of the "
                    "loss computed from the parameter itself, such as a penalty on the weights, or a reference to "
                    "it that its layer does not hold); compute that use inside the model's forward from "
                    "module.weight, or use grad_sample_mode='functorch'"
                )

    def _direct_refusal(self, k: int, why: str) -> UnsupportedConfigurationError:
        us = self._units_of[k]
        layers = " / ".join(f"{u.name!r} ({type(u.module).__name__})" for u in us)
        return UnsupportedConfigurationError(
            f"parameter {self.param_names[k]!r} of layer {layers} is also read directly in the model's forward, "
            f"outside the layer's own call, and that read meets the batch in {why}: ghost clipping cannot split "
            "that use per example. It follows direct reads used as F.linear(x, W), x @ W, x @ W.t(), "
            "F.embedding(ids, W) / W[ids] and additions broadcast over the batch: write the use as one of those "
            "(e.g. logits = F.linear(h, embed.weight)), call the layer itself or a layer tied to the weight "
            "(lm_head = nn.Linear(d, V, bias=False); lm_head.weight = embed.weight), or use "
            "grad_sample_mode='functorch'"
        )

    # ------------------------------------------------------------------ norms, factors, sums
    def _finish(self, calls, direct: dict) -> BatchResult:
        model_batch, self._model_batch = self._model_batch, None
        sizes = {u.name: c.batch for u, cs in calls for c in cs}
        sizes.update({self.param_names[k]: parts[0].batch for k, parts in direct.items() if parts})
        batches = set(sizes.values())
        if len(batches) != 1 or (model_batch is not None and model_batch not in batches):
            if model_batch is None:
                model_batch = max(batches, key=lambda b: sum(v == b for v in sizes.values()))
            odd = {name: b for name, b in sizes.items() if b != model_batch}
            seq_first = [u.name for u, _ in calls if u.name in odd and _sequence_first(u.module)]
            hint = (f"; {', '.join(seq_first)} is sequence-first: pass batch_first=True" if seq_first else "")
            raise UnsupportedConfigurationError(
                f"the model's input has {model_batch} examples along dim 0, but layer(s) {odd} saw another number of "
                "rows: per-example gradients need every layer with trainable parameters called on batch-first, "
                "per-example inputs. An input shared by the batch with a leading dimension of 1 (position ids) is "
                "expanded automatically; an input with no batch dimension, or a batch dimension elsewhere, is not "
                f"(expand it to the batch: x.expand({model_batch}, ...), or pass batch_first=True){hint}"
            )
        B = batches.pop()
        if B == 0:  # an empty (Poisson) batch: nothing to clip, the noise is still added by the optimizer
            return BatchResult([None] * len(self.params), torch.zeros(0, dtype=F64, device=self.params[0].device), 0)
        scale = float(B) if self.loss_reduction == "mean" else 1.0
        device = self.params[0].device
        layer_grads, sq = self._layer_gradients(calls, B, device, direct)
        norms = torch.sqrt(sq) * scale
        bad = ~torch.isfinite(norms)
        if bool(bad.any()):
            self.skipped_nonfinite += check_nonfinite(bad, self.nonfinite)
            # skip: zero the examples' rows everywhere (0 * inf would poison the products), recompute
            calls = [(u, [_without_rows(c, bad) for c in cs]) for u, cs in calls]
            direct = {k: [c.without_rows(bad) for c in parts] for k, parts in direct.items()}
            layer_grads, _ = self._layer_gradients(calls, B, device, direct)
        f = clip_factors(norms, self.max_grad_norm, self.margin)
        if self._weights is not None:
            f = f * check_weights(self._weights, B).to(device)
        f = f * scale
        sums: list = [None] * len(self.params)
        with step_cache():  # the small per-example sums of all layers in one product, the factors cast once
            per_example_sums([c.grads for _, lg in layer_grads for c in _contributions(lg)
                              if isinstance(c, PerExample) and c.folded_into is None], f)
            for index, lg in layer_grads:
                for name, s in lg.weighted_sum(f).items():
                    sums[index[name]] = s
        return BatchResult(sums, norms, B)

    def _layer_gradients(self, calls, B: int, device, direct: dict):
        """Each layer's gradients (rule or fallback) and the summed squared norms, float64 ``(B,)``.

        A layer with one call and no parameter shared with another layer: its rule's norms and sums. A
        layer called several times, owning a parameter another layer owns too (tied weights), or whose
        parameter the forward also read directly (``direct``: position -> contributions): every call's
        contributions (:mod:`~dpmf.training.torch.ghost.joint`), joined per parameter with their
        cross terms."""
        sq = torch.zeros(B, dtype=F64, device=device)
        layer_grads = []
        joint: dict[int, list] = {k: list(parts) for k, parts in direct.items() if parts}
        with self.suspended(), step_cache():
            formed = self._rule_gradients(calls, joint)
            # the norms of the layers alone, formed together (sequence.gram_norms, sequence.per_example_norms)
            alone = [c for _, lg, together in formed if not together and lg.lazy for c in _contributions(lg)]
            gram_norms([c.sequence_pair for c in alone if isinstance(c, Factored) and c.sequence_pair is not None])
            per_example_norms([c.grads for c in alone if isinstance(c, PerExample) and c.folded_into is None])
            for u, lg, together in formed:
                if not together:
                    sq += lg.sq if lg.sq.device == device else lg.sq.to(device)
                    layer_grads.append((u.index, lg))
                    continue
                for name, contribution in lg.contributions.items():
                    joint.setdefault(u.index[name], []).extend(
                        contribution if isinstance(contribution, list) else [contribution])
            for k, contributions in joint.items():
                sq += joint_sq_norms(contributions).to(device)
                param = self.params[k]
                layer_grads.append(({"p": k}, LayerGradients(None, functools.partial(_joint_sum, contributions, param))))
        return layer_grads, sq

    def _rule_gradients(self, calls, joint: dict) -> list:
        """``[(unit, its call's LayerGradients, together)]``: every call's rule (or the fallback's per-example
        gradients); ``together``: joined per parameter with other calls' (:meth:`_layer_gradients`)."""
        formed = []
        for u, cs in calls:
            together = len(cs) > 1 or any(k in self._shared or k in joint for k in u.index.values())
            for c in cs:
                for t, version in c.versions:
                    if t._version != version:
                        raise UnsupportedConfigurationError(
                            f"the input of layer {u.name!r} was modified in place after the forward (an "
                            "in-place operation such as ReLU(inplace=True) on it); use the out-of-place version"
                        )
                c = broadcast.expanded_call(u.name, u.module, c)  # a bias table's call, per example
                lg = apply_rule(u.rule, u.module, c, u.trainable, u.name) if u.rule is not None else (
                    c.shared.gradients(u.trainable) if u.tracked and c.shared is not None else None)
                if lg is not None and together and (lg.contributions is None
                                                    or set(lg.contributions) != set(u.trainable)):
                    lg = None  # the rule cannot give cross terms: per-example gradients of this call
                if lg is None:
                    u.fell_back = u.fell_back or u.rule is not None or u.tracked
                    lg = fallback_gradients(u.module, c, u.trainable, u.name)
                formed.append((u, lg, together))
        return formed

    @contextlib.contextmanager
    def _switched(self, name: str, value: bool):
        """``self.<name>`` set to ``value`` inside, restored after (one of this clipper's own flags)."""
        old = self.__dict__[name]
        self.__dict__[name] = value
        try:
            yield
        finally:
            self.__dict__[name] = old

    def _no_detach(self):
        """No detached parameters inside (:meth:`clipped_sum` differentiates with respect to them)."""
        return self._switched("_detach_ok", False)

    def suspended(self):
        """No capture inside (re-running a layer for its per-example gradients, evaluation)."""
        return self._switched("_suspended", True)

    # ------------------------------------------------------------------ public
    def plain(self):
        """Ordinary (non-private) autograd inside: ``with run.optimizer.clipper.plain(): grads =
        torch.autograd.grad(loss, model.parameters())``. Outside it, ghost mode runs layers with built-in
        rules on detached parameters (module docstring), so ``torch.autograd.grad`` with respect to them
        is refused (:mod:`~dpmf.training.torch.ghost.detached`); inside, the forward uses the
        parameters themselves and nothing is captured for the private step. (``close()`` removes
        ghost mode from the model for good.)"""
        return self.suspended()

    def clipped_sum(self, inputs, targets=None, weights=None):
        """``(S_p for every trainable parameter, unclipped norms n_i)`` of a batch, from forward(s) and
        backward(s) run here (in chunks of ``chunk_size``); ``.grad`` is left untouched.

        ``inputs``: a tensor, a tuple of tensors (``module(*inputs)``) or a dict (``module(**inputs)``);
        ``targets``: passed to ``loss_fn`` (None: ``loss_fn(output)``, or the model's own loss when
        ``loss_fn`` is None). ``weights``: optional per-example multipliers in ``[0, 1]`` of the clip factors.
        """
        if self.pending():
            raise InvalidParameterError(
                "a backward already ran this step (the loop form): call optimizer.step() without a batch, "
                "or pass the batch to optimizer.step(inputs, targets), not both"
            )
        batch = batch_size_of(inputs)
        if targets is not None and (not isinstance(targets, torch.Tensor) or targets.ndim < 1 or targets.shape[0] != batch):
            raise InvalidParameterError(f"targets must be a tensor with {batch} examples along dim 0")
        w_all = None if weights is None else check_weights(weights, batch)
        sums = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self.params]
        norms = []
        step = self.chunk_size or max(batch, 1)
        for lo in range(0, max(batch, 1), step):
            hi = min(batch, lo + step)
            part = split_batch(inputs, lo, hi, batch)
            tpart = None if targets is None else targets[lo:hi]
            self._weights = None if w_all is None else w_all[lo:hi]
            try:
                result = self._forward_backward(part, tpart, hi - lo)
            finally:
                self._weights = None
            for s, r in zip(sums, result.sums):
                if r is not None:
                    s.add_(r)
            norms.append(result.norms)
        return ClippedGradients(sums, torch.cat(norms))

    def _forward_backward(self, inputs, targets, batch: int) -> BatchResult:
        module = self.module
        # autograd.grad(loss, params) runs only the part of the graph that leads to the parameters: no
        # detached parameters here (the loop's backward() runs all of it)
        with torch.enable_grad(), self._no_detach():
            out = module(**inputs) if isinstance(inputs, dict) else (
                module(*inputs) if isinstance(inputs, (tuple, list)) else module(inputs))
            if self.loss_fn is None:
                loss = model_loss(out)
            else:
                loss = model_loss(self.loss_fn(out) if targets is None else self.loss_fn(out, targets))
            if loss.requires_grad:
                torch.autograd.grad(loss, self.params, allow_unused=True)
        for u in self.units:  # layers whose output reached no loss
            for c in u.calls:
                c.stale = True
                _release(c)
            u.calls = []
        got = self._results
        self._results = []
        if not got:
            return BatchResult([None] * len(self.params), torch.zeros(batch, dtype=F64, device=self.params[0].device), batch)
        return got[0]

    def pending(self) -> bool:
        """True when a loop backward formed clipped sums that :meth:`collect` has not taken yet."""
        return bool(self._results)

    def forwards_waiting(self) -> list:
        """Names of layers whose forward has not been followed by a backward yet."""
        return [u.name for u in self.units if u.calls]

    def collect(self) -> tuple[list | None, Any, int]:
        """``(sums, norms, backwards)`` formed by the loop's backwards since the last call: ``sums`` one
        tensor per trainable parameter (``None`` if no backward ran), the unclipped norms of all their
        examples, and how many backwards there were."""
        results, self._results = self._results, []
        if not results:
            return None, torch.zeros(0, dtype=F64, device=self.params[0].device), 0
        if len(results) == 1:  # the rules' own tensors (DPOptimizer copies them)
            sums = [torch.zeros_like(p, memory_format=torch.contiguous_format) if x is None else x
                    for p, x in zip(self.params, results[0].sums)]
            return sums, results[0].norms, 1
        sums = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self.params]
        for r in results:
            for s, x in zip(sums, r.sums):
                if x is not None:
                    s.add_(x)
        return sums, torch.cat([r.norms for r in results]), len(results)

    def discard(self) -> None:
        """Forget captures and formed sums (``zero_grad``)."""
        self._results = []
        for u in self.units:
            for c in u.calls:
                c.stale = True
                _release(c)
            u.calls = []
        if not self._in_model:  # (a forward in progress keeps its aliases until it returns)
            self._drop_direct()

    def close(self) -> None:
        """Remove the hooks from the module."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for u in self.units:
            self._restore(u)
        _ATTACHED.get(self.module, weakref.WeakSet()).discard(self)
        self.discard()
