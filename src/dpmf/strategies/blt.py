"""Buffered-linear Toeplitz (BLT) strategies: Toeplitz encoders with a rational generating function.

A BLT with ``d`` buffers has parameters ``buf_decay`` ``theta_i`` and ``output_scale`` ``omega_i``
(``i = 0 .. d-1``) and is the lower-triangular Toeplitz encoder ``C`` (0-based, as in
:mod:`dpmf.strategies.toeplitz`) with coefficients::

    c_0 = 1,   c_t = sum_i omega_i theta_i^(t-1)   (t >= 1),

i.e. the generating function ``C(z) = 1 + sum_i omega_i z / (1 - theta_i z)``. (McKenna 2024;
Dvijotham et al. 2024, "Efficient and near-optimal noise generation for streaming differential
privacy", arXiv 2404.16706; Alg. 3 of arXiv 2408.08868. Same parametrization as
``jax_privacy``'s ``BufferedToeplitz``; no code is shared.)

Non-negative case (the default, and what the validation of :class:`BLT` asks for):
``theta_i in (0, 1)`` and ``omega_i >= 0``; then ``c_t > 0`` is non-increasing for ``t >= 1``.

**Inverse.** ``1 / C(z)`` is again rational of the same degree, hence a BLT. With ``x = 1/z``,
``C = Q(x) / D(x)`` where ``D(x) = prod_i (x - theta_i)`` and
``Q(x) = D(x) + S(x)``, ``S(x) = sum_i omega_i prod_{k != i} (x - theta_k)`` (both monic/degree
``d`` resp. ``d - 1``). So ``1/C = D/Q = 1 - S(x)/Q(x)``, and partial fractions give::

    1 / C(z) = 1 + sum_j w_j z / (1 - r_j z),   r_j = roots of Q,   w_j = -S(r_j) / Q'(r_j)

(requires distinct roots). In the non-negative case ``f(x) = 1 + sum_i omega_i/(x - theta_i)``
is decreasing between its poles, so ``Q = D f`` has one real root in each gap between sorted
``theta``'s and one below ``min(theta)``: all roots are real, distinct and ``< max(theta) < 1``,
and ``w_j = 1 / f'(r_j) < 0`` (for ``omega_i > 0``; zero-scale terms are dropped first). The
inverse therefore has **negative** output scales (and possibly
a ``buf_decay <= 0``): it is a *general* BLT (``nonnegative=False``), not a non-negative one.
The smallest pole is negative iff ``sum_i omega_i / theta_i > 1``, and below ``-1`` (``C^{-1}``
grows geometrically) when ``f(-1) < 0``, i.e. ``sum_i omega_i / (1 + theta_i) > 1``.

**Streaming.** :class:`BLTNoise` produces ``w = C^{-1} z`` one step at a time with one buffer of
size ``dim`` per term, by forward substitution in the encoder itself (no root finding):
``w_t = z_t - sum_i omega_i s_i``, then ``s_i <- theta_i s_i + w_t``, where
``s_i = sum_{k<t} theta_i^(t-1-k) w_k``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, NumericalError, UnsupportedConfigurationError
from dpmf.resources import check_allocation
from dpmf.strategies.api import NoiseMethod
from dpmf.strategies.streaming import CHUNK, StreamingNoise, check_noise_buffer
from dpmf.strategies.toeplitz import ToeplitzStrategy

__all__ = ["BLT", "BLTStrategy", "BLTNoise", "optimize_blt"]


def _params(name: str, value: object) -> np.ndarray:
    arr = _v.finite_array(name, value, ndim=1).copy()
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class BLT(NoiseMethod):
    """A buffered-linear Toeplitz encoder ``C(z) = 1 + sum_i omega_i z / (1 - theta_i z)``.

    ``buf_decay`` (``theta``) and ``output_scale`` (``omega``) are 1-d arrays of equal length
    ``num_buffers >= 1``. With ``nonnegative=True`` (default) they must satisfy
    ``0 < theta_i < 1`` and ``omega_i >= 0``; with ``nonnegative=False`` (e.g. the result of
    :meth:`inverse`) any finite real values are accepted. The encoder is not normalized to any
    sensitivity (``c_0 = 1``). Instances compare by identity (they hold arrays).
    """

    buf_decay: np.ndarray
    output_scale: np.ndarray
    nonnegative: bool = True

    def __post_init__(self) -> None:
        theta = _params("buf_decay", self.buf_decay)
        omega = _params("output_scale", self.output_scale)
        if theta.shape != omega.shape:
            raise InvalidParameterError(
                f"buf_decay and output_scale must have the same length, got {theta.size} and "
                f"{omega.size}"
            )
        if not isinstance(self.nonnegative, bool):
            raise InvalidParameterError(f"nonnegative must be a bool, got {self.nonnegative!r}")
        if self.nonnegative:
            if not np.all((theta > 0) & (theta < 1)):
                raise InvalidParameterError(f"buf_decay must lie in (0, 1), got {theta.tolist()}")
            if not np.all(omega >= 0):
                raise InvalidParameterError(f"output_scale must be >= 0, got {omega.tolist()}")
        object.__setattr__(self, "buf_decay", theta)
        object.__setattr__(self, "output_scale", omega)

    @property
    def num_buffers(self) -> int:
        return int(self.buf_decay.size)

    def describe(self) -> dict:
        return {
            "name": "blt",
            "num_buffers": self.num_buffers,
            "buf_decay": self.buf_decay.tolist(),
            "output_scale": self.output_scale.tolist(),
            "nonnegative": self.nonnegative,
        }

    def toeplitz_coefs(self, n: int) -> np.ndarray:
        """The first ``n`` coefficients ``c_0 = 1, c_t = sum_i omega_i theta_i^(t-1)``."""
        n = _v.positive_int("n", n)
        check_allocation(n, self.num_buffers + 2, "computing the BLT's Toeplitz coefficients")
        t = np.arange(n - 1, dtype=np.float64)
        powers = np.power(self.buf_decay[None, :], t[:, None])  # 0**0 == 1
        return np.concatenate(([1.0], powers @ self.output_scale))

    def to_toeplitz(self, n: int) -> "BLTStrategy":
        """The ``n x n`` encoder as a :class:`BLTStrategy` (a :class:`ToeplitzStrategy` that keeps
        the BLT parameters, so its streaming noise needs only ``num_buffers * dim`` floats)."""
        return BLTStrategy.from_blt(self, n)

    def inverse(self, *, rtol: float = 1e-12) -> "BLT":
        """The BLT ``(r, w)`` with ``1/C(z) = 1 + sum_j w_j z / (1 - r_j z)`` (module docstring).

        Terms with equal ``buf_decay`` are merged and terms with ``output_scale == 0`` dropped
        (below ``1e-14 * max(1, max|omega|)``) first, so the inverse has as many buffers as ``C``
        has *effective* terms (at most ``num_buffers``; for ``C = I`` one term with scale 0).
        Returned with ``nonnegative=False``. Raises :class:`UnsupportedConfigurationError` if the
        poles of ``1/C`` are complex (possible only for general, not non-negative, BLTs) and
        :class:`NumericalError` if two poles coincide (no partial-fraction form with simple
        poles).
        """
        # reduce to the effective terms: equal decays merge, zero output scales drop out
        theta, idx = np.unique(self.buf_decay, return_inverse=True)
        omega = np.bincount(idx.ravel(), weights=self.output_scale, minlength=theta.size)
        # |omega_i| below 1e-14 * max(1, max|omega|) counts as 0: such a term nearly cancels
        # against a root of the numerator and would give a numerically double pole; dropping it
        # changes each coefficient of C by at most that |omega_i|.
        keep = np.abs(omega) > 1e-14 * max(1.0, float(np.max(np.abs(omega))))
        if not np.any(keep):  # C = I
            return BLT(self.buf_decay[:1], [0.0], nonnegative=False)
        theta, omega = theta[keep], omega[keep]
        d = theta.size
        D = np.poly(theta)  # monic, highest degree first
        S = np.zeros(d)
        for i in range(d):
            S = S + omega[i] * np.poly(np.delete(theta, i))
        Q = D + np.concatenate(([0.0], S))
        roots = np.roots(Q)
        scale = max(1.0, float(np.max(np.abs(roots))))
        if np.any(np.abs(roots.imag) > 1e-9 * scale):
            raise UnsupportedConfigurationError(
                f"1/C has complex poles {roots.tolist()}; only real BLTs are supported"
            )
        r = np.sort(roots.real)
        # refine each root by a few Newton steps on Q
        dQ = np.polyder(Q)
        for _ in range(3):
            step = np.polyval(Q, r) / np.polyval(dQ, r)
            r = r - np.where(np.isfinite(step), step, 0.0)
        if d > 1 and np.min(np.diff(r)) <= rtol * scale:
            raise NumericalError(f"1/C has a repeated pole near {r.tolist()}")
        w = -np.polyval(S, r) / np.polyval(dQ, r)
        if not np.all(np.isfinite(w)):
            raise NumericalError("residues of 1/C are not finite")
        return BLT(r, w, nonnegative=False)

    def sensitivity_squared(self, n: int) -> float:
        """Single-participation squared sensitivity ``||C[:, 0]||^2 = sum_{t<n} c_t^2``.

        Closed form: ``1 + omega^T G omega`` with
        ``G_ij = sum_{s=0}^{n-2} (theta_i theta_j)^s
        = (1 - (theta_i theta_j)^(n-1)) / (1 - theta_i theta_j)``.
        Column 0 has the largest norm, so this is the sensitivity for one participation.
        """
        n = _v.positive_int("n", n)
        p = np.multiply.outer(self.buf_decay, self.buf_decay)
        m = n - 1
        with np.errstate(divide="ignore", invalid="ignore"):
            G = np.where(np.isclose(p, 1.0, rtol=0, atol=1e-14), float(m), (1.0 - p**m) / (1.0 - p))
        return float(1.0 + self.output_scale @ G @ self.output_scale)

    def prefix_sum_rmse(self, n: int) -> float:
        """RMSE over the ``n`` prefix sums at unit noise multiplier for ``C`` as given (not
        normalized): see :meth:`ToeplitzStrategy.prefix_sum_rmse`."""
        return self.to_toeplitz(n).prefix_sum_rmse()

    def _streaming_noise(self, dim: int, rng: object, noise_multiplier: float, dtype: object,
                         n: int | None = None) -> "BLTNoise":
        # streaming_noise (NoiseMethod): w = C^{-1} z by BLTNoise, unbounded unless n is given
        return BLTNoise(self, dim, rng=rng, n=n, noise_multiplier=noise_multiplier, dtype=dtype)


@dataclass(frozen=True, eq=False)
class BLTStrategy(ToeplitzStrategy):
    """The ``n``-step encoder ``scale * C_blt`` of a :class:`BLT`, held as a :class:`ToeplitzStrategy`
    (``coefs = scale * blt.toeplitz_coefs(n)``) that remembers its BLT parameters.

    Everything Toeplitz (sensitivity, errors, ``noising_matrix``) is inherited;
    :meth:`streaming_noise` uses the BLT recursion (:class:`BLTNoise`, ``num_buffers * dim``
    floats) instead of the Toeplitz history, and :meth:`normalized` keeps the BLT form. Build with
    :meth:`from_blt` or :meth:`BLT.to_toeplitz`.
    """

    blt: BLT | None = None
    scale: float = 1.0

    name = "blt"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.blt, BLT):
            raise InvalidParameterError(f"blt must be a BLT, got {type(self.blt).__name__}")
        scale = _v.positive("scale", self.scale)
        expected = scale * self.blt.toeplitz_coefs(self.n)
        if self.coefs.shape != expected.shape or not np.allclose(self.coefs, expected, rtol=1e-12, atol=0):
            raise InvalidParameterError("coefs must equal scale * blt.toeplitz_coefs(n); use BLTStrategy.from_blt")
        object.__setattr__(self, "scale", scale)

    @classmethod
    def from_blt(cls, blt: BLT, n: int, scale: float = 1.0) -> "BLTStrategy":
        """``scale * C_blt`` over ``n`` steps."""
        if not isinstance(blt, BLT):
            raise InvalidParameterError(f"blt must be a BLT, got {type(blt).__name__}")
        n = _v.positive_int("n", n)
        scale = _v.positive("scale", scale)
        return cls(scale * blt.toeplitz_coefs(n), n, blt=blt, scale=scale)

    def describe(self) -> dict:
        """The BLT parameters, ``n`` and ``scale`` (plus ``band``); the Toeplitz ``coefs`` only
        when they are not exactly ``scale * blt.toeplitz_coefs(n)`` (a BLT is its parameters)."""
        d = super().describe()
        if np.array_equal(self.coefs, self.scale * self.blt.toeplitz_coefs(self.n)):
            del d["coefs"]
        d.update(self.blt.describe())
        d.update({"name": self.name, "scale": self.scale, "nonnegative": self.blt.nonnegative})
        return d

    def normalized(self, participation) -> "BLTStrategy":
        """``C / sens`` keeping the BLT form (``scale`` divided by the sensitivity)."""
        sens = self.sensitivity(participation)
        if not sens > 0:
            raise InvalidParameterError("C has zero sensitivity; it cannot be normalized")
        return BLTStrategy.from_blt(self.blt, self.n, self.scale / sens)

    def _streaming_noise(self, dim: int, rng: object, noise_multiplier: float, dtype: object) -> "BLTNoise":
        # streaming_noise (NoiseMethod): n steps of the BLT recursion (BLTNoise)
        return BLTNoise(
            self.blt, dim, rng=rng, n=self.n, noise_multiplier=noise_multiplier, dtype=dtype, scale=self.scale
        )


class BLTNoise(StreamingNoise):
    """Streaming correlated noise ``w_t = (C^{-1} z)_t`` for a :class:`BLT` ``C`` (times ``1/scale``
    for the encoder ``scale * C``).

    Memory: ``memory_floats = num_buffers * dim`` floats of state (``buffers``) besides the output.
    Per step, ``w_t = z_t - sum_i omega_i s_i`` and ``s_i <- theta_i s_i + w_t`` (forward
    substitution in ``C w = z``; exact for any number of steps). Mirrors ``jax_privacy``'s
    ``BufferedToeplitz.inverse_as_streaming_matrix`` (Alg. 3 of arXiv 2408.08868).

    * ``next(noise)`` draws ``z_t = noise_multiplier * N(0, I_dim)`` from ``rng`` and returns
      ``w_t`` (stops after ``n`` steps if ``n`` is given, else never). The draw and the buffer
      updates are fused chunk by chunk (cache-friendly); the numbers are those of
      ``step(noise_multiplier * rng.standard_normal(dim))``.
    * ``noise.step(z_t)`` takes ``z_t`` from the caller; feeding unit vectors materializes
      ``C^{-1}``.

    ``dtype`` (float64 default, float32 on request) is the dtype of draws, buffers and output.
    The normal draw dominates the cost for large ``dim``: a faster bit generator, e.g.
    ``numpy.random.Generator(numpy.random.SFC64(seed))``, is ~20-30% faster than the default
    PCG64 (see ``benchmarks/bench_strategies_structured.py``).
    """

    def __init__(
        self,
        blt: BLT,
        dim: int,
        *,
        rng: np.random.Generator | int | None = None,
        n: int | None = None,
        noise_multiplier: float = 1.0,
        dtype: object = np.float64,
        scale: float = 1.0,
    ) -> None:
        if not isinstance(blt, BLT):
            raise InvalidParameterError(f"blt must be a BLT, got {type(blt).__name__}")
        super().__init__(n, dim, noise_multiplier=noise_multiplier, rng=rng, dtype=dtype)
        self.blt = blt
        self.scale = _v.positive("scale", scale)
        self._theta = [float(x) for x in blt.buf_decay]
        self._omega = [float(x) for x in blt.output_scale]
        check_noise_buffer(blt.num_buffers, self.dim, self.dtype, "the BLT's noise buffers")
        self.buffers = np.zeros((blt.num_buffers, self.dim), dtype=self.dtype)
        self._tmp = np.empty(min(self.dim, CHUNK), dtype=self.dtype)

    @property
    def memory_floats(self) -> int:
        """Floats of state kept between steps: ``num_buffers * dim``."""
        return int(self.buffers.size)

    def _update(self, w: np.ndarray, lo: int, hi: int) -> None:
        # w holds z_t[lo:hi] on entry and w_t[lo:hi] on exit; buffers updated in place.
        buf = self.buffers
        tmp = self._tmp[: hi - lo]
        if self._t:
            for i, om in enumerate(self._omega):
                if om:
                    np.multiply(buf[i, lo:hi], om, out=tmp)
                    w -= tmp
        for i, th in enumerate(self._theta):
            b = buf[i, lo:hi]
            b *= th
            b += w
        if self.scale != 1.0:
            w /= self.scale

    def _step(self, w: np.ndarray) -> np.ndarray:
        for lo in range(0, self.dim, CHUNK):
            hi = min(lo + CHUNK, self.dim)
            self._update(w[lo:hi], lo, hi)
        return w

    def _next(self) -> np.ndarray:
        w = np.empty(self.dim, dtype=self.dtype)
        sigma = self.noise_multiplier
        for lo in range(0, self.dim, CHUNK):
            hi = min(lo + CHUNK, self.dim)
            ww = w[lo:hi]
            self._rng.standard_normal(dtype=self.dtype, out=ww)
            if sigma != 1.0:
                ww *= sigma
            self._update(ww, lo, hi)
        self._t += 1
        return w


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _unpack(x: np.ndarray, d: int) -> BLT:
    theta = np.clip(_sigmoid(x[:d]), 1e-12, 1 - 1e-12)
    return BLT(theta, _softplus(x[d:]))


def _blt_loss(blt: BLT, n: int, participation) -> float:
    from dpmf.strategies.sensitivity import toeplitz_sensitivity_squared

    strat = blt.to_toeplitz(n)
    sens2 = toeplitz_sensitivity_squared(strat.coefs, participation, n).value
    return strat.prefix_sum_rmse() ** 2 * sens2


def optimize_blt(
    n: int,
    num_buffers: int,
    epochs: int = 1,
    *,
    maxiter: int = 300,
    init: BLT | None = None,
) -> tuple[BLT, float]:
    """Minimize the prefix-sum RMSE at unit sensitivity over non-negative BLTs.

    Objective: ``rmse(C)^2 * sens^2(C)`` where ``rmse`` is :meth:`BLT.prefix_sum_rmse` and
    ``sens`` the Toeplitz sensitivity under ``FixedEpochParticipation(epochs, n // epochs)``
    (:func:`dpmf.strategies.sensitivity.toeplitz_sensitivity_squared`). Parameters are
    unconstrained (``theta = sigmoid(u)``, ``omega = softplus(v)``) and optimized by scipy's
    L-BFGS-B with finite-difference gradients (meant for a few buffers and ``n`` up to a few
    thousand). Returns ``(blt, rmse_at_unit_sensitivity)``; the BLT is *not* rescaled (``c_0 =
    1``): divide ``C`` by ``sens`` to normalize.
    """
    from scipy.optimize import minimize

    from dpmf.strategies.sensitivity import FixedEpochParticipation

    n = _v.positive_int("n", n)
    d = _v.positive_int("num_buffers", num_buffers)
    epochs = _v.positive_int("epochs", epochs)
    if epochs > n:
        raise InvalidParameterError(f"epochs must be <= n={n}, got {epochs}")
    part = FixedEpochParticipation(epochs, n // epochs)
    if init is None:
        theta0 = 1.0 - np.logspace(-2.5, -0.3, d)  # spread decays, slow to fast
        omega0 = np.full(d, 0.5 / d)
    else:
        if not isinstance(init, BLT) or init.num_buffers != d or not init.nonnegative:
            raise InvalidParameterError("init must be a non-negative BLT with num_buffers buffers")
        theta0, omega0 = init.buf_decay, np.maximum(init.output_scale, 1e-8)
    x0 = np.concatenate((np.log(theta0 / (1 - theta0)), np.log(np.expm1(omega0))))

    def fun(x: np.ndarray) -> float:
        val = _blt_loss(_unpack(x, d), n, part)
        return math.log(val) if val > 0 and math.isfinite(val) else 1e300

    res = minimize(fun, x0, method="L-BFGS-B", options={"maxiter": maxiter})
    best = _unpack(res.x if res.fun <= fun(x0) else x0, d)
    return best, math.sqrt(_blt_loss(best, n, part))
