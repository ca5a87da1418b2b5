"""The truncated_pld accountant (truncated / padded Poisson and cyclic Poisson; issue 22 item 3)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

import dpmf
from dpmf.accounting.dpsgd import account_dpsgd
from dpmf.accounting.truncated import account_truncated, binomial_tail_upper, truncated_round_pld
from dpmf.errors import DPMFError, UnsupportedConfigurationError
from dpmf.privacy.gaussian_plds import subsampled_gaussian
from dpmf.sampling import CyclicPoissonSampling, PoissonSampling
from dpmf.strategies import Identity
from dpmf.strategies.banded import bsr


def _exact_tail(n, q, k):
    q = Fraction(q)
    return float(sum(math.comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(k, n + 1)))


@pytest.mark.parametrize("n,q,k", [(10, 0.5, 10), (20, 0.1, 8), (60, 0.05, 1), (60, 0.05, 20), (300, 0.02, 25), (7, 0.9, 3)])
def test_binomial_tail_upper_is_an_upper_bound(n, q, k):
    exact = _exact_tail(n, q, k)
    got = binomial_tail_upper(n, q, k)
    assert exact <= got <= exact * (1 + 2e-6) + 1e-300


def test_binomial_tail_edges_and_bad_input():
    assert binomial_tail_upper(5, 0.3, 0) == 1.0 and binomial_tail_upper(5, 0.3, 6) == 0.0
    assert binomial_tail_upper(5, 0.0, 1) == 0.0
    for args in [(-1, 0.1, 1), (5, 1.5, 1), (5, 0.1, 1.5), (True, 0.1, 1)]:
        with pytest.raises(DPMFError):
            binomial_tail_upper(*args)


def _mixture(grads, q, B, sigma):
    """Exact output law of one truncated Poisson step on scalar gradients: {mean: probability}."""
    out: dict[float, float] = {}
    m = len(grads)
    for S in itertools.product((0, 1), repeat=m):
        chosen = [i for i in range(m) if S[i]]
        p = q ** len(chosen) * (1 - q) ** (m - len(chosen))
        subsets = [chosen] if len(chosen) <= B else list(itertools.combinations(chosen, B))
        for T in subsets:
            mu = round(sum(grads[i] for i in T), 12)
            out[mu] = out.get(mu, 0.0) + p / len(subsets)
    return out


def _hockey(P, Q, eps, sigma):
    lo = min(min(P), min(Q)) - 14 * sigma
    hi = max(max(P), max(Q)) + 14 * sigma
    x = np.linspace(lo, hi, 100_001)
    dens = lambda M: sum(w * np.exp(-((x - mu) ** 2) / (2 * sigma**2)) for mu, w in M.items()) / (sigma * math.sqrt(2 * math.pi))
    f = np.maximum(dens(P) - math.exp(eps) * dens(Q), 0.0)
    return float(np.sum((f[1:] + f[:-1]) / 2) * (x[1] - x[0]))


def test_exact_mechanism_is_below_the_bound_and_the_untruncated_bound_fails():
    """Oracle: a concrete tiny mechanism (3 examples, max batch 1): target +1 and the others -1 (the
    displaced example pushes the other way). Its exact hockey-stick divergence, both directions, is
    below the truncated accountant's delta; the untruncated (DP-SGD) PLD is violated by it, so the
    check can fail."""
    q, B, sigma, m = 0.5, 1, 1.0, 3
    tau = binomial_tail_upper(m - 1, q, B)
    bound = truncated_round_pld(sigma, q, tau)
    naive = subsampled_gaussian(sigma, q)
    violated = False
    for others in [(-1.0, -1.0), (0.0, 0.0), (-1.0, 1.0)]:
        with_t = _mixture((1.0, *others), q, B, sigma)
        without = _mixture((0.0, *others), q, B, sigma)
        for eps in (0.0, 0.5, 1.0, 2.0):
            exact = {"remove": _hockey(with_t, without, eps, sigma), "add": _hockey(without, with_t, eps, sigma)}
            ours = bound.delta_by_direction(eps)
            for d in exact:
                assert exact[d] <= ours[d] + 1e-7, (others, eps, d)
            violated |= max(exact.values()) > naive.delta(eps) + 1e-4
    assert violated


def test_large_max_equals_the_untruncated_accountant():
    m = 400
    r = account_truncated(Identity(60), PoissonSampling(0.02, 60, max_batch_size=m, dataset_size=m), 0.9, 1e-5)
    r0 = account_dpsgd(Identity(60), PoissonSampling(0.02, 60), 0.9, 1e-5)
    assert r.epsilon == r0.epsilon and r.diagnostics["truncation_probability_bound"] == 0.0
    # cyclic: the group of ceil(400 / 4) = 100 examples fits in max 100 -> the cyclic reduction (MMCC)
    s = CyclicPoissonSampling(0.1, 20, 4, max_batch_size=100, dataset_size=m)
    rc = account_truncated(bsr(20, 4), s, 1.0, 1e-5)
    rm = dpmf.account(bsr(20, 4), CyclicPoissonSampling(0.1, 20, 4), 1.0, 1e-5, method="mmcc")
    assert rc.epsilon == pytest.approx(rm.epsilon, rel=2e-3)


@pytest.mark.parametrize("q,B", [(0.02, 6), (0.05, 8), (0.1, 12)])
def test_truncated_never_below_untruncated_and_monotone_in_max(q, B):
    m, steps, sigma, d = 200, 20, 2.0, 1e-3
    plain = account_dpsgd(Identity(steps), PoissonSampling(q, steps), sigma, 1e-5, discretization=d).epsilon
    eps = [account_truncated(Identity(steps), PoissonSampling(q, steps, max_batch_size=b, dataset_size=m), sigma, 1e-5,
                             discretization=d).epsilon for b in (B, B + 4)]
    assert eps[0] >= eps[1] >= plain - 1e-12


def test_report_names_its_analysis_and_dispatch_picks_it():
    s = PoissonSampling(0.05, 20, max_batch_size=15, dataset_size=100)
    r = dpmf.account(Identity(20), s, 2.0, 1e-5)
    assert r.method == "truncated_pld" and r.certified
    assert "truncat" in r.diagnostics["analysis"] and r.diagnostics["pool"] == 99
    assert r.scheme["max_batch_size"] == 15
    for method in ("pld", "mmcc", "montecarlo"):
        with pytest.raises(UnsupportedConfigurationError, match="truncated"):
            dpmf.account(Identity(20), s, 1.0, 1e-5, method=method)


def test_refusals():
    with pytest.raises(UnsupportedConfigurationError, match="dataset_size"):
        account_truncated(Identity(10), PoissonSampling(0.1, 10, max_batch_size=3), 1.0, 1e-5)
    with pytest.raises(UnsupportedConfigurationError, match="independent"):
        account_truncated(Identity(10), CyclicPoissonSampling(0.1, 10, 2, "independent", 3, 50), 1.0, 1e-5)
    with pytest.raises(UnsupportedConfigurationError, match="bands"):
        account_truncated(bsr(10, 4), CyclicPoissonSampling(0.1, 10, 2, max_batch_size=3, dataset_size=50), 1.0, 1e-5)
    with pytest.raises(UnsupportedConfigurationError, match="diagonal"):
        account_truncated(bsr(10, 2), PoissonSampling(0.1, 10, max_batch_size=3, dataset_size=50), 1.0, 1e-5)
    with pytest.raises(UnsupportedConfigurationError, match="max_batch_size"):
        account_truncated(Identity(10), PoissonSampling(0.1, 10), 1.0, 1e-5)
