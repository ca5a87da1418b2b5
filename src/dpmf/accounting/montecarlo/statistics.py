"""Sufficient statistics of Monte Carlo privacy losses and the delta(epsilon) estimate from them.

Dong & Ganesh 2026 (``papers/001``), Sec. 2.5 / App. A: for a dominating pair (P, Q) the
hockey-stick divergence is

    delta(eps) = H_{e^eps}(P, Q) = E_{y~P}[ (1 - e^{eps - L(y)})_+ ],   L(y) = ln P(y)/Q(y),

so i.i.d. privacy losses ``L_1..L_s`` give the unbiased estimate ``mean_j (1 - e^{eps - L_j})_+``
(computed as ``-expm1(min(eps - L, 0))``, notes Sec. 8.2). The summand lies in ``[0, 1]``.

:class:`LossHistogram` stores the losses as **exact integer counts on a fine grid**, binned
pessimistically: a loss ``L`` in ``((k-1) h, k h]`` is counted at ``k h >= L``. Because the summand
is non-decreasing in ``L``, every estimate computed from the histogram is >= the estimate from the
raw losses (the bias is at most ``h * P(L > eps - h)``). Losses ``<= 0`` (including ``-inf``) are
counted in ``underflow`` (their summand is exactly 0 for every ``eps >= 0``), finite losses above
``upper`` in ``overflow`` (summand taken as 1, pessimistic) and ``+inf`` in ``infinite`` (summand 1,
exact). Histograms of the same grid merge by adding counts, so chunks computed anywhere, in any
order, give the same statistics (:mod:`dpmf.accounting.montecarlo.run`).

Confidence bounds use the Chernoff-Hoeffding KL inequality for means of independent ``[0, 1]``
variables (Hoeffding 1963, Thm. 1): ``P(mean <= mu - t) <= exp(-s KL(mu - t || mu))``, hence

    UCB = sup{ mu >= mean : s * KL(mean || mu) <= ln(1/alpha) }

satisfies ``P(delta > UCB) <= alpha``. It is the same inequality the certification of
:mod:`dpmf.accounting.montecarlo.certify` (Alg. 5) rests on. Reports use the UCB, never the mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, NumericalError

DEFAULT_RESOLUTION = 1e-4
DEFAULT_UPPER = 64.0


def kl_bernoulli(a: float, b: float) -> float:
    """``KL(Bern(a) || Bern(b)) = a ln(a/b) + (1-a) ln((1-a)/(1-b))`` (0 ln 0 = 0; inf if impossible).

    >>> round(kl_bernoulli(0.5, 0.25), 6)
    0.143841
    """
    if not (0.0 <= a <= 1.0 and 0.0 <= b <= 1.0):
        raise InvalidParameterError(f"kl_bernoulli needs a, b in [0, 1], got a={a!r}, b={b!r}")
    out = 0.0
    if a > 0:
        if b == 0:
            return math.inf
        out += a * (math.log(a) - math.log(b))
    if a < 1:
        if b == 1:
            return math.inf
        out += (1 - a) * (math.log1p(-a) - math.log1p(-b))
    return max(out, 0.0)


def kl_upper_confidence(mean: float, num_samples: int, alpha: float) -> float:
    """Chernoff-Hoeffding upper confidence bound on the mean of ``[0, 1]`` variables.

    ``sup{mu in [mean, 1] : s KL(mean || mu) <= ln(1/alpha)}``; the true mean exceeds it with
    probability <= ``alpha`` (Hoeffding 1963, Thm. 1). Bisection returns the upper end of the
    final bracket, so rounding moves the bound up.

    >>> u = kl_upper_confidence(0.0, 1000, 0.05)   # closed form 1 - alpha**(1/s)
    >>> abs(u - (1 - 0.05 ** (1 / 1000))) < 1e-12
    True
    """
    s = _v.positive_int("num_samples", num_samples)
    alpha = _v.open_unit("alpha", alpha)
    mean = float(mean)
    if not 0.0 <= mean <= 1.0:
        raise InvalidParameterError(f"mean must be in [0, 1], got {mean!r}")
    budget = math.log(1.0 / alpha) / s
    if mean >= 1.0:
        return 1.0
    if mean == 0.0:  # KL(0 || mu) = -ln(1 - mu)
        return min(1.0, -math.expm1(-budget) * (1 + 1e-12))
    if kl_bernoulli(mean, 1.0) <= budget:
        return 1.0
    lo, hi = mean, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if kl_bernoulli(mean, mid) <= budget:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    return hi


def kl_lower_confidence(mean: float, num_samples: int, alpha: float) -> float:
    """Chernoff-Hoeffding lower confidence bound (``inf{mu <= mean : s KL(mean||mu) <= ln 1/alpha}``)."""
    s = _v.positive_int("num_samples", num_samples)
    alpha = _v.open_unit("alpha", alpha)
    mean = float(mean)
    if not 0.0 <= mean <= 1.0:
        raise InvalidParameterError(f"mean must be in [0, 1], got {mean!r}")
    return 1.0 - kl_upper_confidence(1.0 - mean, s, alpha)


@dataclass(frozen=True, eq=False)
class LossHistogram:
    """Exact counts of privacy losses on the grid ``h, 2h, ..., K h`` (``K h >= upper``).

    ``counts[k]`` counts losses in ``(k h, (k+1) h]`` (valued at ``(k+1) h``); see the module
    docstring for ``underflow``, ``overflow`` and ``infinite``. Build with :meth:`empty` or
    :meth:`from_losses`; combine with :meth:`merge`.
    """

    resolution: float
    upper: float
    counts: np.ndarray
    underflow: int = 0
    overflow: int = 0
    infinite: int = 0

    def __post_init__(self) -> None:
        h = _v.positive("resolution", self.resolution)
        upper = _v.positive("upper", self.upper)
        k = _num_bins(h, upper)
        counts = np.asarray(self.counts)
        if counts.shape != (k,) or counts.dtype.kind not in "iu" or (counts.size and counts.min() < 0):
            raise InvalidParameterError(f"counts must be {k} non-negative integers, got shape {counts.shape}")
        for name in ("underflow", "overflow", "infinite"):
            value = int(getattr(self, name))
            if value < 0:
                raise InvalidParameterError(f"{name} must be >= 0, got {value}")
            object.__setattr__(self, name, value)
        counts = counts.astype(np.int64, copy=True)
        tails = self.underflow + self.overflow + self.infinite
        self._freeze(h, upper, counts, int(counts.sum()) + tails)

    def _freeze(self, h: float, upper: float, counts: np.ndarray, total: int) -> None:
        """Store ``counts`` (an int64 array this histogram owns) read-only, and the total; the
        non-zero bins (``_nz``, ``_nz_counts``) are found on first use and cached (immutable)."""
        counts.setflags(write=False)
        object.__setattr__(self, "_total", total)
        object.__setattr__(self, "resolution", h)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "counts", counts)

    @classmethod
    def _owned(cls, h, upper, counts, underflow, overflow, infinite, total) -> "LossHistogram":
        """A histogram from counts computed here (fresh int64 array, checked by construction): no
        validation pass and no copy -- the per-chunk path of :meth:`from_losses` and :meth:`merge`
        (each pass over the 640,000 bins of the default grid costs about as much as 1,000 samples)."""
        self = object.__new__(cls)
        for name, value in (("underflow", underflow), ("overflow", overflow), ("infinite", infinite)):
            object.__setattr__(self, name, int(value))
        self._freeze(h, upper, counts, int(total))
        return self

    @property
    def _nz(self) -> np.ndarray:
        cached = self.__dict__.get("_nz_cache")
        if cached is None:
            nz = np.flatnonzero(self.counts)
            cached = (nz, self.counts[nz].astype(np.float64))
            object.__setattr__(self, "_nz_cache", cached)
        return cached[0]

    @property
    def _nz_counts(self) -> np.ndarray:
        self._nz  # noqa: B018 - fills the cache
        return self.__dict__["_nz_cache"][1]

    # ----------------------------------------------------------------- construction
    @classmethod
    def empty(cls, resolution: float = DEFAULT_RESOLUTION, upper: float = DEFAULT_UPPER) -> "LossHistogram":
        h = _v.positive("resolution", resolution)
        return cls(h, upper, np.zeros(_num_bins(h, _v.positive("upper", upper)), dtype=np.int64))

    @classmethod
    def from_losses(
        cls, losses: np.ndarray, resolution: float = DEFAULT_RESOLUTION, upper: float = DEFAULT_UPPER
    ) -> "LossHistogram":
        """Histogram of ``losses`` (float64; ``+-inf`` allowed, NaN refused), rounded up to the grid."""
        h = _v.positive("resolution", resolution)
        upper = _v.positive("upper", upper)
        k = _num_bins(h, upper)
        x = np.asarray(losses, dtype=np.float64).ravel()
        if np.isnan(x).any():
            raise NumericalError(f"the privacy-loss sampler returned {int(np.isnan(x).sum())} NaN losses")
        top = k * h
        under = x <= 0.0
        inf = x == np.inf
        over = (x > top) & ~inf
        inside = x[~(under | inf | over)]
        idx = np.ceil(inside / h)
        idx[idx * h < inside] += 1  # float division may round down: keep the grid value >= the loss
        idx = np.clip(idx, 1, None).astype(np.int64) - 1
        if idx.size and idx.max() >= k:  # only possible through rounding right at the top
            extra = int((idx >= k).sum())
            idx = idx[idx < k]
        else:
            extra = 0
        counts = np.bincount(idx, minlength=k).astype(np.int64, copy=False)
        return cls._owned(h, upper, counts, int(under.sum()), int(over.sum()) + extra, int(inf.sum()), x.size)

    # ----------------------------------------------------------------- algebra
    @property
    def total(self) -> int:
        """Number of losses counted."""
        return self._total

    @property
    def grid(self) -> np.ndarray:
        """The value each bin is counted at (its upper edge)."""
        return np.arange(1, self.counts.size + 1, dtype=np.float64) * self.resolution

    def same_grid(self, other: "LossHistogram") -> bool:
        return self.resolution == other.resolution and self.upper == other.upper

    def merge(self, other: "LossHistogram") -> "LossHistogram":
        """Counts of both (samples from independent chunks); the grids must be identical."""
        if not isinstance(other, LossHistogram) or not self.same_grid(other):
            raise InvalidParameterError("can only merge LossHistograms with the same resolution and upper")
        return LossHistogram._owned(
            self.resolution,
            self.upper,
            self.counts + other.counts,
            self.underflow + other.underflow,
            self.overflow + other.overflow,
            self.infinite + other.infinite,
            self.total + other.total,
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, LossHistogram)
            and self.same_grid(other)
            and np.array_equal(self.counts, other.counts)
            and (self.underflow, self.overflow, self.infinite) == (other.underflow, other.overflow, other.infinite)
        )

    __hash__ = None  # type: ignore[assignment]

    # ----------------------------------------------------------------- serialization
    def to_sparse(self) -> dict:
        """JSON/npz-ready dict: grid, tails and the non-zero bins as (index, count) arrays."""
        nz = self._nz
        return {
            "resolution": self.resolution,
            "upper": self.upper,
            "underflow": self.underflow,
            "overflow": self.overflow,
            "infinite": self.infinite,
            "bins": nz.astype(np.int64),
            "bin_counts": self.counts[nz].astype(np.int64),
        }

    @classmethod
    def from_sparse(cls, data: dict) -> "LossHistogram":
        """Inverse of :meth:`to_sparse` (validates indices and counts)."""
        try:
            h, upper = float(data["resolution"]), float(data["upper"])
            bins = np.asarray(data["bins"], dtype=np.int64)
            vals = np.asarray(data["bin_counts"], dtype=np.int64)
            tails = int(data["underflow"]), int(data["overflow"]), int(data["infinite"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidParameterError(f"not a serialized LossHistogram ({exc})") from None
        k = _num_bins(h, upper)
        if bins.shape != vals.shape or (bins.size and (bins.min() < 0 or bins.max() >= k or vals.min() < 0)):
            raise InvalidParameterError("corrupt LossHistogram: bin indices or counts out of range")
        counts = np.zeros(k, dtype=np.int64)
        np.add.at(counts, bins, vals)
        return cls(h, upper, counts, *tails)

    # ----------------------------------------------------------------- estimates
    def delta_estimate(self, epsilon: float) -> float:
        """``(1/s) sum (1 - e^{eps - L})_+`` over the grid values (>= the raw-loss estimate)."""
        eps = _v.non_negative("epsilon", epsilon)
        s = self._require_samples()
        return min(1.0, self._weighted_sum(eps, pessimistic=True) / s)

    def delta_interval(self, epsilon: float, confidence: float) -> tuple[float, float, float]:
        """``(lower, estimate, upper)``: two-sided Chernoff-Hoeffding interval at ``confidence``.

        ``upper`` bounds the pessimistically binned mean (valid upper confidence bound, level
        ``(1 - confidence) / 2`` on each side); ``lower`` bounds the optimistically binned mean
        (losses rounded *down* to the grid, overflow at ``upper``), so the interval contains the
        true delta with probability >= ``confidence``.
        """
        eps = _v.non_negative("epsilon", epsilon)
        conf = _v.open_unit("confidence", confidence)
        s = self._require_samples()
        alpha = (1.0 - conf) / 2.0
        est = min(1.0, self._weighted_sum(eps, pessimistic=True) / s)
        opt = min(1.0, max(0.0, self._weighted_sum(eps, pessimistic=False) / s))
        return kl_lower_confidence(opt, s, alpha), est, kl_upper_confidence(est, s, alpha)

    def delta_upper_bound(self, epsilon: float, alpha: float) -> float:
        """One-sided upper confidence bound on delta(epsilon): wrong with probability <= ``alpha``."""
        s = self._require_samples()
        return kl_upper_confidence(self.delta_estimate(epsilon), s, alpha)

    def epsilon_upper_bound(self, delta: float, alpha: float, *, tol: float = 1e-7) -> float:
        """Smallest ``eps >= 0`` (to ``tol``, rounded up) with ``delta_upper_bound(eps) <= delta``.

        ``inf`` when even ``eps = upper`` does not reach ``delta`` (then the overflow/inf counts
        alone exceed it, or more samples are needed).
        """
        delta = _v.open_unit("delta", delta)
        return self._epsilon_for(lambda e: self.delta_upper_bound(e, alpha), delta, tol)

    def epsilon_estimate(self, delta: float, *, tol: float = 1e-7) -> float:
        """The point estimate: smallest ``eps`` with ``delta_estimate(eps) <= delta`` (not a bound)."""
        delta = _v.open_unit("delta", delta)
        return self._epsilon_for(self.delta_estimate, delta, tol)

    # ----------------------------------------------------------------- internals
    def _require_samples(self) -> int:
        s = self.total
        if s == 0:
            raise InvalidParameterError("the histogram holds no samples yet")
        return s

    def _weighted_sum(self, eps: float, *, pessimistic: bool) -> float:
        h = self.resolution
        values = (self._nz + (1.0 if pessimistic else 0.0)) * h
        w = -np.expm1(np.minimum(eps - values, 0.0))
        total = math.fsum((w * self._nz_counts).tolist())
        tail_w = 1.0 if pessimistic else max(0.0, -math.expm1(min(eps - self.counts.size * h, 0.0)))
        out = total + self.overflow * tail_w + self.infinite
        # floating-point rounding (expm1, products, the sum) moves the result by far less than 1e-12
        # relatively: push it to the safe side
        return out * (1 + 1e-12) if pessimistic else out * (1 - 1e-12)

    def _epsilon_for(self, delta_of, delta: float, tol: float) -> float:
        if delta_of(0.0) <= delta:
            return 0.0
        hi = self.counts.size * self.resolution
        if delta_of(hi) > delta:
            return math.inf
        lo = 0.0
        while hi - lo > tol:
            mid = 0.5 * (lo + hi)
            if delta_of(mid) <= delta:
                hi = mid
            else:
                lo = mid
        return hi


def _num_bins(resolution: float, upper: float) -> int:
    k = int(math.ceil(upper / resolution - 1e-9))
    if k < 1 or k > 50_000_000:
        raise InvalidParameterError(
            f"upper / resolution must give between 1 and 5e7 bins, got upper={upper!r}, resolution={resolution!r}"
        )
    return k
