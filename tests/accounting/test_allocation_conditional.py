"""Random allocation, conditional composition (Alg. 4, §3.5-§3.7 of the digest) and soundness of
both accountants against Monte Carlo estimates of the exact dominating pair's epsilon."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from dpmf.accounting.allocation import account_allocation, mixture_means
from dpmf.accounting.allocation.conditional import (
    _prefix_labels,
    conditional_epsilon,
    reverse_hazard_bounds,
    step_weights,
)
from dpmf.privacy.gdp import gaussian_epsilon
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import Identity, ToeplitzStrategy, bisr, bsr


def _sorted_step(M, n):
    """Prefix Gram, labels and order of step n (0-based), as conditional_epsilon builds them."""
    b = M.shape[0]
    labels = np.zeros(b, dtype=np.int64)
    for j in range(n):
        labels = _prefix_labels(labels, M[:, j])
    H = M[:, :n] @ M[:, :n].T
    order = np.lexsort((labels, M[:, n]))
    return H[np.ix_(order, order)], labels[order], order


# ----------------------------------------------------------------------------- O6 / T14
def test_o6_reverse_hazard_dpsgd():
    b = 100
    M = mixture_means(Identity(b), 1, b)
    beta = (1e-5 / 2) / (b * (b - 1))  # 5.05e-10
    H, lab, _ = _sorted_step(M, 1)  # step n = 2 in the paper's 1-based count
    lam = reverse_hazard_bounds(H, lab, 2.0, beta, "add")
    # exact-offset form: 0.01010 (true posterior <= 1/(b - 1) = 0.010101...)
    assert lam[-1] == pytest.approx(0.01010, abs=5e-6)
    # psi uniform over *all* predecessors (no identity information, no Option 3): 0.01032
    lam_u = reverse_hazard_bounds(H, np.arange(b), 2.0, beta, "add", temperatures=())
    assert lam_u[-1] == pytest.approx(0.01032, abs=5e-6)


def test_first_step_is_uniform_and_weights_telescope():
    lam = np.concatenate([[1.0], 1.0 / (2.0 + np.arange(9))])
    np.testing.assert_allclose(step_weights(lam), np.full(10, 0.1), rtol=1e-14)
    rng = np.random.default_rng(0)
    lam = np.concatenate([[1.0], rng.uniform(0, 1, 7)])
    p = step_weights(lam)
    assert p.sum() == pytest.approx(1.0, abs=1e-14)
    # reverse hazards of p are lam: p_i / sum_{j <= i} p_j
    np.testing.assert_allclose(p / np.cumsum(p), lam, rtol=1e-12)


# ----------------------------------------------------------------------------- tail bounds by MC
def _exact_L(y, mu, i, ident_excluded=False):
    """L_i(y) = log((1/i) sum_{j<i} N(y; mu_j) / N(y; mu_i)), sigma = 1 units handled by caller."""
    d = -0.5 * ((y[:, None, :] - mu[None, :i, :]) ** 2).sum(-1)
    di = -0.5 * ((y - mu[i]) ** 2).sum(-1)
    return special.logsumexp(d, axis=1) - math.log(i) - di


@pytest.mark.parametrize("direction", ["add", "remove"])
def test_tail_bounds_hold_by_monte_carlo(direction):
    # BSR, k = 2 epochs, b = 6 steps per epoch, at step 8 (second epoch); beta large so that the
    # frequency Pr[L_i < tau_i] is measurable. sigma = 1.
    M = mixture_means(bsr(12, 3), 2, 12)
    b, n, sigma, beta = 6, 8, 1.0, 0.05
    H, lab, order = _sorted_step(M, n)
    lam = reverse_hazard_bounds(H, lab, sigma, beta, direction)
    mu = M[order][:, :n] / sigma
    rng = np.random.default_rng(11)
    draws = 200_000
    if direction == "add":
        y = rng.standard_normal((draws, n))
    else:  # the full mixture over all b components (T12)
        y = mu[rng.integers(0, b, draws)] + rng.standard_normal((draws, n))
    for i in range(1, b):
        tau = math.log(1 / lam[i] - 1) - math.log(i)  # invert lam = 1 / (1 + i e^tau)
        L = _exact_L(y, mu, i)
        freq = np.mean(L < tau - 1e-9)
        assert freq <= beta + 4 * math.sqrt(beta / draws), (i, freq)


# ----------------------------------------------------------------------------- reductions
def test_no_subsampling_is_the_gaussian_mechanism():
    # b = 1: every step a single Gaussian; the composition is N(||m||, sigma^2) vs N(0, sigma^2)
    strat, scheme = bsr(6, 2), BallsInBinsSampling(6, 6)
    M = mixture_means(strat, 6, 6)
    sens = float(np.linalg.norm(M[0]))
    exact = gaussian_epsilon(2.0, 1e-6, sens)
    c = conditional_epsilon(M, 2.0, 2e-6, delta_e=1e-6, discretization=1e-4)
    assert exact <= c["epsilon"] <= exact + 2e-3
    r = account_allocation(strat, scheme, 2.0, 1e-6, which="renyi")
    assert r.epsilon >= exact


# ----------------------------------------------------------------------------- soundness vs MC
def _mc_epsilon_lower(M, sigma, delta, direction, draws, seed, z=4.0):
    """Lower confidence limit of the exact dominating pair's epsilon at ``delta``.

    With f(eps) = (1 - exp(eps - L))_+ per draw, delta_hat(eps) - z SE <= delta(eps) w.h.p., so
    epsilon(delta) >= the eps where that lower limit crosses delta.
    """
    rng = np.random.default_rng(seed)
    b, N = M.shape
    mu = M / sigma
    if direction == "remove":
        y = mu[rng.integers(0, b, draws)] + rng.standard_normal((draws, N))
    else:
        y = rng.standard_normal((draws, N))
    L = special.logsumexp(y @ mu.T - 0.5 * (mu**2).sum(1), axis=1) - math.log(b)
    if direction == "add":
        L = -L

    def lower(eps):
        f = -np.expm1(np.minimum(eps - L, 0.0))
        return f.mean() - z * f.std() / math.sqrt(draws)

    lo, hi = 0.0, 50.0
    if lower(0.0) <= delta:
        return 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if lower(mid) > delta else (lo, mid)
    return lo


CASES_FAST = [
    (bsr(6, 2), BallsInBinsSampling(2, 6), 0.8, 1e-2),
    (Identity(4), BallsInBinsSampling(1, 4), 0.7, 1e-2),
]


@pytest.mark.parametrize("strategy, scheme, sigma, delta", CASES_FAST)
def test_sound_against_monte_carlo_fast(strategy, scheme, sigma, delta):
    M = mixture_means(strategy, scheme.epochs, scheme.steps)
    for which in ("renyi", "conditional"):  # (each bound by itself: combined skips one that cannot win)
        key = account_allocation(strategy, scheme, sigma, delta, which=which).diagnostics[which]["epsilon_by_direction"]
        for direction in ("remove", "add"):
            mc = _mc_epsilon_lower(M, sigma, delta, direction, 200_000, seed=3)
            assert key[direction] >= mc, (which, direction, key[direction], mc)


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, scheme, sigma, delta",
    [
        (bsr(20, 3), BallsInBinsSampling(2, 20), 1.0, 1e-3),
        (bisr(20, 3), BallsInBinsSampling(2, 20), 1.0, 1e-3),
        (Identity(10), BallsInBinsSampling(1, 10), 0.6, 1e-3),
        (ToeplitzStrategy(np.array([1.0, 0.6, 0.3]), 12), BallsInBinsSampling(3, 12), 1.5, 1e-3),
    ],
)
def test_sound_against_monte_carlo_slow(strategy, scheme, sigma, delta):
    M = mixture_means(strategy, scheme.epochs, scheme.steps)
    for which in ("renyi", "conditional"):  # (each bound by itself: combined skips one that cannot win)
        key = account_allocation(strategy, scheme, sigma, delta, which=which).diagnostics[which]["epsilon_by_direction"]
        for direction in ("remove", "add"):
            mc = _mc_epsilon_lower(M, sigma, delta, direction, 2_000_000, seed=5)
            assert key[direction] >= mc, (which, direction, key[direction], mc)


def test_conditional_monotone_in_sigma_and_delta_e_budget():
    M = mixture_means(bsr(20, 2), 2, 20)
    out = conditional_epsilon(M, 1.0, 1e-5)
    assert out["epsilon"] > conditional_epsilon(M, 2.0, 1e-5)["epsilon"]
    assert out["delta_e"] == 5e-6 and out["beta"] == pytest.approx(5e-6 / (19 * 9))



def test_remove_tail_bound_with_rounded_up_xi_holds_for_every_smaller_xi():
    # the caller rounds xi up; that is safe only because tau stays below every component mean
    from scipy import special

    from dpmf.accounting.allocation.conditional import _tau_remove

    for nu, beta in (([-3.0, 0.0, 4.0], 0.05), ([-2.0, 0.0, 0.0], 0.35), ([1.0, 1.5, 9.0], 1e-6)):
        nu_k = np.array([nu])
        mult = np.ones(3)
        tau = _tau_remove(nu_k, mult, np.array([1.0]), beta, 3)[0]
        assert tau <= min(nu)
        for xi in np.linspace(0.5, 1.0, 26):
            lhs = (special.ndtr((tau - nu_k[0]) / xi) * mult).sum() / 3
            assert lhs <= beta * (1 + 1e-9), (nu, xi)


# ============================================================================= fast path vs oracle
# The implementation before the N = 1000 speed-up (dense b x b work per step and direction, every
# row's bound, sequential composition), kept verbatim as the oracle: the fast path must give the
# same per-step pairs and epsilons up to float rounding.
from dpmf.accounting.allocation.conditional import (  # noqa: E402
    DEFAULT_TEMPERATURES,
    _SLACK,
    _tau_add,
    _tau_remove,
)
from dpmf.errors import NumericalError  # noqa: E402
from dpmf.privacy.mixture import GaussianMixture  # noqa: E402
from dpmf.privacy.pld import PrivacyLossDistribution  # noqa: E402


def _ref_tau_remove(nu_k: np.ndarray, mult: np.ndarray, xi: np.ndarray, beta: float, b: int) -> np.ndarray:
    """Largest tau (from below) with ``(1/b) sum_k mult_k Phi((tau - nu_k)/xi) <= beta``, per row.

    The search never goes above ``min_k nu_k`` (``hi`` below), so every term has
    ``tau - nu_k <= 0`` and is non-decreasing in ``xi``: the rounded-up ``xi`` of the caller is
    therefore the pessimistic side for every component.
    """
    nu_min = nu_k.min(axis=1)
    pos = xi > 0
    out = nu_min.copy()  # xi = 0: the bound is the constant nu_k, never below min_k nu_k
    if not np.any(pos):
        return out
    nk, x = nu_k[pos], xi[pos][:, None]
    m = mult[None, :]
    # sum_k mult_k Phi(.) <= b beta; ndtr underflows only below 1e-300 per term, covered by the
    # absolute allowance b * 1e-300 on the left-hand side
    target = b * beta - b * 1e-300
    lo = nk.min(axis=1) + xi[pos] * special.ndtri(beta)  # every term <= beta: valid
    ratio = np.minimum(b * beta / mult, 0.5)
    hi = (nk + x * special.ndtri(ratio)[None, :]).min(axis=1)  # one group alone reaches beta
    hi = np.maximum(hi, lo)

    def ok(tau):
        return (special.ndtr((tau[:, None] - nk) / x) * m).sum(axis=1) * (1.0 + 1e-12) <= target

    for _ in range(30):
        mid = 0.5 * (lo + hi)
        good = ok(mid)
        lo = np.where(good, mid, lo)
        hi = np.where(good, hi, mid)
    if not np.all(ok(lo)):  # cannot happen in exact arithmetic; stay on the safe side
        raise NumericalError("conditional composition: tail-bound bisection lost its bracket")
    out[pos] = lo
    return out


def _ref_reverse_hazard_bounds(
    prefix_gram: np.ndarray,
    labels: np.ndarray,
    sigma: float,
    beta: float,
    direction: str,
    temperatures=DEFAULT_TEMPERATURES,
) -> np.ndarray:
    """Upper bounds ``lambda_bar_i`` on the reverse hazards, components in the given (sorted) order.

    Args:
      prefix_gram: ``H_ij = <mu_i, mu_j>`` of the prefix means, rows/columns in sorted order.
      labels: equal labels mark identical prefix means (exactly).
      sigma: noise multiplier.
      beta: failure probability of each component's bound.
      direction: ``"remove"`` (history under the mixture P) or ``"add"`` (under Q).
      temperatures: Option-3 temperatures (the uniform psi is always used).

    Returns:
      ``lambda_bar`` (length ``b``), ``lambda_bar[0] = 1``; valid simultaneously for all ``i``
      with probability ``>= 1 - (b - 1) beta``.
    """
    H = np.asarray(prefix_gram, dtype=np.float64)
    b = H.shape[0]
    s2 = sigma * sigma
    idx = np.arange(b)
    pred = idx[None, :] < idx[:, None]  # j < i
    ident = labels[None, :] == labels[:, None]
    S = pred & ~ident  # non-identical predecessors
    n_sub = S.sum(axis=1)
    n_id = (pred & ident).sum(axis=1)
    lam = np.ones(b)
    with np.errstate(divide="ignore"):
        lam[1:] = 1.0 / (1.0 + idx[1:])  # L_i = 0 where every predecessor is identical
    rows = np.flatnonzero(n_sub > 0)
    if rows.size == 0:
        return lam
    diag = np.diag(H)
    d2 = np.maximum(diag[:, None] + diag[None, :] - 2.0 * H, 0.0)
    Sr = S[rows]
    families = [np.where(Sr, 1.0, 0.0)]
    for t in temperatures:
        logits = np.where(Sr, -d2[rows] / t, -np.inf)
        logits -= logits.max(axis=1, keepdims=True)
        families.append(np.where(Sr, np.exp(logits), 0.0))
    # group the mixture components of the remove case by identical prefix means
    _, first, mult = np.unique(labels, return_index=True, return_counts=True)
    best = np.full(rows.size, -np.inf)
    hii = diag[rows]
    for W in families:
        W = W / W.sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = np.where(W > 0, W * np.log(W * n_sub[rows][:, None]), 0.0).sum(axis=1)
        WH = W @ H  # (rows, b): <mu_bar_i, mu_k>
        wh_self = WH[np.arange(rows.size), rows]  # <mu_bar_i, mu_i>
        quad = np.einsum("rk,rk->r", WH, W)  # |mu_bar_i|^2
        e_norm = W @ diag  # E_psi |mu_j|^2
        xi2 = hii - 2.0 * wh_self + quad
        scale = hii + 2.0 * np.abs(wh_self) + np.abs(quad)
        xi = np.sqrt(np.maximum(xi2, 0.0) + _SLACK * scale) / sigma
        const = (hii - e_norm) / (2.0 * s2) - kl
        const_err = _SLACK * (hii + e_norm) / (2.0 * s2) + _SLACK * np.abs(kl)
        if direction == "add":
            nu = const - const_err
            tau = _tau_add(nu, xi, beta)
        else:
            Hk = H[:, first]  # (b, K) <mu_i, mu_k> for representative k
            nu_k = (WH[:, first] - Hk[rows]) / s2 + const[:, None]
            err = _SLACK * (np.abs(WH[:, first]) + np.abs(Hk[rows])) / s2 + const_err[:, None]
            tau = _ref_tau_remove(nu_k - err, mult.astype(np.float64), xi, beta, b)
        best = np.maximum(best, tau)
    w0 = n_id[rows] / rows  # rows >= 1 (component 0 has no predecessors)
    with np.errstate(over="ignore"):
        # L_i >= log(w0 + (1 - w0) e^{tau_sub}), increasing in tau_sub
        tau_full = np.where(
            w0 > 0, np.logaddexp(np.log(np.maximum(w0, 1e-300)), np.log1p(-w0) + best), best
        )
        lam_rows = special.expit(-np.log(rows) - tau_full)
    lam[rows] = np.minimum(1.0, lam_rows * (1.0 + _SLACK))
    return lam



def _ref_step_weights(lam):
    lam = np.asarray(lam, dtype=np.float64)
    with np.errstate(divide="ignore"):
        log_surv = np.log1p(-np.minimum(lam, 1.0))
    tail = np.concatenate([np.cumsum(log_surv[::-1])[::-1][1:], [0.0]])
    with np.errstate(divide="ignore"):
        p = np.exp(np.log(lam) + tail)
    return p / p.sum()


def _ref_pairs(M, sigma, beta, temperatures=DEFAULT_TEMPERATURES):
    b, N = M.shape
    pairs = {"remove": [], "add": []}
    H = np.zeros((b, b))
    labels = np.zeros(b, dtype=np.int64)
    for n in range(N):
        a = M[:, n]
        order = np.lexsort((labels, a))
        Hs, lab = H[np.ix_(order, order)], labels[order]
        for direction in ("remove", "add"):
            if n == 0:
                lam = np.concatenate([[1.0], 1.0 / (2.0 + np.arange(b - 1))])
            else:
                lam = _ref_reverse_hazard_bounds(Hs, lab, sigma, beta, direction, temperatures)
            pairs[direction].append((a[order], _ref_step_weights(lam)))
        H += np.outer(a, a)
        labels = _prefix_labels(labels, a)
    return pairs


def _ref_epsilon(M, sigma, delta, disc):
    de = delta / 2
    b, N = M.shape
    beta = de / (max(N - 1, 1) * max(b - 1, 1))
    pairs = _ref_pairs(M, sigma, beta)
    pmfs = {}
    for direction in ("remove", "add"):
        acc = None
        for a, w in pairs[direction]:
            mech = GaussianMixture.create(a, w, sigma)
            pld = mech.pld(disc) if not mech.is_trivial else PrivacyLossDistribution.identity(disc)
            acc = pld if acc is None else acc.compose(pld)
        pmfs[direction] = acc
    composed = PrivacyLossDistribution(remove=pmfs["remove"].remove, add=pmfs["add"].add)
    return composed.epsilon_by_direction(delta - de)


ORACLE_CASES = [  # (strategy, epochs, sigma): banded, dense Toeplitz, banded inverse, DP-SGD
    (bsr(24, 3), 2, 1.0),
    (bsr(60, 3), 1, 2.0),
    (bisr(30, 4), 3, 1.5),
    (bsr(30, 30), 1, 2.0),
    (ToeplitzStrategy(np.array([1.0, 0.6, 0.3]), 36), 3, 1.2),
    (Identity(20), 2, 1.0),
]


def _merged(a, w, sigma):
    mech = GaussianMixture.create(a, w, sigma)
    return mech.sensitivities, mech.probabilities


@pytest.mark.parametrize("strategy, epochs, sigma", ORACLE_CASES)
def test_fast_step_pairs_equal_the_reference(strategy, epochs, sigma):
    from dpmf.accounting.allocation.conditional import _step_pairs

    M = mixture_means(strategy, epochs, strategy.n)
    b, N = M.shape
    beta = 5e-6 / ((N - 1) * (b - 1))
    new = _step_pairs(M, sigma, beta, DEFAULT_TEMPERATURES, None)
    ref = _ref_pairs(M, sigma, beta)
    for direction in ("remove", "add"):
        assert len(new[direction]) == N
        for n, ((a1, w1), (a2, w2)) in enumerate(zip(new[direction], ref[direction])):
            s1, p1 = _merged(a1, w1, sigma)
            s2, p2 = _merged(a2, w2, sigma)
            np.testing.assert_array_equal(s1, s2)
            # the mixture is all the PLD sees: same weights per distinct mean (float rounding)
            np.testing.assert_allclose(p1, p2, rtol=1e-9, atol=1e-15, err_msg=f"{direction} step {n}")


@pytest.mark.parametrize("strategy, epochs, sigma", ORACLE_CASES[:4])
def test_fast_epsilon_equals_the_reference(strategy, epochs, sigma):
    M = mixture_means(strategy, epochs, strategy.n)
    disc = 2e-3
    new = conditional_epsilon(M, sigma, 1e-5, discretization=disc)["epsilon_by_direction"]
    ref = _ref_epsilon(M, sigma, 1e-5, disc)
    for direction in ("remove", "add"):
        assert new[direction] == pytest.approx(ref[direction], rel=1e-9), direction


@pytest.mark.parametrize("direction", ["remove", "add"])
def test_reverse_hazard_bounds_equal_the_reference(direction):
    for strategy, epochs, sigma in ORACLE_CASES:
        M = mixture_means(strategy, epochs, strategy.n)
        for n in (1, 3, M.shape[1] // 2, M.shape[1] - 1):
            H, lab, _ = _sorted_step(M, n)
            new = reverse_hazard_bounds(H, lab, sigma, 1e-7, direction)
            ref = _ref_reverse_hazard_bounds(H, lab, sigma, 1e-7, direction)
            np.testing.assert_allclose(new, ref, rtol=1e-9, atol=0)


def test_grouped_bisection_with_pruning_keeps_every_group_maximum():
    rng = np.random.default_rng(7)
    b, K, fams, rows = 40, 40, 6, 5
    mult = rng.integers(1, 4, K).astype(np.float64)
    base = rng.normal(0.0, 2.0, (fams * rows, 6))
    nu = base[:, rng.integers(0, 6, K)]  # many exactly equal values per row
    nu[:, :3] += rng.normal(0.0, 0.5, (fams * rows, 3))
    xi = rng.uniform(0.2, 3.0, fams * rows)
    xi[3] = 0.0
    for beta in (1e-3, 1e-8):
        group = np.tile(np.arange(rows), fams)
        fast = _tau_remove(nu, mult, xi, beta, b, group=group)
        plain = _tau_remove(nu, mult, xi, beta, b)
        ref = _ref_tau_remove(nu, mult, xi, beta, b)
        np.testing.assert_allclose(plain, ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(
            fast.reshape(fams, rows).max(0), ref.reshape(fams, rows).max(0), rtol=1e-12, atol=1e-12
        )
        assert np.all(fast <= ref + 1e-12)  # pruned rows only ever return a smaller (valid) value
        for r in np.flatnonzero(xi > 0):  # every returned value satisfies the tail constraint
            lhs = (special.ndtr((fast[r] - nu[r]) / xi[r]) * mult).sum() / b
            assert lhs <= beta * (1 + 1e-9)


def test_fast_path_monotone_in_sigma_and_delta():
    M = mixture_means(bsr(60, 3), 1, 60)
    e = [conditional_epsilon(M, s, 1e-5, discretization=1e-3)["epsilon"] for s in (1.5, 2.0, 3.0)]
    assert e[0] > e[1] > e[2] > 0
    assert conditional_epsilon(M, 2.0, 1e-7, discretization=1e-3)["epsilon"] > e[1]


@pytest.mark.slow
@pytest.mark.parametrize("epochs", [1, 10])
def test_conditional_runs_at_1000_steps(epochs):
    from dpmf.accounting.allocation.conditional import conditional_cost

    strat, scheme = bsr(1000, 4), BallsInBinsSampling(epochs, 1000)
    M = mixture_means(strat, epochs, 1000)
    steps = []
    out = conditional_epsilon(M, 4.0, 1e-5, callback=lambda n, N: steps.append(n))
    assert steps[-1] == 1000 and len(steps) == 1000
    eps = out["epsilon_by_direction"]
    assert all(0 < v < 50 for v in eps.values())
    # combined mode now runs conditional composition at N = 1000 for a banded strategy
    assert conditional_cost(M, 1000) <= 30.0
    rep = account_allocation(strat, scheme, 4.0, 1e-5, which="conditional")
    assert rep.diagnostics["conditional"]["epsilon_by_direction"] == pytest.approx(eps, rel=1e-12)
