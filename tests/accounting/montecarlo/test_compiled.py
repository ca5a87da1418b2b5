"""The compiled Monte Carlo backend: its Gaussian generator, its participation chain, and its
dynamic program against the numpy reference (``_loss_kernels``) and brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpmf.accounting.montecarlo import _compiled
from dpmf.accounting.montecarlo._loss_kernels import backward_dp, backward_dp_log
from dpmf.accounting.montecarlo._xoshiro import ZIG_X, fill_indices, fill_normal, seed_state
from dpmf.accounting.montecarlo.losses import privacy_loss_samples
from dpmf.errors import InvalidParameterError
from dpmf.sampling import BallsInBinsSampling, MinSepSampling
from dpmf.strategies import Identity, ToeplitzStrategy


# ============================================================================ the generator
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ziggurat_normals_are_standard_normal(seed):
    z = np.empty(400_000)
    fill_normal(z, seed_state(np.random.default_rng(seed)))
    assert stats.kstest(z, "norm").pvalue > 1e-4
    se = 1 / math.sqrt(z.size)
    assert abs(z.mean()) < 5 * se
    assert abs(z.var() - 1) < 5 * math.sqrt(2) * se
    assert abs(stats.skew(z)) < 5 * math.sqrt(6) * se
    assert abs(stats.kurtosis(z)) < 5 * math.sqrt(24) * se


def test_ziggurat_tail_and_wedges():
    """Mass beyond r (the exponential-rejection tail) and in a band of every layer boundary
    (where the wedge test decides) match the normal law within binomial error."""
    z = np.empty(4_000_000)
    fill_normal(z, seed_state(np.random.default_rng(7)))
    a = np.abs(z)
    for lo, hi in [(ZIG_X[1], np.inf), (4.5, np.inf), (ZIG_X[2], ZIG_X[1]), (ZIG_X[128], ZIG_X[127]), (ZIG_X[255], ZIG_X[254])]:
        p = 2 * (stats.norm.sf(lo) - stats.norm.sf(hi))
        got = np.mean((a >= lo) & (a < hi))
        assert abs(got - p) <= 5 * math.sqrt(p * (1 - p) / a.size) + 1e-9, (lo, hi, got, p)
    assert np.mean(z > 0) == pytest.approx(0.5, abs=5 * 0.5 / math.sqrt(z.size))


def test_state_is_deterministic_and_advances():
    s = seed_state(np.random.default_rng(3))
    assert s.dtype == np.uint64 and s.shape == (4,) and s.any()
    t = s.copy()
    a, b = np.empty(100), np.empty(100)
    fill_normal(a, s)
    assert not np.array_equal(s, t)
    fill_normal(b, t.copy())
    np.testing.assert_array_equal(a, b)
    c = np.empty(100)
    fill_normal(c, s)  # continues the stream
    assert not np.array_equal(a, c)


def test_uniform_indices_are_uniform():
    out = np.empty(200_000, dtype=np.int64)
    fill_indices(seed_state(np.random.default_rng(5)), 7, out)
    counts = np.bincount(out, minlength=7)
    assert counts.size == 7
    assert stats.chisquare(counts).pvalue > 1e-4


# ============================================================================ the participation chain
def _patterns(p, n, b, warm, count, seed):
    """Participation patterns drawn by the compiled chain: C = I and sigma tiny, so y = x."""
    Y = np.empty((count, n))
    _compiled.minsep_outputs(np.zeros((1, 1)), np.ones(1), True, 1e-12, p, b, warm, True, seed_state(np.random.default_rng(seed)), Y)
    X = np.rint(Y)
    assert np.all(np.abs(Y - X) < 1e-9) and set(np.unique(X)) <= {0.0, 1.0}
    return X


@pytest.mark.parametrize("b", [1, 3, 8])
def test_warm_start_batch_mean_is_p0_at_every_step(b):
    """Warm start is stationary: P(participate at step i) = p0 = 1/(1/p + b - 1) for every i."""
    p, n, count = 0.3, 24, 100_000
    X = _patterns(p, n, b, True, count, 11)
    p0 = 1 / (1 / p + b - 1)
    np.testing.assert_allclose(X.mean(axis=0), p0, atol=5 * math.sqrt(p0 * (1 - p0) / count))


def test_cold_start_law_and_min_separation():
    p, n, b, count = 0.4, 20, 4, 50_000
    X = _patterns(p, n, b, False, count, 12)
    # first step: probability p; every pair of participations at least b apart
    assert abs(X[:, 0].mean() - p) < 5 * math.sqrt(p * (1 - p) / count)
    for row in X[:2000]:
        t = np.flatnonzero(row)
        assert np.all(np.diff(t) >= b)
    # step 1 is barred after a participation at step 0 and otherwise has probability p
    assert np.all(X[X[:, 0] == 1, 1] == 0)
    rest = X[X[:, 0] == 0, 1]
    assert abs(rest.mean() - p) < 5 * math.sqrt(p * (1 - p) / rest.size)


def test_warm_start_p1_is_a_uniform_phase():
    X = _patterns(1.0, 12, 4, True, 40_000, 13)
    first = X.argmax(axis=1)
    assert np.all(X.sum(axis=1) == 3)
    assert stats.chisquare(np.bincount(first, minlength=4)).pvalue > 1e-4


# ============================================================================ the dynamic program
def _dp_compiled(X, p, b, warm):
    n, S = X.shape
    out = np.empty(S)
    with np.errstate(over="ignore"):  # e^{x} = inf sends a sample to the log-space fallback
        E = np.exp(X)
    _compiled.minsep_dp(X, E, p, b, warm, np.empty((n + b, S)), out)
    return out


@pytest.mark.parametrize("scale", [1.0, 40.0, 400.0, 3000.0])
@pytest.mark.parametrize("p,b", [(0.3, 3), (0.999, 5), (1e-4, 4), (0.5, 1), (0.2, 70)])
@pytest.mark.parametrize("warm", [False, True])
def test_compiled_dp_equals_numpy_and_log_space(scale, p, b, warm):
    """Same recursion as ``backward_dp`` (rescaling and fallback included) and as the log-space DP."""
    rng = np.random.default_rng(60)
    X = np.maximum(rng.standard_normal((60, 300)) * scale + math.log(p), -700.0)
    ls = math.log1p(-p)
    wl = math.log(p) if (warm and b > 1) else None
    got = _dp_compiled(X, p, b, warm and b > 1)
    np.testing.assert_allclose(got, backward_dp(X, ls, b, warm_log_p=wl), rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_allclose(got, backward_dp_log(X, ls, b, warm_log_p=wl), rtol=1e-12, atol=1e-12 * scale)


def test_compiled_dp_matches_closed_form_b1():
    """b = 1 (Poisson): ln f_0 = sum_i ln((1 - p) + e^{x_i})."""
    rng = np.random.default_rng(61)
    p = 0.25
    X = rng.standard_normal((30, 50)) + math.log(p)
    want = np.log((1 - p) + np.exp(X)).sum(axis=0)
    np.testing.assert_allclose(_dp_compiled(X, p, 1, False), want, rtol=1e-12)


# ============================================================================ backends agree
@pytest.mark.parametrize(
    "scheme",
    [MinSepSampling(0.1, 48, 6), MinSepSampling(0.1, 48, 6, warm_start=True), MinSepSampling(1.0, 48, 6, warm_start=True), BallsInBinsSampling(4, 48)],
)
@pytest.mark.parametrize("direction", ["remove", "add"])
def test_compiled_and_numpy_backends_sample_the_same_law(scheme, direction):
    strat = ToeplitzStrategy(np.array([1.0, 0.7, 0.5, 0.3, 0.2, 0.1]), 48)
    a = privacy_loss_samples(strat, scheme, 0.8, 30_000, np.random.default_rng(70), direction=direction)
    b = privacy_loss_samples(strat, scheme, 0.8, 30_000, np.random.default_rng(71), direction=direction, backend="numpy")
    assert stats.ks_2samp(a, b).pvalue > 1e-4


def test_compiled_general_banded_equals_toeplitz_representation():
    """A Toeplitz C given densely (general bands) gives the same losses as its coefficient form."""
    from dpmf.strategies import DenseStrategy

    coefs = np.array([1.0, 0.5, 0.25])
    t = ToeplitzStrategy(coefs, 16)
    d = DenseStrategy(t.encoder())
    scheme = MinSepSampling(0.3, 16, 3, warm_start=True)
    a = privacy_loss_samples(t, scheme, 1.0, 2000, np.random.default_rng(72))
    b = privacy_loss_samples(d, scheme, 1.0, 2000, np.random.default_rng(72))
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_identity_single_band():
    a = privacy_loss_samples(Identity(10), MinSepSampling(0.3, 10, 2), 1.0, 20_000, np.random.default_rng(73))
    b = privacy_loss_samples(Identity(10), MinSepSampling(0.3, 10, 2), 1.0, 20_000, np.random.default_rng(74), backend="numpy")
    assert stats.ks_2samp(a, b).pvalue > 1e-4


def test_backend_is_validated():
    with pytest.raises(InvalidParameterError, match="backend"):
        privacy_loss_samples(Identity(4), MinSepSampling(0.3, 4, 2), 1.0, 10, np.random.default_rng(0), backend="gpu")


# ============================================================================ the fused first stage (issue 50)
@pytest.mark.parametrize("toeplitz", [True, False])
@pytest.mark.parametrize("remove", [True, False])
@pytest.mark.parametrize("S", [1, 7, 8, 21])
def test_fused_exponents_equal_outputs_then_blas_then_exponents(toeplitz, remove, S):
    """minsep_exponents draws the same outputs as minsep_outputs (same state, same stream) and
    gives the exponents of the blocked BLAS path to rounding (different order of the sums)."""
    from dpmf.accounting.montecarlo._loss_kernels import Bands

    n, b, p, sigma = 75, 6, 0.2, 0.7
    rng = np.random.default_rng(4)
    if toeplitz:
        bands = Bands.from_coefs(np.array([1.0, 0.6, 0.3, 0.2, 0.1]), n)
        colsT, coefs = np.zeros((1, 1)), np.ascontiguousarray(bands.toeplitz)
    else:
        C = np.tril(np.triu(rng.random((n, n)), -4))  # 5 bands, every entry different
        bands = Bands.from_dense(C)
        colsT, coefs = np.ascontiguousarray(bands.cols.T), np.zeros(1)
    h = bands.sq / (2 * sigma**2) - math.log(p)
    state = seed_state(np.random.default_rng(9))
    Y = np.empty((S, n))
    _compiled.minsep_outputs(colsT, coefs, toeplitz, sigma, p, b, False, remove, state.copy(), Y)
    ref = bands.dots_sm(Y)
    _compiled.exponents(ref, 1 / sigma**2, h)
    X = np.empty((n, S))
    fused_state = state.copy()
    _compiled.minsep_exponents(colsT, coefs, toeplitz, sigma, p, b, False, remove, fused_state, 1 / sigma**2, h, X)
    np.testing.assert_allclose(X, ref, rtol=1e-12, atol=1e-12)
    after = state.copy()
    _compiled.minsep_outputs(colsT, coefs, toeplitz, sigma, p, b, False, remove, after, np.empty((S, n)))
    np.testing.assert_array_equal(fused_state, after)  # the stream advanced by exactly the same draws
