"""Sampling probability for a target expected batch size after the warm start (Sec. 7.3):
checked against independent simulations of the real samplers (other seeds, enough steps that the
standard error is a small fraction of the 1% tolerance), the compiled simulator against
``MultiAttributionMinSepSampling.batches`` in law, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmf.errors import CalibrationError, DPMFError
from dpmf.sampling import (
    MinSepSampling,
    MultiAttributionMinSepSampling,
    attribution_from_edges,
    bound_contributions,
    calibrate_sampling_prob,
    participation_rate,
)
from dpmf.sampling.batch_size import _batch_means_se, simulated_batch_sizes


def sizes_after_warmup(scheme, data, seed) -> np.ndarray:
    return np.array([b.size for b in scheme.batches(data, seed)], dtype=float)


def within(mean: float, se: float, target: float, rel: float = 0.01) -> None:
    """The mean is within rel of the target, and the check means something (3 standard errors < rel)."""
    assert 3 * se < rel * target, f"standard error {se:.3g} too large for a {rel:.0%} check"
    assert abs(mean / target - 1) < rel, (mean, target, se)


@pytest.fixture(scope="module")
def bounded():
    rng = np.random.default_rng(11)
    m = 4000
    ex = np.concatenate([np.arange(m), rng.integers(0, m, 2500)])
    us = np.concatenate([rng.integers(0, 2500, m), rng.integers(0, 2500, 2500)])
    return bound_contributions(attribution_from_edges(ex, us), 3, seed=0)


def test_single_attribution_closed_form_against_the_warm_start_sampler():
    m, b, target = 20_000, 8, 200.0
    cal = calibrate_sampling_prob(target, b, num_examples=m)
    assert cal.method == "stationary" and cal.std_error == 0.0
    assert participation_rate(cal.sampling_prob, b) * m == pytest.approx(target, rel=1e-12)
    assert cal.sampling_prob > target / m  # barred examples: p above the naive target / m
    sizes = sizes_after_warmup(MinSepSampling(cal.sampling_prob, 1500, b, warm_start=True), m, 123)
    within(sizes.mean(), _batch_means_se(sizes, b), target)


def test_multi_attribution_search_against_the_real_sampler(bounded):
    att, b, target, warm = bounded.attribution, 4, 50.0, 200
    cal = calibrate_sampling_prob(target, b, attribution=att, warmup_steps=warm, measure_steps=4000, seed=1)
    assert cal.method == "simulation" and cal.seed == 1 and cal.evaluations >= 2
    assert abs(cal.relative_error) <= 1e-3 + 3 * cal.std_error / target
    # multi-attribution bars more than single attribution: a larger p than the closed form
    single = calibrate_sampling_prob(target, b, num_examples=att.num_examples).sampling_prob
    assert cal.sampling_prob > single
    # independent check: the sampler training uses, another seed, after the same warm-up
    scheme = MultiAttributionMinSepSampling(cal.sampling_prob, 3000, b, bounded.max_user_examples, warmup_steps=warm)
    sizes = sizes_after_warmup(scheme, att, 777)
    within(sizes.mean(), _batch_means_se(sizes, b), target)


def test_one_example_per_user_matches_the_closed_form():
    # a graph where every user has one example is plain b-min-sep: after a long warm-up the search
    # lands on the stationary closed form
    m, b, target = 3000, 5, 60.0
    att = attribution_from_edges(np.arange(m), np.arange(m))
    cal = calibrate_sampling_prob(target, b, attribution=att, warmup_steps=300, measure_steps=5000, seed=4)
    closed = calibrate_sampling_prob(target, b, num_examples=m).sampling_prob
    assert cal.sampling_prob == pytest.approx(closed, rel=0.015)


def test_simulator_has_the_law_of_the_scheme(bounded):
    att, b, p, warm = bounded.attribution, 3, 0.02, 30
    sim = simulated_batch_sizes(att, p, b, warm, 3000, seed=5)
    real = sizes_after_warmup(MultiAttributionMinSepSampling(p, 1500, b, 3, warmup_steps=warm), att, 6)
    se = math.hypot(_batch_means_se(sim, b), _batch_means_se(real, b))
    assert abs(sim.mean() - real.mean()) < 4 * se
    assert abs(sim.var() / real.var() - 1) < 0.15
    # cold start at step 0: nobody barred, every interim example joins: Binomial(m, p)
    first = simulated_batch_sizes(att, p, b, 0, 1, seed=9)
    assert first[0] == pytest.approx(att.num_examples * p, abs=5 * math.sqrt(att.num_examples * p))
    np.testing.assert_array_equal(simulated_batch_sizes(att, p, b, warm, 50, seed=5), sim[:50])  # deterministic


def test_unreachable_target_is_refused():
    # one user owns every example: any interim draw bars the whole dataset for b - 1 steps
    att = attribution_from_edges(np.arange(200), np.zeros(200, dtype=int))
    with pytest.raises(CalibrationError, match="largest simulated mean"):
        calibrate_sampling_prob(20, 4, attribution=att, warmup_steps=10, measure_steps=200, seed=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_examples=100), "target_batch_size=50 is above num_examples / min_sep"),
        (dict(), "exactly one of num_examples"),
        (dict(num_examples=100, attribution=[[0]]), "exactly one of num_examples"),
        (dict(attribution=[[0], [1]], seed=0), "warmup_steps must be an integer >= 0"),
        (dict(attribution=[[0], [1]], warmup_steps=-1, seed=0), "warmup_steps"),
        (dict(attribution=[[0], [1]], warmup_steps=5), "seed must be an integer"),
        (dict(attribution=[[0], [1]], warmup_steps=5, seed=0, measure_steps=0), "measure_steps"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(DPMFError, match=match):
        calibrate_sampling_prob(50, 4, **kwargs)
    with pytest.raises(DPMFError, match="target_batch_size"):
        calibrate_sampling_prob(-1, 4, num_examples=100)
