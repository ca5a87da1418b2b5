"""Issue 14 (robustness and first run): one test per item a new user ran into.

A user who makes a mistake gets one clear line and loses nothing: no traceback for a broken file,
output paths checked before the work, no silent hang (an up-front cost estimate), no silent trap
(ignored options, a Monte Carlo infinity without the number of samples it needs), resume hints
that work when pasted, and output that fits an 80-column terminal.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import dpmf
from dpmf.cli.main import app
from dpmf.errors import DPMFError, InvalidParameterError

runner = CliRunner()
README = Path(__file__).resolve().parents[2] / "README.md"


def invoke(args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(res, *needles) -> str:
    """Exit 2, exactly one 'error:' line on stderr containing every needle, nothing on stdout."""
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output and res.stdout == ""
    lines = [line for line in res.stderr.strip().splitlines() if not line.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from dpmf.accounting.individual import IndividualGDPLedger
    from dpmf.accounting.montecarlo.run import MonteCarloRun
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import BinaryTree, catalog

    root = tmp_path_factory.mktemp("files")
    catalog.save(BinaryTree(8), root / "tree.npz")
    IndividualGDPLedger(4, 1.0, run_id="r").save(root / "ledger.npz")

    def gauss(strategy, scheme, sigma, m, rng, *, direction="remove"):
        y = rng.normal(1.0 if direction == "remove" else 0.0, sigma, m)
        ll = (2 * y - 1) / (2 * sigma**2)
        return ll if direction == "remove" else -ll

    MonteCarloRun(None, PoissonSampling(1.0, 1), 1.0, 1000, seed=0, chunk_size=500, sampler=gauss,
                  checkpoint=root / "mc.npz").run()
    for name in ("tree", "ledger", "mc"):
        raw = (root / f"{name}.npz").read_bytes()
        (root / f"{name}-truncated.npz").write_bytes(raw[: len(raw) // 2])
    (root / "random.npz").write_bytes(np.random.default_rng(0).bytes(400))
    return root


# ------------------------------------------------------------------ tracebacks: broken files
@pytest.mark.parametrize(
    "args",
    [
        ["account", "--strategy", "{f}", "--steps", "8", "--sampling-prob", "0.1", "--noise-multiplier", "2",
         "--delta", "1e-5"],
        ["strategy", "show", "{f}"],
        ["individual", "report", "{f}"],
        ["montecarlo", "report", "{f}", "--delta", "1e-3"],
    ],
    ids=["account --strategy", "strategy show", "individual report", "montecarlo report"],
)
@pytest.mark.parametrize("which", ["tree-truncated", "ledger-truncated", "mc-truncated", "random"])
def test_truncated_or_random_npz_is_one_line_naming_the_file(files, args, which):
    path = files / f"{which}.npz"
    line = one_line_error(invoke([a.replace("{f}", str(path)) for a in args]), str(path))
    assert ("truncated or damaged" in line) or ("not an .npz archive" in line)
    assert "pickle" not in line  # never invite a user to unpickle an untrusted file


def test_ledger_load_truncated_is_a_dpmf_error(files):
    from dpmf.accounting.individual import IndividualGDPLedger

    with pytest.raises(InvalidParameterError, match="ledger-truncated.npz: not a dpmf GDP ledger .truncated"):
        IndividualGDPLedger.load(files / "ledger-truncated.npz")


def test_object_arrays_are_refused_in_dpmf_words(tmp_path):
    from dpmf.strategies import catalog

    with open(tmp_path / "obj.npz", "wb") as fh:
        np.savez(fh, metadata=np.array("{}"), encoder=np.array([{"x": 1}], dtype=object))
    with pytest.raises(InvalidParameterError) as info:
        catalog.load(tmp_path / "obj.npz")
    assert "pickled (object) data, which dpmf never loads" in str(info.value)
    assert "allow_pickle" not in str(info.value)


# ------------------------------------------------------------------ output paths before the work
def test_plan_plot_in_a_missing_folder_fails_before_any_calibration(tmp_path, monkeypatch):
    import dpmf.planner

    monkeypatch.setattr(dpmf.planner, "plan", lambda *a, **k: pytest.fail("the plan ran"))
    one_line_error(invoke(["plan", "--plot", tmp_path / "nope" / "plan.png"]), "--plot", "does not exist")


def test_individual_plot_and_build_out_in_a_missing_folder(files, tmp_path):
    one_line_error(invoke(["individual", "report", files / "ledger.npz", "--plot", tmp_path / "no" / "e.png"]),
                   "--plot", "does not exist")
    res = invoke(["strategy", "build", "optimal", "--steps", "16", "--out", tmp_path / "no" / "s.npz"])
    one_line_error(res, "--out", "does not exist")
    one_line_error(invoke(["montecarlo", "run", "--strategy", "bsr", "--bands", "2", "--steps", "8",
                           "--sampling", "b-min-sep", "--min-sep", "2", "--sampling-prob", "0.1",
                           "--noise-multiplier", "1", "--delta", "1e-2", "--checkpoint", tmp_path / "no" / "c.npz"]),
                   "--checkpoint", "does not exist")


def test_library_writers_refuse_unwritable_paths(tmp_path):
    from dpmf.accounting.individual import IndividualGDPLedger
    from dpmf.strategies import BinaryTree, catalog

    for save in (IndividualGDPLedger(2, 1.0).save, lambda p: catalog.save(BinaryTree(4), p)):
        with pytest.raises(InvalidParameterError, match="does not exist"):
            save(tmp_path / "missing" / "x.npz")
        with pytest.raises(InvalidParameterError, match="is a directory"):
            save(tmp_path)


# ------------------------------------------------------------------ MMCC at sampling probability 1
@pytest.mark.parametrize("make", ["tree", "bsr", "sqrt"])
def test_mmcc_accepts_sampling_probability_one(make):
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import BinaryTree, ToeplitzStrategy, bsr

    strat = {"tree": lambda: BinaryTree(8), "bsr": lambda: bsr(8, 3),
             "sqrt": lambda: ToeplitzStrategy.sqrt_prefix_sum(8)}[make]()
    one = dpmf.account(strat, PoissonSampling(1.0, 8), 4.0, 1e-5, method="mmcc")
    almost = dpmf.account(strat, PoissonSampling(0.999, 8), 4.0, 1e-5, method="mmcc")
    assert math.isfinite(one.epsilon) and one.epsilon >= almost.epsilon  # monotone in q, no refusal


def test_merged_mass_never_exceeds_one():
    from dpmf.accounting.mmcc.rows import merge_upward

    _, mass = merge_upward(np.array([0.25, 0.25, 0.5]), 10.0)
    assert mass.tolist() == [1.0]


# ------------------------------------------------------------------ hangs: the up-front estimate
@pytest.mark.parametrize("strategy", ["identity", "tree"])
def test_a_billion_steps_is_refused_at_once_with_the_estimate(strategy):
    start = time.perf_counter()
    res = invoke(["account", "--strategy", strategy, "--steps", "1000000000", "--sampling-prob", "0.01",
                  "--noise-multiplier", "1", "--delta", "1e-6"])
    line = one_line_error(res, "rough estimate", "--force")
    assert re.search(r"(GiB|min|h|days|years)", line)
    assert time.perf_counter() - start < 20


def test_sampling_probability_one_with_mmcc_is_refused_with_the_estimate():
    res = invoke(["account", "--strategy", "tree", "--sampling-prob", "1", "--steps", "1000",
                  "--noise-multiplier", "1", "--delta", "1e-6"])
    one_line_error(res, "refusing to start", "mmcc", "--force")


def test_force_skips_the_estimate(monkeypatch):
    import dpmf.accounting

    def stub(*args, **kwargs):
        raise DPMFError("stub reached")

    monkeypatch.setattr(dpmf.accounting, "account", stub)
    res = invoke(["account", "--strategy", "tree", "--sampling-prob", "1", "--steps", "1000",
                  "--noise-multiplier", "1", "--delta", "1e-6", "--force"])
    one_line_error(res, "stub reached")


def _readme_commands() -> list[list[str]]:
    text = README.read_text()
    section = text[text.index("## Command line"):]
    out = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].split(">")[0].split("&&")[0].strip()
            if line.startswith("dpmf "):
                out.append(shlex.split(line)[1:])
    return out


def test_readme_commands_pass_the_estimate(tmp_path, monkeypatch):
    """Every README command that can be refused reaches the computation (stubbed here)."""
    import dpmf.accounting
    import dpmf.planner
    from dpmf.strategies import catalog

    monkeypatch.chdir(tmp_path)
    catalog.save(catalog.build("optimal", 128, epochs=2), tmp_path / "opt.npz")

    def stub(*args, **kwargs):
        raise DPMFError("stub reached")

    for name in ("account", "calibrate"):
        monkeypatch.setattr(dpmf.accounting, name, stub)
    monkeypatch.setattr(dpmf.planner, "plan", stub)
    monkeypatch.setattr(catalog, "build", stub)
    checked = 0
    for args in _readme_commands():
        if args[0] in ("account", "calibrate", "plan") or args[:2] == ["strategy", "build"]:
            one_line_error(invoke(args), "stub reached")
            checked += 1
    assert checked >= 8


def test_cost_estimate_grows_with_steps_and_refuses_with_a_clear_message():
    from dpmf.accounting.cost import CostEstimate, accounting_cost, check_cost, plan_cost, strategy_build_cost
    from dpmf.errors import CostLimitError
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import BinaryTree, Identity

    small = accounting_cost(BinaryTree(64), PoissonSampling(0.02, 64), 10.0)
    big = accounting_cost(BinaryTree(4096), PoissonSampling(0.02, 4096), 10.0)
    assert 0 < small.seconds < big.seconds and small.memory_bytes < big.memory_bytes
    assert accounting_cost(BinaryTree(64), PoissonSampling(0.02, 64), 1.0).seconds > small.seconds  # 1/sigma^2
    assert accounting_cost(Identity(10**9), PoissonSampling(0.01, 10**9), 1.0).memory_bytes > 2**34
    assert strategy_build_cost("optimal", 8192).seconds > 3600 > strategy_build_cost("optimal", 512).seconds
    assert plan_cost(1000).seconds < 600  # the README's plan
    with pytest.raises(CostLimitError, match=r"about 2 h and 4 GiB of memory .* rough estimate.*--force"):
        check_cost(CostEstimate(7200.0, 4 * 2**30), max_memory=2**40)
    check_cost(CostEstimate(7200.0, 4 * 2**30), force=True)


def test_dense_encoder_too_large_for_memory_is_a_dpmf_error():
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import BinaryTree

    with pytest.raises(InvalidParameterError, match="dense .* more than the .* of memory available"):
        BinaryTree(10**7).encoder()
    with pytest.raises(DPMFError, match="MMCC needs a dense"):
        dpmf.account(BinaryTree(10**6), PoissonSampling(0.01, 10**6), 1.0, 1e-6, method="mmcc")


# ------------------------------------------------------------------ Monte Carlo infinity
def test_montecarlo_account_at_small_delta_says_how_many_samples_it_needs():
    res = invoke(["account", "--strategy", "bsr", "--bands", "2", "--sampling", "b-min-sep", "--min-sep", "2",
                  "--sampling-prob", "0.05", "--steps", "16", "--noise-multiplier", "1", "--delta", "1e-6",
                  "--method", "montecarlo"])
    line = one_line_error(res, "--samples 100,000", "--delta 1e-06")
    from dpmf.accounting.montecarlo.accountant import samples_to_estimate

    assert f"--samples {samples_to_estimate(1e-6):,}" in line


def test_montecarlo_report_with_too_few_samples_names_the_samples_needed():
    from dpmf.accounting.montecarlo import account_montecarlo
    from dpmf.accounting.montecarlo.accountant import samples_to_estimate
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity

    def gauss(strategy, scheme, sigma, m, rng, *, direction="remove"):
        return rng.normal(0.0, 1.0, m)

    r = account_montecarlo(Identity(1), PoissonSampling(1.0, 1), 1.0, 1e-4, num_samples=1000, seed=0, sampler=gauss)
    need = samples_to_estimate(1e-4)
    assert r.epsilon == math.inf and r.diagnostics["samples_needed_to_estimate"] == need
    assert f"at least {need:,} samples per direction" in r.diagnostics["warning"]


def test_montecarlo_run_help_example_gives_a_finite_epsilon(tmp_path, monkeypatch):
    from dpmf.cli import montecarlo

    monkeypatch.chdir(tmp_path)
    doc = " ".join(montecarlo.run.__doc__.split())
    example = doc[doc.index("Example: dpmf montecarlo run") + len("Example: dpmf "):]
    args = shlex.split(example)
    res = invoke([*args, "--seed", "1", "--json"])
    assert res.exit_code == 0, res.output
    assert math.isfinite(json.loads(res.stdout)["epsilon"])


# ------------------------------------------------------------------ resume hints that work
MC_RUN = ["montecarlo", "run", "--strategy", "bsr", "--bands", "2", "--steps", "16", "--sampling", "b-min-sep",
          "--min-sep", "2", "--participation-rate", "0.05", "--noise-multiplier", "1", "--delta", "1e-2",
          "--confidence", "0.95", "--samples", "3000", "--chunk-size", "1000", "--seed", "7"]


def test_interrupted_montecarlo_run_resumes_with_the_printed_command(tmp_path, monkeypatch):
    import dpmf.accounting.montecarlo.run as mcrun

    full = invoke([*MC_RUN, "--json"])
    assert full.exit_code == 0, full.output
    real_run = mcrun.MonteCarloRun.run

    def interrupted(self, **kwargs):
        real_run(self, max_chunks=2, **{k: v for k, v in kwargs.items() if k != "max_chunks"})
        raise KeyboardInterrupt

    monkeypatch.setattr(mcrun.MonteCarloRun, "run", interrupted)
    monkeypatch.chdir(tmp_path)
    res = invoke([*MC_RUN, "--checkpoint", "ck.npz"])
    assert res.exit_code == 130
    hint = res.stderr.strip().splitlines()[-1]
    command = hint.split("resume with: ", 1)[1]
    monkeypatch.setattr(mcrun.MonteCarloRun, "run", real_run)
    args = shlex.split(command)
    assert args[:3] == ["dpmf", "montecarlo", "resume"]
    resumed = invoke([*args[1:], "--json"])  # exactly what was printed (no --delta needed)
    assert resumed.exit_code == 0, resumed.output
    a, b = json.loads(full.stdout), json.loads(resumed.stdout)
    assert b["delta"] == 1e-2 and b["diagnostics"]["confidence"] == 0.95
    assert b["epsilon_by_direction"] == a["epsilon_by_direction"]  # same counts as the uninterrupted run
    report = invoke(["montecarlo", "report", tmp_path / "ck.npz", "--json"])
    assert report.exit_code == 0 and json.loads(report.stdout)["epsilon"] == b["epsilon"]


def test_interrupted_mmcc_account_says_how_to_resume(tmp_path, monkeypatch):
    import dpmf.accounting

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dpmf.accounting, "account", interrupted)
    args = ["account", "--strategy", "tree", "--sampling-prob", "0.02", "--steps", "64", "--noise-multiplier", "10",
            "--delta", "1e-6"]
    res = invoke([*args, "--cache-dir", tmp_path / "rows"])
    assert res.exit_code == 130
    assert "run the same command again" in res.stderr and str(tmp_path / "rows") in res.stderr
    res = invoke(args)
    assert res.exit_code == 130 and "add --cache-dir" in res.stderr


# ------------------------------------------------------------------ silent traps
@pytest.mark.parametrize(
    "extra,flag",
    [
        (["--epochs", "3"], "--epochs"),
        (["--min-sep", "4"], "--min-sep"),
        (["--bands", "4"], "--bands"),
        (["--warm-start"], "--warm-start"),
        (["--max-batch-size", "10"], "--max-batch-size"),
    ],
)
def test_options_the_configuration_ignores_are_refused(extra, flag):
    res = invoke(["account", "--sampling", "poisson", "--sampling-prob", "0.01", "--steps", "30",
                  "--noise-multiplier", "1", "--delta", "1e-6", *extra])
    one_line_error(res, f"{flag} is not used with --sampling poisson")


def test_epochs_of_an_optimal_strategy_are_used_not_refused(monkeypatch):
    import dpmf.accounting

    def stub(*args, **kwargs):
        raise DPMFError("stub reached")

    monkeypatch.setattr(dpmf.accounting, "account", stub)
    res = invoke(["account", "--strategy", "optimal", "--epochs", "2", "--sampling", "poisson", "--sampling-prob",
                  "0.01", "--steps", "16", "--noise-multiplier", "1", "--delta", "1e-6"])
    one_line_error(res, "stub reached")


def test_separation_longer_than_the_run_is_never_silent():
    from dpmf.errors import DPMFWarning
    from dpmf.sampling import CyclicPoissonSampling, MinSepSampling

    with pytest.warns(DPMFWarning, match=r"min_sep=100 is longer than the run \(steps=64\)"):
        MinSepSampling(0.02, 64, 100)  # valid (each example joins at most once), but said out loud
    with pytest.warns(DPMFWarning, match=r"cycle_length=100 is longer than the run .* some groups never"):
        CyclicPoissonSampling(0.02, 64, 100)
    for sampling in ("b-min-sep", "cyclic-poisson"):
        res = invoke(["account", "--sampling", sampling, "--min-sep", "100", "--sampling-prob", "0.02", "--steps",
                      "64", "--noise-multiplier", "1", "--delta", "1e-6"])
        one_line_error(res, "--min-sep 100 is longer than the run (--steps 64)")


def test_b_min_sep_start_is_the_same_in_every_command(monkeypatch):
    args = ["--strategy", "bsr", "--bands", "2", "--steps", "16", "--sampling", "b-min-sep", "--min-sep", "2",
            "--sampling-prob", "0.1", "--noise-multiplier", "1", "--delta", "1e-2", "--samples", "20000",
            "--seed", "5", "--json"]
    a = invoke(["account", *args, "--method", "montecarlo"])
    b = invoke(["montecarlo", "run", *args])
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    ra, rb = json.loads(a.stdout), json.loads(b.stdout)
    assert ra["scheme"]["warm_start"] is False and rb["scheme"]["warm_start"] is False
    assert ra["epsilon_by_direction"] == rb["epsilon_by_direction"]
    warm = invoke(["account", *args, "--method", "montecarlo", "--warm-start"])
    assert warm.exit_code == 0 and json.loads(warm.stdout)["scheme"]["warm_start"] is True


# ------------------------------------------------------------------ messages and output
@pytest.mark.parametrize(
    "message,expected",
    [
        ("cache_dir '/x' cannot be created: Not a directory", "--cache-dir '/x' cannot be created"),
        ("workers must be an integer >= 1 or None, got 0", "--workers must be an integer"),
        ("chunk_size must be an integer >= 1, got 0", "--chunk-size must be"),
        ("MMCC: sampling_prob must be in (0, 1]", "MMCC: --sampling-prob must be"),
        ("option 'num_samples' is not used when accounting", "option '--samples' is not used"),
        ("epsilon must be > 0; the delta of the run", "--epsilon must be > 0; the delta of the run"),
    ],
)
def test_one_place_maps_library_names_to_flags(message, expected):
    from dpmf.cli.console import cli_message

    assert expected in cli_message(message)


def test_cache_dir_and_workers_errors_name_the_flags(tmp_path):
    (tmp_path / "file").write_text("x")
    base = ["account", "--strategy", "tree", "--sampling-prob", "0.1", "--steps", "8", "--noise-multiplier", "10",
            "--delta", "1e-5"]
    one_line_error(invoke([*base, "--cache-dir", tmp_path / "file" / "rows"]), "error: --cache-dir")
    one_line_error(invoke([*base, "--workers", "0"]), "error: --workers")


def _plan_rows():
    from dpmf.planner import PlanRow

    return [
        PlanRow("banded-toeplitz-64", "cyclic-poisson", "mmcc", 4.27601, 1.99999, True, 14.04, 0.02807, 1.0),
        PlanRow("optimal-mf", "fixed-order", "unamplified", 12345.678, 2.0, True, 1444.25, 0.0285, 1.0),
        PlanRow("banded-toeplitz-64", "b-min-sep", "montecarlo", 0.0001234, 1.98765, False, 14.45, 2.89e-5, 1.0),
        PlanRow("identity", "balls-in-bins", "allocation", 1.96245, 1.99941, True, 31.06, 0.06211, 1.0),
    ]


def test_plan_table_fits_80_columns_with_whole_numbers():
    from rich.console import Console

    from dpmf.cli.main import plan_table
    from dpmf.planner import TrainingRun

    rows = _plan_rows()
    console = Console(width=80, record=True, color_system=None)
    console.print(plan_table(TrainingRun(), rows))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for r in rows:  # sigma, epsilon and the accountant are never cut
        for value in (f"{r.noise_multiplier:.4g}", f"{r.epsilon:.4g}", f"{r.prefix_sum_rmse:.4g}", r.method):
            assert re.search(rf"(^|\s){re.escape(value)}(\s|$)", text, flags=re.M), (value, text)
    assert "ESTIMATE" in text and "…" not in text


def test_plan_figure_keeps_every_label_inside():
    import matplotlib.pyplot as plt

    from dpmf.planner import TrainingRun, plan_figure

    fig = plan_figure(TrainingRun(), _plan_rows())
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        box = fig.bbox
        texts = [t for ax in fig.axes for t in (ax.xaxis.label, ax.title, *ax.get_yticklabels())]
        lo, hi = fig.axes[0].get_xlim()
        texts += [t for t in fig.axes[0].get_xticklabels() if lo <= t.get_position()[0] <= hi]
        for t in texts:
            if t.get_text():
                e = t.get_window_extent(renderer)
                assert e.x0 >= box.x0 - 1 and e.x1 <= box.x1 + 1 and e.y0 >= box.y0 - 1 and e.y1 <= box.y1 + 1, t
    finally:
        plt.close(fig)


@pytest.mark.parametrize("command", [[], ["account"], ["plan"], ["montecarlo", "run"], ["strategy", "show"]])
def test_help_shows_no_bool_type_for_flags(command):
    res = invoke([*command, "--help"])
    assert res.exit_code == 0 and "<bool>" not in res.stdout
    assert "--help" in res.stdout


def test_strategy_show_names_the_gram_condition_not_the_signs_of_c(tmp_path):
    from dpmf.strategies import catalog

    catalog.save(catalog.build("optimal", 16, epochs=2), tmp_path / "opt.npz")
    res = invoke(["strategy", "show", tmp_path / "opt.npz", "--participation", "fixed-epoch", "--epochs", "2",
                  "--json"])
    data = json.loads(res.stdout)
    assert data["strategy"]["nonnegative"] is False
    assert "C^T C >= 0" in data["sensitivity_method"]


def test_strategy_build_matrix_takes_its_size_from_the_matrix(tmp_path):
    np.save(tmp_path / "c.npy", np.tril(np.ones((6, 6))))
    res = invoke(["strategy", "build", "matrix", "--matrix", tmp_path / "c.npy", "--out", tmp_path / "c.npz"])
    assert res.exit_code == 0, res.output
    assert "for 6 steps" in res.stdout
    one_line_error(invoke(["strategy", "build", "matrix", "--matrix", tmp_path / "c.npy", "--steps", "5",
                           "--out", tmp_path / "d.npz"]), "--steps 5 does not match")
    one_line_error(invoke(["strategy", "build", "tree", "--out", tmp_path / "e.npz"]), "--steps is required")


def test_account_with_a_strategy_file_takes_its_steps(files):
    res = invoke(["account", "--strategy", files / "tree.npz", "--sampling-prob", "0.1", "--noise-multiplier", "10",
                  "--delta", "1e-5", "--method", "unamplified", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["scheme"]["steps"] == 8


def test_import_dpmf_loads_no_heavy_dependency():
    import subprocess
    import sys

    code = ("import sys, dpmf; heavy = {'numpy', 'scipy', 'dp_accounting', 'numba', 'matplotlib', 'torch', 'typer'}; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    code = ("import dpmf; from dpmf.privacy import gdp_mu; from dpmf.strategies import Identity; "
            "print(dpmf.account.__module__, dpmf.PrivacyReport.__name__, dpmf.sampling.PoissonSampling.name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["dpmf.accounting.dispatch", "PrivacyReport", "poisson"]


def test_readme_links_only_to_files_in_the_repository():
    text = README.read_text()
    assert "../shared" not in text
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith(("http://", "https://")):
            assert (README.parent / target).exists(), target
