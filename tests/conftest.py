"""Test-suite-wide fixtures."""

import os
import tracemalloc
from contextlib import contextmanager

import pytest

# The CLI's console takes its width from $COLUMNS when set (120 columns into a pipe otherwise), and
# pytest-xdist's workers inherit COLUMNS=80 / LINES=24 from execnet: the tests that read CLI output
# are written for the pipe's width, so the suite runs the same with and without workers (a test of
# a narrow terminal sets COLUMNS itself). Popped before any test imports dpmf.cli.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


@pytest.fixture(autouse=True)
def _private_plan_cache(tmp_path_factory, monkeypatch):
    """`dpmf plan` caches results on disk (~/.cache/dpmf by default): tests never read or write the
    user's cache, and every test starts from an empty one unless it sets its own."""
    monkeypatch.setenv("DPMF_CACHE_DIR", str(tmp_path_factory.mktemp("dpmf-cache")))


# No test asserts how long something took (speed is measured in benchmarks/, docs/design.md): a
# machine loaded by other jobs must not fail the suite. What "refused at once" or "bounded work"
# means is asserted as behaviour instead, with the two fixtures below.
@pytest.fixture
def evaluations(monkeypatch):
    """The accountant work done in this process, by method name: every call of a registered
    method's ``run``, ``fast_calibration`` or ``probe`` (``dpmf.account`` and ``dpmf.calibrate``
    reach the accountants only through them); ``[]`` after a refusal made before any work."""
    import dataclasses

    from dpmf.accounting import dispatch

    calls: list[str] = []

    def counted(name, fn):
        def call(*args, **kw):
            calls.append(name)
            return fn(*args, **kw)

        return call

    for name, m in list(dispatch.METHODS.items()):
        hooks = {k: counted(name, getattr(m, k)) for k in ("run", "fast_calibration", "probe") if getattr(m, k)}
        monkeypatch.setitem(dispatch.METHODS, name, dataclasses.replace(m, **hooks))
    return calls


class _Peak:
    bytes = 0


@pytest.fixture
def peak_memory():
    """``with peak_memory() as peak: ...``, then ``peak.bytes``: the most memory Python objects and
    numpy arrays held at once inside the block (tracemalloc), e.g. that a size was refused before
    its arrays were allocated."""

    @contextmanager
    def traced():
        peak = _Peak()
        was = tracemalloc.is_tracing()
        if not was:
            tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        try:
            yield peak
        finally:
            peak.bytes = tracemalloc.get_traced_memory()[1] - base
            if not was:
                tracemalloc.stop()

    return traced


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per CPU this process may run on (``sched_getaffinity``, which follows
    cpusets), at most 4 -- not psutil's count of physical cores, which is 1 on a VM with two
    hyper-threads and the whole host's in a container."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))
