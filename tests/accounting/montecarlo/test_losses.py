"""Monte Carlo privacy-loss samplers (Dong & Ganesh 2026): the dynamic programs against brute force
(oracles O1-O5, O14, O15 of notes/bminsep-montecarlo.md Sec. 5.3), the samplers against exact
PLDs and against independently drawn outputs, both directions, determinism, bad input."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpmf.accounting.montecarlo import _loss_bruteforce as bf
from dpmf.errors import DPMFWarning
from dpmf.accounting.montecarlo.losses import (
    describe_loss_sampler,
    log_likelihood_ratio,
    loss_sampler_support,
    privacy_loss_samples,
)
from dpmf.errors import DPMFError, InvalidParameterError, UnsupportedConfigurationError
from dpmf.privacy import subsampled_gaussian
from dpmf.sampling import (
    BallsInBinsSampling,
    CyclicPoissonSampling,
    FixedOrderSampling,
    MinSepSampling,
    PoissonSampling,
)
from dpmf.strategies import DenseStrategy, Identity, ToeplitzStrategy


@dataclass(frozen=True)
class MultiAttribution:
    """Stand-in with the field names of ``dpmf.sampling.MultiAttributionMinSepSampling``."""

    sampling_prob: float
    steps: int
    min_sep: int
    max_user_examples: int
    name: str = "multi-attribution-b-min-sep"


def toeplitz(rng, n, w):
    return ToeplitzStrategy(rng.uniform(0.1, 1.0, size=w), n)


def banded_dense(rng, n, w):
    C = np.tril(rng.uniform(0.1, 1.0, size=(n, n)))
    C[np.tril_indices(n, -w)] = 0.0
    return DenseStrategy(C)


def outputs(rng, C, n, sigma, count=4):
    """Outputs y where the ratio is interesting: noise around a random participation pattern."""
    x = (rng.random((n, count)) < 0.4).astype(float)
    return C @ x + sigma * rng.standard_normal((n, count))


def delta_hat(L, eps):
    v = -np.expm1(np.minimum(eps - L, 0.0))
    return v.mean(), v.std(ddof=1) / math.sqrt(v.size)


# ============================================================================ O1, O2: DP = brute force
@pytest.mark.parametrize("n,b,w", [(6, 2, 2), (7, 3, 3), (5, 1, 1), (8, 4, 4), (10, 3, 2), (12, 4, 3), (9, 4, 1)])
@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("kind", ["toeplitz", "dense"])
def test_minsep_dp_equals_brute_force(n, b, w, warm, kind):
    rng = np.random.default_rng(1000 * n + 10 * b + w + warm)
    strat = toeplitz(rng, n, w) if kind == "toeplitz" else banded_dense(rng, n, w)
    C = strat.encoder()
    for p in (0.3, 0.85):
        scheme = MinSepSampling(p, n, b, warm_start=warm)
        sigma = 0.8
        Y = outputs(rng, C, n, sigma)
        got = log_likelihood_ratio(strat, scheme, sigma, Y)
        pats = bf.minsep_patterns(n, b, p, warm)
        assert abs(sum(q for q, _ in pats) - 1) < 1e-12
        want = [bf.log_mixture_ratio(C, pats, sigma, Y[:, j]) for j in range(Y.shape[1])]
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


def test_minsep_p1_modes_equal_brute_force_cold_and_warm():
    rng = np.random.default_rng(3)
    n, b = 11, 4
    strat = toeplitz(rng, n, 3)
    C = strat.encoder()
    Y = outputs(rng, C, n, 0.7)
    for warm in (False, True):
        scheme = MinSepSampling(1.0, n, b, warm_start=warm)
        got = log_likelihood_ratio(strat, scheme, 0.7, Y)
        want = [bf.log_mixture_ratio(C, bf.minsep_patterns(n, b, 1.0, warm), 0.7, Y[:, j]) for j in range(4)]
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


# ============================================================================ O3: b = 1 is Poisson
def test_b1_is_poisson_closed_form():
    rng = np.random.default_rng(4)
    n, p, sigma, c0 = 9, 0.3, 1.3, 0.7
    strat = ToeplitzStrategy(np.array([c0]), n)
    Y = rng.normal(0.4, sigma, size=(n, 5))
    closed = np.log((1 - p) + p * np.exp((c0 * Y - c0**2 / 2) / sigma**2)).sum(axis=0)
    for scheme in (MinSepSampling(p, n, 1), MinSepSampling(p, n, 1, warm_start=True), PoissonSampling(p, n)):
        np.testing.assert_allclose(log_likelihood_ratio(strat, scheme, sigma, Y), closed, rtol=1e-12)
    # and the brute-force mixture over {0,1}^n
    want = bf.log_mixture_ratio(strat.encoder(), bf.poisson_patterns(n, p), sigma, Y[:, 0])
    assert abs(closed[0] - want) < 1e-11


@pytest.mark.parametrize("direction", ["remove", "add"])
def test_b1_samples_match_poisson_pld(direction):
    """delta(eps) from 40k samples of 1-min-sep vs the pessimistic PLD of Poisson DP-SGD."""
    n, p, sigma = 8, 0.25, 0.9
    pld = subsampled_gaussian(sigma, p).self_compose(n)
    L = privacy_loss_samples(Identity(n), MinSepSampling(p, n, 1), sigma, 40_000, np.random.default_rng(5), direction=direction)
    for eps in (0.25, 0.5, 1.0, 1.5):
        est, se = delta_hat(L, eps)
        exact = pld.delta_by_direction(eps)[direction]
        # the PLD is pessimistic by at most its discretization effect (tiny here); 4.5 s.e. of MC
        assert abs(est - exact) <= 4.5 * se + 2e-4, (eps, est, exact, se)


def test_poisson_scheme_samples_match_pld_both_directions():
    n, p, sigma = 6, 0.4, 1.1
    pld = subsampled_gaussian(sigma, p).self_compose(n)
    for direction in ("remove", "add"):
        L = privacy_loss_samples(Identity(n), PoissonSampling(p, n), sigma, 40_000, np.random.default_rng(6), direction=direction)
        for eps in (0.5, 1.0):
            est, se = delta_hat(L, eps)
            assert abs(est - pld.delta_by_direction(eps)[direction]) <= 4.5 * se + 2e-4


# ============================================================================ O4: warm p = 1 = balls-in-bins
def test_warm_p1_equals_balls_in_bins_on_same_y():
    rng = np.random.default_rng(7)
    n, T = 12, 4
    strat = toeplitz(rng, n, 4)
    Y = outputs(rng, strat.encoder(), n, 0.9, count=6)
    a = log_likelihood_ratio(strat, MinSepSampling(1.0, n, T, warm_start=True), 0.9, Y)
    b = log_likelihood_ratio(strat, BallsInBinsSampling(n // T, n), 0.9, Y)
    np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
    want = [bf.log_mixture_ratio(strat.encoder(), bf.balls_in_bins_patterns(n, T), 0.9, Y[:, j]) for j in range(6)]
    np.testing.assert_allclose(b, want, rtol=1e-11)
    # the DP with p -> 1 converges to the same function (log(1-p) -> -inf handled by the p = 1 path)
    near = log_likelihood_ratio(strat, MinSepSampling(1 - 1e-12, n, T, warm_start=True), 0.9, Y)
    np.testing.assert_allclose(near, a, atol=1e-9)


def test_warm_p1_and_balls_in_bins_samples_identical():
    strat = ToeplitzStrategy(np.array([1.0, 0.6, 0.3]), 16)
    a = privacy_loss_samples(strat, MinSepSampling(1.0, 16, 8, warm_start=True), 1.0, 3000, np.random.default_rng(8))
    b = privacy_loss_samples(strat, BallsInBinsSampling(2, 16), 1.0, 3000, np.random.default_rng(8))
    np.testing.assert_array_equal(a, b)


# ============================================================================ O5: multi-attribution
@pytest.mark.parametrize("n,b,w,k", [(6, 3, 3, 2), (7, 2, 2, 3), (8, 3, 2, 2), (5, 1, 1, 2)])
def test_multi_attribution_dp_equals_brute_force(n, b, w, k):
    rng = np.random.default_rng(n * 100 + k)
    strat = toeplitz(rng, n, w)
    C = strat.encoder()
    scheme = MultiAttribution(0.3, n, b, k)
    Y = outputs(rng, C, n, 0.9)
    got = log_likelihood_ratio(strat, scheme, 0.9, Y)
    pats = bf.multi_attribution_patterns(n, b, 0.3, k)
    want = [bf.log_mixture_ratio(C, pats, 0.9, Y[:, j]) for j in range(Y.shape[1])]
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


def test_multi_attribution_k1_is_cold_min_sep():
    rng = np.random.default_rng(9)
    strat = toeplitz(rng, 10, 3)
    Y = outputs(rng, strat.encoder(), 10, 1.0)
    a = log_likelihood_ratio(strat, MultiAttribution(0.4, 10, 3, 1), 1.0, Y)
    b = log_likelihood_ratio(strat, MinSepSampling(0.4, 10, 3), 1.0, Y)
    np.testing.assert_allclose(a, b, rtol=1e-13)


# ============================================================================ O14: App. B upper bound
@pytest.mark.parametrize("r,warm", [(1, False), (2, False), (3, False), (2, True), (3, True)])
def test_app_b_recursion_upper_bounds_brute_force(r, warm):
    rng = np.random.default_rng(10 + r)
    n = 9
    C = np.tril(rng.uniform(0.05, 1.0, size=(n, n)))  # dense: not banded
    strat = DenseStrategy(C)
    scheme = MinSepSampling(0.35, n, r, warm_start=warm)
    assert describe_loss_sampler(strat, scheme)["exact"] is False
    Y = outputs(rng, C, n, 0.8, count=8)
    got = log_likelihood_ratio(strat, scheme, 0.8, Y)
    want = np.array([bf.log_mixture_ratio(C, bf.minsep_patterns(n, r, 0.35, warm), 0.8, Y[:, j]) for j in range(8)])
    assert np.all(got >= want - 1e-12)
    assert np.any(got > want + 1e-6)  # a real bound, not an equality, for dense C


def test_poisson_dense_c_is_upper_bound_and_remove_only():
    rng = np.random.default_rng(11)
    n = 8
    C = np.tril(rng.uniform(0.05, 1.0, size=(n, n)))
    strat = DenseStrategy(C)
    Y = outputs(rng, C, n, 1.0)
    got = log_likelihood_ratio(strat, PoissonSampling(0.3, n), 1.0, Y)
    want = [bf.log_mixture_ratio(C, bf.poisson_patterns(n, 0.3), 1.0, Y[:, j]) for j in range(4)]
    assert np.all(got >= np.array(want) - 1e-12)
    assert loss_sampler_support(strat, PoissonSampling(0.3, n)) is not None
    assert loss_sampler_support(strat, PoissonSampling(0.3, n), direction="remove") is None
    with pytest.raises(UnsupportedConfigurationError, match="add direction"):
        privacy_loss_samples(strat, PoissonSampling(0.3, n), 1.0, 10, np.random.default_rng(0), direction="add")


# ============================================================================ O15: truncated (App. D)
@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("n,b,w", [(6, 2, 2), (8, 3, 3), (7, 3, 2)])
def test_truncated_dp_equals_brute_force(n, b, w, warm):
    rng = np.random.default_rng(20 + n + b + warm)
    strat = toeplitz(rng, n, w)
    C = strat.encoder()
    B = 3
    scheme = MinSepSampling(0.4, n, b, warm_start=warm, max_batch_size=B)
    Y = outputs(rng, C, n, 0.9)
    R = rng.integers(0, 7, size=Y.shape)  # both truncated (r >= 3) and untruncated rounds
    got = log_likelihood_ratio(strat, scheme, 0.9, Y, rest_batch_sizes=R)
    want = [bf.truncated_log_ratio(C, n, b, 0.4, warm, R[:, j], B, 0.9, Y[:, j]) for j in range(Y.shape[1])]
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


def test_truncation_never_triggered_equals_untruncated():
    rng = np.random.default_rng(21)
    strat = toeplitz(rng, 9, 3)
    Y = outputs(rng, strat.encoder(), 9, 1.0)
    R = np.zeros(Y.shape, dtype=int)
    a = log_likelihood_ratio(strat, MinSepSampling(0.3, 9, 3, True, max_batch_size=5), 1.0, Y, rest_batch_sizes=R)
    b = log_likelihood_ratio(strat, MinSepSampling(0.3, 9, 3, True), 1.0, Y)
    np.testing.assert_allclose(a, b, rtol=1e-12)


# ============================================================================ cyclic Poisson
def test_cyclic_independent_equals_brute_force():
    rng = np.random.default_rng(22)
    n, T = 9, 3
    strat = toeplitz(rng, n, 3)
    Y = outputs(rng, strat.encoder(), n, 0.8)
    got = log_likelihood_ratio(strat, CyclicPoissonSampling(0.4, n, T, "independent"), 0.8, Y)
    want = [bf.log_mixture_ratio(strat.encoder(), bf.cyclic_patterns(n, T, 0.4, range(T)), 0.8, Y[:, j]) for j in range(4)]
    np.testing.assert_allclose(got, want, rtol=1e-11)


def test_cyclic_equal_is_phase_zero_and_samples_match_pld():
    rng = np.random.default_rng(23)
    n, T = 10, 3
    strat = toeplitz(rng, n, 2)
    Y = outputs(rng, strat.encoder(), n, 0.8)
    got = log_likelihood_ratio(strat, CyclicPoissonSampling(0.4, n, T), 0.8, Y)
    want = [bf.log_mixture_ratio(strat.encoder(), bf.cyclic_patterns(n, T, 0.4, [0]), 0.8, Y[:, j]) for j in range(4)]
    np.testing.assert_allclose(got, want, rtol=1e-11)
    # samples: 4 participations of phase 0 with sensitivities = column norms (all full here)
    coefs = np.array([1.0, 0.5])
    strat = ToeplitzStrategy(coefs, 12)
    sens = float(np.linalg.norm(coefs))
    pld = subsampled_gaussian(1.0, 0.5, sens).self_compose(4)
    for direction in ("remove", "add"):
        L = privacy_loss_samples(strat, CyclicPoissonSampling(0.5, 12, 3), 1.0, 40_000, np.random.default_rng(24), direction=direction)
        for eps in (0.5, 1.0, 2.0):
            est, se = delta_hat(L, eps)
            assert abs(est - pld.delta_by_direction(eps)[direction]) <= 4.5 * se + 2e-4


# ============================================================================ samplers vs independent y
def _direct_samples(strat, scheme, sigma, count, rng, direction, patterns, rest=None):
    """Losses on y drawn here from the brute-force pattern law (or N(0, sigma^2 I) for add)."""
    C = strat.encoder()
    n = C.shape[0]
    Y = sigma * rng.standard_normal((n, count))
    if direction == "remove":
        probs = np.array([q for q, _ in patterns])
        X = np.array([x for _, x in patterns], dtype=float)
        pick = rng.choice(len(patterns), size=count, p=probs / probs.sum())
        Y += C @ X[pick].T
    L = log_likelihood_ratio(strat, scheme, sigma, Y)
    return L if direction == "remove" else -L


@pytest.mark.parametrize(
    "scheme_factory,pattern_factory",
    [
        (lambda n: MinSepSampling(0.3, n, 3), lambda n: bf.minsep_patterns(n, 3, 0.3, False)),
        (lambda n: MinSepSampling(0.3, n, 3, warm_start=True), lambda n: bf.minsep_patterns(n, 3, 0.3, True)),
        (lambda n: MinSepSampling(1.0, n, 4, warm_start=True), lambda n: bf.minsep_patterns(n, 4, 1.0, True)),
        (lambda n: BallsInBinsSampling(2, n), lambda n: bf.balls_in_bins_patterns(n, n // 2)),
        (lambda n: MultiAttribution(0.3, n, 3, 2), lambda n: bf.multi_attribution_patterns(n, 3, 0.3, 2)),
        (lambda n: CyclicPoissonSampling(0.4, n, 3, "independent"), lambda n: bf.cyclic_patterns(n, 3, 0.4, range(3))),
        (lambda n: PoissonSampling(0.3, n), lambda n: bf.poisson_patterns(n, 0.3)),
    ],
)
@pytest.mark.parametrize("direction", ["remove", "add"])
def test_sampler_law_matches_independent_outputs(scheme_factory, pattern_factory, direction):
    """Two-sample KS test: our sampler vs y drawn from the enumerated law (catches wrong x laws)."""
    n = 8
    scheme = scheme_factory(n)
    # exact Poisson needs a diagonal C; every other scheme gets a 3-band Toeplitz C
    strat = Identity(n) if isinstance(scheme, PoissonSampling) else ToeplitzStrategy(np.array([1.0, 0.6, 0.2]), n)
    ours = privacy_loss_samples(strat, scheme, 0.7, 20_000, np.random.default_rng(30), direction=direction)
    ref = _direct_samples(strat, scheme, 0.7, 20_000, np.random.default_rng(31), direction, pattern_factory(n))
    assert stats.ks_2samp(ours, ref).pvalue > 1e-4


@pytest.mark.parametrize("direction", ["remove", "add"])
@pytest.mark.parametrize("warm", [False, True])
def test_truncated_sampler_identity_and_r_law(direction, warm):
    """E[e^{-L}] = 1 (the ratio integrates to one under the sampling law) and the r_i mean."""
    n, b, m, B = 10, 3, 40, 4
    strat = ToeplitzStrategy(np.array([1.0, 0.5, 0.25]), n)
    scheme = MinSepSampling(0.3, n, b, warm_start=warm, max_batch_size=B)
    L = privacy_loss_samples(strat, scheme, 0.8, 40_000, np.random.default_rng(32), direction=direction, dataset_size=m)
    v = np.exp(-L)
    assert abs(v.mean() - 1) < 5 * v.std() / math.sqrt(v.size)
    assert np.all(np.isfinite(L))
    # the aggregate chain of the other examples: warm start has mean (m-1) p0 at every step
    from dpmf.accounting.montecarlo.losses import _rest_batch_sizes

    r = _rest_batch_sizes(n, b, 0.3, warm, m, 20_000, np.random.default_rng(33))
    p0 = 1 / (1 / 0.3 + b - 1)
    if warm:
        np.testing.assert_allclose(r.mean(axis=1), (m - 1) * p0, rtol=0.02)
    else:
        assert abs(r[0].mean() - (m - 1) * 0.3) < 0.1


@pytest.mark.parametrize(
    "scheme",
    [MinSepSampling(0.3, 12, 3), MinSepSampling(0.3, 12, 3, True), BallsInBinsSampling(3, 12), MultiAttribution(0.2, 12, 3, 2)],
)
def test_remove_losses_integrate_to_one(scheme):
    """E_P[Q/P] = 1 and E_Q[P/Q] = 1 for every exact sampler."""
    strat = ToeplitzStrategy(np.array([1.0, 0.5, 0.2]), 12)
    for direction in ("remove", "add"):
        v = np.exp(-privacy_loss_samples(strat, scheme, 1.0, 40_000, np.random.default_rng(34), direction=direction))
        assert abs(v.mean() - 1) < 5 * v.std() / math.sqrt(v.size)


# ============================================================================ determinism, chunks
def test_deterministic_given_rng_state_and_chunked(monkeypatch):
    from dpmf.accounting.montecarlo import losses

    monkeypatch.setattr(losses, "_CHUNK_ELEMENTS", 64 * 100)  # 100 samples per chunk at n = 64
    monkeypatch.setattr(losses, "_MIN_CHUNK", 1)
    strat = ToeplitzStrategy(np.array([1.0, 0.5, 0.25, 0.1]), 64)
    for scheme in (MinSepSampling(0.05, 64, 4, warm_start=True), BallsInBinsSampling(2, 64)):
        a = privacy_loss_samples(strat, scheme, 1.0, 3000, np.random.default_rng(40))  # 30 chunks
        b = privacy_loss_samples(strat, scheme, 1.0, 3000, np.random.default_rng(40))
        c = privacy_loss_samples(strat, scheme, 1.0, 3000, np.random.default_rng(41))
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)
        assert a.dtype == np.float64 and a.shape == (3000,)
        assert stats.ks_2samp(a[:1500], a[1500:]).pvalue > 1e-4  # chunks are i.i.d.
        monkeypatch.setattr(losses, "_CHUNK_ELEMENTS", 1 << 21)
        whole = privacy_loss_samples(strat, scheme, 1.0, 3000, np.random.default_rng(40))  # one chunk
        assert stats.ks_2samp(a, whole).pvalue > 1e-4
        monkeypatch.setattr(losses, "_CHUNK_ELEMENTS", 64 * 100)


# ============================================================================ bad input
def test_bad_input():
    n = 8
    ok = ToeplitzStrategy(np.array([1.0, 0.5]), n)
    rng = np.random.default_rng(0)
    neg = ToeplitzStrategy(np.array([1.0, -0.5]), n)
    with pytest.raises(UnsupportedConfigurationError, match="non-negative"):
        privacy_loss_samples(neg, MinSepSampling(0.3, n, 2), 1.0, 10, rng)
    Cneg = np.tril(np.ones((n, n)))
    Cneg[3, 1] = -0.1
    with pytest.raises(UnsupportedConfigurationError, match=r"C\[3, 1\]"):
        privacy_loss_samples(DenseStrategy(Cneg), BallsInBinsSampling(1, n), 1.0, 10, rng)
    with pytest.raises(UnsupportedConfigurationError, match="min_sep"):
        privacy_loss_samples(ok, MultiAttribution(0.3, n, 1, 2), 1.0, 10, rng)
    with pytest.raises(UnsupportedConfigurationError, match="min_sep"):
        privacy_loss_samples(ok, MinSepSampling(0.3, n, 1, max_batch_size=3), 1.0, 10, rng, dataset_size=10)
    with pytest.raises(UnsupportedConfigurationError, match="cycle_length"):
        privacy_loss_samples(ToeplitzStrategy(np.ones(3), n), CyclicPoissonSampling(0.3, n, 2), 1.0, 10, rng)
    with pytest.raises(UnsupportedConfigurationError, match="add direction"):
        privacy_loss_samples(ToeplitzStrategy(np.ones(3), n), MinSepSampling(0.3, n, 2), 1.0, 10, rng, direction="add")
    with pytest.raises(UnsupportedConfigurationError, match="fixed-order"):
        privacy_loss_samples(ok, FixedOrderSampling(2, n), 1.0, 10, rng)
    with pytest.raises(InvalidParameterError, match="scheme.steps"):
        privacy_loss_samples(ok, MinSepSampling(0.3, n + 1, 2), 1.0, 10, rng)
    with pytest.raises(InvalidParameterError, match="dataset_size"):
        privacy_loss_samples(ok, MinSepSampling(0.3, n, 2, max_batch_size=3), 1.0, 10, rng)
    for sigma in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidParameterError, match="noise_multiplier"):
            privacy_loss_samples(ok, MinSepSampling(0.3, n, 2), sigma, 10, rng)
    with pytest.raises(InvalidParameterError, match="num_samples"):
        privacy_loss_samples(ok, MinSepSampling(0.3, n, 2), 1.0, 0, rng)
    with pytest.raises(InvalidParameterError, match="rng"):
        privacy_loss_samples(ok, MinSepSampling(0.3, n, 2), 1.0, 10, 123)
    with pytest.raises(InvalidParameterError, match="direction"):
        privacy_loss_samples(ok, MinSepSampling(0.3, n, 2), 1.0, 10, rng, direction="both")
    with pytest.raises(InvalidParameterError, match="shape"):
        log_likelihood_ratio(ok, MinSepSampling(0.3, n, 2), 1.0, np.zeros(n + 1))
    with pytest.raises(InvalidParameterError):
        privacy_loss_samples(object(), MinSepSampling(0.3, n, 2), 1.0, 10, rng)
    # p0 (b - 1) >= 1 cannot be turned into a b-min-sep scheme
    with pytest.raises(InvalidParameterError, match="participation_rate"):
        MinSepSampling.from_participation_rate(0.25, n, 5)
    # support strings name the problem; supported pairs give None
    assert "non-negative" in loss_sampler_support(neg, MinSepSampling(0.3, n, 2))
    assert "cycle_length" in loss_sampler_support(ToeplitzStrategy(np.ones(3), n), CyclicPoissonSampling(0.3, n, 2))
    assert loss_sampler_support(ok, MinSepSampling(0.3, n, 2)) is None
    assert loss_sampler_support(ok, MultiAttribution(0.3, n, 2, 2)) is None
    with pytest.raises(InvalidParameterError):
        loss_sampler_support(ok, MinSepSampling(0.3, n, 2), direction="sideways")
    assert issubclass(UnsupportedConfigurationError, DPMFError)


# ============================================================================ edge cases
@pytest.mark.parametrize("p", [1.0, 0.4])
@pytest.mark.parametrize("warm", [False, True])
def test_min_sep_longer_than_horizon(p, warm):
    """b > n: at most one participation; the DP and the modes path agree with brute force."""
    rng = np.random.default_rng(50)
    strat = toeplitz(rng, 7, 2)
    Y = outputs(rng, strat.encoder(), 7, 1.0)
    with pytest.warns(DPMFWarning, match="longer than the run"):  # on purpose: the edge case under test
        scheme = MinSepSampling(p, 7, 20, warm_start=warm)
    got = log_likelihood_ratio(strat, scheme, 1.0, Y)
    want = [bf.log_mixture_ratio(strat.encoder(), bf.minsep_patterns(7, 20, p, warm), 1.0, Y[:, j]) for j in range(4)]
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)
    v = np.exp(-privacy_loss_samples(strat, scheme, 1.0, 20_000, np.random.default_rng(51)))
    assert abs(v.mean() - 1) < 5 * v.std() / math.sqrt(v.size)


def test_multi_attribution_p1_equals_brute_force():
    rng = np.random.default_rng(52)
    strat = toeplitz(rng, 7, 2)
    Y = outputs(rng, strat.encoder(), 7, 1.0)
    got = log_likelihood_ratio(strat, MultiAttribution(1.0, 7, 2, 2), 1.0, Y)
    want = [bf.log_mixture_ratio(strat.encoder(), bf.multi_attribution_patterns(7, 2, 1.0, 2), 1.0, Y[:, j]) for j in range(4)]
    np.testing.assert_allclose(got, want, rtol=1e-11)


@pytest.mark.parametrize("scale", [1.0, 40.0, 400.0, 3000.0])
@pytest.mark.parametrize("p,sep", [(0.3, 3), (0.999, 5), (1e-4, 4), (0.5, 1), (1.0, 3)])
def test_fast_dp_equals_log_space_dp_including_fallback(scale, p, sep):
    """The rescaled linear-space DP (with its log-space fallback) equals the log-space DP."""
    from dpmf.accounting.montecarlo._loss_kernels import backward_dp, backward_dp_log

    rng = np.random.default_rng(53)
    lp = rng.standard_normal((60, 300)) * scale + math.log(p)
    ls = math.log1p(-p) if p < 1 else -math.inf
    for warm in (None, math.log(p)):
        a = backward_dp(lp, ls, sep, warm_log_p=warm)
        b = backward_dp_log(lp, ls, sep, warm_log_p=warm)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * scale)


def test_small_sigma_losses_match_brute_force():
    """sigma = 0.05: likelihood ratios of e^{+-hundreds} (the fallback path) stay exact."""
    rng = np.random.default_rng(54)
    n, b = 9, 3
    strat = toeplitz(rng, n, 3)
    scheme = MinSepSampling(0.4, n, b, warm_start=True)
    Y = outputs(rng, strat.encoder(), n, 0.05, count=6)
    got = log_likelihood_ratio(strat, scheme, 0.05, Y)
    want = [bf.log_mixture_ratio(strat.encoder(), bf.minsep_patterns(n, b, 0.4, True), 0.05, Y[:, j]) for j in range(6)]
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert np.max(np.abs(want)) > 50


# ============================================================================ truncated sampler law
def test_rest_batch_sizes_conditional_law():
    """Cold start: r_0 ~ Bin(m-1, p); E[r_1 | r_0] = (m-1-r_0) p; E[r_2 | r_0, r_1] = (m-1-r_1) p (b = 2)."""
    from dpmf.accounting.montecarlo.losses import _rest_batch_sizes

    m, p = 30, 0.3
    r = _rest_batch_sizes(3, 2, p, False, m, 200_000, np.random.default_rng(55))
    assert abs(r[0].mean() - (m - 1) * p) < 0.02
    assert abs(r[0].var() - (m - 1) * p * (1 - p)) < 0.05
    for resid in (r[1] - (m - 1 - r[0]) * p, r[2] - (m - 1 - r[1]) * p):
        assert abs(resid.mean()) < 0.02
        assert abs(np.corrcoef(resid, r[0])[0, 1]) < 0.01


@pytest.mark.parametrize("direction", ["remove", "add"])
def test_truncated_sampler_law_given_r(direction):
    """KS test: our truncated sampler vs y drawn from the enumerated App. D law given r."""
    from dpmf.accounting.montecarlo.losses import _rest_batch_sizes
    from itertools import product as iproduct

    n, b, m, B, p, sigma = 6, 2, 12, 3, 0.35, 0.8
    strat = ToeplitzStrategy(np.array([1.0, 0.5]), n)
    C = strat.encoder()
    scheme = MinSepSampling(p, n, b, warm_start=True, max_batch_size=B)
    ours = privacy_loss_samples(strat, scheme, sigma, 20_000, np.random.default_rng(56), direction=direction, dataset_size=m)
    count = 4000
    gen = np.random.default_rng(57)
    R = _rest_batch_sizes(n, b, p, True, m, count, gen)
    pats = bf.minsep_patterns(n, b, p, True)
    Y = sigma * gen.standard_normal((n, count))
    for j in range(count):
        options, weights = [], []
        for prob, x in pats:
            cut = [i for i in range(n) if x[i] and R[i, j] >= B]
            for outcome in iproduct((0, 1), repeat=len(cut)):
                w, mean = prob, np.array(x, dtype=float) if direction == "remove" else np.zeros(n)
                for i, surv in zip(cut, outcome):
                    tp = B / (R[i, j] + 1)
                    w *= tp if surv else 1 - tp
                    if direction == "remove":
                        mean[i] = 2.0 if surv else 0.0
                    else:
                        mean[i] = -1.0 if surv else 0.0
                options.append(mean)
                weights.append(w)
        weights = np.array(weights)
        Y[:, j] += C @ options[gen.choice(len(options), p=weights / weights.sum())]
    L = log_likelihood_ratio(strat, scheme, sigma, Y, rest_batch_sizes=R)
    ref = L if direction == "remove" else -L
    assert stats.ks_2samp(ours, ref).pvalue > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["remove", "add"])
def test_b1_samples_match_poisson_pld_tight(direction):
    """Slow, tighter version of test_b1_samples_match_poisson_pld: 10^6 samples, n = 20."""
    n, p, sigma = 20, 0.1, 0.8
    pld = subsampled_gaussian(sigma, p, discretization=1e-5).self_compose(n)
    L = privacy_loss_samples(Identity(n), MinSepSampling(p, n, 1), sigma, 1_000_000, np.random.default_rng(60), direction=direction)
    for eps in (0.5, 1.0, 2.0, 3.0):
        est, se = delta_hat(L, eps)
        exact = pld.delta_by_direction(eps)[direction]
        assert abs(est - exact) <= 4.5 * se + 2e-5, (eps, est, exact, se)


def test_cyclic_equal_with_varying_column_norms_uses_a_dominating_phase():
    """Dense banded C whose phases have incomparable column norms: the sampled pair is the
    virtual phase of the largest norms (exact=False), which dominates every real phase."""
    n, T = 6, 2
    C = np.eye(n)
    C[3, 3] = 1.5  # phase 1 (steps 1, 3, 5): norms (1, 1.5, 1)
    C[4, 4] = 2.0  # phase 0 (steps 0, 2, 4): norms (1, 1, 2)
    strat = DenseStrategy(C)
    scheme = CyclicPoissonSampling(0.5, n, T)
    info = describe_loss_sampler(strat, scheme)
    assert info["exact"] is False and info["directions"] == ("remove", "add")
    C[4, 4] = 1.0
    assert describe_loss_sampler(DenseStrategy(C), scheme)["exact"] is True  # phase 1 is the worst
    L = privacy_loss_samples(strat, scheme, 1.0, 40_000, np.random.default_rng(61))
    # the virtual phase has sensitivities (1, 1.5, 2)
    worst = subsampled_gaussian(1.0, 0.5).compose(subsampled_gaussian(1.0, 0.5, 1.5)).compose(
        subsampled_gaussian(1.0, 0.5, 2.0)
    )
    for eps in (0.5, 1.0):
        est, se = delta_hat(L, eps)
        assert abs(est - worst.delta_by_direction(eps)["remove"]) <= 4.5 * se + 2e-4


def test_fast_dp_affine_form_equals_explicit_exponents():
    from dpmf.accounting.montecarlo._loss_kernels import backward_dp

    rng = np.random.default_rng(62)
    d = rng.standard_normal((40, 200)) * 30
    h = rng.random(40) * 5
    for warm in (None, math.log(0.3)):
        a = backward_dp(d, math.log1p(-0.3), 4, warm_log_p=warm, affine=(0.7, h))
        b = backward_dp(0.7 * d - h[:, None], math.log1p(-0.3), 4, warm_log_p=warm)
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-12)


# ============================================================================ property: DP = brute force
@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 9),
    b=st.integers(1, 5),
    w_frac=st.floats(0, 1),
    p=st.floats(0.01, 1.0),
    sigma=st.floats(0.2, 3.0),
    warm=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_property_minsep_dp_equals_brute_force(n, b, w_frac, p, sigma, warm, seed):
    rng = np.random.default_rng(seed)
    w = 1 + int(w_frac * (min(b, n) - 1))  # 1 <= bands <= min(b, n)
    strat = ToeplitzStrategy(rng.uniform(0.05, 1.5, size=w), n)
    with warnings.catch_warnings():  # b > n is in the property's domain (it warns users: "did you swap them?")
        warnings.simplefilter("ignore", DPMFWarning)
        scheme = MinSepSampling(p, n, b, warm_start=warm)
    Y = outputs(rng, strat.encoder(), n, sigma, count=2)
    got = log_likelihood_ratio(strat, scheme, sigma, Y)
    pats = bf.minsep_patterns(n, b, p, warm)
    want = [bf.log_mixture_ratio(strat.encoder(), pats, sigma, Y[:, j]) for j in range(2)]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
