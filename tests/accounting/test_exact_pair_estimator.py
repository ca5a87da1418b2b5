"""The benchmarks' yardstick (``benchmarks/exact_pair_mc.py``): the importance-sampled deltas of the
exact random-allocation pair agree with exact integration (b = 2, 3), and the weights are what makes
them agree (a negative control drops them)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from test_allocation_correlated import GRAMS, _gh_deltas

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from exact_pair_mc import exact_pair_samples, hinge, mc_epsilon  # noqa: E402


@pytest.mark.parametrize("gram", GRAMS, ids=["b2", "b2-strong", "b3"])
@pytest.mark.parametrize("sigma", [0.6, 1.2])
def test_importance_sampled_deltas_equal_exact_integration(gram, sigma):
    means = np.linalg.cholesky(gram)  # (rows: the slots' means; M M^T = gram)
    samples = exact_pair_samples(means, sigma, 200_000, seed=3)
    for eps in (0.2, 0.8):
        exact = dict(zip(("remove", "add"), _gh_deltas(gram, sigma, eps, 200)))
        for direction, (log_lr, wt) in samples.items():
            v = hinge(direction, log_lr, eps) * wt
            est, se = v.mean(), v.std() / math.sqrt(v.size)
            assert abs(est - exact[direction]) <= 5 * se + 1e-4 * exact[direction], (direction, eps, est, exact)
            assert se < 0.05 * exact[direction]  # and precise enough to mean something
            # negative control: the tilted draws without their weights overstate remove, understate add
            naive = hinge(direction, log_lr, eps).mean()
            assert abs(naive - exact[direction]) > 10 * se


def test_epsilon_interval_brackets_the_exact_epsilon():
    gram, sigma, delta = GRAMS[2], 0.8, 1e-4
    lo, point, hi = mc_epsilon(np.linalg.cholesky(gram), sigma, delta, 200_000, seed=5)
    assert lo <= point <= hi < lo * 1.05
    # the exact epsilon: the larger direction's root of delta(eps) = delta, by bisection
    def exact_eps(k):
        a, b = 0.0, 20.0
        for _ in range(50):
            m = 0.5 * (a + b)
            a, b = (m, b) if _gh_deltas(gram, sigma, m, 120)[k] > delta else (a, m)
        return b
    assert lo <= max(exact_eps(0), exact_eps(1)) <= hi
