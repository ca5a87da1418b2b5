"""`dpmf verify REPORT.json`: 0 when a report of `dpmf account --json` holds, 1 when an edited one
does not (saying what), 2 with one line on stderr for files it cannot check; `--json`;
`--matrices DIR` for dense strategies referenced by hash."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dpmf.cli.main import app

runner = CliRunner()

ACCOUNT = (
    "account --strategy identity --sampling poisson --sampling-prob 0.05 --steps 200 "
    "--noise-multiplier 1.5 --delta 1e-6 --json"
).split()


def invoke(args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def report_file(tmp_path_factory):
    res = invoke(ACCOUNT)
    assert res.exit_code == 0, res.output
    path = tmp_path_factory.mktemp("verify") / "report.json"
    path.write_text(res.stdout)
    return path


def _one_line_error(res, *needles):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error:")
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_a_report_of_dpmf_account_holds(report_file):
    res = invoke(["verify", report_file])
    assert res.exit_code == 0, res.output
    claimed = json.loads(report_file.read_text())["epsilon"]
    assert res.stdout.startswith("HOLDS: claimed epsilon")
    assert f"{claimed:.10g}" in res.stdout and "method pld" in res.stdout


def test_json_output(report_file):
    res = invoke(["verify", report_file, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    claimed = json.loads(report_file.read_text())["epsilon"]
    assert data["holds"] is True and data["method"] == "pld"
    assert data["claimed_epsilon"] == claimed and data["recomputed_epsilon"] == pytest.approx(claimed, rel=1e-12)


def test_an_edited_report_does_not_hold(report_file, tmp_path):
    data = json.loads(report_file.read_text())
    data["epsilon"] = round(data["epsilon"] / 2, 3)
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    res = invoke(["verify", edited])
    assert res.exit_code == 1, res.output
    assert res.stdout.startswith(f"DOES NOT HOLD: claimed epsilon {data['epsilon']:g} < recomputed")
    assert "at delta 1e-06 (method pld)" in res.stdout
    res = invoke(["verify", edited, "--json"])
    assert res.exit_code == 1
    out = json.loads(res.stdout)
    assert out["holds"] is False and "claimed epsilon" in out["message"]


def test_foreign_and_broken_files_are_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("epsilon = 1, trust me")
    (tmp_path / "other.json").write_text(json.dumps({"epsilon": 1.0, "model": "resnet"}))
    (tmp_path / "bytes.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    _one_line_error(invoke(["verify", tmp_path / "notes.txt"]), "not a dpmf report (not JSON")
    _one_line_error(invoke(["verify", tmp_path / "other.json"]), "not a dpmf privacy report", "'delta'")
    _one_line_error(invoke(["verify", tmp_path / "bytes.json"]), "not a JSON text file")
    _one_line_error(invoke(["verify", tmp_path / "missing.json"]), "cannot read the dpmf report")


def test_unknown_method_and_montecarlo_calibration_are_refused(report_file, tmp_path):
    data = json.loads(report_file.read_text())
    for method, needle in (("magic", "key 'method' must be one of"), ("montecarlo-evr", "verify does not")):
        path = tmp_path / f"{method}.json"
        path.write_text(json.dumps(dict(data, method=method)))
        _one_line_error(invoke(["verify", path]), needle)


def test_dense_strategy_with_matrices_dir(tmp_path):
    mats = tmp_path / "mats"
    mats.mkdir()
    res = invoke(["strategy", "build", "banded", "--steps", "80", "--bands", "4", "--out", mats / "banded.npz"])
    assert res.exit_code == 0, res.output
    res = invoke(
        ["account", "--strategy", mats / "banded.npz", "--sampling", "fixed-order", "--epochs", "4", "--steps", "80",
         "--noise-multiplier", "3", "--delta", "1e-5", "--json"]
    )
    assert res.exit_code == 0, res.output
    report = tmp_path / "dense.json"
    report.write_text(res.stdout)
    assert "sha256" in json.loads(res.stdout)["strategy"]
    _one_line_error(invoke(["verify", report]), "not found", "--matrices")
    res = invoke(["verify", report, "--matrices", mats])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("HOLDS")


def test_a_calibration_report_holds_and_must_meet_its_target(tmp_path):
    res = invoke(
        "calibrate --strategy identity --sampling poisson --sampling-prob 0.05 --steps 100 --epsilon 2 "
        "--delta 1e-6 --json".split()
    )
    assert res.exit_code == 0, res.output
    path = tmp_path / "cal.json"
    path.write_text(res.stdout)
    assert invoke(["verify", path]).exit_code == 0
    data = json.loads(res.stdout)
    data["target_epsilon"] = data["epsilon"] / 2
    path.write_text(json.dumps(data))
    res = invoke(["verify", path])
    assert res.exit_code == 1 and "> the calibration target" in res.stdout


# --------------------------------------------------------------------------- option guards (issue 16 item 2)
_ACCOUNT = ["account", "--sampling", "poisson", "--sampling-prob", "0.01", "--steps", "100",
            "--noise-multiplier", "1", "--delta", "1e-6"]
_CALIBRATE = ["calibrate", "--sampling", "poisson", "--sampling-prob", "0.01", "--steps", "100",
              "--epsilon", "2", "--delta", "1e-6"]


@pytest.mark.parametrize("base", [_ACCOUNT, _CALIBRATE])
def test_cli_misspelled_option_is_refused_with_a_suggestion(base):
    result = runner.invoke(app, [*base, "--worker", "2"])
    assert result.exit_code == 2
    assert "No such option: --worker" in result.output and "--workers" in result.output


@pytest.mark.parametrize("base", [_ACCOUNT, _CALIBRATE])
def test_cli_method_option_the_method_does_not_take_is_refused(base):
    result = runner.invoke(app, [*base, "--method", "pld", "--samples", "100"])
    assert result.exit_code == 2
    assert "'--samples' is not used" in result.output and "option of montecarlo" in result.output
    assert "Traceback" not in result.output
