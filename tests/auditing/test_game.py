"""The white-box game on the mechanism alone (dpmf.auditing.game): over many seeds a correct
mechanism's audit exceeds its certified epsilon no more often than the confidence allows, and the
same statistical check fails on a mechanism that adds a fifth of the claimed noise (so it can
fail). Fast: numpy only, the certified epsilons from dpmf.account."""

from __future__ import annotations

import pytest
from scipy import stats

import dpmf
from dpmf.auditing.game import TEST_WEIGHTS, mechanism_audit, preregister
from dpmf.auditing.whitebox import WhiteBoxScorer
from dpmf.sampling import CyclicPoissonSampling, FixedOrderSampling, PoissonSampling
from dpmf.strategies import Identity, catalog

SEEDS, M, N = 40, 400, 500


def _critical(seeds: int, beta: float, level: float = 1e-3) -> int:
    """Exceedances a correct implementation passes with probability > level: Binomial(seeds, beta)'s
    upper 1e-3 quantile."""
    return int(stats.binom.isf(level, seeds, beta))


CONFIGS = {
    "DP-SGD / Poisson": (Identity(32), PoissonSampling(0.2, 32)),
    "BandMF / cyclic Poisson": (catalog.build("bsr", 32, bands=8), CyclicPoissonSampling(1.0, 32, 8)),
    "BLT / fixed order": (catalog.build("blt", 32, epochs=4), FixedOrderSampling(4, 32)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_correct_mechanisms_stay_below_their_claim_and_faulty_ones_do_not(name):
    strategy, scheme = CONFIGS[name]
    cal = dpmf.calibrate(strategy, scheme, 2.0, 1e-5)
    sigma, claim = cal.noise_multiplier, cal.report.epsilon
    scorer = WhiteBoxScorer(strategy, scheme, sigma, N)
    tests = preregister(scorer, canaries=M, delta=1e-5, seed=0, trials=20)
    crit = _critical(SEEDS, 0.05)

    def exceedances(released_sigma):
        return sum(mechanism_audit(strategy, scheme, sigma, 1e-5, canaries=M, num_examples=N, seed=s, tests=tests,
                                   scorer=scorer, released_noise_multiplier=released_sigma).epsilon_lower > claim
                   for s in range(SEEDS))

    assert exceedances(sigma) <= crit
    assert exceedances(sigma / 5) > crit  # the check has power: a fifth of the noise is caught


def test_test_weights_spend_the_level_once():
    assert TEST_WEIGHTS[0] + 4 * TEST_WEIGHTS[1] == pytest.approx(1.0)
