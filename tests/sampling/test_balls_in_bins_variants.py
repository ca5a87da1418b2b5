"""BallsInBinsSampling(num_selected, fresh_slots) (issue 23): frequencies, reuse, fresh independence,
validation, serialization and how the accountants read the variants.

The frequency tests are chi-square tests at fixed seeds with a threshold of p > 1e-4: each detects a
bias of a few percent in a slot's probability (the counts are in the thousands), and a correct
sampler fails one with probability 1e-4 per seed.
"""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest
from scipy import stats

import dpmf
from dpmf.accounting.dispatch import valid_methods
from dpmf.errors import DPMFError, InvalidParameterError, UnsupportedConfigurationError
from dpmf.sampling import BallsInBinsSampling, scheme_from_dict
from dpmf.strategies import Identity, ToeplitzStrategy

P_MIN = 1e-4


def _membership(scheme, n, seed):
    """``(epochs, n, b)`` 0/1 array: example e in step j of epoch i, from :meth:`batches`."""
    b = scheme.steps_per_epoch
    out = np.zeros((scheme.epochs, n, b), dtype=np.int64)
    for t, batch in enumerate(scheme.batches(n, seed)):
        out[t // b, batch, t % b] += 1
    return out


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("fresh", [False, True])
def test_each_example_joins_k_distinct_uniform_steps_per_epoch(k, fresh):
    s = BallsInBinsSampling(3, 30, num_selected=k, fresh_slots=fresh)
    n = 4000
    mem = _membership(s, n, 11)
    assert mem.max() == 1  # distinct steps (no example twice in one batch)
    assert np.all(mem.sum(axis=2) == k)  # exactly k steps per epoch
    counts = mem[0].sum(axis=0)  # per step of the first epoch: Binomial(n, k/b) each, sum n k
    assert counts.sum() == n * k
    assert stats.chisquare(counts).pvalue > P_MIN
    assert abs(counts.mean() - n * k / s.steps_per_epoch) < 1e-9


def test_k_subsets_are_uniform():
    s = BallsInBinsSampling(1, 5, num_selected=2)
    n = 20000
    mem = _membership(s, n, 3)[0]
    subsets = {c: i for i, c in enumerate(combinations(range(5), 2))}
    idx = [subsets[tuple(np.flatnonzero(row))] for row in mem]
    counts = np.bincount(idx, minlength=len(subsets))
    assert stats.chisquare(counts).pvalue > P_MIN  # 10 subsets, 2000 each expected


def test_a_biased_subset_sampler_is_caught():
    # negative control of the test above: "first slot uniform, second the next step" is not uniform
    # over 2-subsets (adjacent pairs only), and the chi-square test rejects it
    rng = np.random.default_rng(3)
    first = rng.integers(0, 5, 20000)
    pairs = np.sort(np.stack([first, (first + 1) % 5], axis=1), axis=1)
    subsets = {c: i for i, c in enumerate(combinations(range(5), 2))}
    counts = np.bincount([subsets[tuple(p)] for p in pairs], minlength=10)
    assert stats.chisquare(counts).pvalue < 1e-10


def test_reused_slots_repeat_every_epoch_fresh_slots_are_independent():
    n = 6000
    reused = _membership(BallsInBinsSampling(3, 18, num_selected=2), n, 5)
    assert np.array_equal(reused[0], reused[1]) and np.array_equal(reused[0], reused[2])
    fresh = _membership(BallsInBinsSampling(2, 12, fresh_slots=True), n, 5)
    s0, s1 = fresh[0].argmax(axis=1), fresh[1].argmax(axis=1)
    table = np.zeros((6, 6))
    np.add.at(table, (s0, s1), 1)
    assert stats.chi2_contingency(table).pvalue > P_MIN  # epoch 1's slot independent of epoch 0's
    assert np.mean(s0 == s1) < 0.25  # (1/6 expected; reuse would give 1)


def test_default_draws_are_todays_stream():
    """The default scheme draws what balls-in-bins drew before num_selected existed (one
    ``integers(0, b, n)`` call, examples grouped by slot), so existing seeds keep their batches."""
    n, b, seed = 50, 7, 9
    slot = np.random.default_rng(seed).integers(0, b, size=n)
    legacy = [np.sort(np.flatnonzero(slot == j)) for j in range(b)] * 2
    got = list(BallsInBinsSampling(2, 2 * b).batches(n, seed))
    assert all(np.array_equal(a, g) for a, g in zip(legacy, got)) and len(got) == len(legacy)
    explicit = list(BallsInBinsSampling(2, 2 * b, num_selected=1, fresh_slots=False).batches(n, seed))
    assert all(np.array_equal(a, g) for a, g in zip(got, explicit))
    one_epoch_fresh = list(BallsInBinsSampling(1, b, fresh_slots=True).batches(n, seed))
    assert all(np.array_equal(a, g) for a, g in zip(got[:b], one_epoch_fresh))
    first_fresh = list(BallsInBinsSampling(2, 2 * b, fresh_slots=True).batches(n, seed))
    assert all(np.array_equal(a, g) for a, g in zip(got[:b], first_fresh[:b]))  # epoch 0 shared


def test_batches_are_reproducible_and_sorted():
    s = BallsInBinsSampling(2, 10, num_selected=3, fresh_slots=True)
    a, b_ = list(s.batches(40, 1)), list(s.batches(40, np.random.default_rng(1)))
    assert all(np.array_equal(x, y) for x, y in zip(a, b_))
    assert all(np.all(np.diff(x) > 0) for x in a)
    with pytest.raises(InvalidParameterError, match="rng"):
        next(s.batches(40, None))


def test_properties():
    assert (BallsInBinsSampling(4, 40).min_sep, BallsInBinsSampling(4, 40).max_participations) == (10, 4)
    assert (BallsInBinsSampling(4, 40, num_selected=3).min_sep, BallsInBinsSampling(4, 40, num_selected=3).max_participations) == (1, 12)
    fresh = BallsInBinsSampling(4, 40, fresh_slots=True)
    assert (fresh.min_sep, fresh.max_participations, fresh.reused_single_slot) == (1, 4, False)
    assert BallsInBinsSampling(1, 40, fresh_slots=True).reused_single_slot  # one epoch: the same scheme
    # min_sep is a guarantee: the fresh slots of two epochs can be adjacent steps
    first, second = (m.argmax(axis=1) for m in _membership(BallsInBinsSampling(2, 20, fresh_slots=True), 2000, 0))
    assert (10 + second - first).min() == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_selected": 0}, r"num_selected must be an integer in \[1, steps per epoch = 10\].*got 0"),
        ({"num_selected": 11}, r"num_selected .* got 11"),
        ({"num_selected": 2.0}, r"num_selected .* got 2.0"),
        ({"num_selected": True}, r"num_selected .* got True"),
        ({"fresh_slots": 1}, r"fresh_slots must be True .* or False .*got 1"),
        ({"fresh_slots": "yes"}, r"fresh_slots .* got 'yes'"),
        ({"fresh_slots": None}, r"fresh_slots .* got None"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(DPMFError, match=match):
        BallsInBinsSampling(2, 20, **kwargs)


@pytest.mark.parametrize(
    "scheme",
    [BallsInBinsSampling(2, 20), BallsInBinsSampling(2, 20, num_selected=3), BallsInBinsSampling(2, 20, 4, True)],
)
def test_serialization_round_trip(scheme):
    import json

    assert scheme_from_dict(json.loads(json.dumps(scheme.describe()))) == scheme
    assert scheme.describe()["num_selected"] == scheme.num_selected


def test_serialization_old_descriptions_and_types():
    assert scheme_from_dict({"name": "balls-in-bins", "epochs": 2, "steps": 20}) == BallsInBinsSampling(2, 20)
    with pytest.raises(InvalidParameterError, match="key 'fresh_slots' must be true or false"):
        scheme_from_dict({"name": "balls-in-bins", "epochs": 2, "steps": 20, "fresh_slots": 0})
    with pytest.raises(InvalidParameterError, match="key 'num_selected' must be an integer"):
        scheme_from_dict({"name": "balls-in-bins", "epochs": 2, "steps": 20, "num_selected": 1.5})
    with pytest.raises(InvalidParameterError, match="num_selected must be an integer in"):
        scheme_from_dict({"name": "balls-in-bins", "epochs": 2, "steps": 20, "num_selected": 11})


# ----------------------------------------------------------------------------- how accountants read them
def test_unamplified_sensitivity_of_the_variants():
    """Identity: sqrt(participations); fresh slots get no b-separation (a banded C whose columns
    overlap at distance 1 has a larger sensitivity than under (k, b) participation)."""
    for s, parts in [(BallsInBinsSampling(4, 40), 4), (BallsInBinsSampling(4, 40, num_selected=2), 8),
                     (BallsInBinsSampling(4, 40, fresh_slots=True), 4)]:
        r = dpmf.account(Identity(40), s, 2.0, 1e-6, method="unamplified")
        assert r.diagnostics["sensitivity"] == pytest.approx(math.sqrt(parts), rel=1e-12)
    C = ToeplitzStrategy(np.array([1.0, 0.5]), 8)  # columns c_i, c_{i+1} overlap
    reused = dpmf.account(C, BallsInBinsSampling(2, 8), 1.0, 1e-6, method="unamplified").diagnostics["sensitivity"]
    fresh = dpmf.account(C, BallsInBinsSampling(2, 8, fresh_slots=True), 1.0, 1e-6, method="unamplified")
    # worst fresh pattern: steps 3 and 4 (adjacent), ||c_3 + c_4||^2 = 1 + 1.5^2 + 0.25
    assert fresh.diagnostics["sensitivity"] == pytest.approx(math.sqrt(1 + 1.5**2 + 0.25), rel=1e-9)
    assert fresh.diagnostics["sensitivity"] > reused


@pytest.mark.parametrize("scheme", [BallsInBinsSampling(2, 8, num_selected=2), BallsInBinsSampling(2, 8, fresh_slots=True)])
def test_renyi_and_conditional_refuse_the_variants_with_the_reason(scheme):
    C = ToeplitzStrategy(np.array([1.0, 0.5]), 8)
    reasons = valid_methods(C, scheme)
    assert "one slot per example reused every epoch" in reasons["allocation"]
    with pytest.raises(UnsupportedConfigurationError, match="reused every epoch"):
        dpmf.account(C, scheme, 1.0, 1e-6, method="allocation")
    auto = dpmf.account(C, scheme, 1.0, 1e-6)
    unamplified = dpmf.account(C, scheme, 1.0, 1e-6, method="unamplified")
    # allocation_pld's own bounds apply (fresh slots: fresh_correlated.py; k of t: k_of_t_correlated.py)
    assert reasons["allocation_pld"] is None
    pld = dpmf.account(C, scheme, 1.0, 1e-6, method="allocation_pld")
    assert auto.epsilon == min(pld.epsilon, unamplified.epsilon)


def test_fresh_slots_over_one_epoch_equal_reused_slots():
    a = dpmf.account(Identity(16), BallsInBinsSampling(1, 16, fresh_slots=True), 1.0, 1e-6)
    b = dpmf.account(Identity(16), BallsInBinsSampling(1, 16), 1.0, 1e-6)
    assert (a.method, a.epsilon) == (b.method, b.epsilon)
    C = ToeplitzStrategy(np.array([1.0, 0.5]), 8)
    a = dpmf.account(C, BallsInBinsSampling(1, 8, fresh_slots=True), 1.0, 1e-6, method="allocation")
    b = dpmf.account(C, BallsInBinsSampling(1, 8), 1.0, 1e-6, method="allocation")
    assert a.epsilon == b.epsilon


def test_k_equal_one_is_the_one_slot_scheme_for_every_accountant():
    C = ToeplitzStrategy(np.array([1.0, 0.5]), 8)
    one, k1 = BallsInBinsSampling(2, 8), BallsInBinsSampling(2, 8, num_selected=1)
    assert one == k1
    for method in ("allocation", "unamplified"):
        assert dpmf.account(C, one, 1.0, 1e-6, method=method).epsilon == dpmf.account(C, k1, 1.0, 1e-6, method=method).epsilon


# ----------------------------------------------------------------------------- fixed shapes (padding)
def test_fixed_shapes_pad_the_schemes_batches_and_never_cut():
    from dpmf.sampling import BatchOverflowError, fixed_shape_batches, overflow_probability, padded_batch_size

    s = BallsInBinsSampling(3, 30, num_selected=2, fresh_slots=True)
    n = 300  # mean batch 60
    size = padded_batch_size(s, n, 1e-9)
    assert overflow_probability(s, n, size) <= 1e-9 < overflow_probability(s, n, size - 1)
    # the bound: 30 independent steps (fresh), binomial tail at n + 1 examples
    assert overflow_probability(s, n, size) == pytest.approx(30 * stats.binom.sf(size, n + 1, 0.2), rel=1e-5)
    plain = list(s.batches(n, 4))
    for (idx, w), batch in zip(fixed_shape_batches(s, n, 4, size), plain, strict=True):
        assert idx.shape == w.shape == (size,)
        assert np.array_equal(idx[w == 1], batch) and np.all(w[batch.size :] == 0)
    # a cap the run exceeds stops it before the epoch, with the probability in the message
    too_small = max(b.size for b in plain[:10]) - 1
    with pytest.raises(BatchOverflowError, match=r"batch_size=\d+ is too small.*probability <= 1"):
        list(fixed_shape_batches(s, n, 4, too_small))
    with pytest.raises(InvalidParameterError, match="BallsInBinsSampling"):
        padded_batch_size(dpmf.sampling.PoissonSampling(0.1, 10), 100)


def test_overflow_probability_is_an_upper_bound():
    """Empirical frequency of an overflow over 400 runs (reused slot, m = 200, b = 8, cap 35) is
    below the union bound's eta (the bound is a union over 8 steps, so not tight)."""
    from dpmf.sampling import overflow_probability

    s = BallsInBinsSampling(1, 8)
    eta = overflow_probability(s, 200, 35)
    hits = sum(max(b.size for b in s.batches(200, seed)) > 35 for seed in range(400))
    assert 0.02 < eta < 1
    assert stats.binomtest(hits, 400, eta, alternative="greater").pvalue > P_MIN
