"""The PLD accountant for DP-SGD under random allocation (``dpmf.accounting.allocation.pld``).

Oracles: the Gaussian mechanism (t = 1), brute-force numerical integration of the exact pair for
t = 2, 3, and Feldman & Shenfeld's own lower/upper bounds (pld-accounting 2.0, pinned below).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, special

import dpmf
from dpmf.accounting.allocation import grid
from dpmf.accounting.allocation import pld as ap
from dpmf.accounting.allocation.pld import (
    account_allocation_pld,
    allocation_pld_epsilon,
    calibrate_allocation_pld,
)
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.privacy import gaussian_epsilon
from dpmf.sampling import BallsInBinsSampling, PoissonSampling
from dpmf.strategies import Identity, ToeplitzStrategy, bsr

DELTA = 1e-5

# Feldman & Shenfeld's bounds, computed once with pld-accounting 2.0 (PyPI, installed with
# ``pip install --target DIR pld-accounting==2.0 --no-deps``, dp-accounting 0.6.0, numba present):
#   from PLD_accounting import gaussian_allocation_epsilon_range
#   upper, lower = gaussian_allocation_epsilon_range(delta=1e-5, sigma=sigma, num_steps=t)
# (num_selected=1, num_epochs=1, default epsilon_accuracy). (t, sigma): (lower, upper).
PEER = {
    (8, 0.8): (3.605440115753613, 3.639022980538245),
    (8, 1.0): (2.3667836991050843, 2.4052077713837194),
    (8, 2.0): (0.6881929748041703, 0.7195032092223038),
    (64, 0.8): (1.7057360867823936, 1.7382183927103985),
    (64, 1.0): (0.820573385944628, 0.8481482801667106),
    (64, 2.0): (0.21747362885003516, 0.22636926277163108),
    (128, 0.8): (1.184751384033475, 1.2132871614039786),
    (128, 1.0): (0.5160916178799662, 0.535984552720909),
    (128, 2.0): (0.14859045685693653, 0.1544864895498885),
    (1000, 0.8): (0.2786494589620857, 0.290936826590173),
    (1000, 1.0): (0.13637359041954913, 0.14218228894564813),
    (1000, 2.0): (0.04785137308284179, 0.0498665476076243),
    (10000, 0.8): (0.05915057072089454, 0.061920983566951054),
    (10000, 1.0): (0.03655191504386544, 0.03829234257649182),
    (10000, 2.0): (0.013154885865078491, 0.013921658236594905),
}
FAST_PEER = [k for k in PEER if k[0] <= 128]
SLOW_PEER = [k for k in PEER if k[0] > 128]


# ----------------------------------------------------------------------------- brute force
def _call(k, eta):
    """E[(X - k)_+] for the mean-one lognormal (vectorized; k may be <= 0)."""
    k = np.asarray(k, dtype=np.float64)
    s = math.sqrt(eta)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (np.log(np.where(k > 0, k, 1.0)) + eta / 2) / s
        pos = special.ndtr(-(z - s)) - k * special.ndtr(-z)
    return np.where(k > 0, pos, 1.0 - k)


def _put(k, eta):
    """E[(k - X)_+] (vectorized; 0 for k <= 0)."""
    k = np.asarray(k, dtype=np.float64)
    s = math.sqrt(eta)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (np.log(np.where(k > 0, k, 1.0)) + eta / 2) / s
        pos = k * special.ndtr(z) - special.ndtr(z - s)
    return np.where(k > 0, np.maximum(pos, 0.0), 0.0)


_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(300)
_ZMIN, _ZMAX = -12.0, 12.0


def _pieces(k, eta, upper: bool):
    """Gauss-Legendre nodes ``z`` (shape ``k.shape + (m,)``) and weights (normal density folded in)
    over ``[-12, 12]``, split at the kink ``x(z) = k`` where ``x(z) = exp(sqrt(eta) z - eta/2)``;
    ``upper=False`` keeps only ``x(z) < k`` (where a put is non-zero)."""
    s = math.sqrt(eta)
    with np.errstate(divide="ignore"):
        kink = np.clip((np.log(np.maximum(k, 0.0)) + eta / 2) / s, _ZMIN, _ZMAX)
    parts = [(np.full_like(kink, _ZMIN), kink)] + ([(kink, np.full_like(kink, _ZMAX))] if upper else [])
    zs, ws = [], []
    for lo, hi in parts:
        half = (hi - lo)[..., None] / 2
        z = lo[..., None] + half * (_NODES + 1)
        zs.append(z)
        ws.append(half * _WEIGHTS * np.exp(-z * z / 2) / math.sqrt(2 * math.pi))
    return np.concatenate(zs, axis=-1), np.concatenate(ws, axis=-1)


def _stop_loss(k, eta, t: int, upper: bool):
    """``E[(X_1 + ... + X_t - k)_+]`` (``upper``) or ``E[(k - X_1 - ... - X_t)_+]``, exactly up to
    quadrature: t - 1 nested Gauss-Legendre integrals split at the kink, the last in closed form."""
    k = np.asarray(k, dtype=np.float64)
    if t == 1:
        return _call(k, eta) if upper else _put(k, eta)
    z, w = _pieces(k, eta, upper)
    x = np.exp(math.sqrt(eta) * z - eta / 2)
    return np.sum(w * _stop_loss(k[..., None] - x, eta, t - 1, upper), axis=-1)


def _brute_delta(direction: str, eps: float, t: int, sigma: float) -> float:
    """Exact delta of the pair (remove: E[(S - e^eps)_+]; add: E[(1 - e^eps S)_+])."""
    eta = 1.0 / sigma**2
    if direction == "remove":
        return float(_stop_loss(np.array(t * math.exp(eps)), eta, t, True)) / t
    return math.exp(eps) * float(_stop_loss(np.array(t * math.exp(-eps)), eta, t, False)) / t


def _brute_epsilon(direction: str, t: int, sigma: float, delta: float = DELTA) -> float:
    return optimize.brentq(lambda e: _brute_delta(direction, e, t, sigma) - delta, 0.0, 40.0, xtol=1e-14)


def _grid_epsilon(direction: str, t: int, sigma: float, delta: float = DELTA) -> float:
    """One direction on the grid, refined to convergence (the public function short-cuts t = 1)."""
    eta = 1.0 / sigma**2
    best, _ = grid.refine(direction, eta, t, delta, gaussian_epsilon(sigma, delta), 1e-6, 2**16)
    return best


def test_brute_force_reproduces_the_gaussian_mechanism():
    for sigma in (0.8, 2.0):
        for d in ("remove", "add"):
            assert _brute_epsilon(d, 1, sigma) == pytest.approx(gaussian_epsilon(sigma, DELTA), rel=1e-9)


# ----------------------------------------------------------------------------- closed forms
@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
def test_one_step_is_the_gaussian_mechanism(sigma):
    exact = gaussian_epsilon(sigma, DELTA)
    r = account_allocation_pld(Identity(1), BallsInBinsSampling(1, 1), sigma, DELTA)
    assert r.epsilon == exact and r.certified
    for d in ("remove", "add"):  # the grid machinery itself, run at t = 1
        grid = _grid_epsilon(d, 1, sigma)
        assert exact * (1 - 1e-12) <= grid <= exact * (1 + 1e-6)


@pytest.mark.parametrize("t", [2, 3])
@pytest.mark.parametrize("sigma", [0.8, 2.0])
def test_small_t_matches_brute_force_and_never_undercuts_it(t, sigma):
    for d in ("remove", "add"):
        exact = _brute_epsilon(d, t, sigma)
        grid = _grid_epsilon(d, t, sigma)
        assert grid >= exact * (1 - 1e-9), (d, grid, exact)  # an upper bound...
        assert grid <= exact * (1 + 2e-5), (d, grid, exact)  # ...and a tight one


def test_brute_force_values_t2():
    """Independent check of the oracle (scalar adaptive quadrature): remove at t=2, sigma=0.8."""
    from scipy import integrate

    eta = 1 / 0.8**2
    s = math.sqrt(eta)
    eps = _brute_epsilon("remove", 2, 0.8)
    f = lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi) * float(_call(2 * math.exp(eps) - math.exp(s * z - eta / 2), eta))
    val = integrate.quad(f, -12, 12, limit=400, epsabs=1e-16, epsrel=1e-12)[0] / 2
    assert val == pytest.approx(DELTA, rel=1e-7)
    assert eps == pytest.approx(4.98996, abs=1e-5)


# ----------------------------------------------------------------------------- the peer's bounds
def _check_against_peer(t, sigma):
    lower, upper = PEER[(t, sigma)]
    eps = allocation_pld_epsilon(sigma, t, DELTA)["epsilon"]
    assert eps >= lower, (eps, lower)  # never below their lower bound
    assert eps <= 1.01 * upper, (eps, upper)  # at most 1% above their upper bound
    return eps / upper


@pytest.mark.parametrize("t,sigma", FAST_PEER)
def test_within_feldman_shenfeld_bounds(t, sigma):
    _check_against_peer(t, sigma)


@pytest.mark.slow
@pytest.mark.parametrize("t,sigma", SLOW_PEER)
def test_within_feldman_shenfeld_bounds_large_t(t, sigma):
    _check_against_peer(t, sigma)


def test_within_feldman_shenfeld_bounds_t1000_fast_case():
    _check_against_peer(1000, 2.0)


# ----------------------------------------------------------------------------- properties
def test_monotone_in_sigma():
    eps = [allocation_pld_epsilon(s, 64, DELTA)["epsilon"] for s in (0.7, 0.9, 1.2, 1.6, 2.5)]
    assert all(a > b for a, b in zip(eps, eps[1:])), eps


def test_monotone_in_steps():
    eps = [allocation_pld_epsilon(1.0, t, DELTA)["epsilon"] for t in (2, 4, 8, 32, 128, 512)]
    assert all(a > b for a, b in zip(eps, eps[1:])), eps


def test_below_the_gaussian_mechanism_and_remove_dominates_for_many_steps():
    out = allocation_pld_epsilon(1.0, 64, DELTA)
    assert out["epsilon"] < out["gaussian_epsilon"]
    assert out["epsilon_by_direction"]["remove"] >= out["epsilon_by_direction"]["add"]


@pytest.mark.parametrize("epochs", [2, 4])
def test_epochs_are_one_epoch_at_scaled_noise(epochs):
    b, sigma = 16, 2.0
    k = account_allocation_pld(Identity(epochs * b), BallsInBinsSampling(epochs, epochs * b), sigma, DELTA)
    one = account_allocation_pld(Identity(b), BallsInBinsSampling(1, b), sigma / math.sqrt(epochs), DELTA)
    assert k.epsilon_by_direction == one.epsilon_by_direction
    assert "reduction" in k.diagnostics


def test_two_epochs_match_brute_force_of_the_reused_slot():
    """Two epochs of t = 2 (slot reused) against the exact pair at sigma / sqrt(2)."""
    reused = _brute_epsilon("remove", 2, 1.0 / math.sqrt(2))
    ours = account_allocation_pld(Identity(4), BallsInBinsSampling(2, 4), 1.0, DELTA).epsilon
    assert reused * (1 - 1e-9) <= ours <= reused * (1 + 1e-3)


def test_calibration_round_trip():
    scheme = BallsInBinsSampling(1, 64)
    sigma = calibrate_allocation_pld(Identity(64), scheme, 1.0, DELTA, rel_tol=1e-4)
    at = account_allocation_pld(Identity(64), scheme, sigma, DELTA).epsilon
    below = account_allocation_pld(Identity(64), scheme, sigma * (1 - 1e-3), DELTA).epsilon
    assert at <= 1.0 < below


# ----------------------------------------------------------------------------- dispatch
def test_auto_takes_the_pld_accountant_for_identity_balls_in_bins():
    # auto runs the Renyi/conditional accountant too, at any size (tests/accounting/test_auto_minimum.py)
    strategy, scheme = Identity(80), BallsInBinsSampling(1, 80)
    r = dpmf.account(strategy, scheme, 1.0, DELTA)
    assert r.method == "allocation_pld"
    assert "allocation" in r.diagnostics["all_methods"]
    assert r.epsilon == account_allocation_pld(strategy, scheme, 1.0, DELTA).epsilon


def test_supports_balls_in_bins_with_a_non_negative_lower_triangular_c():
    assert ap.supports(Identity(8), BallsInBinsSampling(2, 8)) is None
    assert ap.supports(bsr(8, 2), BallsInBinsSampling(1, 8)) is None  # (the orthogonal-groups bound)
    assert ap.supports(Identity(8), PoissonSampling(0.1, 8)) is not None
    assert ap.supports(ToeplitzStrategy([1.0, -0.5], 8), BallsInBinsSampling(1, 8)) is not None
    with pytest.raises(UnsupportedConfigurationError):
        account_allocation_pld(ToeplitzStrategy([1.0, -0.5], 8), BallsInBinsSampling(1, 8), 1.0, DELTA)
    with pytest.raises(UnsupportedConfigurationError):
        calibrate_allocation_pld(Identity(8), PoissonSampling(0.1, 8), 1.0, DELTA)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"noise_multiplier": -1.0},
        {"noise_multiplier": float("nan")},
        {"delta": 0.0},
        {"delta": 1.5},
        {"accuracy": 0.0},
        {"max_points": 10},
    ],
)
def test_bad_input(kwargs):
    args = {"noise_multiplier": 1.0, "delta": DELTA, **kwargs}
    with pytest.raises(InvalidParameterError):
        account_allocation_pld(Identity(8), BallsInBinsSampling(1, 8), **args)


# ----------------------------------------------------------------------------- small delta, small sigma
def test_small_delta_small_sigma_matches_brute_force_t2():
    """delta = 1e-12, sigma = 0.7, t = 2 (both directions near eps = 10, where the add charge is
    multiplied by e^10 and the remove tail holds mass ~1e-14). Target, fixed from the refinement
    tolerance 2e-4 before measuring: the reported epsilon within 1% of the exact one (it returned
    the unamplified 10.709 against an exact ~10.02 before the relative charge allowance)."""
    delta = 1e-12
    exact = max(_brute_epsilon(d, 2, 0.7, delta) for d in ("remove", "add"))
    r = allocation_pld_epsilon(0.7, 2, delta)
    for d in ("remove", "add"):
        assert r["epsilon_by_direction"][d] >= _brute_epsilon(d, 2, 0.7, delta) * (1 - 1e-9)
    assert exact <= r["epsilon"] <= exact * 1.01, (r["epsilon"], exact)


def test_small_delta_small_sigma_within_the_peer_bounds_t10():
    """sigma 0.5, t = 10, delta = 1e-12: PLD_accounting 2.0 gives [13.3152, 13.3477] (computed once,
    benchmarks/bench_allocation_tightness.py). Target: the issue's, within 5% of the upper bound and
    never below the lower one (before the per-cell rounding mass it was the unamplified 15.64)."""
    lower, upper = 13.3152, 13.3477
    eps = allocation_pld_epsilon(0.5, 10, 1e-12)["epsilon"]
    assert lower <= eps <= 1.05 * upper, eps


# ----------------------------------------------------------------------------- the closed-form lower bound
@pytest.mark.parametrize("t", [1, 2, 3])
@pytest.mark.parametrize("sigma", [0.4, 0.8, 2.0])
def test_pair_lower_bound_is_below_the_exact_epsilon_and_not_trivial(t, sigma):
    """``identity_pair_epsilon_lower_bound`` (used to skip members that cannot win) is below the exact
    remove epsilon (quadrature oracle) and, at small noise where it matters, within 25% of it."""
    from dpmf.accounting.allocation.correlated import identity_pair_epsilon_lower_bound

    exact = _brute_epsilon("remove", t, sigma)
    lb = identity_pair_epsilon_lower_bound(sigma, t, DELTA)
    assert lb <= exact, (lb, exact)
    if sigma <= 0.8:
        assert lb >= 0.75 * exact, (lb, exact)
    if t == 1:
        assert lb == pytest.approx(exact, rel=1e-5)


@pytest.mark.parametrize("sigma, t, delta", [(0.23, 8, 1e-3), (0.371, 2, 1e-3), (0.5, 2, 1e-10), (0.5, 3, 1e-12)])
def test_small_noise_windows_stay_within_max_points(sigma, t, delta):
    """At small noise the add direction's answer sits at its window's end; reaching further used to
    jump to the whole range at the finest grid (windows of 1.1e7 points, 15-47 s for one epsilon).
    Every level's window now stays within ``max_points``, and the epsilon is the remove direction's
    (the add bound is below it, so it cannot decide the max) and never below the lower bound."""
    from dpmf.accounting.allocation.correlated import identity_pair_epsilon_lower_bound

    out = allocation_pld_epsilon(sigma, t, delta)
    widths = [lvl["points"] for levels in out["refinements"].values() for lvl in levels]
    assert max(widths) <= ap.DEFAULT_MAX_POINTS, widths
    assert out["epsilon"] == out["epsilon_by_direction"]["remove"] >= out["epsilon_by_direction"]["add"]
    assert out["epsilon"] >= identity_pair_epsilon_lower_bound(sigma, t, delta)
