"""PrivacyLossDistribution: identity, discrete mechanisms against brute-force hockey-stick
divergences (never below, within the rounding slack), composition, both adjacency directions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmf.errors import InvalidParameterError
from dpmf.privacy import PrivacyLossDistribution, from_probability_mass_functions, subsampled_gaussian

DISC = 1e-4
LOG3 = math.log(3)
RR_P = [0.75, 0.25]  # randomized response with eps0 = log 3: with the example
RR_Q = [0.25, 0.75]  # without it
# An asymmetric mechanism with an outcome impossible with the example (add direction: loss +inf).
ASYM_P = [0.6, 0.4, 0.0]
ASYM_Q = [0.3, 0.5, 0.2]
EPS_GRID = np.linspace(0.0, 2.5, 126)


def hockey_stick(p, q, eps: float) -> float:
    """Brute force delta(eps) = sum_o (P(o) - e^eps Q(o))_+."""
    return math.fsum(max(a - math.exp(eps) * b, 0.0) for a, b in zip(p, q))


def brute_epsilon(p, q, delta: float) -> float:
    """Smallest eps >= 0 with hockey_stick <= delta (bisection; inf if unreachable)."""
    if hockey_stick(p, q, 0.0) <= delta:
        return 0.0
    if hockey_stick(p, q, 50.0) > delta:
        return math.inf
    lo, hi = 0.0, 50.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if hockey_stick(p, q, mid) <= delta else (mid, hi)
    return hi


def joint(p1, p2):
    return [a * b for a in p1 for b in p2]


def check_delta_profile(pld, p, q, n_roundings: int):
    """delta of the PLD is never below the exact one, and above it by at most the rounding slack.

    Each of ``n_roundings`` privacy losses is rounded up by < DISC, so every outcome's term
    (1 - e^{eps - L})_+ grows by at most 1 - e^{-n DISC} (its P-mass summing to 1).
    """
    slack = -math.expm1(-n_roundings * DISC) + 1e-12
    for eps in EPS_GRID:
        got = pld.delta_by_direction(float(eps))
        for direction, (a, b) in (("remove", (p, q)), ("add", (q, p))):
            exact = hockey_stick(a, b, float(eps))
            assert got[direction] >= exact - 1e-14, (direction, eps)
            assert got[direction] <= exact + slack, (direction, eps)
        assert pld.delta(float(eps)) == max(got.values())


# ------------------------------------------------------------------------------ identity
def test_identity_reveals_nothing():
    pld = PrivacyLossDistribution.identity()
    for delta in (1e-12, 1e-6, 0.5):
        assert pld.epsilon(delta) == 0.0
        assert pld.epsilon_by_direction(delta) == {"remove": 0.0, "add": 0.0}
    for eps in (0.0, 0.3, 5.0):
        assert pld.delta(eps) == 0.0
    losses, probs, inf_mass = pld.pmf("remove")
    assert probs.sum() == pytest.approx(1.0) and inf_mass == 0.0
    assert np.all(losses[probs > 0] == 0.0)


def test_identity_is_neutral_for_composition():
    rr = from_probability_mass_functions(RR_P, RR_Q)
    both = rr.compose(PrivacyLossDistribution.identity())
    for eps in (0.0, 0.5, 1.0):
        assert both.delta(eps) == pytest.approx(rr.delta(eps), rel=1e-12, abs=1e-15)


# -------------------------------------------------------------------- randomized response
def test_randomized_response_epsilon_both_directions():
    pld = from_probability_mass_functions(RR_P, RR_Q)
    for delta in (1e-12, 1e-6):
        exact = brute_epsilon(RR_P, RR_Q, delta)  # log(3 - 4 delta), just below log 3
        assert exact == pytest.approx(math.log(3 - 4 * delta), abs=1e-12)
        by_dir = pld.epsilon_by_direction(delta)
        for direction in ("remove", "add"):
            assert exact <= by_dir[direction] <= LOG3 + DISC + 1e-12
        assert pld.epsilon(delta) == max(by_dir.values())
    # losses are rounded up onto the grid: log 3 -> 1.0987, -log 3 -> -1.0986
    losses, probs, inf_mass = pld.pmf("remove")
    support = losses[probs > 0]
    np.testing.assert_allclose(support, [-10986 * DISC, 10987 * DISC], atol=1e-12)
    np.testing.assert_allclose(probs[probs > 0], [0.25, 0.75], rtol=1e-15)
    assert inf_mass == 0.0


def test_randomized_response_delta_matches_brute_force():
    check_delta_profile(from_probability_mass_functions(RR_P, RR_Q), RR_P, RR_Q, n_roundings=1)


def test_randomized_response_delta_is_zero_beyond_log3_plus_grid():
    pld = from_probability_mass_functions(RR_P, RR_Q)
    assert pld.delta(LOG3 + DISC) == 0.0
    assert pld.delta(LOG3 - 0.01) > hockey_stick(RR_P, RR_Q, LOG3 - 0.01) - 1e-15 > 0


def test_dict_and_array_inputs_agree():
    a = from_probability_mass_functions(ASYM_P, ASYM_Q)
    b = from_probability_mass_functions(
        {"x": ASYM_P[0], "y": ASYM_P[1]}, {"x": ASYM_Q[0], "y": ASYM_Q[1], "z": ASYM_Q[2]}
    )
    for eps in (0.0, 0.4, 1.0):
        assert a.delta_by_direction(eps) == b.delta_by_direction(eps)


def test_asymmetric_mechanism_and_infinite_loss():
    pld = from_probability_mass_functions(ASYM_P, ASYM_Q)
    check_delta_profile(pld, ASYM_P, ASYM_Q, n_roundings=1)
    # add direction: P = without; outcome z has Q = with = 0, so loss +inf with mass 0.2
    assert pld.pmf("add")[2] == pytest.approx(0.2)
    assert pld.pmf("remove")[2] == 0.0
    assert pld.epsilon_by_direction(0.1)["add"] == math.inf
    assert pld.epsilon(0.1) == math.inf
    assert math.isfinite(pld.epsilon_by_direction(0.1)["remove"])


# ------------------------------------------------------------------------------ composition
def test_composed_randomized_response_matches_brute_force_over_joint_outcomes():
    rr = from_probability_mass_functions(RR_P, RR_Q)
    two = rr.compose(rr)
    jp, jq = joint(RR_P, RR_P), joint(RR_Q, RR_Q)
    check_delta_profile(two, jp, jq, n_roundings=2)
    for delta in (1e-6, 0.05, 0.3):
        exact = brute_epsilon(jp, jq, delta)
        got = two.epsilon(delta)
        assert exact - 1e-9 <= got <= exact + 2 * DISC + 1e-9
    # self_compose agrees with compose
    for eps in (0.0, 1.0, 2.0):
        assert rr.self_compose(2).delta(eps) == pytest.approx(two.delta(eps), rel=1e-9, abs=1e-15)


def test_composed_asymmetric_mechanisms_keep_both_directions():
    asym = from_probability_mass_functions(ASYM_P, ASYM_Q)
    rr = from_probability_mass_functions(RR_P, RR_Q)
    both = asym.compose(rr)
    check_delta_profile(both, joint(ASYM_P, RR_P), joint(ASYM_Q, RR_Q), n_roundings=2)
    by_dir = both.epsilon_by_direction(0.3)
    exact_add = brute_epsilon(joint(ASYM_Q, RR_Q), joint(ASYM_P, RR_P), 0.3)
    exact_remove = brute_epsilon(joint(ASYM_P, RR_P), joint(ASYM_Q, RR_Q), 0.3)
    assert exact_add > exact_remove + 0.1  # the directions really differ
    assert exact_add - 1e-9 <= by_dir["add"] <= exact_add + 2 * DISC + 1e-9
    assert exact_remove - 1e-9 <= by_dir["remove"] <= exact_remove + 2 * DISC + 1e-9


def test_compose_rejects_different_discretizations():
    a = from_probability_mass_functions(RR_P, RR_Q, discretization=1e-4)
    b = from_probability_mass_functions(RR_P, RR_Q, discretization=1e-3)
    with pytest.raises(InvalidParameterError, match="discretization"):
        a.compose(b)
    with pytest.raises(InvalidParameterError):
        a.compose(PrivacyLossDistribution.identity(1e-3))
    with pytest.raises(InvalidParameterError):
        a.compose("not a pld")


def test_dp_accounting_round_trip():
    rr = from_probability_mass_functions(ASYM_P, ASYM_Q)
    back = PrivacyLossDistribution.from_dp_accounting(rr.to_dp_accounting())
    for eps in (0.0, 0.5, 1.0):
        assert back.delta_by_direction(eps) == rr.delta_by_direction(eps)


# ------------------------------------------------------------- asymmetric subsampled Gaussian
def test_subsampled_gaussian_remove_dominates_add():
    # notes/mmcc.md §5.2: DP-SGD n = 128, p = 1/128, sigma = 1, delta = 1e-6 (dp_accounting 0.6.0):
    # remove 0.8064, add 0.3442; the reported epsilon is the remove one (paper: .806).
    pld = subsampled_gaussian(1.0, 1 / 128).self_compose(128)
    by_dir = pld.epsilon_by_direction(1e-6)
    assert by_dir["remove"] == pytest.approx(0.8064, abs=5e-4)
    assert by_dir["add"] == pytest.approx(0.3442, abs=5e-4)
    assert pld.epsilon(1e-6) == by_dir["remove"]
    assert not pld.symmetric
    # delta at a fixed epsilon: remove direction is the worse one too
    d = pld.delta_by_direction(0.5)
    assert d["remove"] > d["add"] and pld.delta(0.5) == d["remove"]


# -------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "p,q",
    [
        ([0.5, 0.6], [0.5, 0.5]),  # does not sum to 1
        ([1.2, -0.2], [0.5, 0.5]),  # negative
        ([0.5, 0.5], [1.0]),  # lengths differ
        ([0.5, float("nan")], [0.5, 0.5]),
        ({"a": 1.0}, [1.0]),  # dict and array mixed
        ([], []),
    ],
)
def test_bad_pmfs_raise(p, q):
    with pytest.raises(InvalidParameterError):
        from_probability_mass_functions(p, q)


def test_bad_queries_raise():
    pld = from_probability_mass_functions(RR_P, RR_Q)
    for bad_delta in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(InvalidParameterError):
            pld.epsilon(bad_delta)
    for bad_eps in (-1.0, float("nan")):
        with pytest.raises(InvalidParameterError):
            pld.delta(bad_eps)
    with pytest.raises(InvalidParameterError):
        pld.self_compose(0)
    with pytest.raises(InvalidParameterError):
        pld.pmf("sideways")
    with pytest.raises(InvalidParameterError):
        from_probability_mass_functions(RR_P, RR_Q, discretization=0.0)
