"""Streaming noise for every strategy kind: the streamed per-step noise equals ``L z`` computed
densely with the same ``z`` (``L = C^{-1}`` for square encoders, the first difference of the
decoder's noise for the tree and FFT), ``L C = I``, the documented memory, and the RNG path."""

from __future__ import annotations

import numpy as np
import pytest

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.strategies import catalog
from dpmf.strategies.banded import bisr
from dpmf.strategies.blt import BLT, BLTStrategy
from dpmf.strategies.dense import DenseStrategy
from dpmf.strategies.fft import FFTMechanism
from dpmf.strategies.identity import Identity
from dpmf.strategies.sensitivity import FixedEpochParticipation
from dpmf.strategies.streaming import CHUNK, DenseNoise, StreamingNoise
from dpmf.strategies.toeplitz import ToeplitzStrategy
from dpmf.strategies.tree import BinaryTree, online_honaker_decoder, tree_nodes

N, DIM, BANDS = 12, 3, 3
RNG_MATRIX = np.random.default_rng(99)
USER_MATRIX = np.tril(RNG_MATRIX.uniform(0.1, 1.0, (N, N))) + 2 * np.eye(N)


def _build(kind: str):
    return catalog.build(kind, N, epochs=2, bands=BANDS, matrix=USER_MATRIX if kind == "matrix" else None)


def _stream(strategy, z: np.ndarray) -> np.ndarray:
    """Feed z (rows in the encoder's row order) to the strategy's streaming generator."""
    if isinstance(strategy, FFTMechanism):
        return np.array(list(strategy.streaming_noise(z.shape[1], z=z)))
    noise = strategy.streaming_noise(z.shape[1])
    if isinstance(strategy, BinaryTree):
        release = tree_nodes(strategy.n)[:, 4]
        return np.array([noise.step(z[release == t]) for t in range(strategy.n)])
    return np.array([noise.step(row) for row in z])


def _dense_oracle(strategy, z: np.ndarray) -> np.ndarray:
    """L z from first principles: inv(C) z, or diff(B z) with the decoder the training uses."""
    if isinstance(strategy, BinaryTree):
        return np.diff(online_honaker_decoder(strategy.n) @ z, axis=0, prepend=0.0) / strategy.scale
    if isinstance(strategy, FFTMechanism):
        return np.diff(strategy.decoder() @ z, axis=0, prepend=0.0)
    return np.linalg.inv(strategy.encoder()) @ z


@pytest.mark.parametrize("kind", catalog.KINDS)
def test_streamed_noise_equals_dense_left_inverse(kind):
    strategy = _build(kind)
    C = strategy.encoder()
    z = np.random.default_rng(5).standard_normal((C.shape[0], DIM))
    W = _stream(strategy, z)
    expected = _dense_oracle(strategy, z)
    assert W.shape == (N, DIM)
    np.testing.assert_allclose(W, expected, rtol=0, atol=1e-10 * max(1.0, np.abs(expected).max()))
    L = strategy.noising_matrix()
    np.testing.assert_allclose(L @ C, np.eye(N), rtol=0, atol=1e-10)  # what training adds is a left inverse
    np.testing.assert_allclose(L @ z, expected, rtol=0, atol=1e-10 * max(1.0, np.abs(expected).max()))


EXPECTED_MEMORY_ROWS = {
    "identity": 0,
    "tree": 4,  # ceil(log2 12) stored estimates
    "sqrt-toeplitz": N - 1,  # dense C^{-1}: full history
    "banded-toeplitz": BANDS - 1,
    "banded": BANDS - 1,
    "bsr": BANDS - 1,
    "bisr": BANDS - 1,  # exact banded inverse
    "band-inv": BANDS - 1,  # banded inverse: the last bands - 1 draws
    "blt": 2,  # 2 buffers
    "optimal": N - 1,
    "fft": N,  # pre-generated
    "matrix": N - 1,
}


@pytest.mark.parametrize("kind", catalog.KINDS)
def test_memory_floats(kind):
    strategy = _build(kind)
    noise = strategy.streaming_noise(7, rng=0)
    assert noise.memory_floats == EXPECTED_MEMORY_ROWS[kind] * 7


@pytest.mark.parametrize("kind", catalog.KINDS)
def test_rng_path_is_reproducible_scaled_and_stops(kind):
    strategy = _build(kind)
    a = np.array(list(strategy.streaming_noise(4, rng=3, noise_multiplier=2.0)))
    b = np.array(list(strategy.streaming_noise(4, rng=np.random.default_rng(3), noise_multiplier=2.0)))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (N, 4) and np.all(np.isfinite(a))
    c = np.array(list(strategy.streaming_noise(4, rng=3, noise_multiplier=1.0)))
    np.testing.assert_allclose(a, 2.0 * c, rtol=1e-12, atol=1e-12)  # linear in sigma
    zero = np.array(list(strategy.streaming_noise(4, rng=3, noise_multiplier=0.0)))
    np.testing.assert_array_equal(zero, 0.0)


@pytest.mark.parametrize("kind", ["identity", "banded", "blt", "banded-toeplitz", "sqrt-toeplitz", "tree"])
def test_next_equals_step_with_the_same_draws(kind):
    """next() draws z_t = sigma N(0, I) from rng in order (also across chunks): replaying the
    same generator into step() gives the same noise."""
    strategy = catalog.build(kind, 6, bands=2)
    dim = CHUNK + 77  # more than one chunk
    sigma = 1.7
    drawn = strategy.streaming_noise(dim, rng=11, noise_multiplier=sigma)
    fed = strategy.streaming_noise(dim)
    replay = np.random.default_rng(11)
    for _ in range(6):
        w = next(drawn)
        z = sigma * replay.standard_normal(fed.input_shape())
        np.testing.assert_allclose(w, fed.step(z), rtol=1e-13, atol=1e-13)
    with pytest.raises(StopIteration):
        next(drawn)
    with pytest.raises(InvalidParameterError, match="already"):
        fed.step(np.zeros(dim))


def test_streaming_covariance_of_bandmf_matches_inverse_gram():
    """Columns of the (n x dim) output are i.i.d. sigma C^{-1} z: empirical covariance within 5
    standard errors of sigma^2 C^{-1} C^{-T}, and far from independent noise."""
    strategy = catalog.build("banded", 6, bands=3)
    dim, sigma = 40_000, 1.3
    W = np.array(list(strategy.streaming_noise(dim, rng=2024, noise_multiplier=sigma)))
    Cinv = np.linalg.inv(strategy.encoder())
    cov = sigma**2 * Cinv @ Cinv.T
    emp = W @ W.T / dim
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / dim)
    assert np.max(np.abs(emp - cov) / se) < 5.0
    wrong = sigma**2 * np.eye(6)
    assert np.max(np.abs(emp - wrong) / np.sqrt((np.outer(np.diag(wrong), np.diag(wrong)) + wrong**2) / dim)) > 50


def test_tree_streaming_power_of_two_and_odd_sizes_and_normalized_scale():
    for n in (1, 2, 7, 8, 9, 16, 33):
        for tree in (BinaryTree(n), BinaryTree(n).normalized(FixedEpochParticipation(1, n))):
            C = tree.encoder()
            z = np.random.default_rng(n).standard_normal((C.shape[0], 2))
            W = _stream(tree, z)
            np.testing.assert_allclose(W, _dense_oracle(tree, z), rtol=0, atol=1e-12)
            np.testing.assert_allclose(tree.noising_matrix() @ C, np.eye(n), atol=1e-12)
        assert tree.streaming_noise(5).memory_floats == tree.levels * 5


def test_tree_streamed_prefix_noise_has_honaker_variance():
    """Prefix sums of the streamed noise are B_hon z: variance per unit sigma of the last prefix
    sum of a complete tree is sum_h V_h over its blocks, e.g. n = 8: V_3 = 1 / (2 - 1/8)."""
    W = np.array(list(BinaryTree(8).streaming_noise(200_000, rng=1)))
    var = np.var(np.cumsum(W, axis=0)[-1])
    assert var == pytest.approx(1 / (2 - 1 / 8), rel=0.02)


def test_fft_noise_is_pregenerated_and_optimal_decoder_matches_pseudo_inverse():
    fft = FFTMechanism(N)
    z = np.random.default_rng(0).standard_normal((2 * N, 2))
    noise = fft.streaming_noise(2, z=z, decoder="optimal")
    np.testing.assert_allclose(np.array(list(noise)), np.linalg.pinv(fft.encoder()) @ z, atol=1e-10)
    with pytest.raises(UnsupportedConfigurationError, match="not streaming"):
        fft.streaming_noise(2, rng=0).step(np.zeros(2))
    with pytest.raises(InvalidParameterError, match="rng is required"):
        fft.streaming_noise(2)
    with pytest.raises(InvalidParameterError, match="decoder"):
        fft.streaming_noise(2, rng=0, decoder="online")


def test_non_adaptive_dense_strategy_pregenerates_pseudo_inverse_noise():
    C = np.vstack([np.eye(4), np.tril(np.ones((4, 4)))])
    strat = DenseStrategy(C, adaptive=False)
    noise = strat.streaming_noise(3, rng=0)
    assert noise.memory_floats == 12
    with pytest.raises(UnsupportedConfigurationError):
        noise.step(np.zeros(3))
    np.testing.assert_allclose(strat.noising_matrix() @ C, np.eye(4), atol=1e-12)


def test_blt_strategy_normalized_keeps_buffers_and_scales_noise():
    part = FixedEpochParticipation(2, 8)
    s = BLT([0.9, 0.4], [0.3, 0.2]).to_toeplitz(16)
    assert isinstance(s, BLTStrategy) and isinstance(s, ToeplitzStrategy)
    ns = s.normalized(part)
    assert isinstance(ns, BLTStrategy)
    assert ns.sensitivity(part) == pytest.approx(1.0, rel=1e-12)
    z = np.random.default_rng(1).standard_normal((16, 2))
    noise = ns.streaming_noise(2)
    W = np.array([noise.step(r) for r in z])
    np.testing.assert_allclose(W, np.linalg.inv(ns.encoder()) @ z, atol=1e-11)
    assert noise.memory_floats == 4
    with pytest.raises(InvalidParameterError, match="coefs must equal"):
        BLTStrategy(np.ones(16), 16, blt=BLT([0.9], [0.3]))


def test_bisr_keeps_exact_banded_inverse():
    s = bisr(64, 5)
    assert s.inverse_coefs.size == 5
    noise = s.streaming_noise(2)
    assert noise.mode == "banded-inverse" and noise.memory_floats == 4 * 2
    with pytest.raises(InvalidParameterError, match="inverse_coefs"):
        ToeplitzStrategy(s.coefs, 64, inverse_coefs=[1.0, -0.4])


def test_float32_opt_in():
    s = catalog.build("blt", 16, epochs=2)
    w = next(s.streaming_noise(10, rng=0, dtype=np.float32))
    assert w.dtype == np.float32
    w64 = next(s.streaming_noise(10, rng=0))
    assert w64.dtype == np.float64
    with pytest.raises(InvalidParameterError, match="dtype"):
        s.streaming_noise(10, rng=0, dtype=np.int64)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Identity(4).streaming_noise(0), "dim"),
        (lambda: Identity(4).streaming_noise(3, rng="seed"), "rng"),
        (lambda: Identity(4).streaming_noise(3, rng=True), "rng"),
        (lambda: Identity(4).streaming_noise(3, noise_multiplier=-1.0), "noise_multiplier"),
        (lambda: Identity(4).streaming_noise(3, noise_multiplier=float("nan")), "noise_multiplier"),
        (lambda: DenseNoise(np.ones((3, 3)), 2), "lower triangular"),
        (lambda: DenseNoise(np.tril(np.ones((3, 3))) - np.eye(3), 2), "invertible"),
        (lambda: DenseNoise(np.ones((3, 2)), 2), "square"),
    ],
)
def test_bad_streaming_arguments_raise(make, match):
    with pytest.raises(InvalidParameterError, match=match):
        make()


def test_bad_step_inputs_raise():
    noise = catalog.build("banded", 6, bands=2).streaming_noise(3)
    with pytest.raises(InvalidParameterError, match="shape"):
        noise.step(np.zeros(4))
    with pytest.raises(InvalidParameterError, match="finite"):
        noise.step(np.array([0.0, np.nan, 0.0]))
    with pytest.raises(InvalidParameterError, match="rng"):
        next(noise)  # no rng: dpmf never draws hidden seeds
    tree_noise = BinaryTree(4).streaming_noise(2)
    with pytest.raises(InvalidParameterError, match=r"shape \(1, 2\)"):
        tree_noise.step(np.zeros(2))
    assert isinstance(noise, StreamingNoise)


@pytest.mark.parametrize("kind", catalog.KINDS)
def test_parameter_shaped_noise_is_the_flat_noise_reshaped(kind):
    strategy = _build(kind)
    shaped = np.array(list(strategy.streaming_noise((2, 3), rng=8)))
    flat = np.array(list(strategy.streaming_noise(6, rng=8)))
    assert shaped.shape == (N, 2, 3)
    np.testing.assert_array_equal(shaped.reshape(N, 6), flat)
    if kind not in ("fft", "tree"):
        noise = strategy.streaming_noise((2, 3))
        z = np.random.default_rng(0).standard_normal((2, 3))
        w = noise.step(z)
        assert w.shape == (2, 3)
        np.testing.assert_allclose(w, z / strategy.encoder()[0, 0], rtol=1e-13)
    for bad in ((), (2, 0), (2, 1.5)):
        with pytest.raises(InvalidParameterError, match="dim"):
            strategy.streaming_noise(bad, rng=0)
