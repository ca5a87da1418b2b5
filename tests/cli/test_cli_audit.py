"""`dpmf audit`: account's options plus the audit's own; the empirical lower bound printed as such
next to the certified bound; --json with the documented keys; --plot; one-line errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")

from dpmf.cli.main import app  # noqa: E402

runner = CliRunner()

TINY = ("audit --strategy identity --sampling poisson --sampling-prob 0.3 --steps 8 --noise-multiplier 1.5 "
        "--delta 1e-5 --canaries 60 --examples 30 --reference-trials 2 --quiet").split()


def invoke(args):
    return runner.invoke(app, [str(a) for a in args])


def _one_line_error(res, *needles):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error:")
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_help_lists_account_options_and_the_audit_options():
    res = invoke(["audit", "--help"])
    assert res.exit_code == 0
    for opt in ("--strategy", "--sampling", "--sampling-prob", "--bands", "--delta", "--method", "--noise-multiplier",
                "--epsilon", "--canaries", "--threat", "--seed", "--json", "--runs", "--plot"):
        assert opt in res.stdout, opt
    assert "EMPIRICAL LOWER BOUND" in res.stdout


def test_text_output_labels_the_lower_bound(tmp_path):
    res = invoke([*TINY, "--plot", tmp_path / "a.png"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "empirical lower bound" in out and "not a certificate" in out
    assert "certified upper bound" in out and "gap" in out and "verdict" in out and "ideal attacker" in out
    assert (tmp_path / "a.png").stat().st_size > 10_000


def test_json_has_the_documented_keys():
    res = invoke([*TINY, "--json", "--seed", "4"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    for key in ("epsilon_lower", "epsilon_certified", "confidence", "threat_model", "canaries"):
        assert key in d
    assert d["canaries"] == 60 and d["threat_model"] == "white-box" and d["confidence"] == 0.95
    assert d["epsilon_lower_is"] == "empirical lower bound (not a certificate)"
    assert d["epsilon_lower"] <= d["epsilon_certified"] and d["seed"] == 4
    again = json.loads(invoke([*TINY, "--json", "--seed", "4"]).stdout)
    assert again["epsilon_lower"] == d["epsilon_lower"]


def test_many_runs_default_to_one_canary_each():
    res = invoke(["audit", "--strategy", "identity", "--sampling", "poisson", "--sampling-prob", "0.5", "--steps", "4",
                  "--noise-multiplier", "1", "--delta", "1e-5", "--runs", "6", "--examples", "10", "--quiet", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["mode"] == "many-run" and d["runs"] == 6 and d["canaries"] == 6


def test_black_box_and_epsilon_target():
    args = [a for a in TINY if a not in ("--noise-multiplier", "1.5")]
    res = invoke([*args, "--epsilon", "3", "--threat", "black-box", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["threat_model"] == "black-box" and d["epsilon_certified"] <= 3.0 + 1e-9


@pytest.mark.parametrize("extra,needles", [
    (["--epsilon", "2"], ("exactly one of --noise-multiplier and --epsilon",)),
    (["--canaries", "0"], ("--canaries",)),
    (["--reference-trials", "-1"], ("--reference-trials",)),
    (["--min-sep", "4"], ("--min-sep",)),          # an account option the sampler does not use
    (["--threat", "grey"], ()),
    (["--plot", "/no/such/dir/a.png"], ("--plot",)),
])
def test_bad_options_are_one_line_errors(extra, needles):
    res = invoke([*TINY, *extra])
    if extra[:2] == ["--threat", "grey"]:
        assert res.exit_code == 2 and "Traceback" not in res.output
        return
    _one_line_error(res, *needles)


def _audit_lower_bound(sigma: float, extra: list[str]) -> tuple[float, float]:
    res = invoke(["audit", "--strategy", "identity", "--sampling", "poisson", "--sampling-prob", "0.05", "--steps",
                  "100", "--noise-multiplier", sigma, "--delta", "1e-5", "--quiet", "--json", *extra])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    return d["epsilon_lower"], d["epsilon_certified"]


@pytest.mark.parametrize("sigma", [pytest.param(0.1, marks=pytest.mark.slow), 0.03])
def test_audit_at_tiny_noise_answers_and_catches_the_run(sigma):
    """Issue 40 item 3: at sigma 0.1 / 0.03 the account step was refused (the PLD grid floor), so
    such a run could not be audited; now it is accounted on a coarser grid and the audit's lower
    bound exceeds what sigma 1 would certify for the same configuration (the run is caught as far
    less private than a sigma-1 run). A small audit (300 canaries, no reference simulations)."""
    import dpmf
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity

    lower, certified = _audit_lower_bound(sigma, ["--canaries", "300", "--reference-trials", "0"])
    at_one = dpmf.account(Identity(100), PoissonSampling(0.05, 100), 1.0, 1e-5).epsilon  # 3.502
    assert lower > at_one
    assert certified > lower
