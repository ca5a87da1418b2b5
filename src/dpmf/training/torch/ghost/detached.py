"""Parameters that ghost mode detaches in the loop, kept in the graph so that asking autograd for their
gradients is refused with a dpmf error.

Inside the model's forward, layers with built-in rules run on detached copies of their parameters
(:meth:`GhostClipper._detach <dpmf.training.torch.ghost.clipper.GhostClipper>`), so the loop's
``loss.backward()`` forms none of the batch weight gradients that the book-keeping sums replace.
Without more, those parameters are not in the graph at all: ``torch.autograd.grad(loss,
model.parameters())`` fails with torch's "One of the differentiated Tensors appears to not have been
used in the graph", and with ``allow_unused=True`` it returns ``None`` for them (or, for a parameter
also read directly, only the direct read's part) -- gradients silently missing.

The link (no tensor operation, the same numbers): one node per forward, ``token = Gate(sentinel,
*parameters)`` (a 0-dim tensor), and each detached layer's output passed through ``Link(output,
token)``, an alias of ``output`` whose backward passes the gradient on unchanged and gives the token
none. Which nodes the engine runs then tells the two uses apart:

* ``loss.backward()`` (every leaf accumulates): the engine runs every node of the graph, Gate last;
  it returns no gradient, so ``.grad`` stays ``None`` as before. (Hooks registered on those
  parameters, ``register_hook`` / ``register_post_accumulate_grad_hook``, are therefore called, with
  ``None`` / ``.grad`` None: no gradient was formed.)
* ``torch.autograd.grad(loss, inputs)`` / ``backward(inputs=...)``: the engine runs only the nodes
  that lead to ``inputs``; Gate runs exactly when one of the detached parameters is among them, and
  refuses, saying what to do (``with clipper.plain():``). Gradients with respect to the model's input
  or any other tensor do not reach Gate and are unaffected.

Gate tells the two apart by ``torch._C._will_engine_execute_node`` on the sentinel's gradient
accumulator (the sentinel is a leaf no one asks for): ``True`` when the engine runs every node,
``False`` when it runs only what requested inputs need. Cost: one ``autograd.Function`` call per
detached layer call and one Gate per forward (microseconds of Python each).
"""

from __future__ import annotations

from typing import Callable

from dpmf.training.torch._deps import require_torch

torch = require_torch()

__all__ = ["DetachedParameters", "capture_grad"]

class _Gate(torch.autograd.Function):
    """``(guard, sentinel, *parameters) -> 0-dim token``; its backward refuses unless every node runs."""

    @staticmethod
    def forward(guard, sentinel, *params):
        return sentinel.new_zeros(())

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)
        ctx.guard, ctx.n = inputs[0], len(inputs) - 1

    @staticmethod
    def backward(ctx, _):
        if not torch._C._will_engine_execute_node(ctx.guard.sentinel_node):
            ctx.guard.refuse()
        return (None,) * (1 + ctx.n)


class _Link(torch.autograd.Function):
    """``(output, token) -> output`` (an alias, not a view: in-place use stays as on ``output``);
    the gradient passes through, none to the token."""

    generate_vmap_rule = True

    @staticmethod
    def forward(output, token):
        return output.detach()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        sink = ctx.__dict__.get("sink")
        if sink is not None:
            sink(grad)
        return grad, None


#: ``Function.apply`` without its per-call ``inspect.signature`` binding of ``forward``'s arguments (15 us a call,
#: once per detached layer call: 0.5 ms of a 45 ms ViT step; issue 52): the engine's own ``apply``, after the
#: same unwrapping of dead functorch wrappers ``Function.apply`` does; inside functorch transforms, ``apply``
_LINK_APPLY = super(torch.autograd.Function, _Link).apply
_UNWRAP_DEAD = torch._functorch.utils.unwrap_dead_wrappers


def _link(output, token):
    if torch._C._are_functorch_transforms_active():
        return _Link.apply(output, token)
    return _LINK_APPLY(*_UNWRAP_DEAD((output, token)))


#: the same for Gate, once per forward with every detached parameter as an input (~70 in a ViT: 62 -> 26 us warm,
#: ~0.35 ms a step in the forward's cold caches before; issue 52)
_GATE_APPLY = super(torch.autograd.Function, _Gate).apply


def _gate(guard, sentinel, params):
    if torch._C._are_functorch_transforms_active():
        return _Gate.apply(guard, sentinel, *params)
    return _GATE_APPLY(*_UNWRAP_DEAD((guard, sentinel, *params)))


def capture_grad(output, sink: Callable) -> bool:
    """``sink(gradient of output)`` called by ``output``'s link node in the backward, in place of a tensor
    hook on ``output`` (``register_hook``: ~10 us a layer call in the forward; issue 52). The node receives
    exactly what a hook on ``output`` would: the gradient with respect to the link's output, after the
    engine summed its uses and before any later in-place change of ``output`` (a hook registered before
    the change sees the same). ``False`` (nothing done) unless ``output`` is a link's own output whose node
    has no sink yet: the caller then registers the hook."""
    node = output.grad_fn
    if type(node) is not _LINK_NODE or "sink" in node.__dict__:
        return False
    node.sink = sink
    return True


_LINK_NODE = _Link._backward_cls


class DetachedParameters:
    """The link of the module docstring for ``params``; ``on_refused()`` forgets the clipper's captures
    of the refused backward (its end never runs) and ``layers`` names them in the error."""

    def __init__(self, params, layers, on_refused: Callable[[], None]) -> None:
        self.params, self.layers, self._on_refused = tuple(params), list(layers), on_refused
        self._sentinel = torch.zeros((), requires_grad=True)
        self._token = None

    @property
    def sentinel_node(self):
        """The sentinel's gradient accumulator, found when asked (not stored: a stored autograd node
        cannot be deep-copied, and ``copy.deepcopy(model)`` of a private model must work). While a
        graph holds Gate, that graph holds the accumulator, so torch returns this very node."""
        with torch.enable_grad():  # (asked inside a backward, where grad mode is off)
            return self._sentinel.view_as(self._sentinel).grad_fn.next_functions[0][0]

    def link(self, output):
        """``output`` (a detached layer's, floating) joined to this forward's token."""
        if self._token is None:
            self._token = _gate(self, self._sentinel, self.params)
        return _link(output, self._token)

    def forward_done(self) -> None:
        self._token = None

    def refuse(self):
        from dpmf.errors import UnsupportedConfigurationError

        self._on_refused()
        names = ", ".join(repr(n) for n in self.layers[:4]) + (", ..." if len(self.layers) > 4 else "")
        raise UnsupportedConfigurationError(
            "torch.autograd.grad (or backward(inputs=...)) asked for gradients of parameters of layers that "
            f"ghost mode runs on detached copies inside the model's forward ({names}): the loop's backward "
            "does not form their batch gradients (optimizer.step() forms the clipped, noised sums instead), "
            "so torch would report them unused or None. For ordinary gradients run the forward inside "
            "`with optimizer.clipper.plain():`; this step's captures were dropped (run the forward again "
            "before loss.backward())"
        )
