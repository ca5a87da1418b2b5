"""Fixed-shape batches for truncated samplers: the real indices plus zero-weight padding.

Truncated schemes (:class:`~dpmf.sampling.PoissonSampling`, :class:`~dpmf.sampling.CyclicPoissonSampling`
and :class:`~dpmf.sampling.MinSepSampling` with ``max_batch_size``) yield the *real* example indices
of each step, at most ``max_batch_size`` of them. Pipelines that compile for one batch shape (Chua et
al. 2024, "Scalable DP-SGD: shuffling vs. Poisson subsampling"; Dong & Ganesh 2026 App. D) pad every
batch to exactly ``max_batch_size`` with examples of weight 0: a padded example's clipped gradient is
multiplied by 0, so the clipped sum, hence the released noisy sum and its privacy, is the same as
for the real indices alone. dpmf's torch loader trains on the real indices (no padding needed);
:func:`padded_batch` is for code that needs the fixed shape.

>>> import numpy as np
>>> idx, w = padded_batch(np.array([4, 7]), 4)
>>> idx.tolist(), w.tolist()
([4, 7, 0, 0], [1.0, 1.0, 0.0, 0.0])
"""

from __future__ import annotations

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError

__all__ = ["padded_batch"]


def padded_batch(batch, max_batch_size: int, pad_index: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(indices, weights)`` of length exactly ``max_batch_size``: the batch's indices with weight 1,
    then ``max_batch_size - len(batch)`` copies of ``pad_index`` with weight 0 (any valid index:
    its example is loaded for the shape and contributes nothing). A batch longer than
    ``max_batch_size`` is an error (the scheme truncates before yielding)."""
    size = _v.positive_int("max_batch_size", max_batch_size)
    idx = np.asarray(batch, dtype=np.int64).reshape(-1)
    if idx.size > size:
        raise InvalidParameterError(
            f"batch has {idx.size} examples, more than max_batch_size={size}; truncate it first (the "
            "scheme's max_batch_size does)"
        )
    if isinstance(pad_index, bool) or not isinstance(pad_index, (int, np.integer)) or int(pad_index) < 0:
        raise InvalidParameterError(f"pad_index must be an integer >= 0, got {pad_index!r}")
    indices = np.full(size, int(pad_index), dtype=np.int64)
    indices[: idx.size] = idx
    weights = np.zeros(size, dtype=np.float64)
    weights[: idx.size] = 1.0
    return indices, weights
