"""``DPTrainer``: the Hugging Face ``transformers.Trainer`` driven by dpmf's sampler, noise and accountant.

Needs ``transformers`` (``pip install 'dpmf[huggingface]'``); import it from here
(``from dpmf.training.torch.huggingface import DPTrainer``): nothing else in dpmf imports it.

``DPTrainer(model, args, train_dataset=..., strategy=..., sampling=..., target_epsilon=..., delta=...,
max_grad_norm=..., seed=...)`` is a ``Trainer`` whose construction calls
:func:`~dpmf.training.torch.make_private` on the model, the Trainer's optimizer and the training set
(ghost mode: the Trainer's own ``loss.backward()`` forms the clipped sums), and then:

* **batches** -- the Trainer's data loader is replaced by the scheme's (``make_private``'s loader, the
  Trainer's ``data_collator`` inside). One pass over it is the whole run, every epoch of the scheme:
  ``args.max_steps`` is set to the plan's steps and ``num_train_epochs`` is not used (an
  ``args.max_steps`` that disagrees is refused, and so is a second ``train()``);
* **step** -- ``optimizer.step()`` is the private step (clipped sum + correlated noise, divided by the
  plan's normalizer, then the inner optimizer with the Trainer's lr scheduler);
  ``args.max_grad_norm`` is set to 0 (the Trainer's own clipping of the summed gradient would be
  overwritten anyway), and the non-private ``grad_norm`` is neither computed nor logged;
* **loss** -- a causal LM's ``.loss`` is per example (:mod:`~dpmf.training.torch.losses`: each
  sequence's mean over its own non-ignored labels, then the batch mean), other heads with ``-100``
  labels are refused, and ``num_items_in_batch`` (a token count over the batch, which couples the
  examples) is never passed to the model;
* **report** -- every log line carries ``epsilon`` (the plan's, which bounds every prefix of the
  run), ``delta`` and ``dp_steps``; after ``train()``, :attr:`DPTrainer.privacy` holds the
  :class:`~dpmf.training.torch.Privacy` (``privacy.report()``, ``privacy.save_report(path)``) and the
  returned metrics carry ``epsilon`` and ``delta``.

Gradient (activation) checkpointing works (``gradient_checkpointing=True``, or a model with it
enabled), non-reentrant (``use_reentrant=False``, set when not given): the clipper records each
layer's call in the forward and the recomputation inside the backward repeats it unrecorded, so the
norms and clipped sums are those of the same run without checkpointing (the recorded layer inputs
stay in memory, so it saves less memory than in a non-private run; docs/tutorials/huggingface.md). ``bf16=True`` is applied (autocast; norms and
clipped sums are formed outside it, in float32 or wider).

Refused (clear errors, before training): gradient accumulation (use ``chunk_size``; the batch of a
step is the scheme's), more than one device process or GPU (``DataParallel``), label smoothing and
``compute_loss_func`` (token means over the batch), reentrant checkpointing, ``fp16`` (its loss
scaler scales the gradients that are clipped; ignored on a CPU) and a ``bf16`` the device ignores,
``resume_from_checkpoint`` (the noise and sampler
state live in ``privacy.save_checkpoint``). The training loss the Trainer logs is the plain
(non-private) batch loss, as in every DP training loop: it is a statistic of the private data, so do
not publish the logs as if they were private.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.engine import make_private

torch = require_torch()

try:
    import transformers
except ImportError as exc:  # pragma: no cover - exercised only without transformers
    raise ImportError("dpmf.training.torch.huggingface needs transformers: pip install 'dpmf[huggingface]'") from exc

__all__ = ["DPTrainer", "DP_ARGUMENTS"]

#: keyword arguments of :class:`DPTrainer` that go to ``make_private`` (the rest go to ``Trainer``)
DP_ARGUMENTS = ("strategy", "sampling", "delta", "max_grad_norm", "plan", "noise_multiplier", "target_epsilon",
                "accountant", "seed", "secure", "normalizer", "chunk_size", "loss_reduction", "nonfinite",
                "noise_dtype", "accountant_options", "epochs", "sample_rate")


class DPTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` that trains privately with dpmf (module docstring).

    Args:
        model, args: as for ``Trainer`` (``args`` is copied; the copy gets ``max_steps`` = the plan's
            steps and ``max_grad_norm = 0``).
        train_dataset: required; its ``len`` is the public number of examples.
        strategy, sampling, delta, max_grad_norm, target_epsilon | noise_multiplier, seed | secure,
        plan, accountant, normalizer, chunk_size, loss_reduction, nonfinite, noise_dtype,
        accountant_options, epochs, sample_rate: :func:`~dpmf.training.torch.make_private`'s (``max_grad_norm`` is the
            per-example clip norm).
        **kwargs: the other ``Trainer`` arguments (``data_collator``, ``eval_dataset``,
            ``optimizers=(optimizer, scheduler)``, ``callbacks`` ...).

    Attributes:
        privacy: the run's :class:`~dpmf.training.torch.Privacy` (plan, ``report()``, checkpoints).
    """

    def __init__(self, model=None, args=None, **kwargs: Any) -> None:
        dp = {k: kwargs.pop(k) for k in DP_ARGUMENTS if k in kwargs}
        if kwargs.get("train_dataset") is None:
            raise InvalidParameterError("DPTrainer needs train_dataset= (its len() is the public number of examples)")
        if kwargs.get("compute_loss_func") is not None:
            raise UnsupportedConfigurationError(
                "DPTrainer does not take compute_loss_func (it receives num_items_in_batch, a token count over the "
                "batch that couples examples): return a per-example loss reduced over the batch from the model, or "
                "override compute_loss")
        if kwargs.get("model_init") is not None:
            raise UnsupportedConfigurationError("DPTrainer needs model=, not model_init= (the model is made private "
                                                "once, at construction)")
        if args is not None:
            args = copy.copy(args)
            _check_args(args)
        _check_model(model)
        super().__init__(model=model, args=args, **kwargs)
        if args is None:
            self.args = copy.copy(self.args)
            _check_args(self.args)
        _check_precision(self.args, self.accelerator)
        if self.args.n_gpu > 1 or self.args.world_size > 1:
            raise UnsupportedConfigurationError(
                f"DPTrainer runs in one process on one device (n_gpu={self.args.n_gpu}, "
                f"world_size={self.args.world_size}); use make_private(distributed=True) for data parallelism")
        self.model_accepts_loss_kwargs = False  # never pass num_items_in_batch (a batch-wide token count)
        dataset = self.train_dataset
        collate = self.data_collator
        try:
            import datasets

            if isinstance(dataset, datasets.Dataset):
                dataset = self._remove_unused_columns(dataset, description="training")
            else:
                collate = self._get_collator_with_removed_columns(collate, description="training")
        except ImportError:
            collate = self._get_collator_with_removed_columns(collate, description="training")
        optimizer = self.optimizer if self.optimizer is not None else self.create_optimizer()
        run = make_private(self.model, optimizer, dataset, collate_fn=collate,
                           num_workers=self.args.dataloader_num_workers, grad_sample_mode="ghost", **dp)
        self.optimizer, self._dp_loader, self.privacy = run.optimizer, run.data_loader, run.privacy
        plan = self.privacy.run_spec
        if self.args.max_steps > 0 and self.args.max_steps != plan.steps:
            raise InvalidParameterError(
                f"args.max_steps={self.args.max_steps} but the privacy plan covers {plan.steps} steps (the scheme's "
                "steps, every epoch): leave max_steps unset (-1) or set it to the plan's steps")
        self.args.max_steps = plan.steps

    # --- the scheme's batches ---------------------------------------------------------------------
    def get_train_dataloader(self):
        """The scheme's data loader (one pass = the whole run; a second pass is refused)."""
        return self._dp_loader

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """``Trainer.train`` over the plan's steps; the metrics carry ``epsilon`` and ``delta``."""
        if resume_from_checkpoint:
            raise UnsupportedConfigurationError(
                "DPTrainer does not resume Trainer checkpoints (they hold no noise or sampler state): use "
                "trainer.privacy.save_checkpoint(path) / load_checkpoint(path)")
        if trial is not None:
            raise UnsupportedConfigurationError("DPTrainer does not run hyper-parameter searches (each trial "
                                                "would spend privacy)")
        out = super().train(ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)
        out.metrics.update(self._privacy_logs())
        return out

    def training_step(self, model, inputs, num_items_in_batch=None):
        """``Trainer.training_step``; an empty (Poisson) batch skips the forward: the private step still
        adds the noise."""
        first = next((v for v in inputs.values() if isinstance(v, torch.Tensor) and v.ndim >= 1), None)
        if first is not None and first.shape[0] == 0:
            return torch.zeros((), device=self.args.device)
        return super().training_step(model, inputs, num_items_in_batch=None)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The model's own loss (made per-example by the guard ``make_private`` installed)."""
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=None)

    # --- logs ---------------------------------------------------------------------------------------
    def _get_grad_norm(self, model, grad_norm=None):  # the norm of the non-private gradient: not released
        return None

    def _privacy_logs(self) -> dict:
        plan = self.privacy.run_spec
        return {"epsilon": float(plan.epsilon), "delta": float(plan.delta), "dp_steps": self.privacy.steps_done}

    def log(self, logs: dict, *args, **kwargs) -> None:
        """``Trainer.log`` with ``epsilon``, ``delta``, ``dp_steps`` added (and no ``grad_norm``)."""
        logs = {k: v for k, v in logs.items() if k != "grad_norm"}
        if hasattr(self, "privacy"):
            logs.update(self._privacy_logs())
        super().log(logs, *args, **kwargs)


_REENTRANT = ("reentrant checkpointing runs the forward without gradients and backpropagates a second graph "
              "inside the backward, which the per-example norms cannot join")


def _check_model(model) -> None:
    """A model whose checkpointing is on must use the non-reentrant form (``use_reentrant=False``,
    transformers' default; the clipper refuses the other at the first backward too)."""
    for module in model.modules() if isinstance(model, torch.nn.Module) else ():
        fn = getattr(module, "_gradient_checkpointing_func", None)
        if getattr(module, "gradient_checkpointing", False) and getattr(fn, "keywords", {}).get("use_reentrant"):
            raise UnsupportedConfigurationError(
                f"the model's gradient checkpointing uses use_reentrant=True: {_REENTRANT}; enable it with "
                "model.gradient_checkpointing_enable({'use_reentrant': False})")


def _check_checkpointing(args) -> None:
    """``gradient_checkpointing`` / ``activation_checkpointing``: non-reentrant (set when not given;
    ``use_reentrant=True`` refused). The ghost clipper records each layer's call in the forward and
    lets the recomputation inside the backward repeat it without recording (GhostClipper), so the
    norms and sums are those of the run without checkpointing."""
    names = [n for n in ("activation_checkpointing", "gradient_checkpointing") if hasattr(args, n)]
    if not any(getattr(args, n) for n in names):
        return
    for name in (f"{n}_kwargs" for n in names):
        given = getattr(args, name, None)
        kwargs = dict(json.loads(given) if isinstance(given, str) else given or {})
        if kwargs.get("use_reentrant"):
            raise UnsupportedConfigurationError(
                f"{name}={{'use_reentrant': True}}: {_REENTRANT}; pass {{'use_reentrant': False}} (the default)")
        setattr(args, name, {**kwargs, "use_reentrant": False})


def _check_precision(args, accelerator) -> None:
    """``bf16``: autocast, applied by the accelerator (per-example norms and clipped sums are formed
    outside autocast, in float32 or wider, from the captured tensors). ``fp16`` is refused: where it
    runs (a GPU), its loss scaler multiplies the gradients that are clipped; on a CPU it is ignored. A
    ``bf16`` the device ignores is refused too."""
    if getattr(args, "fp16", False):
        raise UnsupportedConfigurationError(
            "fp16=True is not supported by DPTrainer: on a GPU the fp16 loss scaler multiplies the gradients "
            "before they are clipped (the clip norm would apply to scaled gradients), and on a CPU fp16 is ignored "
            "(the run would silently be float32); use bf16=True (autocast, no loss scaling) or full precision")
    if getattr(args, "bf16", False) and not getattr(accelerator, "native_amp", False):
        raise UnsupportedConfigurationError(
            f"bf16=True is ignored on this device ({args.device}): the run would silently be float32; "
            "leave bf16 unset, or train on a device with bfloat16 autocast")


def _check_args(args) -> None:
    _check_checkpointing(args)
    if args.gradient_accumulation_steps != 1:
        raise UnsupportedConfigurationError(
            f"gradient_accumulation_steps={args.gradient_accumulation_steps}: the batch of a private step is the "
            "scheme's batch; to bound memory pass chunk_size=<examples per forward/backward> to DPTrainer")
    if args.label_smoothing_factor:
        raise UnsupportedConfigurationError(
            f"label_smoothing_factor={args.label_smoothing_factor}: the Trainer's label smoother averages over the "
            "tokens of the whole batch (couples examples); smooth inside a per-example loss instead")
    args.max_grad_norm = 0.0
