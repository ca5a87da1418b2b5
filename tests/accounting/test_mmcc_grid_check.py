"""MMCC's checked coarse loss grid (``mmcc/grid.py``: ``checked_coarse_grid``; issue 50 item 2)."""

from __future__ import annotations

import math

import pytest

from dpmf.accounting.mmcc import MMCCAccountant
from dpmf.accounting.mmcc.grid import GRID_CHECK_BUDGET, GRID_CHECK_REL, checked_coarse_grid
from dpmf.sampling import PoissonSampling
from dpmf.strategies import BinaryTree


def _law(exact: float, c: float, calls: list):
    """An epsilon that converges like the grid squared (connect-the-dots PLDs), counting the grids asked."""

    def at(grid: float):
        calls.append(grid)
        e = exact + c * grid * grid
        return e, ("value", grid, e)

    return at


def test_a_converged_grid_is_reported_and_within_the_check_of_the_fine_one():
    calls: list = []
    fine = 1e-4
    at = _law(1000.0, 3.0, calls)
    out = checked_coarse_grid(at, fine)
    assert out is not None
    factor, (_, grid, e) = out
    assert grid == fine * factor and factor >= 2
    e2 = at(2 * grid)[0]
    assert abs(e2 - e) <= GRID_CHECK_REL * e  # the pair agrees
    assert abs(e - at(fine)[0]) <= GRID_CHECK_REL * e / 3 * 1.001  # so the fine grid's is within a third
    # the next coarser grid of the reported one disagrees (the coarsest agreeing pair is taken)
    if 4 * grid <= 64 * fine:
        assert abs(at(4 * grid)[0] - e2) > GRID_CHECK_REL * e2


def test_a_grid_that_does_not_converge_in_the_budget_gives_the_fine_grid_back():
    calls: list = []
    out = checked_coarse_grid(_law(5.0, 1e3, calls), 1e-4)  # small epsilon, large discretization error
    assert out is None
    assert sum(1e-4 / g for g in calls) <= GRID_CHECK_BUDGET  # the work spent, in fine-grid units
    calls.clear()
    assert checked_coarse_grid(lambda g: (math.inf, None), 1e-4) is None
    assert checked_coarse_grid(lambda g: (0.0, None), 1e-4) == (32, None)  # epsilon 0 on both grids


def test_mmcc_reports_the_checked_grid_and_agrees_with_the_requested_one():
    strategy, scheme = BinaryTree(8), PoissonSampling(1 / 8, 8)
    checked = MMCCAccountant(strategy, scheme, 1e-5).report(1.0, heuristic=False)
    fine = MMCCAccountant(strategy, scheme, 1e-5, check_grids=False).report(1.0, heuristic=False)
    assert fine.diagnostics["discretization"] == 1e-4 and "discretization_check" not in fine.diagnostics
    assert checked.diagnostics["discretization"] > 1e-4
    assert "discretization_check" in checked.diagnostics and "discretization_note" not in checked.diagnostics
    assert checked.epsilon == pytest.approx(fine.epsilon, rel=1e-6)


def test_the_heuristic_estimate_is_read_on_a_coarse_grid_within_its_looser_check():
    """The independent-rows heuristic (an estimate, not a bound) takes a coarse grid once two agree to
    ``HEURISTIC_GRID_REL`` (1e-5): within a third of that of the requested grid's estimate, not below it
    by more (every loss is rounded up), and the bound itself is unchanged."""
    from dpmf.accounting.mmcc.accountant import HEURISTIC_GRID_REL

    strategy, scheme = BinaryTree(16), PoissonSampling(1 / 16, 16)
    checked = MMCCAccountant(strategy, scheme, 1e-5)
    fine = MMCCAccountant(strategy, scheme, 1e-5, check_grids=False)
    bound = checked.report(0.7, heuristic=False)
    est = checked.add_heuristic(bound).diagnostics["independent_rows_heuristic_epsilon"]
    ref = fine.add_heuristic(bound).diagnostics["independent_rows_heuristic_epsilon"]
    assert HEURISTIC_GRID_REL > GRID_CHECK_REL
    assert ref * (1 - 1e-9) <= est <= ref * (1 + HEURISTIC_GRID_REL / 3 * 1.001)
    assert checked.report(0.7).epsilon == bound.epsilon
