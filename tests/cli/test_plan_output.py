"""`dpmf plan` says what it did and what its words mean (issue 49 items 3 and 5, issue 51): the legend
under the table, in --help and on the plan page; JSON rows with their rank and cut entries with their
reason; progress that never says done while the budget cut candidates; the table printed once into a
pipe; an empty plan, a budget with --thorough and a bad budget refused; the cost check under a budget."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_checks import one_line_error
from typer.testing import CliRunner

from dpmf.cli.main import app
from dpmf.planner import PlanResult, PlanRow
from dpmf.planning.budget import Cut
from dpmf.planning.legend import LEGEND

runner = CliRunner()
PAGE = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "plan.md"
TOY = "plan --dataset-size 300 --batch-size 100 --epochs 2 --epsilon 2 --delta 1e-6 --no-cache".split()


def _flat(text: str) -> str:
    """``text`` with rich's box characters and markdown emphasis removed and whitespace normalized."""
    return " ".join(re.sub(r"[│╭╮╰╯─*`]", " ", text).split())


def _rows() -> PlanResult:
    """Two ranked rows (one cut by the budget, one under cyclic Poisson), a pruned row and a cut
    candidate with no row."""
    rows = [
        PlanRow("banded-toeplitz-4", "cyclic-poisson", "auto", 1.3, 2.0, True, 10.0, 0.1, 1.0, rank=1),
        PlanRow("bsr-4", "balls-in-bins-fresh", "allocation_pld", 1.5, 1.9, True, 11.0, 0.11, 1.0, cut=True, rank=2),
        PlanRow("tree", "poisson", "mmcc", 9.0, 2.5, True, 12.0, 0.12, 1.0, pruned=True,
                note="epsilon >= 2.5 > 2 already at sigma 9"),
    ]
    cut = [Cut("BSR, balls-in-bins", "bsr-4", "balls-in-bins", "auto", 0, 25.0, reason="stopped by the time budget",
               by_budget=True)]
    return PlanResult(rows, cut=cut, budget=25.0, seconds=26.0)


def _stub(monkeypatch, result, first=None):
    import dpmf.planner

    def plan(run, **kw):
        if first is not None and kw.get("on_first") is not None:
            kw["on_first"](first, 1)
        return result

    monkeypatch.setattr(dpmf.planner, "plan", plan)


# ------------------------------------------------------------------------------ the legend
def test_the_legend_is_under_the_table_and_names_only_the_words_it_shows(monkeypatch):
    _stub(monkeypatch, _rows())
    res = runner.invoke(app, ["plan", "--no-cache", "--quiet"])
    assert res.exit_code == 0, res.output
    text = _flat(res.stdout)
    assert text.index("legend:") > text.index("dpmf plan:")  # under the table
    for term in ("certified", "pruned", "cut", "cyclic-poisson"):
        assert f"{term}: {LEGEND[term]}" in text, term
    assert "b-min-sep:" not in text  # not in this plan
    assert "tree / poisson (mmcc): epsilon >= 2.5" in text  # a pruned row names its accountant
    assert "4 candidates: 1 certified, 1 pruned, 2 cut by the time budget (1 with a certified noise, 1 not ranked)" in text


def test_the_legend_is_the_same_in_help_and_on_the_plan_page():
    res = runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "100"})
    assert res.exit_code == 0
    help_text, page = _flat(res.stdout), _flat(PAGE.read_text())
    for term, text in LEGEND.items():
        assert f"{term}: {text}" in help_text, term
        assert f"{term}: {text}" in page, term


# ------------------------------------------------------------------------------ JSON and progress
@pytest.fixture(scope="module")
def cut_plan():
    """The toy plan with a budget that is spent before the costly wave starts: JSON, log progress."""
    res = runner.invoke(app, TOY + ["--budget", "0.001", "--json"],
                        env={"DPMF_PROGRESS": "log", "DPMF_PROGRESS_INTERVAL": "0"})
    assert res.exit_code == 0, res.output
    return res, json.loads(res.stdout)


def test_json_rows_carry_their_rank_and_cut_entries_their_reason(cut_plan):
    _, data = cut_plan
    assert [r["rank"] for r in data["rows"]] == list(range(1, len(data["rows"]) + 1))
    assert all(r["rank"] is None for r in data["pruned"])
    assert data["cut"] and all(c["reason"] and c["by_budget"] for c in data["cut"])
    assert all("time budget" in c["reason"] for c in data["cut"])
    n = data["counts"]
    assert n["cut"] == len(data["cut"]) and n["certified"] == len(data["rows"]) and n["pruned"] == len(data["pruned"])
    assert n["candidates"] == len(data["rows"]) + len(data["pruned"]) + len(data["cut"])
    from dpmf.planning.rows import row_from_json

    row, rank = row_from_json(data["rows"][1])  # a row of --json loads, with its rank
    assert rank == row.rank == 2


def test_progress_with_cut_candidates_says_stopped_by_the_budget_not_done(cut_plan):
    res, data = cut_plan
    lines = [line for line in res.stderr.splitlines() if "plan candidates" in line]
    k = len(data["rows"]) + len(data["pruned"])
    total = k + len(data["cut"])
    assert f"stopped by the time budget, {k}/{total} candidates" in lines[-1], lines
    assert not any(": done" in line for line in lines), lines
    assert f"{len(data['cut'])} cut by the time budget" in lines[-1]
    assert "the table above" not in res.stderr  # (--json: no early table, no message about one)


def test_into_a_pipe_the_table_is_printed_once_at_the_end(monkeypatch):
    final = _rows()
    _stub(monkeypatch, final, first=[final[0]])
    res = runner.invoke(app, ["plan", "--no-cache", "--quiet"])
    assert res.exit_code == 0, res.output
    assert res.stdout.count("dpmf plan: 50000 examples") == 1 and "replaces the table above" not in res.stdout
    assert "the table above" not in res.stderr and "the table follows when they end" in res.stderr


def test_on_a_terminal_the_early_table_is_shown_and_the_final_one_labelled(monkeypatch):
    import dpmf.cli.main

    final = _rows()
    _stub(monkeypatch, final, first=[final[0]])
    monkeypatch.setattr(dpmf.cli.main, "_interactive", lambda: True)
    res = runner.invoke(app, ["plan", "--no-cache", "--quiet"])
    assert res.exit_code == 0, res.output
    first, _, rest = res.stdout.partition("the final ranking, after the costly candidates (it replaces the table above):")
    assert rest and first.count("dpmf plan: 50000") == 1 and rest.count("dpmf plan: 50000") == 1
    assert "the table above is certified" in res.stderr


# ------------------------------------------------------------------------------ refusals
def test_the_issue_plan_with_no_row_exits_2_before_any_work(monkeypatch):
    import dpmf.planner

    monkeypatch.setattr(dpmf.planner, "plan", lambda *a, **k: pytest.fail("the plan ran"))
    args = "plan --dataset-size 1000000000000 --batch-size 1 --epochs 2 --epsilon 4 --delta 1e-5 --no-mmcc".split()
    one_line_error(runner.invoke(app, args), "refusing to start", "plan fewer steps")
    one_line_error(runner.invoke(app, args + ["--export", "x.json"]), "refusing to start")


def test_a_plan_that_returns_no_row_exits_2_and_export_says_why(monkeypatch, tmp_path):
    cut = [Cut("optimal", "optimal-mf", "fixed-order", "unamplified", 0, 0.0, reason="needs about 15 GiB of memory")]
    _stub(monkeypatch, PlanResult([], cut=cut, budget=25.0))
    one_line_error(runner.invoke(app, ["plan", "--no-cache", "--quiet"]), "no row", "needs about 15 GiB")
    line = one_line_error(runner.invoke(app, ["plan", "--no-cache", "--quiet", "--export", str(tmp_path / "x.json")]),
                          "no row")
    assert "--rank" not in line
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("extra, needle", [
    (["--budget", "5", "--thorough"], "--thorough"),
    (["--budget", "-1", "--thorough"], "--budget"),
    (["--budget", "-1"], "--budget"),
    (["--budget", "0"], "--budget"),
    (["--budget", "nan"], "--budget"),
    (["--budget", "inf"], "--budget"),
    (["--budget", "5", "--scheduler", "tcp://127.0.0.1:1"], "--scheduler"),
])
def test_a_budget_with_thorough_or_a_bad_budget_is_refused_before_any_work(monkeypatch, extra, needle):
    import dpmf.planner

    monkeypatch.setattr(dpmf.planner, "plan", lambda *a, **k: pytest.fail("the plan ran"))
    one_line_error(runner.invoke(app, ["plan", "--no-cache", *extra]), "--budget", needle)


def test_the_cost_note_gives_the_full_estimate_even_with_a_small_budget(monkeypatch):
    """20,000 steps: the quick waves alone take minutes, which a small --budget does not shorten
    (the check used to cap the whole estimate at the budget and say nothing)."""
    _stub(monkeypatch, _rows())
    res = runner.invoke(app, ["plan", "--no-cache", "--quiet", "--dataset-size", "20000", "--batch-size", "1",
                              "--epochs", "1", "--budget", "1"])
    assert res.exit_code == 0, res.output
    assert "note: this will take about 3 min" in res.stderr, res.stderr


def test_the_cli_passes_its_budget_and_a_scheduler_runs_the_waves_whole(monkeypatch):
    import dpmf.planner

    seen = []
    monkeypatch.setattr(dpmf.planner, "plan", lambda run, **kw: seen.append(kw) or _rows())
    for extra in ([], ["--budget", "7"], ["--thorough"], ["--scheduler", "tcp://127.0.0.1:1"]):
        res = runner.invoke(app, ["plan", "--no-cache", "--quiet", *extra])
        assert res.exit_code == 0, res.output
    assert [(kw["budget"], kw["thorough"]) for kw in seen] == [(25.0, False), (7.0, False), (None, True), (None, True)]
    assert seen[-1]["scheduler"] == "tcp://127.0.0.1:1"


@pytest.mark.parametrize("where", ["env", "option"])
def test_a_cache_folder_name_too_long_for_the_system_is_one_line(monkeypatch, tmp_path, where):
    import dpmf.planner

    monkeypatch.setattr(dpmf.planner, "plan", lambda *a, **k: pytest.fail("the plan ran"))
    long = str(tmp_path / ("a" * 5000))
    if where == "env":
        res = runner.invoke(app, ["plan"], env={"DPMF_CACHE_DIR": long})
        line = one_line_error(res, "DPMF_CACHE_DIR", "(5,0", "unset it")
    else:
        line = one_line_error(runner.invoke(app, ["plan", "--cache-dir", long]), "--cache-dir", "characters)")
    assert len(line) < 300


def test_force_help_gives_the_limit_the_cost_check_uses():
    from dpmf.accounting.cost import DEFAULT_MAX_SECONDS

    text = _flat(runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "100"}).stdout)
    assert f"more than {DEFAULT_MAX_SECONDS / 60:g} minutes" in text and "a few minutes" not in text
