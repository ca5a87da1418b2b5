"""BinaryTree.sensitivity without the dense encoder: equal to brute force over patterns (exact
integers) and to the general dispatcher on the dense matrix."""

import math

import numpy as np
import pytest

from dpmf.strategies import BinaryTree, FixedEpochParticipation, Participation, sensitivity_squared
from dpmf.strategies.tree import binary_tree_encoder


def _brute_force_squared(n: int, patterns) -> int:
    """max over patterns S of 1^T X_S 1 with X = C^T C in exact integers."""
    C = binary_tree_encoder(n).astype(np.int64)
    X = C.T @ C
    return max(int(X[np.ix_(S, S)].sum()) for S in patterns)


def _fixed_epoch_patterns(n, k, b):
    return [list(range(s, n, b))[:k] for s in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 16, 31, 64, 100])
def test_every_step_and_fixed_epoch_equal_brute_force(n):
    tree = BinaryTree(n, scale=0.7)
    C = tree.encoder()
    cases = [(Participation(n, 1), [list(range(n))])]
    cases += [(FixedEpochParticipation(k, b), _fixed_epoch_patterns(n, k, b)) for b in range(1, n + 1, max(1, n // 9)) for k in (1, 2, 3, n)]
    for participation, patterns in cases:
        exact = 0.49 * _brute_force_squared(n, patterns)
        fast = tree.sensitivity(participation)
        assert fast >= math.sqrt(exact)  # sound: never below the exact value
        assert fast == pytest.approx(math.sqrt(exact), rel=1e-11)  # (float margins of the results)
        assert fast == pytest.approx(sensitivity_squared(C, participation).sensitivity, rel=1e-11)  # (float margins of the results)


def test_large_tree_never_builds_the_encoder(monkeypatch):
    def refuse(self):
        raise AssertionError("dense encoder built")

    monkeypatch.setattr(BinaryTree, "encoder", refuse)
    tree = BinaryTree(100_000)
    # every step: sum over nodes of size^2 = sum_h 2^h * n (n a power of 2 would give n (2n - 1))
    assert tree.sensitivity(Participation(100_000, 1)) > 0
    assert tree.sensitivity(FixedEpochParticipation(10, 10_000)) > 0


def test_every_step_closed_form_power_of_two():
    n = 1024  # levels h = 0..10, 2^(10-h) nodes of size 2^h: sum 2^(10-h) 4^h = 2^10 (2^11 - 1)
    assert BinaryTree(n).sensitivity(Participation(n, 1)) == pytest.approx(math.sqrt(n * (2 * n - 1)), rel=1e-12)
