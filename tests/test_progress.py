"""dpmf.progress: silent by default, timestamped lines off-terminal, a bar on a terminal."""

import io
import re

import pytest

from dpmf import progress
from dpmf.errors import InvalidParameterError


def test_silent_by_default(capsys):
    with progress.task("work", total=3) as bar:
        for _ in range(3):
            bar.advance()
    assert capsys.readouterr() == ("", "")
    assert not progress.active()


def test_off_terminal_lines_are_timestamped_with_counts_and_time_left():
    stream = io.StringIO()  # not a terminal
    with progress.reporting(stream=stream, interval=0.0):
        assert progress.active()
        with progress.task("MMCC rows", total=4, unit="rows") as bar:
            bar.advance()
            bar.update(note="sigma=1.5")
    lines = stream.getvalue().splitlines()
    stamp = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] "
    assert all(re.match(stamp, line) for line in lines), lines
    assert "MMCC rows: started (4 rows)" in lines[0]
    assert "1/4 rows (25.0%)" in lines[1] and "left" in lines[1]
    assert "[sigma=1.5]" in lines[2]
    assert "MMCC rows: done, 1/4 rows (25.0%)" in lines[-1] and "left" not in lines[-1]


def test_interval_throttles_lines():
    stream = io.StringIO()
    with progress.reporting("log", stream=stream, interval=3600, delay=0):
        with progress.task("loop", total=1000) as bar:
            for _ in range(1000):
                bar.advance()
    assert len(stream.getvalue().splitlines()) == 2  # start and end only


def test_bar_mode_renders_and_cleans_up():
    from rich.console import Console

    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=100)
    with progress.reporting("bar", console=console):
        with progress.task("calibration", total=2) as bar:
            bar.advance(2)
    assert not progress.active()


def test_bad_mode_is_a_dpmf_error():
    with pytest.raises(InvalidParameterError, match="progress mode"):
        with progress.reporting("loud"):
            pass


def test_quick_tasks_print_nothing_so_an_error_stays_one_line():
    stream = io.StringIO()
    with progress.reporting("log", stream=stream, interval=10, delay=0.5):
        with progress.task("quick", total=2) as bar:
            bar.advance(2)
    assert stream.getvalue() == ""


def test_a_task_past_the_delay_prints_its_start_and_end(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    stream = io.StringIO()
    with progress.reporting("log", stream=stream, interval=10, delay=1.0):
        with progress.task("slow", total=3) as bar:
            bar.advance()  # t = 0: not shown yet
            clock[0] += 2.0
            bar.advance()  # t = 2 s: start line, and a progress line
    lines = stream.getvalue().splitlines()
    assert "slow: started (3 units)" in lines[0] and "slow: done, 2/3 units" in lines[-1]


def _log(work, unit="evaluations", total=None):
    """The log lines of one task running ``work(bar)`` (shown at once: delay 0)."""
    stream = io.StringIO()
    with progress.reporting("log", stream=stream, interval=0.0, delay=0.0):
        with progress.task("calibrating noise (pld)", total=total, unit=unit) as bar:
            work(bar)
    return stream.getvalue().splitlines()


def test_an_interrupted_task_says_interrupted_not_done():
    def work(bar):
        bar.advance(3)
        raise KeyboardInterrupt

    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        with progress.reporting("log", stream=stream, interval=0.0, delay=0.0):
            with progress.task("plan candidates (500 steps)", total=18, unit="candidates") as bar:
                work(bar)
    last = stream.getvalue().splitlines()[-1]
    assert "plan candidates (500 steps): interrupted, 3/18 candidates (16.7%)" in last, last
    assert "done" not in last and "left" not in last


def test_a_task_stopped_by_an_error_says_so():
    stream = io.StringIO()
    with pytest.raises(ValueError):
        with progress.reporting("log", stream=stream, interval=0.0, delay=0.0):
            with progress.task("MMCC rows", total=10, unit="rows") as bar:
                bar.advance(2)
                raise ValueError("boom")
    last = stream.getvalue().splitlines()[-1]
    assert "MMCC rows: stopped by an error, 2/10 rows" in last and "done" not in last


def test_a_task_that_did_not_do_all_it_counted_ends_as_it_says_not_done():
    stream = io.StringIO()
    with progress.reporting("log", stream=stream, interval=0.0, delay=0.0):
        with progress.task("plan candidates (20 steps)", total=3, unit="candidates") as bar:
            bar.advance(2)
            bar.end_as("stopped by the time budget")
    last = stream.getvalue().splitlines()[-1]
    assert "plan candidates (20 steps): stopped by the time budget, 2/3 candidates" in last and "done" not in last
    with pytest.raises(ValueError):  # an error still says so
        with progress.reporting("log", stream=stream, interval=0.0, delay=0.0):
            with progress.task("plan candidates (20 steps)", total=3, unit="candidates") as bar:
                bar.end_as("stopped by the time budget")
                raise ValueError("boom")
    assert "stopped by an error" in stream.getvalue().splitlines()[-1]


def test_counts_carry_their_unit_and_are_written_whole():
    lines = _log(lambda bar: bar.advance(10))
    assert "calibrating noise (pld): done, 10 evaluations," in lines[-1], lines
    lines = _log(lambda bar: bar.advance(43_266_000), unit="program terms", total=43_266_000)
    assert "started (43,266,000 program terms)" in lines[0]
    assert "done, 43,266,000/43,266,000 program terms (100.0%)" in lines[-1]
    assert "e+07" not in "".join(lines)


def test_every_progress_task_in_dpmf_names_its_unit():
    """Each ``progress.task(...)`` call in the package passes ``unit=`` (so its counts carry it)."""
    import ast
    from pathlib import Path

    import dpmf

    root = Path(dpmf.__file__).parent
    calls = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "task":
                if isinstance(node.func.value, ast.Name) and node.func.value.id in ("progress", "_progress"):
                    calls.append((path.relative_to(root).as_posix(), node.lineno,
                                  any(k.arg == "unit" for k in node.keywords)))
    assert len(calls) >= 7, calls
    assert all(has_unit for *_, has_unit in calls), [c for c in calls if not c[2]]


def _lines_of(work) -> str:
    stream = io.StringIO()
    with progress.reporting("log", stream=stream, interval=0.0, delay=0.0):
        work()
    return stream.getvalue()


def test_every_long_accountant_computation_reports_off_terminal():
    """Each long computation opens a task (shown off-terminal as timestamped lines)."""
    import numpy as np

    import dpmf
    from dpmf.accounting.allocation.conditional import conditional_epsilon
    from dpmf.accounting.allocation.renyi import RenyiAllocation
    from dpmf.strategies import Identity, bsr

    gram = np.eye(6) + 0.3 * (np.eye(6, k=1) + np.eye(6, k=-1))
    assert "Renyi program" in _lines_of(lambda: RenyiAllocation.create(gram).remove(2.0))
    means = np.tri(6, 6).T[:, :6] * 0.5
    assert "conditional composition" in _lines_of(lambda: conditional_epsilon(means, 2.0, 1e-5))
    scheme = dpmf.sampling.PoissonSampling(0.1, 16)
    assert "MMCC" in _lines_of(lambda: dpmf.account(bsr(16, 2), scheme, 1.0, 1e-5, method="mmcc"))
    assert "calibrating noise" in _lines_of(lambda: dpmf.calibrate(Identity(16), scheme, 4.0, 1e-5, method="pld"))


# ------------------------------------------ work a library call does on its own (issue 53 item 1)
def _long_work(stream, seconds, threshold=5.0):
    with progress.shown_if_long("calibrating", seconds, threshold=threshold, stream=stream):
        with progress.task("search", total=2, unit="evaluations") as bar:
            bar.advance()
            bar.advance()


def test_long_work_says_its_estimate_then_shows_its_progress(monkeypatch):
    monkeypatch.setenv("DPMF_PROGRESS", "log")
    monkeypatch.setenv("DPMF_PROGRESS_INTERVAL", "0")
    stream = io.StringIO()
    _long_work(stream, 90.0)
    lines = stream.getvalue().splitlines()
    assert lines[0] == ("dpmf: calibrating: about 90 s by a rough estimate; progress below "
                        "(DPMF_PROGRESS=off silences it)")
    assert "search: started (2 evaluations)" in lines[1] and "search: done, 2/2 evaluations" in lines[-1]
    assert not progress.active()  # (the reporter is the block's only)


@pytest.mark.parametrize("case", ["short", "off", "already shown"])
def test_long_work_stays_quiet_when_short_silenced_or_already_shown(monkeypatch, case):
    monkeypatch.setenv("DPMF_PROGRESS", "off" if case == "off" else "log")
    monkeypatch.setenv("DPMF_PROGRESS_INTERVAL", "0")
    stream, outer = io.StringIO(), io.StringIO()
    if case == "already shown":
        with progress.reporting("log", stream=outer, interval=0.0):
            _long_work(stream, 90.0)
        assert "search: done" in outer.getvalue()  # the caller's reporter showed it, once
    else:
        _long_work(stream, 4.9 if case == "short" else 90.0)
    assert stream.getvalue() == ""


def test_long_work_refuses_a_bad_progress_setting(monkeypatch):
    monkeypatch.setenv("DPMF_PROGRESS", "of")
    with pytest.raises(InvalidParameterError, match="DPMF_PROGRESS='of' is not valid"):
        _long_work(io.StringIO(), 90.0)
