"""Test-suite-wide fixtures."""

import os

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


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per CPU this process may run on (``sched_getaffinity``, which follows
    cpusets), at most 4 -- not psutil's count of physical cores, which is 1 on a VM with two
    hyper-threads and the whole host's in a container."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))
