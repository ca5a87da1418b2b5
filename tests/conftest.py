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
