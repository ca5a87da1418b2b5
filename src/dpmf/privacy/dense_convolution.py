"""Composition of dense PLD PMFs: dp_accounting's construction, vectorized.

``dp_accounting``'s ``DensePLDPmf.compose`` / ``self_compose`` are our composition engine; their
math is kept here step for step, with two costs removed (profile of an MMCC evaluation, binary
tree of 64 steps: 10 s of 45 s in the first, 12 s in the second):

* **tail truncation** (``_truncate_tails``, pessimistic): the longest prefix and suffix of the
  masses each summing to ``<= tail / 2`` are cut; the prefix's mass is added to the first kept
  point (moved *up* in loss), the suffix's goes to ``+inf``. dp_accounting finds the cut points
  with a Python loop over the array (seconds for the 1e6-1e7 point grids of wide compositions);
  here by ``np.cumsum``, which adds in the same sequential order, so the cut points are the same
  and the result of :func:`compose` is bit for bit dp_accounting's (tests);
* **the self-convolution's range** (Chernoff bounds on the ``k``-fold sum at dp_accounting's 40
  orders ``t = +-1..20 / len``): the log-MGFs ``log sum_i p_i e^{i t}`` in one compiled pass from
  the powers of two exponentials per point (``e^{+-i / len}``) instead of 40 calls of
  ``scipy.special.logsumexp`` (40 exponentials per point, 40 passes); each is raised by its rounding
  allowance, so the range can only be wider than dp_accounting's (by a point, rarely), never
  narrower;
* the self-convolution by **real** transforms, ``irfft(rfft(p)^k)`` with the power by repeated
  squaring (half the transform of dp_accounting's complex ``ifft(fft(p)^k)``, and ~log2(k) complex
  multiplies instead of ``k``-th powers by ``exp(k log z)``: 2.7x less time on the 1.3e7-point
  grids of MMCC BandMF-16 x 500). The numbers differ from dp_accounting's only by the FFT's
  rounding, whose noise floor (~1e-19 per point, of either sign) is the same for both; against a
  long-double transform neither is systematically closer (benchmarks/README.md, issue 50, evening);
* :func:`self_compose_convolve_dense`: ``p^{*k} * b`` in one spectrum (the self-convolution's
  range as above, then one product and one inverse transform), two transforms of the largest
  size fewer than self-composing and then composing (:func:`dpmf.privacy.pld.compose_many`'s last
  merge).

Soundness is dp_accounting's: the truncated prefix moves up, the suffix and (for the
self-convolution, whose range is cut by the Chernoff bound) ``tail`` go to ``+inf``.
"""

from __future__ import annotations

import math

import numpy as np

from dpmf.privacy import dp_pld

__all__ = ["compose_dense", "self_compose_convolve_dense", "self_compose_dense"]


def _prefix_to_truncate(c: np.ndarray, threshold: float) -> int:
    """The first index whose running sum ``c`` exceeds ``threshold`` (``len`` if none): the length of
    the longest prefix summing to ``<= threshold`` (dp_accounting's loop)."""
    over = np.flatnonzero(c > threshold)
    return int(over[0]) if over.size else int(c.size)


def truncate_tails(probs: np.ndarray, tail: float) -> tuple[int, np.ndarray, float]:
    """``(cut prefix length, kept masses, mass to +inf)``, pessimistic (module docstring). Writes into
    ``probs`` (a fresh convolution output)."""
    if tail == 0:
        return 0, probs, 0.0
    half = tail / 2
    # (a sequential running sum, as dp_accounting's loop; only the first few points can matter, so
    # the sums are formed over growing windows until one crosses the threshold)
    left = _first_crossing(probs, half)
    right = probs.size - _first_crossing(probs[::-1], half)
    right = max(right, left + 1)
    left_mass = np.sum(probs[:left])
    right_mass = np.sum(probs[right:])
    kept = probs[left:right]
    kept[0] += left_mass
    return left, kept, float(right_mass)


def _first_crossing(probs: np.ndarray, threshold: float) -> int:
    """:func:`_prefix_to_truncate` of ``probs``' running sum, looking at growing windows (a tail of a
    wide composition is short next to the array)."""
    n = probs.size
    width = 4096
    while True:
        w = min(n, width)
        idx = _prefix_to_truncate(np.cumsum(probs[:w]), threshold)
        if idx < w or w == n:
            return idx
        width *= 8


def compose_dense(a, b, tail: float):
    """dp_accounting's ``DensePLDPmf.compose`` (``a`` and ``b`` on one grid), bit for bit."""
    from scipy import signal

    la, pa, ia, disc = dp_pld.dense_arrays(a)
    lb, pb, ib, _ = dp_pld.dense_arrays(b)
    probs = signal.fftconvolve(pa, pb)
    inf = ia + ib - ia * ib
    offset, probs, right = truncate_tails(probs, tail)
    return dp_pld.make_dense(la + lb + offset, probs, inf + right, disc)


def self_convolve_bounds(probs: np.ndarray, count: int, tail: float) -> tuple[int, int]:
    """dp_accounting's ``compute_self_convolve_bounds``: ``(lo, hi)`` such that the ``count``-fold
    sum of the index law ``probs`` lies outside ``[lo, hi]`` with probability ``<= tail``
    (Chernoff at the orders ``t = +-1..20 / len``), vectorized."""
    n = probs.size
    upper, lower = (n - 1) * count, 0
    if tail == 0:
        return lower, upper
    orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / n
    from dpmf.privacy._pld_compiled import log_mgfs as _log_mgfs

    # log sum_i p_i e^{i j / n} for j = 1..20 and -1..-20 in one compiled pass (powers of one
    # exponential per side, scaled by the largest term); each raised by its rounding allowance,
    # 64 j ulps for the powers and n ulps for the running sum of n terms, so the range is never
    # narrower than the exact bounds give
    values = np.asarray(_log_mgfs(np.ascontiguousarray(probs, dtype=np.float64), 20))
    j = np.arange(1, 21)
    eps = np.finfo(float).eps
    slack = (64.0 * j + n) * eps
    log_mgfs = np.concatenate(((values[20:] + slack)[::-1], values[:20] + slack))  # (orders -20..-1, 1..20)
    log_two_over_tail = math.log(2 / tail)
    for t, lm in zip(orders, log_mgfs):
        bound = (count * lm + log_two_over_tail) / t
        if not math.isfinite(bound):
            continue
        if t > 0:
            upper = min(upper, math.ceil(bound))
        else:
            lower = max(lower, math.floor(bound))
    return lower, upper


def _spectrum_power(probs: np.ndarray, count: int, length: int) -> np.ndarray:
    """``rfft(probs, length) ** count`` by repeated squaring (in place; ``count >= 1``)."""
    from scipy import fft

    base = fft.rfft(probs, length)
    out = None
    while True:
        if count & 1:
            out = base.copy() if out is None else np.multiply(out, base, out=out)
        count >>= 1
        if not count:
            return out
        np.multiply(base, base, out=base)


def _circular_window(full: np.ndarray, start: int, length: int) -> np.ndarray:
    """``full[(start + i) mod len(full)]`` for ``i < length`` (``np.roll(full, -start)[:length]``
    without rolling the whole array; a view of ``full`` where the window does not wrap)."""
    n = full.size
    start %= n
    if start + length <= n:
        return full[start:start + length]  # (a view: ``full`` is a fresh transform output)
    first = min(length, n - start)
    out = np.empty(length, dtype=full.dtype)
    out[:first] = full[start:start + first]
    out[first:] = full[:length - first]
    return out


def self_compose_dense(a, count: int, tail: float):
    """dp_accounting's ``DensePLDPmf.self_compose`` by real transforms (module docstring): the
    ``count``-fold sum on its Chernoff range ``[lo, hi]``, computed circularly on at least
    ``hi - lo + 1`` points (the mass outside the range, ``<= tail``, lands inside by aliasing *and*
    is counted again at ``+inf``, so the result dominates the exact law)."""
    from scipy import fft

    low, probs, inf, disc = dp_pld.dense_arrays(a)
    probs = np.asarray(probs, dtype=np.float64)
    lo, hi = self_convolve_bounds(probs, count, tail)
    out_len = hi - lo + 1
    length = fft.next_fast_len(max(out_len, probs.size), real=True)
    full = fft.irfft(_spectrum_power(probs, count, length), length)
    out = _circular_window(full, lo, out_len)
    inf_prob = tail - math.expm1(count * math.log1p(-inf))
    return dp_pld.make_dense(low * count + lo, out, inf_prob, disc)


def self_compose_convolve_dense(a, count: int, b, tail: float):
    """``self_compose_dense(a, count, tail)`` composed with ``b`` (``compose_dense``), in one
    spectrum: the ``count``-fold sum's Chernoff window ``[lo, hi]`` convolved with ``b`` needs
    ``hi - lo + len(b)`` points, so the circular convolution on that many holds the window's
    convolution without overlap; the mass outside the window (``<= tail``) lands inside by aliasing and is
    counted again at ``+inf``, as in the self-composition; then the tails are truncated as
    :func:`compose_dense` does (pessimistic)."""
    from scipy import fft

    la, pa, ia, disc = dp_pld.dense_arrays(a)
    lb, pb, ib, _ = dp_pld.dense_arrays(b)
    pa = np.asarray(pa, dtype=np.float64)
    lo, hi = self_convolve_bounds(pa, count, tail)
    out_len = hi - lo + pb.size
    length = fft.next_fast_len(max(out_len, pa.size), real=True)
    spectrum = _spectrum_power(pa, count, length)
    np.multiply(spectrum, fft.rfft(np.asarray(pb, dtype=np.float64), length), out=spectrum)
    # (the sum index s + t of the window's entry i is lo + i, circularly)
    probs = _circular_window(fft.irfft(spectrum, length), lo, out_len)
    ia_k = tail - math.expm1(count * math.log1p(-ia))
    inf = ia_k + ib - ia_k * ib
    offset, probs, right = truncate_tails(probs, tail)
    return dp_pld.make_dense(la * count + lo + lb + offset, probs, inf + right, disc)
