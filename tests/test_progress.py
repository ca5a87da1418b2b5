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
        with progress.task("MMCC rows", total=4) as bar:
            bar.advance()
            bar.update(note="sigma=1.5")
    lines = stream.getvalue().splitlines()
    stamp = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] "
    assert all(re.match(stamp, line) for line in lines), lines
    assert "MMCC rows: started (4 units)" in lines[0]
    assert "1/4 (25.0%)" in lines[1] and "left" in lines[1]
    assert "[sigma=1.5]" in lines[2]
    assert "done" in lines[-1]


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
    import time as _time

    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    stream = io.StringIO()
    with progress.reporting("log", stream=stream, interval=10, delay=1.0):
        with progress.task("slow", total=3) as bar:
            bar.advance()  # t = 0: not shown yet
            clock[0] += 2.0
            bar.advance()  # t = 2 s: start line, and a progress line
    lines = stream.getvalue().splitlines()
    assert "slow: started (3 units)" in lines[0] and "done" in lines[-1]


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
