"""``dpmf plan``'s time budget (:mod:`dpmf.planning.budget`): the quick waves always run whole, the
costly last wave stops at the deadline, a stopped candidate keeps only certified noises (a cut row
is an accountant's bound at its noise, never below what a full calibration finds), the cache reuses
cuts only for a budget at most as large, and a budget that suffices changes nothing."""

from __future__ import annotations

import math

import dpmf
from dpmf.planner import TrainingRun, candidates, plan
from dpmf.planning.budget import cut_row, run_until
from dpmf.planning.evaluate import evaluate

RUN = TrainingRun(200, 20, 2, 1.0, 1e-6)  # 20 steps, 10 per epoch
PICK = {("identity", "fixed-order"), ("identity", "poisson"), ("banded-toeplitz-4", "poisson")}  # the last: wave 2


def picked():
    out = [c for c in candidates(RUN) if (c.strategy_name, c.scheme.name) in PICK]
    assert len(out) == 3 and max(c.wave for c in out) == 2
    return out


def values(row) -> tuple:
    d = row.to_dict()
    d.pop("seconds"), d.pop("cached")
    return tuple(sorted(d.items()))


def test_an_exhausted_budget_cuts_the_last_wave_only_and_the_cache_keeps_the_cut(tmp_path):
    firsts = []
    res = plan(RUN, only=picked(), budget=1e-9, cache=tmp_path, on_first=lambda rows, k: firsts.append((rows, k)))
    assert [c.strategy for c in res.cut] == ["banded-toeplitz-4"] and not res.complete
    assert {(r.strategy, r.sampling) for r in res} == {("identity", "fixed-order"), ("identity", "poisson")}
    # (the costly wave starts beside the quick one, so what is ranked when it starts is the first wave)
    assert len(firsts) == 1 and firsts[0][1] == 1 and [r.rank for r in firsts[0][0]] == [1]
    again = plan(RUN, only=picked(), budget=1e-9, cache=tmp_path)  # the same budget: the cut is reused
    assert [c.label for c in again.cut] == [c.label for c in res.cut] and all(r.cached for r in again)
    full = plan(RUN, only=picked(), thorough=True, cache=tmp_path)  # no budget: the cut is not reused
    assert full.complete and len(full) == 3


def test_a_sufficient_budget_gives_the_rows_of_the_thorough_plan():
    """Same best row, same calibrated rows; a row pruned in one plan and calibrated in the other (the
    budgeted plan starts its costly candidates beside the quick ones, against the best row certified
    by then) has its pruned bound at or below the calibrated RMSE."""
    thorough = plan(RUN, only=picked(), thorough=True, cache=None)
    budgeted = plan(RUN, only=picked(), budget=3600, cache=None)
    assert budgeted.complete and values(budgeted[0]) == values(thorough[0])
    by_name = {(r.strategy, r.sampling): r for r in thorough}
    assert len(by_name) == len(budgeted) == 3
    for r in budgeted:
        t = by_name[(r.strategy, r.sampling)]
        if r.pruned == t.pruned:
            assert r.pruned or values(r) == values(t)
        else:
            pruned, calibrated = (r, t) if r.pruned else (t, r)
            assert pruned.prefix_sum_rmse <= calibrated.prefix_sum_rmse


def test_a_cut_row_is_certified_at_its_noise_and_never_below_the_calibrated_row():
    cand = next(c for c in candidates(RUN) if c.strategy_name == "banded-toeplitz-4" and c.scheme.name == "poisson")
    calibrated = evaluate(cand, RUN)
    sigma = calibrated.noise_multiplier * 1.3  # a noise a calibration passes through on its way down
    eps = dpmf.account(cand.strategy, cand.scheme, sigma, RUN.delta, method=cand.method).epsilon
    row = cut_row(cand, RUN, sigma, eps, 3, 1.0)
    assert row.cut and row.certified and not row.pruned and eps <= RUN.epsilon
    assert row.prefix_sum_rmse >= calibrated.prefix_sum_rmse
    assert math.isclose(row.prefix_sum_rmse / row.noise_multiplier, calibrated.prefix_sum_rmse / calibrated.noise_multiplier)


def test_workers_report_every_evaluation_and_a_deadline_keeps_only_passing_noises():
    cand = next(c for c in candidates(RUN) if c.strategy_name == "banded-toeplitz-4" and c.scheme.name == "poisson")
    seen = []
    finished, partial, cut = run_until([cand], RUN, math.inf, None, processes=1, on_eval=lambda i, s, e: seen.append((s, e)))
    assert list(finished) == [0] and not partial and not cut
    row = finished[0]
    assert any(s == row.noise_multiplier and e <= RUN.epsilon for s, e in seen)  # the answer was one evaluation
    assert len(seen) >= 2


def test_a_row_that_would_not_fit_in_memory_is_skipped_before_it_is_built(monkeypatch):
    import dpmf.resources

    run = TrainingRun(60, 20, 300, 4.0, 1e-5, mmcc=False)  # 900 steps, 300 epochs (issue 44)
    optimal = next(c for c in candidates(run) if c.strategy_name == "optimal-mf")
    assert optimal.memory_bytes() > 15 * 2**30  # the dual problem's k(k+1)/2 x (1 + k(k-1)/2) matrix
    small = next(c for c in candidates(run) if c.strategy_name == "identity" and c.scheme.name == "fixed-order")
    monkeypatch.setattr(dpmf.resources, "available_memory", lambda: 4.0 * 2**30)
    res = plan(run, only=[small, optimal], cache=None)
    assert [(r.strategy, r.sampling) for r in res] == [("identity", "fixed-order")]
    (skipped,) = res.cut
    assert skipped.strategy == "optimal-mf" and "15.2 GiB" in skipped.reason and "--force" in skipped.reason
    assert "strategy" not in optimal.__dict__  # never built


def test_a_worker_that_dies_is_named_as_cut_not_a_crash_and_not_cached(tmp_path, monkeypatch):
    """A worker killed from outside (the kernel for memory, a signal) leaves its candidate cut with
    the reason, no row from it, and nothing cached for it (the next run tries again)."""
    import os
    import signal

    from dpmf.planning import budget

    monkeypatch.setattr(budget, "_child", lambda *a: os.kill(os.getpid(), signal.SIGTERM))  # forked: inherited
    res = plan(RUN, only=picked(), budget=3600, cache=tmp_path)
    # (under a budget every candidate after the first wave runs in a worker: both are lost)
    assert sorted(c.strategy for c in res.cut) == ["banded-toeplitz-4", "identity"]
    assert all("died (exit code -15" in c.reason and not c.by_budget for c in res.cut)
    assert {(r.strategy, r.sampling) for r in res} == {("identity", "fixed-order")}
    monkeypatch.undo()
    again = plan(RUN, only=picked(), budget=3600, cache=tmp_path)
    assert again.complete and len(again) == 3


def test_a_costly_candidate_gets_a_worker_first_and_the_deadline_stops_only_costly_ones():
    """Quick and costly candidates together (a budgeted plan): a free worker goes to a costly one
    while none runs (the quick ones cannot starve it); past the deadline the quick ones still run to
    the end and the costly one is cut."""
    import time

    cands = sorted(picked(), key=lambda c: c.wave)  # fixed order, fixed order, ..., the wave-2 one last
    costly = [j for j, c in enumerate(cands) if c.wave == 2]
    quick = [j for j, c in enumerate(cands) if c.wave < 2]
    started = []
    run_until(cands, RUN, math.inf, None, processes=1, quick=quick, on_start=started.append)
    assert started[0] == costly[0] and sorted(started) == list(range(len(cands)))
    finished, partial, cut = run_until(cands, RUN, math.inf, time.monotonic() - 1, processes=1, quick=quick)
    assert set(finished) == set(quick) and set(cut) == set(costly) and not partial
    assert all(c.by_budget for c in cut.values())


def _two_costly():
    cands = [c for c in candidates(RUN) if c.wave == 2 and c.strategy_name == "banded-toeplitz-4"]
    cands += [c for c in candidates(RUN) if c.wave == 2 and c.strategy_name == "tree"]
    assert len(cands) == 2
    return cands


def test_answered_candidates_pause_until_every_costly_one_has_an_answer():
    """One worker, two costly candidates: the first is paused (SIGSTOP) once it has certified a noise,
    the second runs meanwhile, and the first is resumed after; both end with the rows they have alone."""
    cands = _two_costly()
    order, evals = [], []
    finished, partial, cut = run_until(cands, RUN, math.inf, None, processes=1, on_start=order.append,
                                       on_eval=lambda i, s, e: evals.append((i, e <= RUN.epsilon)))
    assert order == [0, 1] and set(finished) == {0, 1} and not partial and not cut
    first_pass = evals.index((0, True))
    assert any(i == 1 for i, _ in evals[first_pass:])  # the second ran after the first's first answer ...
    assert [i for i, _ in evals][-1] == 0  # ... and the first finished last, resumed
    for i, c in enumerate(cands):
        assert values(finished[i]) == values(evaluate(c, RUN))


def test_the_answer_grace_lets_an_unanswered_candidate_answer_after_the_deadline():
    """Past the deadline a costly candidate without an answer still starts and runs until its first
    certified noise (a cut row), within the grace; without a grace it is cut unranked."""
    import time

    (cand,) = _two_costly()[:1]
    finished, partial, cut = run_until([cand], RUN, math.inf, time.monotonic() - 1, processes=1, grace=600)
    assert not cut and (list(partial) == [0] or list(finished) == [0])
    row = partial.get(0) or finished[0]
    assert row.certified and row.epsilon <= RUN.epsilon
    finished, partial, cut = run_until([cand], RUN, math.inf, time.monotonic() - 1, processes=1)
    assert list(cut) == [0] and not partial and not finished
