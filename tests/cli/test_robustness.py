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
from cli_checks import one_line_error
from dpmf.cli.main import app
from dpmf.errors import DPMFError, InvalidParameterError

runner = CliRunner()
README = Path(__file__).resolve().parents[2] / "README.md"


def invoke(args):
    return runner.invoke(app, [str(a) for a in args])


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
def test_a_billion_steps_is_refused_at_once_with_the_estimate(strategy, evaluations):
    res = invoke(["account", "--strategy", strategy, "--steps", "1000000000", "--sampling-prob", "0.01",
                  "--noise-multiplier", "1", "--delta", "1e-6"])
    line = one_line_error(res, "rough estimate", "--force")
    assert re.search(r"(GiB|min|h|days|years)", line)
    assert evaluations == []  # at once: refused before any accountant ran


def test_sampling_probability_one_with_mmcc_is_refused_with_the_estimate():
    # (the tree at this size now runs in seconds on a coarser grid: memory coarsens its rows, 2026-12-02)
    res = invoke(["account", "--strategy", "sqrt-toeplitz", "--sampling-prob", "1", "--steps", "1000",
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
    """The ``dpmf`` commands of the README's and the overview page's bash blocks (the README's long
    command list moved to docs/overview.md)."""
    section = README.read_text() + (README.parent / "docs" / "overview.md").read_text()
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


def test_cost_estimate_grows_with_steps_and_refuses_with_a_clear_message(monkeypatch):
    import dpmf.resources
    from dpmf.accounting.cost import CostEstimate, accounting_cost, check_cost, plan_cost, strategy_build_cost
    from dpmf.errors import CostLimitError
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import BinaryTree, Identity

    # (the memory available decides whether MMCC coarsens a row's grid, which is faster: on a machine
    # with less free memory tree 64 at sigma 1 is cheaper than at sigma 10, as measured; pinned here)
    monkeypatch.setattr(dpmf.resources, "available_memory", lambda: 64 * 2**30)
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
    # the API's up-front memory guard (issue 24) refuses first; past it (force=True), MMCC's own
    with pytest.raises(DPMFError, match="refusing to start: .* memory .* force=True"):
        dpmf.account(BinaryTree(10**6), PoissonSampling(0.01, 10**6), 1.0, 1e-6, method="mmcc")
    with pytest.raises(DPMFError, match="MMCC row .* needs a grid step above 700"):
        dpmf.account(BinaryTree(10**6), PoissonSampling(0.01, 10**6), 1.0, 1e-6, method="mmcc", force=True)


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
def test_max_batch_size_without_dataset_size_is_refused():
    """Truncated Poisson is accounted only with the dataset size; without it the CLI would fall back to
    the unamplified bound silently."""
    res = invoke(["account", "--sampling", "poisson", "--sampling-prob", "0.01", "--steps", "30",
                  "--noise-multiplier", "1", "--delta", "1e-6", "--max-batch-size", "10"])
    one_line_error(res, "--max-batch-size with --sampling poisson needs --dataset-size")


@pytest.mark.parametrize(
    "extra,flag",
    [
        (["--epochs", "3"], "--epochs"),
        (["--min-sep", "4"], "--min-sep"),
        (["--bands", "4"], "--bands"),
        (["--warm-start"], "--warm-start"),
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


# ------------------------------------------------------------------ issue 24: no runaway work, no raw exception
@pytest.fixture
def pools(monkeypatch):
    """Every process pool dpmf creates is recorded (the list of ``max_workers`` asked for) and runs
    its jobs in that many threads instead (same results, no processes); the machine has 2 CPUs."""
    import concurrent.futures

    import importlib

    import dpmf.accounting.mmcc.rows as rows
    import dpmf.resources as resources

    importlib.import_module("dp_accounting.pld.privacy_loss_distribution")  # (once here, not by racing threads)
    started: list = []

    class RecordingPool(concurrent.futures.ThreadPoolExecutor):
        def __init__(self, max_workers=None, mp_context=None, initializer=None, initargs=()):
            started.append(max_workers)
            super().__init__(max_workers=max_workers, initializer=initializer, initargs=initargs)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", RecordingPool)  # (imported at call time)
    monkeypatch.setattr(rows, "ProcessPoolExecutor", RecordingPool)
    monkeypatch.setattr(resources, "available_cpus", lambda: 2)
    return started


#: A hang guard, not a speed test (speed is measured in benchmarks/): the bad inputs below used to
#: run for good (minutes, then on); a machine loaded by other jobs must still pass.
HANG_GUARD_S = 600.0


def timed_invoke(args):
    """``invoke``, failing if it ran past :data:`HANG_GUARD_S` (the bad inputs used to hang)."""
    start = time.perf_counter()
    res = invoke(args)
    assert time.perf_counter() - start < HANG_GUARD_S, args
    return res


_MMCC = ["--strategy", "tree", "--steps", "8", "--sampling-prob", "0.1", "--delta", "1e-6", "--method", "mmcc"]
_MC = ["--strategy", "bsr", "--bands", "2", "--steps", "16", "--sampling", "b-min-sep", "--min-sep", "2",
       "--sampling-prob", "0.1", "--noise-multiplier", "1", "--delta", "1e-2", "--samples", "20000",
       "--chunk-size", "10000", "--seed", "5"]


@pytest.mark.parametrize(
    "args",
    [
        ["account", *_MMCC, "--noise-multiplier", "3"],
        ["calibrate", *_MMCC, "--epsilon", "5"],
        ["montecarlo", "run", *_MC],
    ],
    ids=["account-mmcc", "calibrate-mmcc", "montecarlo-run"],
)
def test_workers_100000_starts_at_most_one_process_per_cpu_with_a_note(pools, args):
    """Issue 24 item 1: --workers 100000 forked ~1,500 processes in a minute; now at most the CPUs."""
    res = timed_invoke([*args, "--workers", "100000"])
    assert res.exit_code == 0, res.output
    assert pools and all(1 <= k <= 2 for k in pools), pools  # 2 CPUs, 100,000 asked for
    notes = [line for line in res.stderr.splitlines() if line.startswith("note: --workers")]
    assert notes == [
        "note: --workers 100,000 is more than the 2 CPUs this process can use; starting at most 2 worker "
        "processes (and never more than there are tasks)"
    ], res.stderr


def test_workers_never_exceed_the_tasks_in_resume_verify_and_plan(pools, monkeypatch, tmp_path):
    import concurrent.futures

    import dpmf.resources as resources
    from dpmf.accounting.montecarlo.run import MonteCarloRun
    from dpmf.planner import TrainingRun, candidates, plan
    from dpmf.sampling import MinSepSampling, PoissonSampling
    from dpmf.strategies import BinaryTree, catalog

    monkeypatch.setattr(resources, "available_cpus", lambda: 64)  # the tasks are the cap now
    checkpoint = tmp_path / "mc.npz"
    MonteCarloRun(catalog.build("bsr", 16, bands=2), MinSepSampling(0.1, 16, 2), 1.0, 20000, seed=5,
                  chunk_size=10000).save(checkpoint)
    res = timed_invoke(["montecarlo", "resume", checkpoint, "--delta", "1e-2", "--workers", "100000"])
    assert res.exit_code == 0, res.output
    assert pools == [4], pools  # 2 chunks x 2 directions: 4 processes, not 64 or 100,000

    pools.clear()
    report = dpmf.account(BinaryTree(8), PoissonSampling(0.1, 8), 3.0, 1e-6, method="mmcc", heuristic=False,
                          workers=100_000)
    assert pools and max(pools) <= 15, pools  # at most one per row (the tree's 15), never 64
    (tmp_path / "r.json").write_text(report.to_json())
    pools.clear()
    res = timed_invoke(["verify", tmp_path / "r.json", "--workers", "100000"])
    assert res.exit_code in (0, 4), res.output  # the claim holds
    assert pools and max(pools) <= 15, pools

    run = TrainingRun(200, 20, 2, 1.0, 1e-6)

    class Stop(Exception):
        pass

    def record_and_stop(max_workers=None, **kwargs):
        pools.append(max_workers)
        raise Stop

    pools.clear()
    monkeypatch.setattr(resources, "available_cpus", lambda: 10**6)
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", record_and_stop)
    with pytest.raises(Stop):
        plan(run, workers=100_000, prune=False)
    assert pools == [len(candidates(run))]  # one process per candidate at most


@pytest.mark.parametrize(
    "args,needle",
    [
        (["account", "--steps", "100", "--sampling-prob", "0.01", "--noise-multiplier", "1", "--delta", "1e-6",
          "--method", "pld", "--workers", "2"], "option '--workers' is not used when accounting with pld"),
        (["calibrate", "--steps", "100", "--sampling-prob", "0.01", "--epsilon", "1", "--delta", "1e-6",
          "--method", "unamplified", "--workers", "2"], "option '--workers' is not used when calibrating with unamplified"),
        (["account", "--steps", "100", "--sampling-prob", "0.01", "--noise-multiplier", "1", "--delta", "1e-6",
          "--method", "pld", "--workers", "100000"], "option '--workers' is not used when accounting with pld"),
    ],
)
def test_workers_with_a_method_that_does_not_use_them_is_an_error(pools, args, needle):
    res = timed_invoke(args)
    one_line_error(res, needle)
    assert "note:" not in res.stderr and pools == []  # the error alone, and nothing started


def test_verify_refuses_workers_for_a_report_that_runs_in_one_process(pools, tmp_path):
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity

    (tmp_path / "pld.json").write_text(dpmf.account(Identity(100), PoissonSampling(0.01, 100), 1.0, 1e-6).to_json())
    one_line_error(timed_invoke(["verify", tmp_path / "pld.json", "--workers", "2"]),
                   "--workers) 2 is not used to recompute a report of method 'pld'")
    assert pools == []


def test_calibrate_a_huge_epsilon_answers_fast_and_soundly():
    """Issue 24 item 2: calibrate --epsilon 1e6 ran for minutes at a shrinking noise, silently."""
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity

    res = timed_invoke(["calibrate", "--steps", "1000", "--sampling-prob", "0.01", "--epsilon", "1e6", "--delta",
                        "1e-6", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["target_epsilon"] == 1e6 and d["epsilon"] <= 1e6
    assert d["evaluations"] <= 20  # a bounded search (7 measured), not minutes at a shrinking noise
    # sound: recomputed from scratch at the noise it released, its own method gives epsilon <= target
    again = dpmf.account(Identity(1000), PoissonSampling(0.01, 1000), d["noise_multiplier"], 1e-6, method=d["method"])
    assert again.epsilon <= 1e6
    # issue 40 item 2: it lands on the target (was: stopped at the pld grid's floor, far below it), on a
    # coarser grid that the report names
    assert d["epsilon"] >= 0.99e6 and d["method"] == "pld"
    assert d["diagnostics"]["discretization"] > d["diagnostics"]["discretization_requested"] == 1e-4


@pytest.fixture
def small_pld_grid(monkeypatch):
    """A 4x smaller one-step PLD grid limit; returns the smallest noise the pld accountant then
    evaluates on the requested grid (1e-4) at q = 0.01 (below it, a coarser grid)."""
    from dpmf.privacy import gaussian_plds

    monkeypatch.setattr(gaussian_plds, "MAX_STEP_GRID_POINTS", 2**18)
    return gaussian_plds._smallest_fitting_noise(0.01, 1.0, 1e-4, 2**18)


@pytest.mark.parametrize(
    "args",
    [
        ["--steps", "1000", "--sampling-prob", "0.01"],
        ["--strategy", "tree", "--steps", "64", "--sampling-prob", "0.05"],
        ["--sampling", "cyclic-poisson", "--min-sep", "4", "--strategy", "banded-toeplitz", "--bands", "4", "--steps",
         "64", "--sampling-prob", "0.05"],
    ],
    ids=["identity", "tree", "cyclic"],
)
def test_calibrate_at_a_delta_every_noise_meets_is_refused_at_once(args):
    """--delta 0.999999: with probability (1 - q)^T an example joins no batch, so epsilon is 0 at any
    noise; the search used to shrink the noise for minutes looking for where it stops being 0."""
    line = one_line_error(timed_invoke(["calibrate", *args, "--epsilon", "1", "--delta", "0.999999"]),
                          "--delta 0.999999 needs no noise at all", "use delta <")
    bound = float(line.split("use delta < ")[1].split()[0])
    from dpmf.accounting.dispatch import _check_delta_needs_noise
    from dpmf.sampling import PoissonSampling

    if args[1] == "1000":  # the bound is 1 - (1 - 0.01)^1000: refused at it, not below it
        assert bound == pytest.approx(1 - 0.99**1000, rel=1e-5)
        with pytest.raises(InvalidParameterError, match="needs no noise"):
            _check_delta_needs_noise(PoissonSampling(0.01, 1000), (1 - 0.99**1000) * (1 + 1e-9))
        _check_delta_needs_noise(PoissonSampling(0.01, 1000), (1 - 0.99**1000) * (1 - 1e-9))


@pytest.mark.parametrize("epsilon,delta", [(1e6, 1e-6), (1e3, 0.05)])
def test_calibration_to_a_huge_target_lands_on_it_on_a_coarser_grid(small_pld_grid, epsilon, delta):
    """Issue 40 items 1-2: below the requested grid's limit the pld accountant accounts on a coarser
    grid (was: NoiseTooSmallError, and calibration stopped there, far below the target)."""
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity

    cal = dpmf.calibrate(Identity(10), PoissonSampling(0.01, 10), epsilon, delta, method="pld")
    assert cal.evaluations <= 20  # a bounded search (10 and 8 measured), on grids it can afford
    assert cal.noise_multiplier < small_pld_grid
    assert (1 - 1e-3) * epsilon <= cal.report.epsilon <= epsilon
    assert "at_smallest_noise" not in cal.report.diagnostics
    assert "a finer grid" in cal.report.diagnostics["discretization_note"]
    res = timed_invoke(["calibrate", "--steps", "10", "--sampling-prob", "0.01", "--epsilon", str(epsilon), "--delta",
                        str(delta), "--method", "pld"])
    assert res.exit_code == 0, res.output
    assert f"noise multiplier {cal.noise_multiplier:.6g} gives epsilon" in res.stdout
    assert "note: accounted on a coarser privacy-loss grid" in res.stdout


def test_calibration_cost_estimate_follows_the_search_and_refuses_over_ten_minutes():
    from dpmf.accounting.cost import accounting_cost
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity

    def cost(epsilon, delta):
        return accounting_cost(Identity(1000), PoissonSampling(0.01, 1000), calibrate=True, target_epsilon=epsilon,
                               delta=delta).seconds

    normal = cost(1.0, 1e-6)
    # the search goes down to small noise: more evaluations, never cheaper (since the adaptive
    # discretization one evaluation there is about as fast as at sigma = 1: 0.3-0.9 s CPU measured at
    # sigma 0.1-0.03, benchmarks/README.md "MMCC and PLD cost model")
    assert cost(1e6, 1e-6) > 1.5 * normal and cost(1.0, 0.5) > 1.5 * normal
    assert cost(1e6, 1e-6) < 600  # ... but never below what the accountant evaluates (a bounded grid)
    # (the tree at 4096 steps calibrates in ~25 s since memory coarsens its rows' grids at small noise)
    one_line_error(timed_invoke(["calibrate", "--strategy", "sqrt-toeplitz", "--steps", "2000", "--sampling-prob", "0.01",
                                 "--epsilon", "1", "--delta", "1e-6"]), "refusing to start", "rough estimate", "--force")


def test_cost_estimate_covers_what_auto_runs_and_the_markov_members():
    """The estimate lists every amplified method ``auto`` may run (``valid_methods``; was: fresh slots
    and k of t with a correlated C counted as unamplified only), and ``allocation_pld`` for a correlated
    C grows with the slots per epoch while its Markov members run (not for C = I, k of t, or above
    their slot limit)."""
    from dpmf.accounting.cost import _methods, accounting_cost
    from dpmf.accounting.dispatch import valid_methods
    from dpmf.sampling import BallsInBinsSampling
    from dpmf.strategies import Identity, bsr

    schemes = [BallsInBinsSampling(2, 128), BallsInBinsSampling(2, 128, fresh_slots=True),
               BallsInBinsSampling(2, 128, num_selected=2)]
    for strategy in (bsr(128, 4), Identity(128)):
        for scheme in schemes:
            valid = {m for m, why in valid_methods(strategy, scheme).items() if why is None} - {"montecarlo"}
            assert valid <= set(_methods(strategy, scheme, "auto")), (strategy, scheme.describe())

    def pld_secs(strategy, scheme, **kw):
        return dict((m, s) for m, s, _ in accounting_cost(strategy, scheme, 2.0, method="allocation_pld", **kw).parts)[
            "allocation_pld"]

    fresh = [pld_secs(bsr(2 * b, 4), BallsInBinsSampling(2, 2 * b, fresh_slots=True)) for b in (32, 64, 128)]
    # (32 slots per epoch also run the band's moving average, 8 tables: bsr(64, 4) over 2 fresh epochs of 32
    # measured 9.7 CPU-s at sigma 2, bsr(128, 4) over 2 of 64 without it 5.0 CPU-s)
    assert fresh[1] < fresh[2]
    base = pld_secs(Identity(256), BallsInBinsSampling(2, 256, fresh_slots=True))
    assert base == pld_secs(bsr(256, 4), BallsInBinsSampling(2, 256, num_selected=2)) < fresh[0]
    assert pld_secs(bsr(1024, 4), BallsInBinsSampling(2, 1024)) == base  # 512 slots per epoch: no members
    # a calibration with the members takes several evaluations' worth: with fresh slots (the first noise
    # whole, then one or two composed members) 5; with reused slots, steered by cheaper member sets, 4.7
    # (cost.py's _MARKOV_CALIBRATION_EVALS, fit on 8 fresh pairs and bench_allocation_calibration_grid.py's 19)
    assert pld_secs(bsr(128, 4), BallsInBinsSampling(2, 128, fresh_slots=True), calibrate=True) >= 4 * fresh[1]
    reused = pld_secs(bsr(64, 4), BallsInBinsSampling(2, 64))
    assert 4 * reused <= pld_secs(bsr(64, 4), BallsInBinsSampling(2, 64), calibrate=True) <= 6 * reused


def test_account_api_refuses_what_cannot_fit_in_memory(monkeypatch, evaluations, peak_memory):
    """Issue 24 item 2: the CLI's memory guard at the API entry point (a billion DP-SGD steps)."""
    import dpmf.resources as resources
    from dpmf.errors import CostLimitError
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity

    monkeypatch.setattr(resources, "available_memory", lambda: 16.0 * 2**30)
    with peak_memory() as peak, pytest.raises(CostLimitError, match=r"refusing to start: .* GiB of memory .* 16 GiB "
                                                                  r"available.*force=True"):
        dpmf.account(Identity(10**9), PoissonSampling(0.01, 10**9), 1.0, 1e-6)
    # at once: no accountant ran, and nothing big was allocated (deciding which methods apply used to
    # build 8 GB arrays first)
    assert evaluations == [] and peak.bytes < 2**28, peak.bytes
    # the guard lets what fits through, with the same answer
    assert dpmf.account(Identity(1000), PoissonSampling(0.01, 1000), 1.0, 1e-6).epsilon == pytest.approx(2.125, abs=1e-3)


@pytest.mark.parametrize("sigma", ["1e-300", "1e-10"])
def test_account_noise_no_grid_represents_names_the_valid_range(sigma):
    """Issue 24 item 3 (1e-300 was a ZeroDivisionError, 1e-2 ran for more than 5 minutes); issue 40
    item 1: only a noise no grid can represent (a grid step above 700 at 65,536 points) is refused."""
    from dpmf.errors import NoiseTooSmallError
    from dpmf.privacy.gaussian_plds import MAX_STEP_GRID_POINTS, _smallest_representable_noise
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity

    edge = _smallest_representable_noise(0.01, 1.0, 1e-4, MAX_STEP_GRID_POINTS)
    line = one_line_error(timed_invoke(["account", "--steps", "10", "--sampling-prob", "0.01", "--noise-multiplier",
                                        sigma, "--delta", "1e-6"]),
                          f"--noise-multiplier {float(sigma)!r} is too small for any privacy-loss grid",
                          f"use --noise-multiplier >= {edge:.4g}")
    assert "Traceback" not in line
    start = time.perf_counter()
    with pytest.raises(NoiseTooSmallError) as exc:
        dpmf.account(Identity(10), PoissonSampling(0.01, 10), float(sigma), 1e-6)
    assert time.perf_counter() - start < HANG_GUARD_S
    assert exc.value.smallest == edge and "\n" not in str(exc.value)
    at_edge = dpmf.account(Identity(10), PoissonSampling(0.01, 10), edge, 1e-6)  # the edge itself answers
    assert math.isfinite(at_edge.epsilon) and at_edge.diagnostics["discretization"] <= 700
    with pytest.raises(NoiseTooSmallError):
        dpmf.account(Identity(10), PoissonSampling(0.01, 10), 0.99 * edge, 1e-6)


def test_account_at_small_noise_answers_on_a_coarser_grid_and_says_so():
    """Issue 40 item 1: sigma 0.1 (q = 0.05, 100 steps) was refused ("use >= 0.127"); dp_accounting
    gives 793.65 (PLD, discretization 1e-2, computed here from dp_accounting alone)."""
    from dp_accounting import dp_event, pld as dpa_pld

    acc = dpa_pld.PLDAccountant(value_discretization_interval=1e-2)
    acc.compose(dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(0.1)), 100)
    peer = acc.get_epsilon(1e-5)
    res = timed_invoke(["account", "--sampling-prob", "0.05", "--steps", "100", "--noise-multiplier", "0.1",
                        "--delta", "1e-5", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["method"] == "pld" and d["diagnostics"]["discretization"] > 1e-4
    assert d["epsilon"] <= peer * (1 + 1e-4)  # (a finer grid than the peer's: at most as large)
    # above epsilon ~700 dp_accounting's reading underflows (e^-loss = 0) and returns the loss where the mass
    # above reaches delta; the same PMF read without underflow (dpmf's reading, tested against 40 digits in
    # tests/privacy/test_pld_large_epsilon.py) gives 792.66: ours must not be far below that
    from dpmf.privacy.pld import PrivacyLossDistribution

    peer_pmf_epsilon = PrivacyLossDistribution.from_dp_accounting(acc._pld).epsilon(1e-5)
    assert peer_pmf_epsilon < peer and peer_pmf_epsilon * (1 - 1e-3) <= d["epsilon"]
    text = timed_invoke(["account", "--sampling-prob", "0.05", "--steps", "100", "--noise-multiplier", "0.1",
                         "--delta", "1e-5"]).stdout
    assert "note: accounted on a coarser privacy-loss grid" in text.replace("\n", " ")


def test_the_requested_grid_is_used_up_to_its_limit_and_a_coarser_one_below(small_pld_grid):
    """The edge of the requested grid is evaluated on it (unchanged numbers); just below, on a
    power-of-two multiple of it, and the bound there is at least the edge's (monotone, pessimistic)."""
    from dpmf.privacy.gaussian_plds import step_grid_points
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity

    assert step_grid_points(small_pld_grid, 0.01) <= 2**18 < step_grid_points(0.99 * small_pld_grid, 0.01)
    at_edge = dpmf.account(Identity(10), PoissonSampling(0.01, 10), small_pld_grid, 1e-6)
    assert at_edge.diagnostics["discretization"] == 1e-4 and "discretization_note" not in at_edge.diagnostics
    assert at_edge.epsilon >= dpmf.account(Identity(10), PoissonSampling(0.01, 10), 2 * small_pld_grid, 1e-6).epsilon
    below = dpmf.account(Identity(10), PoissonSampling(0.01, 10), 0.99 * small_pld_grid, 1e-6)
    ratio = below.diagnostics["discretization"] / 1e-4
    assert ratio > 1 and ratio == 2 ** round(math.log2(ratio))
    assert below.epsilon >= at_edge.epsilon


def _extreme_cases():
    from dpmf.sampling import (BallsInBinsSampling, CyclicPoissonSampling, FixedOrderSampling, MinSepSampling,
                               PoissonSampling)
    from dpmf.strategies import BinaryTree, Identity, catalog

    return [
        ("pld", Identity(10), PoissonSampling(0.01, 10), {}),
        ("mmcc", BinaryTree(8), PoissonSampling(0.1, 8), {}),
        ("auto", BinaryTree(8), CyclicPoissonSampling(0.1, 8, 2), {}),
        ("unamplified", BinaryTree(8), FixedOrderSampling(1, 8), {}),
        ("allocation_pld", Identity(8), BallsInBinsSampling(1, 8), {}),
        ("allocation", catalog.build("banded-toeplitz", 8, bands=2), BallsInBinsSampling(1, 8), {}),
        ("montecarlo", catalog.build("bsr", 16, bands=2), MinSepSampling(0.1, 16, 2), {"num_samples": 20000, "seed": 1}),
    ]


@pytest.mark.parametrize("case", range(7), ids=[c[0] for c in [("pld",), ("mmcc",), ("auto-cyclic",), ("unamplified",),
                                                               ("allocation_pld",), ("allocation",), ("montecarlo",)]])
def test_every_accountant_at_extreme_noise_gives_a_dpmf_error_or_a_sound_answer(case):
    """1e300 was an OverflowError and 1e-300 a ZeroDivisionError deep in the accountants."""
    from dpmf.accounting.dispatch import NOISE_CEILING
    from dpmf.errors import DPMFError

    method, strategy, scheme, opts = _extreme_cases()[case]
    delta = 1e-2 if method == "montecarlo" else 1e-6
    start = time.perf_counter()
    with pytest.raises(DPMFError) as exc:
        dpmf.account(strategy, scheme, 1e-300, delta, method=method, **opts)
    assert "\n" not in str(exc.value) and "noise" in str(exc.value)
    huge = dpmf.account(strategy, scheme, 1e300, delta, method=method, **opts)
    at_ceiling = dpmf.account(strategy, scheme, NOISE_CEILING, delta, method=method, **opts)
    assert time.perf_counter() - start < HANG_GUARD_S
    # sound: more noise is post-processing, so the report at the ceiling bounds it (and says so)
    assert huge.noise_multiplier == 1e300 and huge.epsilon == at_ceiling.epsilon < 1e-3
    assert huge.diagnostics["noise_multiplier_evaluated"] == NOISE_CEILING


def test_account_and_individual_steps_at_a_huge_noise_on_the_command_line():
    res = timed_invoke(["account", "--steps", "10", "--sampling-prob", "0.01", "--noise-multiplier", "1e300",
                        "--delta", "1e-6"])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "epsilon = 0 at delta" in res.stdout and "note: noise multiplier 1e+300 accounted at 1e+08" in res.stdout
    one_line_error(timed_invoke(["individual", "steps", "--noise-multiplier", "1e300", "--epsilon", "0.81563",
                                 "--delta", "1e-5"]), "--noise-multiplier 1e+300 allows about 10^", "more than 2^50",
                   "use --noise-multiplier <= 1.507e+08")
    res = timed_invoke(["individual", "steps", "--noise-multiplier", "1e-300", "--epsilon", "0.81563", "--delta", "1e-5"])
    assert res.exit_code == 0 and "GDP filter: 0 full-gradient steps" in res.stdout, res.output
    mc = [a for a in _MC if a not in ("--noise-multiplier", "1")]  # (its sampler divides by the variance)
    one_line_error(timed_invoke(["montecarlo", "run", *mc, "--noise-multiplier", "1e300"]),
                   "--noise-multiplier 1e+300 is too large", "overflows float64", "<= 1.3e154")
    one_line_error(timed_invoke(["montecarlo", "run", *mc, "--noise-multiplier", "1e-300"]),
                   "--noise-multiplier 1e-300 is too small", "underflows float64", ">= 1.5e-154")


def test_individual_steps_valid_noise_range_in_the_api():
    from dpmf.accounting.individual.steps import MAX_STEPS, full_gradient_steps

    top = full_gradient_steps(1.5e8, 0.81563, 1e-5)  # just inside the range: counted exactly
    assert 0 < top["rdp_steps"] < top["gdp_steps"] <= MAX_STEPS
    assert top["gdp_epsilon_at_steps"] <= 0.81563
    with pytest.raises(InvalidParameterError, match=r"use noise_multiplier <= 1\.507e\+08"):
        full_gradient_steps(1e300, 0.81563, 1e-5)
    assert full_gradient_steps(1e-300, 0.81563, 1e-5)["gdp_steps"] == 0
    assert full_gradient_steps(100, 0.81563, 1e-5)["gdp_steps"] == 495  # (the paper's example is unchanged)
