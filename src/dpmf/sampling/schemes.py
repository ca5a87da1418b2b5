"""Sampling schemes: one object that both generates batches and tells the accountant what it did.

A scheme is a frozen, validated spec. ``batches(num_examples, rng)`` streams the batch of every
step (arrays of example indices) without materializing an examples x steps matrix; the
accountants in :mod:`dpmf.accounting` read the same object, so a sampler and its accounting cannot
disagree (DESIGN.md).
"""

from __future__ import annotations

import warnings

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from dpmf import validation as _v
from dpmf.errors import DPMFWarning, InvalidParameterError


def _validate(spec, **checks) -> None:
    """Replace each named field of a frozen spec by ``check(name, value)`` (validated, normalized)."""
    for name, check in checks.items():
        object.__setattr__(spec, name, check(name, getattr(spec, name)))


def _separation_within_run(name: str, value: int, steps: int) -> None:
    """A separation (or cycle) longer than the run is allowed (every example joins at most once,
    some groups never) but is almost always a mix-up of options: say so, never silently."""
    if value > steps:
        warnings.warn(
            f"{name}={value} is longer than the run (steps={steps}): every example joins at most once"
            + (" and some groups never" if name == "cycle_length" else "") + " (did you swap them?)",
            DPMFWarning,
            stacklevel=4,
        )


def _num_examples(num_examples: object, copies: int = 4) -> int:
    """``num_examples`` validated, and the samplers' per-example arrays (a permutation, the chain
    state, the slots: a few int64 vectors of that length) checked to fit in memory first
    (:func:`dpmf.resources.check_allocation`), before numpy's ``MemoryError``."""
    from dpmf.resources import check_allocation

    n = _v.positive_int("num_examples", num_examples)
    check_allocation(1, n, "drawing batches", copies=copies,
                     hint="use fewer num_examples (the dataset's size: the samplers keep a few int64 per example)")
    return n


def as_generator(rng: np.random.Generator | int | None) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        raise InvalidParameterError(
            "rng must be a numpy.random.Generator or an integer seed (dpmf never draws hidden seeds)"
        )
    if isinstance(rng, (np.random.SeedSequence, np.random.BitGenerator)):
        return np.random.default_rng(rng)
    if isinstance(rng, (bool, np.bool_)) or not isinstance(rng, (int, np.integer)) or rng < 0:
        raise InvalidParameterError(
            f"rng must be a numpy.random.Generator or an integer seed >= 0 (dpmf never draws hidden seeds), "
            f"got {rng!r}"
        )
    return np.random.default_rng(int(rng))


def _validate_truncation(spec) -> None:
    """Validate the optional ``max_batch_size`` / ``dataset_size`` fields of a truncatable scheme."""
    for name in ("max_batch_size", "dataset_size"):
        if getattr(spec, name) is not None:
            _validate(spec, **{name: _v.positive_int})


def _truncation_fields(spec) -> dict:
    """``describe()`` entries of the truncation fields, present only when set (so descriptions of
    untruncated Poisson / cyclic Poisson schemes, and their fingerprints, are unchanged)."""
    return {k: getattr(spec, k) for k in ("max_batch_size", "dataset_size") if getattr(spec, k) is not None}


def _check_dataset_size(spec, n: int) -> None:
    if spec.dataset_size is not None and n != spec.dataset_size:
        raise InvalidParameterError(
            f"num_examples={n} differs from the scheme's dataset_size={spec.dataset_size}, which its "
            "truncation accounting assumes"
        )


def _truncate(chosen: np.ndarray, max_batch_size: int | None, gen: np.random.Generator) -> np.ndarray:
    """``chosen`` cut to a uniformly random subset of ``max_batch_size`` (sorted) when larger
    (Chua et al. 2024; Dong & Ganesh 2026 App. D); no random draw when it fits, so the streams of
    untruncated batches are the same as without a maximum."""
    if max_batch_size is not None and chosen.size > max_batch_size:
        return np.sort(gen.choice(chosen, size=max_batch_size, replace=False))
    return chosen


@dataclass(frozen=True)
class PoissonSampling:
    """Every example joins every step independently with probability ``sampling_prob``.

    Mirrors jax_privacy's ``CyclicPoissonSampling(cycle_length=1)`` and opacus' uniform sampler.
    An example can participate in any number of steps (up to ``steps``).

    ``max_batch_size`` (truncated Poisson, Chua et al. 2024): a batch larger than the maximum is
    cut to a uniformly random subset of that size; every batch is then *padded* to exactly
    ``max_batch_size`` with zero-weight examples. :meth:`batches` yields the real indices only
    (at most ``max_batch_size``); the padding is ``max_batch_size - len(batch)`` zero-weight slots
    (:func:`dpmf.sampling.padded_batch` builds the fixed-shape indices and weights), which add
    nothing to a gradient sum, as for truncated b-min-sep. Accounting a truncated scheme needs the
    public ``dataset_size`` (zero-out adjacency): :mod:`dpmf.accounting.truncated`.
    """

    sampling_prob: float
    steps: int
    max_batch_size: int | None = None
    dataset_size: int | None = None

    def __post_init__(self) -> None:
        _validate(self, sampling_prob=_v.probability, steps=_v.positive_int)
        _validate_truncation(self)

    name = "poisson"

    def describe(self) -> dict:
        return {"name": self.name, "sampling_prob": self.sampling_prob, "steps": self.steps, **_truncation_fields(self)}

    def batches(self, num_examples: int, rng: np.random.Generator | int | None) -> Iterator[np.ndarray]:
        """Yield the sorted example indices of each step (size ~ Binomial(num_examples, q), then
        truncated to ``max_batch_size`` by a uniform subset when it is set)."""
        n = _num_examples(num_examples)
        _check_dataset_size(self, n)
        gen = as_generator(rng)
        for _ in range(self.steps):
            size = int(gen.binomial(n, self.sampling_prob))
            yield _truncate(np.sort(gen.choice(n, size=size, replace=False)), self.max_batch_size, gen)


@dataclass(frozen=True)
class _EpochScheme:
    """Shared spec of the epoch-based schemes: ``epochs`` passes of ``steps // epochs`` steps.

    Every example participates exactly ``epochs`` times, exactly ``steps_per_epoch`` steps apart.
    """

    epochs: int
    steps: int

    name = "epochs"

    def __post_init__(self) -> None:
        epochs = _v.positive_int("epochs", self.epochs)
        steps = _v.positive_int("steps", self.steps)
        if steps % epochs:
            raise InvalidParameterError(
                f"steps must be a multiple of epochs for {self.name} sampling, got steps={steps}, epochs={epochs}"
            )
        object.__setattr__(self, "epochs", epochs)
        object.__setattr__(self, "steps", steps)

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


@dataclass(frozen=True)
class FixedOrderSampling(_EpochScheme):
    """Shuffle once, then use the same order every epoch (k epochs of ``steps // epochs`` batches).

    Each example participates exactly ``epochs`` times, exactly ``steps // epochs`` steps apart:
    the (k, b) fixed-epoch participation of the multi-epoch MF paper, with ``min_sep = b``.
    There is no amplification: accounting is for the worst-case example.
    """

    name = "fixed-order"

    def batches(self, num_examples: int, rng: np.random.Generator | int | None) -> Iterator[np.ndarray]:
        """Yield each step's indices: one shuffle, split into ``steps_per_epoch`` near-equal batches."""
        n = _num_examples(num_examples)
        if n < self.steps_per_epoch:
            raise InvalidParameterError(
                f"num_examples must be >= steps per epoch ({self.steps_per_epoch}), got {n}"
            )
        order = as_generator(rng).permutation(n)
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
    ``cycle_length=1`` is :class:`PoissonSampling`. Mirrors jax_privacy's ``CyclicPoissonSampling``
    (``truncated_batch_size`` there is ``max_batch_size`` here).

    ``max_batch_size``: truncated and padded cyclic Poisson (Chua et al. 2024; the production
    baseline of Dong & Ganesh 2026 Sec. 7.4), exactly as for :class:`PoissonSampling`: a larger
    batch is cut to a uniform subset, :meth:`batches` yields the real indices and the padding is
    ``max_batch_size - len(batch)`` zero-weight slots. Accounting needs ``dataset_size``.
    """

    sampling_prob: float
    steps: int
    cycle_length: int
    partition: str = "equal"
    max_batch_size: int | None = None
    dataset_size: int | None = None

    def __post_init__(self) -> None:
        _validate(self, sampling_prob=_v.probability, steps=_v.positive_int, cycle_length=_v.positive_int)
        _validate_truncation(self)
        _separation_within_run("cycle_length", self.cycle_length, self.steps)
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
            **_truncation_fields(self),
        }

    def groups(self, num_examples: int, rng: np.random.Generator | int | None) -> np.ndarray:
        """Group (phase) of every example, in ``0..cycle_length-1``."""
        n = _num_examples(num_examples)
        gen = as_generator(rng)
        b = self.cycle_length
        if self.partition == "independent":
            return gen.integers(0, b, size=n)
        if n < b:
            raise InvalidParameterError(f"num_examples must be >= cycle_length ({b}), got {n}")
        group = np.empty(n, dtype=np.int64)
        group[gen.permutation(n)] = np.arange(n) * b // n
        return group

    def batches(self, num_examples: int, rng: np.random.Generator | int | None) -> Iterator[np.ndarray]:
        """Yield the sorted example indices of each step (truncated to ``max_batch_size`` by a
        uniform subset when it is set)."""
        _check_dataset_size(self, _num_examples(num_examples))
        gen = as_generator(rng)
        group = self.groups(num_examples, gen)
        members = [np.flatnonzero(group == g) for g in range(self.cycle_length)]
        for t in range(self.steps):
            pool = members[t % self.cycle_length]
            yield _truncate(pool[gen.random(pool.size) < self.sampling_prob], self.max_batch_size, gen)


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
    a truncated-away example stays barred); accounting truncated batches needs ``dataset_size``
    (the number of examples m). ``min_sep=1`` is Poisson; warm start with ``p=1`` is
    balls-in-bins with ``min_sep`` steps per epoch.
    """

    sampling_prob: float
    steps: int
    min_sep: int
    warm_start: bool = False
    max_batch_size: int | None = None
    dataset_size: int | None = None

    def __post_init__(self) -> None:
        _validate(self, sampling_prob=_v.probability, steps=_v.positive_int, min_sep=_v.positive_int)
        _separation_within_run("min_sep", self.min_sep, self.steps)
        object.__setattr__(self, "warm_start", bool(self.warm_start))
        _validate_truncation(self)

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
            "dataset_size": self.dataset_size,
        }

    def batches(self, num_examples: int, rng: np.random.Generator | int | None) -> Iterator[np.ndarray]:
        """Yield each step's sorted indices; O(num_examples) state (steps each example stays barred)."""
        n = _num_examples(num_examples)
        gen = as_generator(rng)
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
            yield _truncate(chosen, self.max_batch_size, gen)


@dataclass(frozen=True)
class BallsInBinsSampling(_EpochScheme):
    """Balls-in-bins / random allocation: each example joins ``num_selected`` uniform steps per epoch.

    With ``b = steps // epochs`` steps per epoch and ``k = num_selected`` (``1 <= k <= b``), example
    ``e`` draws a uniformly random set ``S_e`` of ``k`` distinct steps of ``{0..b-1}``, independently
    of every other example (Feldman & Shenfeld's random allocation; ``k`` is the peers'
    ``num_selected``):

    * ``fresh_slots=False`` (the default): ``S_e`` is drawn once and reused, so ``e`` joins steps
      ``S_e, b + S_e, ..., (epochs-1) b + S_e``. With ``k = 1`` every two participations are
      exactly ``b`` apart (``min_sep = b``): the (k, b) participation that multi-epoch matrix
      factorization needs.
    * ``fresh_slots=True``: a fresh independent ``S_e`` every epoch (the allocation of epoch ``j``
      is independent of the others), so participations in consecutive epochs can be adjacent steps
      (``min_sep = 1``: no separation across epochs). For DP-SGD this is the ``epochs``-fold
      composition of one epoch, far tighter than reusing the slot over many epochs (which is one
      epoch at ``sigma / sqrt(epochs)``, :mod:`dpmf.accounting.reductions`).

    Every example joins exactly ``epochs * k`` steps (:attr:`max_participations`). Batch sizes are
    random: step ``j``'s size is ``Binomial(num_examples, k / b)`` (Multinomial jointly for
    ``k = 1``), mean ``num_examples * k / b``. Fixed *shapes* come from padding every batch to a
    public size with zero-weight examples (:mod:`dpmf.sampling.padding`): padding does not change
    the clipped sum, hence not the mechanism. Cutting a shuffled permutation into equal batches is
    a *different* mechanism (the others' positions reveal the target's slot under zero-out
    adjacency) and is not what this scheme or its accountants describe.

    Draws (:meth:`batches`): slots of all examples for an epoch as one ``(m, k)`` array (Floyd's
    algorithm vectorized over examples, so every ``k``-subset is equally likely); ``k = 1`` is one
    ``integers(0, b, m)`` call, the same stream as before ``num_selected`` existed. Accounted by
    :mod:`dpmf.accounting.allocation` (identity: every variant; correlated ``C``: the reused single
    slot), Monte Carlo where the participation patterns can be enumerated, and the unamplified
    Gaussian mechanism.
    """

    num_selected: int = 1
    fresh_slots: bool = False

    name = "balls-in-bins"

    def __post_init__(self) -> None:
        super().__post_init__()
        k = self.num_selected
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= int(k) <= self.steps_per_epoch:
            raise InvalidParameterError(
                f"num_selected must be an integer in [1, steps per epoch = {self.steps_per_epoch}] (the number "
                f"of distinct steps each example joins per epoch), got {k!r}"
            )
        object.__setattr__(self, "num_selected", int(k))
        if not isinstance(self.fresh_slots, (bool, np.bool_)):
            raise InvalidParameterError(
                f"fresh_slots must be True (a new random allocation every epoch) or False (the slots of the "
                f"first epoch reused in every epoch), got {self.fresh_slots!r}"
            )
        object.__setattr__(self, "fresh_slots", bool(self.fresh_slots))

    @property
    def reused_single_slot(self) -> bool:
        """Whether this is the classic scheme (one slot, reused): ``num_selected == 1`` and not fresh
        (or one epoch, where fresh and reused slots are the same mechanism)."""
        return self.num_selected == 1 and (not self.fresh_slots or self.epochs == 1)

    @property
    def min_sep(self) -> int:
        """The fewest steps between two participations of one example that the scheme guarantees:
        ``b`` for one reused slot, else 1 (``k > 1`` slots may be adjacent; fresh slots of two
        consecutive epochs may be the last step of one and the first of the next)."""
        return self.steps_per_epoch if self.reused_single_slot else 1

    @property
    def max_participations(self) -> int:
        """Steps each example joins: exactly ``epochs * num_selected``."""
        return self.epochs * self.num_selected

    def describe(self) -> dict:
        return {**super().describe(), "num_selected": self.num_selected, "fresh_slots": self.fresh_slots}

    def slots(self, num_examples: int, rng: np.random.Generator | int | None) -> Iterator[np.ndarray]:
        """Yield, for each epoch, the ``(num_examples, num_selected)`` array of every example's steps
        within the epoch (distinct, in ``0..b-1``; reused arrays are the same object every epoch)."""
        n = _num_examples(num_examples, copies=4 * self.num_selected)
        gen = as_generator(rng)
        current = None
        for _ in range(self.epochs):
            if current is None or self.fresh_slots:
                current = _distinct_slots(gen, n, self.num_selected, self.steps_per_epoch)
            yield current

    def batches(self, num_examples: int, rng: np.random.Generator | int | None) -> Iterator[np.ndarray]:
        """Yield each step's sorted indices (examples grouped by their steps in each epoch)."""
        b, k = self.steps_per_epoch, self.num_selected
        grouped = None
        last = None
        for slot in self.slots(num_examples, rng):
            if slot is not last:
                last = slot
                flat = slot.ravel()
                owner = np.repeat(np.arange(slot.shape[0]), k)  # example of each (example, slot) pair
                order = np.argsort(flat, kind="stable")  # stable: examples ascending within a step
                bounds = np.searchsorted(flat[order], np.arange(b + 1))
                grouped = owner[order]
            for i in range(b):
                yield grouped[bounds[i] : bounds[i + 1]]


def _distinct_slots(gen: np.random.Generator, n: int, k: int, b: int) -> np.ndarray:
    """``(n, k)`` uniformly random ``k``-subsets of ``{0..b-1}``, one per row, independent rows.

    Floyd's algorithm, vectorized over rows: for ``j = b-k .. b-1`` draw ``r ~ U{0..j}`` and keep
    ``r`` unless a previous draw of the row took it, then keep ``j``. Every ``k``-subset has
    probability ``1 / C(b, k)`` (Bentley & Floyd 1987). Time ``O(n k^2)``; ``k = 1`` is one
    ``gen.integers(0, b, n)`` call."""
    out = np.empty((n, k), dtype=np.int64)
    for c, j in enumerate(range(b - k, b)):
        r = gen.integers(0, j + 1, size=n)
        if c:
            taken = np.any(out[:, :c] == r[:, None], axis=1)
            r = np.where(taken, j, r)
        out[:, c] = r
    return out


def _gather(ptr: np.ndarray, data: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Concatenation of the CSR rows ``data[ptr[r]:ptr[r+1]]`` for ``r`` in ``rows`` (vectorized)."""
    starts, lens = ptr[rows], ptr[rows + 1] - ptr[rows]
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=data.dtype)
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
    return data[offsets + np.arange(total)]


@dataclass(frozen=True, eq=False)
class Attribution:
    """Examples <-> users incidence (fixed-graph adjacency, Dong & Ganesh 2026 Sec. 6) in CSR form.

    Build with :meth:`from_user_sets` from one iterable of (hashable) user ids per example.
    """

    example_ptr: np.ndarray  # example e's users: user_of[example_ptr[e]:example_ptr[e+1]]
    user_of: np.ndarray
    user_ptr: np.ndarray  # user u's examples: example_of[user_ptr[u]:user_ptr[u+1]]
    example_of: np.ndarray
    user_ids: tuple

    @classmethod
    def from_user_sets(cls, user_sets) -> "Attribution":
        ids: dict = {}
        ptr, users = [0], []
        for e, us in enumerate(user_sets):
            try:
                mapped = sorted({ids.setdefault(u, len(ids)) for u in us})
            except TypeError:
                raise InvalidParameterError(
                    f"attribution[{e}] must be an iterable of hashable user ids, got {us!r}"
                ) from None
            if not mapped:
                raise InvalidParameterError(
                    f"attribution[{e}] has no user: every example must be attributed to at least one user"
                )
            users.extend(mapped)
            ptr.append(len(users))
        if len(ptr) == 1:
            raise InvalidParameterError("attribution must list the users of at least one example")
        example_ptr = np.asarray(ptr, dtype=np.int64)
        user_of = np.asarray(users, dtype=np.int64)
        example_idx = np.repeat(np.arange(len(ptr) - 1), np.diff(example_ptr))
        order = np.argsort(user_of, kind="stable")
        counts = np.bincount(user_of, minlength=len(ids))
        user_ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return cls(example_ptr, user_of, user_ptr, example_idx[order], tuple(ids))

    @property
    def num_examples(self) -> int:
        return self.example_ptr.size - 1

    @property
    def num_users(self) -> int:
        return self.user_ptr.size - 1

    def examples_per_user(self) -> np.ndarray:
        return np.diff(self.user_ptr)

    def neighbourhood(self, examples: np.ndarray) -> np.ndarray:
        """``N(S)``: every example sharing a user with an example of ``examples`` (S included)."""
        examples = np.asarray(examples, dtype=np.int64)
        if examples.size == 0:
            return examples
        users = np.unique(_gather(self.example_ptr, self.user_of, examples))
        return np.unique(_gather(self.user_ptr, self.example_of, users))


@dataclass(frozen=True)
class MultiAttributionMinSepSampling:
    """Multi-attribution b-min-sep sampling (Dong & Ganesh 2026, Sec. 6.1, Algorithm 3).

    Each example may belong to several users (fixed-graph adjacency: neighbouring datasets differ
    in *all* examples of one user). Every step ``i`` draws an *interim sample* ``S_i`` from **all**
    examples, each independently with probability ``sampling_prob`` (p); the batch is
    ``B_i = S_i \\ D_exclude_i`` where ``D_exclude_i`` is the union of the user-sharing
    neighbourhoods ``N(e)`` (e included) of every ``e`` in the interim samples ``S_j`` of the
    previous ``min_sep - 1`` steps. Exclusion uses the interim samples, not the batches (Alg. 4,
    which blocks on batches, is only conjectured private: Conjecture 6.2). Hence each *user*
    participates at most once in any ``min_sep`` consecutive steps.

    ``max_user_examples`` (k_u) caps every user's examples: bound them first with
    :func:`~dpmf.sampling.bound_contributions` (its ``.scheme(...)`` builds this scheme for the
    bounded graph); :meth:`batches` refuses an attribution that violates the cap. Accounting (Thm. 6.1)
    uses the cold-start pair with ``x_i ~ Binom(k_u, p)``; ``warmup_steps`` batches are generated
    and discarded first (the paper's warm start: 2000 generated, last 1000 used), which cold-start
    accounting dominates; :func:`~dpmf.sampling.calibrate_sampling_prob` finds ``p`` for a target
    expected batch after it. ``min_sep = 1`` is Poisson sampling of examples.
    """

    sampling_prob: float
    steps: int
    min_sep: int
    max_user_examples: int
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        _validate(
            self,
            sampling_prob=_v.probability,
            steps=_v.positive_int,
            min_sep=_v.positive_int,
            max_user_examples=_v.positive_int,
        )
        _separation_within_run("min_sep", self.min_sep, self.steps)
        w = self.warmup_steps
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or int(w) < 0:
            raise InvalidParameterError(f"warmup_steps must be an integer >= 0, got {w!r}")
        object.__setattr__(self, "warmup_steps", int(w))

    name = "multi-attribution-b-min-sep"

    @property
    def max_participations(self) -> int:
        """Steps in which one user can participate: ``ceil(steps / min_sep)``."""
        return -(-self.steps // self.min_sep)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "sampling_prob": self.sampling_prob,
            "steps": self.steps,
            "min_sep": self.min_sep,
            "max_user_examples": self.max_user_examples,
            "warmup_steps": self.warmup_steps,
        }

    def attribution(self, user_sets) -> Attribution:
        """Validated :class:`Attribution` (every user has at most ``max_user_examples`` examples)."""
        att = user_sets if isinstance(user_sets, Attribution) else Attribution.from_user_sets(user_sets)
        per_user = att.examples_per_user()
        if per_user.size and per_user.max() > self.max_user_examples:
            u = int(np.argmax(per_user))
            raise InvalidParameterError(
                f"user {att.user_ids[u]!r} has {int(per_user[u])} examples but max_user_examples="
                f"{self.max_user_examples}; bound each user's contribution first (e.g. drop examples)"
            )
        return att

    def batches(self, attribution, rng: np.random.Generator | int | None) -> Iterator[np.ndarray]:
        """Yield each step's sorted example indices (Alg. 3); ``attribution[e]`` = users of example e.

        State is O(examples + attribution size): the number of steps each example stays excluded.
        """
        att = self.attribution(attribution)
        gen = as_generator(rng)
        m, p, b = att.num_examples, self.sampling_prob, self.min_sep
        barred = np.zeros(m, dtype=np.int64)
        for step in range(self.warmup_steps + self.steps):
            interim = np.flatnonzero(gen.random(m) < p)  # S_i over all of D
            batch = interim[barred[interim] == 0]
            barred = np.maximum(barred - 1, 0)
            if b > 1 and interim.size:
                barred[att.neighbourhood(interim)] = b - 1
            if step >= self.warmup_steps:
                yield batch


SamplingScheme = (
    PoissonSampling
    | FixedOrderSampling
    | CyclicPoissonSampling
    | MinSepSampling
    | BallsInBinsSampling
    | MultiAttributionMinSepSampling
)
SCHEMES = (
    PoissonSampling,
    FixedOrderSampling,
    CyclicPoissonSampling,
    MinSepSampling,
    BallsInBinsSampling,
    MultiAttributionMinSepSampling,
)
