"""Fresh slots and k-of-t allocation for DP-SGD (``dpmf.accounting.allocation.pld_compose``).

Oracles (no peer needed): exact integration of the product pair for t = 2, 3 over two epochs
(fresh slots), of the Gaussian x 1-of-2 product (the k-of-t reduction of 2-of-3) and of the exact
2-of-3 pair itself; the Gaussian mechanism. Feldman & Shenfeld's bounds only where installed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize

from dpmf.accounting.allocation import pld_compose
from dpmf.accounting.allocation.pld import account_allocation_pld, allocation_pld_epsilon
from dpmf.privacy import gaussian_epsilon
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import Identity

from test_allocation_pld import _call, _put, _stop_loss  # noqa: E402  (the one-epoch oracle)

DELTA = 1e-5
_HZ, _HW = np.polynomial.hermite_e.hermegauss(48)
_HW = _HW / math.sqrt(2 * math.pi)


def _outer(t: int, eta: float):
    """Nodes and weights of ``S = (X_1 + ... + X_t) / t`` (tensor Gauss-Hermite over the z's)."""
    s = math.sqrt(eta)
    grids = np.meshgrid(*([_HZ] * t), indexing="ij")
    ws = np.meshgrid(*([_HW] * t), indexing="ij")
    S = sum(np.exp(s * g - eta / 2) for g in grids).ravel() / t
    W = np.prod(ws, axis=0).ravel()
    return S, W


def _two_epochs_delta(direction: str, eps: float, t: int, sigma: float) -> float:
    """Exact delta of the product of two 1-of-t pairs: remove ``E[(S1 S2 - g)_+]`` =
    ``E[S1 E[(S2 - g/S1)_+]]``, add ``E[(1 - g S1 S2)_+]`` = ``E[g S1 E[(1/(g S1) - S2)_+]]``."""
    eta = 1.0 / sigma**2
    S, W = _outer(t, eta)
    g = math.exp(eps)
    if direction == "remove":
        inner = _stop_loss(t * g / S, eta, t, True) / t
        return float(np.sum(W * S * inner))
    inner = _stop_loss(t / (g * S), eta, t, False) / t
    return float(np.sum(W * g * S * inner))


def _solve(fn) -> float:
    return optimize.brentq(lambda e: fn(e) - DELTA, 0.0, 12.0, xtol=1e-7)


#: Tightness target against exact integration, fixed from the discretization (not from results):
#: the grids are refined to 2e-4 relative and the composed losses sit on a 1e-3 grid, so the
#: reported epsilon (the larger direction) must be within 1% of the exact one. A direction that
#: cannot decide the answer (its bound is below the other direction's) is only refined until it is
#: below it (pld_compose._ADD_REACH), so there it must be sound and below the other direction.
EXACT_TARGET = 1.01


def _check_against_exact(r, exact: dict) -> None:
    got = r["epsilon_by_direction"]
    for d in ("remove", "add"):
        assert got[d] >= exact[d] * (1 - 1e-9), (d, got[d], exact[d])  # an upper bound in each direction
    assert r["epsilon"] <= max(exact.values()) * EXACT_TARGET, (r["epsilon"], exact)
    for d, other in (("remove", "add"), ("add", "remove")):
        assert got[d] <= exact[d] * EXACT_TARGET or got[d] <= got[other], (d, got, exact)


# (t = 3 is out of reach of this oracle: 48^3 outer nodes x 600 x 300 inner ones is a 148 GiB array)
@pytest.mark.parametrize("t,sigma", [(2, 1.0), pytest.param(2, 0.7, marks=pytest.mark.slow)])
def test_fresh_slots_two_epochs_match_exact_integration(t, sigma):
    r = allocation_pld_epsilon(sigma, t, DELTA, epochs=2, fresh_slots=True)
    _check_against_exact(r, {d: _solve(lambda e: _two_epochs_delta(d, e, t, sigma)) for d in ("remove", "add")})


def _gauss_times_alloc2_delta(direction: str, eps: float, sigma: float) -> float:
    """Exact delta of N(1, s^2) vs N(0, s^2) composed with the 1-of-2 pair (remove / add)."""
    eta = 1.0 / sigma**2
    s = math.sqrt(eta)
    z, w = _HZ, _HW
    Y = np.exp(s * z - eta / 2)  # the Gaussian's likelihood ratio under Q
    g = math.exp(eps)
    if direction == "remove":
        return float(np.sum(w * Y * _stop_loss(2 * g / Y, eta, 2, True) / 2))
    return float(np.sum(w * g * Y * _stop_loss(2 / (g * Y), eta, 2, False) / 2))


def _two_of_three_delta(direction: str, eps: float, sigma: float) -> float:
    """Exact 2-of-3 pair: ``S = (X1 X2 + X1 X3 + X2 X3) / 3``, X3 integrated in closed form."""
    eta = 1.0 / sigma**2
    S, W = _outer(2, eta)  # S = (X1 + X2)/2
    s = math.sqrt(eta)
    zz = np.meshgrid(_HZ, _HZ, indexing="ij")
    X1, X2 = (np.exp(s * g - eta / 2).ravel() for g in zz)
    A, B = X1 * X2, X1 + X2  # 3 S = A + B X3
    g = math.exp(eps)
    if direction == "remove":  # E[(A + B X3 - 3g)_+] / 3
        return float(np.sum(W * B * _call((3 * g - A) / B, eta)) / 3)
    return float(np.sum(W * g * B * _put((3 / g - A) / B, eta)) / 3)  # E[(1 - g S)_+]


def test_k_of_t_two_of_three_is_an_upper_bound_and_its_reduction_is_tight():
    sigma = 1.5
    r = allocation_pld_epsilon(sigma, 3, DELTA, num_selected=2)
    assert r["composition"] == [{"steps": 1, "copies": 1}, {"steps": 2, "copies": 1}]
    reductions = {}
    for d in ("remove", "add"):
        reductions[d] = _solve(lambda e: _gauss_times_alloc2_delta(d, e, sigma))
        exact = _solve(lambda e: _two_of_three_delta(d, e, sigma))
        assert exact <= reductions[d] * (1 + 1e-6)  # the proved reduction dominates the exact pair
    # here the add direction decides the answer (it was 9% loose with the add window at S <= 4)
    _check_against_exact(r, reductions)


def test_k_equal_t_is_the_gaussian_mechanism_composed():
    """t-of-t: every example in every step = t Gaussian steps = one Gaussian at sigma / sqrt(t)."""
    sigma, t = 2.0, 4
    eps = allocation_pld_epsilon(sigma, t, DELTA, num_selected=t)["epsilon"]
    exact = gaussian_epsilon(sigma / 2, DELTA)
    assert exact * (1 - 1e-9) <= eps <= exact * 1.01


def test_num_selected_one_is_one_slot_allocation_exactly():
    a = allocation_pld_epsilon(1.0, 64, DELTA)
    b = allocation_pld_epsilon(1.0, 64, DELTA, num_selected=1)
    assert a["epsilon_by_direction"] == b["epsilon_by_direction"]


def test_fresh_slots_over_one_epoch_equal_reused_slots():
    a = allocation_pld_epsilon(1.0, 64, DELTA, epochs=1, fresh_slots=True)
    b = allocation_pld_epsilon(1.0, 64, DELTA, epochs=1, fresh_slots=False)
    assert a["epsilon_by_direction"] == b["epsilon_by_direction"]


def test_fresh_slots_are_more_private_than_reused_over_epochs():
    fresh = allocation_pld_epsilon(1.0, 32, DELTA, epochs=3, fresh_slots=True)["epsilon"]
    reused = allocation_pld_epsilon(1.0, 32, DELTA, epochs=3)["epsilon"]
    assert fresh < reused


def test_split_k_of_t():
    for t in range(1, 30):
        for k in range(1, t + 1):
            parts = pld_compose.split_k_of_t(t, k)
            assert sum(c for _, c in parts) == k and sum(m * c for m, c in parts) == t


def test_the_scheme_drives_the_accountant():
    r = account_allocation_pld(Identity(64), BallsInBinsSampling(2, 64, num_selected=2, fresh_slots=True), 1.0, DELTA)
    direct = allocation_pld_epsilon(1.0, 32, DELTA, epochs=2, num_selected=2, fresh_slots=True)
    assert r.epsilon == direct["epsilon"] and r.certified
    assert "4 x 1-of-16" in r.diagnostics["reduction"]


def test_refinement_never_returns_inf_at_small_delta():
    """The issue's case (sigma 1.3, t 300, delta 1e-10) and a low-noise one: finite, amplified."""
    for sigma in (1.3, 0.7):
        r = allocation_pld_epsilon(sigma, 300, 1e-10)
        assert math.isfinite(r["epsilon"]) and r["epsilon"] < 0.9 * r["gaussian_epsilon"]
        for levels in r["refinements"].values():
            assert all(math.isfinite(L["epsilon"]) for L in levels)


# Feldman & Shenfeld's bounds (pld-accounting 2.0: gaussian_allocation_epsilon_range(delta, sigma,
# num_steps, [num_selected, num_epochs]) -> (upper, lower)), computed once; the exact oracles above
# run without the package. (sigma, t, delta, kwargs): (lower, upper)
PEER = {
    (1.3, 300, 1e-10, ()): (0.38702757112157826, 0.40330364006442804),
    (0.7, 300, 1e-10, ()): (4.032957456510251, 4.052944441833099),
    (1.0, 64, 1e-5, (("num_epochs", 2),)): (1.0417895612327392, 1.081265255290724),
    (1.0, 64, 1e-5, (("num_selected", 2),)): (1.5583898545618755, 1.6136034031132356),
    (1.0, 64, 1e-5, (("num_epochs", 4),)): (1.3872127146702014, 1.4401962140001205),
}


@pytest.mark.parametrize("key", list(PEER))
def test_between_the_peers_bounds(key):
    sigma, t, delta, kw = key
    kw = dict(kw)
    lower, upper = PEER[key]
    eps = allocation_pld_epsilon(sigma, t, delta, epochs=kw.get("num_epochs", 1), fresh_slots=True,
                                 num_selected=kw.get("num_selected", 1))["epsilon"]
    assert lower <= eps <= 1.05 * upper, (eps, lower, upper)
