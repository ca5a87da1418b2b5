"""The digits example (``examples/digits_correlated_noise.py``) runs end to end in its ``--fast`` mode:
every mechanism is calibrated through ``make_private``, certified by the accountant its sampler
calls for, trained, and written to ``results.json`` / ``results.md`` / ``accuracy_vs_epsilon.png``;
DP-SGD learns (test accuracy well above the 10% of chance)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "digits_correlated_noise.py"

# the accountant each row must be certified by (the sampler decides it; see the example's docstring)
METHODS = {
    "dpsgd": "pld",
    "bandmf-cyc": "mmcc",
    "bandmf-bib": "allocation",
    "blt-bib": "allocation",
    "tree": "mmcc",
    "optimal": "unamplified",
}


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits_fast")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--fast", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"example failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return out, proc.stdout


def test_fast_mode_writes_the_three_outputs(fast_run):
    out, stdout = fast_run
    for name in ("results.json", "results.md", "accuracy_vs_epsilon.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "accuracy_vs_epsilon.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "results.md").read_text()
    assert "| mechanism | eps = 4 |" in md
    assert "DP-SGD" in md and "BandMF" in md and "BLT" in md and "tree" in md and "Optimal" in md
    assert "| mechanism | eps = 4 |" in stdout


def test_fast_mode_accuracies_and_certified_epsilons(fast_run):
    out, _ = fast_run
    res = json.loads((out / "results.json").read_text())
    cfg = res["config"]
    assert cfg["fast"] is True and cfg["epsilons"] == [4.0] and cfg["steps"] == cfg["epochs"] * cfg["steps_per_epoch"]
    rows = {r["mechanism"]: r for r in res["summary"]}
    assert set(rows) == set(METHODS) | {"non-private"}
    for row in res["summary"]:
        assert 0.0 <= row["mean_accuracy"] <= 1.0
        assert all(0.0 <= a <= 1.0 for a in row["accuracies"])
    for run in res["runs"]:
        assert 0.0 <= run["accuracy"] <= 1.0
        if run["mechanism"] == "non-private":
            continue
        # every private run was certified at (at most) its target by the accountant its sampler needs
        assert run["certified_epsilon"] <= run["epsilon"] * (1 + 1e-9)
        assert run["method"] == METHODS[run["mechanism"]], run
        assert run["noise_multiplier"] > 0
    # better than chance (10 classes): DP-SGD learns at epsilon 4 even in 24 steps
    assert rows["dpsgd"]["mean_accuracy"] > 0.2
    assert rows["non-private"]["mean_accuracy"] > 0.8
