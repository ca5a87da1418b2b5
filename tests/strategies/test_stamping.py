"""Stamping (block-diagonal encoders), the restart decoder and the optimal decoder."""

from __future__ import annotations

import numpy as np
import pytest

from dpmf.errors import InvalidParameterError
from dpmf.strategies.fft import FFTMechanism
from dpmf.strategies.stamping import (
    StampedEncoder,
    optimal_decoder,
    pseudo_inverse,
    restart_decoder,
    stamp,
)
from dpmf.strategies.toeplitz import ToeplitzStrategy
from dpmf.strategies.tree import BinaryTree

# ---- local sensitivity helpers (multi-epoch MF paper, Sec. 2; not the library's sensitivity module)


def _patterns(k: int, b: int) -> list[list[int]]:
    """(k, b)-participation with n = k b, 0-based: pi_s = {s, s + b, ..., s + (k-1) b}."""
    return [[s + j * b for j in range(k)] for s in range(b)]


def sens_nonneg_gram(X: np.ndarray, k: int, b: int) -> float:
    """Eq. (3) from X = C^T C: max_pi sqrt(1^T X[pi, pi] 1), exact when X >= 0 entrywise."""
    assert X.min() >= -1e-12
    return float(np.sqrt(max(X[np.ix_(p, p)].sum() for p in _patterns(k, b))))


def sens_nonneg(C: np.ndarray, k: int, b: int) -> float:
    return sens_nonneg_gram(C.T @ C, k, b)


def sens_spectral(C: np.ndarray, k: int, b: int) -> float:
    """Thm. 2.1: sqrt(k) * max_pi ||C[:, pi]||_2 (an upper bound, valid for any C and d)."""
    return float(np.sqrt(k) * max(np.linalg.norm(C[:, p], 2) for p in _patterns(k, b)))


def loss(B: np.ndarray, sens: float) -> float:
    """Eq. (4): sens^2 ||B||_F^2."""
    return sens**2 * float(np.sum(B**2))


# ---- identity sanity: DP-SGD as a matrix mechanism ------------------------------------------------


def test_identity_dpsgd_loss_and_helpers():
    """C = I under (20, 100), n = 2000: sens^2 = k = 20 by both helpers, B = A, and
    loss = 20 * n (n + 1) / 2 = 4.002e7 (notes O22). Stamping I_400 five times is I_2000."""
    n, k, b = 2000, 20, 100
    C = stamp(np.eye(400), 5)
    np.testing.assert_array_equal(C, np.eye(n))
    X = stamp(np.eye(400).T @ np.eye(400), 5)  # the Gram of a stamp is the stamp of the Gram
    assert sens_nonneg_gram(X, k, b) ** 2 == pytest.approx(20, rel=1e-14)
    assert sens_spectral(C, k, b) ** 2 == pytest.approx(20, rel=1e-14)
    B = optimal_decoder(np.eye(400), 5)
    np.testing.assert_allclose(B, np.tri(n), atol=1e-13)
    assert loss(B, sens_nonneg_gram(X, k, b)) == pytest.approx(4.002e7, rel=1e-12)
    # the restart decoder of the 400-step prefix sum is the 2000-step prefix sum
    np.testing.assert_array_equal(restart_decoder(np.tri(400), 5), np.tri(n))


# ---- stamp ------------------------------------------------------------------------------------


def test_stamp_is_block_diagonal():
    block = np.arange(6.0).reshape(3, 2) + 1
    C = stamp(block, 3)
    assert C.shape == (9, 6)
    for i in range(3):
        for j in range(3):
            expected = block if i == j else 0.0
            np.testing.assert_array_equal(C[3 * i : 3 * i + 3, 2 * j : 2 * j + 2], expected)
    np.testing.assert_array_equal(stamp(block, 1), block)


def test_stamped_sensitivity_under_epochs_matches_brute_force():
    """A stamped tree under (k, b) = (4, 4): Eq. (3) on the big matrix equals the maximum over
    all 0/1 participation vectors (C >= 0, so the all-ones vectors are worst)."""
    C = stamp(BinaryTree(8).encoder(), 2)
    best = max(np.linalg.norm(C[:, p].sum(axis=1)) for p in _patterns(4, 4))
    assert sens_nonneg(C, 4, 4) == pytest.approx(best, rel=1e-14)
    # blocks do not compose: two participations in each block of 8 steps
    single_block = sens_nonneg(BinaryTree(8).encoder(), 2, 4)
    assert sens_nonneg(C, 4, 4) == pytest.approx(np.sqrt(2) * single_block, rel=1e-14)


# ---- restart decoder --------------------------------------------------------------------------


@pytest.mark.parametrize("n1,s", [(1, 4), (5, 3), (8, 2), (13, 4)])
def test_restart_decoder_reproduces_prefix_sum(n1, s):
    tree = BinaryTree(n1)
    Bs = restart_decoder(tree.online_decoder(), s)
    np.testing.assert_allclose(Bs @ stamp(tree.encoder(), s), np.tri(n1 * s), atol=1e-12)
    fft = FFTMechanism(n1)
    Bs = restart_decoder(fft.decoder(), s)
    np.testing.assert_allclose(Bs @ stamp(fft.encoder(), s), np.tri(n1 * s), atol=1e-12)


def test_restart_decoder_blocks_repeat_last_row():
    B = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 1.0]])
    Bs = restart_decoder(B, 3)
    assert Bs.shape == (6, 9)
    np.testing.assert_array_equal(Bs[4:6, 0:3], np.tile(B[-1], (2, 1)))
    np.testing.assert_array_equal(Bs[4:6, 3:6], np.tile(B[-1], (2, 1)))
    np.testing.assert_array_equal(Bs[4:6, 6:9], B)
    np.testing.assert_array_equal(Bs[0:2, 3:9], 0.0)


# ---- optimal decoder --------------------------------------------------------------------------


@pytest.mark.parametrize("s", [1, 2, 5])
def test_optimal_decoder_equals_dense_pseudo_inverse(s):
    block = BinaryTree(6).encoder()
    big = stamp(block, s)
    expected = np.tri(6 * s) @ np.linalg.pinv(big)
    np.testing.assert_allclose(optimal_decoder(block, s), expected, atol=1e-12)
    rng = np.random.default_rng(s)
    A = rng.normal(size=(6 * s, 6 * s))
    np.testing.assert_allclose(optimal_decoder(block, s, A), A @ np.linalg.pinv(big), atol=1e-11)
    np.testing.assert_allclose(pseudo_inverse(block), np.linalg.pinv(block), atol=1e-13)


def test_optimal_decoder_never_worse_than_restart():
    """The pseudo-inverse decoder has the least Frobenius norm among all decoders of the encoder."""
    for block, dec in [
        (BinaryTree(16).encoder(), BinaryTree(16).online_decoder()),
        (FFTMechanism(16).encoder(), FFTMechanism(16).decoder()),
    ]:
        opt = optimal_decoder(block, 4)
        rst = restart_decoder(dec, 4)
        np.testing.assert_allclose(opt @ stamp(block, 4), np.tri(64), atol=1e-11)
        assert np.linalg.norm(opt) < np.linalg.norm(rst)


def test_optimal_decoder_with_given_block_pseudo_inverse():
    fft = FFTMechanism(10)
    a = optimal_decoder(fft.encoder(), 3, block_pseudo_inverse=fft.pseudo_inverse())
    b = optimal_decoder(fft.encoder(), 3)
    np.testing.assert_allclose(a, b, atol=1e-12)


def test_optimal_decoder_of_square_invertible_block():
    C = ToeplitzStrategy.sqrt_prefix_sum(7).encoder()
    np.testing.assert_allclose(optimal_decoder(C, 2), np.tri(14) @ np.linalg.inv(stamp(C, 2)), atol=1e-12)


def test_stamped_encoder_object():
    tree = BinaryTree(5)
    st = StampedEncoder(tree.encoder(), 4)
    assert st.n == 20 and st.describe()["copies"] == 4
    np.testing.assert_array_equal(st.encoder(), stamp(tree.encoder(), 4))
    np.testing.assert_allclose(st.restart_decoder(tree.online_decoder()) @ st.encoder(), np.tri(20), atol=1e-12)
    np.testing.assert_allclose(st.optimal_decoder(), optimal_decoder(tree.encoder(), 4), atol=1e-14)
    assert not st.block.flags.writeable


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 1.5, float("nan"), True])
def test_bad_copies_raise(bad):
    for fn in (stamp, restart_decoder, optimal_decoder):
        with pytest.raises(InvalidParameterError, match="copies"):
            fn(np.eye(2), bad)


@pytest.mark.parametrize("bad", [np.ones(3), np.full((2, 2), np.nan), np.zeros((0, 2)), [["x"]]])
def test_bad_matrices_raise(bad):
    with pytest.raises(InvalidParameterError, match="encoder"):
        stamp(bad, 2)
    with pytest.raises(InvalidParameterError, match="decoder"):
        restart_decoder(bad, 2)


def test_rank_deficient_or_wide_encoder_raises():
    with pytest.raises(InvalidParameterError, match="full column rank"):
        pseudo_inverse(np.array([[1.0, 1.0], [2.0, 2.0]]))
    with pytest.raises(InvalidParameterError, match="full column rank"):
        optimal_decoder(np.ones((1, 2)), 2)


def test_shape_mismatches_raise():
    with pytest.raises(InvalidParameterError, match="workload"):
        optimal_decoder(np.eye(3), 2, np.eye(3))
    with pytest.raises(InvalidParameterError, match="block_pseudo_inverse"):
        optimal_decoder(np.eye(3), 2, block_pseudo_inverse=np.eye(2))
    with pytest.raises(InvalidParameterError, match="block_decoder"):
        StampedEncoder(np.ones((3, 2)), 2).restart_decoder(np.ones((3, 2)))
