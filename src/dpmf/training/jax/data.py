"""A dpmf :class:`~dpmf.sampling.SamplingScheme` as the batch indices of a JAX input pipeline.

The batches of a run are ``scheme.batches(num_examples, numpy.random.default_rng(seed))``
(:mod:`dpmf.sampling.schemes`), the very object the accountants read, so the batches and the
epsilon cannot disagree (the PyTorch twin is :class:`dpmf.training.torch.data.SchemeBatchSampler`).
:class:`SchemeBatches` yields one :class:`Batch` per step: the real indices padded with
zero-weight examples to a size from a small set (``pad_multiple``: the next multiple, or the
scheme's ``max_batch_size`` for truncated schemes), so ``jit`` compiles a few shapes, not one per
batch size. Padding changes no clipped sum (a padded example's gradient is zeroed by
``clipped_grad(..., is_padding_example=...)``), hence not the released noisy sum or its privacy
(:mod:`dpmf.sampling.padding`).

Resuming: ``state_dict()`` is ``{scheme, num_examples, seed, steps_done}``; ``load_state_dict``
re-creates the generator from the seed and replays ``steps_done`` batches (the schemes keep state
besides the generator), so a resumed run draws exactly the batches of the uninterrupted one.

>>> from dpmf.sampling import BallsInBinsSampling
>>> batches = SchemeBatches(BallsInBinsSampling(epochs=2, steps=4), 6, seed=3, pad_multiple=4)
>>> out = list(batches)
>>> len(out), out[0].indices.shape[0] % 4, batches.steps_done
(4, 0, 4)
>>> sorted(int(i) for b in out[:2] for i in b.indices[~b.is_padding])  # every example once per epoch
[0, 1, 2, 3, 4, 5]
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError
from dpmf.sampling.padding import padded_batch
from dpmf.sampling.schemes import SCHEMES, MultiAttributionMinSepSampling

__all__ = ["Batch", "SchemeBatches"]


class Batch(NamedTuple):
    """One step's batch: ``indices`` (padded, ``int64``), ``is_padding`` (``bool``, same length; pass
    it as ``clipped_grad(...)(..., is_padding_example=is_padding)``) and the 0-based ``step``."""

    step: int
    indices: np.ndarray
    is_padding: np.ndarray

    @property
    def size(self) -> int:
        """Number of real examples."""
        return int(np.count_nonzero(~self.is_padding))


class SchemeBatches:
    """Iterator over the ``scheme.steps`` batches of a run (module docstring).

    Args:
        scheme: a dpmf sampling scheme (not the user-level multi-attribution one).
        num_examples: the dataset size ``m`` (public under zero-out adjacency).
        seed: an integer seed (the numpy generator of ``scheme.batches``).
        pad_multiple: pad every batch to the next multiple of this (at least one multiple);
            ``None``: no padding (each batch its own shape). Truncated schemes are always padded to
            their ``max_batch_size``.
    """

    def __init__(self, scheme, num_examples: int, *, seed: int, pad_multiple: int | None = 32) -> None:
        if isinstance(scheme, MultiAttributionMinSepSampling) or not isinstance(scheme, SCHEMES):
            raise InvalidParameterError(
                f"scheme must be a dpmf sampling scheme (user-level multi-attribution is PyTorch-only), got "
                f"{type(scheme).__name__}"
            )
        self.scheme = scheme
        self.num_examples = _v.positive_int("num_examples", num_examples)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InvalidParameterError(f"seed must be an integer >= 0 (dpmf never draws hidden seeds), got {seed!r}")
        self.seed = int(seed)
        self.pad_multiple = None if pad_multiple is None else _v.positive_int("pad_multiple", pad_multiple)
        self._restart(0)

    def _restart(self, steps: int) -> None:
        self._it = self.scheme.batches(self.num_examples, np.random.default_rng(self.seed))
        self._t = 0
        for _ in range(steps):
            next(self._it)
            self._t += 1

    def __len__(self) -> int:
        return self.scheme.steps

    @property
    def steps_done(self) -> int:
        """Batches handed out so far (the next one is for step ``steps_done``)."""
        return self._t

    def _size(self, k: int) -> int:
        cap = getattr(self.scheme, "max_batch_size", None)
        if cap is not None:
            return int(cap)
        if self.pad_multiple is None:
            return k
        return max(1, -(-k // self.pad_multiple)) * self.pad_multiple

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        if self._t >= self.scheme.steps:
            raise StopIteration
        real = np.asarray(next(self._it), dtype=np.int64)
        size = self._size(real.size)
        if size == real.size:
            idx, pad = real, np.zeros(real.size, dtype=bool)
        else:
            idx, w = padded_batch(real, size)
            pad = w == 0
        self._t += 1
        return Batch(self._t - 1, idx, pad)

    def state_dict(self) -> dict:
        return {"scheme": self.scheme.describe(), "num_examples": self.num_examples, "seed": self.seed,
                "steps_done": self._t}

    def load_state_dict(self, state) -> None:
        """Resume at ``state["steps_done"]`` (replaying the batches before it); refuses a state of
        another scheme, dataset size or seed."""
        if not isinstance(state, dict) or set(state) != {"scheme", "num_examples", "seed", "steps_done"}:
            raise InvalidParameterError("not a SchemeBatches state (keys scheme, num_examples, seed, steps_done)")
        for key, here in (("scheme", self.scheme.describe()), ("num_examples", self.num_examples), ("seed", self.seed)):
            if state[key] != here:
                raise InvalidParameterError(f"the batch state has {key}={state[key]!r}, this run {here!r}: it belongs "
                                            "to another run")
        steps = state["steps_done"]
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 0 <= steps <= self.scheme.steps:
            raise InvalidParameterError(f"steps_done must be in 0..{self.scheme.steps}, got {steps!r}")
        self._restart(int(steps))
