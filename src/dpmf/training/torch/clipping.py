"""The clipper contract (:class:`Clipper`), and the joint L2 clipping factors and their rounding
shared by every per-example gradient mode.

A *clipper* turns a batch into ``sum_i f_i g_i`` (the clipped per-example gradients' sum) and the
unclipped norms ``n_i``. :class:`Clipper` is all that :class:`~dpmf.training.torch.optimizer.DPOptimizer`
and :func:`~dpmf.training.torch.make_private` use of one; the two implementations,
:class:`~dpmf.training.torch.grad_sample.PerExampleClipper` (``"functorch"``, ``"opacus"``) and
:class:`~dpmf.training.torch.ghost.GhostClipper` (``"ghost"``), subclass it explicitly.

``f_i = min(1, C (1 - margin) / n_i)`` (1 for ``n_i = 0``, 0 for a non-finite ``n_i``), computed in
float64 and cast to the parameter dtype rounding toward zero. ``margin = max(8 eps(dtype), 2**-40)``
absorbs the float64 norm error and the rounding of the products ``f_i g_{i,j}``, so every clipped
per-example gradient has norm ``<= C`` for the computed numbers (the argument is in
:mod:`dpmf.training.torch.grad_sample`; ghost mode adds its own explicit error terms to ``n_i``,
:mod:`dpmf.training.torch.ghost.sequence`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol, Sequence

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError
from dpmf.training.torch._deps import require_torch

torch = require_torch()

__all__ = ["Clipper", "ClippedGradients", "clip_factors", "clip_margin", "toward_zero", "check_weights", "ClipperSetup", "setup_clipper",
           "check_nonfinite", "NONFINITE", "check_scalar_loss"]

class ClippedGradients(NamedTuple):
    """``grads[p]``: the clipped sum ``S_p`` (shape and dtype of parameter ``p``, in
    ``Clipper.param_names`` order); ``norms``: the unclipped ``n_i`` (float64, shape ``(B,)``)."""

    grads: list
    norms: Any


class Clipper(Protocol):
    """What a clipper provides to the optimizer and to ``make_private`` (module docstring).

    Two forms of use: :meth:`clipped_sum` runs the forward and backward of a batch itself; a clipper
    with ``loop_form = True`` also takes the user's loop (``loss.backward()`` then
    ``optimizer.step()``): its backwards form clipped sums that :meth:`collect` returns. A clipper
    without the loop form returns nothing from :meth:`collect` and never has anything :meth:`pending`.
    """

    #: ``"ghost"``, ``"functorch"`` or ``"opacus"`` (recorded in the report and compared across ranks)
    mode: str
    #: whether the loop's ``loss.backward()`` forms clipped sums (:meth:`collect`)
    loop_form: ClassVar[bool]
    #: the trainable parameters, in ``named_parameters()`` order, and their names
    params: list
    param_names: list
    #: ``"mean"`` or ``"sum"``: how the batch loss reduces the per-example losses
    loss_reduction: str
    #: examples dropped for a non-finite gradient (``nonfinite="skip"``)
    skipped_nonfinite: int
    #: hook handles :func:`~dpmf.training.torch.losses.guard_model_loss` attached for this clipper
    loss_guard: list

    def clipped_sum(self, inputs, targets=None, weights=None) -> ClippedGradients:
        """The clipped sum and the unclipped norms of a batch (optional per-example ``weights`` in
        ``[0, 1]`` multiply the clip factors)."""
        ...

    def collect(self) -> tuple[list | None, Any, int]:
        """``(sums, norms, backwards)`` formed by the loop's backwards since the last call (``sums`` is
        None and ``backwards`` 0 when none ran)."""
        ...

    def pending(self) -> bool:
        """Whether a loop backward formed sums that :meth:`collect` has not taken yet."""
        ...

    def forwards_waiting(self) -> list:
        """Names of the layers whose captured forward has not seen its backward yet."""
        ...

    def discard(self) -> None:
        """Forget whatever was captured or formed for the current step (``zero_grad``)."""
        ...

    def close(self) -> None:
        """Remove every hook this clipper attached to the module."""
        ...

    def diagnostics(self) -> dict:
        """What the training report records about this clipper beyond its mode (may be empty)."""
        ...


#: what a clipper does with an example whose gradient is NaN/inf: raise (default), or drop it (count it)
NONFINITE = ("raise", "skip")


def clip_margin(dtypes: Sequence) -> float:
    """Relative margin ``max(8 eps, 2**-40)`` over the given parameter dtypes (the largest eps)."""
    eps = max((torch.finfo(d).eps for d in dtypes), default=torch.finfo(torch.float32).eps)
    return max(8.0 * eps, 2.0**-40)


def clip_factors(norms, max_grad_norm: float, margin: float):
    """``f_i = min(1, C (1 - margin) / n_i)`` in float64; 1 for ``n_i = 0``; 0 for inf/NaN ``n_i``.

    >>> clip_factors(torch.tensor([0.0, 0.5, 4.0, float("inf")]), 2.0, 0.0).tolist()
    [1.0, 1.0, 0.5, 0.0]
    """
    norms = norms.to(torch.float64)
    f = torch.clamp(max_grad_norm * (1.0 - margin) / norms, max=1.0)  # n = 0 -> inf -> 1
    return torch.where(torch.isfinite(norms), f, torch.zeros_like(f))


def toward_zero(f64, dtype):
    """``f64`` cast to ``dtype`` rounding toward zero (never up), so scaling never exceeds the bound."""
    f = f64.to(dtype)
    if dtype == torch.float64:
        return f
    too_big = f.to(torch.float64) > f64
    return torch.where(too_big, torch.nextafter(f, torch.zeros_like(f)), f)


def check_weights(weights, batch: int):
    """``weights`` as a float64 tensor of shape ``(batch,)`` with entries in ``[0, 1]``."""
    try:
        w = torch.as_tensor(weights, dtype=torch.float64).detach().cpu()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InvalidParameterError(f"weights must be a 1-d tensor of {batch} numbers in [0, 1]") from exc
    if w.shape != (batch,):
        raise InvalidParameterError(f"weights must have one entry per example, shape ({batch},), got {tuple(w.shape)}")
    if batch and not (bool(torch.isfinite(w).all()) and float(w.min()) >= 0.0 and float(w.max()) <= 1.0):
        raise InvalidParameterError(f"weights must be finite numbers in [0, 1], got min {float(w.min())!r}, "
                                    f"max {float(w.max())!r}")
    return w


@dataclass
class ClipperSetup:
    """What every clipper holds: the checked arguments and the trainable parameters (in
    ``named_parameters()`` order), their clip margin and the module's BatchNorm layers."""

    max_grad_norm: float
    chunk_size: int | None
    param_names: list
    params: list
    margin: float
    batchnorms: list
    nonfinite: str


def setup_clipper(module, loss_fn, max_grad_norm, chunk_size, loss_reduction, nonfinite, *,
                  loss_fn_optional: bool) -> ClipperSetup:
    """Validate a clipper's common arguments (clear errors) and collect its trainable parameters."""
    if not isinstance(module, torch.nn.Module):
        raise InvalidParameterError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not (callable(loss_fn) or (loss_fn is None and loss_fn_optional)):
        raise InvalidParameterError(f"loss_fn must be callable{' or None' if loss_fn_optional else ''}, got {loss_fn!r}")
    if loss_reduction not in ("mean", "sum"):
        raise InvalidParameterError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
    if nonfinite not in NONFINITE:
        raise InvalidParameterError(f"nonfinite must be one of {NONFINITE}, got {nonfinite!r}")
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise InvalidParameterError("module has no trainable parameter (requires_grad=True)")
    params: list[Any] = [p for _, p in named]
    return ClipperSetup(
        max_grad_norm=_v.positive("max_grad_norm", max_grad_norm),
        chunk_size=None if chunk_size is None else _v.positive_int("chunk_size", chunk_size),
        param_names=[n for n, _ in named],
        params=params,
        margin=clip_margin([p.dtype for p in params]),
        batchnorms=[m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)],
        nonfinite=nonfinite,
    )


def check_nonfinite(bad, policy: str) -> int:
    """For a boolean mask of examples whose gradient norm is NaN/inf: raise under ``"raise"``, else
    return how many are skipped (they contribute 0)."""
    count = int(bad.sum())
    if count and policy == "raise":
        from dpmf.errors import NumericalError

        raise NumericalError(
            f"{count} of {bad.shape[0]} examples have a non-finite gradient (NaN or inf in the inputs, the loss or "
            "the model): dpmf refuses to train on noise alone; clean the data or lower the learning rate, or pass "
            "nonfinite='skip' to drop such examples (counted in the report's diagnostics)"
        )
    return count


def check_scalar_loss(loss):
    """``loss`` if it is a scalar tensor (a batch loss reduced by a sum or a mean), else a clear error."""
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise InvalidParameterError(
            f"the loss must be a scalar tensor (reduced over the batch by a sum or a mean), got {shape}; "
            "a loss with reduction='none' must be reduced (loss.mean() or loss.sum())"
        )
    return loss
