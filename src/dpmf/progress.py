"""Progress of long computations: one API for the library, shown by whoever runs it.

Library code that may run for more than a few seconds (calibration searches, MMCC rows, random
allocation, ``dpmf plan`` candidates, Monte Carlo chunks) wraps its loop in :func:`task`::

    from dpmf import progress

    with progress.task("MMCC rows", total=len(jobs), unit="rows") as bar:
        for job in jobs:
            ...
            bar.advance()

By default nothing is shown (a library stays quiet). The CLI -- or a user -- turns reporting on
with :func:`reporting`:

* on a terminal: a rich progress bar per task, with counts, elapsed time and time left;
* otherwise (CI logs, ``nohup``, a pipe): plain timestamped lines on stderr, at the start and end of
  each task and at most every ``interval`` seconds in between, e.g.
  ``[2026-11-23 14:03:07] MMCC rows: 120/2,046 rows (5.9%), 31 s elapsed, about 8 min left``,
  so a long run is never minutes of silence. Counts carry the task's ``unit``; the last line says
  how the task ended: ``done``, ``interrupted`` (Ctrl-C) or ``stopped by an error``.

``with dpmf.progress.reporting(): dpmf.calibrate(...)`` shows the same from Python.
"""

from __future__ import annotations

import contextvars
import os
import sys
import time
from contextlib import contextmanager
from typing import IO, Iterator, Optional

__all__ = ["Task", "task", "reporting", "active", "settings", "shown_if_long", "PROGRESS_MODES"]


def _clock(seconds: float) -> str:
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _count(x: float) -> str:
    """``1,234`` for whole counts, ``1.5`` otherwise (never ``4.3266e+07``)."""
    x = float(x)
    return f"{int(x):,}" if x.is_integer() and abs(x) < 1e18 else f"{x:.4g}"


#: how a task ended, as its last line says it
DONE, INTERRUPTED, FAILED = "done", "interrupted", "stopped by an error"


class Task:
    """One long computation: ``completed`` out of ``total`` ``unit`` (``total`` may be unknown).

    ``outcome`` is ``None`` while it runs, then ``"done"``, ``"interrupted"`` (KeyboardInterrupt)
    or ``"stopped by an error"``."""

    def __init__(self, reporter: "_Reporter", description: str, total: Optional[float], unit: str = "units") -> None:
        self._reporter = reporter
        self.description = description
        self.total = total
        self.unit = str(unit)
        self.completed = 0.0
        self.note = ""
        self.outcome: Optional[str] = None
        self.started = time.monotonic()
        self._ending: Optional[str] = None

    def end_as(self, outcome: str) -> None:
        """Say ``outcome`` instead of ``done`` if the task leaves its block normally (e.g. ``"stopped
        by the time budget"``): a task that did not do all it counted never says done."""
        self._ending = str(outcome)

    def advance(self, amount: float = 1.0) -> None:
        """``amount`` more units done."""
        self.completed += amount
        self._reporter.changed(self)

    def update(self, *, completed: Optional[float] = None, total: Optional[float] = None, note: Optional[str] = None) -> None:
        """Set the count, the total (when it becomes known) or a short note (e.g. the current sigma)."""
        if completed is not None:
            self.completed = float(completed)
        if total is not None:
            self.total = float(total)
        if note is not None:
            self.note = str(note)
        self._reporter.changed(self)

    def line(self) -> str:
        """``"MMCC rows: 120/2,046 rows (5.9%), 31 s elapsed, about 8 min left"``; once the task has
        ended, its outcome comes first: ``"MMCC rows: interrupted, 120/2,046 rows (5.9%), ..."``."""
        elapsed = time.monotonic() - self.started
        text = f"{self.description}: " + (f"{self.outcome}, " if self.outcome else "") + _count(self.completed)
        if self.total:
            frac = min(self.completed / self.total, 1.0)
            text += f"/{_count(self.total)}"
        text += f" {self.unit}" if self.unit else ""
        if self.total:
            text += f" ({100 * frac:.1f}%)"
        text += f", {_clock(elapsed)} elapsed"
        if self.outcome is None and self.total and 0 < self.completed < self.total:
            text += f", about {_clock(elapsed * (self.total - self.completed) / self.completed)} left"
        if self.note:
            text += f" [{self.note}]"
        return text


class _Reporter:
    """Shows nothing (the library default)."""

    def start(self, task: Task) -> None:
        pass

    def changed(self, task: Task) -> None:
        pass

    def finish(self, task: Task) -> None:
        pass

    def close(self) -> None:
        pass


class _LogReporter(_Reporter):
    """Timestamped plain lines: start, end, and at most every ``interval`` seconds per task.

    A task that ends within ``delay`` seconds prints nothing (quick steps and a command that fails
    at once stay silent: an error remains one line); a longer one prints its start line as soon as
    it reports after ``delay`` and its end line."""

    def __init__(self, stream: IO[str], interval: float, delay: float = 1.0) -> None:
        self.stream = stream
        self.interval = float(interval)
        self.delay = float(delay)
        self._last: dict[int, float] = {}
        self._shown: set[int] = set()

    def _write(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            self.stream.write(f"[{stamp}] {text}\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe must not break the computation
            pass

    def _show(self, task: Task) -> bool:
        """Print the start line once the task has run ``delay`` seconds; whether it is shown."""
        if id(task) not in self._shown:
            if time.monotonic() - task.started < self.delay:
                return False
            self._shown.add(id(task))
            total = f" ({' '.join(filter(None, (_count(task.total), task.unit)))})" if task.total else ""
            self._write(f"{task.description}: started{total}")
        return True

    def start(self, task: Task) -> None:
        self._last[id(task)] = time.monotonic()
        if self.delay <= 0:
            self._show(task)

    def changed(self, task: Task) -> None:
        now = time.monotonic()
        if self._show(task) and now - self._last.get(id(task), 0.0) >= self.interval:
            self._last[id(task)] = now
            self._write(task.line())

    def finish(self, task: Task) -> None:
        self._last.pop(id(task), None)
        if self._show(task):
            self._write(task.line())
        self._shown.discard(id(task))


class _RichReporter(_Reporter):
    """rich progress bars (one line per running task), on ``console``."""

    def __init__(self, console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[note]}"),
            console=console,
            transient=True,
        )
        self.progress.start()
        self._ids: dict[int, object] = {}

    def start(self, task: Task) -> None:
        self._ids[id(task)] = self.progress.add_task(task.description, total=task.total, note=task.note,
                                                     unit=task.unit)

    def changed(self, task: Task) -> None:
        tid = self._ids.get(id(task))
        if tid is not None:
            self.progress.update(tid, completed=task.completed, total=task.total, note=task.note)

    def finish(self, task: Task) -> None:
        tid = self._ids.pop(id(task), None)
        if tid is not None:
            self.progress.remove_task(tid)

    def close(self) -> None:
        self.progress.stop()


_ACTIVE: contextvars.ContextVar[_Reporter] = contextvars.ContextVar("dpmf_progress", default=_Reporter())


def active() -> bool:
    """Whether progress is being shown (so callers can skip building expensive notes)."""
    return type(_ACTIVE.get()) is not _Reporter


@contextmanager
def reporting(
    mode: str = "auto",
    *,
    stream: Optional[IO[str]] = None,
    interval: float = 10.0,
    delay: Optional[float] = None,
    console=None,
) -> Iterator[None]:
    """Show the progress of every :func:`task` run inside the block.

    ``mode``: ``"auto"`` (a rich bar when ``stream`` is a terminal, log lines otherwise),
    ``"bar"``, ``"log"`` or ``"off"``. ``stream`` defaults to ``sys.stderr``; log lines come at
    most every ``interval`` seconds per task (plus start and end), for tasks that run longer than
    ``delay`` seconds (default ``min(1, interval)``)."""
    if mode not in ("auto", "bar", "log", "off"):
        from dpmf.errors import InvalidParameterError

        raise InvalidParameterError(f"progress mode must be 'auto', 'bar', 'log' or 'off', got {mode!r}")
    stream = sys.stderr if stream is None else stream
    if mode == "auto":
        isatty = getattr(stream, "isatty", None)
        mode = "bar" if callable(isatty) and isatty() else "log"
    if mode == "off":
        reporter: _Reporter = _Reporter()
    elif mode == "log":
        reporter = _LogReporter(stream, interval, min(1.0, interval) if delay is None else delay)
    else:
        if console is None:
            from rich.console import Console

            console = Console(file=stream)
        reporter = _RichReporter(console)
    token = _ACTIVE.set(reporter)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
        reporter.close()


@contextmanager
def task(description: str, total: Optional[float] = None, *, unit: str = "units") -> Iterator[Task]:
    """A long computation whose progress the active reporter shows (nothing by default).

    ``unit`` names what is counted (``"rows"``, ``"evaluations"``, ``"samples"`` ...): every count
    is shown with it. The task's last line says how it ended: ``done``, ``interrupted`` (Ctrl-C:
    a KeyboardInterrupt left the block) or ``stopped by an error`` (any other exception)."""
    reporter = _ACTIVE.get()
    t = Task(reporter, description, None if total is None else float(total), unit)
    reporter.start(t)
    try:
        yield t
    except KeyboardInterrupt:
        t.outcome = INTERRUPTED
        raise
    except BaseException:
        t.outcome = FAILED
        raise
    else:
        t.outcome = t._ending or DONE
    finally:
        reporter.finish(t)


#: The values ``DPMF_PROGRESS`` takes (empty or unset: ``auto``).
PROGRESS_MODES = ("auto", "bar", "log", "off")


def settings() -> tuple[str, float]:
    """``(mode, interval)`` from the environment: ``DPMF_PROGRESS`` (one of :data:`PROGRESS_MODES`,
    any case; default ``auto``) and ``DPMF_PROGRESS_INTERVAL`` (seconds >= 0; default 10). A value
    outside these is refused (an :class:`~dpmf.errors.InvalidParameterError` naming the variable
    and the valid values), never silently replaced by the default: a typo such as
    ``DPMF_PROGRESS=of`` would otherwise print progress in a job that asked for none. Checked
    when a command starts (and before a calibration :func:`shown_if_long` shows), before any work,
    so fixing it costs nothing."""
    from dpmf.errors import InvalidParameterError

    raw = os.environ.get("DPMF_PROGRESS", "")
    mode = raw.strip().lower() or "auto"
    if mode not in PROGRESS_MODES:
        raise InvalidParameterError(
            f"environment variable DPMF_PROGRESS={raw!r} is not valid: use one of {', '.join(PROGRESS_MODES)} "
            "(or unset it)"
        )
    raw = os.environ.get("DPMF_PROGRESS_INTERVAL", "")
    try:
        interval = float(raw) if raw.strip() else 10.0
    except ValueError:
        interval = float("nan")
    if not interval >= 0:  # NaN fails too (inf: no line between a task's first and last)
        raise InvalidParameterError(
            f"environment variable DPMF_PROGRESS_INTERVAL={raw!r} is not valid: use a number of seconds >= 0 "
            "(default 10; 0 prints every update), or unset it"
        )
    return mode, interval


@contextmanager
def shown_if_long(what: str, seconds: float, *, threshold: float = 5.0, stream: Optional[IO[str]] = None) -> Iterator[None]:
    """Show the progress of work a library call does on its own (``make_private``'s calibration)
    when its rough estimate is ``seconds >= threshold``: one line on ``stream`` (default
    ``sys.stderr``, which a terminal and a notebook both show) saying what runs and for about how
    long, then the block runs under :func:`reporting` as ``DPMF_PROGRESS`` / ``DPMF_PROGRESS_INTERVAL``
    say (:func:`settings`; ``auto``: a bar on a terminal, log lines otherwise, e.g. in a notebook).
    Nothing changes when progress is already shown (the caller's :func:`reporting` block), under
    ``DPMF_PROGRESS=off``, or for shorter work: a library stays quiet unless the wait would look
    like a hang."""
    if active() or not seconds >= threshold:
        yield
        return
    mode, interval = settings()
    if mode == "off":
        yield
        return
    from dpmf.resources import format_seconds

    stream = sys.stderr if stream is None else stream
    try:
        stream.write(f"dpmf: {what}: about {format_seconds(seconds)} by a rough estimate; progress below "
                     "(DPMF_PROGRESS=off silences it)\n")
        stream.flush()
    except (OSError, ValueError):  # a closed stream must not stop the work
        pass
    with reporting(mode, stream=stream, interval=interval):
        yield
