"""The subsampled Gaussian PLD is dp_accounting's connect-the-dots PMF, built with a vectorized
inverse privacy loss: checked against ``from_gaussian_mechanism`` point by point."""

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dpa_pld

import dpmf
from dpmf.privacy.gaussian_plds import subsampled_gaussian


def _dense(pmf):
    if hasattr(pmf, "_probs"):
        return pmf._lower_loss, pmf._probs, pmf._infinity_mass
    dense = pmf.to_dense_pmf()
    return dense._lower_loss, dense._probs, dense._infinity_mass


GRID = [(sigma, q, sens, 1e-3) for sigma in (0.5, 1.0, 7.0) for q in (1e-4, 0.01, 0.3, 1.0) for sens in (1.0, 2.5)]


@pytest.mark.parametrize("sigma, q, sens, disc", GRID + [(1.0, 0.01, 1.0, 1e-4), (0.8, 0.5, 1.0, 1e-4)])
def test_pmf_equals_dp_accounting(sigma, q, sens, disc):
    ref = dpa_pld.from_gaussian_mechanism(
        sigma, sensitivity=sens, pessimistic_estimate=True, value_discretization_interval=disc, sampling_prob=q
    )
    ours = subsampled_gaussian(sigma, q, sens, discretization=disc)
    for theirs, mine in ((ref._pmf_remove, ours.remove), (ref._pmf_add, ours.add)):
        lo_t, p_t, inf_t = _dense(theirs)
        lo_m, p_m, inf_m = _dense(mine)
        assert lo_t == lo_m and p_t.shape == p_m.shape  # the same grid
        # The same closed forms evaluated in a different order: equal up to floating-point error,
        # which the PMF (second differences of delta(eps) over e^disc - 1 ~ disc) amplifies to
        # ~1e-12 per point, in dp_accounting's values as much as in ours; what accounting reads
        # (tail masses, deltas) agrees far closer.
        tail_t, tail_m = np.cumsum(p_t[::-1]), np.cumsum(p_m[::-1])
        assert np.max(np.abs(tail_m - tail_t)) <= 1e-10
        assert inf_m == pytest.approx(inf_t, rel=1e-9, abs=0)
    for eps in (0.0, 0.5, 2.0):
        assert ours.delta(eps) == pytest.approx(ref.get_delta_for_epsilon(eps), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("steps", [1, 1000])
def test_dpsgd_epsilon_equals_dp_accounting(steps):
    import dp_accounting as dpa

    acc = dpa.pld.PLDAccountant()
    acc.compose(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0)), steps)
    ours = dpmf.account(dpmf.strategies.Identity(steps), dpmf.sampling.PoissonSampling(0.01, steps), 1.0, 1e-6)
    assert ours.epsilon == pytest.approx(acc.get_epsilon(1e-6), rel=1e-9)
