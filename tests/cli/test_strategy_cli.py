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
    assert res.exit_code != 0 and "cannot read the dpmf strategy file (no such file)" in res.output
    res = runner.invoke(app, ["account", "--strategy", "bogus", "--sampling", "fixed-order", "--epochs", "1",
                              "--steps", "4", "--noise-multiplier", "1", "--delta", "1e-6"])
    assert res.exit_code != 0 and "Traceback" not in res.output


def test_momentum_workload_reproduces_table6(tmp_path):
    """Table 6 (n=6, k=3, b=2), momentum 0.95: the Eq. (35) optimum's Error is 16.134 (notes §9)."""
    path = tmp_path / "mom.npz"
    res = runner.invoke(app, ["strategy", "build", "optimal", "--steps", "6", "--epochs", "3", "--momentum", "0.95",
                              "--out", str(path)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["strategy", "show", str(path), "--participation", "fixed-epoch", "--epochs", "3", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["sensitivity"] == pytest.approx(1.0, abs=1e-9)
    assert data["workload"] == {"kind": "momentum", "momentum": 0.95, "learning_rates": None}
    assert data["workload_total_error"] == pytest.approx(16.134, abs=6e-4)
    # the prefix-sum numbers are still reported, and are smaller than the momentum ones
    assert data["rmse"] < data["workload_rmse"]
    res = runner.invoke(app, ["strategy", "show", str(path), "--participation", "fixed-epoch", "--epochs", "3"])
    assert res.exit_code == 0 and "workload total error" in res.output


def test_single_epoch_fixed_point_and_learning_rates(tmp_path):
    lr = tmp_path / "lr.npy"
    import numpy as np

    np.save(lr, np.linspace(1.0, 0.1, 16))
    for extra in (["--learning-rates", str(lr)], ["--learning-rates", ",".join(["1"] * 12 + ["0.5"] * 4)],
                  ["--cooldown", "4", "--momentum", "0.9"]):
        path = tmp_path / "fp.npz"
        res = runner.invoke(app, ["strategy", "build", "optimal", "--steps", "16", "--solver", "fixed-point",
                                  *extra, "--out", str(path)])
        assert res.exit_code == 0, res.output
        res = runner.invoke(app, ["strategy", "show", str(path), "--json"])
        data = json.loads(res.stdout)
        assert data["sensitivity"] == pytest.approx(1.0, abs=1e-9)
        assert data["workload"]["kind"] == "momentum" and len(data["workload"]["learning_rates"]) == 16


@pytest.mark.parametrize(
    "args, match",
    [
        (["optimal", "--steps", "4", "--learning-rates", "1,0,1,1"], "--learning-rates"),
        (["optimal", "--steps", "4", "--learning-rates", "1,x"], "comma-separated"),
        (["optimal", "--steps", "4", "--learning-rates", "1,1,1,1", "--cooldown", "2"], "not both"),
        (["optimal", "--steps", "4", "--momentum", "1.5"], "momentum"),
        (["optimal", "--steps", "4", "--epochs", "2", "--solver", "fixed-point"], "epochs=1"),
        (["optimal", "--steps", "6", "--epochs", "4"], "epochs must divide"),
        (["bsr", "--steps", "8", "--bands", "9"], "bands"),
        (["banded", "--steps", "8", "--bands", "0"], "bands"),
        (["matrix", "--steps", "4", "--matrix", "missing.npy"], "cannot read"),
    ],
)
def test_bad_build_options(tmp_path, args, match):
    res = runner.invoke(app, ["strategy", "build", *args, "--out", str(tmp_path / "x.npz")])
    assert res.exit_code != 0
    assert match in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("kind", ["identity", "tree", "sqrt-toeplitz", "banded-toeplitz", "banded", "bsr", "bisr",
                                  "blt", "optimal", "fft"])
def test_every_kind_builds_and_shows(tmp_path, kind):
    path = tmp_path / f"{kind}.npz"
    res = runner.invoke(app, ["strategy", "build", kind, "--steps", "16", "--epochs", "2", "--bands", "4",
                              "--out", str(path)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["strategy", "show", str(path), "--participation", "fixed-epoch", "--epochs", "2", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["sensitivity"] > 0 and data["max_error"] >= data["rmse"] > 0
