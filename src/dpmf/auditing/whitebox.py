"""The white-box attacker of a correlated-noise training run: whiten, then the likelihood ratio.

**What the attacker sees.** One coordinate per canary (the audit block of
:mod:`dpmf.training.torch.audit`): canary ``i``'s Dirac gradient lives only in coordinate ``i``,
real examples never touch it. In units of the clip norm, the released noisy gradient sums of that
coordinate over the ``n`` steps are

    x_hat = p + sigma * L z,      z ~ N(0, I_n),

with ``p in {0, 1}^n`` the steps at which the canary was sampled (all zero when its coin excluded
it: zero-out adjacency) and ``L`` the strategy's noising matrix (``C^{-1}`` for a square encoder;
:meth:`noising_matrix`). ``sigma`` is the run's noise multiplier.

**Whitening** (notes/privacy-auditing.md Sec. 2). ``L`` is public, so multiplying by a ``W`` with
``W L L^T W^T = I`` is free post-processing: ``y = W x_hat = W p + sigma z'`` with i.i.d. noise.
For a square lower-triangular encoder ``W = C`` (the attacker undoes ``C^{-1}``); otherwise ``W``
is the inverse Cholesky factor of ``L L^T`` (:func:`whitening_matrix`).

**The score** is the log-likelihood ratio of "included" against "zeroed out",

    log LR(y) = log E_p exp(<W p, y> / sigma^2 - ||W p||^2 / (2 sigma^2)),

with ``p`` drawn from the sampler's law for one example: the attacker does *not* see the sampling
masks (a score given them would audit the un-amplified mechanism, and comparing that with an
amplified claim would raise false alarms). Any score gives a valid audit; this one is the
Neyman-Pearson optimal test for one canary, so the audit's power is the mechanism's own. It is
computed exactly where the structure allows (:attr:`WhiteBoxScorer.method`):

* ``slots`` -- balls-in-bins (one slot, reused) and fixed order: one of ``b`` known patterns (a
  mixture over the slot); the balls-in-bins variants (k slots, fresh slots) are ``independent``;
* ``poisson`` -- Poisson sampling with a diagonal ``W`` (DP-SGD): a product over steps;
* ``cyclic`` -- cyclic Poisson with ``W`` banded within the cycle: a mixture over the group of
  products over its steps (participations never overlap in ``W``);
* ``min-sep`` -- b-min-sep with ``W`` banded within ``min_sep``: the forward algorithm over the
  availability chain (the sampler's own Markov chain, cold or warm start);
* ``independent`` -- everything else (e.g. a dense BLT ``C`` under Poisson): the same product with
  each step's marginal participation probability and the cross terms of ``||W p||^2`` dropped.
  Not the exact likelihood ratio -- a valid score with less power, and the audit says so.

**Faulty runs.** The likelihood ratio of the *claimed* mechanism is the optimal test against the
claim, not against a run that adds less noise than claimed. :meth:`WhiteBoxScorer.scores` adds two
variants fitted to the released noise (never using the coins): the claimed ratio at a smaller noise
level when the whitened noise is smaller everywhere, and a ratio with per-step noise variances for
runs that skip the noise on some steps; and :meth:`WhiteBoxScorer.noise_check` compares the
spectrum of the whitened noise with the claim.

Everything is float64 numpy; nothing here imports torch.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import linalg as sla
from scipy import special

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.sampling.schemes import (
    SCHEMES,
    BallsInBinsSampling,
    CyclicPoissonSampling,
    FixedOrderSampling,
    MinSepSampling,
    PoissonSampling,
)

__all__ = ["whitening_matrix", "bandwidth", "WhiteBoxScorer", "participation_masks", "SCORE_METHODS"]

#: The scorer's methods, and whether each is the exact likelihood ratio.
SCORE_METHODS = {"slots": True, "poisson": True, "cyclic": True, "min-sep": True, "independent": False}

#: Strategies larger than this are refused (the whitening materializes ``n x n``).
MAX_STEPS = 8192


def whitening_matrix(strategy) -> np.ndarray:
    """``W`` (``n x n``, float64, lower-triangular) with ``W L L^T W^T = I`` for the strategy's
    noising matrix ``L``: the encoder ``C`` itself when it is square and lower-triangular, else the
    inverse Cholesky factor of ``L L^T``.

    >>> from dpmf.strategies import bsr
    >>> W = whitening_matrix(bsr(6, 3))
    >>> L = bsr(6, 3).noising_matrix()
    >>> bool(np.allclose(W @ L @ L.T @ W.T, np.eye(6)))
    True
    """
    return _whitening(strategy)[0]


def _whitening(strategy) -> tuple[np.ndarray, str]:
    """``(W, how)``: :func:`whitening_matrix` and which form it took."""
    n = getattr(strategy, "n", None)
    if n is None or not callable(getattr(strategy, "noising_matrix", None)):
        raise InvalidParameterError(f"strategy must be a dpmf strategy, got {type(strategy).__name__}")
    if n > MAX_STEPS:
        raise UnsupportedConfigurationError(
            f"a white-box audit whitens with a dense {n} x {n} matrix; at most {MAX_STEPS} steps are supported "
            "(audit a shorter run of the same configuration)"
        )
    C = np.asarray(strategy.encoder(), dtype=np.float64)
    if C.shape == (n, n) and np.allclose(np.triu(C, 1), 0.0):
        return np.tril(C), "C (the encoder: undoes C^-1)"
    L = np.asarray(strategy.noising_matrix(), dtype=np.float64)
    K = np.linalg.cholesky(L @ L.T)
    return sla.solve_triangular(K, np.eye(n), lower=True), "inverse Cholesky factor of L L^T"


def bandwidth(W: np.ndarray) -> int:
    """Number of diagonals of the lower-triangular ``W`` up to its last nonzero one (1: diagonal):
    participations at least this many steps apart have disjoint footprints ``W e_t``."""
    n = W.shape[0]
    for k in range(n - 1, 0, -1):
        if np.any(np.diagonal(W, -k) != 0.0):
            return k + 1
    return 1


def participation_masks(scheme, num_examples: int, seed: int, examples=None) -> np.ndarray:
    """``(steps, len(examples))`` booleans: which of ``examples`` (default all) the scheme's own
    batch generator puts in each step, for ``num_examples`` examples and ``seed``."""
    rng = np.random.default_rng(seed)
    m = _v.positive_int("num_examples", num_examples)
    cols = np.arange(m) if examples is None else np.asarray(examples)
    where = np.full(m, -1, dtype=np.int64)
    where[cols] = np.arange(cols.size)
    out = np.zeros((scheme.steps, cols.size), dtype=bool)
    for t, batch in enumerate(scheme.batches(m, rng)):
        j = where[batch]
        out[t, j[j >= 0]] = True
    return out


def _log1p_mix(q: float, ell: np.ndarray) -> np.ndarray:
    """``log(1 - q + q e^ell)``, stable for any ``ell``."""
    if q >= 1.0:
        return ell
    return np.logaddexp(math.log1p(-q), math.log(q) + ell)


def _log_mixture(log_terms: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``log sum_k weights[k] exp(log_terms[k])`` over the first axis (a weight 0 drops its term)."""
    with np.errstate(divide="ignore"):
        return special.logsumexp(log_terms + np.log(weights)[:, None], axis=0)


def _availability_start(scheme) -> np.ndarray:
    """The law of b-min-sep's availability chain at the first step (state ``k``: steps until the
    example is available again): all mass on "available" for a cold start, the chain's
    stationary law for a warm start (``1 / (1 + (b - 1) p)`` available, ``p / (1 + (b - 1) p)``
    in each barred state)."""
    b, p = scheme.min_sep, scheme.sampling_prob
    out = np.zeros(b)
    if scheme.warm_start and b > 1:
        out[:] = p / (1 + (b - 1) * p)
        out[0] = 1.0 / (1 + (b - 1) * p)
    else:
        out[0] = 1.0
    return out


class WhiteBoxScorer:
    """Log-likelihood-ratio scores of canaries from their released noisy gradient sums (module
    docstring): ``score(released)`` for ``released`` of shape ``(n, m)`` in clip-norm units;
    :meth:`scores` adds two variants fitted to the released noise, for faulty runs.

    Args:
        strategy: the encoder ``C`` of the run (any dpmf strategy with ``n <= 8192``).
        scheme: the run's sampling scheme (its law for one example is what the score averages over).
        noise_multiplier: the run's sigma.
        num_examples: the dataset size of the run (fixed order: slot sizes; cyclic Poisson with
            ``partition="equal"``: group sizes).
    """

    def __init__(self, strategy, scheme, noise_multiplier: float, num_examples: int) -> None:
        if not isinstance(scheme, SCHEMES):
            raise InvalidParameterError(f"scheme must be a dpmf sampling scheme, got {type(scheme).__name__}")
        self.strategy, self.scheme = strategy, scheme
        self.sigma = _v.noise_scale("noise_multiplier", noise_multiplier)
        self.num_examples = _v.positive_int("num_examples", num_examples)
        if strategy.n != scheme.steps:
            raise InvalidParameterError(f"the strategy has n={strategy.n} steps but the scheme {scheme.steps}")
        self.W, self.whitening = _whitening(strategy)
        self.n = self.W.shape[0]
        self.band = bandwidth(self.W)
        self.method = self._choose(self.band)
        L = np.asarray(strategy.noising_matrix(), dtype=np.float64)
        self.step_variance = self.sigma**2 * np.einsum("ij,ij->i", L, L)  # claimed Var of x_hat_t

    @property
    def exact(self) -> bool:
        """Whether :meth:`score` is the exact likelihood ratio (else a valid but weaker score)."""
        return SCORE_METHODS[self.method]

    def _choose(self, band: int) -> str:
        s = self.scheme
        if isinstance(s, FixedOrderSampling) or (isinstance(s, BallsInBinsSampling) and s.reused_single_slot):
            return "slots"
        untruncated = getattr(s, "max_batch_size", None) is None  # (truncation changes the likelihood ratio)
        if isinstance(s, PoissonSampling) and band == 1 and untruncated:
            return "poisson"
        if isinstance(s, CyclicPoissonSampling) and band <= s.cycle_length and untruncated:
            return "cyclic"
        if isinstance(s, MinSepSampling) and band <= s.min_sep and s.max_batch_size is None:
            return "min-sep"
        return "independent"

    def describe(self) -> dict:
        return {"method": self.method, "exact_likelihood_ratio": self.exact, "whitening": self.whitening,
                "bandwidth": self.band}

    # ------------------------------------------------------------------ scores
    def _released(self, released) -> np.ndarray:
        x = np.asarray(released, dtype=np.float64)
        if x.ndim == 1:
            x = x[:, None]
        if x.ndim != 2 or x.shape[0] != self.n:
            raise InvalidParameterError(f"released must have shape ({self.n}, canaries), got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise InvalidParameterError("released gradient sums must be finite")
        return x

    def whiten(self, released) -> np.ndarray:
        """``y = W x_hat`` (shape ``(n, m)``): the canary footprint ``W p`` in i.i.d. noise."""
        return self.W @ self._released(released)

    def score(self, released) -> np.ndarray:
        """The log-likelihood ratio of every canary under the claimed mechanism (``(m,)``, float64;
        higher = "included"): exact where :attr:`exact`."""
        return self._lr(self.whiten(released), self.W, 1.0 / self.sigma**2, self.method)

    def noise_check(self, y: np.ndarray) -> dict:
        """Compare the whitened observations' sample covariance ``S`` with the claimed ``sigma^2 I``.

        No coin is used (a function of the released output). A correct run's ``S`` has every
        eigenvalue above ``sigma^2 (1 - sqrt(n/m))^2`` up to sampling error (Marchenko-Pastur;
        included canaries only add to ``S``); eigenvalues below ``threshold = sigma^2 min(1/4,
        (1 - sqrt(n/m))^2 / 2)`` mean the run added less noise than claimed in those directions
        (steps without noise, a smaller sigma, another ``C``). Needs ``m >= 4 n`` observations and
        ``n <= 2048`` (else ``checked`` is False)."""
        n, m = y.shape
        if m < 4 * n or n > 2048:
            return {"checked": False,
                    "reason": f"needs at least 4 canaries per step and at most 2048 steps (have {m} for {n})"}
        s2 = self.sigma**2
        mean = y.mean(axis=1)
        S = (y @ y.T - m * np.outer(mean, mean)) / (m - 1)
        lam = np.linalg.eigvalsh((S + S.T) / 2)
        threshold = s2 * min(0.25, 0.5 * (1.0 - math.sqrt(n / m)) ** 2)
        return {"checked": True, "smallest_eigenvalue_over_sigma2": float(lam.min() / s2),
                "median_eigenvalue_over_sigma2": float(np.median(lam) / s2),
                "threshold_over_sigma2": float(threshold / s2), "directions_below": int((lam < threshold).sum())}

    def scores(self, released) -> dict:
        """Three scores of every canary, each computed without the coins (so each gives a valid audit):

        * ``"claimed"`` -- :meth:`score`, the likelihood ratio of the claimed mechanism;
        * ``"scalar"`` -- the same with sigma replaced by a noise level fitted to the released noise,
          when smaller: ``sqrt`` of the median eigenvalue of ``S`` (:meth:`noise_check`). For runs that
          added less noise everywhere (a smaller sigma, the sigma of another strategy);
        * ``"per-step"`` -- the likelihood ratio of a model with independent noise on the *released*
          sums, step ``t`` of variance ``v_t``: the claimed ``Var(x_hat_t)`` unless the released sums'
          robust variance (1.4826 x median absolute deviation, squared) is below a quarter of it,
          then that (at least ``1e-6`` of the claim). For runs that skipped the noise on some steps;
          without correlations, weaker than ``"claimed"`` on a correct run.

        Also ``"check"``: :meth:`noise_check`, and ``"steps_below"``: steps whose released noise is
        under a quarter of the claimed variance."""
        x = self._released(released)
        y = self.W @ x
        claimed = self._lr(y, self.W, 1.0 / self.sigma**2, self.method)
        check = self.noise_check(y)
        out = {"claimed": claimed, "scalar": claimed, "check": check}
        if check.get("checked"):
            med = check["median_eigenvalue_over_sigma2"] * self.sigma**2
            if med < self.sigma**2:
                out["scalar"] = self._lr(y, self.W, 1.0 / max(med, 1e-6 * self.sigma**2), self.method)
        if x.shape[1] >= 20:
            mad = np.median(np.abs(x - np.median(x, axis=1, keepdims=True)), axis=1)
            robust = (1.4826 * mad) ** 2
            low = robust < 0.25 * self.step_variance
        else:
            robust, low = self.step_variance, np.zeros(self.n, dtype=bool)
        var = np.where(low, np.maximum(robust, 1e-6 * self.step_variance), self.step_variance)
        out["per-step"] = self._lr(x, np.eye(self.n), 1.0 / var, self._choose(1))
        out["steps_below"] = int(low.sum())
        return out

    # ------------------------------------------------------------------ likelihood ratios
    def _lr(self, y: np.ndarray, W: np.ndarray, prec, method: str) -> np.ndarray:
        """log E_p exp(<W p, Q y> - <W p, Q W p> / 2) for observations ``y = W p + noise`` with noise
        precision ``Q = diag(prec)`` (``prec`` a number or a vector over steps), by ``method``."""
        prec = np.broadcast_to(np.asarray(prec, dtype=np.float64), (self.n,))
        if method == "slots":
            return self._slots(y, W, prec)
        QW = prec[:, None] * W
        ell = QW.T @ y - (np.einsum("ij,ij->j", W, QW) / 2.0)[:, None]  # single participation at t
        return getattr(self, "_" + method.replace("-", "_"))(ell)

    def _slots(self, y: np.ndarray, W: np.ndarray, prec: np.ndarray) -> np.ndarray:
        s = self.scheme
        b = s.steps_per_epoch
        P = np.zeros((self.n, b))
        for e in range(s.epochs):
            P[e * b + np.arange(b), np.arange(b)] = 1.0
        WP = W @ P
        QWP = prec[:, None] * WP
        a = QWP.T @ y - (np.einsum("ij,ij->j", WP, QWP) / 2.0)[:, None]  # (b, m)
        if isinstance(s, FixedOrderSampling):  # slot s holds its share of the shuffled examples
            bounds = np.linspace(0, self.num_examples, b + 1).round().astype(np.int64)
            w = np.diff(bounds) / self.num_examples
        else:
            w = np.full(b, 1.0 / b)
        return _log_mixture(a, w)

    def _poisson(self, ell: np.ndarray) -> np.ndarray:
        return _log1p_mix(self.scheme.sampling_prob, ell).sum(axis=0)

    def _cyclic(self, ell: np.ndarray) -> np.ndarray:
        s = self.scheme
        b = s.cycle_length
        per = _log1p_mix(s.sampling_prob, ell)  # (n, m)
        groups = np.stack([per[g::b].sum(axis=0) for g in range(b)])  # (b, m)
        if s.partition == "equal":
            sizes = np.bincount(np.arange(self.num_examples) * b // self.num_examples, minlength=b)
            w = sizes / self.num_examples
        else:
            w = np.full(b, 1.0 / b)
        return _log_mixture(groups, w)

    def _min_sep(self, ell: np.ndarray) -> np.ndarray:
        s = self.scheme
        b, p = s.min_sep, s.sampling_prob
        m = ell.shape[1]
        if b == 1:
            return _log1p_mix(p, ell).sum(axis=0)
        # alpha[k]: log P(observations so far, chain in state k) relative to "zeroed out";
        # state k = steps until the example is available again (the sampler's `barred`)
        with np.errstate(divide="ignore"):
            alpha = np.repeat(np.log(_availability_start(s))[:, None], m, axis=1)
            log_p, log_q = math.log(p), (math.log1p(-p) if p < 1 else -math.inf)
            for t in range(self.n):
                new = np.empty_like(alpha)
                new[b - 1] = alpha[0] + log_p + ell[t]
                new[0] = np.logaddexp(alpha[0] + log_q, alpha[1])
                if b > 2:
                    new[1 : b - 1] = alpha[2:b]
                alpha = new
        return special.logsumexp(alpha, axis=0)

    def _independent(self, ell: np.ndarray) -> np.ndarray:
        pi = self.marginal_rates()
        out = np.zeros(ell.shape[1])
        for t in range(self.n):
            out += _log1p_mix(float(pi[t]), ell[t])
        return out

    def marginal_rates(self) -> np.ndarray:
        """``P[example participates at step t]`` (``(n,)``) under the scheme, exact for every scheme
        the scorer meets (b-min-sep by propagating its availability chain)."""
        s, n = self.scheme, self.n
        if isinstance(s, PoissonSampling):
            return np.full(n, s.sampling_prob)
        if isinstance(s, CyclicPoissonSampling):
            return np.full(n, s.sampling_prob / s.cycle_length)
        if isinstance(s, BallsInBinsSampling):
            return np.full(n, s.num_selected / s.steps_per_epoch)
        if isinstance(s, FixedOrderSampling):
            return np.full(n, 1.0 / s.steps_per_epoch)
        if isinstance(s, MinSepSampling):
            b, p = s.min_sep, s.sampling_prob
            state = _availability_start(s)
            out = np.empty(n)
            for t in range(n):
                out[t] = state[0] * p
                new = np.zeros(b)
                if b == 1:
                    new[0] = 1.0
                else:
                    new[b - 1] = state[0] * p
                    new[0] = state[0] * (1 - p) + state[1]
                    new[1 : b - 1] = state[2:b]
                state = new
            return out
        raise UnsupportedConfigurationError(f"no white-box score for the {s.name} scheme")
