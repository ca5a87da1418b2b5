"""Composition of dense PLDs in one Fourier domain per stage (privacy/fourier_composition.py):
against direct (FFT-free) convolution, against dp_accounting's pairwise composition, and the
Chernoff window's soundness; the compiled Newton steps of the mixture thresholds against numpy's."""

from __future__ import annotations

import numpy as np
import pytest

from dpmf.privacy import dp_pld
from dpmf.privacy.fourier_composition import Part, compose_parts, plan_stages, window
from dpmf.privacy.mixture import mixture_of_gaussians
from dpmf.privacy.pld import DEFAULT_TAIL_MASS_TRUNCATION, PrivacyLossDistribution, compose_many


def _direct(parts: list[Part]) -> tuple[int, np.ndarray]:
    """The exact sum law by repeated ``np.convolve`` (non-negative terms: relative accuracy)."""
    out, lower = np.ones(1), 0
    for p in parts:
        for _ in range(p.count):
            out = np.convolve(out, p.probs)
            lower += p.lower
    return lower, out


def _hockey(lower: int, probs: np.ndarray, inf: float, disc: float, eps: float) -> float:
    loss = (lower + np.arange(probs.size)) * disc
    return float(np.sum(np.where(loss > eps, -np.expm1(eps - loss) * probs, 0.0))) + inf


def _random_part(rng, size: int, count: int) -> Part:
    p = rng.random(size) ** 4
    return Part(int(rng.integers(-size, size)), p / p.sum(), count)


@pytest.mark.parametrize("seed", range(6))
def test_equals_direct_convolution_without_truncation(seed):
    rng = np.random.default_rng(seed)
    parts = [_random_part(rng, int(rng.integers(2, 40)), int(rng.integers(1, 6))) for _ in range(int(rng.integers(1, 6)))]
    lower, probs, moved = compose_parts(parts, 0.0)
    ref_lower, ref = _direct(parts)
    assert moved == 0.0
    full = np.zeros(ref.size + 2)
    full[lower - ref_lower: lower - ref_lower + probs.size] = probs
    np.testing.assert_allclose(full[: ref.size], ref, rtol=0, atol=1e-15)


@pytest.mark.parametrize("seed", range(6))
def test_truncated_result_dominates_the_exact_law(seed):
    """With a tail that cuts the window, every hockey-stick value is at least the exact one (mass
    outside went up or to +inf) and at most ``2 tail`` per stage above it."""
    rng = np.random.default_rng(100 + seed)
    parts = [_random_part(rng, int(rng.integers(20, 200)), int(rng.integers(1, 30))) for _ in range(4)]
    tail = 1e-6
    lower, probs, moved = compose_parts(parts, tail)
    ref_lower, ref = _direct(parts)
    assert lower >= ref_lower and probs.size < ref.size  # the window did cut
    stages = len(plan_stages(parts, tail))
    for eps in np.linspace(-2.0, 2.0, 9):
        got = _hockey(lower, probs, moved, 0.01, eps)
        want = _hockey(ref_lower, ref, 0.0, 0.01, eps)
        assert want - 1e-14 <= got <= want + 2 * tail * stages + 1e-14


@pytest.mark.parametrize("seed", range(4))
def test_chernoff_window_holds_all_but_tail(seed):
    rng = np.random.default_rng(200 + seed)
    parts = [_random_part(rng, int(rng.integers(50, 300)), int(rng.integers(2, 40))) for _ in range(3)]
    for tail in (1e-3, 1e-8, 1e-12):
        lo, hi, cut = window(parts, tail)
        _, ref = _direct([Part(0, p.probs, p.count) for p in parts])
        outside = ref[:lo].sum() + ref[hi + 1:].sum()
        assert outside <= tail
        assert cut == (lo > 0 or hi < ref.size - 1)


def _old_compose_many(plds, counts, tail=DEFAULT_TAIL_MASS_TRUNCATION):
    """dp_accounting's way (self-compose, then pairwise merges smallest first) for comparison."""
    import heapq

    from dpmf.privacy.pld import _grid_size

    heap = [(_grid_size(p.self_compose(k, tail) if k > 1 else p), i, p.self_compose(k, tail) if k > 1 else p)
            for i, (p, k) in enumerate(zip(plds, counts))]
    heapq.heapify(heap)
    order = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        heapq.heappush(heap, (0, order, a.compose(b, tail)))
        order += 1
    return heap[0][2]


def _engine(plds, counts, direction):
    """The engine's composition of one direction as a dense PMF (as a caller would wire it)."""
    from dpmf.privacy.fourier_composition import infinity_mass
    from dpmf.privacy.pld import dense_pmf

    parts, infs = [], []
    for p, k in zip(plds, counts):
        lower, probs, inf, disc = dp_pld.dense_arrays(p._direction(direction))
        parts.append(Part(lower, probs, k))
        infs.append(inf)
    lower, probs, moved = compose_parts(parts, DEFAULT_TAIL_MASS_TRUNCATION)
    return dense_pmf(lower, probs, min(1.0, infinity_mass(infs, counts) + moved), disc)


def test_mixture_rows_match_pairwise_composition():
    """Mixture PLDs like MMCC's rows (several parts, one with a large count): at deltas 1e-3 and
    1e-6 the epsilons equal dp_accounting's pairwise composition to 1e-9 relative, and the mass at
    +inf is no larger. (At delta <= 1e-10 the two differ by ~1e-6 relative and this engine was
    measured *below* an FFT-free reference: why it is not wired into ``compose_many``.)"""
    from dpmf.privacy.pld import _epsilon_for_delta

    plds = [mixture_of_gaussians([0.0, 0.5, 1.0], [0.9, 0.08, 0.02], 1.0),
            mixture_of_gaussians([0.0, 1.0, 2.0], [0.8, 0.15, 0.05], 1.5),
            mixture_of_gaussians([0.0, 1.0], [0.95, 0.05], 0.8)]
    counts = [1, 3, 200]
    old = compose_many(plds, counts)
    for d in ("remove", "add"):
        new = _engine(plds, counts, d)
        for delta in (1e-3, 1e-6):
            assert _epsilon_for_delta(new, delta) == pytest.approx(_epsilon_for_delta(old._direction(d), delta),
                                                                    rel=1e-9)
        assert dp_pld.infinity_mass(new) <= dp_pld.infinity_mass(old._direction(d))
        assert np.all(dp_pld.dense_arrays(new)[1] >= 0)


def test_infinity_mass_of_the_parts_is_kept():
    from dpmf.privacy.pld import dense_pmf

    pmf = dense_pmf(-3, np.array([0.2, 0.5, 0.3 - 1e-3]), 1e-3, 0.1)
    sym = PrivacyLossDistribution(pmf, pmf)
    out = _engine([sym, sym], [2, 3], "remove")
    inf = dp_pld.infinity_mass(out)
    assert inf >= 1 - (1 - 1e-3) ** 5
    assert inf == pytest.approx(1 - (1 - 1e-3) ** 5, rel=1e-12)
    assert dp_pld.dense_arrays(out)[1].sum() + inf == pytest.approx(1.0, abs=1e-14)


@pytest.mark.parametrize("lattice", [True, False])
def test_compiled_newton_matches_numpy_newton(lattice):
    from dpmf.privacy import mixture as M

    c = np.arange(0.0, 3.01, 0.25)
    p = np.exp(-c * 2.0)
    p /= p.sum()
    mech = M.GaussianMixture.create(c, p, 0.9, 0.25 if lattice else None)
    a, s = mech._a, mech._s
    targets = np.linspace(mech.min_loss + 1e-3, 12.0, 5001)
    evaluate = M._compiled_loss(a, s, mech.lattice / mech.noise_multiplier, -12.0, 16.0)
    fast = M._inverse_loss(a, s, targets, table_range=(-12.0, 16.0), evaluate=evaluate)

    def plain(u):  # the same evaluator without the compiled Newton steps
        return evaluate(u)

    slow = M._inverse_loss(a, s, targets, table_range=(-12.0, 16.0), evaluate=plain)
    np.testing.assert_allclose(fast, slow, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(M._lse(fast, a, s)[0], targets, rtol=1e-12, atol=1e-12)
