"""Mixture-of-Gaussians PLDs: oracles (dp_accounting's test numbers, MMCC App. F.5), exact
profiles, soundness against the continuous truth, and cross-checks with dp_accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dpa_pld
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special, stats

from dpmf.errors import InvalidParameterError
from dpmf.privacy import GaussianMixture, mixture_of_gaussians, subsampled_gaussian
from dpmf.privacy.random_sensitivity import group_dpsgd, last_iterate_linear


# ---------------------------------------------------------------- privacy-loss oracles
# (sigma, sensitivities, probabilities, x, dp_accounting ADD loss) from notes/peer-public-code.md §1.4
ADD_LOSSES = [
    (1, [0, 1, 2], [0.2, 0.6, 0.2], 0.5, 0.1351602748368097),
    (1, [1, 2], [0.2, 0.8], 0.5, 0.7046054708796523),
    (7, [0, 7, 14], [0.2, 0.6, 0.2], 0.5, 0.4746752545839654),
    (7, [0, 7, 14], [0.2, 0.6, 0.2], -0.5, 0.5757291778782041),
    (1, [0, 2], [0.3, 0.7], 0.0, 0.929541389699331),
    (7, [0, 14], [0.1, 0.9], -7.0, 2.150000710600199),
]
# dp_accounting's REMOVE mixture sits at -c: its loss at x is ours at -x.
REMOVE_LOSSES = [
    (1, [0, 1, 2], [0.2, 0.6, 0.2], 0.5, -0.8423781325734492),
    (1, [1, 2], [0.2, 0.8], 0.5, -2.176785009442309),
    (7, [0, 7, 14], [0.2, 0.6, 0.2], 0.5, -0.5757291778782041),
    (7, [0, 7, 14], [0.2, 0.6, 0.2], -0.5, -0.4746752545839654),
]


@pytest.mark.parametrize("sigma,c,p,x,expected", ADD_LOSSES)
def test_add_privacy_loss_matches_oracle(sigma, c, p, x, expected):
    mech = GaussianMixture.create(c, p, sigma)
    assert mech.privacy_loss(x, "add") == pytest.approx(expected, rel=1e-12, abs=1e-13)


@pytest.mark.parametrize("sigma,c,p,x,expected", REMOVE_LOSSES)
def test_remove_privacy_loss_matches_oracle(sigma, c, p, x, expected):
    mech = GaussianMixture.create(c, p, sigma)
    assert mech.privacy_loss(-x, "remove") == pytest.approx(expected, rel=1e-12, abs=1e-13)


def test_inverse_privacy_loss_inverts():
    mech = GaussianMixture.create([0, 1, 2], [0.2, 0.6, 0.2], 1.3)
    losses = np.linspace(mech.min_loss + 1e-3, 30, 2001)
    x = mech.inverse_privacy_loss(losses)
    assert np.all(np.diff(x) > 0)
    np.testing.assert_allclose(mech.privacy_loss(x, "remove"), losses, rtol=1e-12, atol=1e-12)
    with pytest.raises(InvalidParameterError):
        mech.inverse_privacy_loss([mech.min_loss - 1])


# ---------------------------------------------------------------- exact delta oracles
# delta at epsilon = 1, (add, remove), notes/peer-public-code.md §1.4
DELTA_AT_1 = [
    ([0, 1], [0.2, 0.8], 0.0231362104090899, 0.0816951786585355),
    ([0, 3], [0.3, 0.7], 0.1195051215523554, 0.5356298793262404),
    ([0, 1, 2], [0.2, 0.6, 0.2], 0.036691263832032806, 0.15768284088654105),
    ([1, 2], [0.2, 0.8], 0.3894964356580768, 0.433276675545065),
]


@pytest.mark.parametrize("c,p,add,remove", DELTA_AT_1)
def test_exact_delta_matches_oracle(c, p, add, remove):
    mech = GaussianMixture.create(c, p, 1.0)
    assert mech.delta(1.0, "add") == pytest.approx(add, rel=1e-9)
    assert mech.delta(1.0, "remove") == pytest.approx(remove, rel=1e-9)
    assert mech.delta(1.0) == pytest.approx(max(add, remove), rel=1e-9)


@pytest.mark.parametrize("c,p,add,remove", DELTA_AT_1)
def test_pld_delta_at_grid_point_is_exact_and_never_below(c, p, add, remove):
    # epsilon = 1 is a grid point; connect-the-dots reproduces delta there up to round-off
    by_dir = mixture_of_gaussians(c, p, 1.0).delta_by_direction(1.0)
    for got, want in ((by_dir["add"], add), (by_dir["remove"], remove)):
        assert got >= want * (1 - 1e-9)
        assert got == pytest.approx(want, rel=1e-6)


def test_single_gaussian_matches_closed_form():
    from dpmf.privacy import gaussian_delta

    pld = mixture_of_gaussians([3.0], [1.0], 1.0)
    for eps in (0.0, 0.5, 1.0, 4.0, 8.0):
        exact = gaussian_delta(1.0, eps, sensitivity=3.0)
        got = pld.delta(eps)
        assert exact - 1e-12 <= got <= exact + 1e-6


def test_exact_delta_against_numerical_integration():
    """delta(eps) = integral of (p(x) - e^eps q(x))_+ by quadrature (brute force)."""
    c, p, sigma = np.array([0.0, 0.7, 1.9]), np.array([0.5, 0.3, 0.2]), 0.8
    mech = GaussianMixture.create(c, p, sigma)

    def dens_mix(x):
        return float(np.dot(p, stats.norm.pdf(x, loc=c, scale=sigma)))

    def dens_0(x):
        return float(stats.norm.pdf(x, scale=sigma))

    from scipy import optimize

    for eps in (0.1, 0.8, 2.0):
        # the densities cross once; find the crossing independently (brentq), integrate each side
        x_star = optimize.brentq(lambda x: math.log(dens_mix(x)) - eps - math.log(dens_0(x)), -12, 14, xtol=1e-15)
        rem = integrate.quad(lambda x: dens_mix(x) - math.exp(eps) * dens_0(x), x_star, 16, epsabs=1e-14, epsrel=1e-12, limit=200)[0]
        # add: loss -L(x) > eps  <=>  L(x) < -eps
        if -eps <= math.log(p[0]):  # the add loss never exceeds -log p_0
            add = 0.0
        else:
            y_star = optimize.brentq(lambda x: math.log(dens_mix(x)) + eps - math.log(dens_0(x)), -30, 14, xtol=1e-15)
            add = integrate.quad(lambda x: dens_0(x) - math.exp(eps) * dens_mix(x), -16, y_star, epsabs=1e-14, epsrel=1e-12, limit=200)[0]
        assert mech.delta(eps, "remove") == pytest.approx(rem, rel=1e-9, abs=1e-13)
        assert mech.delta(eps, "add") == pytest.approx(add, rel=1e-9, abs=1e-13)


# ---------------------------------------------------------------- composition oracles
def test_dp_accounting_composition_oracle():
    """dp_accounting's test_mixture_of_gaussians_basic: epsilon = 17.193115 at delta = 1e-6."""
    a = mixture_of_gaussians([0, 1, 2], [0.2, 0.6, 0.2], 1.0).self_compose(3)
    b = mixture_of_gaussians([0, 2, 3], [0.33, 0.34, 0.33], 2.0).self_compose(2)
    eps = a.compose(b).epsilon(1e-6)
    assert eps == pytest.approx(17.193115, abs=2e-4)
    assert eps >= 17.193115 - 1e-5  # both are pessimistic connect-the-dots on the same grid


def test_dpsgd_as_mixture_matches_subsampled_gaussian():
    """C = I DP-SGD: MoG({0, 1}, {1-q, q}) composed T times is the Poisson-subsampled Gaussian."""
    mog = mixture_of_gaussians([0, 1], [0.99, 0.01], 1.0).self_compose(1000).epsilon_by_direction(1e-6)
    ref = subsampled_gaussian(1.0, 0.01).self_compose(1000).epsilon_by_direction(1e-6)
    assert mog["remove"] == pytest.approx(2.124523, abs=2e-5)
    assert mog["remove"] == pytest.approx(ref["remove"], abs=1e-6)
    assert mog["remove"] >= ref["remove"] - 1e-6
    # add direction: the loss is bounded by -log(1-q); that top grid point carries the last mass
    assert mog["add"] == pytest.approx(ref["add"], abs=1e-6)


def test_last_iterate_linear_losses_f5():
    """MMCC App. F.5: n = 128, p = 1/128, sigma = 1, delta = 1e-6."""
    per_step = subsampled_gaussian(1.0, 1 / 128).self_compose(128).epsilon(1e-6)
    assert per_step == pytest.approx(0.806, abs=1e-3)
    last = last_iterate_linear(128, 1 / 128, 1.0).epsilon_by_direction(1e-6)
    assert last["add"] == pytest.approx(0.291, abs=1e-3)  # the paper's number: add direction only
    assert max(last.values()) == pytest.approx(0.420, abs=1e-3)
    assert max(last.values()) < per_step


def test_group_of_one_is_dpsgd():
    g = group_dpsgd(1, 50, 0.02, 1.2).epsilon(1e-5)
    ref = subsampled_gaussian(1.2, 0.02).self_compose(50).epsilon(1e-5)
    assert g == pytest.approx(ref, abs=1e-5)
    assert group_dpsgd(2, 50, 0.02, 1.2).epsilon(1e-5) > g


# ---------------------------------------------------------------- soundness: never below the truth
def _assert_pld_dominates_truth(mech: GaussianMixture, disc: float, epsilons) -> float:
    pld = mech.pld(disc)
    worst_excess = 0.0
    for eps in epsilons:
        for direction in ("remove", "add"):
            exact = mech.delta(eps, direction)
            got = pld.delta_by_direction(eps)[direction]
            assert got >= exact - 1e-12, (direction, eps, got, exact)
            worst_excess = max(worst_excess, got - exact)
    return worst_excess


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(1, 4),
    sigma=st.floats(0.5, 4.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_pld_never_below_exact_delta(k, sigma, seed):
    rng = np.random.default_rng(seed)
    c = np.sort(rng.uniform(0, 2, size=k))
    if rng.random() < 0.5:
        c[0] = 0.0
    p = rng.dirichlet(np.ones(k))
    mech = GaussianMixture.create(c, p, sigma)
    eps_grid = np.concatenate([rng.uniform(0, 3, size=6), [0.0]])
    excess = _assert_pld_dominates_truth(mech, 1e-3, eps_grid)
    assert excess < 5e-3  # connect-the-dots slack at a 1e-3 grid is small


@settings(max_examples=10, deadline=None)
@given(k=st.integers(2, 3), sigma=st.floats(0.8, 3.0), seed=st.integers(0, 2**31 - 1))
def test_never_below_dp_accounting_pessimistic(k, sigma, seed):
    """dpmf's delta(eps) is never below dp_accounting's pessimistic value minus the slack 1e-9.

    Both are connect-the-dots PLDs on the same grid; the slack covers their different
    tail truncations (dp_accounting truncates at log mass -50, dpmf at Phi(-10))."""
    rng = np.random.default_rng(seed)
    c = np.concatenate([[0.0], np.sort(rng.uniform(0.2, 1.5, size=k - 1))])
    p = rng.dirichlet(np.ones(k))
    disc = 1e-2
    ours = mixture_of_gaussians(c, p, sigma, discretization=disc)
    theirs = dpa_pld.from_mixture_gaussian_mechanism(sigma, list(c), list(p), value_discretization_interval=disc)
    for eps in (0.0, 0.3, 1.0, 2.0):
        ours_d = ours.delta_by_direction(eps)
        assert ours_d["remove"] >= theirs._pmf_remove.get_delta_for_epsilon(eps) - 1e-9
        assert ours_d["add"] >= theirs._pmf_add.get_delta_for_epsilon(eps) - 1e-9


def test_mass_is_conserved_and_non_negative():
    pld = mixture_of_gaussians([0, 0.5, 1.5], [0.7, 0.2, 0.1], 0.9)
    for direction in ("remove", "add"):
        _, probs, inf_mass = pld.pmf(direction)
        assert np.all(probs >= 0)
        assert 0 <= inf_mass < 1e-20
        assert math.fsum(probs.tolist()) + inf_mass == pytest.approx(1.0, abs=1e-12)
    # bounded add loss (-log p_0): the mass beyond the grid's tail point, at most Phi(-TAIL_Z), sits
    # at +inf unless the grid reaches -log p_0 (then it is one more interval ending there)
    from dpmf.privacy.mixture import TAIL_Z

    assert pld.pmf("add")[2] <= special.ndtr(-TAIL_Z)


def test_pruning_moves_mass_up_only():
    c = np.arange(200) * 0.01
    p = stats.binom.pmf(np.arange(200), 199, 0.3)
    mech = GaussianMixture.create(c, p, 1.0)
    assert mech.sensitivities.size < 200
    assert mech.sensitivities[-1] == c[-1]  # maximum kept
    # stochastic dominance: tail mass at every threshold is at least the original
    for t in np.linspace(0, 2, 41):
        assert mech.probabilities[mech.sensitivities >= t].sum() >= p[c >= t].sum() - 1e-15


def test_trivial_mixture_is_identity():
    pld = mixture_of_gaussians([0.0, 0.0], [0.4, 0.6], 1.0)
    assert pld.epsilon(1e-9) == 0.0


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "c,p,sigma,match",
    [
        ([0, 1], [0.5, 0.5], 0.0, "noise_multiplier"),
        ([0, 1], [0.5, 0.5], -1.0, "noise_multiplier"),
        ([0, 1], [0.5, 0.5], float("nan"), "noise_multiplier"),
        ([0, -1], [0.5, 0.5], 1.0, "sensitivities"),
        ([0, float("nan")], [0.5, 0.5], 1.0, "sensitivities"),
        ([0, 1], [0.5, 0.6], 1.0, "probabilities"),
        ([0, 1], [1.5, -0.5], 1.0, "probabilities"),
        ([0, 1, 2], [0.5, 0.5], 1.0, "same length"),
        ([], [], 1.0, "empty"),
    ],
)
def test_bad_input_raises(c, p, sigma, match):
    with pytest.raises(InvalidParameterError, match=match):
        mixture_of_gaussians(c, p, sigma)
