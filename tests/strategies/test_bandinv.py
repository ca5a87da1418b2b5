"""BandInvMF (dpmf.strategies.bandinv): C^{-1} banded with the requested bands, the streaming noise
equal to the dense C^{-1} z, the objective (closed forms and finite differences), the optimizer
(decreases the objective, beats the identity, one band = the identity, agrees with a dense
brute-force optimizer on a tiny case), the sensitivity against brute force over all patterns,
non-negativity, serialization and bad input."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import scipy.optimize as so

from dpmf.errors import DPMFError, InvalidParameterError, NumericalError
from dpmf.strategies import FixedEpochParticipation, Identity, Participation, bisr, strategy_from_dict
from dpmf.strategies import catalog
from dpmf.strategies.bandinv import (
    BandInvStrategy,
    band_inv_loss_and_grad,
    closed_form_sensitivity_squared,
    optimize_banded_inverse_toeplitz,
)


def _dense_inverse(strategy) -> np.ndarray:
    return np.linalg.inv(strategy.encoder())


# ---- structure --------------------------------------------------------------------------------


@pytest.mark.parametrize("n,bands,epochs", [(24, 1, 1), (24, 3, 2), (30, 5, 3), (16, 16, 1)])
def test_inverse_is_banded_with_the_requested_bands(n, bands, epochs):
    s = optimize_banded_inverse_toeplitz(n, bands, epochs, max_iter=50)
    assert s.bands == bands and s.inverse_coefs[0] == 1.0
    Cinv = _dense_inverse(s)  # numerically inverted dense C, not the stored coefficients
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    assert np.max(np.abs(Cinv[(lag >= bands) | (lag < 0)])) < 1e-10
    for j in range(bands):
        np.testing.assert_allclose(np.diag(Cinv, -j), s.inverse_coefs[j], rtol=0, atol=1e-10)
    assert np.all(np.diag(s.encoder()) > 0)


def test_one_band_is_the_identity():
    part = FixedEpochParticipation(2, 10)
    s = optimize_banded_inverse_toeplitz(20, 1, 2)
    np.testing.assert_array_equal(s.encoder(), np.eye(20))
    assert s.rmse(part) == pytest.approx(Identity(20).rmse(part), rel=1e-12)
    assert s.sensitivity(part) == pytest.approx(math.sqrt(2), rel=1e-12)


# ---- streaming noise --------------------------------------------------------------------------


@pytest.mark.parametrize("bands", [1, 2, 4, 7])
def test_streaming_noise_equals_dense_inverse_times_z(bands):
    n, d = 25, 6
    s = optimize_banded_inverse_toeplitz(n, bands, 1, max_iter=50)
    z = np.random.default_rng(3).standard_normal((n, d))
    gen = s.streaming_noise(d)
    got = np.array([gen.step(row.copy()) for row in z])
    np.testing.assert_allclose(got, _dense_inverse(s) @ z, rtol=0, atol=1e-11)
    assert gen.memory_floats == (bands - 1) * d  # independent of n
    if bands > 1:
        assert gen.mode == "banded-inverse"
    # the drawing path: z_t = sigma * N(0, I) from the same generator
    draws = np.random.default_rng(11).standard_normal((n, d)) * 1.7
    w = np.array(list(s.streaming_noise(d, np.random.default_rng(11), noise_multiplier=1.7)))
    np.testing.assert_allclose(w, _dense_inverse(s) @ draws, rtol=0, atol=1e-10)


def test_streaming_memory_does_not_grow_with_n():
    g = bisr(8, 4).inverse_coefs
    mem = {n: BandInvStrategy.from_noising_coefficients(g, n).streaming_noise(3).memory_floats for n in (8, 80, 800)}
    assert set(mem.values()) == {3 * 3}


# ---- the objective ----------------------------------------------------------------------------


@pytest.mark.parametrize("schema", ["fixed-epoch", "min-sep"])
@pytest.mark.parametrize("n,epochs", [(20, 1), (30, 3), (41, 4)])
def test_objective_pieces_match_dense_formulas_and_finite_differences(n, epochs, schema):
    rng = np.random.default_rng(n)
    g = np.concatenate(([1.0], -0.3 * rng.random(4)))
    L, grad, err, sens2 = band_inv_loss_and_grad(g, n, epochs, schema)
    s = BandInvStrategy.from_noising_coefficients(g, n)
    A = np.tril(np.ones((n, n)))
    B = A @ _dense_inverse(s)
    assert err == pytest.approx(float(np.sum(B * B)) / n, rel=1e-12)
    b = n // epochs
    part = FixedEpochParticipation(epochs, b) if schema == "fixed-epoch" else Participation(epochs, b)
    assert sens2 == pytest.approx(closed_form_sensitivity_squared(s.coefs, part, n).value, rel=1e-12)
    assert L == pytest.approx(err * sens2, rel=1e-15)
    h = 1e-6
    for i in range(1, g.size):
        e = np.zeros_like(g)
        e[i] = h
        fd = (band_inv_loss_and_grad(g + e, n, epochs, schema)[0]
              - band_inv_loss_and_grad(g - e, n, epochs, schema)[0]) / (2 * h)
        assert grad[i] == pytest.approx(fd, rel=1e-6, abs=1e-8 * abs(L))


def _brute_force_sens2(C: np.ndarray, patterns) -> tuple[float, float]:
    """(lower, upper) over all patterns: max of 1^T X_pp 1 and of the best sign vector (attained by
    a neighbouring pair, so a lower bound), and max sum |X_pp| (an upper bound)."""
    X = C.T @ C
    lo = up = 0.0
    for p in patterns:
        sub = X[np.ix_(p, p)]
        for signs in itertools.product((1.0, -1.0), repeat=len(p) - 1):
            u = np.array((1.0,) + signs)
            lo = max(lo, float(u @ sub @ u))
        up = max(up, float(np.abs(sub).sum()))
    return lo, up


def _patterns(n: int, k: int, b: int, fixed: bool):
    if fixed:
        return [list(range(s, n, b))[:k] for s in range(b)]
    out = []
    for size in range(1, k + 1):
        for p in itertools.combinations(range(n), size):
            if all(q - r >= b for r, q in zip(p, p[1:])):
                out.append(list(p))
    return out


@pytest.mark.parametrize("fixed", [True, False])
@pytest.mark.parametrize("g", [[1.0, -0.5, -0.125, -0.0625], [1.0, -0.3, -0.4], [1.0, -0.4712, -0.1258, -0.2715],
                               [1.0, 0.4, -0.2], [1.0, -0.9, 0.3]])
def test_sensitivity_against_brute_force(g, fixed):
    n, k, b = 12, 3, 4
    s = BandInvStrategy.from_noising_coefficients(g, n)
    part = FixedEpochParticipation(k, b) if fixed else Participation(k, b)
    res = s.sensitivity_result(part)
    lo, up = _brute_force_sens2(s.encoder(), _patterns(n, k, b, fixed))
    assert res.value >= lo * (1 - 1e-12)  # sound
    closed = closed_form_sensitivity_squared(s.coefs, part, n)
    assert closed.value >= lo * (1 - 1e-12) and res.value <= closed.value * (1 + 1e-12)
    if s.nonnegative:  # X >= 0: the all-ones vector is optimal (Eq. 3), brute force is exact
        assert res.exact and res.value == pytest.approx(lo, rel=1e-9)
        assert up == pytest.approx(lo, rel=1e-12)
        if fixed:  # the O(n) closed form on |c| is exact for C >= 0, monotone or not
            assert closed.exact and closed.value == pytest.approx(lo, rel=1e-9)
    if closed.exact:
        assert closed.value == pytest.approx(lo, rel=1e-9)


def test_single_participation_sensitivity_is_the_column_norm_for_any_signs():
    s = BandInvStrategy.from_noising_coefficients([1.0, 0.7, -0.2], 30)
    assert not s.nonnegative
    r = closed_form_sensitivity_squared(s.coefs, Participation(1, 1), 30)
    assert r.exact and r.value == pytest.approx(float(np.sum(s.coefs**2)), rel=1e-12)


# ---- the optimizer ----------------------------------------------------------------------------


@pytest.mark.parametrize("n,bands,epochs", [(64, 4, 1), (60, 6, 3), (200, 8, 4)])
def test_optimizer_decreases_the_objective_and_beats_trivial_baselines(n, bands, epochs):
    part = FixedEpochParticipation(epochs, n // epochs)
    start = band_inv_loss_and_grad(bisr(n, bands).inverse_coefs, n, epochs)[0]
    seen = []
    s = optimize_banded_inverse_toeplitz(n, bands, epochs, callback=lambda i, L: seen.append(L))
    L = band_inv_loss_and_grad(s.inverse_coefs, n, epochs)[0]
    assert L < start * (1 - 1e-3)  # strictly better than BISR, its start
    assert seen and min(seen) == pytest.approx(L, rel=1e-9)
    # the objective bounds the true RMSE at sensitivity 1 (sens2 is a sound upper bound)
    assert s.rmse(part) <= math.sqrt(L) * (1 + 1e-9)
    assert s.rmse(part) < Identity(n).rmse(part) * 0.9
    assert s.rmse(part) < optimize_banded_inverse_toeplitz(n, 1, epochs).rmse(part)


def test_optimizer_matches_a_dense_brute_force_optimizer_on_a_tiny_case():
    # Nelder-Mead on the dense formulas (inv, column norms, b-min-sep closed form by enumeration of
    # the fixed-epoch patterns with X >= 0) from several starts: an independent minimizer
    n, bands, epochs = 12, 3, 2
    part = FixedEpochParticipation(epochs, n // epochs)
    A = np.tril(np.ones((n, n)))

    def dense_loss(x):
        g = np.concatenate(([1.0], x))
        Cinv = sum(gj * np.eye(n, k=-j) for j, gj in enumerate(g))
        C = np.linalg.inv(Cinv)
        if np.any(C < -1e-14):
            return 1e9  # the brute force searches the non-negative region only
        X = C.T @ C
        sens2 = max(float(X[np.ix_(p, p)].sum()) for p in _patterns(n, epochs, n // epochs, True))
        B = A @ Cinv
        return float(np.sum(B * B)) / n * sens2

    best = min(so.minimize(dense_loss, x0, method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-12,
                                                                          "maxiter": 4000}).fun
               for x0 in ([-0.5, -0.125], [-0.3, 0.0], [-0.1, -0.3]))
    s = optimize_banded_inverse_toeplitz(n, bands, epochs)
    assert s.nonnegative
    assert s.rmse(part) ** 2 == pytest.approx(best, rel=1e-6)


def test_nonnegative_option_certifies_C_nonnegative():
    s = optimize_banded_inverse_toeplitz(120, 12, 4, nonnegative=True)
    assert np.all(s.inverse_coefs[1:] <= 0) and s.nonnegative
    free = optimize_banded_inverse_toeplitz(120, 12, 4)
    part = FixedEpochParticipation(4, 30)
    # the constraint can only cost (both objectives are the same function)
    L = band_inv_loss_and_grad(s.inverse_coefs, 120, 4)[0]
    assert band_inv_loss_and_grad(free.inverse_coefs, 120, 4)[0] <= L * (1 + 1e-9)
    assert s.rmse(part) > 0


def test_a_negative_C_is_reported_as_such():
    s = BandInvStrategy.from_noising_coefficients([1.0, 0.5], 10)  # C = 1/(1 + x/2): alternating signs
    assert not s.nonnegative and s.coefs[1] == pytest.approx(-0.5)


# ---- structured object, serialization, catalog --------------------------------------------------


def test_describe_round_trips_and_normalized_keeps_the_form(tmp_path):
    s = optimize_banded_inverse_toeplitz(40, 4, 2, max_iter=30)
    d = json.loads(json.dumps(s.describe()))
    assert set(d) == {"name", "n", "bands", "inverse_coefs"} and d["name"] == "band-inv"
    t = strategy_from_dict(d)
    assert isinstance(t, BandInvStrategy) and t.describe() == s.describe()
    np.testing.assert_array_equal(t.coefs, s.coefs)
    with pytest.raises(InvalidParameterError, match="bands"):
        strategy_from_dict(dict(d, bands=5))
    part = FixedEpochParticipation(2, 20)
    u = s.normalized(part)
    assert isinstance(u, BandInvStrategy) and u.sensitivity(part) == pytest.approx(1.0, rel=1e-12)
    path = tmp_path / "bi.npz"
    catalog.save(s, path)
    back = catalog.load(path)
    assert isinstance(back, BandInvStrategy) and back.describe() == s.describe()


def test_catalog_build_band_inv():
    s = catalog.build("band-inv", 48, epochs=2, bands=3)
    assert isinstance(s, BandInvStrategy) and s.nonnegative and np.all(s.inverse_coefs[1:] <= 0)
    free = catalog.build("band-inv", 48, epochs=2, bands=3, constraints="all_signs")
    assert isinstance(free, BandInvStrategy)
    with pytest.raises(InvalidParameterError, match="band-inv"):
        catalog.build("band-inv", 48, epochs=2, bands=3, constraints="orthogonal")
    with pytest.raises(InvalidParameterError, match="bands"):
        catalog.build("band-inv", 48, epochs=2)


# ---- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: optimize_banded_inverse_toeplitz(10, 0),
        lambda: optimize_banded_inverse_toeplitz(10, 11),
        lambda: optimize_banded_inverse_toeplitz(10, -2),
        lambda: optimize_banded_inverse_toeplitz(10, 2.5),
        lambda: optimize_banded_inverse_toeplitz(10, float("nan")),
        lambda: optimize_banded_inverse_toeplitz(10, 3, 11),
        lambda: optimize_banded_inverse_toeplitz(0, 1),
        lambda: optimize_banded_inverse_toeplitz(10, 3, init=[1.0, 0.5]),
        lambda: optimize_banded_inverse_toeplitz(10, 3, init=[1.0, 0.5, -0.1], nonnegative=True),
        lambda: BandInvStrategy.from_noising_coefficients([], 5),
        lambda: BandInvStrategy.from_noising_coefficients([1.0, -0.5, 0.1], 2),
        lambda: BandInvStrategy.from_noising_coefficients([0.0, 1.0], 5),
        lambda: BandInvStrategy.from_noising_coefficients([-1.0, 0.5], 5),
        lambda: BandInvStrategy.from_noising_coefficients([1.0, np.nan], 5),
        lambda: BandInvStrategy(np.ones(4), 4),
        lambda: band_inv_loss_and_grad([1.0, -0.5], 10, 0),
        lambda: closed_form_sensitivity_squared([1.0, 0.5], "single", 4),
        lambda: band_inv_loss_and_grad([1.0, -0.5], 10, 2, "poisson"),
        lambda: optimize_banded_inverse_toeplitz(10, 3, schema="fixed"),
    ],
)
def test_bad_input_raises_dpmf_errors(call):
    with pytest.raises(DPMFError) as info:
        call()
    assert str(info.value)


def test_an_unstable_inverse_overflows_with_a_clear_error():
    with pytest.raises(NumericalError, match="unit disk"):
        BandInvStrategy.from_noising_coefficients([1.0, -3.0], 2000)


def test_min_sep_schema_without_rescoring_optimizes_the_majorant_bound():
    n, bands, epochs = 60, 4, 3
    s = optimize_banded_inverse_toeplitz(n, bands, epochs, schema="min-sep", rescore=False)
    L = band_inv_loss_and_grad(s.inverse_coefs, n, epochs, "min-sep")[0]
    assert L < band_inv_loss_and_grad(bisr(n, bands).inverse_coefs, n, epochs, "min-sep")[0]
    part = Participation(epochs, n // epochs)
    assert s.rmse(part) <= math.sqrt(L) * (1 + 1e-9)  # the objective bounds the true RMSE


@pytest.mark.parametrize("n,bands,epochs", [(48, 3, 2), (100, 3, 5), (200, 4, 10), (60, 4, 3)])
def test_min_sep_result_is_never_worse_than_the_majorant_or_fixed_epoch_optimum(n, bands, epochs):
    # the b-min-sep result is the best candidate by the sensitivity the strategy reports, so its
    # RMSE at sensitivity 1 is at most the majorant optimum's (rescore=False) and the fixed-epoch
    # optimum's, both scored the same way
    part = Participation(epochs, n // epochs)
    s = optimize_banded_inverse_toeplitz(n, bands, epochs, schema="min-sep")
    majorant = optimize_banded_inverse_toeplitz(n, bands, epochs, schema="min-sep", rescore=False)
    fixed = optimize_banded_inverse_toeplitz(n, bands, epochs, schema="fixed-epoch")
    assert s.rmse(part) <= majorant.rmse(part) * (1 + 1e-12)
    assert s.rmse(part) <= fixed.rmse(part) * (1 + 1e-12)


def test_min_sep_rescoring_gains_by_a_brute_force_sensitivity():
    # n = 48, 2 participations >= 24 apart: every pattern is a step or a pair, so the exact
    # squared sensitivity of both results is a brute-force max over pairs (C >= 0 here, so the
    # all-ones G attains sum |X_pp|); the majorant optimum is measurably worse than the result
    n, bands, epochs = 48, 3, 2
    b = n // epochs

    def exact_rmse(strategy):
        C = strategy.encoder()
        assert np.all(C >= 0)
        X = C.T @ C
        d = np.diag(X)
        pairs = d[:, None] + d[None, :] + 2 * X
        sens2 = max(float(d.max()), max(float(pairs[i, j]) for i in range(n) for j in range(i + b, n)))
        B = np.tril(np.ones((n, n))) @ _dense_inverse(strategy)
        return math.sqrt(sens2 * float(np.sum(B * B)) / n), sens2

    s = optimize_banded_inverse_toeplitz(n, bands, epochs, schema="min-sep")
    majorant = optimize_banded_inverse_toeplitz(n, bands, epochs, schema="min-sep", rescore=False)
    ours, sens2 = exact_rmse(s)
    assert s.sensitivity_result(Participation(epochs, b)).value == pytest.approx(sens2, rel=1e-9)
    assert ours < exact_rmse(majorant)[0] * (1 - 1e-3)


def test_min_sep_above_the_dense_limit_returns_the_majorant_optimum():
    # beyond DENSE_SENSITIVITY_MAX the reported b-min-sep sensitivity is the majorant itself, so
    # rescoring has nothing to judge by: the result is the majorant optimum, as with rescore=False
    from dpmf.strategies.bandinv import DENSE_SENSITIVITY_MAX

    n = DENSE_SENSITIVITY_MAX + 52
    s = optimize_banded_inverse_toeplitz(n, 3, 4, schema="min-sep")
    a = optimize_banded_inverse_toeplitz(n, 3, 4, schema="min-sep", rescore=False)
    np.testing.assert_array_equal(s.inverse_coefs, a.inverse_coefs)
    assert s.sensitivity_result(Participation(4, n // 4)).method.startswith("toeplitz")
