"""Bounded in-process memos for results that their inputs determine.

An accountant evaluated many times during one calibration (or a plan's rows and their reports)
often recomputes pieces that do not depend on the noise: the Gram matrices' surrogate fits, the
reductions of a strategy, one composition probed twice. :class:`BoundedMemo` keeps the last
``size`` of them, keyed by what determines them -- never by object identity -- so a hit returns
what the computation would have returned, bit for bit. :func:`array_key` turns arrays into such a
key (shape, dtype and a digest of the bytes).
"""

from __future__ import annotations

import copy
import hashlib
from typing import Callable, Hashable, TypeVar

import numpy as np

__all__ = ["BoundedMemo", "array_key"]

T = TypeVar("T")


class BoundedMemo:
    """At most ``size`` results by key, the oldest dropped first.

    ``get(key, compute)`` returns the stored result for ``key`` or stores ``compute()``;
    ``copy_out=True`` hands out a deep copy (for results the caller may change: dicts of numbers).
    Keys must hold every input that changes the result (numbers as floats/ints, arrays through
    :func:`array_key`)."""

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self._items: dict = {}

    def get(self, key: Hashable, compute: Callable[[], T], *, copy_out: bool = False) -> T:
        if key not in self._items:
            if len(self._items) >= self.size:
                self._items.pop(next(iter(self._items)))
            self._items[key] = compute()
        found = self._items[key]
        return copy.deepcopy(found) if copy_out else found

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


def array_key(*arrays) -> tuple:
    """A hashable key equal for equal arrays (same shape, dtype and bytes): ``(shape, dtype,
    blake2b digest)`` per array (C order)."""
    out = []
    for a in arrays:
        a = np.ascontiguousarray(a)
        out.append((a.shape, a.dtype.str, hashlib.blake2b(a.tobytes(), digest_size=20).hexdigest()))
    return tuple(out)
