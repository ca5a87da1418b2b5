"""User-level (multi-attribution) accounting: k_u = 1 is example-level cold b-min-sep (the two
dominating pairs enumerated; Monte Carlo and calibration equal for a seed), the unamplified bound
is the Gaussian mechanism with sensitivity k_u x the example-level one, and reports say user level."""

from __future__ import annotations

import numpy as np
import pytest

import dpmf
from dpmf.accounting.montecarlo import _loss_bruteforce as bf
from dpmf.accounting.report import ADJACENCY, USER_ADJACENCY
from dpmf.accounting.user_level import single_example_users_reduction, user_sensitivity_factor
from dpmf.privacy.gdp import gaussian_epsilon
from dpmf.sampling import MinSepSampling, MultiAttributionMinSepSampling, PoissonSampling
from dpmf.strategies import Identity, bsr
from dpmf.strategies.participation import Participation


def _patterns(pats) -> dict:
    out: dict = {}
    for prob, x in pats:
        key = tuple(int(v) for v in x)
        out[key] = out.get(key, 0.0) + prob
    return out


@pytest.mark.parametrize("n,b,p", [(6, 1, 0.3), (7, 2, 0.4), (8, 3, 0.25), (5, 5, 0.6)])
def test_one_example_per_user_pair_is_cold_min_sep(n, b, p):
    user = _patterns(bf.multi_attribution_patterns(n, b, p, 1))
    example = _patterns(bf.minsep_patterns(n, b, p, warm=False))
    assert user.keys() == example.keys()
    for x in user:
        assert user[x] == pytest.approx(example[x], rel=1e-12)
    reduced = single_example_users_reduction(MultiAttributionMinSepSampling(p, n, b, 1))
    assert reduced == MinSepSampling(p, n, b, warm_start=False)
    assert single_example_users_reduction(MultiAttributionMinSepSampling(p, n, b, 2)) is None
    assert single_example_users_reduction(MinSepSampling(p, n, b)) is None


def test_user_level_monte_carlo_equals_example_level_for_one_example_users():
    strat = bsr(16, 2)
    kw = dict(method="montecarlo", num_samples=1000, seed=7)
    user = dpmf.account(strat, MultiAttributionMinSepSampling(0.1, 16, 2, 1), 1.0, 0.1, **kw)
    example = dpmf.account(strat, MinSepSampling(0.1, 16, 2), 1.0, 0.1, **kw)
    assert user.epsilon == example.epsilon and user.epsilon_by_direction == example.epsilon_by_direction
    assert user.adjacency == USER_ADJACENCY and example.adjacency == ADJACENCY
    # two examples per user costs more (Thm 6.1's Binomial(2, p) counts)
    two = dpmf.account(strat, MultiAttributionMinSepSampling(0.1, 16, 2, 2), 1.0, 0.1, **kw)
    assert two.epsilon > user.epsilon


@pytest.mark.parametrize("k", [1, 2, 5])
def test_unamplified_user_level_is_the_gaussian_mechanism_with_k_times_the_sensitivity(k):
    strat, n, b, sigma, delta = bsr(12, 3), 12, 3, 2.0, 1e-5
    scheme = MultiAttributionMinSepSampling(0.1, n, b, k)
    sens = strat.sensitivity(Participation(-(-n // b), b))
    rep = dpmf.account(strat, scheme, sigma, delta, method="unamplified")
    assert rep.epsilon == pytest.approx(gaussian_epsilon(sigma, delta, k * sens), rel=1e-12)
    assert rep.diagnostics["sensitivity"] == pytest.approx(k * sens, rel=1e-12)
    # = the example-level bound at sigma / k (the Gaussian mechanism depends on sens / sigma only)
    ex = dpmf.account(strat, MinSepSampling(0.1, n, b), sigma / k, delta, method="unamplified")
    assert rep.epsilon == pytest.approx(ex.epsilon, rel=1e-12)
    assert user_sensitivity_factor(scheme) == k and user_sensitivity_factor(PoissonSampling(0.1, n)) == 1
    cal = dpmf.calibrate(strat, scheme, rep.epsilon, delta, method="unamplified")
    assert cal.noise_multiplier == pytest.approx(sigma, rel=1e-6)


def test_auto_picks_a_proved_bound_for_user_level():
    rep = dpmf.account(Identity(8), MultiAttributionMinSepSampling(0.1, 8, 1, 2), 3.0, 1e-5)
    assert rep.certified and rep.method == "unamplified" and rep.adjacency == USER_ADJACENCY


@pytest.mark.slow
def test_certified_calibration_equal_for_one_example_users():
    strat = bsr(8, 2)
    user = dpmf.calibrate(strat, MultiAttributionMinSepSampling(0.05, 8, 2, 1), 4.0, 1e-3, method="montecarlo", seed=3)
    example = dpmf.calibrate(strat, MinSepSampling(0.05, 8, 2), 4.0, 1e-3, method="montecarlo", seed=3)
    assert user.report.certified and user.report.method == "montecarlo-evr"
    assert user.noise_multiplier == example.noise_multiplier and user.report.epsilon == example.report.epsilon
    two = dpmf.calibrate(strat, MultiAttributionMinSepSampling(0.05, 8, 2, 2), 4.0, 1e-3, method="montecarlo", seed=3)
    assert two.report.certified and two.noise_multiplier > user.noise_multiplier
