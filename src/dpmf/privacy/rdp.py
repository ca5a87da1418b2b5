r"""Rényi differential privacy (RDP) of the Gaussian and Poisson-subsampled Gaussian mechanisms,
and the conversion from RDP to (epsilon, delta)-DP.

What is computed
----------------
*Gaussian mechanism* (sensitivity ``s``, noise ``N(0, sigma^2)``): for every order ``alpha > 1``

    D_alpha = alpha * s^2 / (2 sigma^2).

*Poisson-subsampled Gaussian* (sampled Gaussian mechanism, SGM; Mironov, Talwar, Zhang 2019,
"Rényi Differential Privacy of the Sampled Gaussian Mechanism", arXiv:1908.10530). Each example is
used with probability ``q = sampling_prob``, clip norm 1, noise ``sigma = noise_multiplier``.
With ``mu0 = N(0, sigma^2)``, ``mu1 = N(1, sigma^2)`` and ``mu = (1 - q) mu0 + q mu1``,

    A_alpha = E_{z ~ mu0} [ (mu(z) / mu0(z))^alpha ],      D_alpha = log(A_alpha) / (alpha - 1).

``A_alpha`` is the divergence ``D_alpha(mu || mu0)`` (the "add" direction);
the other direction ``B_alpha = E_{mu}[(mu0 / mu)^alpha]`` never exceeds it (shown by Mironov et
al. 2019), so ``D_alpha`` is valid for zero-out (add/remove) adjacency in both directions, as
DESIGN.md requires. The tests also check ``B_alpha <= A_alpha`` by quadrature at a few points.

*Integer orders* (Mironov et al. 2019, Sec. 3). Binomial expansion of ``(1 - q + q mu1/mu0)^alpha``
and ``E_{mu0}[(mu1/mu0)^k] = exp(k (k - 1) / (2 sigma^2))`` give a finite sum of positive terms.
Because the binomial weights sum to one we compute ``A_alpha - 1`` directly,

    A_alpha - 1 = sum_{k=2}^{alpha} C(alpha, k) (1 - q)^(alpha - k) q^k expm1(k (k - 1) / (2 sigma^2)),

in log space (the ``k = 0, 1`` terms vanish), then ``log A = log1p(A - 1)``. No cancellation:
accurate even when ``D_alpha`` is tiny.

*Fractional orders* (Mironov et al. Sec. 3.3). Split the real line at
``z0 = sigma^2 log(1/q - 1) + 1/2`` (where ``q mu1 = (1 - q) mu0``) and expand each side in the
generalized binomial series. With ``Phi`` the standard normal CDF and ``j = alpha - k``,

    A_alpha = sum_{k >= 0} C(alpha, k) [ q^k (1 - q)^j exp((k^2 - k) / (2 sigma^2)) Phi((z0 - k) / sigma)
                                       + q^j (1 - q)^k exp((j^2 - j) / (2 sigma^2)) Phi((j - z0) / sigma) ].

Rewriting each term as ``C(alpha, k) (1 - q)^alpha exp(-z0^2 / (2 sigma^2)) / sqrt(2 pi) * [R(u_k)
+ R(v_k)]`` with the Mills ratio ``R(u) = Phi(-u) / phi(u)`` (decreasing in ``u``),
``u_k = (k - z0) / sigma`` and ``v_k = (k + z0 - alpha) / sigma`` shows that for
``k >= ceil(alpha)`` the terms alternate in sign (the sign of ``C(alpha, k)``) and decrease in
magnitude. The series converges absolutely, so it may be summed term by term (Fubini), and the
alternating-series bound brackets the truncated tail: after ``K >= ceil(alpha)`` terms the
remainder has the sign of term ``K`` and magnitude at most ``|term_K|``.

**Soundness.** We return an *upper bound* on ``A_alpha``: the partial sum plus the positive part of
the first omitted term, plus an allowance for floating-point error in the log-space terms
(4 ulps times the magnitude of the quantities added in each term's exponent); as a second
certificate we also form the sum of absolute values plus the exact tail bound
``sum_{k >= K} |C(alpha, k)| = K |C(alpha, K)| / alpha`` (from
``(k + 1) |C(alpha, k+1)| = (k - alpha) |C(alpha, k)|``), and keep the smaller of the two valid
bounds. Terms are added (vectorized over orders, doubling the count) until the first omitted term
is below ``1e-13`` of the sum, with a cap of 2^18 terms; at the cap the value is still a valid
(looser) upper bound. Any non-finite intermediate result gives ``+inf`` for that order. Nothing
here warns or logs.

Every order (integer or not) is finally capped by the convexity bound
``A_alpha <= 1 - q + q exp(alpha (alpha - 1) / (2 sigma^2))`` (``P -> E_Q[(P/Q)^alpha]`` is convex),
which is itself below the Gaussian mechanism's RDP; it only matters where the floating-point
allowance above is larger than the true value (tiny ``q`` or orders very close to 1). Orders above
65536 use this bound alone (sound but loose there; the series would need as many terms).

Note on ``dp_accounting`` (0.6.0): its fractional-order routine ``_compute_log_a_frac`` adds the
*absolute values* ``|C(alpha, k)|`` (``gammaln`` drops the sign of the Gamma function), which is a
valid but loose upper bound (e.g. 4% above the exact value at ``q=0.01, sigma=1, alpha=1.5``;
55% at ``q=0.1, sigma=1, alpha=1.1``), and it drops an order (``+inf`` with a warning) when its
1000-step loop does not meet its stopping rule. Our value is the exact ``D_alpha`` (to ~1e-13
in ``log A``), so at fractional orders it is *at most* dp_accounting's; at integer orders both
agree.

*Conversion to (epsilon, delta)* (Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for
Differential Privacy", arXiv:2004.00010 Prop. 12 (v4); the same bound is Balle et al. 2020,
"Hypothesis Testing Interpretations and Renyi Differential Privacy", arXiv:2001.05990 Eq. 20
(v1)). If a mechanism is
``(alpha, r)``-RDP then it is ``(epsilon, delta)``-DP with

    epsilon = r + log1p(-1/alpha) - (log(delta) + log(alpha)) / (alpha - 1),
    log(delta) = (alpha - 1) (r - epsilon + log1p(-1/alpha)) - log(alpha)     (the exact inverse).

We also use, as ``dp_accounting.rdp.compute_epsilon`` / ``compute_delta`` do, the bound
``delta(0) = TV <= sqrt(1 - exp(-KL)) <= sqrt(1 - exp(-r))`` (Bretagnolle-Huber, and
``KL = D_1 <= D_alpha``): it gives ``epsilon = 0`` when ``delta^2 >= 1 - exp(-r)``. The best order
is taken, and the result is clipped to ``epsilon >= 0`` / ``delta <= 1``. Unlike dp_accounting we
apply the conversion at every order ``alpha > 1`` (it is valid there; dp_accounting skips
``alpha <= 1.01``).

Composition of ``T`` mechanisms multiplies RDP by ``T`` at every order.

Functions mirror ``dp_accounting.rdp.rdp_privacy_accountant``
(``_compute_rdp_poisson_subsampled_gaussian``, ``compute_epsilon``, ``compute_delta``).
All arithmetic is float64.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError

__all__ = [
    "DEFAULT_ORDERS",
    "gaussian_rdp",
    "subsampled_gaussian_rdp",
    "rdp_to_epsilon",
    "rdp_to_delta",
    "epsilon_subsampled_gaussian_rdp",
]

#: Default Rényi orders: 1.25..10 in steps of 0.125, the integers 11..64, then a sparse tail.
DEFAULT_ORDERS: np.ndarray = np.concatenate(
    [
        np.arange(1.25, 10.0 + 1e-9, 0.125),
        np.arange(11.0, 65.0),
        np.array([80.0, 96.0, 128.0, 256.0, 512.0, 1024.0]),
    ]
).astype(np.float64)
DEFAULT_ORDERS.setflags(write=False)

# Orders above this use only the convexity bound (sound but loose): the series would need more
# than 65536 terms, and such orders are useful only for huge noise multipliers.
_MAX_SERIES_ORDER = float(1 << 16)
# Fractional-order series: stop when the bracket on the tail is below this relative size.
_FRAC_RTOL = 1e-13
# First block of terms beyond ceil(alpha), and the hard cap on the number of terms.
_FRAC_FIRST_BLOCK = 64
_FRAC_MAX_TERMS = 1 << 18
_FRAC_MAX_BLOCK = 1 << 15
# Floating-point allowance: relative error of one term is taken as this many ulps times the
# magnitude of the quantities summed in its exponent.
_ULPS = 4.0 * np.finfo(np.float64).eps


# ----------------------------------------------------------------------------------------------
# validation helpers (public entry points only)


def _float_vector(name: str, value: object) -> np.ndarray:
    """``value`` as a float64 array, a scalar as a length-1 vector (``name`` in the error)."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"{name} must be an array of numbers: {exc}") from None
    return arr.reshape(1) if arr.ndim == 0 else arr


def _orders(orders: object) -> np.ndarray:
    arr = _v.finite_array("orders", _float_vector("orders", orders))
    if np.any(arr <= 1.0):
        raise InvalidParameterError(
            f"orders must all be > 1 (Rényi orders), got min {float(arr.min())!r}"
        )
    return arr


def _rdp_vector(rdp: object, n: int) -> np.ndarray:
    arr = _float_vector("rdp", rdp)
    if arr.ndim != 1:
        raise InvalidParameterError(f"rdp must be 1-dimensional, got shape {arr.shape}")
    if arr.size != n:
        raise InvalidParameterError(
            f"rdp must have one value per order: got {arr.size} values for {n} orders"
        )
    if np.any(np.isnan(arr)):
        raise InvalidParameterError("rdp must not contain NaN")
    if np.any(arr < 0):
        raise InvalidParameterError(
            f"rdp values must be >= 0 (or +inf), got min {float(arr.min())!r}"
        )
    return arr


# ----------------------------------------------------------------------------------------------
# Gaussian


def gaussian_rdp(
    noise_multiplier: float, orders: object, sensitivity: float = 1.0
) -> np.ndarray:
    """RDP of the Gaussian mechanism: ``alpha * sensitivity^2 / (2 noise_multiplier^2)``.

    Args:
      noise_multiplier: noise standard deviation ``sigma`` (> 0, finite).
      orders: Rényi orders (array-like, all > 1; a scalar is one order).
      sensitivity: L2 sensitivity ``s`` (>= 0, finite).

    Returns:
      float64 array of RDP values, one per order.
    """
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    s = _v.non_negative("sensitivity", sensitivity)
    alphas = _orders(orders)
    return _gaussian_rdp(sigma, alphas, s)


def _gaussian_rdp(sigma: float, alphas: np.ndarray, s: float = 1.0) -> np.ndarray:
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        out = alphas * (np.square(np.float64(s) / np.float64(sigma)) / 2.0)
    return np.where(np.isnan(out), np.inf, out)


# ----------------------------------------------------------------------------------------------
# Poisson-subsampled Gaussian


def subsampled_gaussian_rdp(
    noise_multiplier: float, sampling_prob: float, orders: object
) -> np.ndarray:
    """RDP of the Poisson-subsampled Gaussian mechanism (Mironov, Talwar, Zhang 2019).

    Each example participates independently with probability ``sampling_prob``; its contribution
    has L2 norm <= 1 and the noise is ``N(0, noise_multiplier^2)``. Adjacency is zero-out
    (add/remove); the value is valid for both directions. Mirrors dp_accounting's
    ``_compute_rdp_poisson_subsampled_gaussian``, but fractional orders are computed exactly (see
    the module docstring) and every value is a certified upper bound: ``+inf`` only if the
    computation overflows, never NaN, never a warning.

    Args:
      noise_multiplier: ``sigma`` (> 0, finite).
      sampling_prob: ``q`` in [0, 1]; ``q = 0`` gives 0, ``q = 1`` the Gaussian mechanism.
      orders: Rényi orders (array-like, all > 1; a scalar is one order).

    Returns:
      float64 array of RDP values, one per order.
    """
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    q = _v.probability("sampling_prob", sampling_prob, allow_zero=True)
    alphas = _orders(orders)
    return _subsampled_gaussian_rdp(sigma, q, alphas)


def _subsampled_gaussian_rdp(sigma: float, q: float, alphas: np.ndarray) -> np.ndarray:
    if q == 0.0:
        return np.zeros_like(alphas)
    if q == 1.0:
        return _gaussian_rdp(sigma, alphas)
    log_a = _log_a_convexity_bound(q, sigma, alphas)
    series = alphas <= _MAX_SERIES_ORDER
    is_int = series & (alphas == np.floor(alphas))
    is_frac = series & ~is_int
    if np.any(is_int):
        log_a[is_int] = np.fmin(log_a[is_int], _log_a_int(q, sigma, alphas[is_int]))
    if np.any(is_frac):
        log_a[is_frac] = np.fmin(log_a[is_frac], _log_a_frac(q, sigma, alphas[is_frac]))
    with np.errstate(over="ignore", invalid="ignore"):
        rdp = log_a / (alphas - 1.0)
    rdp = np.where(np.isnan(rdp), np.inf, rdp)
    rdp = np.fmin(rdp, _gaussian_rdp(sigma, alphas))  # subsampling never hurts (convexity)
    return np.maximum(rdp, 0.0)  # A_alpha >= 1 in exact arithmetic


def _log_a_convexity_bound(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """log(1 - q + q exp(alpha (alpha - 1) / (2 sigma^2))) >= log A_alpha (convexity of
    P -> E_Q[(P/Q)^alpha]); never above the Gaussian mechanism's value."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        x = alphas * (alphas - 1.0) / (2.0 * sigma * sigma)
        small = x < 1.0
        return np.where(
            small,
            np.log1p(q * np.expm1(np.where(small, x, 0.0))),
            np.logaddexp(math.log1p(-q), math.log(q) + x),
        )


def _log_expm1(x: np.ndarray) -> np.ndarray:
    """log(exp(x) - 1) for x > 0, stable for small and large x."""
    with np.errstate(over="ignore", divide="ignore"):
        big = x > 1.0
        out = np.empty_like(x)
        out[big] = x[big] + np.log1p(-np.exp(-x[big]))
        out[~big] = np.log(np.expm1(x[~big]))
    return out


def _log_a_int(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """log A_alpha for integer orders, all orders in one vectorized pass.

    Uses A - 1 = sum_{k=2}^{alpha} C(alpha,k) (1-q)^(alpha-k) q^k expm1(k(k-1)/(2 sigma^2)).
    """
    n = alphas.astype(np.int64)
    counts = n - 1  # k = 2..n
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    a = np.repeat(alphas, counts)
    k = np.arange(int(counts.sum()), dtype=np.float64) - np.repeat(starts, counts) + 2.0
    log_q, log_1mq = math.log(q), math.log1p(-q)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        t = (
            special.gammaln(a + 1.0)
            - special.gammaln(k + 1.0)
            - special.gammaln(a - k + 1.0)
            + k * log_q
            + (a - k) * log_1mq
            + _log_expm1(k * (k - 1.0) / (2.0 * sigma * sigma))
        )
        seg_max = np.maximum.reduceat(t, starts)
        shifted = np.exp(t - np.repeat(seg_max, counts))
        log_am1 = seg_max + np.log(np.add.reduceat(shifted, starts))
        out = np.logaddexp(0.0, log_am1)
    return np.where(np.isfinite(out), out, np.inf)


def _frac_terms(
    q: float, sigma: float, alphas: np.ndarray, k: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Log-magnitudes of the two series' terms (rows: orders, columns: k), their common sign, and
    a per-term relative floating-point error allowance."""
    a = alphas[:, None]
    kk = k[None, :]
    j = a - kk
    log_q, log_1mq = math.log(q), math.log1p(-q)
    two_s2 = 2.0 * sigma * sigma
    # z0 = sigma^2 log((1-q)/q) + 1/2, where q mu1 = (1 - q) mu0.
    z0 = sigma * sigma * (log_1mq - log_q) + 0.5
    g_a = special.gammaln(a + 1.0)
    g_k = special.gammaln(kk + 1.0)
    g_j = special.gammaln(j + 1.0)  # log|Gamma(alpha - k + 1)|
    first = kk == 0.0  # C(alpha, 0) = 1 exactly
    log_c = np.where(first, 0.0, g_a - g_k - g_j)
    sign = special.gammasgn(j + 1.0)  # sign of C(alpha, k)
    e0 = (kk * kk - kk) / two_s2
    e1 = (j * j - j) / two_s2
    n0 = special.log_ndtr((z0 - kk) / sigma)
    n1 = special.log_ndtr((j - z0) / sigma)
    p0a, p0b = kk * log_q, j * log_1mq
    p1a, p1b = j * log_q, kk * log_1mq
    t0 = log_c + p0a + p0b + e0 + n0
    t1 = log_c + p1a + p1b + e1 + n1
    mag = np.where(first, 0.0, np.abs(g_a) + np.abs(g_k) + np.abs(g_j))
    err0 = _ULPS * (1.0 + mag + np.abs(p0a) + np.abs(p0b) + np.abs(e0) + np.abs(n0))
    err1 = _ULPS * (1.0 + mag + np.abs(p1a) + np.abs(p1b) + np.abs(e1) + np.abs(n1))
    return t0, t1, sign, err0, err1


def _log_a_frac(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """Certified upper bound on log A_alpha for fractional orders (see module docstring).

    Terms are summed in blocks [start, end); column ``end`` is the first omitted term. All sums
    are scaled by the largest term of the first block, which contains every k <= ceil(alpha)
    and hence the largest term (terms decrease in magnitude for k >= ceil(alpha)).
    """
    n = alphas.size
    out = np.full(n, np.inf)
    scale = np.zeros(n)
    s_signed = np.zeros(n)
    s_abs = np.zeros(n)
    err = np.zeros(n)
    todo = np.arange(n)
    start, end = 0, int(math.ceil(float(alphas.max()))) + _FRAC_FIRST_BLOCK
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        while todo.size:
            al = alphas[todo]
            k = np.arange(start, end + 1, dtype=np.float64)
            t0, t1, sign, err0, err1 = _frac_terms(q, sigma, al, k)
            t = np.logaddexp(t0, t1)  # log of the combined term's magnitude
            if start == 0:
                scale[todo] = np.max(t[:, :-1], axis=1)
            m = scale[todo][:, None]
            w = np.exp(t[:, :-1] - m)
            s_signed[todo] += np.sum(sign[:, :-1] * w, axis=1)
            s_abs[todo] += np.sum(w, axis=1)
            err[todo] += np.sum(
                np.exp(t0[:, :-1] - m) * err0[:, :-1] + np.exp(t1[:, :-1] - m) * err1[:, :-1],
                axis=1,
            )
            nxt = np.exp(t[:, -1] - m[:, 0])
            ss, sa, e = s_signed[todo], s_abs[todo], err[todo]
            # Bound 1: alternating-series bracket (tail has the sign of the next term and is at
            # most its size), plus the floating-point allowance.
            upper_signed = ss + np.where(sign[:, -1] > 0, nxt, 0.0) + e
            # Bound 2: absolute series + exact tail sum_{k>=K} |C(alpha,k)| = K |C(alpha,K)|/alpha
            # times the (decreasing) remaining factor.
            upper_abs = sa + (end / al) * nxt * (1.0 + 1e-12) + e
            upper = np.where(
                np.isfinite(upper_signed) & (upper_signed > 0.0),
                np.fmin(upper_signed, upper_abs),
                upper_abs,
            )
            log_upper = m[:, 0] + np.log(upper)
            finite = np.isfinite(log_upper)
            done = ~finite | (nxt <= _FRAC_RTOL * upper) | (end >= _FRAC_MAX_TERMS)
            out[todo[done]] = np.where(finite[done], log_upper[done], np.inf)
            todo = todo[~done]
            start, end = end, min(2 * end, end + _FRAC_MAX_BLOCK)
    return out


# ----------------------------------------------------------------------------------------------
# RDP -> (epsilon, delta)


def rdp_to_epsilon(orders: object, rdp: object, delta: float) -> tuple[float, float]:
    """Smallest epsilon over the orders such that RDP implies (epsilon, delta)-DP.

    Canonne-Kamath-Steinke 2020 Prop. 12 (= Balle et al. 2020):
    ``eps = rdp + log1p(-1/alpha) - (log(delta) + log(alpha)) / (alpha - 1)``, and ``eps = 0``
    where ``delta^2 >= 1 - exp(-rdp)`` (KL bound). Mirrors dp_accounting's ``compute_epsilon``.

    Args:
      orders: Rényi orders (all > 1, finite).
      rdp: RDP value at each order (>= 0; ``+inf`` allowed).
      delta: target delta in (0, 1).

    Returns:
      ``(epsilon, optimal_order)``; ``epsilon >= 0``. If every order gives ``+inf`` the result is
      ``(inf, nan)``.
    """
    alphas = _orders(orders)
    r = _rdp_vector(rdp, alphas.size)
    d = _v.open_unit("delta", delta)
    return _rdp_to_epsilon(alphas, r, d)


def _rdp_to_epsilon(alphas: np.ndarray, r: np.ndarray, delta: float) -> tuple[float, float]:
    with np.errstate(invalid="ignore", over="ignore"):
        eps = r + np.log1p(-1.0 / alphas) - (math.log(delta) + np.log(alphas)) / (alphas - 1.0)
        eps = np.where(np.isnan(eps), np.inf, eps)
        eps = np.where(delta * delta + np.expm1(-r) > 0.0, 0.0, eps)
    i = int(np.argmin(eps))
    if not np.isfinite(eps[i]):
        return math.inf, math.nan
    return max(0.0, float(eps[i])), float(alphas[i])


def rdp_to_delta(orders: object, rdp: object, epsilon: float) -> tuple[float, float]:
    """Smallest delta over the orders such that RDP implies (epsilon, delta)-DP.

    The exact inverse of :func:`rdp_to_epsilon`'s bound:
    ``log(delta) = (alpha - 1) (rdp - epsilon + log1p(-1/alpha)) - log(alpha)``, combined with the
    KL bound ``delta <= sqrt(1 - exp(-rdp))``; capped at 1. Mirrors dp_accounting's
    ``compute_delta``.

    Args:
      orders: Rényi orders (all > 1, finite).
      rdp: RDP value at each order (>= 0; ``+inf`` allowed).
      epsilon: target epsilon (>= 0, finite).

    Returns:
      ``(delta, optimal_order)`` with ``0 <= delta <= 1``.
    """
    alphas = _orders(orders)
    r = _rdp_vector(rdp, alphas.size)
    eps = _v.non_negative("epsilon", epsilon)
    return _rdp_to_delta(alphas, r, eps)


def _rdp_to_delta(alphas: np.ndarray, r: np.ndarray, eps: float) -> tuple[float, float]:
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        log_d = (alphas - 1.0) * (r - eps + np.log1p(-1.0 / alphas)) - np.log(alphas)
        log_kl = 0.5 * np.log(-np.expm1(-r))
        log_d = np.fmin(np.where(np.isnan(log_d), np.inf, log_d), log_kl)
    i = int(np.argmin(log_d))
    return min(1.0, math.exp(min(float(log_d[i]), 0.0))), float(alphas[i])


# ----------------------------------------------------------------------------------------------
# convenience


def epsilon_subsampled_gaussian_rdp(
    noise_multiplier: float,
    sampling_prob: float,
    steps: int,
    delta: float,
    orders: object = DEFAULT_ORDERS,
) -> float:
    """Epsilon of ``steps`` compositions of the Poisson-subsampled Gaussian via RDP.

    RDP composes additively, so the per-step RDP is multiplied by ``steps`` before the
    Canonne-Kamath-Steinke conversion. Matches ``dp_accounting.rdp.RdpAccountant`` with a
    ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))`` composed ``steps`` times (up to the
    fractional-order difference described in the module docstring, which can only lower ours).

    Args:
      noise_multiplier: ``sigma`` (> 0, finite).
      sampling_prob: ``q`` in [0, 1].
      steps: number of steps (integer >= 1).
      delta: target delta in (0, 1).
      orders: Rényi orders to optimize over (default :data:`DEFAULT_ORDERS`).

    Returns:
      epsilon (>= 0, possibly ``inf``).
    """
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    q = _v.probability("sampling_prob", sampling_prob, allow_zero=True)
    t = _v.positive_int("steps", steps)
    d = _v.open_unit("delta", delta)
    alphas = _orders(orders)
    with np.errstate(over="ignore"):
        rdp = t * _subsampled_gaussian_rdp(sigma, q, alphas)
    return _rdp_to_epsilon(alphas, rdp, d)[0]
