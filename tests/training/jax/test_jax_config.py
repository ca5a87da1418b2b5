"""jax_privacy configurations read into dpmf (dpmf.training.jax.config): strategy objects become the
same matrices, dpmf.account / calibrate run on them (DpParams read), and dpmf's calibrated sigma
sits beside jax_privacy's own where jax_privacy has an accountant (the same analysis: ratio 1)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax_privacy")
pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402
from jax_privacy import batch_selection as bs  # noqa: E402
from jax_privacy.accounting.analysis import DpParams  # noqa: E402
from jax_privacy.matrix_factorization import banded  # noqa: E402
from jax_privacy.matrix_factorization.buffered_toeplitz import BufferedToeplitz  # noqa: E402

import dpmf  # noqa: E402
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError  # noqa: E402
from dpmf.sampling import PoissonSampling  # noqa: E402
from dpmf.strategies import Identity  # noqa: E402
from dpmf.strategies.blt import BLTStrategy  # noqa: E402
from dpmf.strategies.dense import DenseStrategy  # noqa: E402
from dpmf.strategies.toeplitz import ToeplitzStrategy  # noqa: E402
from dpmf.training.jax.config import (  # noqa: E402
    account_jax_privacy,
    compare_with_jax_privacy,
    jax_privacy_epsilon,
    jax_privacy_noise_multiplier,
    strategy_from_jax_privacy,
)


def test_strategies_are_the_same_matrices():
    with jax.enable_x64(True):
        blt = BufferedToeplitz(buf_decay=jnp.array([0.9, 0.3]), output_scale=jnp.array([0.2, 0.1]))
        s = strategy_from_jax_privacy(blt, 10)
        assert isinstance(s, BLTStrategy)
        np.testing.assert_allclose(s.encoder(), np.asarray(blt.materialize(10)), rtol=1e-14)
        cnb = banded.ColumnNormalizedBanded.default(10, 3)
        d = strategy_from_jax_privacy(cnb, 10)
        assert isinstance(d, DenseStrategy)
        np.testing.assert_allclose(d.encoder(), np.asarray(cnb.materialize()), rtol=1e-14)
    assert isinstance(strategy_from_jax_privacy(None, 5), Identity)
    assert isinstance(strategy_from_jax_privacy(np.array([1.0, 0.5]), 5), ToeplitzStrategy)
    with pytest.raises(InvalidParameterError, match="n=10"):
        strategy_from_jax_privacy(banded.ColumnNormalizedBanded.default(10, 3), 12)
    with pytest.raises(UnsupportedConfigurationError, match="no dpmf strategy"):
        strategy_from_jax_privacy("tree", 5)


def test_account_reads_the_dp_params():
    sel = bs.CyclicPoissonSampling(sampling_prob=0.02, iterations=20)
    params = DpParams(noise_multipliers=1.1, num_samples=1000, delta=1e-6, batch_size=20)
    report = account_jax_privacy(None, sel, params)
    direct = dpmf.account(Identity(20), PoissonSampling(0.02, 20), 1.1, 1e-6)
    assert (report.epsilon, report.method, report.delta) == (direct.epsilon, direct.method, 1e-6)
    with pytest.raises(UnsupportedConfigurationError, match="schedule"):
        account_jax_privacy(None, sel, DpParams(noise_multipliers=[(0, 1.0), (10, 2.0)], num_samples=1000,
                                                 delta=1e-6, batch_size=20))


def test_dpsgd_epsilon_beside_jax_privacys_is_the_same_analysis():
    """DP-SGD under Poisson sampling at one sigma: both compose the same PLD; dpmf's certified
    epsilon is at least jax_privacy's (pessimistic discretization) and within 0.5% of it."""
    sel = bs.CyclicPoissonSampling(sampling_prob=0.05, iterations=20)
    ours = account_jax_privacy(None, sel, 1.0, 1e-5, num_examples=1000)
    theirs = jax_privacy_epsilon(None, sel, 1.0, 1e-5, num_examples=1000)
    assert ours.method == "pld" and 0.9999 * theirs <= ours.epsilon < 1.005 * theirs, (ours.epsilon, theirs)


def test_bandmf_cyclic_poisson_epsilon_beside_jax_privacys():
    """BandMF (2 bands, column-normalized) under cyclic Poisson with cycle 2: jax_privacy's reduction
    to DP-SGD over ceil(T / b) participations and dpmf's accountant agree within 0.5%."""
    cnb = banded.ColumnNormalizedBanded.default(12, 2)
    sel = bs.CyclicPoissonSampling(sampling_prob=0.1, iterations=12, cycle_length=2)
    ours = account_jax_privacy(cnb, sel, 1.0, 1e-5, num_examples=1000)
    theirs = jax_privacy_epsilon(cnb, sel, 1.0, 1e-5, num_examples=1000)
    assert abs(ours.epsilon / theirs - 1) < 0.005, (ours.epsilon, ours.method, theirs)


@pytest.mark.slow
def test_calibrated_sigmas_beside_jax_privacys():
    """The calibrated sigmas (what benchmarks/bench_jax.py measures at scale): ratio 1 for both."""
    for strategy, sel in ((None, bs.CyclicPoissonSampling(sampling_prob=0.05, iterations=20)),
                          (banded.ColumnNormalizedBanded.default(12, 2),
                           bs.CyclicPoissonSampling(sampling_prob=0.1, iterations=12, cycle_length=2))):
        out = compare_with_jax_privacy(strategy, sel, 2.0, 1e-5, num_examples=1000)
        assert out["report"].certified and out["report"].epsilon <= 2.0
        assert 0.995 < out["ratio"] < 1.005, out


def test_jax_privacy_has_no_accountant_for_these():
    cnb = banded.ColumnNormalizedBanded.default(12, 3)
    # 3 bands > cycle 2: outside the reduction
    assert jax_privacy_noise_multiplier(cnb, bs.CyclicPoissonSampling(sampling_prob=0.1, iterations=12, cycle_length=2),
                                        2.0, 1e-5, num_examples=1000) is None
    assert jax_privacy_noise_multiplier(None, bs.BallsInBinsSampling(iterations=12, cycle_length=4), 2.0, 1e-5,
                                        num_examples=1000) is None
    with pytest.raises(InvalidParameterError, match="integer batch size"):
        jax_privacy_noise_multiplier(None, bs.CyclicPoissonSampling(sampling_prob=0.0123, iterations=4), 2.0, 1e-5,
                                     num_examples=1000)
