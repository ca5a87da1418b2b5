"""The white-box attacker (dpmf.auditing.whitebox): whitening, and the likelihood ratio against a
brute-force sum over every participation pattern of tiny runs; the mechanism-level game."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import special

from dpmf.auditing.game import mechanism_audit, simulate_released
from dpmf.auditing.whitebox import WhiteBoxScorer, bandwidth, participation_masks, whitening_matrix
from dpmf.errors import DPMFError
from dpmf.sampling import (
    BallsInBinsSampling,
    CyclicPoissonSampling,
    FixedOrderSampling,
    MinSepSampling,
    PoissonSampling,
)
from dpmf.strategies import BLT, BinaryTree, Identity, bsr


def _pattern_probability(scheme, p: tuple, num_examples: int) -> float:
    """P[one example participates exactly at the steps of p] under the scheme (by its definition)."""
    n = len(p)
    if isinstance(scheme, PoissonSampling):
        q = scheme.sampling_prob
        return math.prod(q if x else 1 - q for x in p)
    if isinstance(scheme, CyclicPoissonSampling):
        b, q = scheme.cycle_length, scheme.sampling_prob
        total = 0.0
        for g in range(b):
            if any(x and t % b != g for t, x in enumerate(p)):
                continue
            total += math.prod((q if x else 1 - q) for t, x in enumerate(p) if t % b == g) / b
        return total
    if isinstance(scheme, MinSepSampling):
        b, q = scheme.min_sep, scheme.sampling_prob
        starts = [(0, 1.0)]
        if scheme.warm_start and b > 1:
            starts = [(k, (q if k else 1.0) / (1 + (b - 1) * q)) for k in range(b)]
        total = 0.0
        for barred, w in starts:
            prob = w
            for x in p:
                if barred == 0:
                    prob *= q if x else 1 - q
                    barred = b - 1 if x else 0
                else:
                    if x:
                        prob = 0.0
                        break
                    barred -= 1
            total += prob
        return total
    if isinstance(scheme, (BallsInBinsSampling, FixedOrderSampling)):
        b = scheme.steps_per_epoch
        if isinstance(scheme, FixedOrderSampling):
            bounds = np.linspace(0, num_examples, b + 1).round().astype(int)
            w = np.diff(bounds) / num_examples
        else:
            w = np.full(b, 1.0 / b)
        for s in range(b):
            if tuple(1 if t % b == s else 0 for t in range(n)) == tuple(p):
                return float(w[s])
        return 0.0
    raise AssertionError(scheme)


def _brute_force_llr(W, sigma, y, scheme, num_examples):
    n = W.shape[0]
    terms, weights = [], []
    for p in itertools.product((0, 1), repeat=n):
        w = _pattern_probability(scheme, p, num_examples)
        if w == 0:
            continue
        f = W @ np.asarray(p, dtype=float)
        terms.append((f @ y) / sigma**2 - (f @ f) / (2 * sigma**2))
        weights.append(w)
    assert sum(weights) == pytest.approx(1.0)
    return special.logsumexp(np.asarray(terms), axis=0, b=np.asarray(weights)[:, None])


N = 7
CASES = [
    (Identity(N), PoissonSampling(0.3, N), "poisson"),
    (Identity(N), CyclicPoissonSampling(0.6, N, 2, partition="independent"), "cyclic"),
    (bsr(N, 2), CyclicPoissonSampling(0.6, N, 3, partition="independent"), "cyclic"),
    (bsr(N, 3), MinSepSampling(0.5, N, 3), "min-sep"),
    (bsr(N, 2), MinSepSampling(0.4, N, 2, warm_start=True), "min-sep"),
    (Identity(N), MinSepSampling(0.7, N, 1), "min-sep"),
    (BLT([0.9, 0.5], [0.3, 0.2]).to_toeplitz(6), BallsInBinsSampling(2, 6), "slots"),
    (bsr(6, 3), FixedOrderSampling(3, 6), "slots"),
]


@pytest.mark.parametrize("strategy,scheme,method", CASES)
def test_exact_likelihood_ratio_matches_brute_force(strategy, scheme, method):
    sigma, num = 1.3, 10
    scorer = WhiteBoxScorer(strategy, scheme, sigma, num)
    assert scorer.method == method and scorer.exact
    rng = np.random.default_rng(0)
    released = rng.normal(size=(strategy.n, 5)) * 1.5 + 0.5
    got = scorer.score(released)
    want = _brute_force_llr(scorer.W, sigma, scorer.whiten(released), scheme, num)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_the_approximate_score_is_flagged_and_finite():
    s = BLT([0.9, 0.5], [0.3, 0.2]).to_toeplitz(N)
    scorer = WhiteBoxScorer(s, PoissonSampling(0.3, N), 1.0, 10)
    assert scorer.method == "independent" and not scorer.exact
    assert np.all(np.isfinite(scorer.score(np.random.default_rng(1).normal(size=(N, 4)))))


@pytest.mark.parametrize("strategy", [Identity(8), bsr(8, 3), BLT([0.8], [0.4]).to_toeplitz(8), BinaryTree(8)])
def test_whitening_makes_the_noise_iid(strategy):
    W = whitening_matrix(strategy)
    L = strategy.noising_matrix()
    np.testing.assert_allclose(W @ L @ L.T @ W.T, np.eye(8), atol=1e-9)
    assert np.allclose(np.triu(W, 1), 0)


def test_bandwidth():
    assert bandwidth(np.eye(5)) == 1
    assert bandwidth(bsr(10, 4).encoder()) == 4
    assert bandwidth(BLT([0.9], [0.5]).to_toeplitz(6).encoder()) == 6


def test_marginal_rates_match_the_sampler():
    scheme = MinSepSampling(0.5, 12, 3)
    scorer = WhiteBoxScorer(Identity(12), scheme, 1.0, 4000)
    masks = participation_masks(scheme, 4000, seed=3)
    np.testing.assert_allclose(masks.mean(axis=1), scorer.marginal_rates(), atol=0.03)


def test_noise_check_and_fitted_scores_find_a_run_without_noise_on_half_the_steps():
    n, m, sigma = 16, 400, 2.0
    s, scheme = bsr(n, 4), CyclicPoissonSampling(0.5, n, 4)
    scorer = WhiteBoxScorer(s, scheme, sigma, m)
    released, coins = simulate_released(s, scheme, sigma, canaries=m, num_examples=m, seed=0)
    fine = scorer.scores(released)
    assert fine["check"]["checked"] and fine["check"]["directions_below"] == 0 and fine["steps_below"] == 0
    np.testing.assert_array_equal(fine["claimed"], scorer.score(released))
    # the same run with the noise of the odd steps left out
    P = participation_masks(scheme, m, seed=1, examples=np.arange(m)) * coins
    noise = sigma * s.noising_matrix() @ np.random.default_rng(2).normal(size=(n, m))
    noise[1::2] = 0
    bad = scorer.scores(P + noise)
    assert bad["check"]["directions_below"] >= n // 2 - 1 and bad["steps_below"] == n // 2
    top = np.argsort(bad["per-step"])[-m // 8:]
    assert coins[top].all()  # the canaries seen at a noiseless step are exposed perfectly


def test_mechanism_audit_is_reproducible_and_below_the_claim():
    s, scheme = Identity(16), PoissonSampling(0.3, 16)
    a = mechanism_audit(s, scheme, 1.5, 1e-5, canaries=300, num_examples=600, seed=4)
    b = mechanism_audit(s, scheme, 1.5, 1e-5, canaries=300, num_examples=600, seed=4)
    assert a == b and 0 <= a.epsilon_lower < 3


@pytest.mark.parametrize("call", [
    lambda: WhiteBoxScorer(Identity(5), PoissonSampling(0.1, 6), 1.0, 10),
    lambda: WhiteBoxScorer(Identity(5), PoissonSampling(0.1, 5), -1.0, 10),
    lambda: WhiteBoxScorer(Identity(5), "poisson", 1.0, 10),
    lambda: WhiteBoxScorer(Identity(5), PoissonSampling(0.1, 5), 1.0, 10).score(np.zeros((4, 3))),
    lambda: WhiteBoxScorer(Identity(5), PoissonSampling(0.1, 5), 1.0, 10).score(np.full((5, 3), np.nan)),
    lambda: simulate_released(Identity(5), PoissonSampling(0.1, 5), 1.0, canaries=20, num_examples=10, seed=0),
])
def test_bad_input_is_a_dpmf_error(call):
    with pytest.raises(DPMFError):
        call()
