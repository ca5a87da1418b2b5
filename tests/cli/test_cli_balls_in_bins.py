"""``--num-selected`` / ``--fresh-slots`` (issue 23): the balls-in-bins variants on the command line,
wherever ``--sampling balls-in-bins`` is accepted (account, calibrate, audit, montecarlo run/calibrate)."""

from __future__ import annotations

import json

import pytest
from cli_checks import one_line_error
from typer.testing import CliRunner

import dpmf
from dpmf.cli.main import app
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import Identity

runner = CliRunner()
BASE = ["--sampling", "balls-in-bins", "--epochs", "2", "--steps", "20", "--delta", "1e-6"]


def _account(*extra):
    res = runner.invoke(app, ["account", *BASE, "--noise-multiplier", "4", "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.parametrize(
    "extra, scheme",
    [
        (["--reused-slots"], BallsInBinsSampling(2, 20)),
        (["--num-selected", "2"], BallsInBinsSampling(2, 20, num_selected=2)),
        (["--num-selected", "2", "--fresh-slots"], BallsInBinsSampling(2, 20, num_selected=2, fresh_slots=True)),
    ],
)
def test_account_builds_the_variant_and_reports_the_library_value(extra, scheme):
    got = _account(*extra)
    assert got["scheme"] == scheme.describe()
    assert got["epsilon"] == dpmf.account(Identity(20), scheme, 4.0, 1e-6).epsilon


def test_the_options_are_refused_where_unused_and_checked():
    res = runner.invoke(app, ["account", "--sampling", "poisson", "--sampling-prob", "0.1", "--steps", "40",
                              "--noise-multiplier", "2", "--delta", "1e-6", "--num-selected", "2"])
    one_line_error(res, "--num-selected is not used with --sampling poisson", "balls-in-bins")
    res = runner.invoke(app, ["account", "--sampling", "fixed-order", "--epochs", "4", "--steps", "40",
                              "--noise-multiplier", "2", "--delta", "1e-6", "--fresh-slots"])
    one_line_error(res, "--fresh-slots is not used with --sampling fixed-order")
    res = runner.invoke(app, ["account", *BASE, "--noise-multiplier", "2", "--num-selected", "11"])
    one_line_error(res, "num_selected must be an integer in [1, steps per epoch = 10]", "got 11")
    res = runner.invoke(app, ["account", *BASE, "--noise-multiplier", "2", "--num-selected", "0"])
    one_line_error(res, "num_selected", "got 0")


def test_calibrate_and_the_other_commands_take_them():
    res = runner.invoke(app, ["calibrate", *BASE, "--epsilon", "3", "--num-selected", "2", "--fresh-slots",
                              "--method", "unamplified", "--json"])
    assert res.exit_code == 0, res.output
    cal = json.loads(res.stdout)  # the Gaussian mechanism with sensitivity sqrt(epochs * k) = 2
    assert cal["scheme"]["fresh_slots"] is True and cal["diagnostics"]["sensitivity"] == pytest.approx(2.0)
    assert cal["epsilon"] <= 3
    for command in (["audit"], ["montecarlo", "run"], ["montecarlo", "calibrate"]):
        text = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"}).stdout
        assert "--num-selected" in text and "--fresh-slots" in text, command


def test_montecarlo_run_samples_the_variant():
    res = runner.invoke(app, ["montecarlo", "run", "--strategy", "bsr", "--bands", "2", "--sampling", "balls-in-bins",
                              "--epochs", "2", "--steps", "8", "--num-selected", "2", "--noise-multiplier", "2",
                              "--delta", "1e-3", "--samples", "6000", "--seed", "1", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["scheme"]["num_selected"] == 2
