"""How a dense matrix is identified in a strategy description: its SHA-256 and whether it is inline.

The strategies that hold a dense matrix (:class:`~dpmf.strategies.DenseStrategy`, the stamped
encoder) describe it by these two functions; :mod:`dpmf.strategies.serialization` reads such
descriptions back. Kept apart so that the strategy classes do not import the reader (which
imports them): the import graph stays one-way.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["INLINE_MAX_N", "matrix_sha256", "inline_matrix"]

#: Dense matrices with at most this many columns (and twice as many rows) are written inline.
INLINE_MAX_N = 64


def matrix_sha256(matrix: object) -> str:
    """Hex SHA-256 of ``matrix`` as float64 in C order (the bytes only: shapes are checked apart).

    >>> matrix_sha256([[1.0, 0.0], [1.0, 1.0]]) == matrix_sha256(np.tri(2, dtype=np.float32))
    True
    """
    arr = np.ascontiguousarray(matrix, dtype=np.float64)
    return hashlib.sha256(arr.tobytes()).hexdigest()


def inline_matrix(matrix: np.ndarray) -> bool:
    """Whether ``describe()`` writes ``matrix`` inline (small enough for a JSON report)."""
    rows, cols = matrix.shape
    return cols <= INLINE_MAX_N and rows <= 2 * INLINE_MAX_N
