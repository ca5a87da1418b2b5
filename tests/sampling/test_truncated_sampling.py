"""Truncated (and padded) Poisson / cyclic Poisson samplers (issue 22 item 3)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from dpmf.errors import DPMFError
from dpmf.sampling import CyclicPoissonSampling, PoissonSampling, padded_batch, scheme_from_dict


def _schemes(B, m=40):
    return [
        PoissonSampling(0.3, 30, max_batch_size=B, dataset_size=m),
        CyclicPoissonSampling(0.9, 30, 4, max_batch_size=B, dataset_size=m),
        CyclicPoissonSampling(0.9, 30, 4, partition="independent", max_batch_size=B),
    ]


@pytest.mark.parametrize("B", [1, 3, 8])
def test_never_exceed_and_pad_exactly(B):
    for scheme in _schemes(B):
        sizes = []
        for seed in range(5):
            for batch in scheme.batches(40, seed):
                assert batch.size <= B
                assert np.all(np.diff(batch) > 0)  # sorted, distinct
                idx, w = padded_batch(batch, B)
                assert idx.shape == w.shape == (B,)
                assert w.sum() == batch.size and np.array_equal(idx[: batch.size], batch)
                sizes.append(batch.size)
        assert max(sizes) == B  # truncation happened (the means are far above B)


def test_truncation_is_uniform():
    # q = 1: every step samples all 5 examples, so each batch is the uniform 2-subset of the truncation
    m, B, steps = 5, 2, 6_000
    for scheme in (PoissonSampling(1.0, steps, max_batch_size=B), CyclicPoissonSampling(1.0, steps, 1, max_batch_size=B)):
        counts = {s: 0 for s in itertools.combinations(range(m), B)}
        for batch in scheme.batches(m, 7):
            counts[tuple(batch.tolist())] += 1
        observed = np.array(list(counts.values()))
        assert observed.sum() == steps
        p = stats.chisquare(observed).pvalue  # H0: all C(5, 2) = 10 subsets equally likely
        assert p > 1e-3, (scheme, observed)


def test_truncation_probability_matches_binomial():
    """The empirical frequency of a truncated step agrees with P[Binomial(m, q) > B]."""
    m, q, B, steps = 30, 0.2, 7, 10_000
    full = sum(b.size == B for b in PoissonSampling(q, steps, max_batch_size=B).batches(m, 3))
    exact = float(stats.binom.sf(B - 1, m, q))  # P[size >= B] (a batch of size >= B ends at B)
    assert abs(full / steps - exact) < 5 * math.sqrt(exact * (1 - exact) / steps)


def test_large_max_is_the_untruncated_stream():
    for trunc, plain in [
        (PoissonSampling(0.3, 20, max_batch_size=50), PoissonSampling(0.3, 20)),
        (CyclicPoissonSampling(0.5, 20, 3, max_batch_size=50), CyclicPoissonSampling(0.5, 20, 3)),
    ]:
        for a, b in zip(trunc.batches(50, 11), plain.batches(50, 11)):
            assert np.array_equal(a, b)


def test_describe_round_trip_and_unchanged_untruncated_description():
    s = CyclicPoissonSampling(0.2, 10, 2, max_batch_size=3, dataset_size=20)
    assert s.describe()["max_batch_size"] == 3 and s.describe()["dataset_size"] == 20
    assert scheme_from_dict(s.describe()) == s
    p = PoissonSampling(0.2, 10, max_batch_size=4)
    assert scheme_from_dict(p.describe()) == p
    assert set(PoissonSampling(0.2, 10).describe()) == {"name", "sampling_prob", "steps"}


def test_torch_sampler_same_draws():
    torch_data = pytest.importorskip("dpmf.training.torch.data")
    s = CyclicPoissonSampling(0.8, 12, 3, max_batch_size=4, dataset_size=30)
    sampler = torch_data.SchemeBatchSampler(s, 30, seed=5)
    assert list(sampler) == [b.tolist() for b in s.batches(30, np.random.default_rng(5))]
    with pytest.raises(DPMFError, match="dataset_size"):
        torch_data.SchemeBatchSampler(s, 31, seed=5)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_bad_max_batch_size(bad):
    with pytest.raises(DPMFError, match="max_batch_size"):
        PoissonSampling(0.1, 5, max_batch_size=bad)
    with pytest.raises(DPMFError, match="max_batch_size"):
        CyclicPoissonSampling(0.1, 5, 2, max_batch_size=bad)


def test_bad_dataset_size_and_padding():
    with pytest.raises(DPMFError, match="dataset_size"):
        PoissonSampling(0.1, 5, max_batch_size=2, dataset_size=0)
    with pytest.raises(DPMFError, match="dataset_size=10"):
        next(iter(PoissonSampling(0.1, 5, max_batch_size=2, dataset_size=10).batches(11, 0)))
    with pytest.raises(DPMFError, match="more than max_batch_size"):
        padded_batch([1, 2, 3], 2)
    with pytest.raises(DPMFError, match="pad_index"):
        padded_batch([1], 2, pad_index=-1)
