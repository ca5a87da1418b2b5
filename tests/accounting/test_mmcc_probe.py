"""MMCC's calibration probe: the full report, or a lower bound on its epsilon from the cheapest rows.

Oracle: the full MMCC report at the same noise (``account_mmcc``). A float from the probe must be
above the target and never above the full epsilon (it is a partial composition); a report must be
the full one, bit for bit.
"""

from __future__ import annotations

import pytest

import dpmf
from dpmf.accounting.mmcc import account_mmcc, probe_mmcc
from dpmf.privacy.calibration import NoiseLimitExceeded
from dpmf.sampling import CyclicPoissonSampling, PoissonSampling
from dpmf.strategies import BinaryTree, bsr

DELTA = 1e-6

CASES = [
    (BinaryTree(64), PoissonSampling(0.02, 64), 12.0),
    (BinaryTree(100), PoissonSampling(0.05, 100), 15.0),
    (bsr(96, 4), PoissonSampling(0.05, 96), 2.0),
    (bsr(96, 4), CyclicPoissonSampling(0.2, 96, 4), 2.0),  # generalized MMCC
]
_FULL: dict[int, object] = {}


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.99, 2.0])
def test_probe_is_the_report_or_a_lower_bound_above_the_target(case, fraction):
    strategy, scheme, sigma = CASES[case]
    if case not in _FULL:
        _FULL[case] = account_mmcc(strategy, scheme, sigma, DELTA, heuristic=False)
    full = _FULL[case]
    target = fraction * full.epsilon
    out = probe_mmcc(strategy, scheme, sigma, DELTA, target)
    if isinstance(out, float):
        assert target < out <= full.epsilon
    else:
        assert out.epsilon == full.epsilon
        assert out.epsilon_by_direction == full.epsilon_by_direction
        assert out.diagnostics["max_probability_ratio"] == full.diagnostics["max_probability_ratio"]
    if fraction >= 1:
        assert not isinstance(out, float)  # the target passes: only the full report can say so


def test_the_probe_stops_early_on_the_tree():
    strategy, scheme = BinaryTree(256), PoissonSampling(0.01, 256)
    out = probe_mmcc(strategy, scheme, 10.4, DELTA, 2.0)
    assert isinstance(out, float) and out > 2.0  # (the full epsilon is about 19: see the test above)


def test_calibrate_prunes_with_the_probe_and_says_it_is_a_lower_bound():
    strategy, scheme = BinaryTree(256), PoissonSampling(0.01, 256)
    with pytest.raises(NoiseLimitExceeded, match=">=") as info:
        dpmf.calibrate(strategy, scheme, 2.0, DELTA, method="mmcc", max_noise_multiplier=10.4)
    assert info.value.lower_bound and info.value.epsilon > 2.0
