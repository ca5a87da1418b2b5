"""Per-example gradients and joint L2 clipping: the clipped gradient sum of one batch.

For a batch of examples ``(x_i, y_i)``, ``i = 0..B-1``, and the trainable parameters
``theta = (theta_1, ..., theta_P)`` of a module,

    g_i = grad_theta loss(module(x_i[None]), y_i[None])          (each example alone, batch of 1)
    n_i = ||g_i||_2 = sqrt(sum_p ||g_{i,p}||_2^2)                 (all parameters jointly, float64)
    f_i = min(1, C (1 - margin) / n_i)        (f_i = 1 if n_i = 0; f_i = 0 if n_i is inf or NaN)
    S_p = sum_i f_i g_{i,p}                                       (the clipped sum, shape of theta_p)

so every clipped per-example gradient ``f_i g_i`` has norm ``<= C`` (``max_grad_norm``): the
sensitivity the mechanism of DESIGN.md assumes (clip norm 1 after dividing by ``C``).

Rounding. ``n_i`` is accumulated in float64 (exact squares of float32 entries, no overflow even
for gradients near the float32 maximum); ``f_i`` is cast to the parameter dtype rounding toward
zero, and ``margin = max(8 eps(dtype), 2**-40)`` (``~9.5e-7`` in float32) absorbs the float64
norm error and the rounding of the products ``f_i g_{i,j}``, so the bound holds for the computed
numbers, not only in exact arithmetic. An example whose gradient is not finite contributes 0
(a valid clipped gradient) with ``nonfinite="skip"``, and raises by default; its returned norm is inf or NaN. The rounding inside the *sum* over
examples is the usual floating-point caveat of DP-SGD and is not modelled.

Modes: ``"functorch"`` (default) is ``torch.func.vmap(torch.func.grad(...))`` over examples, each
unsqueezed to a batch of 1 (the usual ``torch.func`` recipe, so forwards that need a batch
dimension work); ``"opacus"`` uses Opacus' hook-based ``GradSampleModule`` when ``opacus`` is
installed (Opacus' ``grad_sample_mode="hooks"``). ``chunk_size`` bounds memory: per-example
gradients exist for at most ``chunk_size`` examples at a time.

Example (``loss = (w.x - y)^2 / 2`` at ``w = 0`` has per-example gradient ``-y x``):

>>> model = torch.nn.Linear(2, 1, bias=False)
>>> _ = torch.nn.init.zeros_(model.weight)
>>> loss = lambda out, y: 0.5 * ((out[:, 0] - y) ** 2).sum()
>>> clipper = PerExampleClipper(model, loss, max_grad_norm=1.0)
>>> grads, norms = clipper.clipped_sum(torch.tensor([[3.0, 4.0], [0.375, 0.5]]), torch.ones(2))
>>> norms.tolist()  # unclipped ||g_i||
[5.0, 0.625]
>>> [round(v, 5) for v in grads[0].flatten().tolist()]  # -(0.6, 0.8) - (0.375, 0.5)
[-0.975, -1.3]
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.batch import as_args
from dpmf.training.torch.clipping import (
    ClippedGradients,
    Clipper,
    check_nonfinite,
    check_scalar_loss,
    check_weights,
    clip_factors,
    clip_margin,
    setup_clipper,
    toward_zero,
)
from dpmf.training.torch.recurrent import is_plain_recurrent, plain_recurrent

torch = require_torch()

__all__ = ["PerExampleClipper", "ClippedGradients", "clip_factors", "clip_margin"]

MODES = ("functorch", "opacus")
#: parameters with at most this many floats per example get their squared norms in one batched
#: float64 product; larger ones one float64 dot per example (faster than ``vector_norm`` in float64)
_SMALL_ROW = 1 << 14


def _vmap_failure(module, run, exc) -> UnsupportedConfigurationError:
    """A clear error for a model ``torch.func.vmap`` could not differentiate per example, naming the
    layer: the innermost module whose forward was running when a second run (with hooks) failed."""
    stack: list = []
    handles = []
    for name, m in module.named_modules():
        handles.append(m.register_forward_pre_hook(lambda m_, a, name=name: stack.append(name)))
        handles.append(m.register_forward_hook(lambda m_, a, o: stack.pop()))
    try:
        run()
        where = "in the model"  # the failure did not repeat
    except Exception:  # noqa: BLE001 -- only to locate the first failure
        if stack:
            layer = module.get_submodule(stack[-1]) if stack[-1] else module
            where = f"in the forward of layer {stack[-1] or '(the model)'!r} ({type(layer).__name__})"
        else:
            where = "in the backward (a layer whose backward torch.func cannot batch)"
    finally:
        for h in handles:
            h.remove()
    text = str(exc).strip()
    first = text.splitlines()[0].rstrip(".") if text else type(exc).__name__
    return UnsupportedConfigurationError(
        f"per-example gradients with torch.func (grad_sample_mode='functorch') failed {where}: "
        f"{type(exc).__name__}: {first}. Each example runs as a batch of 1 under torch.func.vmap, so every "
        "layer must be written in operations vmap supports (no .item(), no data-dependent Python control "
        "flow, no in-place writes into a tensor created outside); use grad_sample_mode='ghost' (per-layer "
        "rules) or 'opacus', or replace the layer"
    )


class PerExampleClipper(Clipper):
    """Per-example gradients of ``module`` under ``loss_fn``, clipped jointly to ``max_grad_norm``.

    Args:
        module: the model; its trainable parameters (``requires_grad=True``, in
            ``named_parameters()`` order, taken at construction) are differentiated, frozen ones and buffers are used as
            they are. BatchNorm in training mode mixes examples and is refused (use GroupNorm).
        loss_fn: ``loss_fn(output, target) -> scalar``. In ``"functorch"`` mode it sees one
            example as a batch of 1 (so ``reduction`` does not matter); in ``"opacus"`` mode it
            sees the batch, and ``loss_reduction`` must say whether it is a ``"mean"`` or ``"sum"``.
        max_grad_norm: the clip norm ``C > 0``.
        mode: ``"functorch"`` or ``"opacus"`` (needs ``opacus``; the module must be in training
            mode, as in Opacus).
        chunk_size: at most this many per-example gradients in memory at once (None: the batch).
        nonfinite: ``"raise"`` (default: a NaN/inf gradient raises :class:`~dpmf.errors.NumericalError`)
            or ``"skip"`` (such an example contributes 0, counted in :attr:`skipped_nonfinite`).

    ``inputs`` is a tensor or a tuple of tensors (positional arguments of ``forward``), each with
    the examples along dim 0; ``targets`` a tensor with the examples along dim 0, or None (then
    ``loss_fn(output)``). Neither the parameters nor their ``.grad`` are changed; dropout draws
    an independent mask per example (``vmap(randomness="different")``). Opacus mode attaches its
    hooks to ``module`` (enabled only inside a call; :meth:`close` removes them); a module that
    carries full backward hooks (Opacus' included) cannot be used in functorch mode (a torch limit).
    """

    loop_form = False

    def __init__(
        self,
        module,
        loss_fn: Callable,
        max_grad_norm: float,
        *,
        mode: str = "functorch",
        chunk_size: int | None = None,
        loss_reduction: str = "mean",
        nonfinite: str = "raise",
    ) -> None:
        if mode not in MODES:
            raise InvalidParameterError(f"mode must be one of {MODES}, got {mode!r}")
        setup = setup_clipper(module, loss_fn, max_grad_norm, chunk_size, loss_reduction, nonfinite,
                              loss_fn_optional=False)
        self.module, self.loss_fn, self.mode, self.loss_reduction = module, loss_fn, mode, loss_reduction
        self.max_grad_norm, self.chunk_size, self.margin = setup.max_grad_norm, setup.chunk_size, setup.margin
        self.param_names, self.params, self._batchnorms = setup.param_names, setup.params, setup.batchnorms
        self.nonfinite, self.skipped_nonfinite = setup.nonfinite, 0
        self.loss_guard: list = []
        self._whole_batch: int | None = None  # set by clipped_sum around its chunks
        for name, m in module.named_modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse and m.weight.requires_grad:
                raise UnsupportedConfigurationError(
                    f"embedding {name!r} has sparse=True: per-example gradients of a sparse embedding are not "
                    f"supported in mode={mode!r} (torch.func and Opacus need dense gradients); use "
                    "torch.nn.Embedding(..., sparse=False), or grad_sample_mode='ghost' (which covers it; the "
                    "noised gradient is dense either way)"
                )
        self._gsm = self._attach_opacus() if mode == "opacus" else None

    # ------------------------------------------------------------------ public
    def clipped_sum(self, inputs, targets=None, weights=None) -> ClippedGradients:
        """``(S_p for every trainable parameter, unclipped norms n_i)``; see the module docstring.

        ``weights`` (optional, one per example, each in ``[0, 1]``) multiply the clip factors:
        ``S_p = sum_i w_i f_i g_{i,p}``, so each contribution still has norm ``<= w_i C <= C``. A
        weight 0 drops the example's gradient (an individual filter's exhausted examples,
        :mod:`dpmf.training.torch.individual`). A weight may depend on public information and on
        example ``i``'s own past, never on other examples of the batch.
        """
        args, batch = self._check_batch(inputs, targets)
        w_all = None if weights is None else check_weights(weights, batch)
        sums = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self.params]
        norms = []
        for lo in range(0, batch, self.chunk_size or max(batch, 1)):
            hi = min(batch, lo + (self.chunk_size or batch))
            self._whole_batch = batch  # the layout checks see the batch the model was given, not the chunk
            try:
                grads = self.per_example_grads(tuple(a[lo:hi] for a in args), None if targets is None else targets[lo:hi])
            finally:
                self._whole_batch = None
            n = self.norms(grads)
            f = clip_factors(n, self.max_grad_norm, self.margin)
            if w_all is not None:  # w <= 1, so the float64 product never exceeds f
                f = f * w_all[lo:hi].to(device=f.device)
            bad = ~torch.isfinite(n)
            any_bad = bool(bad.any())
            if any_bad:
                self.skipped_nonfinite += check_nonfinite(bad, self.nonfinite)
            for s, g in zip(sums, grads):
                if any_bad:  # 0 * inf would be NaN: drop the example's gradient outright
                    g = torch.where(bad.view(-1, *([1] * (g.ndim - 1))), torch.zeros_like(g), g)
                s.add_(torch.tensordot(toward_zero(f, g.dtype), g, dims=1))
            norms.append(n)
        norms = torch.cat(norms) if norms else torch.zeros(0, dtype=torch.float64, device=self.params[0].device)
        return ClippedGradients(sums, norms)

    def per_example_grads(self, inputs, targets=None) -> list:
        """Unclipped ``g_{i,p}``: one tensor of shape ``(B, *theta_p.shape)`` per trainable parameter."""
        args, batch = self._check_batch(inputs, targets)
        if batch == 0:
            return [torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device) for p in self.params]
        if self._gsm is not None:
            return self._opacus_grads(args, targets, batch)
        return self._functorch_grads(args, targets, self._whole_batch or batch)

    def clipped_per_example(self, inputs, targets=None) -> list:
        """``f_i g_{i,p}`` materialized (for inspection and tests; :meth:`clipped_sum` never builds it)."""
        grads = self.per_example_grads(inputs, targets)
        n = self.norms(grads)
        f = clip_factors(n, self.max_grad_norm, self.margin)
        out = []
        for g in grads:
            scale = toward_zero(f, g.dtype).view(-1, *([1] * (g.ndim - 1)))
            out.append(torch.where(scale == 0, torch.zeros_like(g), g * scale))
        return out

    @staticmethod
    def norms(grads: list):
        """``n_i = sqrt(sum_p ||g_{i,p}||^2)`` accumulated in float64, shape ``(B,)``.

        Small parameters in one batched float64 product, large ones with one float64 dot per example
        (measured ~4-7x faster than ``vector_norm(..., dtype=float64)`` at 1M parameters); the float64
        sum's relative error, about ``d * 1.1e-16``, stays far below the clip margin."""
        batch = grads[0].shape[0]
        sq = torch.zeros(batch, dtype=torch.float64, device=grads[0].device)
        for g in grads:
            if batch and g[0].numel():
                rows = g.reshape(batch, -1)
                if rows.shape[1] <= _SMALL_ROW:  # small parameters: one batched float64 product
                    r = rows.to(torch.float64)
                    sq += (r * r).sum(dim=1)
                    continue
                for i in range(batch):  # one float64 dot per example: exact squares, float64 sums
                    r = rows[i].to(torch.float64)
                    sq[i] += torch.dot(r, r)
        return torch.sqrt(sq)

    # the loop form (loss.backward(), then optimizer.step()) is ghost mode's: nothing is ever captured here
    def collect(self) -> tuple[None, Any, int]:
        """``(None, no norms, 0)``: this clipper has no loop form (:class:`~dpmf.training.torch.clipping.Clipper`)."""
        return None, torch.zeros(0, dtype=torch.float64, device=self.params[0].device), 0

    def pending(self) -> bool:
        return False

    def forwards_waiting(self) -> list:
        return []

    def discard(self) -> None:
        """Nothing to forget: every batch is clipped within :meth:`clipped_sum`."""

    def diagnostics(self) -> dict:
        return {}

    def close(self) -> None:
        """Remove Opacus' hooks and attributes from the module (no-op in functorch mode)."""
        if self._gsm is not None:
            self._gsm.cleanup()
            self._gsm = None

    # ------------------------------------------------------------------ helpers
    def _check_batch(self, inputs, targets) -> tuple[tuple, int]:
        args = as_args(inputs)
        if not args or not all(isinstance(a, torch.Tensor) and a.ndim >= 1 for a in args):
            raise InvalidParameterError("inputs must be a tensor or a tuple of tensors with the examples along dim 0")
        batch = args[0].shape[0]
        leading = [a.shape[0] for a in args]
        if targets is not None:
            if not isinstance(targets, torch.Tensor) or targets.ndim < 1:
                raise InvalidParameterError("targets must be a tensor with the examples along dim 0, or None")
            leading.append(targets.shape[0])
        if any(b != batch for b in leading):
            raise InvalidParameterError(f"inputs and targets must share the batch size along dim 0, got {leading}")
        if any(m.training for m in self._batchnorms):
            raise UnsupportedConfigurationError(
                "BatchNorm in training mode mixes examples, so per-example gradients do not exist; "
                "replace it (e.g. torch.nn.GroupNorm) or put it in eval mode"
            )
        return args, batch

    def _functorch_grads(self, args: tuple, targets, batch: int) -> list:
        func = torch.func
        module, loss_fn, names = self.module, self.loss_fn, self.param_names

        def example_loss(params, example_args, target):
            out = func.functional_call(module, params, tuple(a.unsqueeze(0) for a in example_args))
            return check_scalar_loss(loss_fn(out) if target is None else loss_fn(out, target.unsqueeze(0)))

        params = {n: p.detach() for n, p in zip(names, self.params)}
        in_dims = (None, 0, None if targets is None else 0)
        def run():
            return func.vmap(func.grad(example_loss), in_dims=in_dims, randomness="different")(params, args, targets)

        # fused RNN kernels do not vmap: the same layers in plain operations (their layouts checked for `batch`)
        with plain_recurrent(module, batch):
            try:
                grads = run()
            except (RuntimeError, NotImplementedError) as exc:
                raise _vmap_failure(module, run, exc) from exc
        return [grads[n] for n in names]

    def _attach_opacus(self):
        try:
            from opacus import GradSampleModule
        except ImportError as exc:
            raise UnsupportedConfigurationError(
                "mode='opacus' needs opacus (pip install opacus==1.6.0); mode='functorch' needs nothing more"
            ) from exc
        rnn = [n for n, m in self.module.named_modules() if is_plain_recurrent(m)]
        if rnn:
            raise UnsupportedConfigurationError(
                f"mode='opacus' cannot take torch.nn recurrent layers ({', '.join(repr(n) for n in rnn)}): Opacus' hooks "
                "need its own opacus.layers.DPLSTM/DPGRU/DPRNN; grad_sample_mode='ghost' or 'functorch' take "
                "nn.RNN/GRU/LSTM as they are"
            )
        gsm = GradSampleModule(self.module, batch_first=True, loss_reduction=self.loss_reduction, strict=True)
        gsm.disable_hooks()  # only inside our calls: the user's own forward/backward stay untouched
        return gsm

    def _opacus_grads(self, args: tuple, targets, batch: int) -> list:
        gsm = self._gsm
        if not all(m.training for m in self.module.modules() if any(p.requires_grad for p in m.parameters(False))):
            raise UnsupportedConfigurationError(
                "mode='opacus' computes per-example gradients only for modules in training mode "
                "(Opacus' hooks skip eval mode); call module.train() or use mode='functorch'"
            )
        for p in self.params:
            p.grad_sample = None
        gsm.enable_hooks()
        try:
            with torch.enable_grad(), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Full backward hook is firing")  # inputs need no grad
                out = gsm(*args)
                loss = self.loss_fn(out) if targets is None else self.loss_fn(out, targets)
                torch.autograd.grad(loss, self.params, allow_unused=True)  # .grad stays untouched
            grads = []
            for name, p in zip(self.param_names, self.params):
                gs = p.grad_sample
                if isinstance(gs, list):
                    raise UnsupportedConfigurationError(
                        f"opacus stacked several per-example gradients for {name} (several forwards "
                        "of one module per batch); use mode='functorch'"
                    )
                grads.append(torch.zeros((batch, *p.shape), dtype=p.dtype, device=p.device) if gs is None else gs)
            return grads
        finally:
            gsm.disable_hooks()
            for p in self.params:
                p.grad_sample = None
                p._forward_counter = 0
                if hasattr(p, "_current_grad_sample"):
                    del p._current_grad_sample
            for m in self.module.modules():  # left behind only if the forward or backward failed
                for attr in ("activations", "max_batch_len"):
                    if hasattr(m, attr):
                        delattr(m, attr)
