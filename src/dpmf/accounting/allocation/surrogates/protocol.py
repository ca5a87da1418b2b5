"""The declared interface of an allocation surrogate (:mod:`.markov_fit`, :mod:`.moving_average`).

A surrogate is a Gaussian model of one epoch's slot sums whose covariance dominates the mechanism's
Gram (entrywise, or in the PSD sense where its module says so), so that convex functions of its
likelihood ratio bound the exact pair's hockey-stick divergences. The accountants
(:func:`~dpmf.accounting.allocation.surrogates.markov_programs.markov_epsilon`, the fresh-slot compositions of
:mod:`.fresh_correlated`) read a surrogate only through this protocol. Design note:
``docs/notes/allocation-surrogates.md``.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

__all__ = ["Surrogate"]


class Surrogate(Protocol):
    """What an accountant may ask of a surrogate (Gram units: noise ``sigma = 1``)."""

    #: ``True`` when :meth:`table` runs parallel kernels itself (callers then compute tables in turn
    #: instead of on threads).
    parallel_tables: bool

    def describe(self) -> str:
        """One line for a report row (``"Markov surrogate (...)"``, ``"moving average (...)"``)."""
        ...

    def variances(self, n: int) -> np.ndarray:
        """Upper bounds on the ``n`` slots' variances (each ``>=`` its mean's squared norm)."""
        ...

    def table(self, sigma: float, n: int, kind: str, k_max: float, delta: float, **grid) -> tuple[np.ndarray, np.ndarray]:
        """The ``kind`` (``"call"`` or ``"put"``) bound table of a sum of ``n`` slots at noise
        ``sigma``: strikes ``0 .. k_max`` and upper bounds on ``E[(sum X - k)_+]`` (call) or
        ``E[(k - sum X)_+]`` (put) at them; ``grid`` keys a surrogate does not use are ignored. A
        ``stop = (strike, value)`` key lets it return ``None`` instead, once part of its work proves
        that the table's reading at ``strike`` (``calls_at`` / ``puts_at``) exceeds ``value`` (a
        surrogate that cannot prove it early ignores the key and returns the table)."""
        ...
