"""Batch samplers for ``torch.utils.data.DataLoader`` built from a dpmf :class:`SamplingScheme`.

The batches of a training run are ``scheme.batches(num_examples, numpy.random.default_rng(seed))``
(:mod:`dpmf.sampling.schemes`), the very object the accountants read (DESIGN.md: a sampler and
its accountant can never disagree). :class:`SchemeBatchSampler` hands them to a ``DataLoader`` one
list of example indices per step: ``len(sampler) == scheme.steps``, and one pass over it is the
whole run (not one epoch). Batch sizes vary and can be 0 under Poisson-type schemes;
:class:`EmptyBatchCollate` turns an empty batch into tensors of shape ``(0, *example_shape)``
(Opacus' ``wrap_collate_with_empty`` does the same). :func:`private_data_loader` wires both.

Resuming: ``state_dict()`` is ``{scheme, num_examples, seed, steps_done}``; ``load_state_dict``
re-creates the generator from the seed and replays ``steps_done`` batches, so a resumed run draws
exactly the batches of the uninterrupted one. Replaying (rather than saving the numpy
``bit_generator`` state) is needed because the schemes keep state besides the generator (the fixed
order, the balls-in-bins slots, the b-min-sep availability chain).

Example:

>>> from dpmf.sampling import BallsInBinsSampling
>>> sampler = SchemeBatchSampler(BallsInBinsSampling(epochs=2, steps=4), 6, seed=3)
>>> len(sampler)
4
>>> batches = list(sampler)
>>> batches[:2] == batches[2:]  # the same slot in every epoch
True
>>> sorted(i for b in batches[:2] for i in b)  # every example once per epoch
[0, 1, 2, 3, 4, 5]
>>> sampler.state_dict()["steps_done"]
4
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Callable, Iterator

import numpy as np

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.sampling.schemes import SCHEMES, Attribution, MultiAttributionMinSepSampling
from dpmf.training.torch._deps import require_torch

torch = require_torch()

__all__ = ["SchemeBatchSampler", "EmptyBatchCollate", "private_data_loader"]

_STATE_KEYS = ("scheme", "num_examples", "seed", "steps_done")


def _check_seed(seed: object, secure: bool) -> int:
    """The integer seed of the run: the caller's, or 128 bits of OS entropy in secure mode."""
    if secure:
        if seed is not None:
            raise InvalidParameterError(
                f"seed must be None when secure=True (the seed is drawn from the OS), got seed={seed!r}"
            )
        return int(np.random.SeedSequence().entropy)  # fresh OS entropy, never reused
    if seed is None:
        raise InvalidParameterError(
            "seed is required: pass an integer seed, or secure=True to draw one from the OS "
            "(dpmf never draws hidden seeds)"
        )
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or int(seed) < 0:
        raise InvalidParameterError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def _attribution_digest(att: Attribution) -> str:
    """SHA-256 of the example -> user incidence, so a state cannot be loaded onto another graph."""
    h = hashlib.sha256()
    for arr in (att.example_ptr, att.user_of):
        h.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
    return h.hexdigest()


class SchemeBatchSampler(torch.utils.data.Sampler):
    """Batch sampler yielding ``scheme.batches(num_examples, default_rng(seed))`` as lists of ints.

    Use it as ``DataLoader(dataset, batch_sampler=sampler, collate_fn=EmptyBatchCollate(dataset))``
    or through :func:`private_data_loader`. Step ``t`` (0-based) of the run gets the ``t``-th batch
    of the scheme; ``len(sampler) == scheme.steps``.

    Args:
        scheme: any :data:`dpmf.sampling.SamplingScheme`.
        num_examples: dataset size ``m`` (indices ``0..m-1``). For
            :class:`~dpmf.sampling.MultiAttributionMinSepSampling` pass ``attribution`` instead
            (``num_examples`` may be given too and must then equal its number of examples).
        seed: integer seed of the ``numpy.random.Generator``; required unless ``secure=True``.
        secure: draw the seed from OS entropy (128 bits, fresh for every sampler). The stream is
            numpy's PCG64, which is not a cryptographic generator.
        attribution: the users of every example (an :class:`~dpmf.sampling.Attribution` or one
            iterable of user ids per example), for the multi-attribution scheme only.

    Iterating continues from :attr:`steps_done` (breaking out of a loop and iterating again
    resumes); once all ``scheme.steps`` batches were handed out, iterating again raises
    :class:`~dpmf.errors.UnsupportedConfigurationError`: the scheme, hence the accounting,
    covers no more steps. The state (and the seed in it) determines every batch: keep it as
    private as the data.
    """

    def __init__(
        self,
        scheme: Any,
        num_examples: int | None = None,
        *,
        seed: int | None = None,
        secure: bool = False,
        attribution: Any = None,
    ) -> None:
        super().__init__()
        if not isinstance(scheme, SCHEMES):
            names = ", ".join(c.__name__ for c in SCHEMES)
            raise InvalidParameterError(f"scheme must be one of {names}, got {type(scheme).__name__}")
        if not isinstance(secure, bool):
            raise InvalidParameterError(f"secure must be True or False, got {secure!r}")
        self.scheme = scheme
        self.secure = secure
        self.seed = _check_seed(seed, secure)
        self._attribution: Attribution | None = None
        self._digest: str | None = None
        if isinstance(scheme, MultiAttributionMinSepSampling):
            if attribution is None:
                raise InvalidParameterError(
                    "attribution is required for MultiAttributionMinSepSampling (the users of every example)"
                )
            self._attribution = scheme.attribution(attribution)
            self._digest = _attribution_digest(self._attribution)
            m = self._attribution.num_examples
            if num_examples is not None and _count(num_examples) != m:
                raise InvalidParameterError(
                    f"num_examples={num_examples!r} differs from the attribution's {m} examples"
                )
            self.num_examples = m
        else:
            if attribution is not None:
                raise InvalidParameterError(
                    f"attribution is only used by MultiAttributionMinSepSampling, not {type(scheme).__name__}"
                )
            if num_examples is None:
                raise InvalidParameterError("num_examples is required (the number of examples in the dataset)")
            self.num_examples = _count(num_examples)
            if getattr(scheme, "dataset_size", None) not in (None, self.num_examples):  # (truncated schemes)
                raise InvalidParameterError(
                    f"num_examples={self.num_examples} differs from the scheme's dataset_size="
                    f"{scheme.dataset_size}, which its accounting assumes"
                )
            next(iter(scheme.batches(self.num_examples, np.random.default_rng(0))))  # size checks, now
        self._steps_done = 0
        self._stream: Iterator[np.ndarray] | None = None
        self._sizes: dict[int, int] = {}

    # ------------------------------------------------------------------ iteration
    def __len__(self) -> int:
        return self.scheme.steps

    @property
    def steps_done(self) -> int:
        """Batches handed out so far (the 0-based index of the next step)."""
        return self._steps_done

    def _new_stream(self) -> Iterator[np.ndarray]:
        data = self._attribution if self._attribution is not None else self.num_examples
        return iter(self.scheme.batches(data, np.random.default_rng(self.seed)))

    def _open(self) -> Iterator[np.ndarray]:
        """The scheme's stream positioned at :attr:`steps_done` (replayed from the seed if needed)."""
        if self._stream is None:
            stream = self._new_stream()
            for _ in range(self._steps_done):
                next(stream)
            self._stream = stream
        return self._stream

    def __iter__(self) -> Iterator[list[int]]:
        if self._steps_done >= len(self):
            raise UnsupportedConfigurationError(
                f"all {len(self)} steps of the {self.scheme.name} scheme were sampled; the scheme "
                "(and its privacy accounting) covers no more: a longer run needs a new scheme and plan"
            )
        return self._generate()

    def _generate(self) -> Iterator[list[int]]:
        while self._steps_done < len(self):
            batch = next(self._open())  # re-read each step: load_state_dict may swap the stream
            self._sizes[self._steps_done] = len(batch)
            self._sizes.pop(self._steps_done - 64, None)  # keep the recent steps only
            self._steps_done += 1
            yield batch.tolist()

    def batch_size_at(self, step: int) -> int | None:
        """The size of the batch handed out for ``step`` (None if it was not handed out in this
        process, or long ago): what the optimizer checks a step's examples against."""
        return self._sizes.get(step)

    # ------------------------------------------------------------------ checkpoints
    def _expected(self) -> dict:
        state = {"scheme": self.scheme.describe(), "num_examples": self.num_examples, "seed": self.seed}
        if self._digest is not None:
            state["attribution_sha256"] = self._digest
        return state

    def state_dict(self, *, steps_done: int | None = None) -> dict:
        """``{scheme: describe(), num_examples, seed, steps_done}`` (+ the attribution's digest).

        ``steps_done`` overrides the count of batches handed out: pass the trainer's step count
        when a ``DataLoader`` with workers has prefetched batches that were not trained on yet.
        """
        done = self._steps_done if steps_done is None else self._check_steps(steps_done)
        return {**self._expected(), "steps_done": done}

    def _check_steps(self, steps_done: object) -> int:
        if isinstance(steps_done, bool) or not isinstance(steps_done, (int, np.integer)) or not (
            0 <= int(steps_done) <= len(self)
        ):
            raise InvalidParameterError(f"steps_done must be an integer in [0, {len(self)}], got {steps_done!r}")
        return int(steps_done)

    def load_state_dict(self, state: Mapping) -> None:
        """Continue at ``state["steps_done"]``; refuse a state of another scheme, size, seed or graph."""
        if not isinstance(state, Mapping):
            raise InvalidParameterError(f"state must be a mapping from state_dict(), got {type(state).__name__}")
        expected = self._expected()
        missing = [k for k in (*expected, "steps_done") if k not in state]
        if missing:
            raise InvalidParameterError(f"sampler state is missing {missing}; expected keys {list(expected)}")
        for key, value in expected.items():
            if state[key] != value:
                raise InvalidParameterError(
                    f"sampler state has {key}={state[key]!r} but this sampler has {key}={value!r}; "
                    "a state only resumes the run (scheme, dataset, seed) it was saved from"
                )
        self._steps_done = self._check_steps(state["steps_done"])
        self._stream = None  # replayed from the seed on the next batch

    @classmethod
    def from_state_dict(cls, scheme: Any, state: Mapping, *, attribution: Any = None) -> "SchemeBatchSampler":
        """The sampler of a saved run, positioned where it stopped (also for ``secure=True`` runs)."""
        if not isinstance(state, Mapping) or "seed" not in state or "num_examples" not in state:
            raise InvalidParameterError("state must be a mapping from SchemeBatchSampler.state_dict()")
        sampler = cls(scheme, state["num_examples"], seed=state["seed"], attribution=attribution)
        sampler.load_state_dict(state)
        return sampler

    def __repr__(self) -> str:
        return (
            f"SchemeBatchSampler({self.scheme!r}, num_examples={self.num_examples}, "
            f"steps_done={self._steps_done}/{len(self)})"
        )  # the seed is left out on purpose


def _count(num_examples: object) -> int:
    if isinstance(num_examples, bool) or not isinstance(num_examples, (int, np.integer)) or int(num_examples) < 1:
        raise InvalidParameterError(f"num_examples must be an integer >= 1, got {num_examples!r}")
    return int(num_examples)


# ---------------------------------------------------------------------- collate
def _empty_like(obj: Any) -> Any:
    """The collated structure ``obj`` of one example with every tensor/array leaf cut to length 0."""
    if isinstance(obj, torch.Tensor):
        return obj[:0].clone() if obj.ndim else obj
    if isinstance(obj, np.ndarray):
        return obj[:0].copy() if obj.ndim else obj
    if isinstance(obj, Mapping):
        items = {k: _empty_like(v) for k, v in obj.items()}
        try:
            return type(obj)(items)
        except TypeError:
            return items
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_empty_like(v) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_empty_like(v) for v in obj)
    return obj


class EmptyBatchCollate:
    """``collate_fn`` wrapper that also collates an empty batch.

    A non-empty batch goes to ``collate_fn`` (default: ``torch.utils.data.default_collate``). An
    empty one is ``collate_fn([dataset[0]])`` with every tensor (and numpy array) leaf sliced to
    ``[:0]``: shape ``(0, *example_shape)``, the same dtype and nesting as a real batch, so a model
    forward and a per-example clipper run unchanged on it. Picklable (works with ``num_workers``).

    >>> ds = torch.utils.data.TensorDataset(torch.zeros(5, 3, 2), torch.zeros(5, dtype=torch.long))
    >>> x, y = EmptyBatchCollate(ds)([])
    >>> tuple(x.shape), x.dtype, tuple(y.shape), y.dtype
    ((0, 3, 2), torch.float32, (0,), torch.int64)
    """

    def __init__(self, dataset: Any, collate_fn: Callable | None = None) -> None:
        self.dataset = dataset
        self.collate_fn = torch.utils.data.default_collate if collate_fn is None else collate_fn

    def __call__(self, batch: list) -> Any:
        if len(batch):
            return self.collate_fn(batch)
        return _empty_like(self.collate_fn([self.dataset[0]]))


_LOADER_CONFLICTS = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")


def private_data_loader(
    dataset: Any,
    scheme: Any,
    *,
    seed: int | None = None,
    secure: bool = False,
    num_examples: int | None = None,
    attribution: Any = None,
    collate_fn: Callable | None = None,
    num_workers: int = 0,
    **loader_kwargs: Any,
):
    """``DataLoader`` whose batches are the scheme's (a :class:`SchemeBatchSampler`) and may be empty.

    ``num_examples`` defaults to ``len(dataset)`` and must equal it when both exist. Other keyword
    arguments (``pin_memory``, ``worker_init_fn``, ...) go to ``DataLoader``; those that would
    change the batches (``batch_size``, ``shuffle``, ``sampler``, ``batch_sampler``,
    ``drop_last``) are refused. The sampler is ``loader.batch_sampler`` (checkpoint its
    ``state_dict``). With ``num_workers > 0`` the loader prefetches: save
    ``loader.batch_sampler.state_dict(steps_done=trainer_step)``.

    >>> from dpmf.sampling import PoissonSampling
    >>> ds = torch.utils.data.TensorDataset(torch.arange(8.0).reshape(4, 2))
    >>> loader = private_data_loader(ds, PoissonSampling(0.5, steps=3), seed=0)
    >>> [tuple(x.shape) for (x,) in loader]  # step 1 drew nobody
    [(2, 2), (0, 2), (3, 2)]
    """
    bad = sorted(k for k in loader_kwargs if k in _LOADER_CONFLICTS)
    if bad:
        raise InvalidParameterError(
            f"private_data_loader sets the batches from the scheme; do not pass {bad}"
        )
    try:
        size = len(dataset)
    except TypeError:
        size = None
    if num_examples is None and attribution is None:
        if size is None:
            raise InvalidParameterError("dataset has no len(); pass num_examples")
        num_examples = size
    sampler = SchemeBatchSampler(scheme, num_examples, seed=seed, secure=secure, attribution=attribution)
    if size is not None and size != sampler.num_examples:
        raise InvalidParameterError(
            f"the scheme samples from {sampler.num_examples} examples but len(dataset) = {size}"
        )
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=EmptyBatchCollate(dataset, collate_fn),
        num_workers=num_workers,
        **loader_kwargs,
    )
