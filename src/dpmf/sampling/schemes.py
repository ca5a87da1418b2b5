"""Sampling schemes: one object that both generates batches and tells the accountant what it did.

A scheme is a frozen, validated spec. ``batches(num_examples, rng)`` streams the batch of every
step (arrays of example indices) without materializing an examples x steps matrix; the
accountants in :mod:`dpmf.accounting` read the same object, so a sampler and its accounting cannot
disagree (DESIGN.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError


def _rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        raise InvalidParameterError(
            "rng must be a numpy.random.Generator or an integer seed (dpmf never draws hidden seeds)"
        )
    return np.random.default_rng(rng)


@dataclass(frozen=True)
class PoissonSampling:
    """Every example joins every step independently with probability ``sampling_prob``.

    Mirrors jax_privacy's ``CyclicPoissonSampling(cycle_length=1)`` and opacus' uniform sampler.
    An example can participate in any number of steps (up to ``steps``).
    """

    sampling_prob: float
    steps: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "sampling_prob", _v.probability("sampling_prob", self.sampling_prob))
        object.__setattr__(self, "steps", _v.positive_int("steps", self.steps))

    name = "poisson"

    def describe(self) -> dict:
        return {"name": self.name, "sampling_prob": self.sampling_prob, "steps": self.steps}

    def batches(self, num_examples: int, rng: np.random.Generator | int | None) -> Iterator[np.ndarray]:
        """Yield the sorted example indices of each step (size ~ Binomial(num_examples, q))."""
        n = _v.positive_int("num_examples", num_examples)
        gen = _rng(rng)
        for _ in range(self.steps):
            size = int(gen.binomial(n, self.sampling_prob))
            yield np.sort(gen.choice(n, size=size, replace=False))


@dataclass(frozen=True)
class FixedOrderSampling:
    """Shuffle once, then use the same order every epoch (k epochs of ``steps // epochs`` batches).

    Each example participates exactly ``epochs`` times, exactly ``steps // epochs`` steps apart:
    the (k, b) fixed-epoch participation of the multi-epoch MF paper, with ``min_sep = b``.
    There is no amplification: accounting is for the worst-case example.
    """

    epochs: int
    steps: int

    def __post_init__(self) -> None:
        epochs = _v.positive_int("epochs", self.epochs)
        steps = _v.positive_int("steps", self.steps)
        if steps % epochs:
            raise InvalidParameterError(
                f"steps must be a multiple of epochs for fixed-order sampling, got steps={steps}, epochs={epochs}"
            )
        object.__setattr__(self, "epochs", epochs)
        object.__setattr__(self, "steps", steps)

    name = "fixed-order"

    @property
    def steps_per_epoch(self) -> int:
        return self.steps // self.epochs

    @property
    def min_sep(self) -> int:
        """Steps between two participations of one example."""
        return self.steps_per_epoch

    @property
    def max_participations(self) -> int:
        return self.epochs

    def describe(self) -> dict:
        return {"name": self.name, "epochs": self.epochs, "steps": self.steps}

    def batches(self, num_examples: int, rng: np.random.Generator | int | None) -> Iterator[np.ndarray]:
        """Yield each step's indices: one shuffle, split into ``steps_per_epoch`` near-equal batches."""
        n = _v.positive_int("num_examples", num_examples)
        if n < self.steps_per_epoch:
            raise InvalidParameterError(
                f"num_examples must be >= steps per epoch ({self.steps_per_epoch}), got {n}"
            )
        order = _rng(rng).permutation(n)
        bounds = np.linspace(0, n, self.steps_per_epoch + 1).round().astype(np.int64)
        for _ in range(self.epochs):
            for i in range(self.steps_per_epoch):
                yield np.sort(order[bounds[i] : bounds[i + 1]])


SamplingScheme = PoissonSampling | FixedOrderSampling
