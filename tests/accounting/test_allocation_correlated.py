"""Spectral groups (``allocation/correlated.py``): the bound of ``allocation_pld`` for correlated C.

Oracles: (a) exact numerical integration of both directions' delta for the exact pair with
b = 2, 3 correlated slots (conditioning on all slots but one leaves a lognormal, whose call / put
are closed forms), which also checks Lemma 1's convex order directly; (b) a Monte Carlo estimate of
the exact pair with a confidence interval on banded Toeplitz cases, which the bound must never
undercut; (c) a negative control (in-class correlations ignored) that the same checks catch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

import dpmf
from dpmf.accounting.allocation.correlated import (
    Reductions,
    perron_upper_bound,
    reduced_epsilon,
    spectral_groups,
    strategy_reductions,
)
from dpmf.accounting.allocation.dominating_pair import gram_matrix, mixture_means
from dpmf.accounting.allocation.pld import OrthogonalGroups, allocation_pld_epsilon, strategy_groups
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import ToeplitzStrategy, bsr


# ----------------------------------------------------------------------------- exact integration
def _call_put(fwd_mu, var, a):
    """``E[(e^Z - a)_+]`` and ``E[(a - e^Z)_+]`` for ``Z ~ N(mu, var)`` (arrays; ``a > 0`` or not)."""
    s = math.sqrt(var)
    fwd = np.exp(fwd_mu + var / 2)
    pos = a > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        d1 = np.where(pos, (fwd_mu + var - np.log(np.where(pos, a, 1.0))) / s, np.inf)
    call = np.where(pos, fwd * special.ndtr(d1) - a * special.ndtr(d1 - s), fwd - a)
    return call, call - fwd + a


def _gh_deltas(gram: np.ndarray, sigma: float, eps: float, nodes: int) -> tuple[float, float]:
    """Both directions' delta(eps) of the exact pair with Gram ``gram`` (b = 2 or 3 slots): the
    last slot's exponent given the others is Gaussian (closed-form call / put, smooth in the
    others), the others are integrated by a tensor Gauss-Hermite rule."""
    b = gram.shape[0]
    cov = gram / sigma**2
    half = np.diag(cov) / 2
    A, c, cvar = cov[: b - 1, : b - 1], cov[b - 1, : b - 1], cov[b - 1, b - 1]
    beta = np.linalg.solve(A, c)
    rvar = cvar - c @ beta
    L = np.linalg.cholesky(A)
    x, w = special.roots_hermitenorm(nodes)
    w = w / w.sum()
    grids = np.meshgrid(*([x] * (b - 1)), indexing="ij")
    z = np.stack([g.ravel() for g in grids])
    wt = np.prod(np.meshgrid(*([w] * (b - 1)), indexing="ij"), axis=0).ravel()
    y = L @ z
    rest = np.exp(y - half[: b - 1, None]).sum(axis=0)
    mu = beta @ y - half[b - 1]
    ea = math.exp(eps)
    call, _ = _call_put(mu, rvar, b * ea - rest)  # E[(b S - b e^eps)_+ | others]
    _, put = _call_put(mu, rvar, b / ea - rest)  # E[(b e^-eps - b S)_+ | others]
    return float(wt @ call) / b, ea * float(wt @ put) / b


def _exact_deltas(gram: np.ndarray, sigma: float, eps: float) -> tuple[float, float]:
    """:func:`_gh_deltas` at 200 nodes per axis, each direction pushed up by 4x its difference from
    the 120-node rule (the conditional call is not analytic where the others' sum crosses the
    strike, so the rule converges algebraically; measured differences are ~1e-4 relative)."""
    fine, coarse = _gh_deltas(gram, sigma, eps, 200), _gh_deltas(gram, sigma, eps, 120)
    return tuple(f + 4 * abs(f - c) for f, c in zip(fine, coarse))


def _exact_deltas_low(gram: np.ndarray, sigma: float, eps: float) -> tuple[float, float]:
    """The same pushed down (for checks that the exact value is *above* something)."""
    fine, coarse = _gh_deltas(gram, sigma, eps, 200), _gh_deltas(gram, sigma, eps, 120)
    return tuple(f - 4 * abs(f - c) for f, c in zip(fine, coarse))


GRAMS = [
    np.array([[1.49, 0.7], [0.7, 1.0]]),  # Toeplitz [1, 0.7] with two steps
    np.array([[1.0, 0.9], [0.9, 1.0]]),  # strongly correlated
    np.array([[1.3125, 0.875, 0.375], [0.875, 1.3125, 0.5], [0.375, 0.5, 1.0]]),  # [1, 0.5, 0.375] banded
]


@pytest.mark.parametrize("gram", GRAMS, ids=["b2", "b2-strong", "b3"])
def test_lemma1_convex_order_by_exact_integration(gram):
    # E f(S) <= E f(S') for both hockey-stick integrands, S' independent slots at lambda_max(G)
    b, sigma = gram.shape[0], 1.0
    lam = perron_upper_bound(gram)
    for eps in (0.1, 0.5, 1.0):
        exact = _exact_deltas(gram, sigma, eps)
        indep = _exact_deltas_low(lam * np.eye(b), sigma, eps)
        for e, i in zip(exact, indep):
            assert e <= i
        # and lambda_max is needed: at the diagonal's max the independent slots are optimistic
        low = _exact_deltas(float(np.diag(gram).max()) * np.eye(b), sigma, eps)
        assert low[0] < _exact_deltas_low(gram, sigma, eps)[0]


@pytest.mark.parametrize("gram", GRAMS, ids=["b2", "b2-strong", "b3"])
def test_reported_epsilon_is_sound_by_exact_integration(gram):
    b, sigma, delta = gram.shape[0], 1.2, 1e-3
    means = np.linalg.cholesky(gram)  # rows with Gram `gram` (non-negative entries here)
    assert np.all(means >= 0)
    groups = spectral_groups(means)
    og = OrthogonalGroups(b, 1, float(np.diag(gram).max()) * (1 + 1e-12))
    out = reduced_epsilon(Reductions(og, tuple(groups)), sigma, delta, allocation_pld_epsilon)
    rem, add = _exact_deltas(gram, sigma, out["epsilon"])
    assert rem <= delta and add <= delta
    # negative control: one slot per class at the diagonal's norm but b slots (correlation ignored)
    naive = allocation_pld_epsilon(sigma / math.sqrt(float(np.diag(gram).max())), b, delta)["epsilon"]
    assert max(_exact_deltas_low(gram, sigma, naive)) > delta


def test_perron_upper_bound_is_an_upper_bound_and_tight():
    rng = np.random.default_rng(0)
    for n in (1, 3, 40, 130):
        m = np.abs(rng.standard_normal((n, n + 5))) * (rng.random((n, n + 5)) < 0.3)
        g = m @ m.T
        lam = float(np.linalg.eigvalsh(g).max())
        ub = perron_upper_bound(g)
        assert lam <= ub <= lam * (1 + 1e-6) + 1e-12
    assert perron_upper_bound(np.zeros((4, 4))) >= 0.0  # reducible, all zero: still finite


def test_family_contains_the_orthogonal_groups_and_is_pareto():
    strategy, scheme = bsr(64, 4), BallsInBinsSampling(1, 64)
    red = strategy_reductions(strategy, scheme, strategy_groups(strategy, scheme))
    assert red.period == 4 and red.slots == 16
    members = {(g.period, g.slots) for g in red.spectral}
    assert (4, 16) in members and (1, 64) in members
    g4 = next(g for g in red.spectral if g.period == 4)
    assert g4.max_eigenvalue == pytest.approx(red.max_norm_sq, rel=1e-9)  # diagonal class Gram
    lams = [g.max_eigenvalue for g in sorted(red.spectral, key=lambda g: -g.slots)]
    assert lams == sorted(lams, reverse=True) or all(a > b for a, b in zip(lams, lams[1:]))
    # the identity: one member, q = 1, every slot alone at its norm
    assert [(g.period, g.slots) for g in spectral_groups(np.eye(8))] == [(1, 8)]


# ----------------------------------------------------------------------------- Monte Carlo
def _mc_epsilon_interval(means, sigma, delta, n, seed, z=4.0):
    """Monte Carlo (point, lower) epsilon of the exact pair: remove delta(eps) = E_P[(1 - e^eps / S)_+]
    (x ~ P, values in [0, 1]), add delta(eps) = E_Q[(1 - e^eps S)_+]; the lower end is the smallest
    eps at which the estimate minus ``z`` standard errors is <= delta."""
    rng = np.random.default_rng(seed)
    b = means.shape[0]
    half = 0.5 * (means * means).sum(axis=1) / sigma**2
    x = sigma * rng.standard_normal((n, means.shape[1]))
    logs = []
    for shift in (means[rng.integers(0, b, n)], 0.0):
        y = (x + shift) @ means.T / sigma**2 - half
        mx = y.max(axis=1)
        logs.append(mx + np.log(np.exp(y - mx[:, None]).mean(axis=1)))

    def solve(stat):
        lo, hi = 0.0, 30.0
        if stat(0.0) <= delta:
            return 0.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if stat(mid) <= delta else (mid, hi)
        return hi

    out = []
    for k in (0, z):
        eps = []
        for sign, L in ((-1, logs[0]), (1, logs[1])):
            def stat(e, L=L, sign=sign):
                v = np.maximum(1 - np.exp(e + sign * L), 0.0)
                return v.mean() - k * v.std() / math.sqrt(n)
            eps.append(solve(stat))
        out.append(max(eps))
    return out[0], out[1]


@pytest.mark.parametrize(
    "strategy, epochs, sigma",
    [(bsr(32, 4), 1, 2.0), (ToeplitzStrategy([1.0, 0.8, 0.6], 32), 1, 3.0), (bsr(32, 3), 2, 4.0)],
)
def test_never_below_the_monte_carlo_lower_bound(strategy, epochs, sigma):
    delta = 1e-3  # large enough for a precise estimate in a fast test
    scheme = BallsInBinsSampling(epochs, strategy.n)
    report = dpmf.account(strategy, scheme, sigma, delta, method="allocation_pld")
    assert report.certified and report.diagnostics["bound"]
    means = mixture_means(strategy, epochs, strategy.n)
    point, lower = _mc_epsilon_interval(means, sigma, delta, 100_000, seed=11)
    assert report.epsilon >= lower
    # negative control: spectral groups with q = 1 but lambda = max |m_i|^2 (correlation ignored)
    g = float((means * means).sum(axis=1).max())
    naive = allocation_pld_epsilon(sigma / math.sqrt(g), means.shape[0], delta)["epsilon"]
    assert naive < lower  # caught: the same check fails for the optimistic variant
    assert report.epsilon <= 1.5 * point  # and the bound is not vacuous


@pytest.mark.slow
@pytest.mark.parametrize("strategy, epochs", [(bsr(64, 4), 1), (ToeplitzStrategy([1.0, 0.8, 0.6], 64), 1), (bsr(128, 4), 2)])
@pytest.mark.parametrize("sigma", [2.0, 3.0, 4.0])
def test_never_below_the_monte_carlo_lower_bound_at_small_delta(strategy, epochs, sigma):
    delta = 1e-5
    scheme = BallsInBinsSampling(epochs, strategy.n)
    report = dpmf.account(strategy, scheme, sigma, delta, method="allocation_pld")
    means = mixture_means(strategy, epochs, strategy.n)
    _, lower = _mc_epsilon_interval(means, sigma, delta, 1_000_000, seed=21)
    assert report.epsilon >= lower
    og = report.diagnostics["reductions"][0]  # orthogonal groups (skipped only when a member is below it)
    assert og["bound"].startswith("orthogonal") and (og["epsilon"] is None or report.epsilon <= og["epsilon"])


def test_gram_skip_for_large_problems(monkeypatch):
    import dpmf.accounting.allocation.correlated as corr

    monkeypatch.setattr(corr, "MAX_GRAM_ENTRIES", 100)
    strategy, scheme = bsr(64, 4), BallsInBinsSampling(1, 64)
    red = corr.strategy_reductions(strategy, scheme, strategy_groups(strategy, scheme))
    assert red.spectral == () and "orthogonal groups only" in red.skipped
    assert gram_matrix(mixture_means(bsr(8, 2), 1, 8)).shape == (8, 8)


def test_combined_allocation_never_above_the_gaussian_mechanism():
    # conditional composition alone is looser than no amplification at small sigma (issue 23:
    # inherent -- per-step Poisson-like pairs whose weights sum to well over one participation);
    # the combined report is capped by revealing the slot (the Gaussian mechanism at sigma / |m|_max)
    strategy, scheme = bsr(16, 4), BallsInBinsSampling(1, 16)
    r = dpmf.account(strategy, scheme, 0.6, 1e-4, method="allocation")
    gauss = dpmf.account(strategy, scheme, 0.6, 1e-4, method="unamplified").epsilon
    assert r.diagnostics["gaussian_epsilon"] == pytest.approx(gauss, rel=1e-9)
    assert r.epsilon <= r.diagnostics["gaussian_epsilon"]
    # (conditional composition is skipped where its own pairs show it cannot lower the bound: it
    # then counts as no lower than the Renyi bound, which its "cannot_lower" entry records)
    raw = max(min(r.diagnostics[k].get("epsilon_by_direction", {}).get(d, math.inf) for k in ("renyi", "conditional"))
              for d in ("remove", "add"))
    assert ("gaussian_cap" in r.diagnostics) == (raw > gauss)
    assert r.epsilon == pytest.approx(min(raw, gauss), rel=1e-12)


def test_members_that_cannot_win_are_skipped_and_the_answer_is_unchanged():
    """A member whose closed-form lower bound exceeds the best epsilon so far is skipped (its row says
    so); computing every member gives the same minimum."""
    from dpmf.accounting.allocation import correlated

    strategy, scheme = dpmf.strategies.BLT([0.9, 0.4], [0.3, 0.2]).to_toeplitz(8), BallsInBinsSampling(1, 8)
    reductions = correlated.strategy_reductions(strategy, scheme, strategy_groups(strategy, scheme))
    out = correlated.reduced_epsilon(reductions, 0.52, 1e-3, allocation_pld_epsilon)
    skipped = [r for r in out["reductions"] if r["epsilon"] is None]
    assert skipped and all("skipped" in r for r in skipped)
    every = [allocation_pld_epsilon(0.52 / math.sqrt(s), n, 1e-3)["epsilon"] for _, n, s in reductions.candidates()]
    assert out["epsilon"] == min(every)
    for r in skipped:  # each skipped member really is above the answer
        assert allocation_pld_epsilon(0.52 / math.sqrt(r["noise_scale_sq"]), r["slots"], 1e-3)["epsilon"] > out["epsilon"]
