"""Individual accounting: the paper's numbers (notes/individual-accounting.md §5.4), filter
validity as properties, the approximate PLD accountant against exact compositions, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmf.accounting.individual import (
    GDPFilter,
    GDPOdometer,
    IndividualGDPLedger,
    IndividualRDPLedger,
    filtered_step,
    full_gradient_steps,
    gdp_steps,
    rdp_steps,
)
from dpmf.accounting.individual.pld_accountant import IndividualPLDAccountant
from dpmf.errors import InvalidParameterError
from dpmf.privacy import gdp_delta, gdp_epsilon, gdp_mu, subsampled_gaussian
from dpmf.privacy.gdp import gdp_epsilon_array
from dpmf.privacy.rdp import rdp_to_epsilon


# ------------------------------------------------------------------ paper numbers
def test_p1_p2_private_gd_495_vs_420():
    """sigma = 100, delta = 1e-5: 420 RDP steps give eps 0.81563; GDP allows 495 (P1, P2)."""
    orders = np.arange(2, 33, dtype=float)
    eps_rdp_420 = rdp_to_epsilon(orders, orders * 420 / (2 * 100**2), 1e-5)[0]
    assert eps_rdp_420 == pytest.approx(0.81563, abs=1e-5)
    res = full_gradient_steps(100, 0.81563, 1e-5)
    assert res["gdp_steps"] == 495
    assert res["rdp_steps"] == 420
    assert gdp_epsilon(math.sqrt(495) / 100, 1e-5) <= 0.81563 < gdp_epsilon(math.sqrt(496) / 100, 1e-5)


def test_p3_gdp_is_about_ten_percent_smaller():
    eps_gdp = gdp_epsilon(math.sqrt(420) / 100, 1e-5)
    assert eps_gdp == pytest.approx(0.745138, abs=1e-6)
    assert 0.07 < 1 - eps_gdp / 0.815630 < 0.12


@pytest.mark.parametrize("eps,gdp,rdp_int", [(0.4, 134, 107), (0.6, 282, 238), (0.8, 478, 405), (1.0, 718, 611)])
def test_d6_max_steps(eps, gdp, rdp_int):
    assert gdp_steps(100, eps, 1e-5) == gdp
    assert rdp_steps(100, eps, 1e-5, orders=np.arange(2, 33, dtype=float)) == rdp_int
    assert rdp_steps(100, eps, 1e-5) >= rdp_int  # finer orders can only admit more


def test_p4_mimic_budget_and_epsilon():
    """Filtering after 50 epochs with sigma = 10.61: B = sqrt(50)/sigma, epsilon 2.7524 (P4)."""
    b = math.sqrt(50) / 10.61
    assert b == pytest.approx(0.66645, abs=1e-5)
    assert gdp_epsilon(b, 1e-5) == pytest.approx(2.7524, abs=1e-4)
    ledger = IndividualGDPLedger(3, b, noise_multiplier=10.61)
    norms = np.array([5.0, 0.3, 0.0])  # always clipped, small, zero
    for epoch in range(100):
        step = filtered_step(ledger, norms, clip_norm=0.79, noise_multiplier=10.61, normalizer=3)
        if epoch < 50:
            assert step.active[0]
        else:
            assert not step.active[0]  # worst case exhausted after exactly 50 epochs
    assert ledger.individual_epsilon(1e-5)[0] == pytest.approx(2.7524, abs=1e-3)
    assert ledger.individual_epsilon(1e-5)[2] == 0.0


@pytest.mark.parametrize("eps,mu", [(0.5, 0.142211), (10.0, 2.000446), (2.75, 0.665942), (0.8, 0.218686)])
def test_p8_budgets(eps, mu):
    assert gdp_mu(eps, 1e-5) == pytest.approx(mu, abs=2e-6)


def test_d11_hundred_epochs_unfiltered():
    assert gdp_epsilon(math.sqrt(100) / 10.614652581338738, 1e-5) == pytest.approx(4.0857, abs=1e-4)


# ------------------------------------------------------------------ filters
def test_gdp_filter_halts_and_stays_halted():
    f = GDPFilter(1.0)
    assert all(f.try_spend(0.5) for _ in range(4))
    assert not f.try_spend(0.01)
    assert not f.try_spend(0.0)
    assert f.spent_mu == pytest.approx(1.0)
    assert f.epsilon(1e-5) == pytest.approx(gdp_epsilon(1.0, 1e-5))


def test_odometer_blocks():
    odo = GDPOdometer(0.5)
    assert odo.spend(0.3) == pytest.approx(0.5)
    assert odo.spend(0.3) == pytest.approx(0.5)  # 0.09 + 0.09 <= 0.25: same block
    assert odo.spend(0.3) == pytest.approx(0.5 * math.sqrt(2))  # 0.18 + 0.09 > 0.25: new block
    with pytest.raises(InvalidParameterError):
        odo.spend(0.6)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 50),
    budget=st.floats(0.05, 3.0),
    steps=st.integers(1, 40),
    seed=st.integers(0, 2**31 - 1),
    exhaust=st.booleans(),
    permanent=st.booleans(),
)
def test_ledger_never_exceeds_budget(n, budget, steps, seed, exhaust, permanent):
    rng = np.random.default_rng(seed)
    ledger = IndividualGDPLedger(n, budget, permanent_drop=permanent)
    total = np.zeros(n)
    for _ in range(steps):
        mu = rng.exponential(budget / 3, size=n) * (rng.random(n) < 0.8)
        eff = ledger.step(mu, exhaust_budget=exhaust)
        assert np.all(eff <= mu + 1e-15)
        total += eff * eff
        assert np.all(ledger.spent_sq <= budget**2)  # the filter invariant, exactly
    np.testing.assert_allclose(ledger.spent_sq, total, rtol=1e-12, atol=1e-300)


def test_filter_guarantee_matches_closed_form():
    """The ledger's per-example (eps, delta) is the mu-GDP closed form (C.2) at its spent mu."""
    ledger = IndividualGDPLedger(4, 1.5)
    for mu in ([0.5, 0.1, 0.0, 1.0], [0.5, 0.2, 0.0, 1.0], [0.5, 0.3, 0.0, 0.2]):
        ledger.step(np.array(mu))
    eps = ledger.individual_epsilon(1e-6)
    for m, e in zip(ledger.individual_mu(), eps):
        if m == 0:
            assert e == 0
        else:
            assert e == pytest.approx(gdp_epsilon(m, 1e-6), rel=1e-9)
            assert gdp_delta(m, e) <= 1e-6


def test_exhaust_budget_spends_exactly_the_rest():
    ledger = IndividualGDPLedger(1, 1.0)
    ledger.step([0.8])
    eff = ledger.step([0.8], exhaust_budget=True)
    assert eff[0] == pytest.approx(0.6, rel=1e-9)
    assert ledger.spent_sq[0] <= 1.0
    assert ledger.spent_sq[0] == pytest.approx(1.0, rel=1e-9)


def test_filtered_step_weights_and_public_normalizer():
    ledger = IndividualGDPLedger(3, 10.0)
    st_ = filtered_step(ledger, [2.0, 0.5, 0.0], clip_norm=1.0, noise_multiplier=2.0, normalizer=100)
    np.testing.assert_allclose(st_.weights, [0.5, 1.0, 0.0])  # clip factors
    np.testing.assert_allclose(st_.mu, [0.5, 0.25, 0.0])
    assert st_.noise_std == 2.0 and st_.normalizer == 100


def test_rdp_ledger_matches_rdp_steps():
    led = IndividualRDPLedger.for_target(2, 0.81563, 1e-5)
    admitted = 0
    while led.step_gaussian(np.array([0.01, 0.0]))[0]:
        admitted += 1
    assert admitted == rdp_steps(100, 0.81563, 1e-5)
    assert led.individual_epsilon(1e-5)[0] <= 0.81563 + 1e-12


def test_gdp_epsilon_array_matches_scalar():
    mu = np.array([0.0, 1e-3, 0.2, 1.0, 5.0])
    got = gdp_epsilon_array(mu, 1e-6)
    for m, g in zip(mu[1:], got[1:]):
        assert g == pytest.approx(gdp_epsilon(m, 1e-6), rel=1e-9)
        assert gdp_delta(m, g) <= 1e-6


# ------------------------------------------------------------------ persistence
def test_ledger_round_trip_and_other_run(tmp_path):
    led = IndividualGDPLedger(5, 1.0, noise_multiplier=3.0)
    led.step(np.full(5, 0.3))
    path = tmp_path / "ledger.npz"
    led.save(path)
    back = IndividualGDPLedger.load(path, run_id=led.run_id)
    np.testing.assert_array_equal(back.spent_sq, led.spent_sq)
    assert back.steps == 1 and back.budget == 1.0
    with pytest.raises(InvalidParameterError, match="belongs to run"):
        IndividualGDPLedger.load(path, run_id="another-run")
    bad = tmp_path / "bad.npz"
    np.savez(bad, spent_sq=np.zeros(2), dropped=np.zeros(2), last_active=np.ones(2),
             metadata=np.array(json.dumps({"kind": "something else"})))
    with pytest.raises(InvalidParameterError, match="not a dpmf GDP ledger"):
        IndividualGDPLedger.load(bad)


# ------------------------------------------------------------------ approximate PLD accountant
@pytest.fixture(scope="module")
def small_acc():
    return IndividualPLDAccountant(0.01, 1.5, 400, grid_size=12, max_ratio=8.0, discretization=1e-3)


def test_pld_accountant_worst_case_equals_composition(small_acc):
    counts = np.zeros(small_acc.grid.size, dtype=int)
    counts[0] = 400
    exact = subsampled_gaussian(1.5, 0.01, discretization=1e-3).self_compose(400).epsilon(1e-5)
    assert small_acc.epsilon(counts, 1e-5) == pytest.approx(exact, abs=1e-6)


def test_pld_accountant_never_below_exact_heterogeneous_value(small_acc):
    """Rounding noise ratios down to the grid: never below the exact per-example composition."""
    rng = np.random.default_rng(3)
    norms = np.minimum(rng.exponential(0.6, size=300), 1.0)
    counts = small_acc.bucket_counts(norms, clip_norm=1.0)
    got = small_acc.epsilon(counts, 1e-5)
    nz = norms[norms > 0]
    ratios = 1.5 / nz
    pld = None
    for r in ratios:  # exact heterogeneous composition, one PLD per step (unbucketed)
        step = subsampled_gaussian(r, 0.01, discretization=1e-3)
        pld = step if pld is None else pld.compose(step)
    exact = pld.epsilon(1e-5)
    assert got >= exact - 1e-9
    assert got <= exact * 1.3  # bucketing is pessimistic but not wild


def test_pld_accountant_mu_route_dominates_and_is_labelled(small_acc):
    counts = np.zeros(small_acc.grid.size, dtype=int)
    counts[0], counts[5] = 200, 100
    res = small_acc.account([counts], 1e-5)
    assert not res.certified
    assert res.epsilon_rdp[0] >= res.epsilon_pld[0]  # the RDP route only loses
    mu = res.mu[0]
    pmf = small_acc.pmf(counts, "remove")
    grid = np.linspace(0.05, 3, 30)
    slack = pmf._infinity_mass + 1e-12
    assert np.all(np.asarray(pmf.get_delta_for_epsilon(grid)) <= np.array([gdp_delta(mu, e) for e in grid]) + slack)


# ------------------------------------------------------------------ bad input
def test_bad_input():
    with pytest.raises(InvalidParameterError):
        IndividualGDPLedger(3, -1.0)
    with pytest.raises(InvalidParameterError):
        GDPFilter(0.0)
    led = IndividualGDPLedger(3, 1.0)
    with pytest.raises(InvalidParameterError, match="mu must be >= 0"):
        led.step([-0.1, 0, 0])
    with pytest.raises(InvalidParameterError, match="one entry per example"):
        led.step([0.1, 0.1])
    with pytest.raises(InvalidParameterError, match="NaN"):
        filtered_step(led, [np.nan, 1, 1], clip_norm=1, noise_multiplier=1, normalizer=3)
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        gdp_steps(-1, 1, 1e-5)


# ------------------------------------------------------------------ derived oracles D1-D12
def test_d1_d3_gdp_profile():
    assert gdp_delta(1.0, 0.0) == pytest.approx(0.3829249225, abs=1e-10)
    assert gdp_delta(1.0, 1.0) == pytest.approx(0.1269367375, abs=1e-10)
    assert gdp_epsilon(1.0, 1e-5) == pytest.approx(4.377178, abs=1e-6)
    assert gdp_epsilon(0.5, 1e-5) == pytest.approx(1.993091, abs=1e-6)
    assert gdp_epsilon(1.0, 1e-6) == pytest.approx(4.886554, abs=1e-6)


@pytest.mark.parametrize(
    "eps,d_rdp,d_gdp",
    [(0.1, 7.511e-2, 4.331e-2), (0.3, 1.724e-2, 7.545e-3), (0.5, 1.873e-3, 6.319e-4),
     (0.7, 8.819e-5, 2.360e-5), (0.8, 1.367e-5, 3.319e-6), (0.9, 1.696e-6, 3.755e-7)],
)
def test_d4_figure3_curves(eps, d_rdp, d_gdp):
    from dpmf.privacy.rdp import rdp_to_delta

    orders = np.arange(2, 33, dtype=float)
    assert rdp_to_delta(orders, orders * 420 / (2 * 100**2), eps)[0] == pytest.approx(d_rdp, rel=2e-3)
    assert gdp_delta(math.sqrt(420) / 100, eps) == pytest.approx(d_gdp, rel=2e-3)


@pytest.mark.parametrize("k,e_rdp,e_gdp", [(300, 0.6798, 0.6200), (500, 0.8970, 0.8197), (900, 1.2349, 1.1318)])
def test_d5_figure4(k, e_rdp, e_gdp):
    orders = np.arange(2, 33, dtype=float)
    assert rdp_to_epsilon(orders, orders * k / (2 * 100**2), 1e-5)[0] == pytest.approx(e_rdp, abs=1e-4)
    assert gdp_epsilon(math.sqrt(k) / 100, 1e-5) == pytest.approx(e_gdp, abs=1e-4)


def test_d7_d8_d9_mnist_worst_case():
    """MNIST setting (q = 0.005, sigma = 2, T = 10000), every step clipped."""
    from dpmf.privacy.rdp import epsilon_subsampled_gaussian_rdp

    acc = IndividualPLDAccountant(0.005, 2.0, 10000, grid_size=2, max_ratio=2.0, discretization=1e-4)
    counts = np.array([10000, 0])
    assert acc.epsilon(counts, 1e-5) == pytest.approx(1.00424, abs=2e-5)  # D7
    assert acc.epsilon(counts, 1e-6) == pytest.approx(1.15032, abs=2e-5)
    assert epsilon_subsampled_gaussian_rdp(2.0, 0.005, 10000, 1e-5) == pytest.approx(1.09888, abs=1e-5)  # D8
    mu_paper_range, _ = acc.fit_mu(counts, eps_range=(0.01, 0.3))
    assert 0.26622 <= mu_paper_range <= 0.2675  # D9: the paper's fit range gives mu ~ 0.267
    mu_all, _ = acc.fit_mu(counts)
    assert mu_all >= mu_paper_range  # checking every epsilon can only raise mu


def test_d10_gaussian_pld_equals_gdp():
    from dpmf.privacy import gaussian

    # dp_accounting composes k Gaussians as one with sigma / sqrt(k): same here
    pld_eps = gaussian(100.0 / math.sqrt(420)).epsilon(1e-5)
    assert pld_eps == pytest.approx(0.7451383, abs=2e-6)
    exact = gdp_epsilon(math.sqrt(420) / 100, 1e-5)
    assert exact == pytest.approx(0.7451382, abs=1e-6)
    # composing 420 discretized PLDs accumulates (pessimistic) discretization error
    composed = gaussian(100.0).self_compose(420).epsilon(1e-5)
    assert exact <= composed <= exact + 1e-4


def test_d12_direction_of_the_subsampled_pair():
    d = subsampled_gaussian(1.0, 0.5).delta_by_direction(0.5)
    assert d["remove"] == pytest.approx(0.0799446, abs=1e-6)
    assert d["add"] == pytest.approx(0.0091571, abs=1e-6)


def test_bucketing_rounds_noise_down(small_acc):
    """A ratio a hair below a grid point must go to the bucket below (less noise: pessimistic)."""
    g = small_acc.grid
    for i in (1, 5, g.size - 1):
        just_below = small_acc.sigma / (g[i] * (1 - 1e-13))  # clipped norm giving ratio g[i](1-1e-13)
        counts = small_acc.bucket_counts([just_below], clip_norm=1.0)
        assert counts[i - 1] == 1 and counts.sum() == 1
    # every assigned grid point is <= the true noise ratio
    rng = np.random.default_rng(0)
    norms = rng.uniform(0.01, 1.0, 500)
    for c in norms:
        idx = int(np.flatnonzero(small_acc.bucket_counts([c], clip_norm=1.0))[0])
        assert g[idx] <= small_acc.sigma / c
