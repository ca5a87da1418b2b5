"""``make_private``: one call, in Opacus' vocabulary, that turns a model, an optimizer and a dataset
into a private training run with correlated noise and a sound amplified epsilon.

The batches (:class:`~dpmf.training.torch.data.SchemeBatchSampler`), the noise
(:func:`~dpmf.training.torch.noise.correlated_noise`) and the epsilon (the plan's report,
:func:`~dpmf.training.run_spec.build_run_spec`) come from the same ``strategy`` and ``sampling`` objects, so
they cannot disagree; or all three from one ``dpmf plan`` row (``plan=row``: exactly what the row
certified, re-checked, not calibrated again; :func:`~dpmf.training.run_spec.run_spec_from_row`). Example
(BandMF with 4 bands under balls-in-bins, calibrated to epsilon 4):

>>> import torch
>>> from dpmf.sampling import BallsInBinsSampling
>>> from dpmf.strategies import bsr
>>> from dpmf.training.torch import make_private
>>> data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
>>> model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
>>> opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
>>> model, opt, loader, privacy = make_private(
...     model, opt, data, strategy=bsr(16, 4), sampling=BallsInBinsSampling(epochs=2, steps=16),
...     target_epsilon=4.0, delta=1e-5, max_grad_norm=1.0,
...     loss_fn=torch.nn.functional.cross_entropy, seed=0)
>>> for x, y in loader:
...     opt.zero_grad()
...     _ = opt.step(x, y)
>>> privacy.steps_done, privacy.report().epsilon <= 4.0, privacy.report().method
(16, True, 'allocation')
"""

from __future__ import annotations

import io
import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from dpmf.errors import InvalidParameterError
from dpmf.training.run_spec import HasRunSpec, RunSpec, epoch_steps_at_rate, resolve_run_spec
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.clipping import Clipper
from dpmf.training.torch.data import EmptyBatchCollate, SchemeBatchSampler
from dpmf.training.torch.ghost import GhostClipper
from dpmf.training.torch.grad_sample import PerExampleClipper
from dpmf.training.torch.losses import guard_model_loss
from dpmf.training.torch.noise import correlated_noise
from dpmf.training.torch.optimizer import DPOptimizer

torch = require_torch()

__all__ = ["make_private", "PrivateConfig", "build_private_run", "PrivateRun", "Privacy", "ShardedBatchSampler",
           "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = 1


def _derived_seed(seed: int, stream: int) -> int:
    """Independent seeds for the sampler (stream 0) and the noise (stream 1) from one seed (32 bits:
    what torch's CPU generator keeps of a seed)."""
    return int(np.random.SeedSequence([int(seed), stream]).generate_state(1, np.uint32)[0])


class ShardedBatchSampler(torch.utils.data.Sampler):
    """Rank ``rank`` of ``world_size`` takes ``batch[rank::world_size]`` of every global batch (the
    same scheme and seed on every rank, so the global batch is the scheme's)."""

    def __init__(self, sampler: SchemeBatchSampler, rank: int, world_size: int) -> None:
        super().__init__()
        self.sampler, self.rank, self.world_size = sampler, rank, world_size
        self._sizes: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        for batch in self.sampler:
            shard = batch[self.rank :: self.world_size]
            self._sizes[self.sampler.steps_done - 1] = len(shard)
            self._sizes.pop(self.sampler.steps_done - 65, None)
            yield shard

    @property
    def steps_done(self) -> int:
        return self.sampler.steps_done

    def batch_size_at(self, step: int) -> int | None:
        """This rank's share of the batch of ``step`` (None if not handed out here)."""
        return self._sizes.get(step)

    def state_dict(self, **kwargs) -> dict:
        return self.sampler.state_dict(**kwargs)

    def load_state_dict(self, state) -> None:
        self.sampler.load_state_dict(state)


@dataclass
class Privacy(HasRunSpec):
    """The privacy side of a run: its :class:`~dpmf.training.run_spec.RunSpec` (``run_spec``; the
    old name ``plan`` warns), reports, checkpoints (returned by :func:`make_private`)."""

    run_spec: RunSpec
    module: Any
    optimizer: DPOptimizer
    sampler: SchemeBatchSampler

    @property
    def steps_done(self) -> int:
        return self.optimizer.steps_done

    @property
    def noise_multiplier(self) -> float:
        """The noise multiplier sigma of the strategy as given (Opacus' ``optimizer.noise_multiplier``)."""
        return self.run_spec.noise_multiplier

    @property
    def max_grad_norm(self) -> float:
        """The per-example clip norm (Opacus' ``optimizer.max_grad_norm``)."""
        return self.run_spec.max_grad_norm

    @property
    def steps_per_epoch(self) -> int:
        """Steps of one epoch (:func:`~dpmf.training.run_spec.steps_per_epoch`: an epoch scheme's, or
        ``1 / sample_rate`` rounded for Poisson): what ``len(data_loader)`` was in an Opacus loop. Here
        ``len(data_loader)`` counts every epoch (one pass is the whole run): a schedule over the run is
        ``T_max = len(data_loader)`` (= ``epochs * steps_per_epoch`` for whole epochs), not
        ``epochs * len(data_loader)``."""
        return self.run_spec.steps_per_epoch

    @property
    def epochs(self) -> int:
        """Epochs of the run (``ceil(steps / steps_per_epoch)``)."""
        return self.run_spec.epochs

    def epoch_of(self, step: int) -> int:
        """The 0-based epoch of the 0-based ``step`` (``privacy.epoch_of(privacy.steps_done - 1)``: the
        epoch of the last step)."""
        return self.run_spec.epoch_of(step)

    def by_epoch(self, data_loader):
        """``(epoch, batches)`` for each epoch of the run left, ``batches`` that epoch's batches of this
        run's ``data_loader`` (consume them all before the next epoch); for per-epoch evaluation::

            for epoch, batches in privacy.by_epoch(loader):
                for x, y in batches:
                    ...
                evaluate(model)

        A resumed run starts with the rest of the epoch it stopped in."""
        if getattr(data_loader, "batch_sampler", None) not in (self.sampler, self.optimizer.batch_source):
            raise InvalidParameterError("by_epoch(data_loader) takes the data loader make_private returned with "
                                        "this privacy")
        spec, start = self.run_spec, self.sampler.steps_done
        per = spec.steps_per_epoch
        batches = iter(data_loader)
        for epoch in range(start // per, spec.epochs):
            yield epoch, itertools.islice(batches, min(spec.steps, (epoch + 1) * per) - max(start, epoch * per))

    def report(self):
        """The certified report of the planned run (``PrivacyReport``; ``.to_json()``), with the steps
        done so far in its diagnostics. Releasing the models of the first ``t`` steps is
        post-processing of the whole run, so the planned epsilon bounds the privacy spent at any step.
        Its ``adjacency`` states what the epsilon is for (zero-out: ``len(dataset)`` is public); its
        JSON carries the digest ``dpmf verify`` checks for edits."""
        clipper = self.optimizer.clipper
        return self.run_spec.training_report(
            self.steps_done, grad_sample_mode=clipper.mode, nonfinite_examples_skipped=clipper.skipped_nonfinite,
            trainable_parameters=sum(p.numel() for p in clipper.params), **clipper.diagnostics())

    def save_report(self, path: str | os.PathLike) -> list[Path]:
        """Write :meth:`report` as JSON to ``path`` (its folder must exist), and next to it, as
        ``<sha256>.npz``, the dense matrix a large dense strategy's description names by hash only
        (the optimal factorization above 64 steps), so that ``dpmf verify path`` (which searches the
        report's folder) can re-check the report from the files alone. Returns the paths written."""
        return self.run_spec.save_report(self.report, path)

    def get_epsilon(self, delta: float | None = None) -> float:
        """Epsilon of the planned run at ``delta`` (default the plan's), Opacus' name. Another delta is
        recomputed with the same accountant and options."""
        if delta is None or delta == self.run_spec.delta:
            return self.run_spec.epsilon
        r = self.run_spec.report
        if r.method not in ("pld", "unamplified", "mmcc", "allocation", "allocation_pld", "truncated_pld"):
            # (Monte Carlo is an estimate from its own samples at its delta; composition reports carry
            # their parts, not one accountant to rerun)
            raise InvalidParameterError(f"epsilon at another delta is not available for method {r.method!r}")
        return self.run_spec.epsilon_at(delta)

    # --- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Model, optimizer, sampler position, noise state and RNG, and the plan they belong to."""
        return {
            "format": CHECKPOINT_FORMAT,
            **self.run_spec.checkpoint_entries(),
            "steps_done": self.steps_done,
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "optimizer_class": _optimizer_class(self.optimizer),
            "optimizer_hyperparameters": _hyperparameter_names(self.optimizer.param_groups),
            "sampler": self.sampler.state_dict(steps_done=self.steps_done),
            "noise": self.noise_state(),
            "torch_rng": torch.get_rng_state(),
        }

    def noise_state(self) -> dict:
        return self.optimizer.noise.state_dict()

    def load_state_dict(self, state) -> None:
        """Restore a :meth:`state_dict`; refuses, before anything is loaded, one from another plan
        (strategy, sampler, sigma, clip norm, normalizer, dataset size, delta) naming what differs, one
        whose plan description no longer matches its stored fingerprint, one whose epsilon claim no
        longer holds (:meth:`~dpmf.training.run_spec.RunSpec.check_checkpoint`), step counters that disagree or
        were changed after saving (the noise state's digest), and model weights of another
        architecture or with NaN/inf. What this does and does not protect against:
        :meth:`load_checkpoint`."""
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT or "plan" not in state:
            raise InvalidParameterError("not a dpmf training checkpoint (missing format/plan)")
        self.run_spec.check_checkpoint(state)
        steps = state.get("steps_done")
        if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= self.run_spec.steps:
            raise InvalidParameterError(f"checkpoint steps_done={steps!r} is outside 0..{self.run_spec.steps}")
        counters = {"noise": _saved_steps(state, "noise"), "sampler": _saved_steps(state, "sampler")}
        if any(c != steps for c in counters.values()):
            raise InvalidParameterError(
                f"inconsistent checkpoint: steps_done={steps}, but the noise state is at step {counters['noise']!r} and "
                f"the sampler at step {counters['sampler']!r} (they are saved equal): the counters were edited or the "
                "file is damaged; resume from an unedited checkpoint"
            )
        _check_model_state(state.get("model"), self.module)
        _check_optimizer_state(state, self.optimizer)
        # the noise first: it checks everything (its digest too) before changing anything
        self.optimizer.noise.load_state_dict(state["noise"])
        self.sampler.load_state_dict(state["sampler"])
        self.module.load_state_dict(state["model"])
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, ValueError, TypeError, RuntimeError) as exc:
            raise InvalidParameterError(
                f"the checkpoint's optimizer state does not fit this optimizer ({exc}): build the run with the "
                "optimizer it was saved from"
            ) from None
        if self.optimizer.noise.steps_done != steps or self.sampler.steps_done != steps:
            raise InvalidParameterError("inconsistent checkpoint: noise, sampler and step counters differ")
        torch.set_rng_state(state["torch_rng"])
        self.optimizer.steps_done = steps

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Write :meth:`state_dict` to ``path`` atomically (a temporary file, then a rename; the folder
        must exist and be writable; :func:`dpmf.files.atomic_write`). See :meth:`load_checkpoint` for
        what loading it checks."""
        from dpmf.files import atomic_write, check_output_file

        path = check_output_file(path, "checkpoint path")  # folder exists and takes a file, not a folder
        buf = io.BytesIO()
        torch.save(self.state_dict(), buf)
        with atomic_write(path, "checkpoint") as fh:
            fh.write(buf.getbuffer())

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        """Load a checkpoint written by :meth:`save_checkpoint` (tensors only, ``weights_only=True``).

        **What it catches** (each an :class:`~dpmf.errors.InvalidParameterError` before anything
        is loaded): a file that is not a readable torch checkpoint; a checkpoint of another plan
        (strategy, sampler, sigma, clip norm, dataset size, delta: the differences are named); a plan
        description edited after saving (it no longer hashes to its stored fingerprint); step
        counters that disagree (run, sampler, noise) or were changed after saving, e.g. all rewound
        to an earlier step while the noise generator is the later one (the noise state carries a
        digest binding its step counter to its generator and recurrence state); model weights of
        another architecture or with NaN/inf; a noise state of another generator.

        **What it does not protect against**: a deliberate edit. Fingerprints and digests are plain
        hashes stored in the file, not signatures: whoever edits a checkpoint can recompute them,
        and finite weights changed by hand are not detected. Nor does it stop resuming the same
        checkpoint twice (two branches of one run: release the models of one branch only), or
        loading an *older* checkpoint of the same run (legitimate: the run continues from there,
        as the plan allows). Keep checkpoints where only the trainer can write them; a secure run's
        checkpoint holds its secret noise state, so keep it as private as the noise."""
        path = Path(path)
        if not path.is_file():
            raise InvalidParameterError(f"checkpoint {path} does not exist")
        try:
            state = torch.load(path, weights_only=True)
        except Exception as exc:  # torch raises many types for a corrupt file
            raise InvalidParameterError(f"checkpoint {path} is not a readable torch checkpoint ({type(exc).__name__})") from exc
        self.load_state_dict(state)


def _optimizer_class(optimizer) -> str:
    """``"torch.optim.sgd.SGD"``: the class of the optimizer a :class:`DPOptimizer` wraps."""
    inner = getattr(optimizer, "original_optimizer", optimizer)
    cls = type(inner)
    return f"{cls.__module__}.{cls.__qualname__}"


def _hyperparameter_names(param_groups) -> list[str]:
    """The sorted hyper-parameter names of an optimizer's parameter groups (``lr``, ``momentum``,
    ``betas`` ...): what its ``step`` reads from every group."""
    names = set()
    for group in param_groups if isinstance(param_groups, (list, tuple)) else ():
        if isinstance(group, dict):
            names |= {str(k) for k in group if k != "params"}
    return sorted(names)


def _check_optimizer_state(state: dict, optimizer) -> None:
    """Refuse, before anything is loaded, a checkpoint saved from another optimizer class, or whose
    parameter groups lack hyper-parameters this optimizer reads: torch's ``load_state_dict`` would
    take the other optimizer's groups as they are and the first ``step()`` fail deep inside torch
    (``KeyError: 'betas'`` for an SGD checkpoint resumed with Adam). Checkpoints from before the
    class was recorded are checked by their groups' hyper-parameter names alone (for the same class,
    torch itself fills in hyper-parameters a newer version added)."""
    here_cls = _optimizer_class(optimizer)
    there_cls = state.get("optimizer_class")
    saved = state.get("optimizer")
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, (list, tuple)):
        raise InvalidParameterError("the checkpoint's optimizer state has no param_groups: not a torch optimizer state")
    there = set(_hyperparameter_names(groups))
    here = set(_hyperparameter_names(optimizer.param_groups))
    name = lambda c: str(c).rsplit(".", 1)[-1]  # noqa: E731 - "SGD", "Adam"
    if there_cls is not None and there_cls != here_cls:
        raise InvalidParameterError(
            f"the checkpoint was saved with the optimizer {name(there_cls)} ({there_cls}; hyper-parameters "
            f"{', '.join(sorted(there)) or 'none'}) but this run uses {name(here_cls)} ({here_cls}; hyper-parameters "
            f"{', '.join(sorted(here)) or 'none'}): build the run with {name(there_cls)} to resume it, or start "
            "a new run"
        )
    missing = sorted(here - there)
    if there_cls is None and missing:  # (same class: torch fills hyper-parameters newer versions added)
        saved_as = f" {name(there_cls)}" if there_cls is not None else ""
        raise InvalidParameterError(
            f"the checkpoint's optimizer{saved_as} has no hyper-parameter{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)} that this run's {name(here_cls)} reads (it has {', '.join(sorted(there)) or 'none'}): "
            "it was saved with another optimizer; build the run with that optimizer to resume it"
        )


def _saved_steps(state: dict, key: str):
    """``state[key]["steps_done"]`` (None when absent)."""
    part = state.get(key)
    return part.get("steps_done") if isinstance(part, dict) else None


def _digest(value) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _check_ranks_agree(plan, sampler, noise, clipper, process_group) -> None:
    """Before the first step every rank must hold the same plan, sampler seed, noise stream and
    clipping: otherwise ranks draw different batches and noise, an example can be counted twice in
    one step's sum, and the accountant's assumption fails. Digests are exchanged (never the seeds);
    a mismatch is an error on every rank, naming what differs."""
    import torch.distributed as dist

    gen = noise.generator
    mine = {
        "plan": plan.fingerprint(),
        "sampler seed": _digest(sampler.seed),
        "noise stream": _digest([noise.fingerprint(), None if gen is None else gen.get_state().tolist()]),
        "clipping": _digest([clipper.mode, clipper.loss_reduction, clipper.param_names]),
    }
    everyone: list = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(everyone, mine, group=process_group)
    differ = [k for k in mine if len({d[k] for d in everyone}) > 1]
    if differ:
        raise InvalidParameterError(
            f"data-parallel ranks disagree on {', '.join(differ)}: every rank must call make_private with the same "
            "strategy, sampling, noise/epsilon, delta, clip norm, dataset size, seed and model; otherwise batches and "
            "noise differ between ranks and the privacy accounting does not hold"
        )


def _check_model_state(saved, module) -> None:
    """The checkpoint's model must be this model's architecture (same keys and shapes) with finite
    floating-point values; checked before anything is loaded."""
    if not isinstance(saved, dict):
        raise InvalidParameterError("the checkpoint has no model state (key 'model')")
    here = module.state_dict()
    missing, extra = sorted(set(here) - set(saved)), sorted(set(saved) - set(here))
    if missing or extra:
        raise InvalidParameterError(
            f"the checkpoint's model is another architecture (missing {missing[:3]}, unexpected {extra[:3]}): load it "
            "into the model it was saved from"
        )
    for k, v in saved.items():
        if not isinstance(v, torch.Tensor) or tuple(v.shape) != tuple(here[k].shape):
            got = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise InvalidParameterError(f"the checkpoint's {k!r} has shape {got}, this model's {tuple(here[k].shape)}: "
                                        "another architecture")
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise InvalidParameterError(f"the checkpoint's {k!r} holds NaN or inf: it cannot resume a run")


class PrivateRun(NamedTuple):
    """What :func:`make_private` returns: ``module, optimizer, data_loader, privacy = make_private(...)``."""

    module: Any
    optimizer: DPOptimizer
    data_loader: Any
    privacy: Privacy


def make_private(
    module,
    optimizer,
    data,
    *,
    strategy=None,
    sampling=None,
    delta: float | None = None,
    max_grad_norm: float | None = None,
    plan=None,
    loss_fn: Callable | None = None,
    noise_multiplier: float | None = None,
    target_epsilon: float | None = None,
    accountant: str = "auto",
    seed: int | None = None,
    secure: bool = False,
    normalizer: float | None = None,
    grad_sample_mode: str | None = None,
    chunk_size: int | None = None,
    loss_reduction: str = "mean",
    nonfinite: str = "raise",
    noise_dtype=None,
    collate_fn: Callable | None = None,
    num_workers: int = 0,
    distributed: bool = False,
    process_group=None,
    accountant_options: dict | None = None,
    attribution=None,
    epochs: int | None = None,
    sample_rate: float | None = None,
) -> PrivateRun:
    """Private training with correlated noise: ``(module, optimizer, data_loader, privacy)``.

    Args:
        module: any ``nn.Module`` whose forward works per example (BatchNorm: use GroupNorm).
        optimizer: any ``torch.optim.Optimizer`` over the module's parameters (SGD, Adam, ...).
        data: a ``Dataset`` (with ``len``) or a ``DataLoader`` (its dataset and ``collate_fn`` are
            kept; its batching is replaced by ``sampling``, as Opacus does with Poisson sampling).
        strategy: the encoder ``C`` (``dpmf.strategies``: ``Identity`` for DP-SGD, ``bsr``/banded
            BandMF, ``BLTStrategy``, ``BinaryTree``, optimal ``DenseStrategy``, ``FFTMechanism``).
        sampling: the ``dpmf.sampling`` scheme; ``sampling.steps`` must equal ``strategy.n``.
        epochs, sample_rate: instead of ``sampling``, as Opacus' ``make_private_with_epsilon``: Poisson
            sampling at ``sample_rate`` (the probability that an example joins a step; default, for a
            ``DataLoader`` with a ``batch_size``, ``1 / len(data)`` as Opacus) for ``epochs`` epochs of
            ``round(1 / sample_rate)`` steps (:func:`~dpmf.training.run_spec.epoch_steps_at_rate`);
            ``strategy`` defaults to ``Identity(steps)`` (DP-SGD).
        delta, target_epsilon | noise_multiplier: the guarantee; exactly one of the last two.
        max_grad_norm: per-example clip norm (all parameters jointly).
        plan: instead of ``strategy``, ``sampling`` and the guarantee, train exactly what a ``dpmf
            plan`` row certified: a row (``dpmf.planner.plan(run)[0]``), its dict, or the path of a
            file ``dpmf plan --export`` wrote. The row is re-checked by one evaluation of its accountant
            at its noise multiplier -- no second calibration -- and refused when it is pruned, an
            uncertified estimate, or planned for another dataset size or ``delta``
            (:func:`~dpmf.training.run_spec.run_spec_from_row`). Or a
            :class:`~dpmf.training.run_spec.RunSpec` (``build_run_spec``), used as it is (its dataset
            size, and ``delta`` / ``max_grad_norm`` / ``normalizer`` when given, must match it).
            ``strategy``, ``sampling``, ``noise_multiplier``, ``target_epsilon``, ``accountant`` and
            value-changing ``accountant_options`` conflict with ``plan`` and are refused with it.
        loss_fn: ``loss_fn(output, target)`` for ``optimizer.step(inputs, targets)`` (sees one example as
            a batch of 1 in functorch mode, the batch in ghost mode); ``None`` (default) for the loop
            users already have: ``loss = criterion(model(x), y); loss.backward(); optimizer.step()``
            (ghost mode; ``model(**batch)`` and models returning their own loss work too).
        accountant: a ``dpmf.account`` method or ``"auto"`` (the tightest proved one).
        seed: one integer seed for batches and noise (independent streams); or ``secure=True``
            (OS entropy for both; see :mod:`dpmf.training.torch.seeding` for what that guarantees).
        normalizer: the public divisor of the noisy sum; default the expected batch size.
        grad_sample_mode: ``"ghost"`` (per-example norms from each layer's activations and output
            gradients, no per-example gradient tensors: :mod:`dpmf.training.torch.ghost`; the fastest),
            ``"functorch"`` (``torch.func``) or ``"opacus"`` (hooks; needs Opacus). Default: ghost when
            ``loss_fn`` is None, else functorch.
        chunk_size: at most this many examples per forward/backward (ghost) or per-example gradients
            in memory at once (functorch).
        loss_reduction: ``"mean"`` or ``"sum"``: how the batch loss reduces the per-example losses
            (ghost and opacus modes; Opacus' convention). It must be one of the two: a loss averaged
            over all tokens of the batch couples examples (average per sequence first). A
            ``transformers`` causal LM called with ``labels`` (ghost and opacus modes) has its ``.loss``
            recomputed per example (:func:`~dpmf.training.torch.losses.per_example_causal_lm_loss`);
            other ``transformers`` heads called with ``-100`` labels are refused
            (:mod:`dpmf.training.torch.losses`).
        nonfinite: ``"raise"`` (default): an example whose gradient is NaN/inf stops training with an
            error; ``"skip"``: it contributes nothing and is counted in the report's diagnostics.
        noise_dtype: ``torch.float32`` (default for float32 models) or ``torch.float64``.
        distributed: data parallel over the initialized ``torch.distributed`` group: every rank
            takes its shard of each global batch, clipped sums are all-reduced, and the same noise
            is added once to the sum on every rank (the noise state is broadcast from rank 0).
        accountant_options: options for the accountant (e.g. ``{"workers": 2}`` for MMCC).
        attribution: for :class:`~dpmf.sampling.MultiAttributionMinSepSampling` (user-level
            training) only: the public graph, the users of every example of ``data`` (after
            :func:`~dpmf.sampling.bound_contributions`, its ``.attribution``, with
            ``sampling.max_user_examples`` at least its most examples per user). The loader draws
            Alg. 3's user-respecting batches (``sampling.batches(attribution, seed)``) and the report
            is user-level (fixed-graph adjacency); docs/tutorials/user-level.md.

    Raises :class:`~dpmf.errors.UnsupportedConfigurationError` before any step for a (strategy,
    sampling) pair no sound accountant covers, and :class:`~dpmf.errors.InvalidParameterError` for
    a sampler whose steps differ from the strategy's.
    """
    config = PrivateConfig(
        strategy=strategy, sampling=sampling, delta=delta, max_grad_norm=max_grad_norm, plan=plan, loss_fn=loss_fn,
        noise_multiplier=noise_multiplier, target_epsilon=target_epsilon, accountant=accountant, seed=seed,
        secure=secure, normalizer=normalizer, grad_sample_mode=grad_sample_mode, chunk_size=chunk_size,
        loss_reduction=loss_reduction, nonfinite=nonfinite, noise_dtype=noise_dtype, collate_fn=collate_fn,
        num_workers=num_workers, distributed=distributed, process_group=process_group,
        accountant_options=accountant_options, attribution=attribution, epochs=epochs, sample_rate=sample_rate)
    return build_private_run(module, optimizer, data, config)


@dataclass(frozen=True)
class PrivateConfig:
    """Every keyword of :func:`make_private` (same names, same defaults, same meaning): the run's
    configuration before anything is checked. :func:`build_private_run` turns it into a
    :class:`PrivateRun` in stages (data, plan, seeds, clipper, noise, loader and optimizer)."""

    strategy: Any = None
    sampling: Any = None
    delta: float | None = None
    max_grad_norm: float | None = None
    plan: Any = None
    loss_fn: Callable | None = None
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    accountant: str = "auto"
    seed: int | None = None
    secure: bool = False
    normalizer: float | None = None
    grad_sample_mode: str | None = None
    chunk_size: int | None = None
    loss_reduction: str = "mean"
    nonfinite: str = "raise"
    noise_dtype: Any = None
    collate_fn: Callable | None = None
    num_workers: int = 0
    distributed: bool = False
    process_group: Any = None
    accountant_options: dict | None = None
    attribution: Any = None
    epochs: int | None = None
    sample_rate: float | None = None


class _Seeds(NamedTuple):
    """This process's place in the data-parallel group and the seeds of its sampler and noise (None:
    secure, OS entropy)."""

    rank: int
    world: int
    sampler: int | None
    noise: int | None


def build_private_run(module, optimizer, data, config: PrivateConfig) -> PrivateRun:
    """:func:`make_private` from a :class:`PrivateConfig`: the stages in the order their checks run
    (every argument error before the accounting where it can be, before any state is built)."""
    if not isinstance(module, torch.nn.Module):
        raise InvalidParameterError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    dataset, collate_fn = _dataset_of(data, config.collate_fn)
    num_examples = _num_examples(dataset)
    config = _poisson_epochs(config, data)
    mode = _grad_sample_mode(config)
    plan = _resolve_run(config, num_examples)
    seeds = _seeds(config)
    sampler = SchemeBatchSampler(plan.scheme, num_examples, seed=seeds.sampler,
                                 secure=config.secure and not config.distributed, attribution=config.attribution)
    clipper = _make_clipper(module, config, mode, plan.max_grad_norm)
    noise = _make_noise(plan, clipper, config, seeds)
    if config.distributed:
        _check_ranks_agree(plan, sampler, noise, clipper, config.process_group)
    batch_sampler = ShardedBatchSampler(sampler, seeds.rank, seeds.world) if config.distributed else sampler
    # the loader gets its own generator: iterating it must not draw from torch's global RNG, which
    # the model's randomness (dropout) uses and checkpoints restore
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=batch_sampler,
                                         collate_fn=EmptyBatchCollate(dataset, collate_fn),
                                         num_workers=config.num_workers, generator=torch.Generator().manual_seed(0))
    dp_opt = DPOptimizer(optimizer, plan=plan, clipper=clipper, noise=noise, distributed=config.distributed,
                         process_group=config.process_group, batch_source=batch_sampler,
                         exact_position=config.num_workers == 0)
    return PrivateRun(module, dp_opt, loader, Privacy(plan, module, dp_opt, sampler))


def _dataset_of(data, collate_fn):
    """``(dataset, collate_fn)``: a DataLoader gives its dataset and (unless one is given) its collate_fn."""
    if isinstance(data, torch.utils.data.DataLoader):
        return data.dataset, collate_fn or data.collate_fn
    return data, collate_fn


def _num_examples(dataset) -> int:
    try:
        return len(dataset)
    except TypeError as exc:
        raise InvalidParameterError("the dataset must have len() (the number of examples is public)") from exc


def _grad_sample_mode(config: PrivateConfig) -> str:
    """The clipper's mode: ghost for the loss.backward() loop (``loss_fn=None``), else functorch."""
    mode = config.grad_sample_mode
    if mode is None:
        mode = "ghost" if config.loss_fn is None else "functorch"
    if config.loss_fn is None and mode != "ghost":
        raise InvalidParameterError(
            f"loss_fn=None (the loss.backward() loop) needs grad_sample_mode='ghost', got {mode!r}; "
            "pass loss_fn=... to use optimizer.step(inputs, targets)"
        )
    return mode


def _poisson_epochs(config: PrivateConfig, data) -> PrivateConfig:
    """``epochs`` (and ``sample_rate``) as Opacus' ``make_private_with_epsilon`` takes them: the config
    with ``sampling = PoissonSampling(sample_rate, epochs * round(1 / sample_rate))`` and, unless given,
    ``strategy = Identity(steps)``. ``sample_rate`` defaults to ``1 / len(data)`` for a batching
    ``DataLoader`` (Opacus' rule)."""
    import dataclasses

    if config.epochs is None and config.sample_rate is None:
        return config
    if config.epochs is None:
        raise InvalidParameterError("sample_rate needs epochs=<number of epochs> (the run is planned up front)")
    if config.sampling is not None or config.plan is not None:
        raise InvalidParameterError(
            f"epochs={config.epochs!r} (with sample_rate) sets Poisson sampling; it conflicts with "
            f"{'sampling' if config.plan is None else 'plan'}=: pass one or the other")
    from dpmf import validation as _v
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity

    epochs, rate = _v.positive_int("epochs", config.epochs), config.sample_rate
    if rate is None:
        if not isinstance(data, torch.utils.data.DataLoader) or data.batch_size is None:
            raise InvalidParameterError(
                "epochs= needs sample_rate=<probability that an example joins a step> (Opacus' batch_size / "
                "len(dataset)), or data= a DataLoader with a batch_size (then sample_rate = 1 / len(data), as Opacus)")
        rate = 1.0 / len(data)
    steps = epochs * epoch_steps_at_rate(rate)
    strategy = Identity(steps) if config.strategy is None else config.strategy
    return dataclasses.replace(config, strategy=strategy, sampling=PoissonSampling(float(rate), steps))


def _resolve_run(config: PrivateConfig, num_examples: int) -> RunSpec:
    """The frozen run description (:func:`~dpmf.training.run_spec.resolve_run_spec`)."""
    sampling = config.sampling
    if config.plan is None and sampling is not None and (config.attribution is not None
                                                         or hasattr(sampling, "max_user_examples")):
        # the sampler's checks (attribution given for, and only for, multi-attribution; its size; k_u) before
        # the accounting, which can take minutes
        SchemeBatchSampler(sampling, num_examples, seed=0, attribution=config.attribution)
    return resolve_run_spec(config.plan, strategy=config.strategy, sampling=sampling, num_examples=num_examples,
                        delta=config.delta, max_grad_norm=config.max_grad_norm,
                        noise_multiplier=config.noise_multiplier, target_epsilon=config.target_epsilon,
                        accountant=config.accountant, normalizer=config.normalizer,
                        accountant_options=config.accountant_options)


def _seeds(config: PrivateConfig) -> _Seeds:
    """Checks ``seed`` / ``secure``; derives independent sampler and noise seeds from ``seed``. Under
    ``distributed`` with ``secure``, rank 0's OS seed for the sampler goes to every rank (the same
    global batches everywhere)."""
    seed, secure = config.seed, config.secure
    if seed is None and not secure:
        raise InvalidParameterError("pass seed=<int> (reproducible) or secure=True (OS entropy)")
    if seed is not None and secure:
        raise InvalidParameterError("pass seed or secure=True, not both")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise InvalidParameterError(f"seed must be an integer >= 0, got {seed!r}")
    rank, world = 0, 1
    sampler_seed = None if secure else _derived_seed(seed, 0)
    if config.distributed:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise InvalidParameterError("distributed=True needs torch.distributed.init_process_group first")
        rank, world = dist.get_rank(config.process_group), dist.get_world_size(config.process_group)
        if secure:  # every rank must draw the same global batches: one OS seed, from rank 0
            box = [int.from_bytes(os.urandom(16), "little") if rank == 0 else None]
            dist.broadcast_object_list(box, src=0, group=config.process_group)
            sampler_seed = box[0]
    return _Seeds(rank, world, sampler_seed, None if secure else _derived_seed(seed, 1))


def _make_clipper(module, config: PrivateConfig, mode: str, max_grad_norm: float) -> Clipper:
    """The clipper of ``mode``; ghost and opacus modes also make a model's own loss per example."""
    if mode == "ghost":
        clipper: Clipper = GhostClipper(module, config.loss_fn, max_grad_norm, loss_reduction=config.loss_reduction,
                                        chunk_size=config.chunk_size, nonfinite=config.nonfinite)
    else:
        clipper = PerExampleClipper(module, config.loss_fn, max_grad_norm, mode=mode, chunk_size=config.chunk_size,
                                    loss_reduction=config.loss_reduction, nonfinite=config.nonfinite)
    if mode in ("ghost", "opacus"):  # the model's own loss sees the whole batch: keep it per example
        clipper.loss_guard = guard_model_loss(module, config.loss_reduction)
    return clipper


def _make_noise(plan: RunSpec, clipper: Clipper, config: PrivateConfig, seeds: _Seeds):
    """The correlated-noise generator over the clipper's parameters; under ``distributed`` with
    ``secure``, every rank gets rank 0's state (the same secret stream)."""
    noise = correlated_noise(plan.strategy, list(clipper.params), noise_multiplier=plan.noise_multiplier,
                             max_grad_norm=plan.max_grad_norm, seed=seeds.noise, secure=config.secure,
                             dtype=config.noise_dtype)
    if config.distributed and config.secure:
        import torch.distributed as dist

        box = [noise.state_dict() if seeds.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=config.process_group)
        noise.load_state_dict(box[0])
    return noise
