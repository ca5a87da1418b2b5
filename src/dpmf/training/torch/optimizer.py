"""``DPOptimizer``: wraps any torch optimizer so that each step applies the plan's noisy gradient.

Step ``t`` (:mod:`dpmf.training.run_spec`): the clipped per-example gradient sums of the step's batch
(:class:`~dpmf.training.torch.grad_sample.PerExampleClipper`, possibly accumulated over several
micro-batches with :meth:`DPOptimizer.accumulate`), plus the correlated noise of row ``t``
(:func:`~dpmf.training.torch.noise.correlated_noise`), divided by the plan's public normalizer, are
written to ``.grad`` and the inner optimizer steps (SGD, momentum, Adam, ... and any learning-rate
scheduler attached to either optimizer). The noise is added exactly once per step, to the
(all-reduced, under data parallelism) sum; micro-batches never change the sampling rate the
accountant used, because the batch of a step is the scheme's, whatever the memory split.

Like Opacus' ``DPOptimizer`` it shares ``param_groups`` and ``state`` with the wrapped optimizer.

The loop users already have (ghost mode, :class:`~dpmf.training.torch.ghost.GhostClipper`)::

    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)      # or model(**batch).loss
        loss.backward()                    # the clipped sum is formed at the end of the backward
        optimizer.step()                   # + noise, / normalizer, inner step

Several forward/backward pairs before one ``step()`` are micro-batches of one step. ``step()``
refuses a step whose examples are not the data loader's batch for that step (another size, a skipped
batch, a batch used twice) and a step without a backward (unless the loader's batch is empty).
"""

from __future__ import annotations

from dpmf.errors import InvalidParameterError
from dpmf.training.torch._deps import require_torch

torch = require_torch()

__all__ = ["DPOptimizer"]


class DPOptimizer(torch.optim.Optimizer):
    """The inner ``optimizer`` driven by a plan, a clipper and a noise generator (module docstring).

    Use ``optimizer.step(inputs, targets)`` for a whole batch, or ``accumulate(inputs, targets)``
    per micro-batch then ``step()``. ``zero_grad`` and ``state_dict`` are the inner optimizer's.
    Both take optional per-example ``weights`` in ``[0, 1]`` that multiply the clip factors
    (:meth:`PerExampleClipper.clipped_sum`; 0 drops an example, as an individual filter does).
    ``process_group``: under ``torch.distributed`` the clipped sums are all-reduced over it before
    the noise is added (every rank then adds the same noise: the generators share their state).
    """

    def __init__(self, optimizer, *, plan, clipper, noise, process_group=None, distributed: bool = False,
                 batch_source=None, exact_position: bool = False) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidParameterError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.original_optimizer = optimizer
        self.plan, self.clipper, self.noise = plan, clipper, noise
        self.distributed, self.process_group = distributed, process_group
        self.params = list(clipper.params)
        owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
        missing = [name for name, p in zip(clipper.param_names, self.params) if id(p) not in owned]
        if missing:
            raise InvalidParameterError(f"the optimizer does not hold the trainable parameters {missing[:3]}")
        self.steps_done = 0
        #: the sampler whose batches this optimizer steps on (``batch_size_at(t)``, ``steps_done``), or None
        self.batch_source, self.exact_position = batch_source, exact_position
        self._examples = 0
        self._sum: list | None = None
        #: the sums' one buffer (``_sum`` are views of it, in order), or None (:func:`_copied`)
        self._flat = None
        #: the noise is one flat vector laid out as the parameters, in their order (:meth:`step` adds it at once)
        self._flat_noise = [tuple(s) for s in getattr(noise, "shapes", ())] == [tuple(p.shape) for p in self.params]
        self._norms: list = []
        self.last_norms = None  # unclipped per-example norms of the last step (float64)
        self._optimizer_step_pre_hooks = {}
        self._optimizer_step_post_hooks = {}

    # --- shared with the inner optimizer (schedulers and checkpoints see one optimizer) ------------
    @property
    def param_groups(self):
        return self.original_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.original_optimizer.param_groups = value

    @property
    def state(self):
        return self.original_optimizer.state

    @property
    def defaults(self):
        return self.original_optimizer.defaults

    def state_dict(self):
        return self.original_optimizer.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.original_optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"DPOptimizer({self.original_optimizer.__class__.__name__}, step {self.steps_done}/{self.plan.steps})"

    # --- the private step -----------------------------------------------------------------------
    def accumulate(self, inputs, targets=None, weights=None):
        """Add the clipped per-example gradient sum of a (micro-)batch of the current step; returns
        the unclipped per-example norms. ``weights``: optional per-example multipliers in ``[0, 1]``
        of the clip factors (one per example of this micro-batch)."""
        self.plan.check_step(self.steps_done)
        grads, norms = self.clipper.clipped_sum(inputs, targets, weights=weights)
        self._add(grads, norms)
        return norms

    def _add(self, grads, norms) -> None:
        if self._sum is None:  # (a copy: a rule's sums may be tensors it holds; step() adds the noise in place.
            # Copied here, the rule's tensors are freed before the noise is drawn: keeping them and forming
            # sum + noise anew at the step held a third parameter-sized copy, +45 MiB peak on gpt2-6/llama-6)
            self._flat, self._sum = _copied(grads, self._flat_noise)
        else:
            torch._foreach_add_(self._sum, [g.detach() for g in grads])
        self._norms.append(norms)
        self._examples += int(norms.shape[0])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The inner optimizer's ``zero_grad``; also forgets the clipped sums accumulated for this step
        (micro-batches, loop backwards, forwards not yet backpropagated)."""
        self.clipper.discard()
        self._sum, self._flat, self._norms, self._examples = None, None, [], 0
        self.original_optimizer.zero_grad(set_to_none=set_to_none)

    def _collect_loop(self) -> int:
        """Take the clipped sums the loop's backwards formed (a clipper with the loop form: ghost mode);
        returns how many backwards."""
        waiting = self.clipper.forwards_waiting()
        if waiting:
            raise InvalidParameterError(
                f"step() after a forward without its backward (layers {waiting[:3]}): call loss.backward() "
                "before optimizer.step()"
            )
        sums, norms, backwards = self.clipper.collect()
        if backwards:
            self._add(sums, norms)
        return backwards

    def _check_batch(self, backwards: int) -> None:
        """The examples of this step must be the loader's batch for it (when the loader produced it)."""
        src, t = self.batch_source, self.steps_done
        expected = None if src is None else src.batch_size_at(t)
        if expected is not None and self.exact_position and src.steps_done > t + 1:
            skipped = src.steps_done - 1 - t
            raise InvalidParameterError(
                f"the data loader is at step {src.steps_done - 1} but the optimizer at step {t}: {skipped} "
                f"batch{'es were' if skipped > 1 else ' was'} skipped (taken from the loader without optimizer.step(), e.g. "
                "a peek with next(iter(loader)) before the loop). The private data loader is one pass over all "
                "the plan's steps (every epoch), not restarted by a new iter(): each batch it yields is a step "
                "the accounting counts, so a peek consumes one. Step on every batch it yields; to look at the "
                "data, index the dataset or use a plain DataLoader over it, then build the run again with "
                "make_private (or resume from a checkpoint)"
            )
        seen = self._examples
        if expected is not None and seen != expected:
            raise InvalidParameterError(
                f"step {t} clipped {seen} examples but the data loader's batch for this step has {expected}: "
                "step on exactly the loader's batch (once; micro-batches must add up to it), and call "
                "zero_grad() before a new forward"
            )
        if expected is None and self.clipper.loop_form and backwards == 0 and not self._norms:
            raise InvalidParameterError(
                "step() without a backward: run loss.backward() (or pass the batch: optimizer.step(inputs, "
                "targets)) before optimizer.step()"
            )

    def step(self, inputs=None, targets=None, closure=None, *, weights=None):
        """One private step: accumulate ``inputs`` (if given, with optional per-example ``weights``),
        add noise once, normalize, step.

        Raises :class:`~dpmf.training.run_spec.StepOutOfPlanError` past the plan's last step.
        """
        if closure is not None:
            raise InvalidParameterError("DPOptimizer.step does not take a closure; pass the batch (inputs, targets)")
        self.plan.check_step(self.steps_done)
        if inputs is not None:
            self.accumulate(inputs, targets, weights=weights)
        elif weights is not None:
            raise InvalidParameterError("weights go with a batch: pass them to accumulate() with its micro-batch")
        backwards = self._collect_loop()
        self._check_batch(backwards)
        sums = self._sum if self._sum is not None else [torch.zeros_like(p) for p in self.params]
        if self.distributed:
            import torch.distributed as dist

            for s in sums:
                dist.all_reduce(s, op=dist.ReduceOp.SUM, group=self.process_group)
        scale = 1.0 / self.plan.normalizer
        flat, w = self._flat, self.noise.draw()
        with torch.no_grad():  # (s + w) * scale in place, elementwise: on the one buffer, or per parameter
            if flat is not None:
                flat.add_(w.to(device=flat.device, dtype=flat.dtype))
                flat.mul_(scale)
            else:
                noise = [w.to(device=s.device, dtype=s.dtype) for s, w in zip(sums, self.noise.unflatten(w))]
                torch._foreach_add_(sums, noise)
                torch._foreach_mul_(sums, scale)
            for p, s in zip(self.params, sums):
                p.grad = s if s.dtype == p.dtype else s.to(p.dtype)
        self.last_norms = torch.cat(self._norms) if self._norms else torch.zeros(0, dtype=torch.float64)
        self._sum, self._flat, self._norms, self._examples = None, None, [], 0
        out = self.original_optimizer.step()
        self.steps_done += 1
        return out


def _copied(grads, flat_ok: bool) -> tuple:
    """``(buffer, copies)``: copies of the clipped sums ``grads`` (one per parameter, in order), as views of
    one new contiguous buffer when ``flat_ok`` (the noise is laid out as the parameters) and they share a
    dtype and device (dense tensors) -- the noise is then added and scaled in two elementwise passes over the buffer, the
    same numbers as per parameter (issue 52) --, else ``(None, clones)``."""
    gs = [g.detach() for g in grads]
    first = gs[0] if gs else None
    if flat_ok and len(gs) > 1 and all(g.dtype == first.dtype and g.device == first.device and g.layout == torch.strided
                                       for g in gs):
        flat = torch._C._nn.flatten_dense_tensors(gs)  # (a new tensor: torch.cat of two or more)
        return flat, list(torch._C._nn.unflatten_dense_tensors(flat, gs))
    return None, [g.clone() for g in gs]
