"""What a person sees (issue 24, item 10): the `dpmf plan` table at any width (every value whole,
one line per row when the terminal allows), its footer, progress lines that say how a task ended,
the Ctrl-C hint only where a run can resume, and help texts wrapped at the terminal's width."""

from __future__ import annotations

import io
import re

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from dpmf.cli.main import app, plan_table
from dpmf.planner import PlanRow, TrainingRun

runner = CliRunner()


def _rows(estimate: bool = True) -> list[PlanRow]:
    """The default plan's rows (12 ranked, 6 pruned), with its longest names, a 5-digit sigma, a
    tiny and a large number, and (``estimate``) a Monte Carlo row."""
    ranked = [
        ("banded-toeplitz-16", "cyclic-poisson", "mmcc", 2.36956, 1.9999993, 11.141, 0.0222821),
        ("banded-toeplitz-4", "cyclic-poisson", "mmcc", 1.35878, 1.99999999, 12.0795, 0.024159),
        ("banded-toeplitz-64", "cyclic-poisson", "mmcc", 4.2757, 1.99999937, 14.0363, 0.0280726),
        ("identity", "poisson", "pld", 0.913263, 1.99995, 14.4544, 0.0289088),
        ("banded-toeplitz-100", "fixed-order", "unamplified", 4.98750, 2.0, 15.4988, 0.0309976),
        ("blt-2", "fixed-order", "unamplified", 8.87770, 2.0, 15.9743, 0.0319486),
        ("banded-toeplitz-64", "fixed-order", "unamplified", 4.98750, 2.0, 16.373, 0.032746),
        ("sqrt-toeplitz", "fixed-order", "unamplified", 11.3312, 2.0, 18.7143, 0.0374285),
        ("tree", "fixed-order", "unamplified", 19.95, 2.0, 21.3622, 0.0427244),
        ("banded-toeplitz-16", "fixed-order", "unamplified", 4.98750, 2.0, 23.4499, 0.0468998),
        ("optimal-mf", "fixed-order", "unamplified", 12345.678, 2.0, 1444.25, 0.0285),
        ("identity", "fixed-order", "unamplified", 4.98750, 2.0, 78.9381, 0.157876),
    ]
    rows = [PlanRow(s, q, m, sig, eps, True, rmse, per, 1.0) for s, q, m, sig, eps, rmse, per in ranked]
    if estimate:
        rows.insert(4, PlanRow("banded-toeplitz-64", "b-min-sep", "montecarlo", 0.0001234, 1.98765, False, 14.45,
                               2.89e-5, 1.0))
    for s, q, m, sig, rmse in [
        ("banded-toeplitz-4", "poisson", "mmcc", 1.25321, 11.141),
        ("tree", "poisson", "mmcc", 10.4045, 11.141),
        ("bsr-4", "balls-in-bins", "auto", 1.52886, 11.141),
        ("identity", "balls-in-bins", "allocation_pld", 0.979252, 15.4988),
    ]:
        rows.append(PlanRow(s, q, m, sig, 5.0, True, rmse, rmse / 500, 1.0, pruned=True))
    return rows


def _render(rows, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(plan_table(TrainingRun(), rows))
    return console.export_text().splitlines()


def _tokens(row: PlanRow, rank: int | None) -> list[str]:
    """What must appear whole for a row: its rank, names and numbers as the table formats them."""
    if row.pruned:
        numbers = [f">{row.noise_multiplier:.3g}", f">{row.prefix_sum_rmse:.3g}", f">{row.rmse_per_example_in_batch:.3g}"]
        return [row.strategy, row.sampling, row.method, "pruned", *numbers]
    numbers = [f"{v:.4g}" for v in (row.noise_multiplier, row.epsilon, row.prefix_sum_rmse, row.rmse_per_example_in_batch)]
    names = ([] if rank is None else [str(rank)]) + [row.strategy, row.sampling, row.method]
    return names + numbers + ([] if row.certified else ["ESTIMATE"])


def _whole(token: str, text: str) -> bool:
    """``token`` appears in ``text`` not as part of a longer word or number (``2`` is not in ``2.37``)."""
    return re.search(rf"(?<![\w.>/-]){re.escape(token)}(?![\w.-])", text) is not None


def _row_blocks(lines: list[str], rows) -> list[list[str]]:
    """For each row in order, the lines that show it: from the line naming it up to the next row."""
    starts, i = [], 0
    for row in rows:
        while not _whole(row.strategy, lines[i]):
            i += 1
        starts.append(i)
        i += 1
    ends = starts[1:] + [len(lines)]
    return [[line for line in lines[a:b] if line.strip()] for a, b in zip(starts, ends)]


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120, 200])
@pytest.mark.parametrize("estimate", [True, False])
def test_plan_table_shows_every_value_whole_at_any_width(width, estimate):
    rows = _rows(estimate)
    lines = _render(rows, width)
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= width, text
    assert "…" not in text  # (the ellipsis rich puts where it cuts a value)
    rank = 0
    blocks = _row_blocks(lines, rows)
    for row, block in zip(rows, blocks):
        rank += not row.pruned
        for token in _tokens(row, None if row.pruned else rank):
            assert any(_whole(token, line) for line in block), (width, token, block)
    # a row on one line when it fits (120 columns and wider), two lines at 80, a compact list below
    longest = max(len(block) for block in blocks)
    if width >= 120:
        assert longest == 1, text
        assert all(_whole(t, block[0]) for r, block in zip(rows, blocks) for t in _tokens(r, None)), text
    elif width >= 80:
        assert longest == 2, text
    else:
        assert longest <= 5 and "sigma 2.37" in text, text


def test_plan_table_ranks_stay_whole_with_more_than_nine_rows():
    lines = _render(_rows(), 80)
    ranked = [line.split()[0] for line in lines if re.match(r"^\s*\d+\s+\S", line)]
    assert ranked == [str(k) for k in range(1, 14)], ranked


def _plan_cli(monkeypatch, rows, width=80, env=None):
    import dpmf.cli.console
    import dpmf.planner

    monkeypatch.setattr(dpmf.planner, "plan", lambda run, **kw: rows)
    monkeypatch.setattr(dpmf.cli.console.out, "_width", width)
    res = runner.invoke(app, ["plan", "--no-cache", "--quiet"], env=env)
    assert res.exit_code == 0, res.output
    return res.stdout


def test_plan_footer_says_estimate_only_when_a_row_is_an_estimate(monkeypatch):
    with_estimate = _plan_cli(monkeypatch, _rows(estimate=True))
    assert "ESTIMATE: Monte Carlo, not a proof." in " ".join(with_estimate.split())
    proven = _plan_cli(monkeypatch, _rows(estimate=False))
    assert "ESTIMATE" not in proven, proven
    assert "prefix RMSE: root-mean-square noise" in proven
    # a pruned row is never an estimate, and is not counted as one
    pruned_only = [r for r in _rows(estimate=False)]
    assert "ESTIMATE" not in _plan_cli(monkeypatch, pruned_only, width=60)


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_plan_command_output_fits_and_keeps_numbers_whole(monkeypatch, width):
    rows = _rows()
    text = _plan_cli(monkeypatch, rows, width=width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text
    for value in ("0.1579", "1.235e+04", "0.0001234", "allocation_pld", "banded-toeplitz-100", "13"):
        assert _whole(value, text), (value, text)


# ------------------------------------------------------------------------ progress and Ctrl-C
def test_an_interrupted_plan_says_interrupted_with_the_unit_not_done(monkeypatch):
    import dpmf.planner
    from dpmf import progress

    def plan(run, **kw):
        with progress.task("plan candidates (500 steps)", total=18, unit="candidates") as bar:
            bar.advance(2)
            raise KeyboardInterrupt

    monkeypatch.setattr(dpmf.planner, "plan", plan)
    res = runner.invoke(app, ["plan", "--no-cache"], env={"DPMF_PROGRESS": "log", "DPMF_PROGRESS_INTERVAL": "0"})
    assert res.exit_code == 130, res.output
    lines = res.stderr.splitlines()
    assert any("plan candidates (500 steps): interrupted, 2/18 candidates (11.1%)" in line for line in lines), lines
    assert not any(": done" in line for line in lines), lines
    assert lines[-1] == "interrupted"  # --no-cache: nothing saved, so no resume hint


_ACCOUNT = ["account", "--sampling-prob", "0.02", "--steps", "64", "--noise-multiplier", "10", "--delta", "1e-6"]


@pytest.mark.parametrize(
    "extra,hint",
    [
        ([], None),  # identity under Poisson: pld (exact), no MMCC run, nothing to resume
        (["--method", "pld"], None),
        (["--strategy", "bsr", "--bands", "4", "--sampling", "balls-in-bins", "--epochs", "1"], None),
        (["--strategy", "tree"], "add --cache-dir DIR to make an MMCC run resumable"),
        (["--strategy", "tree", "--method", "mmcc"], "add --cache-dir DIR to make an MMCC run resumable"),
    ],
)
def test_the_cache_dir_hint_after_ctrl_c_appears_only_where_a_run_can_resume(monkeypatch, extra, hint):
    import dpmf.accounting

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dpmf.accounting, "account", interrupted)
    args = [a for a in _ACCOUNT if not (extra and "--sampling" in extra and a in ("--sampling-prob", "0.02"))]
    res = runner.invoke(app, [*args, *extra])
    assert res.exit_code == 130, res.output
    last = res.stderr.strip().splitlines()[-1]
    if hint is None:
        assert last == "interrupted" and "--cache-dir" not in res.stderr, res.stderr
    else:
        assert hint in last


# ------------------------------------------------------------------------------------ help
def _command_paths() -> list[list[str]]:
    root = typer.main.get_command(app)

    def walk(cmd, path):
        yield path
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, [*path, name])

    return list(walk(root, []))


def _command(path):
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def _description(output: str) -> list[list[str]]:
    """The paragraphs of a help screen's description (between the usage line and the options)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith(("╭", "Options:", "Arguments:")))
    paragraphs, current = [], []
    for line in lines[start:end]:
        if line.strip():
            current.append(line.rstrip())
        elif current:
            paragraphs.append(current)
            current = []
    return paragraphs + ([current] if current else [])


@pytest.mark.parametrize("width", [60, 80, 120])
@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p) or "dpmf")
def test_help_wraps_sentences_at_the_terminal_width_and_cuts_nothing(path, width):
    res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(width)})
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert max(len(line) for line in out.splitlines()) <= width
    assert "…" not in out, out  # no option name or value cut
    paragraphs = _description(out)
    for para in paragraphs:  # each line is full: the next word would not have fit (no hard breaks)
        for line, nxt in zip(para, para[1:]):
            assert len(line) + 1 + len(nxt.split()[0]) > width - 4, (path, width, line, nxt)
    shown = " ".join(" ".join(p) for p in paragraphs).split()
    cmd = _command(path)
    for para in (cmd.help or "").split("\n\n"):  # the whole docstring is there, word for word
        words = para.split()
        assert any(shown[i : i + len(words)] == words for i in range(len(shown))), (para, shown)
    for param in cmd.params:
        for opt in [*param.opts, *param.secondary_opts]:
            if opt.startswith("-"):
                assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", out), (opt, out)


def test_hard_wrapped_docstrings_are_reflowed_and_backslash_b_paragraphs_kept():
    from dpmf.cli.console import reflow_help

    doc = """First line of the summary
    goes on here.

    A second paragraph, hard-wrapped
    by the editor at some column.

    \b
    $ dpmf plan
    $ dpmf plan --no-mmcc
    """
    assert reflow_help(doc) == (
        "First line of the summary goes on here.\n\nA second paragraph, hard-wrapped by the editor at some column."
        "\n\n\b\n$ dpmf plan\n$ dpmf plan --no-mmcc"
    )
    assert reflow_help(None) is None


def test_long_choice_lists_show_a_short_value_name_and_list_the_choices():
    res = runner.invoke(app, ["account", "--help"], env={"COLUMNS": "80"})
    assert "<name>" in res.stdout and "<poisson|" not in res.stdout
    res = runner.invoke(app, ["montecarlo", "run", "--help"], env={"COLUMNS": "120"})
    text = " ".join(res.stdout.replace("│", " ").split())
    assert "balls-in-bins" in text and "b-min-sep" in text
