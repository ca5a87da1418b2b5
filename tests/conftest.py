"""Test-suite-wide fixtures."""

import pytest


@pytest.fixture(autouse=True)
def _private_plan_cache(tmp_path_factory, monkeypatch):
    """`dpmf plan` caches results on disk (~/.cache/dpmf by default): tests never read or write the
    user's cache, and every test starts from an empty one unless it sets its own."""
    monkeypatch.setenv("DPMF_CACHE_DIR", str(tmp_path_factory.mktemp("dpmf-cache")))
