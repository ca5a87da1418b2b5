"""The per-layer registry of ghost-norm rules (Opacus' ``GRAD_SAMPLERS``, for norms and book-keeping).

A *rule* turns what one call of a layer saw -- its inputs ``A`` and its output gradients ``G``
(:class:`LayerCall`) -- into a :class:`LayerGradients`: an upper bound on every example's squared
gradient norm over the layer's own trainable parameters, and a function that forms the clipped sum
``sum_i f_i g_i`` for given per-example factors ``f_i`` without a per-example gradient tensor where
the rule has a product form. One module per layer family registers its rules here with
:func:`register_ghost_rule`; :func:`rule_for` looks a module up by exact type (or a subclass that
keeps the parent's ``forward``, e.g. ``NonDynamicallyQuantizableLinear``) and returns ``None`` for
layers without a rule, which :mod:`~dpmf.training.torch.ghost.fallback` then covers with per-example
gradients of that layer alone.

A rule may also return ``None`` for a configuration it does not cover (an ``Embedding`` with
``max_norm``); the fallback takes that call. It must never return a wrong norm: the norm it reports
is an upper bound of the exact one for the computed ``A`` and ``G`` (see
:mod:`~dpmf.training.torch.ghost.sequence` for the rounding argument).

A rule for your own layer: ``y = x * w`` (a learned per-feature scale, ``w`` of shape ``(d,)``) has
per-example gradient ``sum_t x_{i,t} * g_{i,t}`` over the positions; a small materialized
:class:`~dpmf.training.torch.ghost.joint.PerExample` contribution is normed in float64 and summed from
the same tensor (use :class:`~dpmf.training.torch.ghost.joint.Factored` for a matrix-shaped weight whose
gradient is a sum of outer products, as Linear does). Giving the rule as contributions also lets the
layer be called twice or share its weight with another layer:

>>> import torch
>>> from dpmf.training.torch.ghost import GHOST_RULES, GhostClipper, PerExample, from_contributions, register_ghost_rule
>>> class Scale(torch.nn.Module):
...     def __init__(self, d):
...         super().__init__()
...         self.w = torch.nn.Parameter(torch.linspace(0.5, 2.0, d))
...     def forward(self, x):
...         return x * self.w
>>> @register_ghost_rule(Scale)
... def scale_rule(module, call, trainable):
...     x, g = call.input, call.grad_output                       # (B, ..., d) each
...     per = (x * g).reshape(x.shape[0], -1, x.shape[-1]).sum(1)  # example i's gradient of w: (B, d)
...     return from_contributions({"w": PerExample(per)}, trainable)
>>> torch.manual_seed(0) and None
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), Scale(4), torch.nn.Linear(4, 2))
>>> x, y = torch.randn(6, 5, 3), torch.randn(6, 5, 2)
>>> loss = lambda out, y: ((out - y) ** 2).sum((1, 2)).mean()
>>> ghost = GhostClipper(model, loss, max_grad_norm=1.0)
>>> ghost.covered_layers()
{'0': 'ghost', '1': 'ghost', '2': 'ghost'}
>>> with_rule = ghost.clipped_sum(x, y)
>>> ghost.close()
>>> del GHOST_RULES[Scale]                                       # the per-example fallback instead
>>> fallback = GhostClipper(model, loss, max_grad_norm=1.0)
>>> without_rule = fallback.clipped_sum(x, y)
>>> fallback.covered_layers()["1"]                           # x * w: no rule, not a broadcast addition
'fallback'
>>> bool(torch.allclose(with_rule.norms, without_rule.norms, rtol=1e-5))
True
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from dpmf.errors import DPMFError, InvalidParameterError
from dpmf.training.torch._deps import require_torch

torch = require_torch()

__all__ = ["LayerCall", "LayerGradients", "GHOST_RULES", "register_ghost_rule", "rule_for", "apply_rule"]

_QUALIFIED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


@dataclass
class LayerCall:
    """One forward call of a layer and the gradients that reached its outputs.

    ``args``/``kwargs``: the call's arguments (tensors detached); ``outputs``: the flat list of the
    output tensors; ``grads``: the gradient of the loss with respect to each of them (``None`` when
    no gradient reached it, i.e. zero); ``batch``: the number of examples (dim 0 of the input);
    ``versions``: ``(tensor, its _version at the forward)`` for the captured inputs (an in-place
    change before the backward is refused); ``stale``: the call was dropped before a backward reached
    it (a later forward, ``zero_grad``); ``done``: a backward already used it; ``shared``: see below. The gradients in
    ``grads`` are those of the batch loss as reduced (the clipper scales a mean by the batch size).
    """

    args: tuple
    kwargs: dict
    outputs: list
    grads: list
    batch: int
    versions: list = field(default_factory=list)
    stale: bool = False
    done: bool = False
    #: per-example gradients collected where the model broadcast a tensor of this call over the batch
    #: (:mod:`~dpmf.training.torch.ghost.broadcast`): a layer's parameters used directly, or the output
    #: of a call made without a batch dimension
    shared: Any = None
    #: ``_version`` of each of ``outputs`` when the call was recorded (a rule that reads an output, as the
    #: recurrent rule reads the hidden states, checks that it was not modified in place since)
    output_versions: list | None = None

    def __post_init__(self) -> None:
        if self.output_versions is None:
            self.output_versions = [t._version for t in self.outputs]

    @property
    def input(self):
        """The layer's main input: the first positional argument, or the keyword ``input``."""
        if self.args:
            return self.args[0]
        return self.kwargs.get("input")

    @property
    def grad_output(self):
        """The gradient of the first output (zeros if none arrived)."""
        g = self.grads[0]
        return torch.zeros_like(self.outputs[0]) if g is None else g


class LayerGradients:
    """``sq``: float64 ``(B,)`` upper bounds of ``||g_i||^2`` over the layer's trainable parameters (or a
    function of no argument that forms them when ``sq`` is first read: a call whose parameters are joined
    with other calls' takes its norms from ``contributions`` and never forms its own);
    ``weighted_sum(f)``: ``{name: sum_i f_i g_{i,name}}`` for float64 factors ``f`` (``(B,)``),
    each in the parameter's dtype and shape.

    ``contributions``: optional ``{name: contribution}`` (:mod:`~dpmf.training.torch.ghost.joint`): what
    this call adds to each parameter's per-example gradient, in a form whose cross terms with another
    call's can be taken. Needed when a parameter is used by several calls (tied weights, a layer called
    twice); a rule without it is replaced by the fallback for such calls. It may be a function of no
    argument, formed when first read (only for such calls: a rule whose norms and sums alone come another
    way, e.g. the recurrent rule's kept per-example gradients, then forms no contribution it does not need;
    :attr:`formed_contributions` reads it without forming it)."""

    def __init__(self, sq, weighted_sum: Callable[[Any], dict], contributions: "dict | Callable | None" = None) -> None:
        self._sq = sq
        self.weighted_sum = weighted_sum
        self._contributions = contributions

    @property
    def contributions(self) -> dict | None:
        if callable(self._contributions):
            self._contributions = self._contributions()
        return self._contributions

    @contributions.setter
    def contributions(self, value) -> None:
        self._contributions = value

    @property
    def formed_contributions(self) -> dict | None:
        """:attr:`contributions` if formed (or given as a dict), else None (not formed here)."""
        return None if callable(self._contributions) else self._contributions

    @property
    def lazy(self) -> bool:
        """Whether ``sq`` is still a function, not formed yet."""
        return callable(self._sq) and not isinstance(self._sq, torch.Tensor)

    @property
    def sq(self):
        if self.lazy:
            self._sq = self._sq()
        return self._sq

    @sq.setter
    def sq(self, value) -> None:
        self._sq = value

    def __repr__(self) -> str:
        contributions = "<not formed>" if callable(self._contributions) else repr(self._contributions)
        return f"LayerGradients(sq={'<not formed>' if self.lazy else self._sq!r}, contributions={contributions})"


Rule = Callable[[Any, LayerCall, dict], "LayerGradients | None"]
#: layer type -> rule(module, call, trainable) ; ``trainable`` maps the layer's own parameter names
#: (``weight``, ``bias``) to the parameters that require a gradient
GHOST_RULES: dict = {}
#: ``(predicate(module) -> bool, rule)``: layers found by what they are (e.g. the RMSNorm classes every
#: Hugging Face model defines for itself); the rule must check what the layer computed and return
#: ``None`` (the fallback) when it does not match
GHOST_MATCHERS: list = []


def _qualified(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _rule_name(fn) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _check_layer_types(layer_types: tuple) -> None:
    """At least one layer type, each a ``torch.nn.Module`` subclass or a dotted qualified name."""
    if not layer_types:
        raise InvalidParameterError(
            "register_ghost_rule() needs the layer types the rule is for, e.g. @register_ghost_rule(MyLayer) "
            "or @register_ghost_rule(\"package.module.MyLayer\"); got none"
        )
    for t in layer_types:
        if isinstance(t, type) and issubclass(t, torch.nn.Module):
            continue
        if isinstance(t, str) and _QUALIFIED.fullmatch(t):
            continue
        hint = (" (write @register_ghost_rule(MyLayer) with the layer type, not @register_ghost_rule on the "
                "function)") if callable(t) and not isinstance(t, type) else ""
        raise InvalidParameterError(
            f"register_ghost_rule: layer type {t!r} is not a torch.nn.Module subclass or a qualified class name "
            f"such as 'transformers.pytorch_utils.Conv1D'{hint}"
        )


def _check_rule_signature(fn) -> None:
    """``fn`` is callable as ``fn(module, call, trainable)``."""
    if not callable(fn):
        raise InvalidParameterError(
            f"register_ghost_rule: the rule must be a function rule(module, call, trainable), got {fn!r}"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature: checked at its call
        return
    try:
        signature.bind(None, None, None)
    except TypeError as exc:
        raise InvalidParameterError(
            f"register_ghost_rule: the rule {_rule_name(fn)}{signature} cannot be called as rule(module, call, "
            f"trainable) ({exc})"
        ) from None


def register_ghost_rule(*layer_types) -> Callable[[Rule], Rule]:
    """Decorator: ``@register_ghost_rule(torch.nn.Linear)`` makes the function the rule of those types.

    A type may also be given by its qualified name (``"transformers.pytorch_utils.Conv1D"``), so that a
    rule for another library's layer needs no import of that library. The types and the rule's
    signature ``rule(module, call, trainable)`` are checked here; what the rule returns is checked at
    each call (:func:`apply_rule`), each mistake an :class:`~dpmf.errors.InvalidParameterError`
    naming the rule and the layer."""
    _check_layer_types(layer_types)

    def wrap(fn: Rule) -> Rule:
        _check_rule_signature(fn)
        for t in layer_types:
            GHOST_RULES[t] = fn
        return fn

    return wrap


def _junk(rule, layer: str, what: str) -> InvalidParameterError:
    return InvalidParameterError(
        f"the ghost rule {_rule_name(rule)} returned {what} for layer {layer!r}; a rule returns None (use the "
        "per-example fallback) or LayerGradients(sq=<float tensor of shape (batch,)>, weighted_sum=<f -> "
        "{parameter name: tensor of the parameter's shape}>), e.g. from_contributions(...)"
    )


def _checked_contributions(rule, layer: str, trainable: dict, contributions):
    """``contributions`` if None or a dict over (some of) the trainable names."""
    if contributions is not None and not (isinstance(contributions, dict) and set(contributions) <= set(trainable)):
        raise _junk(rule, layer, f"contributions for {contributions!r}, expected a dict over {sorted(trainable)}")
    return contributions


def _checked_sums(rule, layer: str, trainable: dict, weighted_sum: Callable) -> Callable:
    """``weighted_sum`` whose result is checked: one tensor of the parameter's shape per trainable name."""

    def checked(f):
        sums = weighted_sum(f)
        if not isinstance(sums, dict):
            raise _junk(rule, layer, f"a weighted_sum giving {type(sums).__name__}, not a dict")
        if set(sums) != set(trainable):
            raise _junk(rule, layer, f"a weighted_sum with parameters {sorted(map(str, sums))}, expected "
                                     f"{sorted(trainable)} (the layer's trainable parameters)")
        for name, value in sums.items():
            shape = tuple(trainable[name].shape)
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise _junk(rule, layer, f"a weighted_sum whose {name!r} is {got}, expected a tensor of shape {shape}")
        return sums

    return checked


def _checked_sq(rule, layer: str, batch: int, sq, call: LayerCall | None = None):
    """``sq`` if it is a real floating tensor of shape ``(batch,)``; else the rule's mistake, named.

    With ``call`` (a rule not dpmf's own) also its values: a negative squared norm would lower the
    example's total norm below the truth and clip it too little (a privacy failure, not a numerical
    one), and a non-finite one where the call's own input and output gradient are finite is the
    rule's, not the data's (which the clipper's non-finite check would blame)."""
    if not isinstance(sq, torch.Tensor) or tuple(sq.shape) != (batch,) or not sq.is_floating_point():
        got = (f"a {sq.dtype} tensor of shape {tuple(sq.shape)}" if isinstance(sq, torch.Tensor)
               else type(sq).__name__)
        raise _junk(rule, layer, f"sq = {got} (batch {batch})")
    if call is not None and batch:
        low = sq.detach().min()
        if bool(low < 0):
            raise _junk(rule, layer, f"a negative squared norm (sq min {float(low):.3g}; sq bounds ||g_i||^2 >= 0)")
        if not bool(torch.isfinite(sq).all()) and all(
                bool(torch.isfinite(t).all()) for t in (call.input, call.grad_output) if isinstance(t, torch.Tensor)):
            raise _junk(rule, layer, "a non-finite squared norm from a finite input and output gradient")
    return sq


def apply_rule(rule: Rule, module, call: LayerCall, trainable: dict, layer: str) -> "LayerGradients | None":
    """``rule(module, call, trainable)`` with its result checked: ``None`` or a :class:`LayerGradients`
    whose ``sq`` is a real tensor of shape ``(call.batch,)`` and whose ``weighted_sum`` gives one
    tensor of each trainable parameter's shape (checked when called, for a rule not dpmf's own). An
    exception inside a rule that is not dpmf's own is one :class:`~dpmf.errors.InvalidParameterError`
    naming the rule and ``layer``."""
    try:
        out = rule(module, call, trainable)
    except DPMFError:
        raise
    except Exception as exc:
        if getattr(rule, "__module__", "").startswith("dpmf."):
            raise
        raise InvalidParameterError(
            f"the ghost rule {_rule_name(rule)} failed on layer {layer!r} ({type(module).__name__}): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if out is None:
        return None
    if not isinstance(out, LayerGradients):
        raise _junk(rule, layer, f"a {type(out).__name__}")
    user = None if getattr(rule, "__module__", "").startswith("dpmf.") else call  # dpmf's rules: proved >= 0
    if out.lazy:  # checked when formed
        form = out._sq
        out.sq = lambda: _checked_sq(rule, layer, call.batch, form(), user)
    else:
        _checked_sq(rule, layer, call.batch, out.sq, user)
    if not callable(out.weighted_sum):
        raise _junk(rule, layer, f"a weighted_sum that is not callable ({type(out.weighted_sum).__name__})")
    if callable(out._contributions):  # checked when formed
        make = out._contributions
        out.contributions = lambda: _checked_contributions(rule, layer, trainable, make())
    else:
        _checked_contributions(rule, layer, trainable, out.contributions)
    if user is not None:  # (dpmf's rules give their parameters' shapes: tests/training/torch, 36 checks a ViT step)
        out.weighted_sum = _checked_sums(rule, layer, trainable, out.weighted_sum)
    return out


def rule_for(module) -> Rule | None:
    """The rule of ``module``'s type (or qualified name), of a parent type whose ``forward`` it keeps, of
    a matcher that recognizes it, or ``None``."""
    for cls in type(module).__mro__:
        rule = GHOST_RULES.get(cls) or GHOST_RULES.get(_qualified(cls))
        if rule is not None:
            return rule if type(module).forward is cls.forward else None
    for matches, rule in GHOST_MATCHERS:
        if matches(module):
            return rule
    return None


#: layer type -> ``batch_of(module, args, kwargs, name=..., model_batch=...)``: the number of examples of
#: a call of a layer whose main input is not batch-first (a recurrent layer with ``batch_first=False``);
#: it may raise a clear error, naming the layer ``name``, for an input it cannot take (a
#: ``PackedSequence``, a layout the model's batch of ``model_batch`` examples, or None, makes ambiguous).
#: Layers not listed: dim 0 of the first tensor.
CALL_BATCH: dict[type, Callable] = {}


def call_batch(module, args, kwargs, default: int, *, name: str = "", model_batch: int | None = None) -> int:
    """The number of examples of one call of ``module`` (``default`` unless its type registered a
    ``batch_of`` in :data:`CALL_BATCH`)."""
    fn = CALL_BATCH.get(type(module)) if rule_for(module) is not None else None
    return default if fn is None else fn(module, args, kwargs, name=name, model_batch=model_batch)
