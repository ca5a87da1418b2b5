"""``dpmf.planner.plan`` answers like ``dpmf plan`` and says what it did (issue 49 items 3-5, issue 51):
the CLI's budget, thorough, cache and worker defaults; a budget and thorough together refused; progress
that never says done while the budget cut candidates; a cut retried under a larger budget; pruned rows
naming the accountant that bounded them; a plan with no row refused."""

from __future__ import annotations

import inspect
import io
import math
import time

import pytest

from dpmf import progress
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.planner import TrainingRun, candidates, plan
from dpmf.planning import budget as budget_module
from dpmf.planning.budget import DEFAULT_BUDGET, cut_row, resolve_budget
from dpmf.planning.evaluate import evaluate

RUN = TrainingRun(200, 20, 2, 1.0, 1e-6)  # 20 steps, 10 per epoch
PICK = {("identity", "fixed-order"), ("identity", "poisson"), ("banded-toeplitz-4", "poisson")}  # the last: wave 2


def picked():
    return [c for c in candidates(RUN) if (c.strategy_name, c.scheme.name) in PICK]


# ----------------------------------------------------------------------- Python = CLI
def test_plan_has_the_defaults_of_the_cli():
    from dpmf.cli.main import DEFAULT_PLAN_BUDGET

    params = inspect.signature(plan).parameters
    assert params["budget"].default is None and params["thorough"].default is False
    assert params["cache"].default is True and params["workers"].default is None
    assert resolve_budget(None, False) == DEFAULT_BUDGET == DEFAULT_PLAN_BUDGET
    assert resolve_budget(None, True) is None and resolve_budget(7, False) == 7.0
    doc = inspect.getdoc(plan)
    assert "dpmf plan" in doc and "25 s" in doc and "thorough" in doc and "default_cache_dir" in doc


def test_a_default_plan_call_stops_its_costly_wave_at_the_default_budget(monkeypatch, tmp_path):
    """``plan(run)`` with nothing else: the (monkeypatched, small) default budget stops a costly
    candidate that would run for minutes, and the rows go to the default cache folder."""
    import os

    monkeypatch.setenv("DPMF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(budget_module, "DEFAULT_BUDGET", 3.0)
    real_child = budget_module._child

    def child(i, cand, run, threshold, *pipe):  # (forked: inherited) the costly wave never ends in time
        if cand.wave == 2:
            time.sleep(300)
        real_child(i, cand, run, threshold, *pipe)

    monkeypatch.setattr(budget_module, "_child", child)
    res = plan(RUN, only=picked())
    assert res.budget == 3.0 and res.seconds < 3.0 + budget_module.answer_grace(3.0) + 60  # (300 s without it)
    assert [c.strategy for c in res.cut] == ["banded-toeplitz-4"] and res.cut[0].by_budget and res.cut[0].reason
    assert len(res) == 2 and not res.complete
    assert os.listdir(tmp_path / "plan")  # the default cache, as dpmf plan's


@pytest.mark.parametrize("budget, thorough", [(5, True), (-1, False), (0, False), (math.nan, False),
                                              (math.inf, False), (True, False), (5, "yes")])
def test_a_budget_with_thorough_or_a_bad_budget_is_refused_before_any_work(budget, thorough, monkeypatch):
    monkeypatch.setattr("dpmf.planner.candidates", lambda run: pytest.fail("the plan ran"))
    with pytest.raises(InvalidParameterError, match="budget|thorough"):
        plan(RUN, budget=budget, thorough=thorough)


def test_a_budget_with_a_scheduler_is_refused():
    with pytest.raises(InvalidParameterError, match="scheduler"):
        plan(RUN, only=picked(), budget=5, scheduler="tcp://127.0.0.1:1")


# ----------------------------------------------------------------------- an honest budget
def _progress_lines(**kwargs) -> tuple:
    buf = io.StringIO()
    with progress.reporting("log", stream=buf, interval=0, delay=0):
        res = plan(RUN, only=picked(), cache=None, **kwargs)
    return res, buf.getvalue().splitlines()


def test_progress_never_says_done_when_the_budget_cut_candidates():
    res, lines = _progress_lines(budget=1e-9)
    last = [line for line in lines if "plan candidates" in line][-1]
    assert ": stopped by the time budget, 2/3 candidates" in last and ": done" not in last, last
    assert "3 candidates: 2 certified, 1 cut by the time budget (0 with a certified noise, 1 not ranked)" in last
    assert res.counts() == {"certified": 2, "estimates": 0, "pruned": 0, "cut": 1, "skipped": 0, "candidates": 3}
    full, lines = _progress_lines(thorough=True)
    last = [line for line in lines if "plan candidates" in line][-1]
    assert ": done, 3/3 candidates (100.0%)" in last and "3 candidates: " in last and "cut" not in last, last


def test_the_budget_never_stops_the_quick_waves_even_when_they_are_the_last():
    quick = [c for c in picked() if c.wave < 2]
    assert {c.wave for c in quick} == {0, 1}
    res = plan(RUN, only=quick, budget=1e-9, cache=None)
    assert res.complete and len(res) == 2 and not any(r.cut for r in res)


def test_a_cut_is_retried_under_a_larger_budget_and_reused_under_the_same(tmp_path):
    cut = plan(RUN, only=picked(), budget=1e-9, cache=tmp_path)
    assert [c.strategy for c in cut.cut] == ["banded-toeplitz-4"]
    same = plan(RUN, only=picked(), budget=1e-9, cache=tmp_path)
    assert [c.label for c in same.cut] == [c.label for c in cut.cut] and all(r.cached for r in same)
    larger = plan(RUN, only=picked(), budget=3600, cache=tmp_path)
    assert larger.complete and len(larger) == 3
    assert not next(r for r in larger if r.strategy == "banded-toeplitz-4").cached  # computed again


def test_a_cut_row_is_retried_under_a_larger_budget_and_reused_under_a_smaller(tmp_path):
    from dpmf.planning.cache import PlanCache

    import dpmf

    cand = next(c for c in picked() if c.wave == 2)
    calibrated = evaluate(cand, RUN)
    sigma = calibrated.noise_multiplier * 1.5
    eps = dpmf.account(cand.strategy, cand.scheme, sigma, RUN.delta, method=cand.method).epsilon
    cache = PlanCache(tmp_path)
    cache.put(cand.key(RUN), cut_row(cand, RUN, sigma, eps, 2, 1.0), budget=5.0)
    smaller = plan(RUN, only=[cand], budget=4.0, cache=cache)
    assert smaller[0].cut and smaller[0].cached and smaller[0].noise_multiplier == sigma
    larger = plan(RUN, only=[cand], budget=3600, cache=cache)
    assert not larger[0].cut and not larger[0].cached
    assert larger[0].noise_multiplier == pytest.approx(calibrated.noise_multiplier, rel=1e-12)


# ----------------------------------------------------------------------- the rows explain themselves
def test_pruned_rows_name_the_accountant_that_bounded_them():
    """BSR under balls-in-bins is planned with ``auto``; its pruned row names the accountant whose
    epsilon ruled it out (the toy run of docs/tutorials/plan.md, where it is pruned)."""
    from dpmf.accounting.dispatch import METHODS

    run = TrainingRun(300, 100, 2, 2.0, 1e-6)
    pick = [c for c in candidates(run) if (c.strategy_name, c.sampling_name) in
            {("identity", "balls-in-bins-fresh"), ("bsr-3", "balls-in-bins")}]
    assert [c.method for c in pick if c.strategy_name == "bsr-3"] == ["auto"]
    rows = plan(run, only=pick, thorough=True, cache=None)
    (pruned,) = [r for r in rows if r.pruned]
    assert pruned.strategy == "bsr-3" and pruned.method != "auto" and pruned.method in METHODS
    assert pruned.rank is None and [r.rank for r in rows if not r.pruned] == [1]


def test_a_plan_with_no_row_is_refused_saying_why(monkeypatch):
    import dpmf.resources

    run = TrainingRun(60, 20, 300, 4.0, 1e-5, mmcc=False)  # 900 steps: the optimal factorization needs > 15 GiB
    optimal = next(c for c in candidates(run) if c.strategy_name == "optimal-mf")
    monkeypatch.setattr(dpmf.resources, "available_memory", lambda: 4.0 * 2**30)
    with pytest.raises(UnsupportedConfigurationError, match=r"no row: .*1 skipped.*optimal-mf.*memory.*--force"):
        plan(run, only=[optimal], cache=None)
    with pytest.raises(UnsupportedConfigurationError, match="no candidate"):
        plan(run, only=[], cache=None)


def test_the_cost_check_keeps_the_quick_waves_whole_under_a_budget():
    """Only the costly wave stops at the budget: the estimate a budget checks keeps the quick waves'
    part in full (a 10^6-step plan was let through with ``--budget 5``, issue 51)."""
    from dpmf.accounting.cost import plan_cost
    from dpmf.planning.budget import budgeted_cost

    est = plan_cost(1000, epochs=10)
    assert est.parts[0][0].startswith("closed forms") and len(est.parts) > 1  # the quick waves come first
    capped = budgeted_cost(est, 5.0)
    assert capped.seconds == pytest.approx(est.parts[0][1] + 5.0) and capped.memory_bytes == est.memory_bytes
    assert budgeted_cost(est, 1e6).seconds == pytest.approx(est.seconds) and budgeted_cost(est, None) is est
    huge = plan_cost(10**6)
    assert budgeted_cost(huge, 5.0).seconds >= huge.parts[0][1] > 3600
