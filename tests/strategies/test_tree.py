"""Binary-tree encoder, online Honaker decoder (tree completion, zeroed virtual steps) and the
optimal decoder; Table 1 Honaker rows of the multi-epoch MF paper (notes/multi-epoch-mf.md
Sec. 9, oracles O9-O10)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmf.errors import InvalidParameterError
from dpmf.strategies.stamping import optimal_decoder, restart_decoder, stamp
from dpmf.strategies.tree import BinaryTree, binary_tree_encoder, online_honaker_decoder, tree_nodes

# ---- local helpers (Eq. (3) exact sensitivity for X = C^T C >= 0, Eq. (4) loss) -------------------


def _patterns(k: int, b: int) -> list[list[int]]:
    return [[s + j * b for j in range(k)] for s in range(b)]


def sens_nonneg_gram(X: np.ndarray, k: int, b: int) -> float:
    """max_pi sqrt(1^T X[pi, pi] 1); exact when X >= 0 entrywise (Cor. 2.1)."""
    assert X.min() >= 0
    return float(np.sqrt(max(X[np.ix_(p, p)].sum() for p in _patterns(k, b))))


def loss(B: np.ndarray, sens: float) -> float:
    return sens**2 * float(np.sum(B**2))


def _reference_tree(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Independent level-major construction (notes, appendix snippet): rows of C ordered by
    (level, index), the online decoder built block by block, completion row, virtual rows dropped."""
    L = int(np.ceil(np.log2(n))) if n > 1 else 0
    NL = 2**L
    nodes = [(h, t) for h in range(L + 1) for t in range(NL >> h)]
    idx = {x: i for i, x in enumerate(nodes)}
    C = np.zeros((len(nodes), n))
    for (h, t), i in idx.items():
        if (t << h) < n:
            C[i, t << h : min((t + 1) << h, n)] = 1

    def est(h, t):
        w = 2.0 ** -np.arange(h + 1)
        w /= w.sum()
        r = np.zeros(len(nodes))
        for j in range(h + 1):
            for tt in range(t << j, (t + 1) << j):
                r[idx[(h - j, tt)]] += w[j]
        return r

    B = np.zeros((n, len(nodes)))
    for i in range(1, n + 1):
        start = 0
        for h in range(L, -1, -1):
            if i & (1 << h):
                B[i - 1] += est(h, start >> h)
                start += 1 << h
    if n != NL:
        B[n - 1] = est(L, 0)
    keep = C.sum(1) > 0
    return B[:, keep], C[keep]


# ---- encoder ----------------------------------------------------------------------------------


@pytest.mark.parametrize("L", [0, 1, 3, 6])
def test_power_of_two_tree(L):
    n = 2**L
    tree = BinaryTree(n)
    C = tree.encoder()
    assert C.shape == (2 * n - 1, n) and tree.num_rows == 2 * n - 1 and tree.levels == L
    np.testing.assert_array_equal(C.sum(axis=0), L + 1)  # every step is in L + 1 nodes
    np.testing.assert_allclose(tree.column_norms(), math.sqrt(L + 1))
    assert set(np.unique(C)) <= {0.0, 1.0}


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 11, 100, 129])
def test_rows_in_release_order_and_streaming(n):
    nodes = tree_nodes(n)
    C = binary_tree_encoder(n)
    release = nodes[:, 4]
    assert np.all(np.diff(release) >= 0)
    # each row only reads steps up to its release step, and it does read that step
    last_step = np.array([np.flatnonzero(row)[-1] for row in C])
    np.testing.assert_array_equal(last_step, release)
    # same rows as the level-major reference construction (up to order)
    _, C_ref = _reference_tree(n)
    assert sorted(map(tuple, C)) == sorted(map(tuple, C_ref))
    assert C.shape[0] == BinaryTree(n).num_rows == sum(-(-n // 2**h) for h in range(BinaryTree(n).levels + 1))


# ---- online Honaker decoder --------------------------------------------------------------------


@pytest.mark.parametrize("n", list(range(1, 40)) + [100, 257])
def test_online_decoder_reproduces_prefix_sums_and_is_online(n):
    C = binary_tree_encoder(n)
    B = online_honaker_decoder(n)
    np.testing.assert_allclose(B @ C, np.tri(n), rtol=0, atol=1e-13)
    release = tree_nodes(n)[:, 4]
    steps, rows = np.nonzero(B)
    assert np.all(release[rows] <= steps)  # step i only uses nodes released by step i


@pytest.mark.parametrize("n", [1, 5, 8, 12, 31, 64])
def test_online_decoder_matches_reference_per_step_variance(n):
    B_ref, C_ref = _reference_tree(n)
    B = online_honaker_decoder(n)
    np.testing.assert_allclose(np.sum(B**2, axis=1), np.sum(B_ref**2, axis=1), rtol=1e-13)
    np.testing.assert_allclose(B_ref @ C_ref, np.tri(n), atol=1e-13)


def test_honaker_variance_formula_app_d3():
    """Prefix of length 2^h is one subtree: Var = 1 / (2 (1 - 2^{-(h+1)})) per unit sigma."""
    B = online_honaker_decoder(64)
    for h in range(7):
        assert np.sum(B[2**h - 1] ** 2) == pytest.approx(1 / (2 * (1 - 2.0 ** -(h + 1))), rel=1e-13)


def test_tree_completion_and_zeroed_virtual_steps_n5():
    """n = 5 in an 8-leaf tree. Without completion the last prefix sum is est(2,0) + leaf 4,
    variance 4/7 + 1. With completion it is the root estimator, weights (8, 4, 2, 1)/15 on levels
    3..0, restricted to the kept nodes (1 + 2 + 3 + 5): (64 + 2*16 + 3*4 + 5*1) / 225 = 113/225."""
    B = online_honaker_decoder(5)
    assert np.sum(B[4] ** 2) == pytest.approx(113 / 225, rel=1e-14)
    assert 113 / 225 < 4 / 7 + 1
    # rows before the last keep the plain from-below estimator: prefix of 4 = one subtree
    assert np.sum(B[3] ** 2) == pytest.approx(4 / 7, rel=1e-14)


# ---- optimal decoder ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 6, 16, 33])
def test_optimal_decoder(n):
    tree = BinaryTree(n)
    C = tree.encoder()
    Bo = tree.optimal_decoder()
    np.testing.assert_allclose(Bo, np.tri(n) @ np.linalg.pinv(C), atol=1e-12)
    np.testing.assert_allclose(Bo @ C, np.tri(n), atol=1e-12)
    assert np.linalg.norm(Bo) <= np.linalg.norm(tree.online_decoder()) * (1 + 1e-12)
    A = np.random.default_rng(n).normal(size=(n, n))
    np.testing.assert_allclose(tree.optimal_decoder(A), A @ np.linalg.pinv(C), atol=1e-11)
    assert tree.prefix_sum_rmse("optimal") <= tree.prefix_sum_rmse("online") * (1 + 1e-12)
    assert tree.prefix_sum_rmse() == pytest.approx(np.linalg.norm(tree.online_decoder()) / math.sqrt(n), rel=1e-14)


def test_describe_and_nodes():
    tree = BinaryTree(6)
    assert tree.describe() == {"name": "binary_tree", "n": 6, "levels": 3, "rows": 6 + 3 + 2 + 1}
    nodes = tree.nodes()
    # root of the completed 8-leaf tree covers the real steps 0..5 and is released at step 5
    assert [3, 0, 0, 6, 5] in nodes.tolist()


# ---- Table 1 (k, b) = (20, 100), n = 2000: notes Sec. 9, O9-O10 -------------------------------------

K, BSEP, N = 20, 100, 2000
STAMP_SIZES = [2000, 1000, 400, 200, 100]
ONLINE_LOSS = {2000: 5.774e6, 1000: 3.267e6, 400: 2.077e6, 200: 1.954e6, 100: 2.130e6}  # paper 5.8, 3.3, 2.1, 2.0, 2.1
OPTIMAL_LOSS = {2000: 2.431e6, 1000: 1.551e6, 400: 1.225e6, 200: 1.388e6, 100: 1.753e6}  # paper 2.4, 1.6, 1.2, 1.4, 1.8
PAPER_ONLINE = {2000: 5.8e6, 1000: 3.3e6, 400: 2.1e6, 200: 2.0e6, 100: 2.1e6}
PAPER_OPTIMAL = {2000: 2.4e6, 1000: 1.6e6, 400: 1.2e6, 200: 1.4e6, 100: 1.8e6}


@pytest.fixture(scope="module")
def honaker_table():
    """(Online) Honaker (n')xs with the restart decoder, and Optimal Decoder Honaker (n')xs with
    A (I_s (x) C)^+; exact sensitivity (Eq. 3, C >= 0) of the stamped encoder under (20, 100)."""
    rows = {}
    for n1 in STAMP_SIZES:
        s = N // n1
        tree = BinaryTree(n1)
        C = tree.encoder()
        X = np.kron(np.eye(s), C.T @ C)
        sens = sens_nonneg_gram(X, K, BSEP)
        online = loss(restart_decoder(tree.online_decoder(), s), sens)
        optimal = loss(optimal_decoder(C, s), sens)
        rows[n1] = (sens, online, optimal)
    return rows


@pytest.mark.parametrize("n1", STAMP_SIZES)
def test_table1_honaker_rows(honaker_table, n1):
    _, online, optimal = honaker_table[n1]
    assert online == pytest.approx(ONLINE_LOSS[n1], rel=1e-3)
    assert optimal == pytest.approx(OPTIMAL_LOSS[n1], rel=1e-3)
    assert float(f"{online:.1e}") == PAPER_ONLINE[n1]
    assert float(f"{optimal:.1e}") == PAPER_OPTIMAL[n1]


def test_table1_honaker_class_minima(honaker_table):
    assert min(STAMP_SIZES, key=lambda n1: honaker_table[n1][1]) == 200  # Online Honaker (n=200)x10
    assert min(STAMP_SIZES, key=lambda n1: honaker_table[n1][2]) == 400  # Optimal Decoder Honaker (n=400)x5


def test_stamped_sensitivity_uses_whole_matrix():
    """Eq. (3) on the stamped tree: with n' = 400 each block sees 4 participations of one
    pattern, and all 5 blocks add: sens^2 = 5 * (block value) = 300 (so sens = 17.3205, cf. the
    (n=400)x5 row)."""
    C = BinaryTree(400).encoder()
    X = C.T @ C
    block = max(X[np.ix_(p, p)].sum() for p in _patterns(4, 100))
    assert block == pytest.approx(60.0)
    big = sens_nonneg_gram(np.kron(np.eye(5), X), K, BSEP)
    assert big**2 == pytest.approx(5 * block, rel=1e-14)


def test_tree_small_table_analogue():
    """Fast analogue, n = 64 under (8, 8): stamped restart decoder == direct restart construction,
    and the optimal decoder beats the online one for every stamping."""
    for n1 in (64, 32, 16, 8):
        s = 64 // n1
        tree = BinaryTree(n1)
        C = stamp(tree.encoder(), s)
        sens = sens_nonneg_gram(C.T @ C, 8, 8)
        online = loss(restart_decoder(tree.online_decoder(), s), sens)
        opt = loss(np.tri(64) @ np.linalg.pinv(C), sens)
        assert loss(optimal_decoder(tree.encoder(), s), sens) == pytest.approx(opt, rel=1e-10)
        assert opt < online


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3, 2.5, float("nan"), True, "10"])
def test_bad_n_raises(bad):
    with pytest.raises(InvalidParameterError, match="n"):
        BinaryTree(bad)
    with pytest.raises(InvalidParameterError, match="n"):
        tree_nodes(bad)


def test_bad_decoder_arguments_raise():
    tree = BinaryTree(4)
    with pytest.raises(InvalidParameterError, match="decoder"):
        tree.prefix_sum_rmse("full")
    with pytest.raises(InvalidParameterError, match="workload"):
        tree.optimal_decoder(np.eye(3))
    with pytest.raises(InvalidParameterError, match="workload"):
        tree.optimal_decoder(np.full((4, 4), np.nan))
