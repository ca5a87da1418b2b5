"""Sensitivity under participation schemas, against brute force over every participation pattern
and every sign vector on small random encoders (multi-epoch MF paper, Sec. 2, App. H)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmf.errors import DPMFError, InvalidParameterError, UnsupportedConfigurationError
from dpmf.strategies import Participation
from dpmf.strategies.sensitivity import (
    FixedEpochParticipation,
    SensitivityResult,
    banded_sensitivity_squared,
    count_patterns,
    effective_participations,
    min_sep_dp_upper_bound,
    participation_patterns,
    scalar_sensitivity_squared,
    sensitivity_squared,
    spectral_upper_bound,
    toeplitz_sensitivity_squared,
)

# --- brute-force oracles ---------------------------------------------------------------------


def all_patterns(n: int, k: int, b: int, fixed: bool) -> list[tuple[int, ...]]:
    """Every non-empty pattern: <= k steps, consecutive gaps == b (fixed) or >= b (min-sep)."""
    out = []
    for size in range(1, k + 1):
        for steps in itertools.combinations(range(n), size):
            gaps = np.diff(steps)
            if np.all(gaps == b) if fixed else np.all(gaps >= b):
                out.append(steps)
    return out


def brute_scalar(C: np.ndarray, patterns) -> float:
    """max ||C u||^2 over u in {-1, +1} on a pattern, 0 elsewhere (scalar sensitivity^2)."""
    n = C.shape[1]
    best = 0.0
    for p in patterns:
        for signs in itertools.product((1.0, -1.0), repeat=len(p)):
            u = np.zeros(n)
            u[list(p)] = signs
            best = max(best, float(np.sum((C @ u) ** 2)))
    return best


def random_vector_lower(C: np.ndarray, patterns, rng, trials: int = 20, d: int = 3) -> float:
    """max ||C G||_F^2 over random G with unit rows on a pattern: a lower bound on vector sens^2."""
    n = C.shape[1]
    best = 0.0
    for p in patterns:
        for _ in range(trials):
            G = np.zeros((n, d))
            rows = rng.standard_normal((len(p), d))
            G[list(p)] = rows / np.linalg.norm(rows, axis=1, keepdims=True)
            best = max(best, float(np.sum((C @ G) ** 2)))
    return best


def ascent_vector_lower(C: np.ndarray, patterns, rng, starts: int = 4, iters: int = 5000) -> float:
    """Independent vector oracle: parallel ascent G <- rownormalize(X_p G) from random starts.

    Monotone for psd X (G' maximizes the linearization of the convex tr(X G G^T)); every
    iterate is a feasible G, so the result is a lower bound on vector sensitivity^2."""
    X = C.T @ C
    best = 0.0
    for p in patterns:
        Xp = X[np.ix_(p, p)]
        for _ in range(starts):
            G = rng.standard_normal((len(p), len(p)))
            G /= np.linalg.norm(G, axis=1, keepdims=True)
            prev = -np.inf
            for it in range(iters):
                H = Xp @ G
                nrm = np.linalg.norm(H, axis=1, keepdims=True)
                G = np.where(nrm > 0, H / np.where(nrm > 0, nrm, 1), G)
                if it % 50 == 0:
                    val = float(np.trace(G.T @ Xp @ G))
                    if val - prev <= 1e-13 * abs(val):
                        break
                    prev = val
            best = max(best, float(np.trace(G.T @ Xp @ G)))
    return best


def schema(k: int, b: int, fixed: bool):
    return FixedEpochParticipation(k, b) if fixed else Participation(k, b)


def toeplitz(c: np.ndarray, n: int) -> np.ndarray:
    col = np.zeros(n)
    col[: len(c)] = c
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    return np.where(lag >= 0, col[np.maximum(lag, 0)], 0.0)


# --- patterns --------------------------------------------------------------------------------


@pytest.mark.parametrize("fixed", [False, True])
def test_patterns_are_the_maximal_brute_force_patterns(fixed):
    for n in range(1, 9):
        for k in range(1, n + 1):
            for b in range(1, n + 1):
                pats = all_patterns(n, k, b, fixed)
                maximal = [p for p in pats if not any(set(p) < set(q) for q in pats)]
                part = schema(k, b, fixed)
                assert sorted(participation_patterns(n, part)) == sorted(maximal), (n, k, b)
                assert count_patterns(n, part) == len(pats)
                assert effective_participations(n, part) == max(len(p) for p in pats)


def test_fixed_epoch_patterns_paper_example():
    # (k=3, b=2) on n=6 -> {1,3,5}, {2,4,6} in the paper's 1-based indices
    assert sorted(participation_patterns(6, FixedEpochParticipation(3, 2))) == [(0, 2, 4), (1, 3, 5)]


# --- random small C against brute force ------------------------------------------------------


def _cases(count: int, seed: int):
    rng = np.random.default_rng(seed)
    for t in range(count):
        n = int(rng.integers(3, 8))
        kind = t % 3
        C = rng.standard_normal((n, n))
        if kind == 1:
            C = np.abs(C)  # X >= 0: Eq. (3) exact
        C = np.tril(C) if t % 2 == 0 else C
        k = int(rng.integers(1, n + 1)) if t % 5 == 0 else int(rng.integers(2, n + 1))
        b = int(rng.integers(1, n + 1)) if t % 5 == 0 else int(rng.integers(1, n // 2 + 1))
        yield C, k, b, rng


@pytest.mark.parametrize("fixed", [False, True])
def test_exact_methods_equal_brute_force_and_bounds_dominate(fixed):
    exact_vector = 0
    for C, k, b, rng in _cases(90, seed=11 + fixed):
        n = C.shape[1]
        part = schema(k, b, fixed)
        pats = all_patterns(n, k, b, fixed)
        truth_scalar = brute_scalar(C, pats)

        scalar = sensitivity_squared(C, part, data="scalar")
        assert scalar.exact
        assert scalar.value == pytest.approx(truth_scalar, rel=1e-9)
        assert scalar.value >= truth_scalar  # rounded up, never down

        vec = sensitivity_squared(C, part)
        assert isinstance(vec, SensitivityResult) and vec.data == "vector"
        assert vec.value >= truth_scalar  # vector sensitivity >= scalar
        assert vec.value >= random_vector_lower(C, pats, rng, trials=5)
        assert vec.lower_bound <= vec.value
        X = C.T @ C
        kk = max(len(p) for p in pats)
        nonneg = all(X[np.ix_(p, p)].min() >= 0 for p in pats)
        if nonneg or kk <= 2:  # Thm. H.1 (1)/(2): scalar == vector
            assert vec.exact
            assert vec.value == pytest.approx(truth_scalar, rel=1e-9)
        if vec.exact:
            exact_vector += 1
            assert vec.lower_bound == pytest.approx(vec.value, rel=1e-9)
            if not (nonneg or kk <= 2):  # certified SDP/abs-sum: check with an independent ascent
                found = ascent_vector_lower(C, participation_patterns(n, part), rng)
                assert found <= vec.value
                assert found == pytest.approx(vec.value, rel=1e-6)

        spec = spectral_upper_bound(C, part)
        assert not spec.exact
        assert spec.value >= vec.lower_bound * (1 - 1e-12)
        assert spec.value >= truth_scalar
        # Thm. 2.1 per pattern: max_p |p| ||C[:, p]||_2^2 (<= k max_p ||C[:, p]||_2^2 as printed)
        direct = max(len(p) * np.linalg.norm(C[:, list(p)], 2) ** 2 for p in pats)
        assert spec.value == pytest.approx(direct, rel=1e-9)
        assert spec.value <= kk * max(np.linalg.norm(C[:, list(p)], 2) ** 2 for p in pats) * (1 + 1e-9)
    assert exact_vector >= 60  # the certified SDP closes the gap in most cases


def test_min_sep_dynamic_program_bound_is_sound_and_exact_when_attained():
    exact = 0
    for C, k, b, _ in _cases(120, seed=5):
        n = C.shape[1]
        pats = all_patterns(n, k, b, False)
        X = C.T @ C
        abs_max = max(float(np.abs(X[np.ix_(p, p)]).sum()) for p in pats)
        bound, pat, _ = min_sep_dp_upper_bound(X, k, b)
        assert bound >= abs_max * (1 - 1e-12)
        assert tuple(pat) in pats
        forced = sensitivity_squared(C, Participation(k, b), max_patterns=1)  # no enumeration
        full = sensitivity_squared(C, Participation(k, b))
        assert forced.value >= brute_scalar(C, pats)
        if full.exact:
            assert forced.value >= full.value * (1 - 1e-12)
        if forced.exact:
            exact += 1
            assert forced.value == pytest.approx(full.value, rel=1e-9)
    assert exact >= 60


def test_dynamic_program_every_step_nonneg_is_exact():
    rng = np.random.default_rng(3)
    C = np.tril(rng.random((60, 60)))
    res = sensitivity_squared(C, Participation(60, 1))  # 2^60 patterns: the DP path
    assert res.exact and "dynamic program" in res.method
    assert res.value == pytest.approx(float((C.T @ C).sum()), rel=1e-10)  # u = all ones


# --- App. H.2: scalar sensitivity does not bound vector sensitivity --------------------------

H2_C = np.array([[2.0, 1.0, 1.0], [1.0, 2.0, -1.0], [1.0, -1.0, 2.0]]) / math.sqrt(24)
H2_G = np.array([[2.0, 1.0], [2.0, -1.0], [1.0, 2.0]]) / math.sqrt(5)


def test_h2_counterexample():
    every_step = Participation(3, 1)  # n = k = 3: the only maximal pattern is {0, 1, 2}
    scalar = scalar_sensitivity_squared(H2_C, every_step)
    assert scalar.value == pytest.approx(1.0, rel=1e-12)
    assert brute_scalar(H2_C, all_patterns(3, 3, 1, False)) == pytest.approx(1.0, rel=1e-12)
    paper_G = float(np.sum((H2_C @ H2_G) ** 2))
    assert paper_G == pytest.approx(1.1, rel=1e-12)  # ||CG||_F = sqrt(1.1) ~ 1.049 > 1
    assert scalar.value < paper_G

    vec = sensitivity_squared(H2_C, every_step)
    assert vec.value >= paper_G
    assert vec.method in ("sdp (certified dual)", "spectral (Thm. 2.1)")
    # the true vector optimum is 9/8: Y = 1.5 (I - v v^T / 3), v = (1, -1, -1), rank 2
    assert vec.exact and vec.value == pytest.approx(1.125, rel=1e-9)
    v = np.array([1.0, -1.0, -1.0])
    w, V = np.linalg.eigh(1.5 * (np.eye(3) - np.outer(v, v) / 3))
    G = V[:, w > 0.5] * np.sqrt(w[w > 0.5])
    np.testing.assert_allclose(np.linalg.norm(G, axis=1), 1.0)
    assert float(np.sum((H2_C @ G) ** 2)) == pytest.approx(1.125, rel=1e-12)
    # scalar data keeps the scalar value
    assert sensitivity_squared(H2_C, every_step, data="scalar").value == pytest.approx(1.0, rel=1e-12)


def test_vector_never_uses_scalar_enumeration_without_thm_h1():
    rng = np.random.default_rng(0)
    for _ in range(30):
        C = rng.standard_normal((5, 5))
        res = sensitivity_squared(C, Participation(5, 1))
        assert "sign enumeration" not in res.method


# --- structured exact cases ------------------------------------------------------------------


@pytest.mark.parametrize("fixed", [False, True])
def test_identity_is_sqrt_k(fixed):
    for n in (1, 4, 7, 9):
        for k in range(1, n + 1):
            for b in range(1, n + 1):
                res = sensitivity_squared(np.eye(n), schema(k, b, fixed))
                assert res.exact
                assert res.value == pytest.approx(min(k, math.ceil(n / b)), rel=1e-12)


def test_nonneg_check_on_X_not_on_C():
    # C with negative entries but orthogonal columns: X = I >= 0, exact via Eq. (3)
    Q = np.linalg.qr(np.random.default_rng(1).standard_normal((6, 6)))[0]
    res = sensitivity_squared(Q, FixedEpochParticipation(3, 2))
    assert res.exact and res.value == pytest.approx(3.0, rel=1e-9)
    # C >= 0 (dense, not banded, not Toeplitz): Eq. (3)
    C = np.tril(np.random.default_rng(2).random((6, 6)) + 0.1)
    res = sensitivity_squared(C, FixedEpochParticipation(3, 2))
    assert res.method == "X = C^T C >= 0 on the patterns (Eq. 3)" and res.exact
    X = C.T @ C
    assert res.value == pytest.approx(max(X[np.ix_(p, p)].sum() for p in [(0, 2, 4), (1, 3, 5)]), rel=1e-12)
    # X with negative entries on a pattern: not Eq. (3)
    C2 = C.copy()
    C2[4, 0] = -5.0
    assert (C2.T @ C2)[0, 4] < 0
    res2 = sensitivity_squared(C2, FixedEpochParticipation(3, 2))
    assert res2.method != "X = C^T C >= 0 on the patterns (Eq. 3)"
    assert res2.value >= brute_scalar(C2, all_patterns(6, 3, 2, True))


@pytest.mark.parametrize("fixed", [False, True])
def test_toeplitz_nonneg_nonincreasing_closed_form(fixed):
    rng = np.random.default_rng(7)
    for _ in range(25):
        n = int(rng.integers(2, 9))
        c = np.sort(rng.random(int(rng.integers(1, n + 1))))[::-1]
        k, b = int(rng.integers(1, n + 1)), int(rng.integers(1, n + 1))
        part = schema(k, b, fixed)
        truth = brute_scalar(toeplitz(c, n), all_patterns(n, k, b, fixed))  # X >= 0: scalar == vector
        res = toeplitz_sensitivity_squared(c, part, n)
        assert res.exact and res.value == pytest.approx(truth, rel=1e-12)
        dense = sensitivity_squared(toeplitz(c, n), part)
        assert dense.exact and dense.value == pytest.approx(truth, rel=1e-12)
        if effective_participations(n, part) > 1:
            assert dense.method in ("toeplitz-nonneg-nonincreasing", "single-participation (max column norm)")


def test_toeplitz_other_coefficients():
    n, b = 8, 3
    part = Participation(3, b)
    c = np.array([0.2, 1.0, 0.5])  # banded (len <= b) but increasing: closed form does not apply
    res = toeplitz_sensitivity_squared(c, part, n)
    assert res.method == "banded" and res.exact
    assert res.value == pytest.approx(brute_scalar(toeplitz(c, n), all_patterns(n, 3, b, False)), rel=1e-12)
    c = np.array([1.0, -0.7, 0.4, 0.9])  # neither: falls back to the dense dispatcher
    res = toeplitz_sensitivity_squared(c, part, n)
    assert res.value >= brute_scalar(toeplitz(c, n), all_patterns(n, 3, b, False))
    with pytest.raises(InvalidParameterError, match="coefs"):
        toeplitz_sensitivity_squared(np.ones(9), part, 8)


def test_banded_is_a_selection_not_k_times_max_norm():
    C = np.diag([1.0, 3.0, 3.0, 1.0])  # 1 band; norms^2 1, 9, 9, 1
    part = Participation(2, 2)
    res = banded_sensitivity_squared(C, part)
    assert res.exact and res.value == pytest.approx(10.0, rel=1e-12)  # {0, 2} or {1, 3}; not 2 * 9
    assert sensitivity_squared(C, part).value == pytest.approx(10.0, rel=1e-12)
    assert brute_scalar(C, all_patterns(4, 2, 2, False)) == pytest.approx(10.0)


def test_banded_random_and_column_normalized():
    rng = np.random.default_rng(4)
    for _ in range(20):
        n = int(rng.integers(3, 9))
        bands = int(rng.integers(1, n))
        b = int(rng.integers(bands, n + 1))
        k = int(rng.integers(1, n + 1))
        C = np.tril(rng.standard_normal((n, n))) * (np.subtract.outer(np.arange(n), np.arange(n)) < bands)
        for fixed in (False, True):
            part = schema(k, b, fixed)
            truth = brute_scalar(C, all_patterns(n, k, b, fixed))
            res = banded_sensitivity_squared(C, part)
            assert res.exact and res.value == pytest.approx(truth, rel=1e-12)
            assert sensitivity_squared(C, part).method in ("banded", "single-participation (max column norm)")
        Cn = C / np.linalg.norm(C, axis=0)  # column-normalized BandMF: sens^2 = k'
        res = banded_sensitivity_squared(Cn, Participation(k, b))
        assert res.value == pytest.approx(min(k, math.ceil(n / b)), rel=1e-12)
    with pytest.raises(UnsupportedConfigurationError, match="min_sep"):
        banded_sensitivity_squared(np.tri(5), Participation(2, 2))


def sqrt_toeplitz_coefs(n: int) -> np.ndarray:
    f = np.ones(n)
    for t in range(1, n):
        f[t] = f[t - 1] * (1 - 1 / (2 * t))
    return f


@pytest.mark.parametrize("part", [Participation(2, 64), FixedEpochParticipation(2, 64)])
def test_sqrt_toeplitz_n128_two_epochs(part):
    # notes/peer-libraries.md B.5: sqrt(A) Toeplitz, (k=2, b=64): sensitivity 2.4737
    f = sqrt_toeplitz_coefs(128)
    assert math.sqrt(toeplitz_sensitivity_squared(f, part).value) == pytest.approx(2.4737, abs=5e-5)
    res = sensitivity_squared(toeplitz(f, 128), part)
    assert res.exact and res.sensitivity == pytest.approx(2.4737, abs=5e-5)
    # the DP (no enumeration) and the generic enumeration give the same exact value
    C = toeplitz(f, 128) + 0.0
    C[127, 0] += 1e-9  # break the Toeplitz structure so the generic paths run
    for kw in ({}, {"max_patterns": 1}):
        r = sensitivity_squared(C, part, **kw)
        assert r.exact and r.sensitivity == pytest.approx(2.4737, abs=5e-5)


# --- soundness property ----------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    entries=st.lists(st.integers(-3, 3), min_size=25, max_size=25),
    k=st.integers(1, 5),
    b=st.integers(1, 5),
    fixed=st.booleans(),
)
def test_property_value_bounds_every_pattern_and_sign(entries, k, b, fixed):
    C = np.array(entries, dtype=float).reshape(5, 5)
    part = schema(k, b, fixed)
    pats = all_patterns(5, k, b, fixed)
    truth = brute_scalar(C, pats)
    vec = sensitivity_squared(C, part)
    assert vec.value >= truth
    assert vec.value >= random_vector_lower(C, pats, np.random.default_rng(0), trials=3)
    sc = sensitivity_squared(C, part, data="scalar")
    assert sc.exact and sc.value >= truth and sc.value == pytest.approx(truth, rel=1e-9, abs=1e-12)


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "C,match",
    [
        (np.array([[1.0, np.nan], [0.0, 1.0]]), "finite"),
        (np.ones(4), "2-dimensional"),
        (np.zeros((0, 3)), "empty"),
        ([["a"]], "C"),
    ],
)
def test_bad_matrix(C, match):
    with pytest.raises(InvalidParameterError, match=match):
        sensitivity_squared(C, Participation(1, 1))


def test_bad_participation():
    C = np.eye(4)
    with pytest.raises(InvalidParameterError, match="min_sep"):
        sensitivity_squared(C, Participation(2, 5))  # min_sep > n
    with pytest.raises(InvalidParameterError, match="min_sep"):
        sensitivity_squared(C, FixedEpochParticipation(2, 5))
    with pytest.raises(InvalidParameterError, match="participation"):
        sensitivity_squared(C, (2, 2))
    with pytest.raises(InvalidParameterError, match="max_participations"):
        Participation(-1, 1)
    with pytest.raises(InvalidParameterError, match="max_participations"):
        FixedEpochParticipation(-2, 1)
    with pytest.raises(InvalidParameterError, match="separation"):
        FixedEpochParticipation(2, 0)
    with pytest.raises(InvalidParameterError, match="data"):
        sensitivity_squared(C, Participation(2, 2), data="matrix")
    with pytest.raises(InvalidParameterError, match="max_patterns"):
        sensitivity_squared(C, Participation(2, 2), max_patterns=0)
    with pytest.raises(DPMFError):
        count_patterns(0, Participation(1, 1))


def test_scalar_enumeration_budget():
    with pytest.raises(UnsupportedConfigurationError, match="max_sign_evaluations"):
        scalar_sensitivity_squared(np.eye(30), Participation(30, 1), max_sign_evaluations=1000)


def test_describe():
    assert FixedEpochParticipation(3, 2).describe() == {
        "schema": "fixed-epoch",
        "max_participations": 3,
        "separation": 2,
    }
    assert FixedEpochParticipation(3, 2).min_sep == 2
