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


@dataclass(frozen=True)
class CyclicPoissonSampling:
    """Cyclic Poisson: examples split into ``cycle_length`` groups; group ``t mod b`` is active at step t.

    At an active step each example of the group joins independently with probability
    ``sampling_prob`` (the per-active-step rate, ``b * p0`` for a target rate ``p0``; Choquette-Choo
    et al. 2024). Each example can participate only every ``cycle_length`` steps, so the scheme has
    the b-min-sep *property* with ``min_sep = cycle_length``. ``partition="equal"`` splits a random
    permutation into equal groups; ``"independent"`` assigns each example a uniform group.
    ``cycle_length=1`` is :class:`PoissonSampling`. Mirrors jax_privacy's ``CyclicPoissonSampling``.
    """

    sampling_prob: float
    steps: int
    cycle_length: int
    partition: str = "equal"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sampling_prob", _v.probability("sampling_prob", self.sampling_prob))
        object.__setattr__(self, "steps", _v.positive_int("steps", self.steps))
        object.__setattr__(self, "cycle_length", _v.positive_int("cycle_length", self.cycle_length))
        if self.partition not in ("equal", "independent"):
            raise InvalidParameterError(
                f"partition must be 'equal' or 'independent', got {self.partition!r}"
            )

    name = "cyclic-poisson"

    @property
    def min_sep(self) -> int:
        return self.cycle_length

    @property
    def max_participations(self) -> int:
        """Participations possible for the worst-placed example (group 0): ceil(steps / b)."""
        return -(-self.steps // self.cycle_length)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "sampling_prob": self.sampling_prob,
            "steps": self.steps,
            "cycle_length": self.cycle_length,
            "partition": self.partition,
        }

    def groups(self, num_examples: int, rng: np.random.Generator | int | None) -> np.ndarray:
        """Group (phase) of every example, in ``0..cycle_length-1``."""
        n = _v.positive_int("num_examples", num_examples)
        gen = _rng(rng)
        b = self.cycle_length
        if self.partition == "independent":
            return gen.integers(0, b, size=n)
        if n < b:
            raise InvalidParameterError(f"num_examples must be >= cycle_length ({b}), got {n}")
        group = np.empty(n, dtype=np.int64)
        group[gen.permutation(n)] = np.arange(n) * b // n
        return group

    def batches(self, num_examples: int, rng: np.random.Generator | int | None) -> Iterator[np.ndarray]:
        """Yield the sorted example indices of each step."""
        gen = _rng(rng)
        group = self.groups(num_examples, gen)
        members = [np.flatnonzero(group == g) for g in range(self.cycle_length)]
        for t in range(self.steps):
            pool = members[t % self.cycle_length]
            yield pool[gen.random(pool.size) < self.sampling_prob]


def participation_rate(sampling_prob: float, min_sep: int) -> float:
    """b-min-sep marginal rate ``p0 = 1 / (1/p + b - 1)`` (Dong & Ganesh 2026, Sec. 3)."""
    p = _v.probability("sampling_prob", sampling_prob)
    b = _v.positive_int("min_sep", min_sep)
    return 1.0 / (1.0 / p + b - 1)


def sampling_prob_for_rate(rate: float, min_sep: int) -> float:
    """Inverse of :func:`participation_rate`: ``p = p0 / (1 - p0 (b - 1))``; needs ``p0 <= 1/b``."""
    p0 = _v.probability("participation_rate", rate)
    b = _v.positive_int("min_sep", min_sep)
    if p0 * (b - 1) >= 1 or p0 > 1.0 / b * (1 + 1e-12):
        raise InvalidParameterError(
            f"participation_rate must be <= 1/min_sep = {1 / b:.6g} for min_sep={b} "
            f"(p0*(b-1) < 1), got {p0}"
        )
    return min(1.0, p0 / (1.0 - p0 * (b - 1)))


@dataclass(frozen=True)
class MinSepSampling:
    """b-min-sep subsampling (Dong & Ganesh 2026, Algs. 1-2): Poisson over the *available* examples.

    At each step every example that did not participate in the previous ``min_sep - 1`` steps
    joins independently with probability ``sampling_prob`` (p). The marginal rate per step is
    ``p0 = 1/(1/p + b - 1)`` (:attr:`participation_rate`); build from a target rate with
    :meth:`from_participation_rate`. ``warm_start=True`` starts every example from the stationary
    state of its availability chain (Alg. 2), so every step has expected batch ``m * p0``.
    ``max_batch_size`` truncates larger batches to a uniform subset and pads smaller ones (App. D;
    a truncated-away example stays barred). ``min_sep=1`` is Poisson; warm start with ``p=1`` is
    balls-in-bins with ``min_sep`` steps per epoch.
    """

    sampling_prob: float
    steps: int
    min_sep: int
    warm_start: bool = False
    max_batch_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sampling_prob", _v.probability("sampling_prob", self.sampling_prob))
        object.__setattr__(self, "steps", _v.positive_int("steps", self.steps))
        object.__setattr__(self, "min_sep", _v.positive_int("min_sep", self.min_sep))
        object.__setattr__(self, "warm_start", bool(self.warm_start))
        if self.max_batch_size is not None:
            object.__setattr__(self, "max_batch_size", _v.positive_int("max_batch_size", self.max_batch_size))

    name = "b-min-sep"

    @classmethod
    def from_participation_rate(cls, rate: float, steps: int, min_sep: int, **kwargs) -> "MinSepSampling":
        """The scheme whose marginal per-step participation probability is ``rate`` (p0)."""
        return cls(sampling_prob_for_rate(rate, min_sep), steps, min_sep, **kwargs)

    @property
    def participation_rate(self) -> float:
        return participation_rate(self.sampling_prob, self.min_sep)

    @property
    def max_participations(self) -> int:
        return -(-self.steps // self.min_sep)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "sampling_prob": self.sampling_prob,
            "participation_rate": self.participation_rate,
            "steps": self.steps,
            "min_sep": self.min_sep,
            "warm_start": self.warm_start,
            "max_batch_size": self.max_batch_size,
        }

    def batches(self, num_examples: int, rng: np.random.Generator | int | None) -> Iterator[np.ndarray]:
        """Yield each step's sorted indices; O(num_examples) state (steps each example stays barred)."""
        n = _v.positive_int("num_examples", num_examples)
        gen = _rng(rng)
        b, p = self.min_sep, self.sampling_prob
        barred = np.zeros(n, dtype=np.int64)  # steps until available again (chain state)
        if self.warm_start and b > 1:
            # stationary law: state 0 w.p. 1/(1+(b-1)p), each state 1..b-1 w.p. p/(1+(b-1)p)
            probs = np.full(b, p / (1 + (b - 1) * p))
            probs[0] = 1.0 / (1 + (b - 1) * p)
            barred = gen.choice(b, size=n, p=probs / probs.sum())
        for _ in range(self.steps):
            avail = np.flatnonzero(barred == 0)
            chosen = avail[gen.random(avail.size) < p]
            barred = np.maximum(barred - 1, 0)
            barred[chosen] = b - 1
            if self.max_batch_size is not None and chosen.size > self.max_batch_size:
                chosen = np.sort(gen.choice(chosen, size=self.max_batch_size, replace=False))
            yield chosen


@dataclass(frozen=True)
class BallsInBinsSampling:
    """Balls-in-bins / random allocation: each example picks one uniform step per epoch, reused.

    With ``b = steps // epochs`` steps per epoch, example e draws ``s_e ~ Uniform{0..b-1}`` once and
    participates at steps ``s_e, b + s_e, ..., (epochs-1) b + s_e`` (exactly ``epochs`` times,
    exactly ``b`` apart). Batch sizes are Multinomial, mean ``num_examples / b``. Accounted by
    :mod:`dpmf.accounting.allocation` (sampling-free) and Monte Carlo.
    """

    epochs: int
    steps: int

    def __post_init__(self) -> None:
        epochs = _v.positive_int("epochs", self.epochs)
        steps = _v.positive_int("steps", self.steps)
        if steps % epochs:
            raise InvalidParameterError(
                f"steps must be a multiple of epochs for balls-in-bins sampling, got steps={steps}, epochs={epochs}"
            )
        object.__setattr__(self, "epochs", epochs)
        object.__setattr__(self, "steps", steps)

    name = "balls-in-bins"

    @property
    def steps_per_epoch(self) -> int:
        return self.steps // self.epochs

    @property
    def min_sep(self) -> int:
        return self.steps_per_epoch

    @property
    def max_participations(self) -> int:
        return self.epochs

    def describe(self) -> dict:
        return {"name": self.name, "epochs": self.epochs, "steps": self.steps}

    def batches(self, num_examples: int, rng: np.random.Generator | int | None) -> Iterator[np.ndarray]:
        """Yield each step's sorted indices (examples grouped once by their random step)."""
        n = _v.positive_int("num_examples", num_examples)
        slot = _rng(rng).integers(0, self.steps_per_epoch, size=n)
        order = np.argsort(slot, kind="stable")
        bounds = np.searchsorted(slot[order], np.arange(self.steps_per_epoch + 1))
        for _ in range(self.epochs):
            for i in range(self.steps_per_epoch):
                yield order[bounds[i] : bounds[i + 1]]


SamplingScheme = (
    PoissonSampling | FixedOrderSampling | CyclicPoissonSampling | MinSepSampling | BallsInBinsSampling
)
SCHEMES = (PoissonSampling, FixedOrderSampling, CyclicPoissonSampling, MinSepSampling, BallsInBinsSampling)
