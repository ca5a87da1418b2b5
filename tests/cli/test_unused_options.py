"""Issue 44 item 4: an option the run would ignore is refused in every command, under ``--method
auto`` as under an explicit method (decided by the methods auto actually runs for the pair), and
no ``--cache-dir`` folder is created for a run that will not use it; paths given to ``verify``
must exist."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import dpmf
from cli_checks import one_line_error
from dpmf.cli.main import app
from dpmf.errors import InvalidParameterError

runner = CliRunner()
DPSGD = ["--strategy", "identity", "--sampling", "poisson", "--sampling-prob", "0.01", "--steps", "100",
         "--delta", "1e-6"]


def invoke(args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("command", [["account", "--noise-multiplier", "1"], ["calibrate", "--epsilon", "1"]],
                         ids=["account", "calibrate"])
@pytest.mark.parametrize("method", ["auto", "pld"])
@pytest.mark.parametrize("extra", [["--workers", "2"], ["--cache-dir", "rows"], ["--samples", "1000"]],
                         ids=["workers", "cache-dir", "samples"])
def test_an_option_the_run_ignores_is_refused_and_no_folder_is_made(command, method, extra, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flag = extra[0]
    line = one_line_error(invoke([*command, *DPSGD, "--method", method, *extra]), f"option '{flag}' is not used")
    if method == "auto":
        assert "auto runs pld" in line and "mmcc is skipped" in line  # says what auto chose, and why
    assert not (tmp_path / "rows").exists()


def test_the_cache_is_made_and_used_when_the_method_auto_runs_takes_it(tmp_path):
    rows = tmp_path / "rows"
    args = ["account", "--strategy", "tree", "--sampling", "poisson", "--sampling-prob", "0.1", "--steps", "8",
            "--noise-multiplier", "2", "--delta", "1e-6", "--cache-dir", rows, "--quiet"]
    res = invoke(args)
    assert res.exit_code == 0, res.output
    assert "method mmcc" in res.stdout and len(list(rows.glob("*.npz"))) > 0  # the rows are cached


def test_the_api_refuses_the_same_under_auto():
    from dpmf.accounting.dispatch import check_options
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import BinaryTree, Identity

    with pytest.raises(InvalidParameterError, match="'cache_dir' is not used .* mmcc is skipped"):
        dpmf.calibrate(Identity(100), PoissonSampling(0.01, 100), 1.0, 1e-6, cache_dir="x")
    assert check_options(Identity(100), PoissonSampling(0.01, 100)) == ["pld", "unamplified"]
    assert "mmcc" in check_options(BinaryTree(8), PoissonSampling(0.1, 8), options={"workers": 2})


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity

    path = tmp_path_factory.mktemp("r") / "report.json"
    path.write_text(dpmf.account(Identity(100), PoissonSampling(0.01, 100), 1.0, 1e-6).to_json())
    return path


def test_verify_refuses_a_matrices_folder_that_does_not_exist(report, tmp_path):
    assert invoke(["verify", report]).exit_code == 0
    one_line_error(invoke(["verify", report, "--matrices", tmp_path / "nodir"]), "--matrices", "nodir",
                   "does not exist")
    (tmp_path / "file").write_text("x")
    one_line_error(invoke(["verify", report, "--matrices", tmp_path / "file"]), "is not a folder")
    assert invoke(["verify", report, "--matrices", tmp_path]).exit_code == 0  # an existing folder is fine
    from dpmf.accounting.verify import verify_report

    with pytest.raises(InvalidParameterError, match="search_dir .*nodir.* does not exist"):
        verify_report(report, search_dir=tmp_path / "nodir")
