"""f-DP trade-off curves (dpmf.privacy.tradeoff): closed forms, brute force, dp_accounting, soundness.

Every curve is an upper bound on the TPR of any test at each FPR: it must never be below the exact
curve (closed form, or Neyman-Pearson by enumeration on a discrete pair) and never below the curve
of dp_accounting's *optimistic* PLD; and it must be close to them (a loose bound would pass
soundness checks while being useless)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpmf.errors import DPMFError, InvalidParameterError
from dpmf.privacy import PrivacyLossDistribution, from_probability_mass_functions, gaussian, subsampled_gaussian
from dpmf.privacy.gdp import gdp_epsilon
from dpmf.privacy.tradeoff import (
    PrivacyCurve,
    TradeOff,
    compose_curves,
    epsilon_delta_pld,
    tpr_epsilon_delta,
    tpr_from_pld,
    tpr_from_profile,
    tpr_gdp,
)

ALPHA = np.concatenate(([0.0], np.logspace(-8, -1, 15), np.linspace(0.1, 1.0, 19)))


def gaussian_tpr(mu, alpha):
    """1 - G_mu(alpha) = 1 - Phi(Phi^-1(1 - alpha) - mu) (DRS Eq. 3), written independently (with the
    survival functions, accurate at tiny alpha)."""
    return stats.norm.sf(stats.norm.isf(np.asarray(alpha)) - mu)


def neyman_pearson_tpr(null: np.ndarray, alt: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Exact largest TPR at FPR alpha for discrete distributions (randomized likelihood-ratio test)."""
    with np.errstate(divide="ignore"):
        ratio = np.where(null > 0, alt / np.where(null > 0, null, 1), np.inf)
    order = np.argsort(-ratio, kind="stable")
    fpr = np.concatenate(([0.0], np.cumsum(null[order])))
    tpr = np.concatenate(([0.0], np.cumsum(alt[order])))
    # the ROC of the LR test is the piecewise-linear interpolation of these vertices (randomization)
    out = np.empty_like(alpha)
    for i, a in enumerate(alpha):
        k = np.searchsorted(fpr, a, side="right") - 1
        k = min(k, fpr.size - 2)
        # outcomes with null mass 0 come first (infinite ratio): all their TPR at FPR 0
        if fpr[k + 1] == fpr[k]:
            out[i] = tpr[k + 1]
        else:
            out[i] = tpr[k] + (a - fpr[k]) / (fpr[k + 1] - fpr[k]) * (tpr[k + 1] - tpr[k])
    return np.minimum(out, 1.0)


# ------------------------------------------------------------------------------ closed forms
@pytest.mark.parametrize("mu", [0.0, 0.3, 1.0, 2.5])
def test_gdp_curve_is_the_closed_form(mu):
    alpha = ALPHA[(ALPHA > 0) & (ALPHA < 1)]
    ours, exact = tpr_gdp(mu, alpha), gaussian_tpr(mu, alpha)
    np.testing.assert_allclose(ours, exact, rtol=1e-10, atol=1e-15)
    assert np.all(ours >= exact * (1 - 1e-14))  # (nudged up past its rounding: never below)
    assert tpr_gdp(mu, 0.0) == 0.0 and tpr_gdp(mu, 1.0) == 1.0
    assert isinstance(tpr_gdp(mu, 0.05), float)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
def test_gaussian_pld_curve_is_the_closed_form_from_above(sigma):
    """The Gaussian mechanism's pessimistic PLD gives Phi(Phi^-1(fpr) + 1/sigma): never below it (sound),
    within the discretization's effect (1e-4 grid)."""
    mu = 1.0 / sigma
    ours = tpr_from_pld(gaussian(sigma), ALPHA)
    exact = np.where(ALPHA >= 1, 1.0, gaussian_tpr(mu, ALPHA))
    assert np.all(ours >= exact - 1e-12), np.max(exact - ours)
    assert np.max(ours - exact) < 1e-5 + 1e-15  # (the note's "reproduces G_mu to 1e-5")
    # relative closeness at small FPR as well (where an audit looks)
    small = (ALPHA > 1e-8) & (ALPHA < 1e-2)
    np.testing.assert_allclose(ours[small], exact[small], rtol=2e-3)


def test_gaussian_pld_curve_fails_for_a_smaller_mu():
    """The check above can fail: a Gaussian PLD of a *more* private mechanism is below the curve."""
    ours = tpr_from_pld(gaussian(1.05), ALPHA)
    exact = gaussian_tpr(1.0, ALPHA[1:-1])
    assert np.any(ours[1:-1] < exact - 1e-4)


def test_epsilon_delta_curve_is_its_formula():
    eps, delta = 1.3, 1e-5
    ours = tpr_epsilon_delta(eps, delta, ALPHA)
    formula = [min(1.0, math.exp(eps) * a + delta, 1 - math.exp(-eps) * (1 - delta - a)) for a in ALPHA]
    np.testing.assert_allclose(ours, np.maximum(formula, ALPHA), rtol=1e-14, atol=1e-17)
    assert tpr_epsilon_delta(eps, delta, 0.0) == pytest.approx(delta)
    assert tpr_epsilon_delta(0.0, 0.0, 0.3) == pytest.approx(0.3)  # perfect privacy: guessing
    assert tpr_epsilon_delta(math.inf, 1e-5, 0.3) == 1.0


def test_epsilon_delta_pld_has_exactly_that_curve():
    """The dominating pair of (eps, delta)-DP (eps on the grid) has the (eps, delta) curve, and its epsilon
    at delta is eps."""
    eps, delta = 1.0, 1e-5
    pld = epsilon_delta_pld(eps, delta, 1e-4)
    np.testing.assert_allclose(tpr_from_pld(pld, ALPHA), tpr_epsilon_delta(eps, delta, ALPHA), atol=1e-12)
    assert pld.epsilon(delta) == pytest.approx(eps, abs=1e-4)
    # off the grid the loss is rounded up: never a smaller epsilon
    assert epsilon_delta_pld(1.00003, delta, 1e-4).epsilon(delta) >= 1.00003


# ------------------------------------------------------------------------------ brute force
def _discrete_pair():
    p = np.array([0.05, 0.15, 0.3, 0.3, 0.2, 0.0])  # with the example
    q = np.array([0.01, 0.09, 0.2, 0.3, 0.35, 0.05])  # without it (asymmetric: some outcomes only here)
    return p, q


def test_discrete_pair_curve_bounds_neyman_pearson_in_both_orders():
    """From an asymmetric discrete pair's PLD (losses rounded up): at least the exact optimal test's TPR in
    both orders (null = without / null = with), and within the rounding's effect of the larger one."""
    p, q = _discrete_pair()
    pld = from_probability_mass_functions(p, q, discretization=1e-4)
    ours = tpr_from_pld(pld, ALPHA)
    member = neyman_pearson_tpr(q, p, ALPHA)  # null: without (q), alternative: with (p)
    reverse = neyman_pearson_tpr(p, q, ALPHA)
    assert np.all(ours >= member - 1e-12) and np.all(ours >= reverse - 1e-12)
    assert np.max(ours - np.maximum(member, reverse)) < 1e-3
    # one direction alone is not enough: the orders differ, and the curve takes the worse
    assert np.max(np.abs(member - reverse)) > 0.01


def test_the_binary_search_finds_the_minimum_over_every_atom():
    """The curve is exact for the discretized pair: equal to the minimum of both supporting lines over every
    atom eps (brute force, with dp_accounting's own hockey-stick divergences), in both orders."""
    pld = subsampled_gaussian(1.0, 0.2, discretization=2e-3).self_compose(5)
    alpha = np.linspace(0, 1, 41)

    def lines(an: str, na: str):
        atoms = lambda d: np.concatenate(([0.0], pld.pmf(d)[0][pld.pmf(d)[0] > 0]))  # noqa: E731
        ea, en = atoms(an), atoms(na)
        da = np.asarray(pld._direction(an).get_delta_for_epsilon(ea))[:, None]  # noqa: SLF001
        dn = np.asarray(pld._direction(na).get_delta_for_epsilon(en))[:, None]  # noqa: SLF001
        first = np.min(np.exp(ea)[:, None] * alpha + da, axis=0)
        second = np.min(1 - np.exp(-en)[:, None] * (1 - alpha - dn), axis=0)
        return np.minimum(np.minimum(first, second), 1.0)

    brute = np.maximum(np.maximum(lines("remove", "add"), lines("add", "remove")), alpha)
    np.testing.assert_allclose(tpr_from_pld(pld, alpha), brute, rtol=0, atol=1e-10)


# ------------------------------------------------------------------------------ dp_accounting
def _dpa_curve(dpa_pld, alpha):
    """The same two-line formula over dp_accounting's own hockey-stick divergences on a dense eps grid."""
    eps = np.linspace(0, 8, 2001)
    d_r = np.asarray(dpa_pld._pmf_remove.get_delta_for_epsilon(eps))  # noqa: SLF001
    d_a = np.asarray(dpa_pld._pmf_add.get_delta_for_epsilon(eps))  # noqa: SLF001
    e = np.exp(eps)[:, None]
    a = alpha[None, :]

    def order(d_an, d_na):
        return np.minimum(np.min(e * a + d_an[:, None], axis=0), np.min(1 - (1 - a - d_na[:, None]) / e, axis=0))

    return np.minimum(np.maximum(order(d_r, d_a), order(d_a, d_r)), 1.0)


def test_subsampled_gaussian_curve_against_dp_accounting():
    """DP-SGD (q = 0.02, sigma = 1, 300 steps): dpmf's curve is never below the one from dp_accounting's
    pessimistic PLD by more than its own discretization's effect, never below the one from dp_accounting's
    *optimistic* PLD (a lower bound on the truth), and close to both."""
    from dp_accounting.pld import privacy_loss_distribution as dpa

    alpha = np.concatenate((np.logspace(-6, -1, 11), np.linspace(0.15, 0.95, 9)))
    ours = tpr_from_pld(subsampled_gaussian(1.0, 0.02).self_compose(300), alpha)

    def theirs(pessimistic: bool):
        pld = dpa.from_gaussian_mechanism(1.0, sampling_prob=0.02, value_discretization_interval=1e-4,
                                          pessimistic_estimate=pessimistic, use_connect_dots=pessimistic)
        return _dpa_curve(pld.self_compose(300), alpha)

    pess, opt = theirs(True), theirs(False)
    assert np.all(ours >= opt - 1e-12), np.max(opt - ours)  # (the optimistic PLD is 300 x 1e-4 below: loose)
    assert np.all(ours >= pess - 1e-6), np.max(pess - ours)  # (their coarse eps grid can only lift theirs)
    np.testing.assert_allclose(ours, pess, rtol=2e-3, atol=1e-7)
    # the note's computed number: the implied mu at FPR 0.5 is about 0.409
    mu_half = stats.norm.ppf(float(tpr_from_pld(subsampled_gaussian(1.0, 0.01).self_compose(1000), 0.5)))
    assert mu_half == pytest.approx(0.409, abs=2e-3)


# ------------------------------------------------------------------------------ properties
def test_curve_properties():
    """Non-decreasing, at least the FPR, 1 at FPR 1; each order's curve is concave, the default (their
    maximum) need not be, the symmetric one is, and lies above the default."""
    pld = subsampled_gaussian(0.8, 0.05).self_compose(50)
    a = np.linspace(0, 1, 201)
    t = tpr_from_pld(pld, a)
    sym = tpr_from_pld(pld, a, symmetric=True)
    for curve in (t, sym):
        assert np.all(np.diff(curve) >= -1e-15)  # non-decreasing
        assert np.all(curve >= a - 1e-15) and curve[-1] == 1.0
    slopes = np.diff(sym) / np.diff(a)
    assert np.all(np.diff(slopes) <= 1e-6)  # concave (a minimum of lines)
    assert np.all(sym >= t - 1e-15) and np.max(sym - t) > 1e-4  # (the two orders cross: it matters)
    # each order alone is concave: a symmetric PLD (q = 1) gives a concave default curve
    g = tpr_from_pld(gaussian(0.8), a)
    assert np.all(np.diff(np.diff(g) / np.diff(a)) <= 1e-6)
    np.testing.assert_allclose(g, tpr_from_pld(gaussian(0.8), a, symmetric=True), atol=1e-12)
    # unsorted input: same values
    b = np.array([0.5, 0.01, 0.2])
    np.testing.assert_allclose(tpr_from_pld(pld, b), [tpr_from_pld(pld, x) for x in b])


def test_profile_curve_matches_the_pld_curve_and_is_sound_on_any_grid():
    """tpr_from_profile on a PLD's own hockey-stick divergences at every atom reproduces tpr_from_pld; on a
    coarser grid it can only be larger."""
    pld = subsampled_gaussian(1.0, 0.2, discretization=1e-3).self_compose(5)
    a = np.linspace(0, 1, 41)
    eps = np.unique(np.concatenate(([0.0], pld.pmf("remove")[0], pld.pmf("add")[0])))
    eps = eps[eps >= 0]
    d_r = np.asarray(pld.remove.get_delta_for_epsilon(eps)) + 1e-12
    d_a = np.asarray(pld.add.get_delta_for_epsilon(eps)) + 1e-12
    full = tpr_from_profile(eps, d_r, d_a, a)
    np.testing.assert_allclose(full, tpr_from_pld(pld, a), atol=1e-9)
    coarse = tpr_from_profile(eps[::50], d_r[::50], d_a[::50], a)
    assert np.all(coarse >= full - 1e-15)
    np.testing.assert_allclose(tpr_from_profile(eps, d_r, d_a, a, symmetric=True),
                               tpr_from_pld(pld, a, symmetric=True), atol=1e-9)
    with pytest.raises(InvalidParameterError, match="sorted"):
        tpr_from_profile([1.0, 0.5], [0.1, 0.2], [0.1, 0.2], 0.1)


def test_delta_offset_and_infinite_mass_lift_the_curve():
    pld = gaussian(1.0)
    base = tpr_from_pld(pld, ALPHA)
    lifted = tpr_from_pld(pld, ALPHA, delta_offset=1e-3)
    assert np.all(lifted >= base) and tpr_from_pld(pld, 0.0, delta_offset=1e-3) >= 1e-3
    assert np.max(lifted - base) <= 1e-3 * math.e + 1e-9


def test_regrid_is_pessimistic():
    pld = subsampled_gaussian(1.0, 0.01).self_compose(200)
    eps = pld.epsilon(1e-6)
    for disc in (1e-4, 3e-4, 1e-3, 2.7e-4):  # same, integer multiples and a non-integer ratio
        g = pld.regrid(disc)
        assert g.discretization == disc
        assert g.epsilon(1e-6) >= eps - 1e-12
        assert g.epsilon(1e-6) <= eps + 2 * disc
        assert np.all(tpr_from_pld(g, ALPHA) >= tpr_from_pld(pld, ALPHA) - 1e-12)
    assert pld.regrid(1e-4) is pld


# ------------------------------------------------------------------------------ composition
def test_gdp_composition_is_exact():
    c, hows = compose_curves([PrivacyCurve.gaussian(0.3), PrivacyCurve.gaussian(0.4)], [1, 3])
    assert c.kind == "gdp" and c.mu == pytest.approx(math.sqrt(0.09 + 3 * 0.16))
    assert c.epsilon_at(1e-6) == pytest.approx(gdp_epsilon(c.mu, 1e-6))
    assert all(h.startswith("exact") for h in hows)


def test_k_gaussian_plds_compose_to_sqrt_k_mu():
    k, sigma = 9, 2.0
    c = PrivacyCurve.from_pld(gaussian(sigma)).self_compose(k)
    exact = gaussian_tpr(math.sqrt(k) / sigma, ALPHA[1:-1])
    ours = c.tpr(ALPHA[1:-1])
    assert np.all(ours >= exact - 1e-12) and np.max(ours - exact) < 1e-4
    assert c.epsilon_at(1e-6) == pytest.approx(gdp_epsilon(math.sqrt(k) / sigma, 1e-6), rel=1e-3)


def test_composition_is_commutative_and_never_below_its_parts():
    a = PrivacyCurve.from_pld(subsampled_gaussian(1.0, 0.1).self_compose(10))
    b = PrivacyCurve.from_pld(gaussian(3.0, discretization=2e-4))  # another grid: regridded up
    ab, ba = a.compose(b), b.compose(a)
    assert ab.discretization == 2e-4
    assert ab.epsilon_at(1e-6) == pytest.approx(ba.epsilon_at(1e-6), rel=1e-9)
    for part in (a, b):
        assert ab.delta_at(1.0) >= part.delta_at(1.0)
        assert np.all(ab.tpr(ALPHA) >= part.tpr(ALPHA) - 1e-12)


def test_mismatched_grids_are_refused_at_the_pld_level():
    with pytest.raises(InvalidParameterError, match="different discretizations"):
        gaussian(1.0).compose(gaussian(1.0, discretization=2e-4))


def test_epsilon_delta_parts_compose_through_their_dominating_pair():
    """Not tight, and said so; it is the *optimal* composition of (eps, delta)-DP parts: Kairouz, Oh &
    Viswanath's closed form (Thm 3.3) -- k-fold composition is ((k - 2i) eps, 1 - (1 - delta)^k (1 - delta_i))-DP
    with delta_i = sum_{l < i} C(k, l) (e^{(k-l) eps} - e^{(k-2i+l) eps}) / (1 + e^eps)^k, and no better."""
    eps, delta, k = 0.1, 1e-6, 50
    c, hows = compose_curves([PrivacyCurve.from_epsilon_delta(eps, delta)], [k])
    assert hows[0].startswith("NOT tight")
    for i in (0, 5, 10, 15):
        d_i = math.fsum(math.comb(k, l) * (math.exp((k - l) * eps) - math.exp((k - 2 * i + l) * eps))
                        for l in range(i)) / (1 + math.exp(eps)) ** k
        kov = 1 - (1 - delta) ** k * (1 - d_i)
        assert c.delta_at((k - 2 * i) * eps) == pytest.approx(kov, rel=1e-6, abs=1e-12)
    assert c.delta_at(k * eps) <= k * delta  # basic composition holds
    assert c.epsilon_at(1e-4) < 0.75 * k * eps  # and the optimal composition is far better here


def test_several_plds_mean_the_worst_and_compose_only_through_the_claim():
    p1, p2 = gaussian(1.0), subsampled_gaussian(0.5, 0.3)
    c = PrivacyCurve.from_pld([(p1, 0.0), (p2, 1e-7)], epsilon=6.0, delta=1e-5)
    worst = np.maximum(tpr_from_pld(p1, ALPHA), tpr_from_pld(p2, ALPHA, delta_offset=1e-7))
    np.testing.assert_allclose(c.tpr(ALPHA), worst)
    _, hows = compose_curves([c, PrivacyCurve.from_pld(p1)])
    assert hows[0].startswith("NOT tight") and "worst of 2" in hows[0]
    with pytest.raises(DPMFError, match="no .epsilon, delta. claim"):
        PrivacyCurve.from_pld([(p1, 0.0), (p2, 0.0)]).as_pld(1e-4)


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("fpr", [float("nan"), -0.1, 1.5, [[0.1]], [], "x"])
def test_bad_fpr_is_refused(fpr):
    with pytest.raises(InvalidParameterError, match="fpr"):
        tpr_gdp(1.0, fpr)
    with pytest.raises(InvalidParameterError, match="fpr"):
        tpr_from_pld(gaussian(1.0), fpr)


def test_bad_curves_are_refused():
    with pytest.raises(InvalidParameterError, match="mu"):
        tpr_gdp(-1.0, 0.1)
    with pytest.raises(InvalidParameterError, match="kind"):
        PrivacyCurve("rdp")
    with pytest.raises(InvalidParameterError, match="epsilon"):
        PrivacyCurve.from_epsilon_delta(float("nan"), 1e-5)
    with pytest.raises(InvalidParameterError, match="delta_offset"):
        tpr_from_pld(gaussian(1.0), 0.1, delta_offset=-1e-3)
    with pytest.raises(InvalidParameterError, match="pld"):
        tpr_from_pld("not a pld", 0.1)
    with pytest.raises(InvalidParameterError, match="nothing to compose"):
        compose_curves([])


def test_tradeoff_result():
    t = TradeOff.of(PrivacyCurve.gaussian(1.0), [0.01, 0.1])
    assert t.kind == "gdp" and t.mu == 1.0 and "exact" in t.mu_note and t.tpr.shape == (2,)
    d = t.to_dict()
    assert d["fpr"] == [0.01, 0.1] and d["tpr"][0] == pytest.approx(gaussian_tpr(1.0, 0.01))
    assert isinstance(TradeOff.of(PrivacyCurve.gaussian(1.0), 0.01).tpr, float)
    assert isinstance(PrivacyLossDistribution.identity().regrid(1e-3), PrivacyLossDistribution)
