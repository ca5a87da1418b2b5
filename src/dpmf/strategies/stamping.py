"""Stamping: repeat an ``n'``-step encoder ``s`` times block-diagonally, and its two decoders.

Choquette-Choo et al., *Multi-Epoch Matrix Factorization Mechanisms for Private ML* (ICML 2023),
Sec. 5.1 and App. D.4 (digest ``notes/multi-epoch-mf.md`` Sec. 4.5):

* **stamp**: ``C_big = I_s (x) C``, an ``(s m) x (s n')`` encoder covering ``n = s n'`` steps
  (block ``i`` acts on steps ``i n' .. (i+1) n' - 1``, 0-based). "Restarting" a mechanism every
  ``n'`` steps is this encoder. Its sensitivity must be computed on the whole block-diagonal
  matrix under the training participation schema, not by composing the blocks.
* **restart decoder** (prefix-sum-like workloads): block ``(i, i)`` is the block decoder ``B``
  (``n' x m``) and every block ``(i, j < i)`` repeats ``B``'s last row: the outputs of completed
  blocks are frozen and added to the running prefix sum. If ``B C = A_{n'}`` (the ``n'``-step
  prefix sum) then ``restart(B) @ (I_s (x) C) = A_n``. The paper uses it for the stamped tree
  (online Honaker) and FFT mechanisms of Table 1.
* **optimal decoder**: ``A (I_s (x) C)^+ = A (I_s (x) C^+)`` for any workload ``A`` (Denisov et al.
  2022, Sec. 3): the minimum-Frobenius-norm decoder of the stamped encoder (Table 1's "Optimal
  Decoder Honaker" and "FFT Optimal Decoder"). For a full-column-rank block ``C``,
  ``C^+ = (C^T C)^{-1} C^T``; a rank-deficient block cannot reproduce every workload and raises.

Privacy depends only on the encoder; the decoder choice only changes the error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg as _sl

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError

__all__ = ["stamp", "restart_decoder", "pseudo_inverse", "optimal_decoder", "StampedEncoder"]


def _matrix(name: str, value: object) -> np.ndarray:
    return _v.finite_array(name, value, ndim=2)


def stamp(encoder: object, copies: int) -> np.ndarray:
    """The dense block-diagonal ``I_copies (x) encoder``."""
    C = _matrix("encoder", encoder)
    s = _v.positive_int("copies", copies)
    return np.kron(np.eye(s), C)


def restart_decoder(decoder: object, copies: int) -> np.ndarray:
    """The ``(s n') x (s m)`` restart decoder built from an ``n' x m`` block decoder.

    Valid for prefix-sum-like workloads: requires ``decoder @ C`` to be the ``n'``-step prefix sum
    for the block encoder ``C`` (the caller's promise; then the result decodes ``I_s (x) C`` to the
    ``s n'``-step prefix sum).
    """
    B = _matrix("decoder", decoder)
    s = _v.positive_int("copies", copies)
    n, m = B.shape
    out = np.zeros((n * s, m * s))
    for i in range(s):
        out[i * n : (i + 1) * n, i * m : (i + 1) * m] = B
        if i:
            out[i * n : (i + 1) * n, : i * m] = np.tile(B[-1], i)
    return out


def pseudo_inverse(encoder: object) -> np.ndarray:
    """``C^+ = (C^T C)^{-1} C^T`` for an encoder with full column rank (Cholesky of the Gram).

    Raises :class:`InvalidParameterError` if ``C^T C`` is not numerically positive definite.
    """
    C = _matrix("encoder", encoder)
    if C.shape[0] < C.shape[1]:
        raise InvalidParameterError(
            f"encoder must have at least as many rows as columns (full column rank), got {C.shape}"
        )
    try:
        factor = _sl.cho_factor(C.T @ C, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        raise InvalidParameterError(
            "encoder must have full column rank (C^T C is not positive definite)"
        ) from None
    return _sl.cho_solve(factor, C.T, check_finite=False)


def _prefix_sum_times_block_diag(P: np.ndarray, s: int) -> np.ndarray:
    # A (I_s (x) P) for the prefix-sum A: column block j is 0 above block j, the running sums of P
    # inside it, and P's column sums below it.
    n1, m = P.shape
    cum = np.cumsum(P, axis=0)
    out = np.zeros((n1 * s, m * s))
    for j in range(s):
        out[j * n1 : (j + 1) * n1, j * m : (j + 1) * m] = cum
        out[(j + 1) * n1 :, j * m : (j + 1) * m] = cum[-1]
    return out


def optimal_decoder(
    encoder: object,
    copies: int = 1,
    workload: object | None = None,
    *,
    block_pseudo_inverse: object | None = None,
) -> np.ndarray:
    """``A (I_s (x) C)^+`` for the block encoder ``C`` (``m x n'``) stamped ``s = copies`` times.

    ``workload`` is the dense ``(s n') x (s n')`` matrix ``A`` (default: the prefix sum, computed
    without materializing ``A``). ``block_pseudo_inverse`` may supply ``C^+`` (``n' x m``) when a
    structured method knows it (e.g. the FFT mechanism); otherwise it is computed with
    :func:`pseudo_inverse`.
    """
    C = _matrix("encoder", encoder)
    s = _v.positive_int("copies", copies)
    m, n1 = C.shape
    if block_pseudo_inverse is None:
        P = pseudo_inverse(C)
    else:
        P = _matrix("block_pseudo_inverse", block_pseudo_inverse)
        if P.shape != (n1, m):
            raise InvalidParameterError(
                f"block_pseudo_inverse must have shape {(n1, m)} (transpose of the encoder's), "
                f"got {P.shape}"
            )
    if workload is None:
        return _prefix_sum_times_block_diag(P, s)
    A = _matrix("workload", workload)
    if A.shape != (n1 * s, n1 * s):
        raise InvalidParameterError(
            f"workload must have shape {(n1 * s, n1 * s)} (copies * encoder columns), got {A.shape}"
        )
    return np.concatenate([A[:, j * n1 : (j + 1) * n1] @ P for j in range(s)], axis=1)


@dataclass(frozen=True, eq=False)
class StampedEncoder:
    """``I_copies (x) block``: structured as the block and the number of copies.

    ``n = copies * block.shape[1]`` steps, ``copies * block.shape[0]`` rows. Held as given (not
    normalized); compute its sensitivity on :meth:`encoder` under the training schema.
    Instances compare by identity (they hold an array).
    """

    block: np.ndarray
    copies: int

    name = "stamped"

    def __post_init__(self) -> None:
        block = _matrix("block", self.block).copy()
        block.setflags(write=False)
        object.__setattr__(self, "block", block)
        object.__setattr__(self, "copies", _v.positive_int("copies", self.copies))

    @property
    def n(self) -> int:
        return self.copies * self.block.shape[1]

    def describe(self) -> dict:
        """``name``, ``n``, ``copies``, ``block_shape``, ``sha256`` (content hash of the block) and,
        for a small block, the ``block`` itself (see :meth:`DenseStrategy.describe
        <dpmf.strategies.dense.DenseStrategy.describe>` for the hash and the ``.npz`` lookup)."""
        from dpmf.strategies.matrix_identity import inline_matrix, matrix_sha256

        d = {
            "name": self.name,
            "n": self.n,
            "copies": self.copies,
            "block_shape": [int(k) for k in self.block.shape],
            "sha256": matrix_sha256(self.block),
        }
        if inline_matrix(self.block):
            d["block"] = self.block.tolist()
        return d

    def encoder(self) -> np.ndarray:
        """The dense block-diagonal encoder."""
        return stamp(self.block, self.copies)

    def restart_decoder(self, block_decoder: object) -> np.ndarray:
        """The restart decoder from a block decoder with ``block_decoder @ block = prefix sum``."""
        B = _matrix("block_decoder", block_decoder)
        if B.shape != (self.block.shape[1], self.block.shape[0]):
            raise InvalidParameterError(
                f"block_decoder must have shape {(self.block.shape[1], self.block.shape[0])}, "
                f"got {B.shape}"
            )
        return restart_decoder(B, self.copies)

    def optimal_decoder(self, workload: object | None = None) -> np.ndarray:
        """``A (I_s (x) C)^+`` (default ``A``: the ``n``-step prefix sum)."""
        return optimal_decoder(self.block, self.copies, workload)
