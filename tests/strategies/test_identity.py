"""The identity encoder: sensitivity by brute force over participation patterns, prefix-sum
RMSE from the dense workload/decoder matrices."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpmf.errors import InvalidParameterError
from dpmf.strategies import Identity, Participation


def brute_sensitivity(C: np.ndarray, k: int, b: int) -> float:
    """max ||C u|| over 0/1 participation vectors u with <= k ones, consecutive ones >= b apart.

    For C >= 0 entrywise this is the L2 sensitivity (all of an example's clipped gradients
    aligned; multi-epoch MF paper, Sec. 2).
    """
    n = C.shape[1]
    best = 0.0
    for size in range(1, k + 1):
        for steps in itertools.combinations(range(n), size):
            if all(t2 - t1 >= b for t1, t2 in zip(steps, steps[1:])):
                u = np.zeros(n)
                u[list(steps)] = 1.0
                best = max(best, float(np.linalg.norm(C @ u)))
    return best


@pytest.mark.parametrize("n,k", [(1, 1), (6, 1), (6, 2), (6, 3), (6, 6), (12, 4), (10, 5)])
def test_fixed_epoch_sensitivity_is_sqrt_k(n, k):
    strat = Identity(n)
    part = Participation(k, n // k)  # (k, b) fixed-epoch order
    assert strat.sensitivity(part) == pytest.approx(math.sqrt(k), rel=1e-15)
    assert strat.sensitivity(part) == pytest.approx(brute_sensitivity(strat.encoder(), k, n // k), rel=1e-12)


@pytest.mark.parametrize("n", [1, 4, 7, 9])
def test_sensitivity_matches_brute_force_for_all_schemas(n):
    strat = Identity(n)
    C = strat.encoder()
    for k in range(1, n + 1):
        for b in range(1, n + 1):
            assert strat.sensitivity(Participation(k, b)) == pytest.approx(brute_sensitivity(C, k, b), rel=1e-12)


def test_encoder_is_identity():
    C = Identity(5).encoder()
    np.testing.assert_array_equal(C, np.eye(5))
    assert np.all(C >= 0) and np.array_equal(C, np.tril(C))
    np.testing.assert_allclose(np.linalg.norm(C, axis=0), 1.0)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 57, 200])
def test_prefix_sum_rmse_matches_dense_matrices(n):
    strat = Identity(n)
    A = np.tril(np.ones((n, n)))  # prefix-sum workload
    C = strat.encoder()
    B = A @ np.linalg.inv(C)  # decoder, A = B C
    np.testing.assert_allclose(B @ C, A)
    # noise on query i is (B z)_i with z ~ N(0, I): variance ||B_i||^2 = i (1-based)
    per_query_var = np.sum(B**2, axis=1)
    np.testing.assert_allclose(per_query_var, np.arange(1, n + 1))
    brute = math.sqrt(per_query_var.mean())  # sqrt(mean_i i)
    assert strat.prefix_sum_rmse() == pytest.approx(brute, rel=1e-12)


def test_describe():
    assert Identity(12).describe() == {"name": "identity", "n": 12}


@pytest.mark.parametrize("bad", [0, -3, 2.5, float("nan"), True, "10"])
def test_bad_n_raises(bad):
    with pytest.raises(InvalidParameterError, match="n"):
        Identity(bad)


@pytest.mark.parametrize("k,b", [(0, 1), (1, 0), (-1, 1), (1.5, 1)])
def test_bad_participation_raises(k, b):
    with pytest.raises(InvalidParameterError):
        Participation(k, b)
