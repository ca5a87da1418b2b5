"""Tests of dpmf.privacy.product_mixtures (MMCC App. F.2 per-row sensitivity distribution).

The oracles are exact: probabilities are float64 numbers, i.e. dyadic rationals, so the exact
law of ``S`` (rounded or not) is computed with Python integers scaled by a power of two, and the
results' float masses are converted exactly as well. Dominance is then checked without any
tolerance.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from bisect import bisect_left
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import fft as sfft

from dpmf.errors import InvalidParameterError
from dpmf.privacy import product_mixtures as pm_mod
from dpmf.privacy.product_mixtures import (
    METHODS,
    GridDistribution,
    dominates,
    grid_indices,
    product_mixture,
)

FLOAT_EXP = 1074  # every finite float64 is an integer multiple of 2**-1074


# ----------------------------------------------------------------------------- exact oracles
def _dyadic(x: float) -> tuple[int, int]:
    """``x = n / 2**e`` exactly."""
    n, d = float(x).as_integer_ratio()
    return n, d.bit_length() - 1


def float_masses_as_ints(probs: np.ndarray) -> list[int]:
    """The float masses exactly, as integers scaled by ``2**FLOAT_EXP``."""
    out = []
    for v in probs.tolist():
        n, e = _dyadic(v)
        out.append(n << (FLOAT_EXP - e))
    return out


def exact_unrounded(p, c) -> tuple[list[Fraction], list[int], int]:
    """Brute force over all 2^J outcomes: (sorted values, masses as ints, exponent E).

    ``Pr[S = values[i]] = masses[i] / 2**E`` exactly, with the unrounded ``c_j``.
    """
    ratios = [_dyadic(x) for x in p]
    big_e = sum(e for _, e in ratios)
    cs = [Fraction(float(x)) for x in c]
    law: dict[Fraction, int] = {}
    for bits in itertools.product((0, 1), repeat=len(ratios)):
        mass = 1
        value = Fraction(0)
        for b, (n, e), cj in zip(bits, ratios, cs):
            if b:
                mass *= n
                value += cj
            else:
                mass *= (1 << e) - n
        if mass:
            law[value] = law.get(value, 0) + mass
    values = sorted(law)
    return values, [law[v] for v in values], big_e


def exact_rounded(p, k) -> tuple[list[int], int]:
    """Exact law of ``sum_j B_j k_j`` on the integer grid: (masses as ints, exponent E)."""
    masses = [1]
    big_e = 0
    for pj, kj in zip(p, k):
        n, e = _dyadic(pj)
        q = (1 << e) - n
        new = [0] * (len(masses) + int(kj))
        for i, v in enumerate(masses):
            new[i] += v * q
            new[i + int(kj)] += v * n
        masses, big_e = new, big_e + e
    return masses, big_e


def _suffix(xs: list[int]) -> list[int]:
    out = [0] * (len(xs) + 1)
    for i in range(len(xs) - 1, -1, -1):
        out[i] = out[i + 1] + xs[i]
    return out


def assert_dominates_exactly(result: GridDistribution, values, masses, big_e) -> None:
    """``Pr_result[X >= t] >= Pr[S = values with masses / 2**E >= t]`` for every real t."""
    res_support = [Fraction(float(s)) for s in result.support]
    assert all(a < b for a, b in zip(res_support, res_support[1:]))
    res_tail = _suffix(float_masses_as_ints(result.probs))
    ex_tail = _suffix(list(masses))
    assert res_tail[0] >= 1 << FLOAT_EXP, "total mass below 1"
    for t in sorted(set(res_support) | set(values)):
        lhs = res_tail[bisect_left(res_support, t)] << big_e
        rhs = ex_tail[bisect_left(values, t)] << FLOAT_EXP
        assert lhs >= rhs, f"not dominating at t={float(t)!r}: {lhs / 2 ** (big_e + FLOAT_EXP)!r}"


def assert_valid(result: GridDistribution) -> None:
    assert result.probs.dtype == np.float64
    assert np.all(result.probs >= 0)
    assert abs(math.fsum(result.probs.tolist()) - 1.0) <= 1e-12


def random_instance(rng: np.random.Generator, j: int, cmax: float = 1.0):
    p = rng.random(j)
    p[rng.random(j) < 0.2] = 0.0
    p[rng.random(j) < 0.1] = 1.0
    c = rng.random(j) * cmax
    c[rng.random(j) < 0.1] = 0.0
    return p, c


# ----------------------------------------------------------------------------- brute force
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", range(6))
def test_dominates_brute_force_unrounded_law(method, seed):
    rng = np.random.default_rng(seed)
    j = int(rng.integers(1, 11))
    p, c = random_instance(rng, j)
    step = float(rng.choice([0.01, 0.05, 0.1, 0.3]))
    result = product_mixture(p, c, step, method=method)
    assert_valid(result)
    assert_dominates_exactly(result, *exact_unrounded(p, c))


@pytest.mark.parametrize("seed", range(6))
def test_direct_equals_exact_rounded_law(seed):
    rng = np.random.default_rng(100 + seed)
    j = int(rng.integers(1, 11))
    p, c = random_instance(rng, j)
    step = 0.05
    k = grid_indices(c, step)
    masses, big_e = exact_rounded(p, k)
    exact = np.array([float(Fraction(m, 1 << big_e)) for m in masses])
    result = product_mixture(p, c, step, method="direct")
    n = result.probs.size  # terms with p_j = 0 are skipped, so the exact grid may be longer
    assert n <= exact.size and np.all(exact[n:] == 0)
    np.testing.assert_allclose(result.probs, exact[:n], rtol=0, atol=1e-14)
    support = [k * Fraction(step) for k in range(exact.size)]
    assert_dominates_exactly(result, support, masses, big_e)


# ----------------------------------------------------------------------------- FFT vs direct
@pytest.mark.parametrize("seed", range(3))
def test_fft_path_dominates_exact_law_and_is_close_to_direct(seed):
    rng = np.random.default_rng(200 + seed)
    p = rng.random(30) * 0.6
    c = rng.random(30)
    step = 0.02
    k = grid_indices(c, step)
    masses, big_e = exact_rounded(p, k)
    support = [i * Fraction(step) for i in range(len(masses))]
    exact_tail = np.array([float(Fraction(m, 1 << big_e)) for m in _suffix(masses)[:-1]])

    fft = product_mixture(p, c, step, method="fft")
    direct = product_mixture(p, c, step, method="direct")
    for result in (fft, direct):
        assert_valid(result)
        assert result.probs.size == len(masses)
        assert_dominates_exactly(result, support, masses, big_e)
    # Within 1e-10 of each other and of the exact tails; the direct path far closer.
    assert np.max(np.abs(fft.tail() - direct.tail())) <= 1e-10
    assert np.max(np.abs(fft.tail() - exact_tail)) <= 1e-10
    assert np.max(np.abs(direct.tail() - exact_tail)) <= 1e-13
    # FFT noise is repaired, not clipped away: every grid point keeps (tiny) mass, none negative.
    assert np.all(fft.probs > 0)


def test_auto_mixes_direct_and_fft_merges_soundly(monkeypatch):
    """Force small FFT merges so that FFT merges consume direct nodes' error certificates."""
    calls = {"fft": 0, "direct": 0}
    real_fft, real_direct = pm_mod._merge_fft, pm_mod._merge_direct

    def counting(name, fn):
        def wrapped(a, b):
            calls[name] += 1
            return fn(a, b)

        return wrapped

    monkeypatch.setattr(pm_mod, "_merge_fft", counting("fft", real_fft))
    monkeypatch.setattr(pm_mod, "_merge_direct", counting("direct", real_direct))
    monkeypatch.setattr(pm_mod, "_use_fft", lambda n_a, n_b: n_a * n_b > 2000)
    rng = np.random.default_rng(7)
    p, c = rng.random(40) * 0.5, rng.random(40)
    step = 0.02
    result = product_mixture(p, c, step, method="auto")
    assert calls["fft"] > 0 and calls["direct"] > 0
    assert_valid(result)
    masses, big_e = exact_rounded(p, grid_indices(c, step))
    assert_dominates_exactly(result, [i * Fraction(step) for i in range(len(masses))], masses, big_e)


def test_auto_uses_fft_on_large_problems_and_stays_close(monkeypatch):
    calls = {"fft": 0}
    real_fft = pm_mod._merge_fft

    def wrapped(a, b):
        calls["fft"] += 1
        return real_fft(a, b)

    monkeypatch.setattr(pm_mod, "_merge_fft", wrapped)
    rng = np.random.default_rng(8)
    p, c = rng.random(300) * 0.3, rng.random(300)
    auto = product_mixture(p, c, 0.005, method="auto")
    assert calls["fft"] > 0
    direct = product_mixture(p, c, 0.005, method="direct")
    assert_valid(auto)
    assert np.max(np.abs(auto.tail() - direct.tail())) <= 1e-10
    assert auto.mean() >= float(np.dot(p, c))


@pytest.mark.parametrize(("na", "nb"), [(7, 5), (300, 40), (2000, 3000)])
def test_fft_error_bound_holds_and_is_not_vacuous(na, nb):
    rng = np.random.default_rng(na)
    worst = 0.0
    for kind in range(3):
        a, b = rng.random(na) ** (1 + 10 * kind), rng.random(nb) ** (1 + 10 * kind)
        a, b = a / a.sum(), b / b.sum()
        n_out = na + nb - 1
        length = pm_mod._fft_length(n_out)
        y = sfft.irfft(sfft.rfft(a, length) * sfft.rfft(b, length), length)[:n_out]
        ref = np.convolve(a.astype(np.longdouble), b.astype(np.longdouble))
        err = np.asarray(y - ref, dtype=np.float64)
        eta_inf, eta_2 = pm_mod._fft_error_bounds(a, b, length)
        assert np.max(np.abs(err)) <= eta_inf
        assert np.linalg.norm(err) <= eta_2
        worst = max(worst, np.linalg.norm(err) / eta_2)
    assert worst >= 1e-5  # a bound 10^5 times the observed error would be useless


# ----------------------------------------------------------------------------- rounding
def test_grid_indices_keep_exact_multiples_and_round_others_up():
    np.testing.assert_array_equal(grid_indices([0.5, 0.75, 0.0, 1.0, 0.6, 1e-300], 0.25), [2, 3, 0, 4, 3, 1])
    # The literal 0.3 lies below the real number 3 * fl(0.1); fl(3 * 0.1) lies above it.
    np.testing.assert_array_equal(grid_indices([0.3, 3 * 0.1, 0.7, 0.31, 0.1], 0.1), [3, 4, 7, 4, 1])


@given(
    c=st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=20),
    step=st.floats(1e-3, 10, allow_nan=False),
)
@settings(max_examples=80, deadline=None)
def test_grid_indices_are_the_smallest_exact_upper_multiples(c, step):
    k = grid_indices(c, step)
    fstep = Fraction(step)
    for cj, kj in zip(c, k.tolist()):
        assert kj * fstep >= Fraction(cj)
        assert kj == 0 or (kj - 1) * fstep < Fraction(cj)


def test_rounding_in_product_mixture():
    exact = product_mixture([0.5], [0.5], 0.25)
    assert exact.probs.tolist() == [0.5, 0.0, 0.5]
    bumped = product_mixture([0.5], [0.51], 0.25)
    assert bumped.probs.tolist() == [0.5, 0.0, 0.0, 0.5]
    assert bumped.support[-1] == 0.75


def test_support_is_rounded_up():
    support = GridDistribution(0.1, np.full(10, 0.1)).support
    for k, s in enumerate(support.tolist()):
        assert Fraction(s) >= k * Fraction(0.1)
        assert s == k * 0.1 or s == np.nextafter(k * 0.1, np.inf)


# ----------------------------------------------------------------------------- property
unit = st.one_of(st.just(0.0), st.just(1.0), st.floats(0, 1, allow_nan=False))


@given(
    data=st.data(),
    j=st.integers(0, 8),
    step=st.sampled_from([0.01, 0.05, 0.1, 0.25, 0.3, 0.7]),
    method=st.sampled_from(METHODS),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_property_dominates_exact_unrounded_law(data, j, step, method):
    p = data.draw(st.lists(unit, min_size=j, max_size=j))
    multiple = st.integers(0, 8).map(lambda i: i * step)
    c = data.draw(st.lists(st.one_of(st.floats(0, 2, allow_nan=False), multiple), min_size=j, max_size=j))
    result = product_mixture(p, c, step, method=method)
    assert_valid(result)
    values, masses, big_e = exact_unrounded(p, c)
    assert_dominates_exactly(result, values, masses, big_e)
    exact_mean = sum((Fraction(pj) * Fraction(cj) for pj, cj in zip(p, c)), Fraction(0))
    result_mean = sum(
        (Fraction(float(s)) * Fraction(float(q)) for s, q in zip(result.support, result.probs)), Fraction(0)
    )
    assert result_mean >= exact_mean
    assert math.isclose(result.mean(), float(result_mean), rel_tol=1e-14, abs_tol=1e-300)


# ----------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("method", METHODS)
def test_all_zero_probabilities_or_sensitivities_give_point_mass_at_zero(method):
    assert product_mixture([0.0, 0.0], [0.3, 1.0], 0.1, method=method).probs.tolist() == [1.0]
    assert product_mixture([0.3, 0.9], [0.0, 0.0], 0.1, method=method).probs.tolist() == [1.0]
    assert product_mixture([], [], 0.1, method=method).probs.tolist() == [1.0]


@pytest.mark.parametrize("method", METHODS)
def test_certain_terms_shift(method):
    shifted = product_mixture([1.0, 0.5, 1.0], [0.3, 0.2, 0.1], 0.1, method=method)
    assert shifted.probs.tolist() == [0.0] * 4 + [0.5, 0.0, 0.5]
    assert product_mixture([1.0], [0.5], 0.25, method=method).probs.tolist() == [0.0, 0.0, 1.0]


def test_single_term_is_exact_and_has_mass_at_least_one():
    p = 0.1 + 2**-40  # 1 - p is not a float: it is rounded up
    result = product_mixture([p], [1.0], 1.0)
    assert result.probs[1] == p
    assert Fraction(result.probs[0]) + Fraction(result.probs[1]) >= 1
    assert 0 <= Fraction(result.probs[0]) - (1 - Fraction(p)) <= Fraction(2.0**-53)


def test_grid_distribution_api():
    d = GridDistribution(0.5, [0.25, 0.0, 0.75])
    np.testing.assert_array_equal(d.support, [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(d.tail(), [1.0, 0.75, 0.75])
    assert d.mean() == 0.75
    s, q = d.nonzero()
    np.testing.assert_array_equal(s, [0.0, 1.0])
    np.testing.assert_array_equal(q, [0.25, 0.75])
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.step = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError):
        d.probs[0] = 0.5
    assert d == GridDistribution(0.5, np.array([0.25, 0.0, 0.75]))


def test_dominates_handles_different_steps_and_atol():
    a = GridDistribution(0.1, [0.0, 0.0, 0.0, 1.0])  # point mass at 3 * 0.1
    b = GridDistribution(0.25, [0.0, 1.0])  # point mass at 0.25
    assert dominates(a, b) and not dominates(b, a)
    assert dominates(a, a)
    c = GridDistribution(0.25, [0.5, 0.5])
    d = GridDistribution(0.25, [0.5 + 1e-9, 0.5 - 1e-9])
    assert dominates(c, d) and not dominates(d, c)
    assert dominates(d, c, atol=1e-9) and not dominates(d, c, atol=1e-10)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([0.5, 0.5], [0.1], 0.1), {}, "same length"),
        (([0.5, np.nan], [0.1, 0.2], 0.1), {}, "probabilities"),
        (([0.5], [np.inf], 0.1), {}, "sensitivities"),
        (([1.5], [0.1], 0.1), {}, "probabilities must lie in"),
        (([-0.1], [0.1], 0.1), {}, "probabilities must lie in"),
        (([0.5], [-0.1], 0.1), {}, "sensitivities must be >= 0"),
        (([0.5], [0.1], 0.0), {}, "step"),
        (([0.5], [0.1], -1.0), {}, "step"),
        (([0.5], [0.1], np.nan), {}, "step"),
        (([0.5], [0.1], np.inf), {}, "step"),
        (([0.5], [0.1], 1e-300), {}, "step"),
        (([[0.5]], [[0.1]], 0.1), {}, "1-dimensional"),
        (([0.5], [0.1], 0.1), {"method": "fast"}, "method"),
        (([0.5, 0.5], [1.0, 1e12], 1e-3), {}, "too fine"),
        (([0.5], [1e300], 1e-100), {}, "too fine"),
    ],
)
def test_bad_input_raises(args, kwargs, match):
    with pytest.raises(InvalidParameterError, match=match):
        product_mixture(*args, **kwargs)


@pytest.mark.parametrize(
    ("step", "probs", "match"),
    [
        (0.0, [1.0], "step"),
        (0.1, [0.5, -0.1, 0.6], ">= 0"),
        (0.1, [0.5, 0.6], "sum to 1"),
        (0.1, [], "empty"),
        (0.1, [np.nan, 1.0], "finite"),
    ],
)
def test_bad_grid_distribution_raises(step, probs, match):
    with pytest.raises(InvalidParameterError, match=match):
        GridDistribution(step, probs)


def test_grid_indices_bad_input_raises():
    with pytest.raises(InvalidParameterError, match="sensitivities must be >= 0"):
        grid_indices([-1.0], 0.1)
    with pytest.raises(InvalidParameterError, match="too fine"):
        grid_indices([1e300], 1e-100)


def test_dominates_rejects_non_distributions():
    with pytest.raises(InvalidParameterError, match="GridDistribution"):
        dominates(GridDistribution(0.1, [1.0]), np.array([1.0]))  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="atol"):
        dominates(GridDistribution(0.1, [1.0]), GridDistribution(0.1, [1.0]), atol=-1.0)
