"""``make_private`` for JAX: a loss, parameters and a dataset size in; the optax transformation, the
clipped-gradient function, the batches and the privacy report out.

The JAX twin of :func:`dpmf.training.torch.make_private`, built on the same framework-free
:class:`~dpmf.training.run_spec.RunSpec` (:func:`~dpmf.training.run_spec.resolve_run_spec`: the same
certification before step 0 and the same refusals, with the same messages) and on jax_privacy for
the per-example work. The update of step ``t`` is the plan's

    ``g_t = ( sum_{i in B_t} clip(grad_i, max_grad_norm) + noise_multiplier * max_grad_norm * (C^{-1} z)_t ) / normalizer``

followed by the user's optimizer:

* the clipped sum: ``jax_privacy.clipped_grad(loss_fn, l2_clip_norm=max_grad_norm,
  keep_batch_dim=False)`` (``vmap`` over the examples, padding examples zeroed);
* the noise: :func:`~dpmf.training.jax.noise.correlated_privatizer` (jax_privacy's
  matrix-factorization privatizer with the strategy's noising matrix), then
  ``optax.scale(1 / normalizer)`` (the public normalizer), then the user's optimizer, chained in
  one ``optax.GradientTransformation`` whose state holds the noise key and buffers;
* the batches: :class:`~dpmf.training.jax.data.SchemeBatches` (the scheme's batches, padded);
* the loss: per example, optionally with auxiliary outputs (``has_aux``) and a random key
  (``takes_rng``: step ``t``'s key is ``fold_in(loss key, t)``, split over the examples); its values
  come back from ``train_step`` (:class:`StepOutput`, not covered by the report);
* the plan's length: a step past it raises :class:`~dpmf.training.run_spec.StepOutOfPlanError` on
  the host (:class:`_PlanGuard`) before it runs.

Example (BandMF with 4 bands under balls-in-bins, calibrated to epsilon 4):

>>> import jax, jax.numpy as jnp, numpy as np, optax
>>> from dpmf.sampling import BallsInBinsSampling
>>> from dpmf.strategies import bsr
>>> from dpmf.training.jax import make_private
>>> X, Y = np.random.default_rng(0).normal(size=(256, 8)), np.arange(256) % 2
>>> def loss(params, example):
...     x, y = example
...     logits = x @ params["w"] + params["b"]
...     return -jax.nn.log_softmax(logits)[y]
>>> params = {"w": jnp.zeros((8, 2)), "b": jnp.zeros(2)}
>>> run = make_private(loss, params, 256, optimizer=optax.sgd(0.5), strategy=bsr(16, 4),
...                    sampling=BallsInBinsSampling(epochs=2, steps=16), target_epsilon=4.0, delta=1e-5,
...                    max_grad_norm=1.0, seed=0)
>>> opt_state = run.tx.init(params)
>>> for batch in run.batches:
...     params, opt_state = run.step(params, opt_state, (X[batch.indices], Y[batch.indices]), batch.is_padding)
>>> run.privacy.steps_done, run.privacy.report(opt_state).epsilon <= 4.0, run.privacy.report().method
(16, True, 'allocation')
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from dpmf.errors import InvalidParameterError
from dpmf.training.jax._deps import require_jax
from dpmf.training.jax.checks import (check_microbatch_size, check_params, check_prng_key, check_seed,
                                      checked_grad_fn)
from dpmf.training.jax.config import as_dpmf_strategy
from dpmf.training.jax.data import SchemeBatches
from dpmf.training.jax.noise import GuardedNoiseState, correlated_privatizer
from dpmf.training.run_spec import HasRunSpec, RunSpec, StepOutOfPlanError, resolve_run_spec

jax, optax, jax_privacy = require_jax()
import jax.numpy as jnp  # noqa: E402

__all__ = ["make_private", "PrivateRun", "Privacy", "StepOutput", "StepOutOfPlanError", "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = 1
GRAD_SAMPLE_MODE = "jax_privacy.clipped_grad (vmap)"


def _derived_seed(seed: int, stream: int) -> int:
    """Independent seeds for the batches (stream 0) and the noise key (stream 1) from one seed."""
    return int(np.random.SeedSequence([int(seed), stream]).generate_state(1, np.uint32)[0])


def _noise_state(opt_state) -> GuardedNoiseState:
    """The noise part of the chained optax state (its first element)."""
    first = opt_state[0] if isinstance(opt_state, tuple) and opt_state else None
    if not isinstance(first, GuardedNoiseState):
        raise InvalidParameterError("opt_state must be the state of run.tx (tx.init(params)), whose first part is "
                                    "the noise state")
    return first


def _to_numpy_leaves(tree) -> tuple[list[np.ndarray], list[bool]]:
    """The leaves of a pytree as numpy arrays; JAX PRNG keys as their raw key data (flagged)."""
    leaves = jax.tree.leaves(tree)
    out, is_key = [], []
    for leaf in leaves:
        key = hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        out.append(np.asarray(jax.random.key_data(leaf) if key else leaf))
        is_key.append(bool(key))
    return out, is_key


def _from_numpy_leaves(template, leaves: list, what: str):
    """``template``'s pytree with ``leaves`` (same count and shapes; keys re-wrapped)."""
    ref, treedef = jax.tree.flatten(template)
    if len(ref) != len(leaves):
        raise InvalidParameterError(f"the checkpoint's {what} has {len(leaves)} arrays, this run's {len(ref)}: it was "
                                    "saved from another model or optimizer")
    out = []
    for i, (r, v) in enumerate(zip(ref, leaves)):
        v = np.asarray(v)
        if jnp.issubdtype(r.dtype, jax.dtypes.prng_key):
            if v.shape != jax.random.key_data(r).shape:
                raise InvalidParameterError(f"the checkpoint's {what} key {i} has shape {v.shape}")
            out.append(jax.random.wrap_key_data(v, impl=jax.random.key_impl(r)))
            continue
        if tuple(v.shape) != tuple(np.shape(r)):
            raise InvalidParameterError(f"the checkpoint's {what} array {i} has shape {v.shape}, this run's "
                                        f"{tuple(np.shape(r))}: another architecture or optimizer")
        if np.issubdtype(v.dtype, np.floating) and not np.all(np.isfinite(v)):
            raise InvalidParameterError(f"the checkpoint's {what} array {i} holds NaN or inf: it cannot resume a run")
        out.append(jnp.asarray(v, dtype=r.dtype))
    return jax.tree.unflatten(treedef, out)


@dataclasses.dataclass
class Privacy(HasRunSpec):
    """The privacy side of a JAX run: its :class:`~dpmf.training.run_spec.RunSpec` (``run_spec``; the
    old name ``plan`` warns), reports and checkpoints (:func:`make_private`)."""

    run_spec: RunSpec
    batches: SchemeBatches

    @property
    def steps_done(self) -> int:
        """Batches handed out so far."""
        return self.batches.steps_done

    @property
    def noise_multiplier(self) -> float:
        return self.run_spec.noise_multiplier

    def noise_steps(self, opt_state) -> int:
        """The noise steps taken by ``opt_state`` (the counter in its noise state)."""
        return int(_noise_state(opt_state).count)

    def report(self, opt_state=None):
        """The certified report of the planned run (``PrivacyReport``), with the steps done in its
        diagnostics (releasing the first ``t`` steps' models is post-processing of the whole run).
        With ``opt_state``, its noise counter must equal the batches handed out (the batch contract)."""
        if opt_state is not None and self.noise_steps(opt_state) != self.steps_done:
            raise InvalidParameterError(
                f"the optimizer state has taken {self.noise_steps(opt_state)} noise steps but {self.steps_done} batches "
                "were handed out: every batch must be used for exactly one update (run.step)"
            )
        return self.run_spec.training_report(self.steps_done, grad_sample_mode=GRAD_SAMPLE_MODE, framework="jax")

    def save_report(self, path: str | os.PathLike, opt_state=None) -> list[Path]:
        """Write :meth:`report` as JSON to ``path`` (and, beside it, the matrix a large dense strategy's
        description names by hash), so ``dpmf verify path`` re-checks it. Returns the paths written."""
        return self.run_spec.save_report(lambda: self.report(opt_state), path)

    def get_epsilon(self, delta: float | None = None) -> float:
        """Epsilon of the planned run (at the plan's delta)."""
        if delta is not None and delta != self.run_spec.delta:
            return self.run_spec.epsilon_at(delta)
        return self.run_spec.epsilon

    # --- checkpoints ------------------------------------------------------------------------------
    def state_dict(self, params, opt_state) -> dict:
        """Parameters, optax state (noise key and buffers included), batch position and the plan, as
        numpy arrays and JSON-ready values."""
        p, _ = _to_numpy_leaves(params)
        o, _ = _to_numpy_leaves(opt_state)
        return {"format": CHECKPOINT_FORMAT, **self.run_spec.checkpoint_entries(),
                "steps_done": self.steps_done, "batches": self.batches.state_dict(),
                "noise_steps": self.noise_steps(opt_state), "params": p, "opt_state": o}

    def load_state_dict(self, state, params, opt_state):
        """Restore a :meth:`state_dict` onto templates ``params`` and ``opt_state`` (this run's
        ``tx.init(params)``); returns ``(params, opt_state)`` and moves the batches to the saved step.
        Refuses, before anything changes: another plan (naming what differs), a description edited
        after saving, counters that disagree, arrays of another model or optimizer, NaN/inf."""
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT or "plan" not in state:
            raise InvalidParameterError("not a dpmf JAX training checkpoint (missing format/plan)")
        self.run_spec.check_checkpoint(state)
        steps = state.get("steps_done")
        saved_batches = state.get("batches") if isinstance(state.get("batches"), dict) else {}
        counters = (state.get("noise_steps"), saved_batches.get("steps_done"))
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 0 <= steps <= self.run_spec.steps \
                or any(c != steps for c in counters):
            raise InvalidParameterError(
                f"inconsistent checkpoint: steps_done={steps!r}, noise state at step {counters[0]!r}, batches at step "
                f"{counters[1]!r} (they are saved equal, within 0..{self.run_spec.steps}): resume from an unedited checkpoint"
            )
        new_params = _from_numpy_leaves(params, state.get("params", []), "params")
        new_opt = _from_numpy_leaves(opt_state, state.get("opt_state", []), "optimizer state")
        if int(_noise_state(new_opt).count) != steps:
            raise InvalidParameterError(f"inconsistent checkpoint: the optimizer state's noise counter is "
                                        f"{int(_noise_state(new_opt).count)}, steps_done {steps}")
        self.batches.load_state_dict(saved_batches)
        return new_params, new_opt

    def save_checkpoint(self, path: str | os.PathLike, params, opt_state) -> None:
        """Write :meth:`state_dict` to ``path`` (``.npz``: the arrays, and the rest as JSON; no pickle)."""
        from dpmf.files import check_output_file, write_npz

        path = check_output_file(path, "checkpoint path")
        state = self.state_dict(params, opt_state)
        arrays = {f"params_{i}": a for i, a in enumerate(state.pop("params"))}
        arrays.update({f"opt_{i}": a for i, a in enumerate(state.pop("opt_state"))})
        meta = {**state, "kind": "dpmf-jax-checkpoint", "num_params": sum(k.startswith("params_") for k in arrays),
                "num_opt": sum(k.startswith("opt_") for k in arrays)}
        write_npz(path, {"metadata": np.array(json.dumps(meta)), **arrays}, "checkpoint", compressed=False)

    def load_checkpoint(self, path: str | os.PathLike, params, opt_state):
        """Load a checkpoint written by :meth:`save_checkpoint` onto templates; ``(params, opt_state)``.
        The checks of :meth:`load_state_dict` (plain hashes, not signatures: they catch mistakes and
        damage, not a deliberate edit; keep a run's checkpoints as private as its noise)."""
        from dpmf.files import read_npz

        data = read_npz(path, "dpmf JAX checkpoint", kind="dpmf-jax-checkpoint")
        try:
            meta = data.metadata
            state = {k: v for k, v in meta.items() if k not in ("num_params", "num_opt", "kind")}
            state["params"] = [data.arrays[f"params_{i}"] for i in range(int(meta["num_params"]))]
            state["opt_state"] = [data.arrays[f"opt_{i}"] for i in range(int(meta["num_opt"]))]
        except (KeyError, ValueError, TypeError) as exc:
            raise InvalidParameterError(f"checkpoint {path} is not a dpmf JAX checkpoint ({exc})") from None
        return self.load_state_dict(state, params, opt_state)


class StepOutput(NamedTuple):
    """What ``run.train_step`` returns beside ``(params, opt_state)``:

    * ``step``: the 0-based index of the step just taken;
    * ``loss``: the mean of the per-example losses over the batch's real examples (0 for an empty batch);
    * ``losses``: the per-example losses, one per row of the padded batch (padding rows 0);
    * ``aux``: the per-example auxiliary outputs of ``loss_fn`` (``has_aux=True``; padding rows 0),
      else ``None``.

    All are computed from the batch without noise (jax_privacy's ``clipped_grad`` returns them beside
    the clipped sum, from the same forward pass): **the privacy report does not cover them**. Logging
    them releases information about the training examples; log them privately or on held-out data
    where that matters.
    """

    step: Any
    loss: Any
    losses: Any
    aux: Any


class PrivateRun(NamedTuple):
    """What :func:`make_private` returns.

    * ``tx``: the ``optax.GradientTransformation`` (correlated noise, ``1 / normalizer``, your
      optimizer) to apply to the clipped gradient **sum**;
    * ``grad_fn``: ``grad_fn(params, batch, is_padding_example=mask)``, the sum of per-example
      gradients clipped to ``max_grad_norm`` (``batch`` a pytree of arrays with a leading example axis;
      with ``takes_rng=True`` also ``rng=<the step's key>``, split per example);
    * ``step``: ``step(params, opt_state, batch, is_padding) -> (params, opt_state)``, jitted;
    * ``batches``: the :class:`~dpmf.training.jax.data.SchemeBatches` of the plan;
    * ``privacy``: :class:`Privacy` (plan, report, checkpoints);
    * ``train_step``: ``train_step(params, opt_state, batch, is_padding) -> (params, opt_state,
      StepOutput)``: the same step (the same compiled function) with its loss values
      (:class:`StepOutput`).

    Both steps raise :class:`~dpmf.training.run_spec.StepOutOfPlanError` before a step past the plan
    (a host-side check of the noise counter, no device read in a plain loop), and derive the step's
    random key (``takes_rng=True``) from the run's key and the step index.
    """

    tx: Any
    grad_fn: Callable
    step: Callable
    batches: SchemeBatches
    privacy: Privacy
    train_step: Callable


def _run_keys(seed, prng_key) -> tuple[int, Any, Any]:
    """``(batch seed, noise key, loss key)`` from exactly one of ``seed`` or ``prng_key``: independent
    streams (stream 0 the batches, 1 the noise, 2 the loss's random keys)."""
    if (seed is None) == (prng_key is None):
        raise InvalidParameterError("pass exactly one of seed=<int> and prng_key=<a jax.random key> "
                                    "(reproducible; dpmf never draws hidden seeds)")
    if seed is not None:
        seed = check_seed(seed)
        return (_derived_seed(seed, 0), jax.random.key(_derived_seed(seed, 1)),
                jax.random.key(_derived_seed(seed, 2)))
    key = check_prng_key(prng_key)
    words = [int(w) for w in np.asarray(jax.random.key_data(key), dtype=np.uint32).ravel()]
    batch_seed = int(np.random.SeedSequence(words + [0]).generate_state(1, np.uint32)[0])
    return batch_seed, jax.random.fold_in(key, 1), jax.random.fold_in(key, 2)


class _PlanGuard:
    """The host-side check that a step is inside the plan (``plan.check_step`` on the noise counter).

    The counter lives on the device; reading it every step would wait for the previous step. So the
    guard remembers the counter array each step returned and its value: a state passed back as
    returned is checked from memory, any other (``tx.init``, a checkpoint, a copy) is read once.
    Inside a caller's ``jit`` (a traced counter) nothing can be checked on the host: the noise's NaN
    guard is what remains there."""

    def __init__(self, plan: RunSpec) -> None:
        self.plan = plan
        self._last: tuple[Any, int] | None = None

    def before(self, opt_state) -> int | None:
        count = _noise_state(opt_state).count
        if isinstance(count, jax.core.Tracer):
            return None
        t = self._last[1] if self._last is not None and count is self._last[0] else int(count)
        self.plan.check_step(t)
        return t

    def after(self, opt_state, t: int | None) -> None:
        if t is not None:
            self._last = (_noise_state(opt_state).count, t + 1)


def _steps(clipped: Callable, tx, plan: RunSpec, loss_key, *, takes_rng: bool, has_aux: bool):
    """``(grad_fn, step, train_step)`` around jax_privacy's clipped function ``clipped(params, batch,
    [rng,] is_padding_example=) -> (clipped sum, AuxiliaryOutput(values, _, aux))``."""
    def rng_args(rng) -> tuple:
        if takes_rng and rng is None:
            raise InvalidParameterError("loss_fn takes a random key (takes_rng=True): pass grad_fn(..., rng=<key>)")
        if not takes_rng and rng is not None:
            raise InvalidParameterError("rng= is for a loss_fn taking a random key: pass takes_rng=True to make_private")
        return (rng,) if takes_rng else ()

    def grad_fn(params, batch, is_padding_example=None, rng=None):
        return clipped(params, batch, *rng_args(rng), is_padding_example=is_padding_example)[0]

    @jax.jit
    def compiled(params, opt_state, batch, is_padding):
        t = _noise_state(opt_state).count
        if is_padding is None:
            is_padding = jnp.zeros(jax.tree.leaves(batch)[0].shape[0], dtype=bool)
        keys = (jax.random.fold_in(loss_key, t),) if takes_rng else ()
        g, out = clipped(params, batch, *keys, is_padding_example=is_padding)
        updates, opt_state = tx.update(g, opt_state, params)
        real = ~jnp.asarray(is_padding, dtype=bool)
        losses = jnp.where(real, out.values, jnp.zeros_like(out.values))
        loss = jnp.sum(losses) / jnp.maximum(jnp.sum(real), 1).astype(losses.dtype)

        def zero_padding(a):
            mask = real.reshape(real.shape + (1,) * (a.ndim - 1))
            return jnp.where(mask, a, jnp.zeros_like(a))

        aux = jax.tree.map(zero_padding, out.aux) if has_aux else None
        return optax.apply_updates(params, updates), opt_state, StepOutput(t, loss, losses, aux)

    guard = _PlanGuard(plan)

    def train_step(params, opt_state, batch, is_padding=None):
        t = guard.before(opt_state)
        params, opt_state, out = compiled(params, opt_state, batch, is_padding)
        guard.after(opt_state, t)
        return params, opt_state, out

    def step(params, opt_state, batch, is_padding=None):
        params, opt_state, _ = train_step(params, opt_state, batch, is_padding)
        return params, opt_state

    return grad_fn, step, train_step


def make_private(
    loss_fn: Callable,
    params,
    num_examples: int,
    *,
    optimizer=None,
    strategy=None,
    sampling=None,
    delta: float | None = None,
    max_grad_norm: float | None = None,
    plan=None,
    noise_multiplier: float | None = None,
    target_epsilon: float | None = None,
    accountant: str = "auto",
    seed: int | None = None,
    normalizer: float | None = None,
    pad_multiple: int | None = 32,
    microbatch_size: int | None = None,
    accountant_options: dict | None = None,
    prng_key=None,
    has_aux: bool = False,
    takes_rng: bool = False,
) -> PrivateRun:
    """Private training of a JAX model with correlated noise: :class:`PrivateRun`.

    Args:
        loss_fn: ``loss_fn(params, example) -> scalar`` for **one** example (``example`` a pytree of
            arrays without the batch axis, e.g. ``(x, y)``); ``loss_fn(params, example, rng)`` with
            ``takes_rng=True``; returning ``(scalar, aux)`` with ``has_aux=True``.
        params: the parameter pytree (its structure and shapes set the noise's).
        num_examples: the dataset size (public under zero-out adjacency).
        optimizer: any ``optax.GradientTransformation`` (``optax.sgd(0.1, momentum=0.9)``, ``adam``...).
        strategy: a dpmf strategy, or a jax_privacy ``BufferedToeplitz`` / ``ColumnNormalizedBanded``
            (converted over the sampler's steps by :func:`~dpmf.training.jax.config.strategy_from_jax_privacy`).
        sampling, delta, max_grad_norm, target_epsilon | noise_multiplier, accountant,
            normalizer, plan, accountant_options: as for :func:`dpmf.training.torch.make_private`
            (the same :func:`~dpmf.training.run_spec.resolve_run_spec`).
        seed, prng_key: exactly one: an integer seed, or a JAX key (``jax.random.key(0)``), from which
            the batches, the noise key and the loss's keys are derived (independent streams). JAX's
            keys are reproducible, not a secure source: there is no ``secure`` mode here.
        pad_multiple: batches are padded to a multiple of this (:class:`SchemeBatches`).
        microbatch_size: passed to ``jax_privacy.clipped_grad`` (examples per ``vmap`` at once): a
            positive integer dividing ``pad_multiple``, or ``None``.
        has_aux: ``loss_fn`` returns ``(loss, aux)``, as for ``jax.value_and_grad``; ``aux`` (any
            pytree) comes back per example in :class:`StepOutput` (not covered by the report).
        takes_rng: ``loss_fn`` takes a third argument, a random key (dropout): the key of step ``t``
            is ``fold_in(loss key, t)``, split over the batch's examples (jax_privacy's
            ``prng_argnum``), so a run is reproducible and a resumed run draws the same masks.

    Checked here: every parameter is a floating-point array and ``microbatch_size`` divides the padded
    batches; checked the first time a batch of a new shape arrives (one abstract ``jax.eval_shape``
    call, :mod:`~dpmf.training.jax.checks`): ``loss_fn`` runs on one example and returns a real scalar
    (or ``(scalar, aux)``). Each step: it is inside the plan
    (:class:`~dpmf.training.run_spec.StepOutOfPlanError` otherwise).

    Raises :class:`~dpmf.errors.UnsupportedConfigurationError` before any step for a (strategy,
    sampling) pair no sound accountant covers, and :class:`~dpmf.errors.InvalidParameterError`
    for missing or conflicting arguments (the messages of the PyTorch side).
    """
    if not callable(loss_fn):
        raise InvalidParameterError(f"loss_fn must be callable (loss_fn(params, example) -> scalar), got {loss_fn!r}")
    if optimizer is None or not hasattr(optimizer, "init") or not hasattr(optimizer, "update"):
        raise InvalidParameterError(f"optimizer must be an optax.GradientTransformation (e.g. optax.sgd(0.1)), "
                                    f"got {optimizer!r}")
    for name, flag in (("has_aux", has_aux), ("takes_rng", takes_rng)):
        if not isinstance(flag, (bool, np.bool_)):
            raise InvalidParameterError(f"{name} must be True or False, got {flag!r}")
    check_params(params)
    microbatch_size = check_microbatch_size(microbatch_size, pad_multiple)
    if isinstance(num_examples, bool) or not isinstance(num_examples, (int, np.integer)) or num_examples < 1:
        raise InvalidParameterError(f"num_examples must be a positive integer (the dataset size), got {num_examples!r}")
    strategy = as_dpmf_strategy(strategy, getattr(sampling, "steps", None))
    plan = resolve_run_spec(plan, strategy=strategy, sampling=sampling, num_examples=int(num_examples), delta=delta,
                            max_grad_norm=max_grad_norm, noise_multiplier=noise_multiplier,
                            target_epsilon=target_epsilon, accountant=accountant, normalizer=normalizer,
                            accountant_options=accountant_options)
    batch_seed, noise_key, loss_key = _run_keys(seed, prng_key)
    batches = SchemeBatches(plan.scheme, plan.num_examples, seed=batch_seed, pad_multiple=pad_multiple)
    noise = correlated_privatizer(plan.strategy, noise_multiplier=plan.noise_multiplier,
                                  max_grad_norm=plan.max_grad_norm, prng_key=noise_key)
    tx = optax.chain(noise, optax.scale(1.0 / plan.normalizer), optimizer)
    clipped = checked_grad_fn(
        jax_privacy.clipped_grad(loss_fn, has_aux=bool(has_aux), l2_clip_norm=plan.max_grad_norm, batch_argnums=1,
                                 keep_batch_dim=False, microbatch_size=microbatch_size, return_values=True,
                                 prng_argnum=2 if takes_rng else None),
        loss_fn, microbatch_size, has_aux=bool(has_aux))
    grad_fn, step, train_step = _steps(clipped, tx, plan, loss_key, takes_rng=bool(takes_rng),
                                       has_aux=bool(has_aux))
    return PrivateRun(tx, grad_fn, step, batches, Privacy(plan, batches), train_step)
