"""b-min-sep (cold/warm/truncated), cyclic Poisson, balls-in-bins and multi-attribution (Alg. 3)
batch generators: batch-size laws, the variance ratio of Sec. 4.1 (O8), separation invariants,
a literal Alg. 3 reference on the same random draws, reproducibility and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmf.errors import InvalidParameterError
from dpmf.sampling import (
    SCHEMES,
    BallsInBinsSampling,
    CyclicPoissonSampling,
    MinSepSampling,
    MultiAttributionMinSepSampling,
    participation_rate,
    sampling_prob_for_rate,
)


def _appearances(batches, m):
    """steps[e] = sorted steps in which example e appears."""
    out = [[] for _ in range(m)]
    for t, batch in enumerate(batches):
        assert np.all(np.diff(batch) > 0) if batch.size > 1 else True  # sorted, no duplicates
        for e in batch:
            out[e].append(t)
    return out


# ----------------------------------------------------------------------------- b-min-sep
def test_o6_rate_conversion():
    assert sampling_prob_for_rate(1 / 300, 150) == pytest.approx(1 / 151, rel=1e-12)
    assert sampling_prob_for_rate(1 / 300, 300) == pytest.approx(1.0, rel=1e-12)
    p0 = 1793 / 14_745_600
    assert sampling_prob_for_rate(p0, 256) == pytest.approx(1.2549e-4, rel=1e-4)
    assert participation_rate(sampling_prob_for_rate(0.01, 20), 20) == pytest.approx(0.01, rel=1e-12)


def test_o7_warm_start_expected_batch_size_every_step():
    m, p0, b, steps = 100_000, 0.02, 10, 30
    scheme = MinSepSampling.from_participation_rate(p0, steps, b, warm_start=True)
    sizes = np.array([bt.size for bt in scheme.batches(m, 3)])
    # each example's chain is stationary and independent, so |B_i| ~ Binomial(m, p0) at every step
    z = (sizes - m * p0) / math.sqrt(m * p0 * (1 - p0))
    assert np.all(np.abs(z) < 4.5), z
    assert abs(sizes.mean() - m * p0) < 4 * math.sqrt(m * p0 / steps)


def test_cold_start_first_step_samples_everyone_at_p():
    m, p0, b = 100_000, 0.02, 10
    scheme = MinSepSampling.from_participation_rate(p0, b, b)  # only the first step is drawn
    p = scheme.sampling_prob
    size = next(iter(scheme.batches(m, 4))).size
    assert abs(size - m * p) < 4.5 * math.sqrt(m * p)  # m p = 2439, far from m p0 = 2000
    assert abs(size - m * p0) > 5 * math.sqrt(m * p0)  # 9.8 sd apart in expectation


@pytest.mark.parametrize("warm", [False, True])
def test_min_sep_separation_holds(warm):
    m, b = 400, 5
    scheme = MinSepSampling(0.5, 60, b, warm_start=warm)
    for steps in _appearances(scheme.batches(m, 5), m):
        assert np.all(np.diff(steps) >= b)


def test_truncated_batches_are_capped_and_still_separated():
    m, b, cap = 2000, 4, 50
    scheme = MinSepSampling(0.2, 40, b, warm_start=True, max_batch_size=cap)
    batches = list(scheme.batches(m, 6))
    assert max(bt.size for bt in batches) == cap  # expected size ~ 2000 p0 = 185 > cap
    for steps in _appearances(batches, m):
        assert np.all(np.diff(steps) >= b)


def test_o8_participation_count_variance_ratio():
    # notes O8: n = 4000 steps, b = 8, p0 = 1/64: Var ~ 48.71 (renewal formula; simulation 49.0),
    # cyclic Poisson 54.69, mean n p0 = 62.5. Each example is one independent replicate.
    n, b, p0, m = 4000, 8, 1 / 64, 20_000
    counts = np.zeros(m, dtype=np.int64)
    for bt in MinSepSampling.from_participation_rate(p0, n, b, warm_start=True).batches(m, 7):
        counts[bt] += 1
    cyc = np.zeros(m, dtype=np.int64)
    for bt in CyclicPoissonSampling(b * p0, n, b, partition="independent").batches(m, 8):
        cyc[bt] += 1
    var_cyclic = (n / b) * (b * p0) * (1 - b * p0)
    var_bms = n * p0 * (1 - b * p0) * (1 - p0 * (b - 1))
    assert var_cyclic == pytest.approx(54.6875)
    assert var_bms == pytest.approx(48.71, abs=0.01)
    se = lambda v: v * math.sqrt(2 / (m - 1))  # noqa: E731  (standard error of a sample variance)
    assert abs(counts.mean() - n * p0) < 4 * math.sqrt(var_bms / m)
    assert abs(counts.var(ddof=1) - var_bms) < 4 * se(var_bms) + 0.3  # 0.3: finite-n boundary term
    assert abs(cyc.var(ddof=1) - var_cyclic) < 4 * se(var_cyclic)
    assert counts.var(ddof=1) / cyc.var(ddof=1) == pytest.approx(1 - p0 * (b - 1), abs=0.03)


def test_reproducible_from_seed():
    s = MinSepSampling(0.3, 20, 3, warm_start=True)
    a = [bt.tolist() for bt in s.batches(500, 42)]
    b = [bt.tolist() for bt in s.batches(500, np.random.default_rng(42))]
    c = [bt.tolist() for bt in s.batches(500, 43)]
    assert a == b and a != c


# ----------------------------------------------------------------------------- cyclic Poisson
@pytest.mark.parametrize("partition", ["equal", "independent"])
def test_cyclic_poisson_phases(partition):
    m, b, q, steps = 3000, 6, 0.4, 36
    scheme = CyclicPoissonSampling(q, steps, b, partition=partition)
    groups = scheme.groups(m, 9)
    batches = list(scheme.batches(m, 9))  # same seed: the same groups are drawn first
    for t, bt in enumerate(batches):
        assert np.all(groups[bt] == t % b)
    if partition == "equal":
        assert np.ptp(np.bincount(groups, minlength=b)) <= 1
    sizes = np.array([bt.size for bt in batches])
    assert abs(sizes.mean() - m * q / b) < 4 * math.sqrt(m * q / b / steps)


# ----------------------------------------------------------------------------- balls-in-bins
def test_balls_in_bins_each_example_once_per_epoch_same_slot():
    m, epochs, steps = 500, 3, 15
    b = steps // epochs
    batches = list(BallsInBinsSampling(epochs, steps).batches(m, 10))
    for steps_e in _appearances(batches, m):
        assert len(steps_e) == epochs
        assert np.all(np.diff(steps_e) == b)
        assert steps_e[0] < b
    assert sum(bt.size for bt in batches) == m * epochs


def test_warm_start_p1_is_balls_in_bins_pattern():
    # warm start with p = 1 and b = cycle length: every example participates exactly every b steps
    m, b, steps = 300, 5, 20
    for steps_e in _appearances(MinSepSampling(1.0, steps, b, warm_start=True).batches(m, 11), m):
        assert steps_e[0] < b and np.all(np.diff(steps_e) == b)


# ----------------------------------------------------------------------------- multi-attribution
def _random_attribution(m, users, rng, max_users_per_example=3):
    return [list(rng.choice(users, size=rng.integers(1, max_users_per_example + 1), replace=False)) for _ in range(m)]


def _reference_alg3(user_sets, p, b, steps, rng):
    """Algorithm 3 written literally (sets), drawing S_i with the same calls as the library."""
    m = len(user_sets)
    sets = [set(u) for u in user_sets]
    nbr = [{f for f in range(m) if sets[e] & sets[f]} for e in range(m)]
    interim = []
    out = []
    for i in range(steps):
        s_i = set(np.flatnonzero(rng.random(m) < p).tolist())
        exclude = set()
        for j in range(max(0, i - b + 1), i):
            for e in interim[j]:
                exclude |= nbr[e]
        interim.append(s_i)
        out.append(sorted(s_i - exclude))
    return out


@pytest.mark.parametrize("b,p", [(1, 0.3), (3, 0.2), (6, 0.5)])
def test_multi_attribution_equals_literal_algorithm_3(b, p):
    rng = np.random.default_rng(13)
    att = _random_attribution(120, 60, rng)
    k_u = max(np.unique(np.concatenate(att), return_counts=True)[1])
    scheme = MultiAttributionMinSepSampling(p, 25, b, int(k_u))
    ours = [bt.tolist() for bt in scheme.batches(att, 99)]
    assert ours == _reference_alg3(att, p, b, 25, np.random.default_rng(99))


def test_multi_attribution_user_level_min_sep_and_cap():
    rng = np.random.default_rng(14)
    m, b = 400, 4
    att = _random_attribution(m, 150, rng)
    k_u = int(max(np.unique(np.concatenate(att), return_counts=True)[1]))
    batches = list(MultiAttributionMinSepSampling(0.3, 60, b, k_u).batches(att, 15))
    user_steps: dict = {}
    for t, bt in enumerate(batches):
        for e in bt:
            for u in att[e]:
                user_steps.setdefault(u, set()).add(t)
    assert user_steps  # something was sampled
    for steps in user_steps.values():
        assert np.all(np.diff(sorted(steps)) >= b)
    with pytest.raises(InvalidParameterError, match="max_user_examples"):
        next(iter(MultiAttributionMinSepSampling(0.3, 5, b, k_u - 1).batches(att, 1)))


def test_multi_attribution_single_users_and_b1_is_poisson():
    m, p = 50_000, 0.05
    att = [[e] for e in range(m)]
    sizes = [bt.size for bt in MultiAttributionMinSepSampling(p, 10, 1, 1).batches(att, 16)]
    assert abs(np.mean(sizes) - m * p) < 4 * math.sqrt(m * p / 10)


def test_multi_attribution_warmup_discards_leading_batches():
    rng = np.random.default_rng(17)
    att = _random_attribution(200, 80, rng)
    k_u = int(max(np.unique(np.concatenate(att), return_counts=True)[1]))
    long = [bt.tolist() for bt in MultiAttributionMinSepSampling(0.2, 30, 3, k_u).batches(att, 5)]
    warm = [bt.tolist() for bt in MultiAttributionMinSepSampling(0.2, 20, 3, k_u, warmup_steps=10).batches(att, 5)]
    assert warm == long[10:]


def test_multi_attribution_is_a_registered_scheme():
    s = MultiAttributionMinSepSampling(0.1, 10, 2, 3)
    assert isinstance(s, SCHEMES)
    assert s.describe()["max_user_examples"] == 3 and s.max_participations == 5


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "make",
    [
        lambda: MinSepSampling.from_participation_rate(0.2, 10, 6),  # p0 (b - 1) = 1
        lambda: MinSepSampling.from_participation_rate(0.3, 10, 5),  # p0 (b - 1) > 1
        lambda: MinSepSampling(0.0, 10, 2),
        lambda: MinSepSampling(0.1, 10, 0),
        lambda: MinSepSampling(0.1, 10, 2, max_batch_size=0),
        lambda: MultiAttributionMinSepSampling(0.1, 10, 2, 0),
        lambda: MultiAttributionMinSepSampling(float("nan"), 10, 2, 1),
        lambda: MultiAttributionMinSepSampling(0.1, 10, 2, 1, warmup_steps=-1),
        lambda: CyclicPoissonSampling(0.1, 10, 2, partition="random"),
    ],
)
def test_bad_parameters_raise(make):
    with pytest.raises(InvalidParameterError):
        make()


def test_bad_attributions_raise():
    s = MultiAttributionMinSepSampling(0.1, 3, 2, 2)
    with pytest.raises(InvalidParameterError, match=r"attribution\[1\]"):
        next(iter(s.batches([["a"], []], 1)))
    with pytest.raises(InvalidParameterError, match="hashable"):
        next(iter(s.batches([[["unhashable"]]], 1)))
    with pytest.raises(InvalidParameterError):
        next(iter(s.batches([], 1)))
    with pytest.raises(InvalidParameterError, match="rng"):
        next(iter(s.batches([["a"]], None)))
