"""Binary-tree aggregation (DP-FTRL's encoder) with the online Honaker and the optimal decoders.

Implements the tree baselines of Choquette-Choo et al., *Multi-Epoch Matrix Factorization
Mechanisms for Private ML* (ICML 2023), App. D.1/D.3 (digest ``notes/multi-epoch-mf.md`` Sec. 4.7),
the binary tree mechanism (Dwork et al. 2010; Chan et al. 2011; digest ``notes/mmcc.md`` Sec. 4.1)
and the "estimator from below" of Honaker (2015) as used by Kairouz et al. (2021).

**Nodes** (0-based; the papers' node ``(j, k)`` covering rounds ``[k 2^j + 1, (k+1) 2^j]`` is our
``(h, t) = (j, k)`` covering steps ``[t 2^h, (t+1) 2^h)``). With ``L = ceil(log2 n)`` the complete
tree has ``2^L`` leaves; steps ``n .. 2^L - 1`` are *virtual* (their input is 0). A node is kept
iff it covers at least one real step (``t 2^h < n``); all-virtual nodes are dropped (their rows
of ``C_tree E`` are zero), which is the paper's "zero out the virtual steps" improvement. A kept
node's row of the encoder ``C`` (``m x n``, 0/1, ``C >= 0``) is the indicator of its real steps
``[t 2^h, min((t+1) 2^h, n))``; it is *released* at its last real step ``min((t+1) 2^h, n) - 1``.
**Rows are ordered by release time** (ties: lower level first), so ``C`` is lower-triangular in
the streaming sense: the noisy value of a row only depends on inputs up to its release step. For
``n = 2^L`` there are ``m = 2n - 1`` rows and every column has ``L + 1`` ones.

**Online Honaker decoder** (App. D.3). For a subtree rooted at ``(h, t)`` the inverse-variance
estimate of its sum from the nodes inside it is::

    est(h, t) = sum_{j=0}^{h} c_j * (sum of the 2^j nodes at level h - j below (h, t)),
    c_j = 2^{-j} / sum_{j'=0}^{h} 2^{-j'},      Var = sigma^2 / (2 (1 - 2^{-(h+1)})).

The prefix sum of steps ``0 .. i-1`` (``i = 1 .. n``) is the sum of ``est`` over the dyadic blocks
of the binary representation of ``i`` (largest first). *Tree completion*: if ``n`` is not a power
of two, the last prefix sum (``i = n``) is estimated by the root estimator ``est(L, 0)`` of the
completed tree (virtual inputs are 0), restricted to the kept nodes. ``B_hon @ C = A`` (prefix
sums) and ``B_hon[i, r] != 0`` only for rows ``r`` released at or before step ``i``.

**Optimal decoder**: ``B = A C^+`` (minimum Frobenius norm among all decoders of ``C``; the
"full" Honaker estimator when ``A`` is the prefix sum). It is not online.

Privacy only depends on ``C``; ``C^T C >= 0``, so the exact sensitivity under (k, b)-participation
is Eq. (3) of the paper, ``max_pi sqrt(1^T X[pi, pi] 1)``.

**Training noise** (streaming): DP-FTRL adds ``L z`` with ``L = A^{-1} B_hon`` (the step-by-step
increments of the online decoder's prefix-sum noise, ``L C = I``);
:meth:`BinaryTree.streaming_noise` produces it with one stored estimate per pending dyadic block
(``ceil(log2 n) * dim`` floats), see :class:`dpmf.strategies.streaming.TreeNoise`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError
from dpmf.resources import check_allocation
from dpmf.strategies.api import ErrorMethods
from dpmf.strategies.stamping import optimal_decoder as _optimal_decoder

__all__ = ["BinaryTree", "tree_nodes", "binary_tree_encoder", "online_honaker_decoder"]


def _levels(n: int) -> int:
    return (n - 1).bit_length()  # ceil(log2 n), exact in integers; 0 for n = 1


def tree_nodes(n: int) -> np.ndarray:
    """The kept nodes of the binary tree over ``n`` steps, in release order.

    Returns an integer array of shape ``(m, 5)`` with columns ``level h, index t, start, stop,
    release``: node ``(h, t)`` covers real steps ``start .. stop - 1`` and is released at step
    ``release = stop - 1``. Sorted by ``(release, level)``.
    """
    n = _v.positive_int("n", n)
    check_allocation(2 * n, 5, "the binary tree's node table", copies=3)
    L = _levels(n)
    rows = []
    for h in range(L + 1):
        count = -(-n // (1 << h))  # nodes with t 2^h < n
        t = np.arange(count)
        start = t << h
        stop = np.minimum((t + 1) << h, n)
        rows.append(np.stack([np.full(count, h), t, start, stop, stop - 1], axis=1))
    nodes = np.concatenate(rows)
    order = np.lexsort((nodes[:, 0], nodes[:, 4]))
    return nodes[order]


def binary_tree_encoder(n: int) -> np.ndarray:
    """The dense ``m x n`` 0/1 tree encoder ``C``, rows in release order (see :func:`tree_nodes`)."""
    nodes = tree_nodes(n)
    C = np.zeros((nodes.shape[0], n))
    for r, (_, _, start, stop, _) in enumerate(nodes):
        C[r, start:stop] = 1.0
    return C


def online_honaker_decoder(n: int) -> np.ndarray:
    """The ``n x m`` online Honaker decoder with tree completion and zeroed virtual steps."""
    nodes = tree_nodes(n)
    L = _levels(n)
    m = nodes.shape[0]
    # position[h][t] = row of node (h, t) in C, or -1 for dropped all-virtual nodes
    position = [np.full(1 << (L - h), -1, dtype=np.int64) for h in range(L + 1)]
    for r, (h, t, *_rest) in enumerate(nodes):
        position[h][t] = r

    def est(h: int, t: int) -> np.ndarray:
        out = np.zeros(m)
        w = 2.0 ** -np.arange(h + 1)
        w /= w.sum()
        for j in range(h + 1):
            pos = position[h - j][t << j : (t + 1) << j]
            out[pos[pos >= 0]] += w[j]
        return out

    B = np.zeros((n, m))
    for i in range(1, n + 1):
        # i = i' + 2^h with h the lowest set bit: the blocks of i are those of i' plus [i', i)
        h = (i & -i).bit_length() - 1
        rest = i - (1 << h)
        B[i - 1] = est(h, rest >> h)
        if rest:
            B[i - 1] += B[rest - 1]
    if n != 1 << L:  # tree completion: last prefix sum from the root of the completed tree
        B[n - 1] = est(L, 0)
    return B


def _fixed_epoch_tree_gram(n: int, k: int, b: int) -> float:
    """``max_S 1^T X_S 1`` for the 0/1 tree encoder over windows ``S = {s, s + b, ..., s + (k-1) b}
    ∩ [0, n)``, with ``X[a, c] = L + 1 - bitlen(a XOR c)`` (exact integers).

    All residue classes at once: member ``j`` of class ``r`` is ``r + j b`` (a ``b x M`` table,
    ``M = ceil(n / b)``; members past ``n`` count 0, which is the value of the shorter window they
    leave, itself a valid pattern). Window sums by offset ``d``: ``2 sum_j X[x_j, x_{j+d}]`` over the
    window, from a cumulative sum. Windows starting after ``M - k`` are sub-windows (dominated,
    ``X >= 0``). O(n k) time, O(n) memory."""
    check_allocation(1, n, "the tree's fixed-epoch sensitivity", copies=6)
    L = _levels(n)
    rows = min(b, n)
    M = -(-n // b)
    kk = min(k, M)
    x = np.arange(rows, dtype=np.int64)[:, None] + b * np.arange(M, dtype=np.int64)[None, :]
    valid = x < n
    starts = M - kk + 1
    j0 = np.arange(starts)
    diag = np.concatenate((np.zeros((rows, 1), np.int64), np.cumsum(valid * (L + 1), axis=1)), axis=1)
    total = diag[:, j0 + kk] - diag[:, j0]
    for d in range(1, kk):
        w = ((L + 1) - _bit_length(x[:, :-d] ^ x[:, d:])) * (valid[:, :-d] & valid[:, d:])
        csum = np.concatenate((np.zeros((rows, 1), np.int64), np.cumsum(w, axis=1)), axis=1)
        total += 2 * (csum[:, j0 + kk - d] - csum[:, j0])  # pairs (j, j + d), j0 <= j <= j0 + kk - 1 - d
    return float(total.max())


def _bit_length(v: np.ndarray) -> np.ndarray:
    """Elementwise ``int.bit_length`` of non-negative int64 (exact: no floating-point log)."""
    out = np.zeros(v.shape, dtype=np.int64)
    v = v.copy()
    while np.any(v):
        nz = v > 0
        out += nz
        v >>= 1
    return out


@dataclass(frozen=True)
class BinaryTree(ErrorMethods):
    """The binary-tree encoder over ``n`` steps (any ``n >= 1``; virtual steps complete the tree).

    Structured representation: the node list (:meth:`nodes`); dense matrices on request.
    The encoder is ``scale`` times the 0/1 node-indicator matrix (``scale = 1`` as built;
    :meth:`normalized` divides it by the sensitivity). Shares the method set of every strategy
    (:mod:`dpmf.strategies.api`; the workload errors use the optimal decoder ``A C^+``); the
    streaming noise is the online Honaker decoder's (:class:`~dpmf.strategies.streaming.TreeNoise`,
    ``O(log n)`` stored estimates).
    """

    n: int
    scale: float = 1.0

    name = "binary_tree"

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _v.positive_int("n", self.n))
        object.__setattr__(self, "scale", _v.positive("scale", self.scale))

    @property
    def levels(self) -> int:
        """``L = ceil(log2 n)``: the completed tree has ``2^L`` leaves and ``L + 1`` levels."""
        return _levels(self.n)

    @property
    def num_rows(self) -> int:
        """Number of kept nodes ``m`` (rows of the encoder); ``2n - 1`` when ``n`` is a power of 2."""
        return sum(-(-self.n // (1 << h)) for h in range(self.levels + 1))

    def describe(self) -> dict:
        d = {"name": self.name, "n": self.n, "levels": self.levels, "rows": self.num_rows}
        if self.scale != 1.0:
            d["scale"] = self.scale
        return d

    def nodes(self) -> np.ndarray:
        """``(m, 5)`` int array ``level, index, start, stop, release`` in release order."""
        return tree_nodes(self.n)

    def encoder(self) -> np.ndarray:
        """The dense ``m x n`` encoder: ``scale`` times the 0/1 node indicators (release order)."""
        check_allocation(2 * self.n, self.n, "the binary tree's dense encoder")
        C = binary_tree_encoder(self.n)
        return C * self.scale if self.scale != 1.0 else C

    def online_decoder(self) -> np.ndarray:
        """The dense ``n x m`` online Honaker decoder (prefix-sum workload only)."""
        check_allocation(self.n, 2 * self.n, "the binary tree's dense decoder", copies=2)
        B = online_honaker_decoder(self.n)
        return B / self.scale if self.scale != 1.0 else B

    def optimal_decoder(self, workload: object | None = None) -> np.ndarray:
        """``A C^+`` for the workload ``A`` (default: the ``n x n`` prefix sum)."""
        return _optimal_decoder(self.encoder(), 1, workload)

    def column_norms(self) -> np.ndarray:
        """L2 norms of the columns of ``C``: sqrt(number of kept nodes containing each step)."""
        counts = np.zeros(self.n)
        for _, _, start, stop, _ in self.nodes():
            counts[start:stop] += 1.0
        return self.scale * np.sqrt(counts)

    def sensitivity(self, participation) -> float:
        """Sound L2 sensitivity of the tree's release under ``participation``.

        ``C >= 0``, so ``X = C^T C >= 0`` and the worst case aligns every contribution: the squared
        sensitivity is ``max_S 1^T X_S 1`` over the allowed participation patterns ``S`` (Eq. 3 of
        the multi-epoch paper, exact). For the tree, ``X[a, c]`` is the number of nodes holding both
        steps: ``L + 1 - bitlen(a XOR c)`` (they share the node at level ``h`` iff
        ``a >> h == c >> h``), so two schemas need no matrix at all:

        * every step (``Participation(n, 1)``, Poisson sampling): ``sum over nodes of size^2``,
          O(n) time and memory;
        * fixed epoch order (``FixedEpochParticipation(k, b)``): every window of ``k`` consecutive
          steps ``s, s + b, ...``, summed by offsets, O(n k) time, O(n) memory.

        Other schemas use the dense encoder (``(2n - 1) x n``) and the general dispatcher of
        :func:`~dpmf.strategies.sensitivity.sensitivity_squared`.
        """
        from dpmf.strategies.sensitivity import FixedEpochParticipation, rounding_margin, sensitivity_squared

        n, k = self.n, int(participation.max_participations)
        if isinstance(participation, FixedEpochParticipation):
            value = _fixed_epoch_tree_gram(n, min(k, -(-n // participation.separation)), participation.separation)
        elif participation.min_sep == 1 and k >= n:
            sizes = self.nodes()
            value = float(np.sum((sizes[:, 3] - sizes[:, 2]).astype(np.float64) ** 2))
        else:
            return sensitivity_squared(self.encoder(), participation).sensitivity
        # the sums are exact integers: the margin covers only the final products and the root
        return float(np.sqrt(rounding_margin(self.scale**2 * value, self.num_rows, 1)))

    def prefix_sum_rmse(self, decoder: Literal["online", "optimal"] = "online") -> float:
        """RMSE over the ``n`` prefix sums per unit noise multiplier, ``||B||_F / sqrt(n)``, for
        ``C`` as given (not normalized to a participation schema)."""
        if decoder == "online":
            B = self.online_decoder()
        elif decoder == "optimal":
            B = self.optimal_decoder()
        else:
            raise InvalidParameterError(f"decoder must be 'online' or 'optimal', got {decoder!r}")
        return float(np.linalg.norm(B) / math.sqrt(self.n))

    def normalized(self, participation) -> "BinaryTree":
        """The tree with ``scale / sens``: sensitivity <= 1 under ``participation`` (= 1 when the
        sensitivity is exact, as it is for fixed-epoch participation)."""
        sens = self.sensitivity(participation)
        if not sens > 0:
            raise InvalidParameterError("C has zero sensitivity; it cannot be normalized")
        return BinaryTree(self.n, self.scale / sens)

    def _decoder_for(self, workload: object) -> np.ndarray:
        return self.optimal_decoder(workload)

    def noising_matrix(self) -> np.ndarray:
        """``L = A^{-1} B_hon`` (``n x m``): row ``t`` is the first difference of the online Honaker
        decoder's rows ``t`` and ``t - 1``; ``L C = I``. This is what training adds, ``L z``."""
        return np.diff(self.online_decoder(), axis=0, prepend=0.0)

    def _streaming_noise(self, dim: int, rng: object, noise_multiplier: float, dtype: object):
        # streaming_noise (NoiseMethod): (L z)_t of the online Honaker decoder (TreeNoise)
        from dpmf.strategies.streaming import TreeNoise

        return TreeNoise(self.n, dim, noise_multiplier=noise_multiplier, rng=rng, dtype=dtype, scale=self.scale)
