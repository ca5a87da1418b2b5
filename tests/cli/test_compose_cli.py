"""`dpmf compose REPORT.json ...` and `dpmf account --plot` (issue 25 items 3 and 4)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dpmf.cli.main import app

runner = CliRunner()

ACCOUNT = (
    "account --strategy identity --sampling poisson --sampling-prob 0.05 --steps 100 "
    "--noise-multiplier 1.5 --delta 1e-6 --json"
).split()
GAUSSIAN = (
    "account --strategy identity --sampling fixed-order --epochs 1 --steps 10 --noise-multiplier 2 --delta 1e-6 --json"
).split()


def invoke(args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compose")
    out = {}
    for name, args in (("run", ACCOUNT), ("gauss", GAUSSIAN)):
        res = invoke(args)
        assert res.exit_code == 0, res.output
        (tmp / f"{name}.json").write_text(res.stdout)
        out[name] = tmp / f"{name}.json"
    balls = invoke("account --sampling balls-in-bins --epochs 1 --steps 8 --noise-multiplier 1 --delta 1e-6 "
                   "--method allocation --json".split())
    assert balls.exit_code == 0, balls.output
    (tmp / "balls.json").write_text(balls.stdout)
    out["balls"] = tmp / "balls.json"
    return out


def test_compose_json_is_the_library_composition(files):
    import dpmf

    res = invoke(["compose", files["run"], "--times", "4", "--delta", "1e-5", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["method"] == "composition" and d["certified"] and d["diagnostics"]["tight"]
    assert d["diagnostics"]["parts"][0]["times"] == 4 and d["diagnostics"]["parts"][0]["recomputed"]
    lib = dpmf.compose([files["run"]], 1e-5, times=4)
    assert d["epsilon"] == pytest.approx(lib.epsilon, rel=1e-12)
    # the saved composition verifies, and composes again
    (files["run"].parent / "comp.json").write_text(res.stdout)
    v = invoke(["verify", files["run"].parent / "comp.json"])
    assert v.exit_code == 0, v.output
    assert "HOLDS" in v.stdout and "method composition" in v.stdout


def test_compose_text_names_what_is_not_tight(files):
    res = invoke(["compose", files["run"], files["gauss"], files["balls"]])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "method composition" in out and "3 runs" in out
    assert "part 1:" in out and "tight (its pessimistic PLD)" in out
    assert "exact GDP" in out
    assert "NOT TIGHT" in out and "allocation" in out
    assert "basic composition" in out


def test_compose_of_gaussian_runs_prints_mu(files):
    res = invoke(["compose", files["gauss"], files["gauss"]])
    assert res.exit_code == 0, res.output
    assert "GDP mu = 0.707107" in res.stdout and "exact" in res.stdout


def test_compose_recomputes_an_edited_file(files, tmp_path):
    d = json.loads(files["run"].read_text())
    d["epsilon"] = 0.001
    lying = tmp_path / "lying.json"
    lying.write_text(json.dumps(d))
    res = invoke(["compose", lying, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["epsilon"] > 0.5
    assert "its own claim does not hold" in res.stderr and "edited" in res.stderr


@pytest.mark.parametrize("args,needle", [
    (["compose", "{missing}"], "missing.json"),
    (["compose", "{run}", "--times", "0"], "--times"),
    (["compose", "{run}", "--delta", "2"], "--delta"),
    (["compose", "{run}", "--plot", "{dir}/p.txt"], "--plot"),
])
def test_compose_errors_are_one_line(files, tmp_path, args, needle):
    args = [a.format(missing=tmp_path / "missing.json", run=files["run"], dir=tmp_path) for a in args]
    res = invoke(args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and res.stdout == ""
    lines = [line for line in res.stderr.strip().splitlines() if not line.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.stderr


def test_account_plot_writes_the_curve(tmp_path):
    png = tmp_path / "curve.png"
    res = invoke([*ACCOUNT, "--plot", png])
    assert res.exit_code == 0, res.output
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    json.loads(res.stdout)  # stdout stays one JSON object; the note goes to stderr
    assert "written to" in res.stderr and "PLD" in res.stderr
    res = invoke([a for a in ACCOUNT if a != "--json"] + ["--plot", tmp_path / "c.svg"])
    assert res.exit_code == 0 and "written to" in res.stdout and (tmp_path / "c.svg").exists()


def test_account_plot_path_is_checked_before_the_work(tmp_path, monkeypatch):
    import dpmf.accounting

    def reached(*a, **k):
        raise AssertionError("the work started")

    monkeypatch.setattr(dpmf.accounting, "account", reached)
    for path, reason in ((tmp_path / "nope" / "c.png", "does not exist"), (tmp_path / "c.foo", "extension '.foo'")):
        res = invoke([*ACCOUNT, "--plot", path])
        assert res.exit_code == 2, res.output
        assert "--plot" in res.stderr and reason in res.stderr and res.stdout == ""


def test_compose_plot(files, tmp_path):
    png = tmp_path / "comp.png"
    res = invoke(["compose", files["run"], "--times", "2", "--plot", png])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:4] == b"\x89PNG" and "written to" in res.stdout


def _out_of_memory_hint(res):
    assert res.exit_code == 2 and "Traceback" not in res.output
    line = res.stderr.strip()
    assert "\n" not in line and "out of memory" in line, res.stderr
    assert "--times" in line and "--steps" not in line  # compose has no --steps (issue 44)
    return line


def test_out_of_memory_names_the_option_compose_has(files, monkeypatch):
    import dpmf.accounting.composition as composition

    def exhausted(*args, **kwargs):
        raise MemoryError("Unable to allocate 610. TiB")

    monkeypatch.setattr(composition, "compose", exhausted)
    _out_of_memory_hint(invoke(["compose", files["run"], "--times", "5", "--delta", "1e-5"]))


def test_a_trillion_runs_is_refused_at_once_naming_times(files, peak_memory):
    """Issue 44: the reproduction; refused by the memory guard before the composition starts."""
    with peak_memory() as peak:
        res = invoke(["compose", files["run"], "--times", str(10**12), "--delta", "1e-5"])
    assert peak.bytes < 2**28, peak.bytes  # at once: before the composition's grid was allocated
    line = one_line(res)
    assert "composing 1,000,000,000,000 runs" in line and "use a smaller times" in line and "--steps" not in line


def one_line(res):
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    return lines[0]
