"""DenseStrategy: validation, the Identity method set, normalization, and published numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dpmf
from dpmf.errors import InvalidParameterError
from dpmf.sampling.schemes import FixedOrderSampling
from dpmf.strategies import Identity, Participation
from dpmf.strategies.dense import DenseStrategy
from dpmf.strategies.sensitivity import FixedEpochParticipation, SensitivityResult


def sqrt_toeplitz(n: int) -> np.ndarray:
    f = np.ones(n)
    for t in range(1, n):
        f[t] = f[t - 1] * (1 - 1 / (2 * t))
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    return np.where(lag >= 0, f[np.maximum(lag, 0)], 0.0)


def test_same_methods_as_identity():
    for name in ("n", "name", "describe", "encoder", "sensitivity", "prefix_sum_rmse"):
        assert hasattr(Identity(3), name) and hasattr(DenseStrategy(np.eye(3)), name)


@pytest.mark.parametrize("n", [1, 5, 9])
def test_identity_matrix_matches_identity_strategy(n):
    dense, ident = DenseStrategy(np.eye(n)), Identity(n)
    assert dense.n == n
    for k in range(1, n + 1):
        for b in range(1, n + 1):
            part = Participation(k, b)
            assert dense.sensitivity(part) == pytest.approx(ident.sensitivity(part), rel=1e-12)
            assert dense.sensitivity(part) >= ident.sensitivity(part)  # rounded up
    assert dense.prefix_sum_rmse() == pytest.approx(ident.prefix_sum_rmse(), rel=1e-12)


def test_describe_encoder_repr_and_immutability():
    C = np.tril(np.ones((4, 4)))
    s = DenseStrategy(C, name="prefix")
    d = s.describe()
    assert {k: d[k] for k in ("name", "n", "adaptive", "nonnegative")} == {
        "name": "prefix", "n": 4, "adaptive": True, "nonnegative": True
    }
    assert d["class"] == "DenseStrategy" and d["matrix"] == C.tolist()  # small: inline (rebuildable)
    assert repr(s) == "DenseStrategy(name='prefix', n=4, adaptive=True)"
    enc = s.encoder()
    enc[0, 0] = 7.0
    assert s.C[0, 0] == 1.0  # a copy
    C[1, 0] = 5.0
    assert s.C[1, 0] == 1.0  # the input was copied too
    with pytest.raises(ValueError):
        s.C[0, 0] = 2.0  # read-only
    assert DenseStrategy(np.eye(2)).name == "dense"
    assert not DenseStrategy(np.array([[1.0, 0.0], [-1.0, 1.0]])).nonnegative


def test_sensitivity_result_and_cache():
    s = DenseStrategy(sqrt_toeplitz(16))
    part = Participation(2, 8)
    r = s.sensitivity_result(part)
    assert isinstance(r, SensitivityResult) and r.exact
    assert s.sensitivity_result(part) is r  # cached
    assert s.sensitivity(part) == pytest.approx(math.sqrt(r.value), rel=1e-15)
    # fixed-epoch patterns are a subset of b-min-sep ones
    assert s.sensitivity(FixedEpochParticipation(2, 8)) <= s.sensitivity(part) * (1 + 1e-12)


def test_sqrt_toeplitz_n128_normalized_rmse():
    """notes/peer-libraries.md B.5: sqrt(A) Toeplitz, n = 128, 2 epochs (k = 2, b = 64):
    sensitivity 2.4737 and RMSE* 3.7496 per unit noise multiplier at sensitivity 1."""
    s = DenseStrategy(sqrt_toeplitz(128), name="sqrt-toeplitz")
    part = Participation(2, 64)
    assert s.sensitivity(part) == pytest.approx(2.4737, abs=5e-5)
    unit = s.normalized(part)
    assert unit.name == "sqrt-toeplitz"
    assert unit.sensitivity(part) == pytest.approx(1.0, rel=1e-12)
    assert unit.sensitivity(part) <= 1.0 + 1e-12
    assert unit.prefix_sum_rmse() == pytest.approx(3.7496, abs=5e-5)
    eye = DenseStrategy(np.eye(128)).normalized(part)
    assert eye.prefix_sum_rmse() == pytest.approx(11.3578, abs=5e-5)


def test_non_adaptive_encoders():
    sym = np.array([[2.0, 1.0, 1.0], [1.0, 2.0, -1.0], [1.0, -1.0, 2.0]]) / math.sqrt(24)
    with pytest.raises(InvalidParameterError, match="lower triangular"):
        DenseStrategy(sym)
    s = DenseStrategy(sym + np.eye(3), adaptive=False)  # invertible symmetric
    assert s.describe()["adaptive"] is False
    tall = np.vstack([np.eye(3), np.ones((2, 3))])
    t = DenseStrategy(tall, adaptive=False)
    assert t.n == 3
    np.testing.assert_allclose(t.decoder() @ tall, np.tri(3), atol=1e-12)
    assert t.sensitivity(Participation(1)) == pytest.approx(math.sqrt(3.0), rel=1e-12)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"C": np.array([[1.0, 0.0], [np.nan, 1.0]])}, "finite"),
        ({"C": np.ones((2, 3))}, "square"),
        ({"C": np.array([[1.0, 2.0], [0.0, 1.0]])}, "lower triangular"),
        ({"C": np.array([[1.0, 0.0], [1.0, 0.0]])}, "invertible"),
        ({"C": np.ones(3)}, "2-dimensional"),
        ({"C": np.ones((2, 3)), "adaptive": False}, "rows"),
        ({"C": np.ones((3, 2)), "adaptive": False}, "rank"),
        ({"C": np.eye(2), "adaptive": "yes"}, "adaptive"),
        ({"C": np.eye(2), "name": ""}, "name"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(InvalidParameterError, match=match):
        DenseStrategy(**kwargs)


def test_bad_participation():
    s = DenseStrategy(np.eye(4))
    with pytest.raises(InvalidParameterError, match="min_sep"):
        s.sensitivity(Participation(2, 5))
    with pytest.raises(InvalidParameterError, match="max_participations"):
        s.sensitivity(Participation(-1, 1))


def test_unamplified_accounting_accepts_dense():
    scheme = FixedOrderSampling(epochs=2, steps=8)
    dense = dpmf.account(DenseStrategy(np.eye(8)), scheme, 1.0, 1e-6)
    ident = dpmf.account(Identity(8), scheme, 1.0, 1e-6)
    assert dense.epsilon == pytest.approx(ident.epsilon, rel=1e-9)
    assert dense.epsilon >= ident.epsilon  # sensitivity rounded up, never down
