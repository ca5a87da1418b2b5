"""Sampling schemes: batches reproducible from a seed, Poisson inclusion frequency ~ q
(statistical tests with fixed seeds and tolerances that would catch a wrong q or a biased
sampler), fixed order = each example exactly `epochs` times, same order, min_sep apart."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpmf.errors import InvalidParameterError
from dpmf.sampling import FixedOrderSampling, PoissonSampling


def participation_counts(batches, n: int) -> np.ndarray:
    counts = np.zeros(n, dtype=np.int64)
    for b in batches:
        counts[b] += 1
    return counts


# ----------------------------------------------------------------------------- Poisson
def test_poisson_reproducible_from_seed():
    scheme = PoissonSampling(0.05, 50)
    a = list(scheme.batches(500, 123))
    b = list(scheme.batches(500, 123))
    c = list(scheme.batches(500, np.random.default_rng(123)))
    assert len(a) == 50
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert all(np.array_equal(x, y) for x, y in zip(a, c))
    d = list(scheme.batches(500, 124))
    assert not all(np.array_equal(x, y) for x, y in zip(a, d))


def test_poisson_batches_are_valid_index_sets():
    for batch in PoissonSampling(0.3, 20).batches(100, 0):
        assert batch.dtype.kind in "iu"
        assert np.all(np.diff(batch) > 0)  # sorted, no repeats
        assert batch.size == 0 or (batch[0] >= 0 and batch[-1] < 100)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("q", [0.01, 0.2])
def test_poisson_inclusion_frequency_is_q(seed, q):
    n, steps = 2000, 250
    counts = participation_counts(PoissonSampling(q, steps).batches(n, seed), n)
    # total inclusions ~ Binomial(n * steps, q): within 5 standard deviations (a 10% error in q
    # is > 15 sd here for q = 0.2 and > 7 sd for q = 0.01)
    total, trials = counts.sum(), n * steps
    sd = math.sqrt(trials * q * (1 - q))
    assert abs(total - trials * q) < 5 * sd
    # every example has the same inclusion probability, independently over steps: the per-example
    # counts are Binomial(steps, q). A dispersion (chi-square) test with both tails at 1e-6 catches
    # samplers that favour some examples (too dispersed) or rotate through them (too even).
    var = steps * q * (1 - q)
    chi2 = float(np.sum((counts - steps * q) ** 2) / var)
    assert stats.chi2.sf(chi2, df=n) > 1e-6
    assert stats.chi2.cdf(chi2, df=n) > 1e-6
    # batch sizes ~ Binomial(n, q)
    sizes = np.array([b.size for b in PoissonSampling(q, steps).batches(n, seed)])
    assert abs(sizes.mean() - n * q) < 5 * math.sqrt(n * q * (1 - q) / steps)


def test_poisson_probability_one_takes_everyone():
    for batch in PoissonSampling(1.0, 3).batches(17, 5):
        assert np.array_equal(batch, np.arange(17))


# --------------------------------------------------------------------------- fixed order
@pytest.mark.parametrize("n,epochs,steps", [(100, 4, 40), (103, 3, 30), (7, 2, 14), (50, 1, 5)])
def test_fixed_order_participation(n, epochs, steps):
    scheme = FixedOrderSampling(epochs, steps)
    batches = list(scheme.batches(n, 42))
    assert len(batches) == steps
    per_epoch = steps // epochs
    assert scheme.steps_per_epoch == scheme.min_sep == per_epoch
    assert scheme.max_participations == epochs
    # each example exactly `epochs` times
    np.testing.assert_array_equal(participation_counts(batches, n), np.full(n, epochs))
    # each epoch is a partition of the data, in the same order every epoch
    for e in range(epochs):
        epoch = batches[e * per_epoch : (e + 1) * per_epoch]
        np.testing.assert_array_equal(np.sort(np.concatenate(epoch)), np.arange(n))
        for i in range(per_epoch):
            np.testing.assert_array_equal(epoch[i], batches[i])
    # near-equal batch sizes
    sizes = [b.size for b in batches]
    assert max(sizes) - min(sizes) <= 1
    # every example's participations are exactly steps / epochs apart
    steps_of = [[] for _ in range(n)]
    for t, b in enumerate(batches):
        for i in b:
            steps_of[i].append(t)
    for ts in steps_of:
        assert np.all(np.diff(ts) == per_epoch)


def test_fixed_order_reproducible_and_shuffled():
    scheme = FixedOrderSampling(2, 10)
    a = list(scheme.batches(100, 9))
    b = list(scheme.batches(100, np.random.default_rng(9)))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = list(scheme.batches(100, 10))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    # shuffled: the first batch is not simply the first 10 indices
    assert not np.array_equal(a[0], np.arange(10))


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("scheme", [PoissonSampling(0.1, 5), FixedOrderSampling(1, 5)])
def test_rng_none_raises(scheme):
    with pytest.raises(InvalidParameterError, match="rng"):
        list(scheme.batches(10, None))


@pytest.mark.parametrize(
    "make",
    [
        lambda: PoissonSampling(0.0, 10),
        lambda: PoissonSampling(1.5, 10),
        lambda: PoissonSampling(-0.1, 10),
        lambda: PoissonSampling(float("nan"), 10),
        lambda: PoissonSampling("0.1", 10),
        lambda: PoissonSampling(0.1, 0),
        lambda: PoissonSampling(0.1, 2.5),
        lambda: PoissonSampling(0.1, True),
        lambda: FixedOrderSampling(0, 10),
        lambda: FixedOrderSampling(3, 10),  # steps not a multiple of epochs
        lambda: FixedOrderSampling(2, -4),
        lambda: FixedOrderSampling(1.5, 3),
    ],
)
def test_bad_parameters_raise(make):
    with pytest.raises(InvalidParameterError):
        make()


def test_bad_num_examples_raise():
    with pytest.raises(InvalidParameterError, match="num_examples"):
        list(PoissonSampling(0.1, 5).batches(0, 1))
    with pytest.raises(InvalidParameterError, match="num_examples"):
        list(FixedOrderSampling(1, 5).batches(4, 1))  # fewer examples than batches per epoch


def test_error_messages_name_the_argument():
    with pytest.raises(InvalidParameterError, match="sampling_prob"):
        PoissonSampling(2.0, 10)
    with pytest.raises(InvalidParameterError, match="epochs"):
        FixedOrderSampling(3, 10)
