"""``dpmf montecarlo run|resume|report`` (the sub-app invoked directly; the lead registers it).

The loss sampler is the closed-form DP-SGD sampler of the Monte Carlo tests, injected as the
default so these tests do not depend on which strategies the library sampler covers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dpmf.accounting.montecarlo.accountant as acc
import dpmf.accounting.montecarlo.run as mcrun
from dpmf.accounting.montecarlo import account_montecarlo, minimum_samples
from dpmf.cli.montecarlo import app
from dpmf.sampling import PoissonSampling
from dpmf.strategies import Identity

_spec = importlib.util.spec_from_file_location(
    "_dpsgd_sampler", Path(__file__).resolve().parents[1] / "accounting" / "montecarlo" / "_dpsgd_sampler.py"
)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
dpsgd_loss_samples = _mod.dpsgd_loss_samples

runner = CliRunner()
BASE = ["--strategy", "identity", "--steps", "10", "--sampling", "poisson", "--sampling-prob", "0.1",
        "--noise-multiplier", "1.0", "--delta", "1e-2", "--seed", "3", "--chunk-size", "1000"]


@pytest.fixture
def dpsgd_sampler(monkeypatch):
    monkeypatch.setattr(mcrun, "default_sampler", lambda: dpsgd_loss_samples)
    monkeypatch.setattr(acc, "supports", lambda strategy, scheme: None)


def test_run_json_matches_the_library(tmp_path, dpsgd_sampler):
    ck = tmp_path / "mc.npz"
    res = runner.invoke(app, ["run", *BASE, "--samples", "4000", "--checkpoint", str(ck), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["certified"] is False and data["method"] == "montecarlo"
    assert data["diagnostics"]["samples_used"] == 4000 and data["diagnostics"]["seed_entropy"] == 3
    lib = account_montecarlo(
        Identity(10), PoissonSampling(0.1, 10), 1.0, 1e-2, num_samples=4000, seed=3, chunk_size=1000
    )
    assert data["epsilon"] == lib.epsilon
    assert ck.exists()


def test_run_text_says_estimate_and_samples_needed(dpsgd_sampler):
    res = runner.invoke(app, ["run", *BASE, "--samples", "2000"])
    assert res.exit_code == 0, res.output
    assert "ESTIMATE" in res.stdout
    assert f"needs {minimum_samples(1e-2):,} per direction" in res.stdout  # Alg. 5 recipe (notes O9)


def test_partial_report_then_resume_equals_a_full_run(tmp_path, dpsgd_sampler):
    ck = tmp_path / "part.npz"
    mcrun.MonteCarloRun(
        Identity(10), PoissonSampling(0.1, 10), 1.0, 4000, seed=3, chunk_size=1000, checkpoint=ck
    ).run(max_chunks=3)
    rep = runner.invoke(app, ["report", str(ck), "--delta", "1e-2", "--epsilon", "0.5"])
    assert rep.exit_code == 0, rep.output
    assert "PARTIAL" in rep.stdout and "delta(0.5) remove" in rep.stdout
    res = runner.invoke(app, ["resume", str(ck), "--delta", "1e-2", "--json"])
    assert res.exit_code == 0, res.output
    full = runner.invoke(app, ["run", *BASE, "--samples", "4000", "--json"])
    assert json.loads(res.stdout)["epsilon_by_direction"] == json.loads(full.stdout)["epsilon_by_direction"]
    assert json.loads(res.stdout)["diagnostics"]["complete"] is True


def test_report_of_a_custom_sampler_checkpoint_is_read_only(tmp_path, dpsgd_sampler):
    ck = tmp_path / "custom.npz"
    mcrun.MonteCarloRun(None, None, 1.0, 1000, seed=1, chunk_size=500, checkpoint=ck,
                        sampler=_mod.gaussian_loss_samples).run()
    rep = runner.invoke(app, ["report", str(ck), "--delta", "1e-2", "--json"])
    assert rep.exit_code == 0, rep.output
    assert json.loads(rep.stdout)["diagnostics"]["sampler"].endswith("gaussian_loss_samples")
    res = runner.invoke(app, ["resume", str(ck), "--delta", "1e-2"])
    assert res.exit_code == 2 and "sampler" in res.output


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--sampling", "b-min-sep", "--sampling-prob", "0.1"], "--min-sep"),
        (["--sampling", "b-min-sep", "--min-sep", "2", "--sampling-prob", "0.1", "--participation-rate", "0.1"],
         "exactly one"),
        (["--sampling", "b-min-sep", "--min-sep", "6", "--participation-rate", "0.2"], "--participation-rate"),
        (["--sampling", "balls-in-bins"], "--epochs"),
        (["--sampling", "poisson", "--sampling-prob", "1.5"], "--sampling-prob"),
    ],
)
def test_bad_input_is_one_line(args, needle, dpsgd_sampler):
    res = runner.invoke(app, ["run", "--steps", "12", "--noise-multiplier", "1", "--delta", "1e-3", *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_missing_checkpoint_is_an_error(tmp_path, dpsgd_sampler):
    res = runner.invoke(app, ["report", str(tmp_path / "nope.npz"), "--delta", "1e-3"])
    assert res.exit_code == 2 and "cannot read the dpmf Monte Carlo checkpoint (no such file)" in res.output


def test_run_with_the_library_sampler_b_min_sep_banded_toeplitz(tmp_path):
    pytest.importorskip("dpmf.accounting.montecarlo.losses")
    ck = tmp_path / "bms.npz"
    args = ["run", "--strategy", "bsr", "--bands", "2", "--steps", "16", "--sampling", "b-min-sep",
            "--min-sep", "2", "--participation-rate", "0.05", "--noise-multiplier", "1.0", "--delta", "1e-2",
            "--samples", "3000", "--chunk-size", "1000", "--seed", "1", "--checkpoint", str(ck), "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["scheme"]["name"] == "b-min-sep" and data["scheme"]["warm_start"] is False  # cold start: the library's (and every command's) default
    assert data["certified"] is False and 0 < data["epsilon"] < float("inf")
    again = runner.invoke(app, ["resume", str(ck), "--delta", "1e-2", "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["epsilon"] == data["epsilon"]
    # too few samples for delta = 1e-4: the bound cannot go below ln(200)/3000 > 1e-4 -> inf, with a warning
    tiny = runner.invoke(app, ["report", str(ck), "--delta", "1e-4"])
    assert tiny.exit_code == 0 and "inf" in tiny.stdout and "too few samples" in tiny.stdout


def test_run_with_worker_processes_equals_serial(tmp_path):
    args = ["run", "--strategy", "bsr", "--bands", "2", "--steps", "16", "--sampling", "b-min-sep",
            "--min-sep", "2", "--participation-rate", "0.05", "--noise-multiplier", "1.0", "--delta", "1e-2",
            "--samples", "3000", "--chunk-size", "500", "--seed", "4", "--json"]
    serial = runner.invoke(app, args)
    par = runner.invoke(app, args + ["--workers", "2"])
    assert serial.exit_code == 0 and par.exit_code == 0, par.output
    assert json.loads(par.stdout)["epsilon_by_direction"] == json.loads(serial.stdout)["epsilon_by_direction"]


def test_calibrate_certifies_a_private_noise(dpsgd_sampler):
    # one Gaussian step: the released noise must satisfy the exact Gaussian delta(eps) <= delta
    import math

    from scipy.stats import norm

    res = runner.invoke(app, ["calibrate", "--strategy", "identity", "--steps", "1", "--sampling", "poisson",
                              "--sampling-prob", "1.0", "--epsilon", "1.0", "--delta", "1e-2", "--seed", "2",
                              "--candidates", "6", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["certified"] is True and data["method"] == "montecarlo-evr"
    sigma = data["noise_multiplier"]
    a = 1 / (2 * sigma)
    assert norm.cdf(a - sigma) - math.e * norm.cdf(-a - sigma) <= 1e-2


# ---------------------------------------------------------------- progress when stderr is a pipe (issue 49 item 3)
_BMINSEP = ["--strategy", "banded-toeplitz", "--bands", "4", "--steps", "32", "--sampling", "b-min-sep",
            "--min-sep", "4", "--participation-rate", "0.05", "--seed", "2", "--chunk-size", "2000"]
_ESTIMATE = r"\d[\d,]*/[\d,]+ samples \(\d+\.\d%\), \d+ s elapsed, about \d+ (s|min) left"


def test_run_prints_progress_lines_with_time_left_into_a_pipe():
    """The real command in a subprocess, stderr a pipe: timestamped lines, one with an estimate."""
    import os
    import re
    import subprocess
    import sys

    env = dict(os.environ, DPMF_PROGRESS_INTERVAL="0")  # every update (the default is one line per 10 s)
    env.pop("DPMF_PROGRESS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "dpmf", "montecarlo", "run", *_BMINSEP, "--noise-multiplier", "1", "--delta", "1e-2",
         "--samples", "20000"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] sampling privacy losses: started \(40,000 samples\)", lines[0])
    assert any(re.search("sampling privacy losses: " + _ESTIMATE, line) for line in lines), proc.stderr
    assert "sampling privacy losses: done, 40,000/40,000 samples" in lines[-1]
    assert "samples per CPU-second" in proc.stdout


def test_calibrate_prints_pilot_and_verification_progress_with_time_left(monkeypatch):
    import re

    monkeypatch.setenv("DPMF_PROGRESS_INTERVAL", "0")
    monkeypatch.delenv("DPMF_PROGRESS", raising=False)
    res = runner.invoke(app, ["calibrate", *_BMINSEP, "--epsilon", "2", "--delta", "1e-2", "--candidates", "5"])
    assert res.exit_code == 0, res.output
    err_lines = res.stderr.splitlines()
    assert any(re.search("pilot estimate .*: " + _ESTIMATE, line) for line in err_lines), res.stderr
    assert any(re.search("verification .*: " + _ESTIMATE + r" \[candidate 1 of at most \d", line) for line in err_lines)
    assert "certified by Algorithm 5" in res.stdout and "samples per CPU-second" in res.stdout
