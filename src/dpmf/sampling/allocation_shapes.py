r"""Fixed batch *shapes* for balls-in-bins sampling, soundly: pad to a public size, never cut.

Random allocation (:class:`~dpmf.sampling.BallsInBinsSampling`) gives random batch sizes: step
``j``'s size is ``Binomial(m, k / b)`` for ``m`` examples, ``k = num_selected`` slots of ``b`` steps
per epoch. Two ways to get fixed shapes, only one of which the accountants cover:

* **Shuffle-then-cut** (a random permutation cut into ``b`` equal batches, what most loaders do)
  is a different mechanism: the slots are no longer independent across examples, and under
  zero-out adjacency with adversarial other gradients the other examples' positions reveal the
  target's slot. The random-allocation analyses assume independent slots, so they do **not**
  cover it; dpmf does not offer it under this scheme.
* **Padding** (here): the batch keeps exactly the examples the scheme drew and is filled up to a
  public ``batch_size`` with entries of weight 0 (:func:`dpmf.sampling.padding.padded_batch`). A
  zero-weight entry adds nothing to the clipped sum, so the released ``C x + z`` -- hence every privacy
  accounting of the scheme -- is unchanged.

**Remainders.** ``m k`` is rarely a multiple of ``b``, and sizes fluctuate anyway: a batch smaller
than ``batch_size`` is padded. A batch *larger* than ``batch_size`` is never truncated (dropping
examples changes the mechanism and would need its own analysis): :func:`fixed_shape_batches`
raises :class:`BatchOverflowError` before the first step of the epoch whose allocation overflows,
naming the probability of that event. Choose ``batch_size`` with :func:`padded_batch_size` so that
this probability ``eta`` is negligible. The only thing an overflow can reveal is that it happened
(the run stops before any output of that epoch); including that bit, the run is
``(epsilon, delta + (1 + e^epsilon) eta)``-DP whenever the unstopped run is ``(epsilon, delta)``-DP
(the two runs differ only on an event of probability ``<= eta`` under either dataset -- couple them
-- so ``P(S) <= P'(S) + eta`` on both sides of the ``(epsilon, delta)`` inequality). ``eta`` is computed
at ``m + 1`` examples, the larger of the dataset and a neighbour, so it bounds both.

``eta`` (:func:`overflow_probability`) is a union bound over the steps whose batches are drawn
independently (``b`` for reused slots, ``epochs * b`` for fresh ones) of the binomial tail
``P(Binomial(m + 1, k/b) > batch_size)``, rounded up.
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np
from scipy import stats

from dpmf import validation as _v
from dpmf.errors import DPMFError, InvalidParameterError
from dpmf.sampling.padding import padded_batch
from dpmf.sampling.schemes import BallsInBinsSampling

__all__ = ["BatchOverflowError", "overflow_probability", "padded_batch_size", "fixed_shape_batches"]


class BatchOverflowError(DPMFError):
    """A balls-in-bins batch has more examples than the fixed ``batch_size`` (module docstring)."""


def _check(scheme, num_examples: int) -> tuple[int, int]:
    if not isinstance(scheme, BallsInBinsSampling):
        raise InvalidParameterError(
            f"fixed-shape batches are provided for BallsInBinsSampling, got {type(scheme).__name__}"
        )
    draws = scheme.steps_per_epoch * (scheme.epochs if scheme.fresh_slots else 1)
    return _v.positive_int("num_examples", num_examples), draws


def overflow_probability(scheme: BallsInBinsSampling, num_examples: int, batch_size: int) -> float:
    """Upper bound on ``P(some batch of the run has more than batch_size examples)`` (module docstring):
    ``min(1, draws * P(Binomial(m + 1, k / b) > batch_size))``, ``draws`` the independently drawn steps.

    >>> from dpmf.sampling import BallsInBinsSampling
    >>> s = BallsInBinsSampling(epochs=10, steps=230, fresh_slots=True)   # 23 steps per epoch
    >>> overflow_probability(s, 1437, 63) == 1.0                         # the mean is 62.5
    True
    >>> overflow_probability(s, 1437, 122) < 1e-9
    True
    """
    m, draws = _check(scheme, num_examples)
    size = _v.positive_int("batch_size", batch_size)
    # at m + 1 examples: the tail grows with m, so this bounds the dataset and its neighbours
    tail = float(stats.binom.sf(size, m + 1, scheme.num_selected / scheme.steps_per_epoch))
    return min(1.0, draws * tail * (1 + 1e-6))  # (margin over the tail's float rounding)


def padded_batch_size(scheme: BallsInBinsSampling, num_examples: int, overflow_prob: float = 1e-12) -> int:
    """The smallest ``batch_size`` with :func:`overflow_probability` ``<= overflow_prob`` (public: it
    depends only on the scheme and the dataset size)."""
    m, _ = _check(scheme, num_examples)
    eta = _v.probability("overflow_prob", overflow_prob)
    lo, hi = 1, m + 1  # overflow_probability(.., m + 1) == 0 (a neighbour has at most m + 1 examples)
    while lo < hi:
        mid = (lo + hi) // 2
        if overflow_probability(scheme, m, mid) <= eta:
            hi = mid
        else:
            lo = mid + 1
    return lo


def fixed_shape_batches(
    scheme: BallsInBinsSampling, num_examples: int, rng: np.random.Generator | int | None, batch_size: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(indices, weights)`` of length ``batch_size`` for each batch of ``scheme.batches(num_examples, rng)``.

    The examples of every batch are exactly the scheme's (same order, same stream for a seed) with
    weight 1, then ``batch_size - size`` copies of example 0 with weight 0 (:func:`padded_batch`). Each epoch's batches are checked before its first one
    is yielded; a batch above ``batch_size`` raises :class:`BatchOverflowError` (never truncated).

    >>> from dpmf.sampling import BallsInBinsSampling
    >>> s = BallsInBinsSampling(epochs=2, steps=4)
    >>> idx, w = list(fixed_shape_batches(s, 6, 3, batch_size=4))[1]
    >>> idx.tolist(), w.tolist()
    ([0, 5, 0, 0], [1.0, 1.0, 0.0, 0.0])
    """
    m, _ = _check(scheme, num_examples)
    size = _v.positive_int("batch_size", batch_size)
    b = scheme.steps_per_epoch
    stream = scheme.batches(m, rng)
    for epoch in range(scheme.epochs):
        batches = [next(stream) for _ in range(b)]
        big = max(range(b), key=lambda i: batches[i].size)
        if batches[big].size > size:
            eta = overflow_probability(scheme, m, size)
            raise BatchOverflowError(
                f"batch_size={size} is too small: step {epoch * b + big} of this run drew {batches[big].size} "
                f"examples (the run stops before any step of epoch {epoch}; batches are padded, never cut, "
                f"since cutting changes the mechanism). Such an overflow had probability <= {eta:.3g}; use "
                f"batch_size >= padded_batch_size(scheme, {m}) = {padded_batch_size(scheme, m)} "
                "(overflow probability <= 1e-12)"
            )
        for batch in batches:
            yield padded_batch(batch, size)
