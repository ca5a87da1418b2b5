"""Tensors without a batch dimension followed through the forward until the model broadcasts them over
the batch (the mechanics behind :mod:`~dpmf.training.torch.ghost.broadcast`).

A *source* is a tensor that depends on trainable parameters but not on the examples: a parameter that
a layer without a rule uses directly (ViT's ``cls_token`` and ``position_embeddings``), or the output
of a layer called on an input without a batch dimension (T5's relative position bias table looked up
with ``(query, key)`` buckets). While the forward runs, the source and every tensor computed from it
and from other example-free tensors are :class:`Tracked` (a ``torch.Tensor`` subclass whose
``__torch_function__`` sees each operation on them; the values and the autograd graph are the plain
ones). At the operation where such a tensor ``s`` (shape ``S``) meets the batch by broadcasting,

* an explicit ``s.expand(B, ...)`` (``expand``, ``expand_as``, ``broadcast_to`` to ``B`` rows), or
* an addition, subtraction or ``torch.where`` with a tensor of ``B`` rows, or the additive
  ``attn_mask`` of ``scaled_dot_product_attention``,

``s`` is replaced by ``s_B``, its broadcast made explicit along dim 0 only (``B`` identical rows; the
value is unchanged), so the gradient that reaches ``s_B`` is per example: row ``i`` is
``dL_i / ds``. A hook on ``s_B`` pulls it back to each source ``r`` that ``s`` was computed from,
per example, through the (example-free) operations in between:
``c_i = (ds/dr)^T dL_i/ds`` (``torch.autograd.grad`` with ``is_grads_batched=True``, inside the
backward, while that part of the graph still exists). Summed over the places where the model
broadcasts it, ``c_i`` is example ``i``'s gradient with respect to the source, exactly.

A lookup ``F.embedding(ids, w)`` of a parameter source ``w`` is kept in index form: with ids of ``B``
rows its output is per example, and example ``i``'s contribution to ``w`` is the lookup's
``sum_t e_{x_{i,t}} g_{i,t}^T`` (a :class:`~dpmf.training.torch.ghost.joint.Factored` contribution,
as the Embedding rule gives); with example-free ids (positions) its output becomes a source of its
own, whose per-example gradients are then scattered into the looked-up rows the same way.

A product of per-example rows ``x`` (``B`` rows) with a *parameter source* (a source that stands for
one parameter ``W``, :attr:`Source.param`: the direct reads of a layer's weight) or its transpose --
``F.linear(x, W)``, ``x @ W``, ``x @ W.t()`` -- is kept in factored form too: example ``i``'s
contribution to ``W`` is ``sum_t u_{i,t} v_{i,t}^T`` with ``(u, v)`` the output gradients and the rows of
``x`` in ``W``'s orientation (:attr:`Source.products`, a dense
:class:`~dpmf.training.torch.ghost.joint.Factored` contribution, as the Linear rule gives).

Anything else that combines a tracked tensor that needs a gradient with a tensor of ``B`` rows (a
``matmul`` with another tracked tensor, a multiplication, a concatenation along dim 0) marks its
sources *escaped* once a gradient reaches its result (one that reaches the loss): their
per-example gradients are not known here (:mod:`~dpmf.training.torch.ghost.broadcast` then uses the
fallback, or refuses). A use that bypasses ``__torch_function__`` is caught afterwards: the
per-example gradients must add up to the gradient autograd formed for the source (to within
rounding), else the source counts as escaped too.

Batch rows are recognized by size: a tensor whose dim 0 equals the model's batch ``B`` is taken as
per example, and a tracked tensor expanded to exactly ``B`` rows along dim 0 as broadcast over the
examples (an example-free tensor that happens to have ``B`` rows along dim 0 and meets the batch is
ambiguous and escapes).
"""

from __future__ import annotations

import functools
import threading
import weakref

from dpmf.training.torch._deps import require_torch

torch = require_torch()

__all__ = ["Tracked", "Source", "track", "watched_aliases", "plain", "pulling", "param_of", "mark_param"]

_pytree = torch.utils._pytree
_Tensor = torch.Tensor
_F = torch.nn.functional

#: operations that broadcast their (first) argument to the shape given: ``s.expand(B, ...)``
_EXPAND = {_Tensor.expand, _Tensor.expand_as, _Tensor.broadcast_to, torch.broadcast_to}
#: elementwise operations through which a tracked argument is added to per-example tensors
_ADDITIVE = {torch.add, torch.sub, torch.subtract, torch.where, _Tensor.add, _Tensor.sub, _Tensor.add_,
             _Tensor.sub_, _Tensor.where, _Tensor.__add__, _Tensor.__radd__, _Tensor.__iadd__, _Tensor.__sub__,
             _Tensor.__rsub__, _Tensor.__isub__}
_SDPA = _F.scaled_dot_product_attention
#: products ``x @ M`` (``matmul``, ``mm``) of per-example rows with a matrix; ``F.linear`` is ``x @ M^T``
_MATMUL = {torch.matmul, _Tensor.matmul, _Tensor.__matmul__, torch.mm, _Tensor.mm}
#: transposes of a matrix (properties arrive as their getters: ``W.T``, ``W.mT``)
_TRANSPOSE = {_Tensor.t, torch.t, _Tensor.transpose, torch.transpose, _Tensor.permute, torch.permute}
_TRANSPOSE_PROPERTIES = (_Tensor.T, _Tensor.mT)

_state = threading.local()  # .pulling: inside a pull-back (a source's own total-gradient hook ignores it)


def pulling() -> bool:
    """Inside a per-example pull-back (hooks on tensors it passes see batched gradients: not the backward's)."""
    return getattr(_state, "pulling", False)


def plain():
    """Inside: operations on :class:`Tracked` tensors run as on plain tensors (no tracking)."""
    return torch._C.DisableTorchFunctionSubclass()


class Source:
    """Where per-example gradients of one tracked origin ``root`` (shape ``S``) collect.

    ``dense``: ``(B, *S)`` per-example gradients (summed over the broadcasts); ``factored``: index-form
    contributions of lookups with per-example ids; ``lookups``: sources made by lookups with example-free
    ids (their gradients belong to this one); ``escaped``: why per-example gradients are not known here
    (``None``: they are); ``total``: the gradient autograd formed for ``root`` (a hook fills it where no
    other record exists); ``parent``: the parameter source a lookup source belongs to; ``param``: the
    parameter a *parameter source* stands for (its aliases, and their transposes, are known by it:
    :func:`param_of`); ``products``: ``(U, V, dtype)`` of its products with per-example rows, in its
    orientation, and the precision the product ran in (autocast's, where it was on)."""

    def __init__(self, root, batch: int, *, parent: "Source | None" = None, ids=None, padding_idx=None,
                 param=None) -> None:
        self.root, self.batch, self.parent, self.param = root, batch, parent, param
        self.ids, self.padding_idx = ids, padding_idx
        self.dense = None
        self.factored: list = []
        self.products: list = []
        self.lookups: list = []
        self.escaped: str | None = None
        self.total = None
        self.points = 0
        self.verified = False  # the parts were checked against the total already

    def watch_total(self) -> None:
        """Record in ``total`` the gradient autograd forms for ``root`` (all its uses together)."""
        ref = weakref.ref(self)
        with plain():
            self.root.register_hook(lambda g: _add_total(ref, g))

    def escape(self, why: str) -> None:
        if self.escaped is None:
            self.escaped = why
        if self.parent is not None:
            self.parent.escape(why)

    def add_dense(self, g) -> None:
        self.points += 1
        self.dense = g if self.dense is None else self.dense + g

    def release(self) -> None:
        """Drop the tensors (the hooks on ``root`` hold this object weakly)."""
        self.root = self.dense = self.total = self.ids = self.param = None
        self.factored, self.lookups, self.products = [], [], []


def _add_total(ref, g) -> None:
    src = ref()
    if src is None or pulling():
        return
    src.total = g if src.total is None else src.total + g


class Tracked(torch.Tensor):
    """A tensor computed from sources without the examples (module docstring); ``_dpmf_sources``."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, spec = _pytree.tree_flatten((args, kwargs))
        with plain():
            sources = _sources_of(flat)
            live = [s for s in sources if s.root is not None]
            grads = [t for t in flat if isinstance(t, Tracked) and t.requires_grad]
            if not live or not grads:
                return _unwrap(func(*args, **kwargs))
            B = live[0].batch
            batch = [t for t in flat if isinstance(t, _Tensor) and not isinstance(t, Tracked) and t.ndim >= 1
                     and t.shape[0] == B]
            if func in _EXPAND and isinstance(args[0], Tracked):
                return _expand_op(func, args, kwargs, live, B)
            if func is _F.embedding:
                bound = {**dict(zip(_EMBEDDING_ARGS, args)), **kwargs}
                plain_lookup = bound.get("max_norm") is None and not bound.get("scale_grad_by_freq")
                return _lookup_op(func, args, kwargs, bound.get("input"), bound.get("weight"),
                                  bound.get("padding_idx") if plain_lookup else False, live, B, bool(batch))
            if func is _Tensor.__getitem__ and _row_index(args):  # w[ids]: a lookup of rows
                return _lookup_op(func, args, kwargs, args[1], args[0], None, live, B, bool(batch))
            if not batch:
                return _transposed(func, args, _track_result(func(*args, **kwargs), live))
            if func in _ADDITIVE or func is _SDPA:
                return _additive_op(func, flat, spec, batch, B)
            if func is _F.linear or func in _MATMUL:
                return _product_op(func, args, kwargs, live, B)
            return _escaping(func(*args, **kwargs), live, _name(func))


def track(tensor, sources: list):
    """``tensor`` as a :class:`Tracked` alias (same values, in the autograd graph) carrying ``sources``
    (and those it carried already: another clipper on the same model tracks it too)."""
    before = tuple(s for s in getattr(tensor, "_dpmf_sources", ()) if s not in sources)
    with plain():
        out = tensor.as_subclass(Tracked)
    out._dpmf_sources = tuple(sources) + before
    return out


def watched_aliases(tensors, sources) -> list:
    """``track(t, [s])`` for each pair of ``tensors`` and ``sources``, with ``s.root`` set to it, its total
    watched (:meth:`Source.watch_total`) and, for a parameter source, marked as an alias of ``s.param``
    (:func:`mark_param`): the direct reads' aliases of a whole forward in one pass (one ``plain()`` for all,
    no closure per alias; ~70 of them a step in a ViT, issue 52)."""
    out = []
    with plain():
        for t, s in zip(tensors, sources):
            before = tuple(x for x in t._dpmf_sources if x is not s) if isinstance(t, Tracked) else ()
            a = t.as_subclass(Tracked)
            a._dpmf_sources = (s,) + before
            if s.param is not None:
                a._dpmf_param, a._dpmf_transposed = s.param, False
            s.root = a
            node = a.grad_fn  # (the alias' own node: a hook on it sees what a tensor hook on ``a`` would)
            if node is None:
                a.register_hook(functools.partial(_add_total, weakref.ref(s)))  # (refused: needs no gradient)
            else:
                node.register_prehook(functools.partial(_add_total_pre, weakref.ref(s)))
            out.append(a)
    return out


def _add_total_pre(ref, grad_outputs) -> None:
    _add_total(ref, grad_outputs[0])


def param_of(t):
    """``(W, transposed)`` when ``t`` is a tracked alias of parameter ``W`` (``transposed=False``) or of its
    transpose (``True``), else ``(None, False)``."""
    if isinstance(t, Tracked) and getattr(t, "_dpmf_param", None) is not None:
        return t._dpmf_param, t._dpmf_transposed
    return None, False


def mark_param(t, param, transposed: bool = False):
    """Mark tracked ``t`` as an alias of ``param`` (or of its transpose): :func:`param_of`."""
    t._dpmf_param, t._dpmf_transposed = param, transposed
    return t


def _is_transpose(func, args) -> bool:
    if getattr(func, "__self__", None) in _TRANSPOSE_PROPERTIES:
        return True
    if func in (_Tensor.t, torch.t):
        return True
    dims = tuple(a for a in args[1:] if isinstance(a, int))
    if func in (_Tensor.permute, torch.permute) and len(args) == 2 and isinstance(args[1], (tuple, list)):
        dims = tuple(args[1])
    return func in _TRANSPOSE and len(dims) == 2 and {d % 2 for d in dims} == {0, 1}


def _transposed(func, args, result):
    """``result`` marked as the transpose of a parameter when ``func`` transposed an alias of one."""
    param, transposed = param_of(args[0]) if args else (None, False)
    if param is not None and isinstance(result, Tracked) and result.ndim == 2 and args[0].ndim == 2 \
            and _is_transpose(func, args):
        mark_param(result, param, not transposed)
    return result


def _name(func) -> str:
    return f"`{getattr(func, '__name__', None) or repr(func)}`"


def _sources_of(flat) -> list:
    seen, out = set(), []
    for t in flat:
        for s in getattr(t, "_dpmf_sources", ()) if isinstance(t, Tracked) else ():
            if id(s) not in seen:
                seen.add(id(s))
                out.append(s)
    return out


def _unwrap(result):
    """Results as plain tensors (a tracked result that needs no gradient needs no tracking)."""
    def one(t):
        return t.as_subclass(torch.Tensor) if isinstance(t, Tracked) else t
    return _pytree.tree_map(one, result)


def _escaping(result, sources, why: str):
    """``result`` of a use that is not split per example: its sources escape once a gradient reaches it
    (a result that no gradient reaches adds nothing to theirs)."""
    result = _unwrap(result)
    refs = [weakref.ref(s) for s in sources]

    def hook(g):
        for ref in refs:
            s = ref()
            if s is not None:
                s.escape(why)

    for t in _pytree.tree_leaves(result):
        if isinstance(t, _Tensor) and t.requires_grad:
            t.register_hook(hook)
    return result


def _track_result(result, sources):
    def one(t):
        if isinstance(t, Tracked):  # an in-place operation returned its tracked input
            t._dpmf_sources = tuple(sources) + tuple(s for s in t._dpmf_sources if s not in sources)
            return t
        return track(t, sources) if isinstance(t, _Tensor) and t.requires_grad else t
    return _pytree.tree_map(one, result)


def _pull_back(s, sources, g) -> None:
    """Per-example gradients ``g`` (``(B, *s.shape)``) of tracked ``s``, added to each of its sources."""
    _state.pulling = True
    try:
        with plain():
            for src in sources:
                if src.root is None:
                    continue
                if s is src.root:
                    src.add_dense(g)
                    continue
                (c,) = torch.autograd.grad(s, src.root, g, retain_graph=True, allow_unused=True,
                                           is_grads_batched=True)
                if c is not None:
                    src.add_dense(c)
    finally:
        _state.pulling = False


def _on_grad(s, sources, shape, reduce_dims):
    """The hook on ``s_B``: its gradient, summed over the dims the operation itself broadcast, is
    ``(B, *shape)`` per-example gradients of ``s``."""

    def hook(g):
        if reduce_dims:
            g = g.sum(reduce_dims, keepdim=True)
        _pull_back(s, sources, g.reshape(g.shape[0], *shape))

    return hook


def _aligned(s, ndim: int):
    """``s``'s shape with leading 1s up to ``ndim`` dims, or ``None`` if dim 0 is not a broadcast one."""
    shape = (1,) * (ndim - s.ndim) + tuple(s.shape)
    return shape if ndim >= s.ndim and shape[0] == 1 else None


def _expand_op(func, args, kwargs, sources, B):
    s = args[0]
    out = func(*args, **kwargs)
    if out.ndim == 0 or out.shape[0] != B:
        return _track_result(out, sources)  # not to the batch: still example-free
    aligned = _aligned(s, out.ndim)
    if aligned is None:  # s had B rows already: ambiguous
        for src in sources:
            src.escape(_name(func))
        return _unwrap(out)
    out = out.as_subclass(torch.Tensor)
    reduce_dims = [d for d in range(1, out.ndim) if aligned[d] == 1 and out.shape[d] != 1]
    out.register_hook(_on_grad(s, s._dpmf_sources, tuple(s.shape), reduce_dims))
    return out


def _broadcast_positions(func, flat, spec):
    """Indices into ``flat`` of the tracked tensors that the operation broadcasts additively."""
    if func is not _SDPA:
        return [k for k, t in enumerate(flat) if isinstance(t, Tracked)]
    args, kwargs = _pytree.tree_unflatten(list(range(len(flat))), spec)
    mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
    return [mask] if isinstance(mask, int) and isinstance(flat[mask], Tracked) else []


def _additive_op(func, flat, spec, batch, B):
    ndim = max(t.ndim for t in batch)
    positions = _broadcast_positions(func, flat, spec)
    flat = list(flat)
    for k, t in enumerate(flat):
        if not isinstance(t, Tracked):
            continue
        aligned = _aligned(t, ndim) if k in positions else None
        if t.requires_grad and aligned is None:
            for s in t._dpmf_sources:
                s.escape(_name(func))
        if t.requires_grad and aligned is not None:
            s_B = t.reshape(aligned).expand(B, *aligned[1:]).as_subclass(torch.Tensor)
            s_B.register_hook(_on_grad(t, t._dpmf_sources, tuple(t.shape), []))
            flat[k] = s_B
        else:
            flat[k] = t.as_subclass(torch.Tensor)
    args, kwargs = _pytree.tree_unflatten(flat, spec)
    return _unwrap(func(*args, **kwargs))


_EMBEDDING_ARGS = ("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse")


def _row_index(args) -> bool:
    """``w[ids]`` with ``w`` a matrix and ``ids`` a tensor of non-negative row numbers."""
    if len(args) != 2 or not isinstance(args[0], Tracked) or args[0].ndim != 2:
        return False
    ids = args[1]
    return (isinstance(ids, _Tensor) and not isinstance(ids, Tracked) and not ids.is_floating_point()
            and ids.dtype != torch.bool and not ids.is_complex() and ids.numel() > 0 and bool(ids.min() >= 0))


def _lookup_op(func, args, kwargs, ids, w, padding, sources, B, batched: bool):
    """A lookup of rows ``ids`` of ``w`` (``F.embedding``, ``w[ids]``; ``padding=False``: one that changes
    the gradient, ``max_norm`` or ``scale_grad_by_freq``). Of a source ``w`` itself: index form (module
    docstring); else as any operation (tracked without per-example ids, escaped with them)."""
    param, transposed = param_of(w)
    owner = [s for s in sources if s.root is w or (param is not None and not transposed and s.param is param)]
    exact = owner and padding is not False and isinstance(ids, _Tensor) and not isinstance(ids, Tracked)
    out = func(*args, **kwargs)
    if not exact:
        if not batched:
            return _track_result(out, sources)
        for s in sources:
            s.escape("a lookup (`embedding` / indexing)")
        return _unwrap(out)
    src = owner[0]
    if padding is not None and padding < 0:
        padding += w.shape[0]
    if not batched:  # positions: the output is a source of its own, scattered into w's rows at the end
        look = Source(None, B, parent=src, ids=ids, padding_idx=padding)
        look.root = track(out, [look])
        src.lookups.append(look)
        return look.root
    out = out.as_subclass(torch.Tensor)
    ref = weakref.ref(src)

    def hook(g):
        s = ref()
        if s is not None and s.root is not None:
            s.factored.append((ids, g, padding))

    out.register_hook(hook)
    return out


def _product_args(func, args, kwargs):
    """``(x, M, bias, linear)`` of ``F.linear(x, M, bias)`` (``x @ M^T + bias``) or ``matmul(x, M)``."""
    if func is _F.linear:
        bound = {**dict(zip(("input", "weight", "bias"), args)), **kwargs}
        return bound.get("input"), bound.get("weight"), bound.get("bias"), True
    bound = {**dict(zip(("input", "other"), args)), **{k: v for k, v in kwargs.items() if k != "out"}}
    return bound.get("input"), bound.get("other", bound.get("mat2")), None, False


def _product_op(func, args, kwargs, sources, B):
    """``F.linear(x, M[, b])`` or ``x @ M`` with ``x`` per-example rows (``(B, ..., k)``) and ``M`` an alias
    of a parameter ``W`` or of its transpose: example ``i``'s contribution to ``W`` recorded in factored
    form (module docstring); a tracked ``b`` is added as a broadcast. Anything else escapes."""
    x, M, bias, linear = _product_args(func, args, kwargs)
    param, transposed = param_of(M)
    ok = (param is not None and M.ndim == 2 and isinstance(x, _Tensor) and not isinstance(x, Tracked)
          and x.ndim >= 2 and x.shape[0] == B and "out" not in kwargs)
    owners = [s for s in sources if ok and s.param is param]
    if not owners or any(s.param is not param for s in _sources_of([M])):
        return _escaping(func(*args, **kwargs), sources, _name(func))
    out = _unwrap(_F.linear(x, M) if linear else func(x, M))
    if out.requires_grad:
        # W-oriented factors: x @ M gives dM_i = sum_t x_t g_t^T, F.linear gives dM_i = sum_t g_t x_t^T
        swap = (not linear) != transposed  # (U, V) = (x, g) when True, else (g, x)
        refs = [weakref.ref(s) for s in owners]
        X, version = x.detach(), x._version
        out.register_hook(_product_hook(refs, X, version, swap, B, out.dtype))
    if bias is None:
        return out
    flat, spec = _pytree.tree_flatten(((out, bias), {}))
    return _additive_op(torch.add, flat, spec, [out], B)


def _product_hook(refs, X, version, swap: bool, B: int, dtype):
    def hook(g):
        if pulling():
            return
        for ref in refs:
            s = ref()
            if s is None or s.root is None:
                continue
            if X._version != version:
                s.escape("an in-place change of the rows multiplied by it")
                continue
            G, A = g.reshape(B, -1, g.shape[-1]), X.reshape(B, -1, X.shape[-1])
            s.products.append((A, G, dtype) if swap else (G, A, dtype))

    return hook
