"""dpmf.privacy.pld.composed_epsilon: the worst direction composed on the fine grid, the other one
bounded on a coarse grid; against compose_many (both directions on the fine grid)."""

from __future__ import annotations

import numpy as np
import pytest

from dpmf.privacy import dp_pld
from dpmf.privacy.mixture import mixture_of_gaussians
from dpmf.privacy.pld import PrivacyLossDistribution, compose_many, compose_many_directions, composed_epsilon


def _rows():
    # MMCC-like rows: mixtures whose remove direction is the worse one
    return [
        mixture_of_gaussians([0.0, 0.5, 1.0], [0.9, 0.07, 0.03], 0.9),
        mixture_of_gaussians([0.0, 1.0, 2.0], [0.95, 0.04, 0.01], 1.1),
        mixture_of_gaussians([0.0, 1.0], [0.97, 0.03], 1.0),
    ]


def _swapped(pld: PrivacyLossDistribution) -> PrivacyLossDistribution:
    return PrivacyLossDistribution(remove=pld.add, add=pld.remove)


@pytest.mark.parametrize("delta", [1e-3, 1e-6])
def test_worst_direction_equals_compose_many_and_the_other_is_bounded(delta):
    plds, counts = _rows(), [1, 3, 40]
    full = compose_many(plds, counts)
    exact = full.epsilon_by_direction(delta)
    assert exact["remove"] > exact["add"]  # (the premise: remove decides)
    got = composed_epsilon(plds, counts, delta)
    assert got.bounded == ("add",) and got.pld is None
    assert got.epsilon_by_direction["remove"] == exact["remove"]  # the same composition, bit for bit
    assert got.epsilon == max(exact.values())
    # the coarse bound is an upper bound of the fine direction's epsilon, and not far above it
    assert exact["add"] <= got.epsilon_by_direction["add"] <= exact["remove"]


def test_the_add_direction_is_found_when_it_is_the_worst():
    plds, counts = [_swapped(p) for p in _rows()], [1, 3, 40]
    exact = compose_many(plds, counts).epsilon_by_direction(1e-6)
    assert exact["add"] > exact["remove"]
    got = composed_epsilon(plds, counts, 1e-6)
    assert got.bounded == ("remove",)
    assert got.epsilon_by_direction["add"] == exact["add"]
    assert exact["remove"] <= got.epsilon_by_direction["remove"] <= exact["add"]


def test_a_tie_composes_both_directions():
    """Both directions the same law (as separate objects): the other direction's coarse bound is
    above the worst one's fine epsilon, so it is composed on the fine grid too (negative control of
    the shortcut)."""
    base = mixture_of_gaussians([0.0, 1.0], [0.9, 0.1], 1.0)
    lower, probs, inf, disc = dp_pld.dense_arrays(base.remove)
    twin = PrivacyLossDistribution(base.remove, dp_pld.make_dense(lower, probs.copy(), inf, disc))
    assert not twin.symmetric
    got = composed_epsilon([twin], [30], 1e-6)
    full = compose_many([twin], [30])
    assert got.bounded == () and got.pld is not None
    assert got.epsilon_by_direction == full.epsilon_by_direction(1e-6)


def test_keep_points_returns_compose_manys_pld():
    plds, counts = _rows(), [2, 1, 25]
    got = composed_epsilon(plds, counts, 1e-5, keep_points=10**9)
    full = compose_many(plds, counts)
    assert got.bounded == ()
    for d in ("remove", "add"):
        a, b = got.pld.pmf(d), full.pmf(d)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        assert a[2] == b[2]


def test_compose_many_directions_is_compose_manys_per_direction():
    plds, counts = _rows(), [1, 4, 9]
    full = compose_many(plds, counts)
    for d in ("remove", "add"):
        one = compose_many_directions(plds, counts, (d,))
        assert set(one) == {d}
        np.testing.assert_array_equal(dp_pld.dense_arrays(one[d])[1], full.pmf(d)[1])


def test_mmcc_keeps_its_curve_when_small_and_bounds_the_other_direction_when_not(monkeypatch):
    """A small MMCC run keeps both directions (its report's curve is the composed PLD); with no room
    for the curve, the other direction is bounded on the coarse grid and named in the diagnostics,
    and the epsilon is the same."""
    import dpmf
    from dpmf.accounting.mmcc import accountant
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import bsr

    def run():
        return dpmf.account(bsr(24, 4), PoissonSampling(0.05, 24), 1.0, 1e-6, method="mmcc", heuristic=False)

    kept = run()
    assert kept.curve is not None and "bounded_directions" not in kept.diagnostics
    monkeypatch.setattr(accountant, "_CURVE_MAX_POINTS", 0)
    bounded = run()
    assert bounded.epsilon == kept.epsilon
    assert "upper bound" in bounded.diagnostics["bounded_directions"]
    assert bounded.epsilon_by_direction["add"] >= kept.epsilon_by_direction["add"]
