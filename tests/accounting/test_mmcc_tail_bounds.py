"""MMCC tail bounds (Alg. 2/4, App. F.3) against brute force and closed forms."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from dpmf.accounting.mmcc import binomial_thresholds, tail_bound_structure
from dpmf.accounting.mmcc.rows import merge_upward
from dpmf.privacy.product_mixtures import GridDistribution, dominates


def _rows(m):
    return [np.array([i]) for i in range(m)]


@pytest.mark.parametrize("prob", [0.01, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("delta_prime", [1e-3, 1e-9])
def test_binomial_thresholds_are_the_smallest_passing_values(prob, delta_prime):
    t = binomial_thresholds(40, prob, delta_prime)
    for K in range(41):
        # brute-force tail Pr[Binomial(K, prob) > t] from the exact pmf
        pmf = [math.comb(K, k) * prob**k * (1 - prob) ** (K - k) for k in range(K + 1)]
        tail = lambda tt: math.fsum(pmf[tt + 1 :])  # noqa: E731
        assert tail(int(t[K])) <= delta_prime
        if t[K] > 0:
            assert tail(int(t[K]) - 1) > delta_prime * (1 - 1e-6)


def _brute_force_signal(G_col: np.ndarray, prob: float, delta_prime: float, count: int) -> float:
    """Exact (1 - delta') quantile-type bound: the smallest s with Pr[sum_j x_j G_j > s] <= delta'
    over i.i.d. Bernoulli(prob) x (enumeration)."""
    vals, probs = [], []
    for x in itertools.product((0, 1), repeat=count):
        x = np.array(x)
        vals.append(float(np.dot(x, G_col)))
        probs.append(prob ** x.sum() * (1 - prob) ** (count - x.sum()))
    order = np.argsort(vals)
    vals, probs = np.array(vals)[order], np.array(probs)[order]
    tails = np.cumsum(probs[::-1])[::-1]  # Pr[S >= vals[k]]
    for k in range(len(vals)):
        above = tails[k + 1] if k + 1 < len(vals) else 0.0
        if above <= delta_prime:
            return float(vals[k])
    return float(vals[-1])


def test_structure_against_a_hand_computed_example():
    # C (lower triangular, 0-based): rows released at steps 0, 1, 2
    C = np.array([[1.0, 0.0, 0.0], [0.5, 1.0, 0.0], [0.25, 0.5, 1.0]])
    q, delta1 = 0.3, 1e-3
    st = tail_bound_structure(C, _rows(3), q, delta1)
    # non-trivial pairs: (1,0), (2,0), (2,1) = nnz - n = 3; two events each
    assert st.tail_events == 6
    assert st.delta_prime == pytest.approx(delta1 / 6, rel=1e-15)
    assert st.z >= stats.norm.isf(delta1 / 6)
    # row 2, column 0: prior column (1, 0.5): a^2 = 1.25; Gram column 0 = (1.25, 0.5)
    sl = st.unit(2)
    assert st.columns[sl].tolist() == [0, 1, 2]
    a2 = st.prior_norm_sq[sl]
    assert a2[0] <= 1.25 <= a2[0] * (1 + 1e-11)
    assert st.prior_norm[sl][0] >= math.sqrt(1.25)
    assert st.prior_norm[sl][2] == 0  # first appearance of column 2: trivial
    # s: top-t sum of (1.25, 0.5) with t from Binomial(2, q)
    t = int(binomial_thresholds(2, q, delta1 / 6)[2])
    assert t == 2  # Pr[Bin(2, .3) > 1] = 0.09 > delta'
    assert st.signal[sl][0] >= 1.75 and st.signal[sl][0] <= 1.75 * (1 + 1e-11)
    # the top-t sum is at least the exact tail quantile of the signal (enumeration)
    exact = _brute_force_signal(np.array([1.25, 0.5]), q, st.delta_prime, 2)
    assert st.signal[sl][0] >= exact


def test_signal_bounds_the_exact_tail_on_random_matrices():
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = 6
        C = np.tril(rng.random((n, n)) * (rng.random((n, n)) < 0.7))
        np.fill_diagonal(C, rng.random(n) + 0.1)
        q = float(rng.choice([0.05, 0.3, 0.7]))
        st = tail_bound_structure(C, _rows(n), q, 1e-2)
        for i in range(1, n):
            G = C[:i].T @ C[:i]
            sl = st.unit(i)
            for j, a, s in zip(st.columns[sl], st.prior_norm[sl], st.signal[sl]):
                if a == 0:
                    assert not np.any(C[:i, j] > 0)
                    continue
                assert a >= math.sqrt(G[j, j])
                exact = _brute_force_signal(G[:, j], q, st.delta_prime, n)
                assert s >= exact * (1 - 1e-12)


def test_identity_needs_no_tail_bounds_and_gives_q():
    st = tail_bound_structure(np.eye(5), _rows(5), 0.2, 1e-6)
    assert st.tail_events == 0 and st.delta1 == 0.0 and st.delta_prime == 0.0
    assert np.all(st.probabilities(0.7) == 0.2)


def test_probabilities_closed_form_monotone_and_bounded():
    C = np.array([[1.0, 0.0], [1.0, 1.0]])
    q = 0.1
    st = tail_bound_structure(C, _rows(2), q, 1e-6)
    sl = st.unit(1)
    a, a2, s = st.prior_norm[sl][0], st.prior_norm_sq[sl][0], st.signal[sl][0]
    assert (a, a2, s) == (1.0, 1.0, 1.0)  # t >= 1 (Pr[Bin(1, .1) > 0] = .1 > delta'), one column
    z = st.z
    for sigma in (0.5, 1.0, 3.0, 30.0):
        eps = z / sigma + 1.0 / (2 * sigma**2)
        expected = q * math.exp(eps) / (q * math.exp(eps) + 1 - q)
        got = st.probabilities(sigma)[sl][0]
        assert expected <= got <= expected * (1 + 1e-10)
    pts = [st.probabilities(s)[sl][0] for s in (0.3, 1, 3, 10, 100, 1e4)]
    assert all(x >= y for x, y in zip(pts, pts[1:]))  # non-increasing in sigma
    assert pts[-1] == pytest.approx(q, rel=1e-3)  # -> q as sigma -> infinity (tightness, Sec. 4)
    assert st.probabilities(1e-3)[sl][0] == 1.0


def test_non_adaptive_counts_later_columns():
    # upper-triangular C: row 0 touches columns 0 and 1; row 1 touches column 1 again.
    C = np.array([[1.0, 1.0], [0.0, 1.0]])
    st = tail_bound_structure(C, _rows(2), 0.5, 1e-3)
    sl = st.unit(1)
    # prior Gram column 1 = (1, 1): both columns can carry signal, binomial over K = 2
    assert st.prior_norm[sl][0] == 1.0
    t = int(binomial_thresholds(2, 0.5, st.delta_prime)[2])
    assert st.signal[sl][0] == float(t)


def test_merge_upward_dominates_and_keeps_mass():
    rng = np.random.default_rng(3)
    for budget in (0.0, 1e-9, 1e-6, 1e-3):
        p = rng.random(300) ** 8
        p /= p.sum()
        idx, mass = merge_upward(p, budget)
        merged = np.zeros(p.size)
        merged[idx] = mass
        # exact tails (fsum) of the merged PMF are >= those of the input at every grid point
        for k in range(0, p.size, 7):
            assert math.fsum(merged[k:].tolist()) >= math.fsum(p[k:].tolist())
        assert dominates(GridDistribution(0.01, merged), GridDistribution(0.01, p), atol=1e-15)
        assert math.fsum(mass.tolist()) >= math.fsum(p.tolist())
        if budget == 0.0:
            assert np.array_equal(idx, np.flatnonzero(p > 0))
        # cost of every merged run within budget
        start = 0
        for hi in idx:
            run = np.arange(start, hi + 1)
            assert float(np.dot(p[run], hi - run)) <= budget * (1 + 1e-12) or run.size == 1
            start = hi + 1
