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


# --------------------------------------------------------------------------- edits (issue 24 item 14)
def _edited_file(report_file, tmp_path, name, edit):
    data = json.loads(report_file.read_text())
    edit(data)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def test_an_unedited_report_exits_0_and_says_not_edited(report_file):
    res = invoke(["verify", report_file])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("HOLDS:") and lines[1].startswith("NOT EDITED")
    data = json.loads(invoke(["verify", report_file, "--json"]).stdout)
    assert data["holds"] is True and data["edited"] is False


def test_an_edit_to_a_more_private_run_holds_but_exits_3(report_file, tmp_path):
    for name, edit in (
        ("sigma-raised", lambda d: d.update(noise_multiplier=d["noise_multiplier"] * 2)),
        ("q-halved", lambda d: d["scheme"].update(sampling_prob=d["scheme"]["sampling_prob"] / 2)),
    ):
        path = _edited_file(report_file, tmp_path, name, edit)
        res = invoke(["verify", path])
        assert res.exit_code == 3, (name, res.output)
        assert res.stdout.startswith("HOLDS:") and "EDITED since it was produced" in res.stdout
        data = json.loads(invoke(["verify", path, "--json"]).stdout)
        assert data["holds"] is True and data["edited"] is True


def test_an_edit_to_a_less_private_run_exits_1(report_file, tmp_path):
    for name, edit in (
        ("sigma-lowered", lambda d: d.update(noise_multiplier=d["noise_multiplier"] / 2)),
        ("epsilon-lowered", lambda d: d.update(epsilon=d["epsilon"] / 2)),
    ):
        res = invoke(["verify", _edited_file(report_file, tmp_path, name, edit)])
        assert res.exit_code == 1, (name, res.output)
        assert res.stdout.startswith("DOES NOT HOLD:") and "EDITED since it was produced" in res.stdout


def test_a_report_without_digest_holds_but_cannot_tell_and_exits_4(report_file, tmp_path):
    path = _edited_file(report_file, tmp_path, "old", lambda d: d.pop("digest"))
    res = invoke(["verify", path])
    assert res.exit_code == 4, res.output
    assert res.stdout.startswith("HOLDS:") and "NO DIGEST: cannot tell" in res.stdout
    assert json.loads(invoke(["verify", path, "--json"]).stdout)["edited"] is None


def test_help_documents_the_exit_codes_and_what_the_digest_is():
    from dpmf.cli.verify import EXIT_CODES

    res = runner.invoke(app, ["verify", "--help"], terminal_width=200)
    assert res.exit_code == 0
    text = " ".join(res.stdout.split())
    assert "not forgery" in text and "not a signature" in text
    for code in sorted(set(EXIT_CODES.values())):
        assert f"{code} the " in text or f"{code} the" in text, code
    assert EXIT_CODES == {"holds, not edited": 0, "does not hold": 1, "cannot be checked": 2,
                          "holds, edited since produced": 3, "holds, no digest (cannot tell whether edited)": 4}


def test_a_raised_calibration_target_is_an_edit(tmp_path):
    res = invoke(
        "calibrate --strategy identity --sampling poisson --sampling-prob 0.05 --steps 100 --epsilon 2 "
        "--delta 1e-6 --json".split()
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    data["target_epsilon"] = 4.0
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(data))
    res = invoke(["verify", path])
    assert res.exit_code == 3 and "EDITED" in res.stdout, res.output


# --------------------------------------------------------------------------- adjacency (issue 24 item 13)
def test_printed_and_json_reports_state_the_adjacency(report_file):
    from dpmf.accounting.report import ADJACENCY

    assert json.loads(report_file.read_text())["adjacency"] == ADJACENCY
    res = invoke([a for a in ACCOUNT if a != "--json"])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[1].startswith("  adjacency: zero-out")
    assert f"adjacency: {ADJACENCY}" in " ".join(res.stdout.split())  # (wrapped at the console's width)
    res = invoke("calibrate --strategy identity --sampling poisson --sampling-prob 0.05 --steps 100 --epsilon 2 "
                 "--delta 1e-6".split())
    assert res.exit_code == 0, res.output
    assert f"adjacency: {ADJACENCY}" in " ".join(res.stdout.split())
