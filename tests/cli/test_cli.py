"""The `dpmf` command line: the acceptance commands, JSON output, one-line errors naming the
option (no tracebacks), `plan` with a plot, and the installed console script."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dp_accounting
import pytest
from typer.testing import CliRunner

from dpmf import __version__
from dpmf.cli.main import app

runner = CliRunner()

ACCOUNT = (
    "account --strategy identity --sampling poisson --sampling-prob 0.01 --steps 1000 "
    "--noise-multiplier 1.0 --delta 1e-6 --json"
).split()
CALIBRATE = (
    "calibrate --strategy identity --sampling poisson --sampling-prob 0.01 --steps 1000 "
    "--epsilon 1 --delta 1e-6 --json"
).split()
FIXED_ORDER = (
    "account --strategy identity --sampling fixed-order --epochs 4 --steps 1000 "
    "--noise-multiplier 2.0 --delta 1e-6"
).split()

MIN_SEP = (
    "account --sampling b-min-sep --min-sep 10 --sampling-prob 0.01 --max-batch-size 50 --steps 100 "
    "--noise-multiplier 2.0 --delta 1e-6 --method unamplified --json"
).split()
BALLS = (
    "account --sampling balls-in-bins --epochs 2 --steps 100 --noise-multiplier 2.0 --delta 1e-6 --method unamplified --json"
).split()


def invoke(args):
    return runner.invoke(app, list(args))


def _replace(args, option, value):
    args = list(args)
    i = args.index(option)
    args[i + 1] = value
    return args


def test_version():
    res = invoke(["--version"])
    assert res.exit_code == 0
    assert res.stdout.strip() == f"dpmf {__version__}"


def test_acceptance_account():
    res = invoke(ACCOUNT)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["epsilon"] == pytest.approx(2.1245, abs=2e-3)
    assert data["method"] == "pld" and data["certified"] is True
    assert data["delta"] == 1e-6 and data["noise_multiplier"] == 1.0


def test_acceptance_calibrate():
    res = invoke(CALIBRATE)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["noise_multiplier"] == pytest.approx(1.5627, abs=5e-3)
    assert data["epsilon"] <= 1.0
    assert data["target_epsilon"] == 1.0
    assert data["evaluations"] >= 1


def test_fixed_order_account_text_and_json():
    expected = dp_accounting.get_epsilon_gaussian(1.0, 1e-6)  # sigma 2 / sqrt(4 epochs)
    res = invoke(FIXED_ORDER + ["--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert data["method"] == "unamplified"
    text = invoke(FIXED_ORDER)
    assert text.exit_code == 0
    assert f"epsilon = {expected:.6g}" in text.stdout
    assert "remove direction" in text.stdout and "certified upper bound" in text.stdout


def test_fixed_order_calibrate_text():
    res = invoke("calibrate --sampling fixed-order --epochs 4 --steps 1000 --epsilon 1 --delta 1e-6".split())
    assert res.exit_code == 0, res.output
    sigma = 2.0 * dp_accounting.get_sigma_gaussian(1.0, 1e-6)
    assert f"noise multiplier {sigma:.6g}" in res.stdout


@pytest.mark.parametrize(
    "args,sens",
    [
        (MIN_SEP, math.sqrt(10)),  # <= ceil(100/10) = 10 participations of the identity
        ([a for a in _replace(MIN_SEP, "--sampling", "cyclic-poisson") if a not in ("--max-batch-size", "50")],
         math.sqrt(10)),
        (BALLS, math.sqrt(2)),  # exactly one step per epoch
    ],
    ids=["b-min-sep", "cyclic-poisson", "balls-in-bins"],
)
def test_new_samplers_unamplified_identity_is_the_gaussian_with_participation_sensitivity(args, sens):
    from dpmf.privacy.gdp import gaussian_epsilon

    res = invoke(args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["diagnostics"]["sensitivity"] == pytest.approx(sens, rel=1e-12)
    assert data["epsilon"] == pytest.approx(gaussian_epsilon(2.0, 1e-6, sens), rel=1e-12)
    assert data["scheme"]["name"] == args[args.index("--sampling") + 1]


BAD_INPUTS = [
    (_replace(ACCOUNT, "--noise-multiplier", "0"), "--noise-multiplier"),
    (_replace(ACCOUNT, "--noise-multiplier", "-1"), "--noise-multiplier"),
    (_replace(ACCOUNT, "--noise-multiplier", "nan"), "--noise-multiplier"),
    (_replace(ACCOUNT, "--sampling-prob", "1.5"), "--sampling-prob"),
    (_replace(ACCOUNT, "--sampling-prob", "0"), "--sampling-prob"),
    (_replace(ACCOUNT, "--sampling-prob", "nan"), "--sampling-prob"),
    (_replace(ACCOUNT, "--delta", "0"), "--delta"),
    (_replace(ACCOUNT, "--delta", "1"), "--delta"),
    (_replace(ACCOUNT, "--steps", "0"), "--steps"),
    ([a for a in ACCOUNT if a not in ("--sampling-prob", "0.01")], "--sampling-prob"),
    ([a for a in ACCOUNT if a not in ("--steps", "1000")], "--steps"),
    (_replace(CALIBRATE, "--epsilon", "0"), "--epsilon"),
    (_replace(CALIBRATE, "--epsilon", "nan"), "--epsilon"),
    (_replace(CALIBRATE, "--sampling-prob", "1.5"), "--sampling-prob"),
    (_replace(CALIBRATE, "--delta", "1"), "--delta"),
    ([a for a in FIXED_ORDER if a not in ("--epochs", "4")], "--epochs"),
    ([a for a in MIN_SEP if a not in ("--min-sep", "10")], "--min-sep"),
    (_replace(MIN_SEP, "--min-sep", "0"), "--min-sep"),
    (_replace(MIN_SEP, "--sampling-prob", "2"), "--sampling-prob"),
    (_replace(MIN_SEP, "--max-batch-size", "0"), "--max-batch-size"),
    ([a for a in _replace(MIN_SEP, "--sampling", "cyclic-poisson") if a not in ("--sampling-prob", "0.01")],
     "--sampling-prob"),
    ([a for a in BALLS if a not in ("--epochs", "2")], "--epochs"),
    (_replace(BALLS, "--epochs", "3"), "--epochs"),
    ("plan --dataset-size 0".split(), "--dataset-size"),
    ("plan --epsilon -1".split(), "--epsilon"),
]


@pytest.mark.parametrize("args,option", BAD_INPUTS, ids=[" ".join(a[-6:]) for a, _ in BAD_INPUTS])
def test_bad_input_one_line_error_naming_option(args, option):
    res = invoke(args)
    assert res.exit_code == 2
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert res.stdout == ""  # errors go to stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error:") and option in lines[0]


def test_long_error_message_stays_on_one_line():
    # regression: rich used to soft-wrap stderr at 80 columns when it is not a terminal
    # 'steps must be a multiple of epochs for fixed-order sampling, got steps=1000, epochs=3'
    res = invoke(_replace(FIXED_ORDER, "--epochs", "3"))
    assert res.exit_code == 2
    assert "--epochs" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


# -------------------------------------------------------------------------------- plan
PLAN = "plan --dataset-size 2000 --batch-size 100 --epochs 2 --epsilon 1 --delta 1e-6 --json --budget 20".split()  # (the asserted rows are all in the quick waves, which a budget never cuts)


@pytest.fixture(scope="module")
def plan_result(tmp_path_factory):
    png = tmp_path_factory.mktemp("plan") / "plan.png"
    res = invoke(PLAN + ["--plot", str(png)])
    return res, png


def test_plan_json_rows(plan_result):
    res, _ = plan_result
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["run"]["steps"] == 40 and data["run"]["sampling_prob"] == pytest.approx(0.05)
    rows = data["rows"]
    assert {(r["strategy"], r["sampling"]) for r in rows} >= {
        ("identity", "poisson"),
        ("identity", "fixed-order"),
        ("sqrt-toeplitz", "fixed-order"),
        ("tree", "fixed-order"),
    }
    rmse = [r["prefix_sum_rmse"] for r in rows]
    assert rmse == sorted(rmse)
    for r in rows:
        assert r["epsilon"] <= 1.0
        assert r["certified"] is True
        if r["strategy"] == "identity":
            # RMSE = sigma * sqrt((n + 1) / 2) for the identity over n = 40 steps
            assert r["prefix_sum_rmse"] == pytest.approx(r["noise_multiplier"] * math.sqrt(41 / 2), rel=1e-12)
    by_key = {(r["strategy"], r["sampling"]): r for r in rows}
    assert ("optimal-mf", "fixed-order") in by_key
    # the optimal factorization is never worse than sqrt-Toeplitz under the same pattern
    assert by_key[("optimal-mf", "fixed-order")]["prefix_sum_rmse"] <= by_key[("sqrt-toeplitz", "fixed-order")]["prefix_sum_rmse"] * (1 + 1e-9)
    # correlated noise beats independent noise when neither is amplified
    assert by_key[("sqrt-toeplitz", "fixed-order")]["prefix_sum_rmse"] < by_key[("identity", "fixed-order")]["prefix_sum_rmse"]
    # Poisson amplification beats no amplification at this target
    assert by_key[("identity", "poisson")]["prefix_sum_rmse"] < by_key[("identity", "fixed-order")]["prefix_sum_rmse"]
    # the amplified samplers have their rows, each from a proven accountant (ranked, or pruned -- by the
    # accountant named -- against a row certified before it, e.g. the fresh slots' under a budget)
    decided = {**{(r["strategy"], r["sampling"]): r for r in data["pruned"]}, **by_key}
    assert decided[("identity", "balls-in-bins")]["method"] in ("allocation", "allocation_pld", "unamplified")
    assert any(r["sampling"] == "cyclic-poisson" for r in rows)


def test_plan_plot_writes_png(plan_result):
    res, png = plan_result
    assert res.exit_code == 0
    assert png.is_file() and png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------- installed console script
def test_installed_console_script():
    script = Path(sys.executable).with_name("dpmf")
    exe = str(script) if script.exists() else shutil.which("dpmf")
    assert exe, "the dpmf console script is not installed"
    proc = subprocess.run(
        [exe, *FIXED_ORDER, "--json"],
        capture_output=True,
        text=True,
        timeout=900,  # (a hang guard, far above the work)
        env={**os.environ, "COLUMNS": "80"},
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["epsilon"] == pytest.approx(dp_accounting.get_epsilon_gaussian(1.0, 1e-6), rel=1e-9)
    assert data["dpmf_version"] == __version__
    assert "Traceback" not in proc.stderr


def test_mmcc_cache_dir_resumes_with_the_same_answer(tmp_path):
    """--cache-dir: rows saved on the first run, all reloaded (none recomputed) on the second."""
    args = (
        "account --strategy banded-toeplitz --bands 4 --sampling poisson --sampling-prob 0.125 --steps 24 "
        f"--noise-multiplier 3 --delta 1e-6 --method mmcc --json --cache-dir {tmp_path / 'rows'}"
    ).split()
    first = invoke(args)
    assert first.exit_code == 0, first.output
    saved = sorted(os.listdir(tmp_path / "rows"))
    assert saved and all(f.endswith(".npz") for f in saved)
    second = invoke(args)
    assert second.exit_code == 0, second.output
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["epsilon_by_direction"] == b["epsilon_by_direction"]
    assert b["diagnostics"]["backend"]["rows_loaded"] == b["diagnostics"]["distinct_units_computed"] > 0
    assert sorted(os.listdir(tmp_path / "rows")) == saved


def test_plan_montecarlo_rows_need_enough_samples():
    from dpmf.errors import InvalidParameterError
    from dpmf.planner import TrainingRun

    with pytest.raises(InvalidParameterError, match="at least 5,298,315 samples"):
        TrainingRun(2000, 100, 2, 1.0, 1e-6, montecarlo_samples=20_000)
    res = invoke(PLAN + ["--montecarlo-samples", "20000"])
    assert res.exit_code == 2 and "--montecarlo-samples" in res.stderr and "--delta" in res.stderr


def test_plan_montecarlo_row_is_an_estimate_below_the_unamplified_noise():
    from dpmf.accounting import calibrate
    from dpmf.planner import TrainingRun, estimate_montecarlo, candidates

    run = TrainingRun(2000, 100, 2, 1.0, 1e-3, montecarlo_samples=20_000)
    (cand,) = [c for c in candidates(run) if c.method == "montecarlo"]
    assert cand.scheme.name == "b-min-sep"
    cal = estimate_montecarlo(cand, run)
    assert cal.report.certified is False and cal.report.epsilon <= 1.0
    unamp = calibrate(cand.strategy, cand.scheme, 1.0, 1e-3, method="unamplified")
    assert cal.noise_multiplier < unamp.noise_multiplier
