"""dpmf strategies as jax_privacy's matrix-factorization privatizer (dpmf.training.jax.noise): the
streaming matrices equal dpmf's numpy generators on the same z, the privatizer's noise has covariance
std^2 L L^T over the steps (the check the PyTorch generators pass), NaN past n, seeds required."""

from __future__ import annotations

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax_privacy")
pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402
from jax_privacy.matrix_factorization import streaming_matrix as jp_sm  # noqa: E402

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError  # noqa: E402
from dpmf.strategies import catalog  # noqa: E402
from dpmf.strategies.banded import bisr, bsr  # noqa: E402
from dpmf.strategies.blt import BLT, BLTStrategy  # noqa: E402
from dpmf.strategies.dense import DenseStrategy  # noqa: E402
from dpmf.strategies.fft import FFTMechanism  # noqa: E402
from dpmf.strategies.identity import Identity  # noqa: E402
from dpmf.strategies.toeplitz import ToeplitzStrategy  # noqa: E402
from dpmf.strategies.tree import BinaryTree  # noqa: E402
from dpmf.training.jax.noise import correlated_privatizer, noising_matrix, streaming_matrix  # noqa: E402

N, D = 12, 5
SIGMA, CLIP = 1.3, 0.8
STD = SIGMA * CLIP
_R = np.random.default_rng(2024)
USER_C = np.tril(_R.uniform(0.1, 1.0, (N, N))) + np.diag(_R.uniform(1.0, 2.0, N))
BLT2 = BLT([0.9, 0.4], [0.3, 0.2])

STRATEGIES = {
    "identity": Identity(N),
    "toeplitz-banded-encoder": ToeplitzStrategy([1.0, 0.6, 0.3], N),
    "bsr": bsr(N, 4),
    "toeplitz-banded-inverse": bisr(N, 4),
    "toeplitz-full-history": ToeplitzStrategy.sqrt_prefix_sum(N),
    "blt": BLT2.to_toeplitz(N),
    "blt-scaled": BLTStrategy.from_blt(BLT2, N, scale=0.7),
    "dense-matrix": DenseStrategy(USER_C, name="matrix"),
    "dense-bandmf": catalog.build("banded", N, bands=3),
    "dense-optimal": catalog.build("optimal", N, epochs=2),
    "tree": BinaryTree(N),
    "fft": FFTMechanism(N),
}
STREAMING = {"identity", "toeplitz-banded-encoder", "bsr", "blt", "blt-scaled", "dense-bandmf"}


def test_streaming_where_the_strategy_streams():
    for kind, strategy in STRATEGIES.items():
        sm = streaming_matrix(strategy)
        assert (sm is not None) == (kind in STREAMING), kind
        if sm is None:  # the dense left inverse L, n x m
            L = np.asarray(noising_matrix(strategy))
            assert L.shape[0] == N


def test_banded_state_is_bands_arrays_per_parameter():
    """O(bands) / O(buffers) state: the streaming matrices' state for a (7, 3) parameter."""
    leaf = jnp.zeros((7, 3))
    sizes = {}
    for kind in ("bsr", "blt", "dense-bandmf", "identity"):
        state = streaming_matrix(STRATEGIES[kind]).init_multiply(leaf)
        sizes[kind] = sum(int(np.size(x)) for x in jax.tree.leaves(state))
    assert sizes["identity"] == 0
    assert sizes["blt"] == 2 * 21  # two buffers
    assert 4 * 21 <= sizes["bsr"] <= 4 * 21 + 2  # four bands (+ the step counters)
    assert 3 * 21 <= sizes["dense-bandmf"] <= 3 * 21 + 2


@pytest.mark.parametrize("kind", sorted(STREAMING))
def test_streaming_equals_numpy_generator_on_the_same_z(kind):
    strategy = STRATEGIES[kind]
    z = np.random.default_rng(7).standard_normal((N, D))
    with jax.enable_x64(True):
        out = np.asarray(jp_sm.multiply_array(streaming_matrix(strategy), jnp.asarray(z)))
    gen = strategy.streaming_noise(D)
    ref = np.array([gen.step(row) for row in z])
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out, strategy.noising_matrix() @ z, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", sorted(set(STRATEGIES) - STREAMING))
def test_dense_kinds_hand_jax_privacy_the_left_inverse(kind):
    strategy = STRATEGIES[kind]
    with jax.enable_x64(True):
        L = np.asarray(noising_matrix(strategy))
    np.testing.assert_allclose(L, strategy.noising_matrix(), rtol=0, atol=0)
    # L is a left inverse of the encoder: the noise L z is what C x + z releases, mapped back
    np.testing.assert_allclose(L @ strategy.encoder(), np.eye(N), atol=1e-8)


# ---- equal in law: covariance std^2 L L^T over the steps --------------------------------------

REPLICATES = 20_000  # coordinates of one parameter: independent replicates of the n-step noise


def _covariance_matches(emp: np.ndarray, sigma: np.ndarray, replicates: int) -> bool:
    """Each entry of the empirical covariance of `replicates` Gaussian vectors has standard
    deviation sqrt((S_ii S_jj + S_ij^2) / R) <= sqrt(2 / R) max_i S_ii: allow 6 of those."""
    tol = 6.0 * math.sqrt(2.0 / replicates) * float(np.max(np.diag(sigma)))
    return float(np.max(np.abs(emp - sigma))) < tol


def _privatized_zeros(strategy, steps: int, seed: int = 1234, replicates: int = REPLICATES) -> np.ndarray:
    """The noise the privatizer adds to zero gradients at `steps` steps: (steps, replicates)."""
    tx = correlated_privatizer(strategy, noise_multiplier=SIGMA, max_grad_norm=CLIP, seed=seed)
    zeros = jnp.zeros(replicates)

    def body(state, _):
        out, state = tx.update(zeros, state)
        return state, out

    _, W = jax.lax.scan(body, tx.init(zeros), None, length=steps)
    return np.asarray(W, dtype=np.float64)


@pytest.mark.parametrize("kind", sorted(STRATEGIES))
def test_covariance_is_std2_L_Lt(kind):
    strategy = STRATEGIES[kind]
    W = _privatized_zeros(strategy, N)
    emp = W @ W.T / REPLICATES
    L = strategy.noising_matrix()
    exact = STD**2 * L @ L.T
    assert _covariance_matches(emp, exact, REPLICATES)
    # not vacuous: a wrong covariance fails the same check
    assert not _covariance_matches(emp, 1.5 * exact, REPLICATES)
    if kind != "identity":
        iid = STD**2 * np.eye(N)
        tol = 6.0 * math.sqrt(2.0 / REPLICATES) * float(np.max(np.diag(exact)))
        assert np.max(np.abs(exact - iid)) > 2 * tol  # the alternative really differs ...
        assert not _covariance_matches(emp, iid, REPLICATES)  # ... and is rejected


def test_identity_covariance_rejects_correlated_alternative():
    W = _privatized_zeros(STRATEGIES["identity"], N, seed=5)
    emp = W @ W.T / REPLICATES
    L = STRATEGIES["toeplitz-full-history"].noising_matrix()
    assert _covariance_matches(emp, STD**2 * np.eye(N), REPLICATES)
    assert not _covariance_matches(emp, STD**2 * L @ L.T, REPLICATES)


def test_adds_to_the_gradient_and_keeps_the_pytree():
    tx = correlated_privatizer(STRATEGIES["blt"], noise_multiplier=0.0, max_grad_norm=1.0, seed=0)
    grads = {"w": jnp.ones((3, 2)), "b": jnp.arange(2.0)}
    out, _ = tx.update(grads, tx.init(grads))
    assert jax.tree.structure(out) == jax.tree.structure(grads)
    np.testing.assert_array_equal(np.asarray(out["b"]), [0.0, 1.0])  # sigma 0: the gradient itself


def test_past_n_steps_the_updates_are_nan():
    tx = correlated_privatizer(Identity(3), noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
    g = jnp.zeros(4)
    state = tx.init(g)
    for _ in range(3):
        out, state = tx.update(g, state)
        assert np.all(np.isfinite(np.asarray(out)))
    out, state = tx.update(g, state)
    assert np.all(np.isnan(np.asarray(out)))  # step 3 is outside the strategy (and any report)


def test_same_seed_same_noise_other_seed_other_noise():
    a, b, c = (_privatized_zeros(STRATEGIES["bsr"], 2, seed=s, replicates=50) for s in (3, 3, 4))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_bad_inputs_raise_dpmf_errors():
    with pytest.raises(InvalidParameterError, match="seed"):
        correlated_privatizer(Identity(3), noise_multiplier=1.0, max_grad_norm=1.0)
    with pytest.raises(InvalidParameterError, match="seed"):
        correlated_privatizer(Identity(3), noise_multiplier=1.0, max_grad_norm=1.0, seed=-1)
    with pytest.raises(InvalidParameterError, match="max_grad_norm"):
        correlated_privatizer(Identity(3), noise_multiplier=1.0, max_grad_norm=0.0, seed=0)
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        correlated_privatizer(Identity(3), noise_multiplier=float("nan"), max_grad_norm=1.0, seed=0)
    with pytest.raises(InvalidParameterError, match="to_toeplitz"):
        correlated_privatizer(BLT2, noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
    with pytest.raises(UnsupportedConfigurationError, match="no JAX noise"):
        noising_matrix(type("S", (), {"n": 3})())
