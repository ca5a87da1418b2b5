"""``dpmf strategy build|show`` and ``dpmf account --strategy``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dpmf.cli.main import app
from dpmf.privacy import gaussian_epsilon

runner = CliRunner()


def test_build_show_account(tmp_path):
    path = tmp_path / "opt.npz"
    res = runner.invoke(app, ["strategy", "build", "optimal", "--steps", "64", "--epochs", "2", "--out", str(path)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["strategy", "show", str(path), "--participation", "fixed-epoch", "--epochs", "2", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["sensitivity"] == pytest.approx(1.0, abs=1e-9)
    assert {"sensitivity", "rmse", "max_error"} <= set(data)
    res = runner.invoke(app, ["account", "--strategy", str(path), "--sampling", "fixed-order", "--epochs", "2",
                              "--steps", "64", "--noise-multiplier", "2", "--delta", "1e-6", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["epsilon"] == pytest.approx(gaussian_epsilon(2.0, 1e-6, 1.0), rel=1e-9)


def test_bad_strategy_inputs(tmp_path):
    res = runner.invoke(app, ["strategy", "build", "bogus", "--steps", "4", "--out", str(tmp_path / "x.npz")])
    assert res.exit_code != 0 and "kind must be one of" in res.output
    res = runner.invoke(app, ["strategy", "show", str(tmp_path / "missing.npz")])
    assert res.exit_code != 0 and "not a dpmf strategy file" in res.output
    res = runner.invoke(app, ["account", "--strategy", "bogus", "--sampling", "fixed-order", "--epochs", "1",
                              "--steps", "4", "--noise-multiplier", "1", "--delta", "1e-6"])
    assert res.exit_code != 0 and "Traceback" not in res.output
