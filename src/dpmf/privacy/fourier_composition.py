"""Composition of many dense PLD PMFs in one Fourier domain per stage (one direction at a time).

The PMF of ``X_1 + ... + X_K`` (independent privacy losses on one grid) is the convolution of the
parts' PMFs; with ``counts[i]`` copies of part ``i`` its discrete Fourier transform is
``prod_i F(p_i)^{k_i}``. :func:`compose_parts` transforms each part **once**, at the size of the
final result, raises it to its count and multiplies, then inverts once, instead of
dp_accounting's sequence of self-compositions and pairwise merges (each a forward and inverse
transform, each truncating its tails). When the parts are very unequal (MMCC's BandMF rows: 20
ramp-up rows next to one row composed 477 times) a few *stages* cost less: the small parts first,
in their own smaller domain, then their composite with the big ones (:func:`plan_stages`, a
dynamic program over the parts sorted by width on an ``L log L`` cost model). Real transforms
(``rfft``/``irfft``): the PMFs are real, so half the work of complex ones.

Soundness (pessimistic, the conventions of :mod:`dpmf.privacy.pld`):

* **Range.** A stage keeps the index window ``[lo, hi]`` of the sum given by Chernoff bounds
  (:func:`window`): ``Pr[S > hi] <= e^{K(t) - t hi} <= tail / 2`` for the sum's log-MGF ``K`` at
  ``t = j t_0`` (``j = 1..J``, ``t_0`` from the sum's variance), the same on the left, so the mass
  outside is ``<= tail``, and ``tail`` goes to ``+inf``. The transform length ``L >= hi - lo + 1``
  is cyclic: the mass outside the window folds back onto it, which only *adds* mass (every point
  carries its true mass plus folded mass; extra mass can only raise the hockey-stick divergence),
  exactly as in dp_accounting's ``self_compose`` (``ifft(fft(p, L)^k)`` with a Chernoff range).
  The log-MGFs are computed in one compiled pass per part (:func:`._pld_compiled.log_mgf_ladder`)
  and raised by their rounding allowances, so the window is never narrower than the exact bound.
* **Tails.** After the inverse transform the window's tails are truncated as dp_accounting's
  ``compose`` does (:func:`~dpmf.privacy.dense_convolution.truncate_tails`): a prefix of mass
  ``<= tail / 2`` moves *up* onto the first kept point, a suffix of mass ``<= tail / 2`` goes to
  ``+inf``. A stage thus moves at most ``2 tail`` (window and truncation) where the pairwise merges
  moved ``tail`` per merge (20+ merges on MMCC's BandMF rows): the result is tighter.
* **Floating point: NOT yet covered, so nothing in dpmf calls this module yet.** The transforms
  carry rounding noise of either sign (the ``k``-th power multiplies a spectrum's error by ``k``).
  Negative outputs are clipped to 0 (adds mass), but the noise can also *remove* mass from the
  upper tail. Measured against an FFT-free reference (direct convolution; three mixture PLDs at
  loss grid 0.01 composed 1 + 3 + 60 times): epsilon ``-1.3e-10`` relative at delta 1e-6,
  ``-5.6e-8`` at 1e-10 and ``-1.5e-5`` at 1e-12 (below the reference: optimistic), where
  dp_accounting's pairwise composition (``compose_many``) was above it at every delta (its 1e-15
  truncations per merge cover its own noise there). Before this engine replaces ``compose_many``
  it needs a rigorous allowance for the transform error moved to ``+inf`` (Higham's FFT bound,
  ``sum_i k_i c_L ||p_i^{*(k_i - 1)}||_2`` per point in 2-norm, times the square root of the
  points above epsilon; a first estimate puts it at ~6e-7 of epsilon for BandMF-16 x 500 at
  sigma 2, within the 1e-6 that issue 50 allows).
* **Mass at +inf**: ``1 - prod_i (1 - inf_i)^{k_i}`` rounded up, plus what the windows and
  truncations moved there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpmf.numerics import UNIT_ROUNDOFF

__all__ = ["Part", "compose_parts", "plan_stages", "window"]

#: Orders ``t = j t_0``, ``j = 1..LADDER``, of the Chernoff bounds (``t_0 = t* / LADDER_BELOW``,
#: ``t*`` the Gaussian optimum ``z / std``; so ``t`` runs from ``t* / 3`` to ``4 t*``; the windows of MMCC's rows
#: were the same to 0.3% with 24 orders from ``t* / 6``).
LADDER = 12
LADDER_BELOW = 3.0
#: A stage whose full support has at most this many points keeps all of it (no Chernoff window).
SMALL_SUPPORT = 1 << 14
#: Smallest positive normal float64 (an allowance per term for underflow in the log-MGF sums).
_TINY = 2.2250738585072014e-308


@dataclass
class Part:
    """``count`` copies of the PMF ``probs`` (finite masses, index ``0`` at grid index ``lower``)."""

    lower: int
    probs: np.ndarray
    count: int = 1

    def __post_init__(self) -> None:
        self.probs = np.ascontiguousarray(self.probs, dtype=np.float64)
        self._moments: tuple[float, float] | None = None

    @property
    def span(self) -> int:
        """Grid points of the full support of the ``count``-fold sum, less one."""
        return self.count * (self.probs.size - 1)

    def moments(self) -> tuple[float, float]:
        """``(mean, variance)`` of the ``count``-fold sum of the index law (relative indices; a
        planning estimate, not part of any bound)."""
        if self._moments is None:
            from dpmf.privacy._pld_compiled import index_moments

            mean, var = index_moments(self.probs)
            self._moments = (self.count * mean, self.count * var)
        return self._moments


def _log_tail_ratio(tail: float) -> float:
    return math.log(2.0 / tail)


def window(parts: list[Part], tail: float) -> tuple[int, int, bool]:
    """``(lo, hi, cut)``: relative indices (``0`` = every part at its lowest point) such that the sum
    lies outside ``[lo, hi]`` with probability ``<= tail`` (Chernoff, module docstring; ``cut`` says
    whether the window is narrower than the full support, i.e. whether ``tail`` must go to ``+inf``)."""
    full = sum(p.span for p in parts)
    if tail <= 0 or full + 1 <= SMALL_SUPPORT:
        return 0, full, False
    var = sum(p.moments()[1] for p in parts)
    if not var > 0:
        return 0, full, False
    log_ratio = _log_tail_ratio(tail)
    t0 = math.sqrt(2.0 * log_ratio / var) / LADDER_BELOW
    from dpmf.privacy._pld_compiled import log_mgf_ladder

    up = np.zeros(LADDER)
    down = np.zeros(LADDER)
    j = np.arange(1, LADDER + 1, dtype=np.float64)
    t = j * t0
    u = UNIT_ROUNDOFF
    for p in parts:
        n = p.probs.size
        # (each sum raised by n _TINY inside the kernel: every term that underflowed counts as _TINY)
        top, bottom = log_mgf_ladder(p.probs, t0, LADDER, n * _TINY)
        # rounding allowances (relative, of the sums): the exponent (j t0 (n - 1) at most, one
        # rounding) and the exp (1 ulp) of each base, j roundings of its powers, 1 of the product,
        # n of the running sum of non-negative terms
        rel = (2.0 * t * (n - 1) + 3.0 * j + n + 8.0) * u
        shift = t * (n - 1)
        up += p.count * (top + 1.01 * rel + shift * (1.0 + 4.0 * u))
        down += p.count * (bottom + 1.01 * rel)
    hi_bounds = (up + log_ratio) / t
    lo_bounds = -(down + log_ratio) / t
    hi = full
    lo = 0
    for h, l in zip(hi_bounds, lo_bounds):
        if math.isfinite(h):
            hi = min(hi, math.ceil(h * (1.0 + 8.0 * u)) + 1)
        if math.isfinite(l):
            lo = max(lo, math.floor(l - abs(l) * 8.0 * u) - 1)
    lo, hi = max(lo, 0), min(hi, full)
    if hi < lo:  # (cannot happen for a proper law; keep the full support rather than guess)
        return 0, full, False
    return lo, hi, (lo > 0 or hi < full)


def _transform(probs: np.ndarray, length: int) -> np.ndarray:
    """``rfft`` of ``probs`` folded cyclically onto ``length`` points (the cyclic convolution of
    folded inputs is the folded convolution)."""
    from scipy import fft

    if probs.size > length:
        padded = np.zeros(-(-probs.size // length) * length)
        padded[: probs.size] = probs
        probs = padded.reshape(-1, length).sum(axis=0)
    return fft.rfft(probs, length)


def compose_stage(parts: list[Part], tail: float) -> tuple[int, np.ndarray, float]:
    """``(lower grid index, masses, mass to +inf)`` of the sum of ``parts`` in one domain."""
    from scipy import fft

    from dpmf.privacy._pld_compiled import multiply_power, power
    from dpmf.privacy.dense_convolution import truncate_tails
    from dpmf.resources import check_allocation

    lo, hi, cut = window(parts, tail)
    width = hi - lo + 1
    length = fft.next_fast_len(width, real=True)
    check_allocation(1, length, f"composing privacy loss distributions (a grid of {width:,} points)", copies=4,
                     hint="use fewer steps or a larger noise multiplier")
    acc = None
    for p in parts:
        spectrum = _transform(p.probs, length)
        if acc is None:
            acc, spectrum = spectrum, None
            if p.count > 1:
                power(acc, int(p.count))
        else:
            multiply_power(acc, spectrum, int(p.count))
    full = fft.irfft(acc, length)
    del acc
    start = lo % length
    out = np.concatenate((full[start:], full[:start]))[:width] if start else full[:width]
    np.maximum(out, 0.0, out=out)
    offset, kept, right = truncate_tails(out, tail)
    lower = sum(p.count * p.lower for p in parts) + lo + offset
    return lower, kept, (tail if cut else 0.0) + right


def _estimated_width(var: float, full: int, tail: float, largest: int) -> float:
    """Planning estimate of a stage's grid (Gaussian window ``2 z std`` plus the widest input)."""
    if tail <= 0:
        return full + 1.0
    z = math.sqrt(2.0 * _log_tail_ratio(tail))
    return float(min(full + 1, 2.2 * z * math.sqrt(var) + largest))


def _cost(width: float, transforms: int) -> float:
    return transforms * width * math.log2(max(width, 2.0))


def plan_stages(parts: list[Part], tail: float) -> list[list[int]]:
    """Stages (lists of indices into ``parts``; each stage after the first also takes the previous
    stage's result) minimizing the estimated transform work: the parts sorted by estimated width, a
    stage composes a contiguous run of them (a dynamic program over the cut points)."""
    stats = []
    for i, p in enumerate(parts):
        _, var = p.moments()
        stats.append((_estimated_width(var, p.span, tail, p.probs.size), var, p.span, p.probs.size, i))
    stats.sort()
    m = len(stats)
    # prefix totals: the width of the sum of the first j parts
    widths = [0.0] * (m + 1)
    var = 0.0
    span = 0
    largest = 0
    for j, (_, v, s, n, _) in enumerate(stats, start=1):
        var, span, largest = var + v, span + s, max(largest, n)
        widths[j] = _estimated_width(var, span, tail, largest)
    best = [0.0] + [math.inf] * m
    cut = [0] * (m + 1)
    for j in range(1, m + 1):
        for i in range(j):
            transforms = (j - i) + (1 if i > 0 else 0) + 1
            c = best[i] + _cost(widths[j], transforms)
            if c < best[j]:
                best[j], cut[j] = c, i
    stages = []
    j = m
    while j > 0:
        i = cut[j]
        stages.append([stats[k][4] for k in range(i, j)])
        j = i
    return stages[::-1]


def compose_parts(parts: list[Part], tail: float) -> tuple[int, np.ndarray, float]:
    """``(lower grid index, masses, mass moved to +inf)`` of the sum of ``count`` copies of every
    part (module docstring). The parts' own masses at ``+inf`` are the caller's to combine."""
    parts = [p for p in parts if p.count > 0]
    if not parts:
        return 0, np.ones(1), 0.0
    if len(parts) == 1 and parts[0].count == 1:
        return parts[0].lower, np.asarray(parts[0].probs, dtype=np.float64), 0.0
    moved = 0.0
    previous: Part | None = None
    for stage in plan_stages(parts, tail):
        members = [parts[i] for i in stage] + ([previous] if previous is not None else [])
        lower, probs, right = compose_stage(members, tail)
        moved += right
        previous = Part(lower, probs, 1)
    return previous.lower, previous.probs, moved


def infinity_mass(masses: list[float], counts: list[int]) -> float:
    """``1 - prod_i (1 - m_i)^{k_i}`` rounded up (a few ulps above the float value)."""
    total = 0.0
    for m, k in zip(masses, counts):
        if m >= 1.0:
            return 1.0
        if m > 0:
            total += k * math.log1p(-m)
    if total == 0.0:
        return 0.0
    return min(1.0, -math.expm1(total) * (1.0 + 16.0 * UNIT_ROUNDOFF))
