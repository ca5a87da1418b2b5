"""Quadrature for the allocation surrogates (:mod:`.markov_fit`, :mod:`.moving_average`): node
placement and convex-order spreading of a standard normal and of a lognormal onto given points.

A *spread* of a law onto increasing points moves each cell's mass to the cell's two ends keeping its
mean (the mass outside the points as each function says): a mean-preserving spread, so it dominates
the law in convex order, and the surrogates' call/put programs (expectations of convex functions)
only grow when it replaces the law. Weights are computed in 40-digit arithmetic (``mpmath``) on the
float points and rounded to float64. Design note: ``docs/notes/allocation-surrogates.md``.

The 40 digits are those of a context of this module's own, one per thread (:func:`_context`), never
``mpmath.mp``'s: ``mp.workdps`` sets the one global context's precision, so two threads spreading at
once (the ring tables' mixing nodes run on threads, :func:`dpmf.resources.on_threads`, and the first
table of a process fills these caches from both) restored each other's precision, and one thread's
weights came out of 53-bit arithmetic -- not the 40 digits the roundings assume (seen as tables that
differed by ~1e-16 between the first call of a process and the next).
"""

from __future__ import annotations

import math
import threading
from functools import lru_cache

import numpy as np

__all__ = ["points", "spread", "spread_on", "mp_spread"]


def points(half: float, cells: int, stretch: float) -> np.ndarray:
    """``cells + 1`` increasing points on ``[-L, L]``, denser at 0: ``L sinh(a t) / sinh(a)``, ``t``
    uniform on ``[-1, 1]`` (``a = stretch``; any points give a valid spread, they only set its error)."""
    t = np.linspace(-1.0, 1.0, cells + 1)
    return half * np.sinh(stretch * t) / math.sinh(stretch) if stretch > 0 else half * t


#: Digits of the spreads' arithmetic.
_DIGITS = 40
_LOCAL = threading.local()


def _context():
    """This thread's own ``mpmath`` context at :data:`_DIGITS` digits (made on first use): nothing
    another thread or the caller does to ``mpmath.mp`` changes its precision."""
    ctx = getattr(_LOCAL, "ctx", None)
    if ctx is None:
        import mpmath

        ctx = mpmath.MPContext()
        ctx.dps = _DIGITS
        _LOCAL.ctx = ctx
    return ctx


@lru_cache(maxsize=8)
def spread(half: float, cells: int, stretch: float = 0.0, center: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Points (:func:`points`, shifted by ``center``) and weights of the standard normal spread onto
    them (each cell's mass at its ends, mean kept; the mass below the first point at it; the mass
    above the last point left out: charged), computed in 40-digit arithmetic on the float points
    and rounded to float64."""
    return spread_on(tuple(float(x) for x in points(half, cells, stretch) + center))


@lru_cache(maxsize=64)
def spread_on(points: tuple) -> tuple[np.ndarray, np.ndarray]:
    """:func:`spread` onto the given increasing points."""
    mp = _context()
    pts = np.asarray(points, dtype=np.float64)
    cells = pts.size - 1
    xs = [mp.mpf(float(x)) for x in pts]
    cdf = [mp.ncdf(x) for x in xs]
    pdf = [mp.npdf(x) for x in xs]
    w = [mp.mpf(0)] * (cells + 1)
    w[0] = cdf[0]
    for k in range(cells):
        p = cdf[k + 1] - cdf[k]
        right = (pdf[k] - pdf[k + 1] - xs[k] * p) / (xs[k + 1] - xs[k])  # E[xi - x_k; cell] / width
        w[k] += p - right
        w[k + 1] += right
    return pts.copy(), np.array([float(x) for x in w])


def mp_spread(points_log, scale: float):
    """:func:`_mp_spread_cached` on a hashable copy of the points (the shared factor's tables reuse
    the same points and scales at every node)."""
    return _mp_spread_cached(tuple(float(x) for x in points_log), float(scale)).copy()


@lru_cache(maxsize=64)
def _mp_spread_cached(points_log: tuple, scale: float):
    """Weights of the spread of ``e^{scale xi}`` (``xi ~ N(0, 1)``) onto ``e^{scale x_k}`` for the
    increasing points ``x_k``: each cell's mass to its ends with ``E[e^{scale xi}; cell]`` kept, the
    mass above the last point at the last point; the mass below the first point is *not* included
    (the caller charges it). 40-digit arithmetic, rounded to float64."""
    mp = _context()
    k = mp.mpf(scale)
    xs = [mp.mpf(float(x)) for x in points_log]
    cdf = [mp.ncdf(x) for x in xs]
    cdf_k = [mp.ncdf(x - k) for x in xs]
    eta = [mp.exp(k * x) for x in xs]
    ek = mp.exp(k * k / 2)
    w = [mp.mpf(0)] * len(xs)
    for j in range(len(xs) - 1):
        p = cdf[j + 1] - cdf[j]
        mean = ek * (cdf_k[j + 1] - cdf_k[j])
        right = (mean - eta[j] * p) / (eta[j + 1] - eta[j])
        w[j] += p - right
        w[j + 1] += right
    w[-1] += 1 - cdf[-1]
    return np.array([float(x) for x in w])
