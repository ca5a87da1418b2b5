"""The JAX digits example (``examples/digits_jax.py``) runs end to end in its ``--fast`` mode: DP-SGD,
BandMF and BLT each certified at (at most) the target epsilon by ``build_run_spec``, trained through
``dpmf.training.jax.make_private``, their reports saved and accepted by ``verify_report`` (what ``dpmf
verify`` does), and every row learns (test accuracy well above the 10% of chance).

The fast mode compiles three JAX training loops and calibrates DP-SGD (about 20 s of CPU), so the
module is ``slow`` (``python -m pytest -m slow``), like the PyTorch examples' test; its fast version
in the default run is ``test_jax_training.py`` (make_private -> noise covariance, batches, report ->
verify, checkpoints)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("jax_privacy")
pytest.importorskip("optax")
pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "digits_jax.py"


def test_fast_mode_trains_certified_rows_that_learn(tmp_path):
    pytest.importorskip("sklearn")
    from dpmf.accounting.verify import verify_report

    proc = subprocess.run([sys.executable, str(EXAMPLE), "--fast", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, f"example failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads((tmp_path / "results.json").read_text())
    rows = result["summary"]
    assert [r["mechanism"].split(" (")[0].split(",")[0] for r in rows] == ["DP-SGD", "banded Toeplitz", "BLT"]
    for row in rows:
        assert row["certified_epsilon"] <= row["epsilon"] == 8.0
        assert row["mean_accuracy"] > 0.25, row
    assert "| epsilon | mechanism |" in (tmp_path / "results.md").read_text()
    reports = sorted((tmp_path / "reports").glob("*.json"))
    assert len(reports) == 3
    for path in reports:
        check = verify_report(path)
        assert check.holds and check.edited is False
        assert json.loads(path.read_text())["diagnostics"]["training"]["framework"] == "jax"
