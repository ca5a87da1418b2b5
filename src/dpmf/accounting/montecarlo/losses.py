"""Privacy-loss samples of the dominating pair for Monte Carlo accounting (Dong & Ganesh 2026).

Paper: "Privacy Amplification for BandMF via b-Min-Sep Subsampling" (arXiv 2602.09338), digest
``notes/bminsep-montecarlo.md``. For a non-negative lower-triangular encoder ``C`` and a sampling
scheme, the worst case over datasets is the matrix mechanism ``y = C x + z``,
``z ~ N(0, sigma^2 I_n)`` (paper Sec. 2.4, Lemma 4.5 of Choquette-Choo et al.), with

* ``P = E_x N(C x, sigma^2 I)``: the differing example is present, ``x`` its random
  participation pattern under the scheme (Sec. 2.6 of the digest);
* ``Q = N(0, sigma^2 I)``: the example is absent (zeroed out).

:func:`privacy_loss_samples` returns i.i.d. samples of the privacy loss in one *direction*:
``remove``: ``L = ln P(y)/Q(y)`` with ``y ~ P``; ``add``: ``L = ln Q(y)/P(y)`` with ``y ~ Q``.
The hockey-stick divergence of that direction is ``E[max(0, 1 - e^{eps - L})]``; epsilon is the
worst of both directions (DESIGN.md). Methods, by scheme (0-based steps; the paper is 1-based):

=====================================  ==================================================  ======
scheme                                 likelihood ratio                                    exact
=====================================  ==================================================  ======
``MinSepSampling`` (cold / warm)       backward DP, Thm 5.1 Eq. (1) and its warm-start     yes
                                       corollary, needs ``bands <= min_sep``
``MinSepSampling``, ``bands > min_sep`` App. B recursion (Lemma B.1), an upper bound on     remove
                                       ``P/Q`` (so only the remove direction is sound)     only
``MinSepSampling``, ``p = 1``          finite mixture of modes (warm = balls-in-bins       yes
                                       with ``T = min_sep``; cold = one Gaussian)
``MinSepSampling(max_batch_size)``     App. D: truncated/padded batches, ratio of the      yes
                                       ``P/R`` and ``Q/R`` DPs given the other examples'
                                       pre-truncation batch sizes ``r_i`` (needs
                                       ``dataset_size``)
multi-attribution (``max_user_         Thm 6.1: DP with ``Binomial(k_u, p)`` participation  yes
examples``)                            counts, cold start (it dominates warm start)
``BallsInBinsSampling``                log-mean-exp over the ``T`` modes ``C x^(s)``       yes
``PoissonSampling``                    ``sum_i ln((1-p) + p e^{llr_i})``; for a diagonal  yes
                                       ``C`` exact, otherwise App. B with ``r = 1``        (remove
                                                                                           only)
``CyclicPoissonSampling``              ``partition="independent"``: log-mean-exp over the  yes
(needs ``bands <= cycle_length``)      ``T`` phases of products of subsampled Gaussians;
                                       ``"equal"``: the worst phase, i.e. a composition of  (see
                                       subsampled Gaussians with the largest column norm    note)
                                       of any phase in each round (a real phase for
                                       Toeplitz C; otherwise a dominating virtual phase,
                                       ``exact=False``, still sound in both directions)
=====================================  ==================================================  ======

"Exact" means the loss of the dominating pair itself; App. D's pair is for an adversary who also
sees the other examples' batch sizes ``r_i`` (the paper's analysis), and Thm 6.1's pair is
cold-started. An App. B upper bound on ``P/Q`` only makes delta of the *remove* direction
conservative, so the add direction is refused there (:func:`loss_sampler_support`).

Balls-in-bins and ``p = 1`` never materialize ``y``: the loss only depends on the ``T`` inner
products ``u = M y`` with the modes ``M`` (rows ``C x^(s)``), and ``u ~ N(M C x, sigma^2 M M^T)``
is drawn directly (``T`` normals per sample instead of ``n``).

Everything is float64. Two backends: ``"compiled"`` (default; b-min-sep, ``p = 1``,
balls-in-bins: numba kernels in ``_compiled.py`` with xoshiro256++/ziggurat normals) and the
numpy reference (every scheme; vectorized over samples, ``_loss_kernels.py``). Both compute
``C^T y`` by blocked BLAS products and run the DP rescaled in linear space with a log-space
fallback. Samples are processed in chunks of ``clip(2**21 / n, 1024, 8192)``, so
memory is ``O(n * chunk)`` whatever ``num_samples`` is. Results are a deterministic function of
the generator state and the arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpmf import validation as _v
from dpmf.accounting.reductions import identity_epochs_reduction
from dpmf.accounting.user_level import single_example_users_reduction
from dpmf.accounting.montecarlo._loss_kernels import (
    Bands,
    backward_dp,
    banded_matvec,
    log_mix,
    logaddexp,
    logsumexp_rows,
)
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.resources import check_allocation

__all__ = [
    "loss_sampler_support",
    "describe_loss_sampler",
    "privacy_loss_samples",
    "log_likelihood_ratio",
    "DIRECTIONS",
    "BACKENDS",
]

DIRECTIONS = ("remove", "add")
BACKENDS = ("compiled", "numpy")
_CHUNK_ELEMENTS = 1 << 21  # values of y (n x S) per chunk: 16 MiB per float64 array (more if n > 2048)
_MAX_CHUNK = 8192
_MIN_CHUNK = 1024


# ============================================================================ strategy -> bands
def strategy_bands(strategy) -> Bands:
    """The non-negative lower-triangular encoder as :class:`Bands`, or a DPMFError."""
    coefs = getattr(strategy, "coefs", None)
    n = getattr(strategy, "n", None)
    if coefs is not None and n is not None and not hasattr(strategy, "C"):
        c = np.asarray(coefs, dtype=np.float64)
        if c.ndim != 1 or not np.all(np.isfinite(c)):
            raise InvalidParameterError("strategy.coefs must be a finite 1-d array")
        if np.any(c < 0):
            i = int(np.flatnonzero(c < 0)[0])
            raise UnsupportedConfigurationError(
                f"amplification by sampling needs a non-negative encoder C; strategy.coefs[{i}] = {c[i]!r} < 0"
            )
        nz = np.flatnonzero(c[: int(n)])
        check_allocation(int(n), int(nz[-1]) + 1 if nz.size else 1, "Monte Carlo accounting's band of C")
        return Bands.from_coefs(c, int(n))
    if getattr(strategy, "name", None) == "identity" and n is not None:
        check_allocation(int(n), 1, "Monte Carlo accounting's band of C")
        return Bands(np.ones((int(n), 1)), toeplitz=np.ones(1))
    encoder = getattr(strategy, "encoder", None)
    if encoder is None:
        raise InvalidParameterError(
            f"strategy must be a dpmf strategy (ToeplitzStrategy, Identity, DenseStrategy, ...), got {type(strategy).__name__}"
        )
    from dpmf.accounting.cost import strategy_shape, check_dense_fits

    rows, n_cols = strategy_shape(strategy)
    if rows != n_cols:  # (e.g. the binary tree, (2n - 1) x n): refused without building it
        raise UnsupportedConfigurationError(f"Monte Carlo accounting needs a square encoder C, got shape ({rows}, {n_cols})")
    check_dense_fits(strategy, "Monte Carlo accounting")  # before numpy's MemoryError
    C = np.asarray(encoder(), dtype=np.float64)
    if C.ndim != 2 or C.shape[0] != C.shape[1]:
        raise UnsupportedConfigurationError(f"Monte Carlo accounting needs a square encoder C, got shape {C.shape}")
    if not np.all(np.isfinite(C)):
        raise InvalidParameterError("the encoder C must be finite")
    if np.any(np.triu(C, 1) != 0):
        raise UnsupportedConfigurationError("Monte Carlo accounting needs a lower-triangular encoder C (adaptive streams)")
    if np.any(C < 0):
        i, j = np.argwhere(C < 0)[0]
        raise UnsupportedConfigurationError(
            f"amplification by sampling needs a non-negative encoder C; C[{i}, {j}] = {C[i, j]!r} < 0"
        )
    return Bands.from_dense(C)


# ============================================================================ scheme -> plan
@dataclass(frozen=True)
class _Plan:
    method: str  # minsep | minsep-bound | modes | poisson | cyclic-independent | cyclic-equal | truncated
    exact: bool
    directions: tuple[str, ...]
    note: str = ""


def _scheme_name(scheme) -> str:
    if getattr(scheme, "max_user_examples", None) is not None:
        return "multi-attribution"
    return getattr(scheme, "name", type(scheme).__name__)


def _plan(bands: Bands, scheme) -> _Plan:
    name = _scheme_name(scheme)
    steps = getattr(scheme, "steps", None)
    if steps is None:
        raise InvalidParameterError(f"scheme must be a dpmf sampling scheme, got {type(scheme).__name__}")
    if int(steps) != bands.n:
        raise InvalidParameterError(
            f"scheme.steps must equal the number of steps of the strategy (n = {bands.n}), got {steps}"
        )
    w = bands.w
    both = DIRECTIONS
    if name == "multi-attribution":
        b = int(scheme.min_sep)
        if w > b:
            raise UnsupportedConfigurationError(
                f"multi-attribution b-min-sep (Thm 6.1) needs min_sep >= bands of C; got min_sep={b}, bands={w}"
            )
        _v.positive_int("max_user_examples", scheme.max_user_examples)
        return _Plan("minsep", True, both, "Thm 6.1, cold start")
    if name == "b-min-sep":
        b, p = int(scheme.min_sep), float(scheme.sampling_prob)
        if getattr(scheme, "max_batch_size", None) is not None:
            if w > b:
                raise UnsupportedConfigurationError(
                    f"truncated b-min-sep (App. D) needs min_sep >= bands of C; got min_sep={b}, bands={w}"
                )
            return _Plan("truncated", True, both, "App. D (the adversary also sees r_i)")
        if w > b:
            return _Plan(
                "minsep-bound",
                False,
                ("remove",),
                f"C has {w} bands > min_sep={b}: App. B upper bound on P/Q, sound for the remove direction only",
            )
        if p == 1.0:
            return _Plan("modes", True, both, "p = 1: finite mixture of modes")
        return _Plan("minsep", True, both, "Thm 5.1")
    if name == "balls-in-bins":
        if getattr(scheme, "reused_single_slot", True):
            return _Plan("modes", True, both, "log-mean-exp over T modes")
        K = _allocation_mode_count(scheme)
        if K > MAX_MODES:
            raise UnsupportedConfigurationError(
                f"Monte Carlo for balls-in-bins with num_selected={scheme.num_selected}, fresh_slots="
                f"{scheme.fresh_slots} enumerates every participation pattern (C(b, k) per epoch, to the power "
                f"epochs when fresh): {K:.3g} patterns > {MAX_MODES}; use fewer steps per epoch or epochs, or "
                "method='unamplified'"
            )
        return _Plan("modes", True, both, f"log-mean-exp over {K} participation patterns")
    if name in ("poisson", "cyclic-poisson") and getattr(scheme, "max_batch_size", None) is not None:
        raise UnsupportedConfigurationError(  # (dpmf.accounting.truncated covers it; it imports this module)
            f"Monte Carlo accounting does not analyse truncated batches (max_batch_size={scheme.max_batch_size}); "
            "use method='truncated_pld'"
        )
    if name == "poisson":
        if w == 1:
            return _Plan("poisson", True, both, "independent subsampled Gaussians")
        return _Plan(
            "poisson",
            False,
            ("remove",),
            f"C has {w} bands: App. B bound with r = 1, sound for the remove direction only",
        )
    if name == "cyclic-poisson":
        T = int(scheme.cycle_length)
        if w > T:
            raise UnsupportedConfigurationError(
                f"cyclic Poisson Monte Carlo needs cycle_length >= bands of C (disjoint columns per phase); "
                f"got cycle_length={T}, bands={w}"
            )
        if scheme.partition == "independent":
            return _Plan("cyclic-independent", True, both, "log-mean-exp over phases")
        K = -(-bands.n // T)
        sq = np.zeros(K * T)
        sq[: bands.n] = bands.sq
        phases = np.sqrt(sq.reshape(K, T).T)  # row g: column norms of phase g, round by round
        if np.any(np.all(phases == _worst_phase_norms(bands, T), axis=1)):
            return _Plan("cyclic-equal", True, both, "a real phase has the largest column norm in every round")
        return _Plan(
            "cyclic-equal",
            False,
            both,
            "no single worst phase: a virtual phase with the largest column norm at every round "
            "dominates all phases (monotone coupling), sound in both directions but not tight",
        )
    raise UnsupportedConfigurationError(
        f"no Monte Carlo privacy-loss sampler for scheme {name!r} "
        "(supported: b-min-sep, multi-attribution b-min-sep, balls-in-bins, poisson, cyclic-poisson)"
    )


def describe_loss_sampler(strategy, scheme) -> dict:
    """What :func:`privacy_loss_samples` would do: ``method``, ``exact``, ``directions``, ``note``.

    ``exact=False`` means the per-sample loss is an upper bound on ``ln P/Q`` (App. B, Lemma B.1):
    delta estimates of the remove direction are then conservative and the add direction is not
    available. Raises a :class:`~dpmf.errors.DPMFError` when the pair is not supported.
    """
    plan = _plan(strategy_bands(strategy), scheme)
    return {"method": plan.method, "exact": plan.exact, "directions": plan.directions, "note": plan.note}


def loss_sampler_support(strategy, scheme, direction: str | None = None) -> str | None:
    """``None`` if losses can be sampled for ``(strategy, scheme)``, else the reason (a sentence).

    ``direction=None`` asks for both directions (what an epsilon needs); ``"remove"`` or ``"add"``
    asks for one.
    """
    if direction is not None and direction not in DIRECTIONS:
        raise InvalidParameterError(f"direction must be 'remove', 'add' or None, got {direction!r}")
    try:
        plan = _plan(strategy_bands(strategy), scheme)
    except (InvalidParameterError, UnsupportedConfigurationError) as exc:
        return str(exc)
    wanted = DIRECTIONS if direction is None else (direction,)
    missing = [d for d in wanted if d not in plan.directions]
    if missing:
        return f"the {'/'.join(missing)} direction is not available: {plan.note}"
    return None


# ============================================================================ participation
def _first_available(scheme, S: int, rng: np.random.Generator, warm: bool) -> np.ndarray:
    """First step at which the example is available: 0 (cold) or the stationary state (warm)."""
    b, p = int(scheme.min_sep), float(scheme.sampling_prob)
    if not warm or b == 1:
        return np.zeros(S, dtype=np.int64)
    probs = np.full(b, p / (1.0 + (b - 1) * p))
    probs[0] = 1.0 / (1.0 + (b - 1) * p)
    return rng.choice(b, size=S, p=probs / probs.sum()).astype(np.int64)


def _participations(n: int, b: int, q: float, start: np.ndarray, rng: np.random.Generator):
    """Yield ``(t, s)`` rounds of the b-min-sep renewal chain (participation prob ``q`` per step).

    Each round holds at most one participation per sample ``s``; after participating at ``t`` the
    example is barred for ``t+1 .. t+b-1`` (Alg. 1/2).
    """
    idx = np.arange(start.size)
    nxt = start.copy()
    while idx.size:
        t = nxt + rng.geometric(q, size=idx.size) - 1
        keep = t < n
        idx, t = idx[keep], t[keep]
        if not idx.size:
            return
        yield t, idx
        nxt = t + b


def _chunks(num_samples: int, n: int):
    # at least _MIN_CHUNK samples per vector operation: the DP makes ~3 numpy calls per step
    size = int(min(_MAX_CHUNK, max(_MIN_CHUNK, _CHUNK_ELEMENTS // max(n, 1))))
    return _chunks_of(num_samples, size)


def _chunks_of(total: int, size: int):
    """``(start, length)`` of consecutive chunks of at most ``size`` samples."""
    for lo in range(0, total, size):
        yield lo, min(size, total - lo)


# ============================================================================ log P/Q given y
def _llr(bands: Bands, d: np.ndarray, sigma: float, scale: float = 1.0) -> np.ndarray:
    """In place: ``(2 scale d_i - scale^2 ||c_i||^2) / (2 sigma^2)``, the log N(scale c_i)/N(0)."""
    d *= scale / sigma**2
    d -= (scale**2 * bands.sq / (2 * sigma**2))[:, None]
    return d


def _binomial_log_pmf(k: int, p: float) -> np.ndarray:
    """``ln P(Binomial(k, p) = j)`` for ``j = 0..k`` (``-inf`` where the mass is 0)."""
    j = np.arange(k + 1)
    if p == 1.0:
        out = np.full(k + 1, -np.inf)
        out[k] = 0.0
        return out
    logc = np.array([math.lgamma(k + 1) - math.lgamma(i + 1) - math.lgamma(k - i + 1) for i in j])
    return logc + j * math.log(p) + (k - j) * math.log1p(-p)


def _minsep_log_ratio(bands, scheme, sigma, d, plan_method) -> np.ndarray:
    """ln P/Q from ``d = C^T y`` (overwritten) for b-min-sep / multi-attribution / App. B."""
    b, p = int(scheme.min_sep), float(scheme.sampling_prob)
    k = getattr(scheme, "max_user_examples", None)
    if k is not None:  # Thm 6.1: f_i = (1-p)^k f_{i+1} + sum_j Binom(k,p)_j N(j c_i)/N(0) f_{i+b}
        k = int(k)
        logw = _binomial_log_pmf(k, p)
        base = d / sigma**2
        terms = np.empty((k,) + d.shape)
        for j in range(1, k + 1):
            terms[j - 1] = logw[j] + j * base - (j * j * bands.sq / (2 * sigma**2))[:, None]
        log_part = terms[0] if k == 1 else _logsumexp0(terms)
        log_stay = k * math.log1p(-p) if p < 1 else -math.inf
        return backward_dp(log_part, log_stay, b)  # cold start dominates warm start (Sec. 6.2)
    # exponent of step i: ln p + llr_i = d_i / sigma^2 - (||c_i||^2 / (2 sigma^2) - ln p)
    affine = (1.0 / sigma**2, bands.sq / (2 * sigma**2) - math.log(p))
    log_stay = math.log1p(-p) if p < 1 else -math.inf
    warm = bool(getattr(scheme, "warm_start", False)) and b > 1
    return backward_dp(d, log_stay, b, warm_log_p=math.log(p) if warm else None, affine=affine)


def _logsumexp0(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=0)
    return m + np.log(np.exp(x - m).sum(axis=0))


def _poisson_log_ratio(bands, p, sigma, d) -> np.ndarray:
    return log_mix(_llr(bands, d, sigma), p).sum(axis=0)


def _cyclic_independent_log_ratio(bands, T, p, sigma, d) -> np.ndarray:
    n, S = d.shape
    mix = log_mix(_llr(bands, d, sigma), p)
    K = -(-n // T)
    padded = np.zeros((K * T, S))
    padded[:n] = mix
    per_phase = padded.reshape(K, T, S).sum(axis=0)
    return logsumexp_rows(per_phase) - math.log(T)


def log_likelihood_ratio(strategy, scheme, noise_multiplier: float, y, *, rest_batch_sizes=None) -> np.ndarray:
    """``ln P(y)/Q(y)`` of the dominating pair for outputs ``y`` (shape ``(n,)`` or ``(n, S)``).

    The exact dynamic programs of the table in the module docstring (an upper bound where
    :func:`describe_loss_sampler` says ``exact=False``). Truncated b-min-sep also needs the other
    examples' pre-truncation batch sizes ``rest_batch_sizes`` (same shape as ``y``). Meant for
    tests and diagnostics; :func:`privacy_loss_samples` is the fast path.

    >>> import numpy as np
    >>> from dpmf.strategies import Identity
    >>> from dpmf.sampling import PoissonSampling
    >>> y = np.array([0.3, -1.0])
    >>> val = log_likelihood_ratio(Identity(2), PoissonSampling(0.5, 2), 1.0, y)
    >>> exact = np.log((0.5 + 0.5 * np.exp(y - 0.5))).sum()
    >>> bool(abs(val - exact) < 1e-12)
    True
    """
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    bands = strategy_bands(strategy)
    plan = _plan(bands, scheme)
    Y = np.asarray(y, dtype=np.float64)
    one = Y.ndim == 1
    if one:
        Y = Y[:, None]
    if Y.ndim != 2 or Y.shape[0] != bands.n:
        raise InvalidParameterError(f"y must have shape (n,) or (n, S) with n = {bands.n}, got {np.shape(y)}")
    if plan.method == "truncated":
        if rest_batch_sizes is None:
            raise InvalidParameterError("rest_batch_sizes is required for truncated b-min-sep (App. D)")
        r = np.asarray(rest_batch_sizes)
        r = r[:, None] if r.ndim == 1 else r
        if r.shape != Y.shape:
            raise InvalidParameterError(f"rest_batch_sizes must have the shape of y {Y.shape}, got {r.shape}")
        out = _truncated_log_ratio(bands, scheme, sigma, bands.dots(Y), r)
    else:
        out = _log_ratio_from_dots(bands, scheme, plan, sigma, bands.dots(Y))
    return out[0] if one else out


def _log_ratio_from_dots(bands, scheme, plan, sigma, d) -> np.ndarray:
    m = plan.method
    if m in ("minsep", "minsep-bound"):
        return _minsep_log_ratio(bands, scheme, sigma, d, m)
    if m == "modes":
        M, logw = _modes(bands, scheme)
        # u_s = <C x^(s), y> = (x^(s))^T (C^T y) = (x^(s))^T d
        X = _mode_patterns(bands.n, scheme)
        u = X @ d
        G = np.einsum("sn,sn->s", M, M)
        return logsumexp_rows(logw[:, None] + (2 * u - G[:, None]) / (2 * sigma**2))
    if m == "poisson":
        return _poisson_log_ratio(bands, float(scheme.sampling_prob), sigma, d)
    if m == "cyclic-independent":
        return _cyclic_independent_log_ratio(bands, int(scheme.cycle_length), float(scheme.sampling_prob), sigma, d)
    if m == "cyclic-equal":
        T, p = int(scheme.cycle_length), float(scheme.sampling_prob)
        norms = _worst_phase_norms(bands, T)
        # the worst phase is realised by phase 0 when its norms are the largest (Toeplitz C);
        # given y, evaluate phase 0's ratio (a function of d at steps 0, T, 2T, ...)
        steps = np.arange(0, bands.n, T)
        if not np.array_equal(norms, np.sqrt(bands.sq[steps])):
            raise UnsupportedConfigurationError(
                "log_likelihood_ratio for equal-partition cyclic Poisson is only defined when phase 0 "
                "is the worst phase (non-increasing column norms, e.g. Toeplitz C)"
            )
        llr = _llr(bands, d, sigma)[steps]
        return log_mix(llr, p).sum(axis=0)
    raise AssertionError(m)  # pragma: no cover


# ============================================================================ modes (p = 1, BiB)
#: Most participation patterns the mode mixture enumerates for the balls-in-bins variants
#: (``num_selected > 1`` or fresh slots): each sample costs ``K min(K, n)`` flops.
MAX_MODES = 4096


def _allocation_mode_count(scheme) -> float:
    """Participation patterns of a balls-in-bins scheme: ``C(b, k)``, to the power ``epochs`` when
    the slots are fresh (a float: it can be astronomically large)."""
    per_epoch = float(math.comb(int(scheme.steps_per_epoch), int(scheme.num_selected)))
    return per_epoch ** int(scheme.epochs) if scheme.fresh_slots else per_epoch


def _allocation_patterns(n: int, scheme) -> np.ndarray:
    """Every 0/1 pattern of a balls-in-bins scheme (rows, equally likely): a ``k``-subset of the
    ``b`` steps of each epoch, the same subset every epoch (reused) or one per epoch (fresh)."""
    from itertools import combinations

    b, k, E = int(scheme.steps_per_epoch), int(scheme.num_selected), int(scheme.epochs)
    subsets = np.zeros((math.comb(b, k), b))
    for r, c in enumerate(combinations(range(b), k)):
        subsets[r, list(c)] = 1.0
    if not scheme.fresh_slots:
        return np.tile(subsets, (1, E))[:, :n]
    out = subsets
    for _ in range(E - 1):  # Cartesian product, epoch by epoch
        out = np.concatenate([np.repeat(out, subsets.shape[0], axis=0), np.tile(subsets, (out.shape[0], 1))], axis=1)
    return out[:, :n]


def _mode_patterns(n: int, scheme) -> np.ndarray:
    """0/1 patterns ``x^(s)`` (rows) of the finite mixtures: balls-in-bins, b-min-sep with p = 1."""
    name = _scheme_name(scheme)
    if name == "balls-in-bins" and not getattr(scheme, "reused_single_slot", True):
        return _allocation_patterns(n, scheme)
    if name == "balls-in-bins":
        T = int(scheme.steps_per_epoch)
        starts = np.arange(T)
    else:  # b-min-sep with p = 1
        T = int(scheme.min_sep)
        starts = np.arange(T) if (scheme.warm_start and T > 1) else np.zeros(1, dtype=np.int64)
    i = np.arange(n)
    return ((i[None, :] >= starts[:, None]) & ((i[None, :] - starts[:, None]) % T == 0)).astype(np.float64)


def _modes(bands: Bands, scheme) -> tuple[np.ndarray, np.ndarray]:
    """Mode means ``M`` (rows ``C x^(s)``) and log mixture weights (uniform in every use here)."""
    X = _mode_patterns(bands.n, scheme)
    M = banded_matvec(bands, X.T).T
    return M, np.full(X.shape[0], -math.log(X.shape[0]))


def _factor(G: np.ndarray) -> np.ndarray:
    """``R`` with ``R R^T = G`` (Cholesky, or a symmetric square root if ``G`` is singular)."""
    try:
        return np.linalg.cholesky(G)
    except np.linalg.LinAlgError:
        lam, V = np.linalg.eigh(G)
        return V * np.sqrt(np.clip(lam, 0.0, None))


def _sample_modes(bands, scheme, sigma, S, rng, direction, state=None) -> np.ndarray:
    """Losses of a uniform mixture of ``K`` modes from ``K`` normals per sample.

    ``u = M y`` with ``M`` the mode means (rows ``C x^(s)``) is all the loss depends on:
    ``ln P/Q = logsumexp_s(ln w_s + (2 u_s - G_ss)/(2 sigma^2))`` with ``G = M M^T``. Under P
    (mode ``s*``) ``u ~ N(G[:, s*], sigma^2 G)``; under Q ``u ~ N(0, sigma^2 G)``. With
    ``R R^T = G`` this is ``u = G[:, s*] + sigma R w``, ``w ~ N(0, I_K)``. With ``state`` (the
    compiled backend) ``w`` and ``s*`` come from xoshiro256++ instead of ``rng``.
    """
    M, logw = _modes(bands, scheme)
    G = M @ M.T
    K = G.shape[0]
    # R R^T = G: a factor of G, or M itself when there are more modes than steps (then w ~ N(0, I_n))
    R = M if K > M.shape[1] else _factor(G)
    A = np.ascontiguousarray(R.T) / sigma  # (w @ A)_s = sigma (R w)_s / sigma^2
    Gs = G / sigma**2  # symmetric: row s* = column s*
    h = logw - np.diag(G) / (2 * sigma**2)
    out = np.empty(S)
    for lo, m in _chunks(S, K):
        if state is None:
            W = rng.standard_normal((m, A.shape[0]))
            star = rng.integers(0, K, size=m) if (direction == "remove" and K > 1) else None
        else:
            from dpmf.accounting.montecarlo._xoshiro import fill_indices, fill_normal

            W = np.empty((m, A.shape[0]))
            fill_normal(W.reshape(-1), state)
            star = None
            if direction == "remove" and K > 1:
                star = np.empty(m, dtype=np.int64)
                fill_indices(state, K, star)
        X = W @ A
        if direction == "remove":
            X += Gs[star] if star is not None else Gs[0]
        X += h
        top = X.max(axis=1)
        X -= top[:, None]
        np.exp(X, out=X)
        L = np.log(X.sum(axis=1)) + top
        out[lo : lo + m] = L if direction == "remove" else -L
    return out


# ============================================================================ compiled kernels
def _compiled_ok(plan: _Plan, scheme) -> bool:
    if plan.method == "modes":
        return True
    return plan.method in ("minsep", "minsep-bound") and getattr(scheme, "max_user_examples", None) is None


def _sample_compiled(bands, scheme, plan, sigma, S, rng, direction) -> np.ndarray:
    """The fused numba kernels (``_compiled.py``); ``S`` losses, xoshiro256++ seeded from ``rng``."""
    from dpmf.accounting.montecarlo._compiled import minsep_dp, minsep_exponents
    from dpmf.accounting.montecarlo._xoshiro import seed_state

    state = seed_state(rng)
    if plan.method == "modes":
        return _sample_modes(bands, scheme, sigma, S, rng, direction, state=state)
    out = np.empty(S)
    remove = direction == "remove"
    b, p = int(scheme.min_sep), float(scheme.sampling_prob)
    warm = bool(getattr(scheme, "warm_start", False)) and b > 1
    colsT, coefs, toeplitz = _kernel_bands(bands)
    n = bands.n
    size = int(min(S, max(64, _KERNEL_CHUNK_ELEMENTS // n)))
    X = np.empty((n, size))
    E = np.empty((n, size))
    F = np.empty((n + b, size))
    h = bands.sq / (2 * sigma**2) - math.log(p)
    for lo, m in _chunks_of(S, size):
        # outputs, d = C^T y and the exponents in one compiled pass (time-major (n, m))
        minsep_exponents(colsT, coefs, toeplitz, sigma, p, b, warm, remove, state, 1.0 / sigma**2, h, X[:, :m])
        with np.errstate(over="ignore"):  # e^{x} = inf sends a sample to the log-space fallback
            np.exp(X[:, :m], out=E[:, :m])
        minsep_dp(X[:, :m], E[:, :m], p, b, warm, F[:, :m], out[lo : lo + m])
    if not remove:
        np.negative(out, out=out)
    return out


_KERNEL_CHUNK_ELEMENTS = 1 << 16  # outputs per compiled chunk (512 KiB per array: stays in L2)


def _kernel_bands(bands: Bands) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(colsT, coefs, toeplitz)`` for the compiled kernels: the coefficient vector of a Toeplitz
    ``C`` (then ``colsT`` is a dummy), else the bands as rows ``colsT[k, i] = C[i + k, i]``."""
    if bands.toeplitz is not None:
        return np.zeros((1, 1)), np.ascontiguousarray(bands.toeplitz, dtype=np.float64), True
    return np.ascontiguousarray(bands.cols.T), np.zeros(1), False


# ============================================================================ cyclic, equal partition
def _worst_phase_norms(bands: Bands, T: int) -> np.ndarray:
    """Column norms of a phase that dominates every phase: ``max_g ||c_{g + kT}||`` for each k."""
    n = bands.n
    K = -(-n // T)
    sq = np.zeros(K * T)
    sq[:n] = bands.sq
    return np.sqrt(sq.reshape(K, T).max(axis=1))


def _sample_cyclic_equal(bands, scheme, sigma, S, rng, direction) -> np.ndarray:
    """Composition of subsampled Gaussians with sensitivities ``s_k`` (the worst phase).

    Columns of one phase are disjoint (``bands <= T``), so ``u_k = <c_k, y> ~ x_k s_k^2 +
    sigma s_k z_k`` independently and ``ln P/Q = sum_k ln((1-p) + p exp((2 u_k - s_k^2)/(2 sigma^2)))``.
    """
    T, p = int(scheme.cycle_length), float(scheme.sampling_prob)
    s = _worst_phase_norms(bands, T)
    s = s[s > 0]
    K = s.size
    out = np.empty(S)
    for lo, m in _chunks(S, K):
        u = rng.standard_normal((K, m)) * (sigma * s)[:, None]
        if direction == "remove":
            x = rng.random((K, m)) < p
            u += x * (s * s)[:, None]
        llr = (2 * u - (s * s)[:, None]) / (2 * sigma**2)
        L = log_mix(llr, p).sum(axis=0)
        out[lo : lo + m] = L if direction == "remove" else -L
    return out


# ============================================================================ generic y sampling
def _sample_y(bands, scheme, plan, sigma, m, rng, direction) -> np.ndarray:
    """``y`` from P (remove) or Q (add), *sample-major* ``(m, n)`` (one contiguous row per sample)."""
    n = bands.n
    y = rng.standard_normal((m, n))
    y *= sigma
    if direction == "add":
        return y
    meth = plan.method
    if meth == "poisson":
        x = (rng.random((m, n)) < float(scheme.sampling_prob)).astype(np.float64)
        bands.add_matvec_sm(y, x)
        return y
    if meth == "cyclic-independent":
        T, p = int(scheme.cycle_length), float(scheme.sampling_prob)
        g = rng.integers(0, T, size=m)
        for t0 in range(0, n, T):
            t = g + t0
            s = np.flatnonzero((t < n) & (rng.random(m) < p))
            bands.add_columns_sm(y, t[s], s)
        return y
    # b-min-sep family (exact DP, App. B bound, multi-attribution)
    b, p = int(scheme.min_sep), float(scheme.sampling_prob)
    k = getattr(scheme, "max_user_examples", None)
    if k is not None:
        k = int(k)
        q = -math.expm1(k * math.log1p(-p)) if p < 1 else 1.0  # P(Binom(k, p) >= 1)
        logw = _binomial_log_pmf(k, p)[1:]
        cdf = np.cumsum(np.exp(logw - np.logaddexp.reduce(logw)))
        cdf[-1] = 1.0
        means = _Means(bands, y, 1.0 / (1.0 / q + b - 1))
        for t, s in _participations(n, b, q, np.zeros(m, dtype=np.int64), rng):
            cnt = np.searchsorted(cdf, rng.random(t.size), side="right") + 1
            means.add(t, s, cnt.astype(np.float64))
        return means.finish()
    start = _first_available(scheme, m, rng, bool(getattr(scheme, "warm_start", False)))
    means = _Means(bands, y, 1.0 / (1.0 / p + b - 1))
    for t, s in _participations(n, b, p, start, rng):
        means.add(t, s)
    return means.finish()


class _Means:
    """Adds ``C x`` to sample-major ``y`` for sparse participations ``x``: scatter the columns
    when participations are rare, else collect ``x`` and use the blocked BLAS product (a
    fancy-indexed write costs ~40 ns, a flop of the product ~0.03 ns)."""

    def __init__(self, bands: Bands, y: np.ndarray, rate: float) -> None:
        self.bands, self.y = bands, y
        w = bands.w
        self.x = np.zeros_like(y) if (w == 1 or rate * w * 700 > max(32, w) + w) else None

    def add(self, t: np.ndarray, s: np.ndarray, coef: np.ndarray | float = 1.0) -> None:
        if self.x is not None:
            self.x[s, t] = coef
        else:
            self.bands.add_columns_sm(self.y, t, s, coef)

    def finish(self) -> np.ndarray:
        if self.x is not None:
            self.bands.add_matvec_sm(self.y, self.x)
        return self.y


# ============================================================================ public entry point
def privacy_loss_samples(
    strategy,
    scheme,
    noise_multiplier: float,
    num_samples: int,
    rng: np.random.Generator,
    *,
    direction: str = "remove",
    dataset_size: int | None = None,
    backend: str = "compiled",
) -> np.ndarray:
    """``num_samples`` i.i.d. privacy losses of the dominating pair (float64, ``+inf`` allowed).

    ``direction="remove"``: ``L = ln P(y)/Q(y)`` with ``y ~ P`` (example present);
    ``"add"``: ``L = ln Q(y)/P(y)`` with ``y ~ Q``. Then ``delta(eps) = E[max(0, 1 - e^{eps - L})]``
    for that direction (Dong & Ganesh 2026, Sec. 2.5, App. A). ``noise_multiplier`` is sigma for
    ``strategy`` as given (``y = C x + N(0, sigma^2 I)``, clip norm 1). Methods per scheme: module
    docstring. ``dataset_size`` (number of examples; default ``scheme.dataset_size`` if the scheme
    has that field) is needed by truncated b-min-sep (``scheme.max_batch_size`` set; App. D).

    Deterministic given the state of ``rng`` (a ``numpy.random.Generator``) and ``backend``.
    ``backend="compiled"`` (default) runs b-min-sep (single attribution, untruncated), ``p = 1``
    and balls-in-bins in fused numba kernels (``_compiled.py``; normals from xoshiro256++ seeded by
    ``rng``); ``"numpy"`` is the vectorized reference. Both sample the same distribution, from
    different random streams. Memory is bounded (samples are processed in chunks of
    ``clip(2**21 / n, 1024, 8192)``; the compiled kernels keep three length-``n`` buffers).

    >>> import numpy as np
    >>> from dpmf.strategies import ToeplitzStrategy
    >>> from dpmf.sampling import MinSepSampling
    >>> C = ToeplitzStrategy(np.array([1.0, 0.5]), 16)
    >>> L = privacy_loss_samples(C, MinSepSampling(0.2, 16, 2), 1.0, 1000, np.random.default_rng(0))
    >>> L.shape, L.dtype
    ((1000,), dtype('float64'))
    >>> bool(abs(np.mean(np.exp(-L)) - 1) < 0.1)  # E_P[Q/P] = 1
    True
    """
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    S = _v.positive_int("num_samples", num_samples)
    if not isinstance(rng, np.random.Generator):
        raise InvalidParameterError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if direction not in DIRECTIONS:
        raise InvalidParameterError(f"direction must be 'remove' or 'add', got {direction!r}")
    if backend not in BACKENDS:
        raise InvalidParameterError(f"backend must be one of {BACKENDS}, got {backend!r}")
    reduction = identity_epochs_reduction(strategy, scheme)
    if reduction is not None:  # equal in law, k times fewer steps (dpmf.accounting.reductions)
        strategy, scheme, sigma = reduction.strategy, reduction.scheme, sigma * reduction.noise_scale
    scheme = single_example_users_reduction(scheme) or scheme  # k_u = 1: the same pair (accounting.user_level)
    bands = strategy_bands(strategy)
    plan = _plan(bands, scheme)
    if direction not in plan.directions:
        raise UnsupportedConfigurationError(f"the {direction} direction is not available: {plan.note}")
    if plan.method == "truncated":
        if dataset_size is None:
            dataset_size = getattr(scheme, "dataset_size", None)
        if dataset_size is None:
            raise InvalidParameterError(
                "dataset_size is required for truncated b-min-sep (scheme.max_batch_size is set; App. D): "
                "pass dataset_size=... (the number of examples, public under zero-out adjacency)"
            )
        size = _v.positive_int("dataset_size", dataset_size)
        return _sample_truncated(bands, scheme, sigma, S, rng, direction, size)
    if backend == "compiled" and _compiled_ok(plan, scheme):
        return _sample_compiled(bands, scheme, plan, sigma, S, rng, direction)
    if plan.method == "modes":
        return _sample_modes(bands, scheme, sigma, S, rng, direction)
    if plan.method == "cyclic-equal":
        return _sample_cyclic_equal(bands, scheme, sigma, S, rng, direction)
    out = np.empty(S)
    for lo, m in _chunks(S, bands.n):
        y = _sample_y(bands, scheme, plan, sigma, m, rng, direction)
        d = bands.dots_sm(y)
        del y
        L = _log_ratio_from_dots(bands, scheme, plan, sigma, d)
        out[lo : lo + m] = L if direction == "remove" else -L
    return out


# ============================================================================ truncated (App. D)
def _truncated_log_ratio(bands, scheme, sigma, d, r) -> np.ndarray:
    """``ln P(y|r)/Q(y|r)`` for truncated b-min-sep: two DPs against ``R = N(0, sigma^2 I)``.

    App. D (Cor. D.2): in a round with ``r_i >= B`` (truncation) the example, if sampled, survives
    with probability ``tp = B/(r_i + 1)``; P has mean ``2 c_i`` then (else ``c_i``), Q has mean
    ``-c_i`` then (else 0). Both DPs keep the b-min-sep blocking of every *sampled* example.
    Warm start averages each DP separately before the ratio (App. D).
    """
    b, p, B = int(scheme.min_sep), float(scheme.sampling_prob), int(scheme.max_batch_size)
    trunc = r >= B
    tp = np.where(trunc, B / (r + 1.0), 0.5)
    log_tp, log_1mtp = np.log(tp), np.log1p(-tp)
    s2 = sigma**2
    sq = bands.sq[:, None]
    llr1 = (2 * d - sq) / (2 * s2)  # N(c_i)/N(0)
    llr2 = (2 * d - 2 * sq) / s2  # N(2 c_i)/N(0)
    llrn = (-2 * d - sq) / (2 * s2)  # N(-c_i)/N(0)
    logp = math.log(p)
    part_p = np.where(trunc, logaddexp(log_tp + llr2, log_1mtp), llr1) + logp
    part_q = np.where(trunc, logaddexp(log_tp + llrn, log_1mtp), 0.0) + logp
    log_stay = math.log1p(-p) if p < 1 else -math.inf
    warm = bool(scheme.warm_start) and b > 1
    wl = logp if warm else None
    return backward_dp(part_p, log_stay, b, warm_log_p=wl) - backward_dp(part_q, log_stay, b, warm_log_p=wl)


def _rest_batch_sizes(n, b, p, warm, dataset_size, m, rng) -> np.ndarray:
    """Pre-truncation batch sizes ``r_i`` of the other ``dataset_size - 1`` examples, ``(n, m)``.

    Aggregate chain: ``r_i ~ Binomial(A_i, p)`` with ``A_i`` the available others; the ``r_i``
    sampled at step i (kept or truncated away) return at step ``i + b``. Warm start draws the
    initial states from ``Multinomial(dataset_size - 1, pi)``.
    """
    others = dataset_size - 1
    back = np.zeros((n + b, m), dtype=np.int64)  # back[i]: examples becoming available at step i
    if warm and b > 1:
        probs = np.full(b, p / (1.0 + (b - 1) * p))
        probs[0] = 1.0 / (1.0 + (b - 1) * p)
        counts = rng.multinomial(others, probs / probs.sum(), size=m)  # (m, b)
        avail = counts[:, 0].astype(np.int64)
        back[1:b] = counts[:, 1:].T
    else:
        avail = np.full(m, others, dtype=np.int64)
    r = np.empty((n, m), dtype=np.int64)
    for i in range(n):
        avail = avail + back[i] if i else avail
        r[i] = rng.binomial(avail, p)
        avail = avail - r[i]
        back[i + b] += r[i]
    return r


def _sample_truncated(bands, scheme, sigma, S, rng, direction, dataset_size) -> np.ndarray:
    n = bands.n
    b, p, B = int(scheme.min_sep), float(scheme.sampling_prob), int(scheme.max_batch_size)
    warm = bool(scheme.warm_start)
    out = np.empty(S)
    for lo, m in _chunks(S, n):
        r = _rest_batch_sizes(n, b, p, warm, dataset_size, m, rng)
        y = rng.standard_normal((m, n))  # sample-major
        y *= sigma
        start = _first_available(scheme, m, rng, warm)
        means = _Means(bands, y, 1.0 / (1.0 / p + b - 1))
        for t, s in _participations(n, b, p, start, rng):
            rr = r[t, s]
            cut = rr >= B
            survive = rng.random(t.size) < B / (rr + 1.0)
            if direction == "remove":
                coef = np.where(cut, np.where(survive, 2.0, 0.0), 1.0)
            else:
                coef = np.where(cut & survive, -1.0, 0.0)
            nz = coef != 0
            means.add(t[nz], s[nz], coef[nz])
        d = bands.dots_sm(means.finish())
        del y
        L = _truncated_log_ratio(bands, scheme, sigma, d, r)
        out[lo : lo + m] = L if direction == "remove" else -L
    return out
