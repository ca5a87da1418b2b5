"""Unamplified accounting of correlated-noise strategies under shuffled fixed-order sampling."""

from __future__ import annotations

import numpy as np
import pytest

import dpmf
from dpmf.privacy import gaussian_epsilon
from dpmf.sampling import FixedOrderSampling
from dpmf.strategies import Participation
from dpmf.strategies.dense import DenseStrategy
from dpmf.strategies.sensitivity import FixedEpochParticipation
from dpmf.strategies.toeplitz import ToeplitzStrategy
from dpmf.strategies.tree import BinaryTree


def test_structured_sensitivities_match_dense():
    for strat in (ToeplitzStrategy.sqrt_prefix_sum(24), ToeplitzStrategy(np.array([1.0, -0.3, 0.2]), 24)):
        dense = DenseStrategy(strat.encoder())
        for part in (FixedEpochParticipation(3, 8), Participation(3, 8), Participation(1, 1)):
            assert strat.sensitivity(part) == pytest.approx(dense.sensitivity(part), rel=1e-9)


def test_tree_fixed_epoch_sensitivity_is_brute_force():
    tree = BinaryTree(16)
    C = tree.encoder()
    best = max(np.linalg.norm(C[:, [j, j + 8]].sum(axis=1)) for j in range(8))
    assert tree.sensitivity(FixedEpochParticipation(2, 8)) == pytest.approx(best, rel=1e-9)


def test_fixed_order_accounting_uses_exact_fixed_epoch_sensitivity():
    tree = BinaryTree(64)
    scheme = FixedOrderSampling(epochs=4, steps=64)
    report = dpmf.account(tree, scheme, noise_multiplier=10.0, delta=1e-6)
    sens = tree.sensitivity(FixedEpochParticipation(4, 16))
    assert report.method == "unamplified"
    assert report.diagnostics["sensitivity"] == pytest.approx(sens)
    assert report.epsilon == pytest.approx(gaussian_epsilon(10.0, 1e-6, sens), rel=1e-12)
    # fixed-epoch patterns are a subset of 16-min-sep ones
    assert sens <= tree.sensitivity(Participation(4, 16)) + 1e-12


def test_calibrated_sqrt_toeplitz_beats_identity_without_amplification():
    n, k = 60, 3
    scheme = FixedOrderSampling(epochs=k, steps=n)
    ident = dpmf.calibrate(dpmf.strategies.Identity(n), scheme, 1.0, 1e-6)
    sqrt_t = dpmf.calibrate(ToeplitzStrategy.sqrt_prefix_sum(n), scheme, 1.0, 1e-6)
    assert ident.report.epsilon <= 1.0 and sqrt_t.report.epsilon <= 1.0
    rmse_ident = ident.noise_multiplier * dpmf.strategies.Identity(n).prefix_sum_rmse()
    rmse_sqrt = sqrt_t.noise_multiplier * ToeplitzStrategy.sqrt_prefix_sum(n).prefix_sum_rmse()
    assert rmse_sqrt < rmse_ident
