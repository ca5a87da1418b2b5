"""The Markov surrogate's chain: :class:`MarkovSurrogate` (an ARMA(1,1) Gaussian chain in Gram units,
with its optional edges, shared factor or anchored ring) and the covariances it certifies.

Part of the Markov surrogate (:mod:`.markov_fit` has the argument and the fitting; design note
``docs/notes/allocation-surrogates.md``). Implements :class:`~dpmf.accounting.allocation.surrogates.protocol.Surrogate`;
its tables are :mod:`.markov_programs`'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dpmf.accounting.allocation.surrogates.markov_programs import (
    call_bound_table,
    factor_half_width,
    put_bound_table,
    ring_table,
)
from dpmf.numerics import UNIT_ROUNDOFF

__all__ = ["MAX_SLOTS", "MarkovSurrogate", "toeplitz", "added_covariance"]

#: Above this many slots per epoch the Markov members are skipped (cost: see the module docstring).
MAX_SLOTS = 256


@dataclass(frozen=True)
class MarkovSurrogate:
    """The chain of the module docstring in Gram units (``sigma = 1``): ``alpha, beta, rho, s`` and
    the slot order (``order[pos]`` is the slot at chain position ``pos``). Implements
    :class:`~dpmf.accounting.allocation.surrogates.protocol.Surrogate`."""

    #: (the chain's tables are serial kernels: callers run several on threads, :func:`~.markov_programs.on_threads`)
    parallel_tables: ClassVar[bool] = False

    alpha: float
    beta: float
    rho: float
    s: float
    order: str  # "natural" or "zigzag"
    proxy: float
    #: the shared factor on the ends of a cyclic Gram (:func:`~.markov_ring.fit_ring_surrogate`): ``(a, r, width)``
    #: in Gram units, loadings ``a r^j`` on the ``j``-th slot from either end (``j < width``)
    ring: tuple | None = None
    #: the anchored variant (:func:`~.markov_ring.fit_ring_surrogate`): loadings ``e_j`` (Gram units) of the chain's
    #: first state ``Z_0`` on the ``j``-th slot from the end (``anchor[j]``, ``j < len(anchor)``)
    anchor: tuple | None = None
    #: larger innovation loadings at the ends (Gram units): ``(start, end)``, ``beta_i = max(beta,
    #: start[j])`` at the ``j``-th position from the start and ``max(beta, end[j])`` at the ``j``-th from
    #: the end (:meth:`betas`; module docstring, *edges*)
    edges: tuple | None = None
    #: how it dominates the Gram: ``"entrywise"`` (Lemma K) or ``"psd"`` (Lemma P)
    domination: str = "entrywise"

    def betas(self, n: int) -> np.ndarray:
        """The innovation loadings ``beta_i`` at the ``n`` chain positions (Gram units)."""
        out = np.full(n, self.beta)
        if self.edges is not None:
            for k, e in enumerate(self.edges):
                e = np.asarray(e, dtype=np.float64)[:n]
                pos = np.arange(e.size) if k == 0 else n - 1 - np.arange(e.size)
                out[pos] = np.maximum(out[pos], e)
        return out

    def variances(self, n: int) -> np.ndarray:
        """Lower bounds on the float chain's variances ``alpha^2 + beta_i^2`` (Gram units; without a ring)."""
        b = self.betas(n)
        return (self.alpha * self.alpha + b * b) * (1 - 64 * UNIT_ROUNDOFF)

    def covariance(self, n: int) -> np.ndarray:
        """Lower bounds on the float chain's covariance over ``n`` positions (Gram units), without a
        ring: the stationary lags off the diagonal (a larger ``beta_i`` only adds ``alpha (beta_i -
        beta) s rho^{j-i-1} >= 0`` to ``Cov(Y'_i, Y'_j)``, ``j > i``) and ``alpha^2 + beta_i^2`` on it."""
        cov = toeplitz(self.lags(n), n)
        cov[np.diag_indices(n)] = self.variances(n)
        return cov

    def anchor_loadings(self, n: int) -> np.ndarray:
        """The loadings ``e_i`` of ``Z_0`` at the ``n`` chain positions (zeros off the end)."""
        out = np.zeros(n)
        if self.anchor is not None:
            e = np.asarray(self.anchor, dtype=np.float64)[:n]
            out[n - 1 - np.arange(e.size)] = e
        return out

    def start_covariances(self, n: int, lower: bool = True) -> np.ndarray:
        """``Cov(alpha Z_i + beta xi_{i+1}, Z_0) = alpha rho^i`` (Gram units; ``Z_0 ~ N(0, 1)``, the
        float ``rho`` is the one the programs run), rounded down (``lower``) or up."""
        d = np.arange(n, dtype=np.float64)
        f = (1 - 4 * UNIT_ROUNDOFF * (d + 4)) if lower else (1 + 4 * UNIT_ROUNDOFF * (d + 4))
        return self.alpha * self.rho ** d * f

    def loadings(self, n: int) -> np.ndarray:
        """The factor's loadings (Gram units, ``sigma = 1``) at the ``n`` chain positions (zeros
        without a ring factor): ``a r^j`` at distance ``j < width`` from the nearer end."""
        out = np.zeros(n)
        if self.ring is not None:
            a, r, width = self.ring
            j = np.minimum(np.arange(n), n - 1 - np.arange(n))
            out[j < width] = a * r ** j[j < width]
        return out

    def lags(self, count: int) -> np.ndarray:
        """Lower bounds on the float chain's covariances ``gamma_0 .. gamma_{count-1}`` (Gram units)."""
        a, b, r, s = self.alpha, self.beta, self.rho, self.s
        out = np.empty(count)
        out[0] = a * a + b * b
        g1 = a * a * r + a * b * s
        out[1:] = g1 * r ** np.arange(count - 1)
        return out * (1 - 64 * UNIT_ROUNDOFF)  # (Var Z_i >= 1: the float chain's lags are no smaller than these)

    def describe(self) -> str:
        g = self.lags(2)
        order = ", zig-zag order" if self.order == "zigzag" else ""
        if self.ring is not None:
            order += f", ring: shared factor on the {self.ring[2]} slots at each end"
        if self.anchor is not None:
            order += f", ring: the last {len(self.anchor)} slots anchored on its first state"
        if self.edges is not None:
            order += f", larger innovations on {len(self.edges[0])} + {len(self.edges[1])} end positions"
        if self.domination == "psd":
            order += ", PSD domination"
        return f"Markov surrogate (ARMA(1,1) rho {self.rho:.2g}, lag-1 corr. {g[1] / g[0]:.3g}{order})"

    def table(self, sigma: float, n: int, kind: str, k_max: float, delta: float, *, stop=None, **grid):
        """The call or put bound table of a sum of ``n`` slots (:class:`~.protocol.Surrogate`): with
        the shared factor or anchor if the chain has one (:func:`~.markov_programs.ring_table`, which
        honours ``stop``), else the plain chain's (:func:`~.markov_programs.call_bound_table`,
        :func:`~.markov_programs.put_bound_table`; one backward program, no partial bound: ``stop`` ignored)."""
        if self.ring is not None or self.anchor is not None:
            return ring_table(self, sigma, n, kind, k_max, w_half=factor_half_width(self, sigma, delta), stop=stop,
                              **grid)
        return (call_bound_table if kind == "call" else put_bound_table)(self, sigma, n, k_max, **grid)

def toeplitz(lags: np.ndarray, n: int) -> np.ndarray:
    return lags[np.abs(np.subtract.outer(np.arange(n), np.arange(n)))]
def added_covariance(sur: MarkovSurrogate, n: int) -> np.ndarray:
    """``Cov(Y') - chain`` of a ring surrogate over ``n`` slots (lower bounds, Gram units)."""
    if sur.anchor is not None:
        e = sur.anchor_loadings(n) * (1 - 8 * UNIT_ROUNDOFF)
        c = sur.start_covariances(n)
        return (np.outer(e, e) + np.outer(e, c) + np.outer(c, e)) * (1 - 4 * UNIT_ROUNDOFF)
    v = sur.loadings(n) * (1 - 8 * UNIT_ROUNDOFF)
    return np.outer(v, v) * (1 - 4 * UNIT_ROUNDOFF)
