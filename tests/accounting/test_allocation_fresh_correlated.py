"""Correlated C with a fresh slot each epoch (``allocation/fresh_correlated.py``).

Oracles: (a) Monte Carlo of the exact pair (the mixture over all ``b^k`` patterns, small cases): the
bound is never below its lower end, and the same reduction composed over one epoch only undercuts it
(negative control: the composition over the epochs is what is paid); (b) the identity given as a plain
matrix reproduces the identity's own fresh-slot accountant; (c) step 1's matrix inequality
(block-diagonal with the moved diagonal minus the Gram of all steps is positive semidefinite).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_allocation_correlated import _mc_epsilon_interval

import dpmf
from dpmf.accounting.allocation.correlated import reduced_epsilon
from dpmf.accounting.allocation.dominating_pair import mixture_means
from dpmf.accounting.allocation.fresh_correlated import epoch_grams, fresh_slot_reductions
from dpmf.accounting.allocation.pld import allocation_pld_epsilon
from dpmf.errors import UnsupportedConfigurationError
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import ToeplitzStrategy, bsr


def _pattern_means(strategy, k: int, n: int) -> np.ndarray:
    """One row per pattern ``(tau_0, .., tau_{k-1})``: ``sum_e C[:, e b + tau_e]`` (written out)."""
    m = mixture_means(strategy, 1, n)
    b = n // k
    return np.array([sum(m[e * b + t] for e, t in enumerate(tau)) for tau in itertools.product(range(b), repeat=k)])


CASES = [(bsr(16, 4), 2, 1.5), (ToeplitzStrategy([1.0, 0.8, 0.6], 12), 3, 2.0), (bsr(8, 3), 2, 1.0)]


@pytest.mark.parametrize("strategy, k, sigma", CASES, ids=["bsr16x4-2ep", "toeplitz12-3ep", "bsr8x3-2ep"])
def test_never_below_the_monte_carlo_lower_end_of_the_exact_pair(strategy, k, sigma):
    delta, n = 1e-3, strategy.n
    scheme = BallsInBinsSampling(k, n, fresh_slots=True)
    report = dpmf.account(strategy, scheme, sigma, delta, method="allocation_pld")
    point, lower = _mc_epsilon_interval(_pattern_means(strategy, k, n), sigma, delta, 300_000, seed=5)
    assert report.epsilon >= lower
    assert report.epsilon < dpmf.account(strategy, scheme, sigma, delta, method="unamplified").epsilon
    assert "fresh slots" in report.diagnostics["reduction"]


def test_negative_control_one_epoch_of_the_composition_undercuts_the_exact_pair():
    """The Monte Carlo check has the power to catch a bound that forgets the composition over the
    epochs: the same members composed over one epoch only are below its lower end. (On the two bsr
    cases above the reduction to the identity's pair is loose enough that even one copy is above.)"""
    strategy, k, sigma, delta = ToeplitzStrategy([1.0, 0.8, 0.6], 12), 3, 2.0, 1e-3
    scheme = BallsInBinsSampling(k, strategy.n, fresh_slots=True)
    _, lower = _mc_epsilon_interval(_pattern_means(strategy, k, strategy.n), sigma, delta, 300_000, seed=5)
    one = reduced_epsilon(fresh_slot_reductions(strategy, scheme), sigma, delta, allocation_pld_epsilon)
    assert one["epsilon"] < lower


def test_identity_as_a_matrix_is_the_identity_accountant():
    n, k, sigma, delta = 24, 3, 1.2, 1e-5
    scheme = BallsInBinsSampling(k, n, fresh_slots=True)
    red = fresh_slot_reductions(np.eye(n), scheme)
    assert [(g.period, g.slots, g.max_eigenvalue) for g in red.spectral][0][:2] == (1, n // k)
    got = reduced_epsilon(red, sigma, delta, allocation_pld_epsilon, epochs=k, fresh_slots=True)
    want = allocation_pld_epsilon(sigma, n // k, delta, epochs=k, fresh_slots=True)
    assert got["epsilon"] == pytest.approx(want["epsilon"], rel=1e-9) and got["epsilon"] >= want["epsilon"]


@pytest.mark.parametrize("strategy, k", [(bsr(16, 4), 2), (ToeplitzStrategy([1.0, 0.8, 0.6], 12), 3), (bsr(24, 5), 4)])
def test_moving_the_cross_epoch_entries_to_the_diagonal_dominates_the_gram(strategy, k):
    m = mixture_means(strategy, 1, strategy.n)
    gram = m @ m.T
    blocks = epoch_grams(m, k)
    big = np.zeros_like(gram)
    b = strategy.n // k
    for e, g in enumerate(blocks):
        big[e * b:(e + 1) * b, e * b:(e + 1) * b] = g
    assert np.linalg.eigvalsh(big - gram).min() >= -1e-12 * np.abs(gram).max()
    # and it is needed: the blocks alone do not dominate
    plain = np.zeros_like(gram)
    for e in range(k):
        plain[e * b:(e + 1) * b, e * b:(e + 1) * b] = gram[e * b:(e + 1) * b, e * b:(e + 1) * b]
    assert np.linalg.eigvalsh(plain - gram).min() < -1e-6


def test_refusals_stay_clear():
    scheme = BallsInBinsSampling(2, 16, fresh_slots=True)
    with pytest.raises(UnsupportedConfigurationError, match="non-negative"):
        dpmf.account(-np.eye(16), scheme, 2.0, 1e-5, method="allocation_pld")


def test_markov_profiles_bound_each_epochs_pair_by_monte_carlo():
    """Step 2': every Markov member's curve is >= a Monte Carlo estimate of the hockey-stick curve of
    one epoch's pair after step 1 (both directions, several gamma); the same member's curve at 1.3x
    the noise undercuts it somewhere (negative control)."""
    from dpmf.accounting.allocation.fresh_correlated import _markov_members, _profiles

    strategy, k, sigma = bsr(16, 4), 2, 1.5
    grams = epoch_grams(mixture_means(strategy, 1, strategy.n), k)
    members = _markov_members(grams)
    assert members
    rng = np.random.default_rng(2)
    gam = np.array([0.5, 0.9, 1.2, 1.6, 2.5])
    curves = {}  # (each member's tables once)
    for q, chains, parts in members:
        for sur, _ in chains:
            curves.setdefault(id(sur), _profiles(sur, parts, sigma, 6.0))
    for e, g in enumerate(grams):
        chol = np.linalg.cholesky(g / sigma**2)
        y = rng.standard_normal((400_000, g.shape[0])) @ chol.T
        s = np.exp(y - 0.5 * np.diag(g) / sigma**2).mean(axis=1)
        for direction, vals in (("remove", np.maximum(s[:, None] - gam, 0.0)), ("add", np.maximum(1 - gam * s[:, None], 0.0))):
            mean, se = vals.mean(axis=0), vals.std(axis=0) / np.sqrt(s.size)
            for q, chains, parts in members:
                for sur, epochs in chains:
                    if e in epochs:
                        assert np.all(curves[id(sur)][direction][0](gam) >= mean - 4 * se), (q, direction)
            if direction == "remove":  # negative control
                q, chains, parts = members[0]
                assert np.any(_profiles(chains[0][0], parts, 1.3 * sigma, 6.0)[direction][0](gam) < mean - 4 * se)


def test_the_composed_markov_member_is_offered_and_never_above_the_spectral_result():
    strategy, k, sigma, delta = ToeplitzStrategy([1.0, 0.8, 0.6], 12), 3, 2.0, 1e-3
    report = dpmf.account(strategy, BallsInBinsSampling(k, 12, fresh_slots=True), sigma, delta, method="allocation_pld")
    rows = report.diagnostics["reductions"]
    markov = [r for r in rows if "composed over 3 epochs" in r["bound"]]
    spectral = [r["epsilon"] for r in rows if r["bound"].startswith("spectral") and r.get("epsilon") is not None]
    assert markov and "composed over" in report.diagnostics["bound"]
    assert report.epsilon <= min(spectral) and report.epsilon == min([min(spectral)] + [r["epsilon"] for r in markov])


def test_members_see_each_epochs_raised_diagonal_at_the_end(monkeypatch):
    """An epoch's pair does not depend on the order of its slots: the members fit the epochs with the
    raised diagonal last (the second of two epochs reversed), so their chains carry no larger
    innovation at the start, and the bound is tighter than the same fit in the given order (measured:
    bsr(16, 4), 2 fresh epochs of 8, sigma 2: 2.641 -> 2.474) while staying above the Monte Carlo
    lower end of the exact pair (the soundness oracles above run on the reversed fit too)."""
    import dpmf.accounting.allocation.fresh_correlated as fc

    strategy, k, sigma, delta = bsr(16, 4), 2, 2.0, 1e-5
    monkeypatch.setattr(fc, "_BAND_MAX_SLOTS", 0)  # (the chains' orientation: the band's own member is left out)
    grams = epoch_grams(mixture_means(strategy, 1, strategy.n), k)
    oriented = [fc._raised_end_last(g) for g in grams]
    assert np.array_equal(oriented[0], grams[0]) and np.array_equal(oriented[1], grams[1][::-1, ::-1])
    members = fc._markov_members(grams)
    assert members and all(not sur.edges or not sur.edges[0] for _, chains, _ in members for sur, _ in chains)
    scheme = BallsInBinsSampling(k, strategy.n, fresh_slots=True)
    now = dpmf.account(strategy, scheme, sigma, delta, method="allocation_pld").epsilon
    monkeypatch.setattr(fc, "_raised_end_last", lambda g: g)
    before = dpmf.account(strategy, scheme, sigma, delta, method="allocation_pld").epsilon
    assert now < 0.97 * before
    _, lower = _mc_epsilon_interval(_pattern_means(strategy, k, strategy.n), sigma, delta, 300_000, seed=7)
    assert now >= lower


def test_three_epochs_offer_a_chain_for_the_outer_epochs_and_one_for_the_middle():
    """With 3 fresh epochs the first and last epochs (raised at one end) get their own chain and the
    middle one (raised at both) another; each chain's per-epoch curve bounds a Monte Carlo estimate of
    the hockey-stick curve of every epoch it covers, the outer chain is *not* a bound for the middle
    epoch (so covering it with the middle chain is what is paid), and the composed bound is tighter than
    the single chain's and above the Monte Carlo lower end of the exact pair."""
    from dpmf.accounting.allocation.fresh_correlated import _markov_members, _profiles

    strategy, k, sigma, delta = bsr(24, 3), 3, 2.0, 1e-5
    grams = epoch_grams(mixture_means(strategy, 1, strategy.n), k)
    members = _markov_members(grams)
    split = [m for m in members if len(m[1]) == 2]
    assert split and all(m[1][0][1] == (0, 2) and m[1][1][1] == (1,) for m in split)
    rng = np.random.default_rng(4)
    gam = np.array([0.7, 1.0, 1.5, 2.5])
    below_middle = False
    curves = {id(sur): _profiles(sur, parts, sigma, 6.0)["remove"][0] for _, chains, parts in split for sur, _ in chains}
    for e, g in enumerate(grams):
        y = rng.standard_normal((400_000, g.shape[0])) @ np.linalg.cholesky(g / sigma**2).T
        s = np.exp(y - 0.5 * np.diag(g) / sigma**2).mean(axis=1)
        vals = np.maximum(s[:, None] - gam, 0.0)
        mean, se = vals.mean(axis=0), vals.std(axis=0) / np.sqrt(s.size)
        for _, chains, parts in split:
            for sur, epochs in chains:
                curve = curves[id(sur)](gam)
                if e in epochs:
                    assert np.all(curve >= mean - 4 * se)
                elif e == 1:
                    below_middle |= bool(np.any(curve < mean - 4 * se))
    assert below_middle
    report = dpmf.account(strategy, BallsInBinsSampling(k, strategy.n, fresh_slots=True), sigma, delta,
                          method="allocation_pld")
    rows = report.diagnostics["reductions"]
    single = min(r["epsilon"] for r in rows if "composed over" in r["bound"] and "epochs 1, 3" not in r["bound"])
    assert "epochs 1, 3" in report.diagnostics["bound"] and report.epsilon < single
    _, lower = _mc_epsilon_interval(_pattern_means(strategy, k, strategy.n), sigma, delta, 300_000, seed=9)
    assert report.epsilon >= lower
