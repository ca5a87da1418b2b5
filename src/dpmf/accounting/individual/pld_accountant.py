"""Approximate per-example (epsilon, delta) accounting for DP-SGD from per-example PLDs.

Koskela, Tobaben & Honkela, Sec. 5 and App. D (``notes/individual-accounting.md`` §4.6-4.8).
In DP-SGD with Poisson sampling ``q``, clip norm ``C`` and noise multiplier ``sigma``, example
``x`` at step ``t`` with clipped gradient norm ``c_{x,t}`` is a Poisson-subsampled Gaussian with
noise ratio ``sigma_{x,t} = sigma C / c_{x,t} >= sigma`` (a zero gradient costs nothing). Its
privacy over a run is the heterogeneous composition of those steps.

Bucketing (App. D). Noise ratios are rounded **down** to a geometric grid starting at ``sigma``
(less noise: a valid upper bound by data processing); ratios beyond the grid go to its last point.
Each bucket's one-step PLD (both directions, pessimistic, from dp_accounting) is Fourier
transformed once; an example's composition is the product of the transforms raised to its bucket
counts and one inverse FFT: ``O(n log n)`` per example instead of ``T`` convolutions.

Aliasing. The FFT length ``n`` is fixed; the composed loss support is placed on a window
``[top - n Delta, top]``. ``top`` comes from a Chernoff bound with the examples' own RDP
(``Pr[L > t] <= exp((alpha - 1)(D_alpha - t))``), so the mass above the window is at most
``1e-15`` and is added to delta; mass below the window wraps to its top, which can only raise
delta. Negative round-off entries are clipped and twice their mass added to the infinity mass.

Two outputs per example:

* ``epsilon_pld``: epsilon of the composed per-example PLD (worst direction). It is an upper bound
  for a *fixed* sequence of gradient norms (post-hoc accounting); FFT round-off is handled as in
  dp_accounting (estimated, not bounded), so reports say ``certified=False``.
* ``mu`` and ``epsilon_rdp``: the paper's route for adaptive use: the smallest ``mu`` whose
  ``mu``-GDP profile dominates the PLD's delta on an epsilon grid, then ``epsilon`` from the RDP
  curve ``alpha mu^2 / 2`` (Sec. 5, eq. 5.3). The domination is checked on the grid with a
  monotone sandwich (``delta_pld(e_j) <= delta_mu(e_{j+1}) + delta_floor``), which covers the
  grid's range up to an additive slack (the PLD's infinity mass plus 1e-12), which is charged
  to delta before the RDP conversion.
  The paper fits on eps in [0.01, 0.3] only; we check the whole range, so our mu is larger or equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpmf import validation as _v
from dpmf._lazy import LazyModule
from dpmf.errors import InvalidParameterError
from dpmf.privacy import dp_pld
from dpmf.privacy.gaussian_plds import subsampled_gaussian
from dpmf.privacy.gdp import gdp_delta_array
from dpmf.privacy.rdp import DEFAULT_ORDERS, rdp_to_epsilon, subsampled_gaussian_rdp

pld_pmf = LazyModule("dp_accounting.pld.pld_pmf")  # loaded on first use

_TAIL = 1e-15  # mass allowed above the window (added to delta)
_LOW_WINDOW = 40.0  # Pr[L < -t] <= exp(-t) under P: e^-40 below the window, wrapped pessimistically


@dataclass(frozen=True)
class IndividualPLDResult:
    """Per-example results (arrays of length N) of :class:`IndividualPLDAccountant`."""

    epsilon_pld: np.ndarray
    mu: np.ndarray
    epsilon_rdp: np.ndarray
    delta: float
    certified: bool = False


class IndividualPLDAccountant:
    """Bucketed FFT accountant for per-example DP-SGD privacy (module docstring).

    Parameters mirror the training run: ``sampling_prob`` (Poisson ``q``), ``noise_multiplier``
    (``sigma``), ``max_steps`` (to size the FFT). ``grid_size`` buckets span noise ratios from
    ``sigma`` to ``max_ratio * sigma`` geometrically; ``discretization`` is the loss grid.
    """

    def __init__(
        self,
        sampling_prob: float,
        noise_multiplier: float,
        max_steps: int,
        *,
        grid_size: int = 40,
        max_ratio: float = 50.0,
        discretization: float = 1e-3,
    ) -> None:
        self.q = _v.probability("sampling_prob", sampling_prob)
        self.sigma = _v.positive("noise_multiplier", noise_multiplier)
        self.max_steps = _v.positive_int("max_steps", max_steps)
        grid_size = _v.positive_int("grid_size", grid_size)
        max_ratio = _v.positive("max_ratio", max_ratio)
        if max_ratio <= 1 and grid_size > 1:
            raise InvalidParameterError(f"max_ratio must be > 1, got {max_ratio!r}")
        self.disc = _v.positive("discretization", discretization)
        self.grid = self.sigma * np.geomspace(1.0, max_ratio, grid_size)
        self.orders = DEFAULT_ORDERS
        self.bucket_rdp = np.stack([subsampled_gaussian_rdp(s, self.q, self.orders) for s in self.grid])
        plds = [subsampled_gaussian(s, self.q, discretization=self.disc) for s in self.grid]
        self._pmfs = {d: [p.pmf(d) for p in plds] for d in ("remove", "add")}
        self._lo = {d: np.array([int(round(l[0] / self.disc)) for l, _, _ in self._pmfs[d]]) for d in self._pmfs}
        self._inf = {d: np.array([inf for _, _, inf in self._pmfs[d]]) for d in self._pmfs}
        # FFT length: the worst window (every step in the least noisy bucket) plus the low margin
        top = self._top(np.eye(1, grid_size, 0)[0] * self.max_steps)
        width = max(p.size for _, p, _ in self._pmfs["remove"] + self._pmfs["add"])
        need = max(int(math.ceil((top + _LOW_WINDOW) / self.disc)), 2 * width)
        self.n = 1 << (need - 1).bit_length()
        self._fft = {
            d: np.stack([np.fft.rfft(np.pad(p, (0, self.n - p.size))) for _, p, _ in self._pmfs[d]])
            for d in self._pmfs
        }

    # ------------------------------------------------------------------ encoding
    def bucket_counts(self, clipped_norms, clip_norm: float) -> np.ndarray:
        """Counts per bucket for one example's clipped gradient norms over its steps.

        Noise ratio ``sigma C / c`` is rounded down to the grid (the last point collects
        everything larger); zero norms cost nothing and are not counted.
        """
        c = _v.positive("clip_norm", clip_norm)
        norms = np.asarray(clipped_norms, dtype=np.float64)
        if not np.all(np.isfinite(norms)) or np.any(norms < 0):
            raise InvalidParameterError("clipped_norms must be finite and >= 0")
        if norms.size > self.max_steps:
            raise InvalidParameterError(f"more steps ({norms.size}) than max_steps={self.max_steps}")
        norms = np.minimum(norms[norms > 0], c)
        ratio = self.sigma * c / norms
        # shrink by 1e-12 first so float error in sigma C / c never lands on a grid point above the
        # true ratio (that bucket would have more noise than the example got: optimistic)
        idx = np.searchsorted(self.grid, ratio * (1 - 1e-12), side="right") - 1
        idx = np.clip(idx, 0, self.grid.size - 1)
        return np.bincount(idx, minlength=self.grid.size)

    # ------------------------------------------------------------------ accounting
    def _top(self, counts: np.ndarray) -> float:
        rdp = counts @ self.bucket_rdp if counts.ndim == 1 else counts
        a = self.orders
        return float(np.min(rdp + math.log(1 / _TAIL) / (a - 1)))

    def pmf(self, counts, direction: str) -> pld_pmf.DensePLDPmf:
        """The composed (pessimistic up to FFT round-off) PMF of one example, one direction."""
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != self.grid.shape or np.any(counts < 0):
            raise InvalidParameterError(f"counts must be {self.grid.size} non-negative integers")
        if counts.sum() == 0:
            return pld_pmf.DensePLDPmf(self.disc, 0, np.ones(1), 0.0, True)
        nz = np.flatnonzero(counts)
        spec = np.ones(self.n // 2 + 1, dtype=np.complex128)
        for i in nz:
            spec *= self._fft[direction][i] ** int(counts[i])
        circ = np.fft.irfft(spec, n=self.n)
        shift = int(np.dot(counts, self._lo[direction]))  # composed index of circular position 0
        top_idx = int(math.ceil(self._top(counts) / self.disc))
        bottom = top_idx - self.n + 1
        window = np.roll(circ, -((bottom - shift) % self.n))
        neg = -window[window < 0].sum()
        window = np.maximum(window, 0.0)
        inf = -math.expm1(float(np.dot(counts, np.log1p(-self._inf[direction]))))
        return pld_pmf.DensePLDPmf(self.disc, bottom, window, inf + _TAIL + 2 * neg, True)

    def epsilon(self, counts, delta: float) -> float:
        """Per-example epsilon of the composed PLD, worst of both directions."""
        delta = _v.open_unit("delta", delta)
        return max(float(self.pmf(counts, d).get_epsilon_for_delta(delta)) for d in ("remove", "add"))

    def fit_mu(
        self,
        counts,
        *,
        eps_max: float = 20.0,
        points: int = 2000,
        delta_floor: float = 1e-12,
        eps_range: tuple[float, float] | None = None,
    ) -> tuple[float, float]:
        """``(mu, slack)``: the smallest mu (bisection) whose GDP profile dominates this example's
        PLD up to the additive ``slack``.

        ``slack`` is the PLD's infinity mass (truncation and round-off) plus ``delta_floor``.
        Checked on ``points`` epsilons in ``[0, eps_top]``, ``eps_top`` being where the PLD's delta
        falls to the slack, with the monotone sandwich of the module docstring. ``eps_range``
        restricts the check to an interval, as the paper's code does with ``(0.01, 0.3)``: the
        result then dominates only there (an approximation, not a bound elsewhere).
        """
        pmfs = [self.pmf(counts, d) for d in ("remove", "add")]
        slack = max(dp_pld.infinity_mass(p) for p in pmfs) + delta_floor
        e_top = max(float(p.get_epsilon_for_delta(min(2 * slack, 0.5))) for p in pmfs)
        e_top = min(max(e_top, 1e-3), eps_max)
        grid = np.linspace(0.0, e_top, points) if eps_range is None else np.linspace(*eps_range, points)
        d_pld = np.max([np.asarray(p.get_delta_for_epsilon(grid)) for p in pmfs], axis=0)
        if d_pld.max() <= slack:
            return 0.0, slack

        def dominates(mu: float) -> bool:
            return bool(np.all(d_pld[:-1] <= gdp_delta_array(mu, grid[1:]) + slack))

        hi = 1.0
        while not dominates(hi):
            hi *= 2
            if hi > 1e4:
                raise InvalidParameterError("no mu-GDP curve dominates this PLD")
        lo = 0.0
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if dominates(mid) else (mid, hi)
        return hi, slack

    def account(self, counts_matrix, delta: float) -> IndividualPLDResult:
        """All three quantities for each row of ``counts_matrix`` (examples x buckets)."""
        delta = _v.open_unit("delta", delta)
        counts_matrix = np.atleast_2d(np.asarray(counts_matrix, dtype=np.int64))
        eps_pld, mus, eps_rdp = [], [], []
        for counts in counts_matrix:
            eps_pld.append(self.epsilon(counts, delta))
            mu, slack = self.fit_mu(counts)
            if slack >= delta / 10:
                raise InvalidParameterError(f"delta={delta!r} is too small next to the PLD slack {slack:.3g}")
            mus.append(mu)
            a = self.orders
            # the GDP domination holds up to `slack`, charged to delta
            eps_rdp.append(rdp_to_epsilon(a, a * mu * mu / 2, delta - slack)[0] if mu > 0 else 0.0)
        return IndividualPLDResult(np.array(eps_pld), np.array(mus), np.array(eps_rdp), delta)

