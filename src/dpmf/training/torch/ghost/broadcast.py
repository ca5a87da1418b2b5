"""Ghost norms for learned tensors that the model broadcasts over the batch.

Two kinds of layers give every example the same tensor, built from trainable parameters:

* **Parameters added to activations** -- a layer without a rule that uses its own parameters directly:
  ViT's and DeiT's ``cls_token``, ``distillation_token`` and ``position_embeddings`` (``x + pos``,
  ``cls.expand(B, -1, -1)``), learned biases of any shape, BART's and Whisper's position-embedding
  classes (``Embedding`` subclasses with their own ``forward``). During the layer's forward its
  parameters are replaced by tracked aliases (:mod:`~dpmf.training.torch.ghost.tracking`); example
  ``i``'s gradient of a parameter ``p`` is collected where the model broadcasts it over the batch:
  ``c_i = sum_{places} (d s / d p)^T dL_i / d s``, materialized (``B x p.shape``, a
  :class:`~dpmf.training.torch.ghost.joint.PerExample` contribution), and lookups ``F.embedding(ids, p)``
  in index form (:class:`~dpmf.training.torch.ghost.joint.Factored`, as the Embedding rule, so tied
  word embeddings join the output layer's contribution with exact cross terms). If the layer combines
  a parameter with the examples any other way (``x * w``, ``x @ W``), that call uses the per-example
  fallback, as before (:meth:`ParamCapture.gradients` returns ``None``).
* **Layers shared by the batch without a batch dimension** ("bias tables") -- a layer with a rule
  called on an input without the batch dimension, whose output the model broadcasts over the batch:
  T5's ``relative_attention_bias``, an ``Embedding`` of (query, key) buckets whose output
  ``(q, k, heads)`` becomes ``(1, heads, q, k)`` and is added to every example's attention scores. Its
  output is tracked, per-example output gradients ``G_i = dL_i / d out`` are collected (summed over
  every layer that adds the bias), and the layer's own rule is applied to the call as if it had been
  made on the input expanded to the batch, ``x -> (B, *x.shape)``, with output gradients ``G``: for an
  Embedding, example ``i``'s gradient of table row ``v`` is ``sum_{(q,k): bucket(q,k) = v} G_i[q, k]``,
  the rows read by the positions summed per example -- exact, and joinable with other uses of the
  parameter. A call is taken as such when its main input's dim 0 differs from the model's batch, or
  always for layers named in :data:`BIAS_TABLE_NAMES` (T5-family tables, whose number of query
  positions may equal the batch size). An output that meets the batch in any other way is refused
  (:func:`expanded_call`), naming the layer.

Both check afterwards that the per-example gradients add up to the gradient autograd formed for the
tensor, to within the rounding of that sum, ``|sum_i c_i - g| <= 4 gamma_{B + K + 16} (sum_i |c_i| + |g|)``
elementwise (``K`` places; :func:`~dpmf.training.torch.ghost.sequence.gamma` of the gradient's dtype):
a use that bypassed the tracking (an operation below ``__torch_function__``) would break the sum.
"""

from __future__ import annotations

from dpmf.errors import UnsupportedConfigurationError
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.ghost.joint import Factored, PerExample, joint_sq_norms, joint_weighted_sum, zero_rows
from dpmf.training.torch.ghost.registry import LayerCall, LayerGradients
from dpmf.training.torch.ghost.sequence import F64, gamma, rows_sum_and_abs
from dpmf.training.torch.ghost.tracking import Source, plain, pulling, track, watched_aliases

torch = require_torch()

__all__ = ["BIAS_TABLE_NAMES", "is_bias_table", "ParamCapture", "DirectReads", "OutputCapture", "expanded_call",
           "joined", "pulling", "watch_groups"]

#: attribute names of layers that are always called without a batch dimension (bias tables)
BIAS_TABLE_NAMES = {"relative_attention_bias"}


def is_bias_table(name: str, module) -> bool:
    """A bias table by name: an ``Embedding`` held as one of :data:`BIAS_TABLE_NAMES` (T5, mT5, UMT5,
    LongT5, Switch Transformers, ...)."""
    return isinstance(module, torch.nn.Embedding) and name.rsplit(".", 1)[-1] in BIAS_TABLE_NAMES


def _where_not(bad, t):
    return None if t is None else zero_rows(t, bad)


def _mismatch(parts_sum, parts_abs, total, points: int, batch: int, dtype=None) -> bool:
    """Whether the per-example parts fail to add up to autograd's gradient (module docstring); ``dtype``:
    the precision autograd formed it in, where lower than its own (a product under autocast)."""
    if total is None:
        return parts_sum is not None and bool(parts_sum.ne(0).any())
    tol = 4 * gamma(batch + points + 16, dtype or total.dtype)
    total = total.to(F64)
    if parts_sum is None:
        return bool(total.ne(0).any())
    return bool(((parts_sum - total).abs() > tol * (parts_abs + total.abs())).any())


class ParamCapture:
    """One call's tracked parameters of a layer without a rule (module docstring)."""

    def __init__(self, trainable: dict, batch: int) -> None:
        self.batch = batch
        self.sources = {name: Source(None, batch) for name in trainable}
        self.views = dict(zip(trainable, watched_aliases(trainable.values(), self.sources.values())))

    def swap(self, module) -> dict:
        """Put the tracked aliases into ``module``; returns the parameters to put back."""
        originals = {}
        for name, view in self.views.items():
            originals[name] = module._parameters[name]
            module._parameters[name] = view
        self.views = {}
        return originals

    def release(self) -> None:
        for src in self.sources.values():
            for look in src.lookups:
                look.release()
            src.release()
        self.sources, self.views = {}, {}

    def without_rows(self, bad) -> "ParamCapture":
        out = ParamCapture.__new__(ParamCapture)
        out.batch, out.views, out.sources = self.batch, {}, {}
        for name, src in self.sources.items():
            new = Source(src.root, src.batch)
            # checked on the whole batch already; the total still holds the skipped examples
            new.escaped, new.total, new.points, new.verified = src.escaped, src.total, src.points, True
            new.dense = _where_not(bad, src.dense)
            new.factored = [(ids, _where_not(bad, g), pad) for ids, g, pad in src.factored]
            for look in src.lookups:
                copy = Source(look.root, look.batch, ids=look.ids, padding_idx=look.padding_idx)
                copy.dense = _where_not(bad, look.dense)
                new.lookups.append(copy)
            out.sources[name] = new
        return out

    def gradients(self, trainable: dict) -> LayerGradients | None:
        """The layer's gradients from the collected contributions, or ``None`` (the fallback) where a
        parameter met the batch other than by broadcasting (or its parts do not add up)."""
        contributions = {}
        for name, p in trainable.items():
            src = self.sources.get(name)
            parts = [] if src is None else _parts(src, p)
            if parts is None:
                return None
            contributions[name] = parts or [PerExample(torch.zeros((self.batch, *p.shape), dtype=p.dtype,
                                                                   device=p.device))]
        return joined(contributions, trainable)


def _lookup_part(ids, g, padding, batch: int, p):
    """The index-form contribution of a lookup into ``p``: ids per example, or example-free ids."""
    rows, d = p.shape[0], p.shape[-1]
    idx = ids.reshape(batch, -1) if ids.ndim >= 1 and ids.shape[0] == batch and g.shape[:ids.ndim] == ids.shape \
        else ids.reshape(1, -1).expand(batch, -1)
    G = g.reshape(batch, -1, d)
    keep = None if padding is None else idx != padding
    return Factored(idx, G, rows=rows, keep=keep, work=torch.promote_types(p.dtype, torch.float32))


def _batch_sums(part, p):
    """``(sum_i c_i, sum_i |c_i|)`` of one contribution, float64 of ``p``'s shape (for a dense factored
    one, ``sum_{i,t} |u_{i,t}| |v_{i,t}|^T``, which bounds the second elementwise)."""
    if isinstance(part, PerExample):
        return rows_sum_and_abs(part.grads)
    if not part.index:
        U, V = part.U.reshape(-1, part.R).to(F64), part.V.reshape(-1, part.C).to(F64)
        return (U.T @ V).reshape(p.shape), (U.abs().T @ V.abs()).reshape(p.shape)
    idx, V = part.U.reshape(-1), part.V.reshape(-1, part.C).to(F64)
    if part.keep is not None:
        keep = part.keep.reshape(-1)
        idx, V = idx[keep], V[keep]
    z = torch.zeros(part.R, part.C, dtype=F64, device=V.device)
    return (z.index_add(0, idx, V).reshape(p.shape), z.index_add(0, idx, V.abs()).reshape(p.shape))


def _parts(src: Source, p) -> list | None:
    if src.escaped is not None or any(look.escaped is not None for look in src.lookups):
        return None
    B = src.batch
    parts = [] if src.dense is None else [PerExample(src.dense)]
    parts += [_lookup_part(ids, g, pad, B, p) for ids, g, pad in src.factored]
    parts += [_lookup_part(look.ids, look.dense, look.padding_idx, B, p) for look in src.lookups
              if look.dense is not None]
    work = torch.promote_types(p.dtype, torch.float32)
    parts += [Factored(U, V, work=work) for U, V, _ in src.products]
    dtypes = [d for _, _, d in src.products] + ([src.total.dtype] if src.total is not None else [])
    coarsest = max(dtypes, key=lambda d: torch.finfo(d).eps) if dtypes else None
    total, absolute = None, None
    for part in parts:
        s, a = _batch_sums(part, p)
        total, absolute = (s, a) if total is None else (total + s, absolute + a)
    points = (src.points + len(src.factored) + sum(look.points for look in src.lookups)
              + sum(U.shape[0] * U.shape[1] for U, _, _ in src.products))  # a product sums B T terms
    return None if not src.verified and _mismatch(total, absolute, src.total, points, B, coarsest) else parts


def joined(contributions: dict, trainable: dict) -> LayerGradients:
    """:class:`~dpmf.training.torch.ghost.registry.LayerGradients` of parameters with a *list* of
    contributions each (their sum is the per-example gradient; cross terms exact)."""
    sq = None
    for parts in contributions.values():
        x = joint_sq_norms(parts)
        sq = x if sq is None else sq + x

    def weighted_sum(f):
        return {name: joint_weighted_sum(parts, f, trainable[name]) for name, parts in contributions.items()}

    return LayerGradients(sq, weighted_sum, contributions=dict(contributions))


class DirectReads:
    """The parameters of layers *with* a rule that the forward reads directly, outside the layer's own
    calls (``h @ embed.weight.t()``, ``F.linear(h, lin.weight)``, ``F.embedding(ids, lin.weight)``).

    For the model's whole forward, each such parameter ``W`` is replaced in its layers by a tracked
    alias (a *parameter source*, :attr:`~dpmf.training.torch.ghost.tracking.Source.param`); the layers'
    own calls get ``W`` back (the clipper's pre-hook), so only the direct reads see the alias. Their uses
    are followed (:mod:`~dpmf.training.torch.ghost.tracking`): products ``x @ W``, ``x @ W^T``,
    ``F.linear(x, W)`` and lookups with per-example rows in factored form, broadcasts over the batch
    pulled back per example; the clipper joins these contributions with the rule's (cross terms exact,
    as for tied weights). :meth:`parts` says why not where a use was not followed, and checks that the
    contributions add up to the gradient autograd formed through the alias (the ``_mismatch`` bound).

    An alias is installed before the forward (:meth:`install_all`) or on the parameter's first read
    (:meth:`watch`: the layers' ``_parameters`` replaced for the forward by a mapping that installs it when
    the parameter itself is read -- by attribute, ``[]``, ``get``, ``items``, ``values`` --, so a forward
    that reads few parameters directly forms few aliases; ~70 of them a step in a ViT that reads none,
    issue 52). A read that bypasses both (a raw copy of the mapping, a reference the layer does not hold)
    reaches the parameter itself: the clipper refuses that gradient where its layers run on detached
    copies, which is where it watches (``GhostClipper._check_unfollowed``)."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.sources: dict = {}  # parameter position -> Source
        self._installed: list = []
        self._watched: list = []  # (module, its own _parameters) while a _ReadWatch stands in for it

    def install(self, k: int, param, places: list) -> None:
        """One alias of ``param`` in ``module._parameters[name]`` for every ``(module, name)`` of ``places``
        (over what is there: another clipper's alias is followed through this one)."""
        self.install_all([(k, param, places)])

    def install_all(self, entries: list) -> None:
        """:meth:`install` of every ``(k, param, places)`` of ``entries``, the aliases formed in one pass."""
        sources = [Source(None, self.batch, param=param) for _, param, _ in entries]
        roots = watched_aliases([_raw(*places[0]) for _, _, places in entries], sources)
        for (k, _, places), src, root in zip(entries, sources, roots):
            for module, n in places:
                self._installed.append((module, n, _raw(module, n)))
                module._parameters[n] = root
            self.sources[k] = src

    def watch(self, groups: list) -> None:
        """:meth:`install` of each ``(k, param, places)`` entry when ``param`` itself is first read from one of
        its ``places`` (class docstring); :meth:`unwatch` ends it. ``groups``: :func:`watch_groups` of the
        entries."""
        for module, names in groups:
            own = module.__dict__["_parameters"]
            stand_in = _ReadWatch(own)
            stand_in._reads, stand_in._names = self, names
            module.__dict__["_parameters"] = stand_in
            self._watched.append((module, own))

    def unwatch(self) -> None:
        """Each layer's own ``_parameters`` back, holding what the stand-in holds (what was set or removed in it
        meanwhile; the aliases are gone once :meth:`uninstall` put back what they replaced)."""
        for module, own in self._watched:
            stand_in = module.__dict__["_parameters"]
            if isinstance(stand_in, _ReadWatch):
                own.clear()
                own.update(dict.items(stand_in))
            module.__dict__["_parameters"] = own
        self._watched = []

    def _first_read(self, entry):
        """The alias of ``entry``'s parameter, installed in all its places now (:meth:`watch`)."""
        k, param, places = entry
        if k not in self.sources:  # (a place holding its layer's detached copy, mid-call, keeps it)
            self.install_all([(k, param, [(m, n) for m, n in places if _raw(m, n) is param])])
        return self.sources[k].root

    def uninstall(self) -> None:
        """Put back what :meth:`install` replaced (last first)."""
        for module, n, previous in reversed(self._installed):
            module._parameters[n] = previous
        self._installed = []

    def used(self) -> list:
        """Positions of the parameters whose alias reached the loss (or recorded a use)."""
        return [k for k, s in self.sources.items()
                if s.total is not None or s.dense is not None or s.factored or s.products or s.lookups]

    def parts(self, k: int, p) -> tuple:
        """``(contributions, None)`` of parameter ``k``'s direct reads, or ``([], why)`` where they are not
        known per example."""
        src = self.sources[k]
        why = src.escaped or next((look.escaped for look in src.lookups if look.escaped is not None), None)
        if why is not None:
            return [], why
        parts = _parts(src, p)
        if parts is None:
            return [], "an operation dpmf cannot follow (its per-example parts do not add up to the gradient)"
        return parts, None

    def release(self) -> None:
        self.uninstall()
        self.unwatch()
        for src in self.sources.values():
            for look in src.lookups:
                look.release()
            src.release()
        self.sources = {}


def watch_groups(entries: list) -> list:
    """``[(module, {name: entry})]``: the ``(k, param, places)`` entries of :meth:`DirectReads.watch` by layer."""
    by_module: dict = {}
    for entry in entries:
        for module, n in entry[2]:
            by_module.setdefault(id(module), (module, {}))[1][n] = entry
    return list(by_module.values())


def _raw(module, name: str):
    """What ``module._parameters`` holds under ``name``, read without a :class:`_ReadWatch`'s alias."""
    return dict.__getitem__(module._parameters, name)


class _ReadWatch(dict):
    """A rule layer's ``_parameters`` during one forward (:meth:`DirectReads.watch`): the same entries; a
    read of a watched parameter while the parameter itself is there (not the detached copy of its layer's
    own call) installs its alias first and returns it."""

    __slots__ = ("_reads", "_names")  # the DirectReads; name -> (k, param, places)

    def __getitem__(self, name):
        value = dict.__getitem__(self, name)
        entry = self._names.get(name)
        if entry is not None and value is entry[1]:
            return self._reads._first_read(entry)
        return value

    def get(self, name, default=None):
        return self[name] if dict.__contains__(self, name) else default

    def items(self):
        return [(n, self[n]) for n in dict.keys(self)]

    def values(self):
        return [self[n] for n in dict.keys(self)]

    def __reduce_ex__(self, protocol):  # (a copy or pickle taken during the forward is a plain dict)
        return dict, (dict(dict.items(self)),)


class OutputCapture:
    """The tracked outputs of one call of a layer with a rule made without a batch dimension."""

    def __init__(self, sources: list) -> None:
        self.sources = sources  # one per output (None: an output that needs no gradient)

    @staticmethod
    def trackable(output) -> bool:
        """A single float output that needs a gradient (what :meth:`track_outputs` takes)."""
        return isinstance(output, torch.Tensor) and output.requires_grad and output.is_floating_point()

    @classmethod
    def track_outputs(cls, output, batch: int):
        """``(output tracked, capture)`` for a :meth:`trackable` output."""
        src = Source(None, batch)
        src.root = track(output, [src])
        return src.root, cls([src])

    def release(self) -> None:
        for src in self.sources:
            if src is not None:
                src.release()

    def without_rows(self, bad) -> "OutputCapture":
        copies = []
        for src in self.sources:
            if src is None:
                copies.append(None)
                continue
            new = Source(src.root, src.batch)
            new.escaped, new.points, new.dense = src.escaped, src.points, _where_not(bad, src.dense)
            new.verified = True  # checked on the whole batch already; the total still holds the skipped examples
            copies.append(new)
        return OutputCapture(copies)


def _refusal(name: str, module, call, why: str) -> UnsupportedConfigurationError:
    x = call.input
    shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
    return UnsupportedConfigurationError(
        f"layer {name!r} ({type(module).__name__}) was called on an input without the batch dimension (shape {shape}; "
        f"the model's batch has {call.batch} examples), and its output {why}: ghost clipping splits a shared output "
        "per example only where the model adds it to per-example tensors by broadcasting (as T5 adds its "
        f"relative position bias) or expands it to the batch. Call the layer on per-example inputs (x.expand("
        f"{call.batch}, ...)), pass batch-first inputs (batch_first=True), or use grad_sample_mode='functorch'"
    )


def expanded_call(name: str, module, call: LayerCall) -> LayerCall:
    """``call`` if it was made with a batch dimension; else the same call as if made on its main input
    expanded to the batch, ``(B, *x.shape)``, with the per-example output gradients collected where the
    model broadcast the output (module docstring). Refuses an output used any other way."""
    capture = call.shared
    if not isinstance(capture, OutputCapture):
        return call
    B = call.batch
    grads = []
    for k, src in enumerate(capture.sources):
        total = call.grads[k] if k < len(call.grads) else None
        if src is None:
            grads.append(None)
            continue
        if src.escaped is not None:
            raise _refusal(name, module, call, f"met the batch in {src.escaped}")
        s = None if src.dense is None else src.dense.to(F64).sum(0)
        a = None if src.dense is None else src.dense.to(F64).abs().sum(0)
        if not src.verified and _mismatch(s, a, total, src.points, B):
            raise _refusal(name, module, call, "reached the loss other than by broadcasting over the batch (or "
                                               "through an operation dpmf cannot follow)")
        grads.append(src.dense)
    with plain():
        x = call.input
        big = x.unsqueeze(0).expand(B, *x.shape)
        args = (big, *call.args[1:]) if call.args else call.args
        kwargs = call.kwargs if call.args else {**call.kwargs, "input": big}
        outputs = [o.detach().unsqueeze(0).expand(B, *o.shape).as_subclass(torch.Tensor) for o in call.outputs]
    return LayerCall(args, kwargs, outputs, grads, B, versions=[])
