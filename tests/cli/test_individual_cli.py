"""``dpmf individual steps|report``."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from dpmf.accounting.individual import IndividualGDPLedger
from dpmf.cli.main import app

runner = CliRunner()


def test_steps_paper_numbers_json():
    res = runner.invoke(app, ["individual", "steps", "--noise-multiplier", "100", "--epsilon", "0.81563",
                              "--delta", "1e-5", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["gdp_steps"] == 495 and data["rdp_steps"] == 420


def test_steps_text_and_bad_input():
    res = runner.invoke(app, ["individual", "steps", "--noise-multiplier", "100", "--epsilon", "0.81563", "--delta", "1e-5"])
    assert res.exit_code == 0 and "495" in res.stdout and "420" in res.stdout
    bad = runner.invoke(app, ["individual", "steps", "--noise-multiplier", "-2", "--epsilon", "1", "--delta", "1e-5"])
    assert bad.exit_code != 0
    assert "--noise-multiplier" in bad.output and "Traceback" not in bad.output


def _ledger(tmp_path):
    led = IndividualGDPLedger(200, 0.5, noise_multiplier=5.0)
    rng = np.random.default_rng(1)
    for _ in range(8):
        led.step(np.minimum(rng.exponential(0.15, 200), 0.2))
    path = tmp_path / "ledger.npz"
    led.save(path)
    return led, path


def test_report_json_and_plot(tmp_path):
    led, path = _ledger(tmp_path)
    png = tmp_path / "eps.png"
    res = runner.invoke(app, ["individual", "report", str(path), "--json", "--plot", str(png), "--delta", "1e-5"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    eps = led.individual_epsilon(1e-5)
    assert data["max_epsilon"] == float(eps.max())
    assert data["num_examples"] == 200 and data["steps"] == 8
    assert data["exhausted"] == int(led.exhausted().sum())
    assert png.stat().st_size > 1000


def test_report_refuses_other_run_and_garbage(tmp_path):
    _, path = _ledger(tmp_path)
    res = runner.invoke(app, ["individual", "report", str(path), "--run-id", "not-this-one"])
    assert res.exit_code != 0 and "belongs to run" in res.output and "Traceback" not in res.output
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a ledger")
    res = runner.invoke(app, ["individual", "report", str(junk)])
    assert res.exit_code != 0 and "not a dpmf GDP ledger" in res.output
