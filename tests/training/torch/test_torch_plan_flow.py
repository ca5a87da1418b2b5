"""From plan to trained model to a report anyone can re-check (issue 26, items 2 and 3).

``make_private(..., plan=row)`` trains exactly what a ``dpmf plan`` row certified: the row's strategy,
scheme and noise, re-checked by one evaluation of its accountant (never a second calibration: the
tests count the accountant's evaluations and refuse any calibration); a row planned for another
dataset size or delta, a pruned row, an estimate, an edited row and options that contradict the
row are refused. The run's report passes ``dpmf verify`` and says what was trained (steps done of
steps planned, clip norm, normalizer, the row); an edited report does not pass.

A tiny run (120 examples, batch 20, 2 epochs: 12 steps) keeps every test to seconds."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

import dpmf
from dpmf.accounting import dispatch
from dpmf.accounting.verify import verify_report
from dpmf.cli.main import app
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.planner import TrainingRun, candidates, evaluate, export_row, plan
from dpmf.training.run_spec import RunSpec, run_spec_from_row, training_summary
from dpmf.training.torch import make_private

RUN = TrainingRun(120, 20, 2, 2.0, 1e-5)
#: one cheap row per kind of accountant the flow must carry: unamplified (closed form), the
#: random-allocation PLD, MMCC (generalized, cyclic Poisson) and the Poisson PLD
KINDS = {
    ("banded-toeplitz", "fixed-order"),
    ("identity", "balls-in-bins"),
    ("banded-toeplitz", "cyclic-poisson"),
    ("identity", "poisson"),
}


@pytest.fixture(scope="module")
def rows():
    out = {}
    for cand in candidates(RUN):
        key = (cand.spec.kind, cand.scheme.name)
        if key in KINDS and key not in out:
            out[key] = evaluate(cand, RUN)
    assert set(out) == KINDS
    return out


def _data(n: int = 120):
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 2, (n,), generator=g))


def _make(plan, data=None, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opts = {"max_grad_norm": 1.0, "seed": 0, **kw}
    return make_private(model, torch.optim.SGD(model.parameters(), lr=0.2), _data() if data is None else data,
                        plan=plan, **opts)


def _train(run) -> None:
    model, opt, loader, _ = run
    criterion = torch.nn.CrossEntropyLoss()
    for x, y in loader:
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()


@pytest.fixture
def count_evaluations(monkeypatch):
    """Every accountant evaluation of ``dpmf.account`` goes through ``dispatch._run_checked``: count
    them; any calibration fails the test."""
    calls = []
    real = dispatch._run_checked

    def counted(m, *args, **kw):
        calls.append(m.name)
        return real(m, *args, **kw)

    def no_calibration(*args, **kw):
        raise AssertionError("make_private(plan=row) must not calibrate again")

    monkeypatch.setattr(dispatch, "_run_checked", counted)
    # (the package's lazy name first: resolving it after patching dispatch would cache the patch)
    monkeypatch.setattr(dpmf.accounting, "calibrate", no_calibration)
    monkeypatch.setattr(dispatch, "calibrate", no_calibration)
    return calls


@pytest.mark.parametrize("key", sorted(KINDS), ids=["/".join(k) for k in sorted(KINDS)])
def test_make_private_trains_the_row_without_calibrating_again(rows, key, count_evaluations):
    row = rows[key]
    run = _make(row)
    assert count_evaluations == [row.method]  # one evaluation of the row's own accountant, no search
    privacy = run.privacy
    plan = privacy.run_spec
    assert plan.noise_multiplier == row.noise_multiplier and plan.delta == RUN.delta
    assert json.loads(json.dumps(plan.strategy.describe())) == row.strategy_spec
    assert json.loads(json.dumps(plan.scheme.describe())) == row.scheme_spec
    assert plan.report.epsilon == row.epsilon and plan.report.method == row.method
    assert plan.report.epsilon_by_direction == row.epsilon_by_direction
    assert plan.normalizer == pytest.approx(RUN.batch_size) and plan.steps == RUN.steps
    _train(run)
    report = privacy.report()
    assert privacy.steps_done == RUN.steps
    training = report.diagnostics["training"]
    assert training["steps_done"] == training["steps_planned"] == RUN.steps
    assert training["max_grad_norm"] == 1.0 and training["normalizer"] == plan.normalizer
    assert training["plan_row"]["strategy"] == row.strategy and training["plan_row"]["run"] == RUN.describe()
    assert training["plan_row"]["noise_multiplier"] == row.noise_multiplier
    v = verify_report(report.to_json())
    assert v.holds and v.edited is False and v.recomputed_epsilon == row.epsilon


def test_the_re_check_costs_a_fraction_of_a_calibration(rows, evaluations):
    """The MMCC row: make_private(plan=row) against make_private(target_epsilon=...) on the same pair,
    which calibrates from scratch (the issue's complaint) and may land on another sigma. The work is
    counted, never timed: the re-check is one evaluation, the calibration a search of several."""
    row = rows[("banded-toeplitz", "cyclic-poisson")]
    strategy, scheme, _ = row.build()
    _make(row)
    assert evaluations == ["mmcc"]
    evaluations.clear()
    again = _make(None, strategy=strategy, sampling=scheme, target_epsilon=RUN.epsilon, delta=RUN.delta)
    assert again.privacy.run_spec.report.epsilon <= RUN.epsilon
    assert evaluations.count("mmcc") > 1, evaluations


def test_a_row_of_another_dataset_size_or_delta_is_refused(rows, count_evaluations):
    row = rows[("identity", "poisson")]
    with pytest.raises(InvalidParameterError, match=r"dataset has 100 examples.*dataset_size=120.*plan again"):
        _make(row, data=_data(100))
    with pytest.raises(InvalidParameterError, match=r"delta=1e-06 but .*certified at delta=1e-05"):
        _make(row, delta=1e-6)
    assert _make(row, delta=1e-5).privacy.run_spec.delta == 1e-5  # the row's own delta may be repeated
    assert count_evaluations == ["pld"]  # nothing was computed for the refused ones


def test_pruned_rows_and_estimates_are_refused(rows, count_evaluations):
    row = rows[("identity", "poisson")]
    with pytest.raises(UnsupportedConfigurationError, match="pruned.*lower bound.*certifies nothing"):
        _make(dataclasses.replace(row, pruned=True, rank=None))
    with pytest.raises(UnsupportedConfigurationError, match="ESTIMATE.*certified=False.*montecarlo"):
        _make(dataclasses.replace(row, certified=False, method="montecarlo"))
    assert count_evaluations == []


def test_a_real_pruned_row_is_refused():
    only = [c for c in candidates(RUN) if (c.spec.kind, c.scheme.name) in
            {("identity", "fixed-order"), ("identity", "balls-in-bins"), ("tree", "poisson")}]
    pruned = [r for r in plan(RUN, only=only, thorough=True, cache=None) if r.pruned]  # the tree's MMCC row loses to balls-in-bins DP-SGD
    assert [r.strategy for r in pruned] == ["tree"]
    with pytest.raises(UnsupportedConfigurationError, match="pruned"):
        _make(pruned[0])


def test_an_edited_row_is_refused_after_its_re_check(rows):
    row = rows[("identity", "balls-in-bins")]
    with pytest.raises(InvalidParameterError, match="claims epsilon .* but its accountant gives"):
        _make(dataclasses.replace(row, epsilon=row.epsilon * 0.9))
    with pytest.raises(InvalidParameterError, match="claims epsilon .* but its accountant gives"):
        _make(dataclasses.replace(row, noise_multiplier=row.noise_multiplier * 0.8))


CONFLICTS = [
    ({"noise_multiplier": 1.0}, "noise_multiplier=1.0"),
    ({"target_epsilon": 2.0}, "target_epsilon=2.0"),
    ({"accountant": "pld"}, "accountant='pld'"),
    ({"accountant_options": {"discretization": 1e-3}}, "'discretization' cannot be combined with a plan row"),
]


@pytest.mark.parametrize("extra,match", CONFLICTS, ids=[c[1][:20] for c in CONFLICTS])
def test_options_that_contradict_the_plan_are_refused(rows, extra, match):
    with pytest.raises(InvalidParameterError, match=match.replace("(", r"\(").replace(")", r"\)")):
        _make(rows[("identity", "poisson")], **extra)


def test_strategy_and_sampling_with_a_plan_are_refused(rows):
    row = rows[("banded-toeplitz", "fixed-order")]
    strategy, scheme, _ = row.build()
    with pytest.raises(InvalidParameterError, match=r"do not also pass strategy=.*sampling="):
        _make(row, strategy=strategy, sampling=scheme)
    with pytest.raises(InvalidParameterError, match="max_grad_norm is needed with a plan row"):
        _make(row, max_grad_norm=None)
    with pytest.raises(InvalidParameterError, match="plan must be a dpmf plan row"):
        _make(42)
    with pytest.raises(InvalidParameterError, match="make_private needs strategy, sampling"):
        _make(None)


def test_execution_options_run_the_re_check(rows):
    run = _make(rows[("banded-toeplitz", "cyclic-poisson")], accountant_options={"workers": 1})
    assert run.privacy.run_spec.report.epsilon == rows[("banded-toeplitz", "cyclic-poisson")].epsilon


def test_an_execution_plan_is_used_as_it_is(rows, count_evaluations):
    first = _make(rows[("identity", "balls-in-bins")]).privacy.run_spec
    assert count_evaluations == ["allocation_pld"]
    second = _make(first)
    assert second.privacy.run_spec is first and count_evaluations == ["allocation_pld"]  # no accounting at all
    assert _make(first, delta=first.delta, normalizer=first.normalizer).privacy.run_spec is first
    with pytest.raises(InvalidParameterError, match="max_grad_norm=2.0 but the RunSpec has max_grad_norm=1.0"):
        _make(first, max_grad_norm=2.0)
    with pytest.raises(InvalidParameterError, match="dataset has 100 examples but the RunSpec"):
        _make(first, data=_data(100))
    with pytest.raises(InvalidParameterError, match="nothing to do with a RunSpec"):
        _make(first, accountant_options={"workers": 2})
    assert isinstance(first, RunSpec) and first.describe()["plan_row"]["strategy"] == "identity"


def test_plan_from_row_is_the_library_entry_point(rows):
    row = rows[("banded-toeplitz", "fixed-order")]
    p = run_spec_from_row(row, num_examples=120, max_grad_norm=0.5, normalizer=25.0)
    assert p.max_grad_norm == 0.5 and p.normalizer == 25.0 and p.noise_multiplier == row.noise_multiplier
    assert p.plan_row == row.describe_source()


# --------------------------------------------------------------------- export -> train -> verify
def test_exported_file_round_trips_into_training(rows, tmp_path, count_evaluations):
    row = dataclasses.replace(rows[("banded-toeplitz", "cyclic-poisson")], rank=1)
    export_row(row, tmp_path / "best.json")
    run = _make(str(tmp_path / "best.json"))
    assert count_evaluations == ["mmcc"]
    _train(run)
    report = run.privacy.report()
    assert report.epsilon == row.epsilon
    assert report.diagnostics["training"]["plan_row"] == row.describe_source()
    assert report.diagnostics["training"]["plan_row"]["rank"] == 1
    assert "from dpmf plan row 1: banded-toeplitz-4 / cyclic-poisson (mmcc" in training_summary(report)


def _verify_cli(path, expect_rank: int, size: int, steps: int) -> None:
    runner = CliRunner()
    report = json.loads(path.read_text())
    res = runner.invoke(app, ["verify", str(path)])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("HOLDS") and "NOT EDITED" in res.stdout
    assert f"trained: {steps} of {steps} planned steps, clip norm 1, normalizer" in res.stdout
    assert f"from dpmf plan row {expect_rank}: " in res.stdout
    assert f"planned for {size} examples, batch 20, 2 epochs" in res.stdout
    from_python = verify_report(path).summary()  # Python says what the command prints, trained line included
    assert from_python.splitlines()[2].startswith(f"trained: {steps} of {steps} planned steps")
    assert " ".join(from_python.split()) == " ".join(res.stdout.split())
    res = runner.invoke(app, ["verify", str(path), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["training"]["steps_done"] == steps

    edited = json.loads(json.dumps(report))
    edited["epsilon"] = edited["epsilon"] / 2  # a better claim than the accountant gives
    path.write_text(json.dumps(edited))
    res = runner.invoke(app, ["verify", str(path)])
    assert res.exit_code == 1 and res.stdout.startswith("DOES NOT HOLD") and "EDITED" in res.stdout

    edited = json.loads(json.dumps(report))
    edited["diagnostics"]["training"]["steps_planned"] = 2 * steps  # the description of what was trained
    path.write_text(json.dumps(edited))
    res = runner.invoke(app, ["verify", str(path)])
    assert res.exit_code == 3 and "EDITED since it was produced" in res.stdout


def test_exported_row_trained_report_verifies_and_an_edited_one_does_not(rows, tmp_path):
    row = dataclasses.replace(rows[("identity", "poisson")], rank=2)
    export_row(row, tmp_path / "row.json")
    run = _make(tmp_path / "row.json")
    _train(run)
    path = tmp_path / "report.json"
    path.write_text(run.privacy.report().to_json(indent=1))
    _verify_cli(path, expect_rank=2, size=120, steps=12)


@pytest.mark.slow
def test_cli_plan_export_then_train_then_verify(tmp_path):
    """The whole flow as a user runs it: dpmf plan --export (every candidate of a 6-step run),
    make_private(plan=FILE), the report saved as JSON, dpmf verify (exit 0, says what was trained);
    an edited report does not pass. (Slow: a whole plan; the fast version above exports one row.)"""
    res = CliRunner().invoke(app, ["plan", "--dataset-size", "60", "--batch-size", "20", "--epochs", "2",
                                   "--epsilon", "2", "--delta", "1e-5", "--no-mmcc", "--quiet", "--no-cache", "--thorough",
                                   "--export", str(tmp_path / "best.json")])
    assert res.exit_code == 0, res.output
    assert "row 1 (" in res.stdout and "written to" in res.stdout
    run = _make(str(tmp_path / "best.json"), data=_data(60))
    _train(run)
    path = tmp_path / "report.json"
    path.write_text(run.privacy.report().to_json(indent=1))
    _verify_cli(path, expect_rank=1, size=60, steps=6)


def test_a_dense_rows_report_is_saved_with_its_matrix_and_verifies(tmp_path):
    """The optimal factorization at 80 steps names its matrix by hash only: ``save_report`` writes the
    matrix next to the report, and ``dpmf verify --matrices`` re-checks it from the files alone."""
    run = TrainingRun(800, 20, 2, 2.0, 1e-5, mmcc=False)
    (cand,) = [c for c in candidates(run) if c.spec.kind == "optimal"]
    row = evaluate(cand, run)
    assert "matrix" not in row.strategy_spec
    training = _make(row, data=_data(800))
    _train(training)
    written = training.privacy.save_report(tmp_path / "report.json")
    assert [p.name for p in written] == ["report.json", f"{row.strategy_spec['sha256']}.npz"]
    res = CliRunner().invoke(app, ["verify", str(tmp_path / "report.json"), "--matrices", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "trained: 80 of 80 planned steps" in res.stdout
    res = CliRunner().invoke(app, ["verify", str(tmp_path / "report.json")])  # the report's folder, by default
    assert res.exit_code == 0, res.output
    written[1].unlink()
    res = CliRunner().invoke(app, ["verify", str(tmp_path / "report.json")])  # without the matrix: cannot check
    assert res.exit_code == 2 and "sha256" in res.stderr


def test_a_dense_strategy_report_verifies_with_no_matrices_option_from_another_folder(tmp_path, monkeypatch):
    """BandMF from the catalog (a dense matrix named by hash above 64 steps): ``dpmf verify report.json``
    finds the matrix ``save_report`` wrote beside the report, from any working directory (issue 52)."""
    from dpmf.sampling import FixedOrderSampling
    from dpmf.strategies import catalog

    strategy = catalog.build("banded", 80, bands=4)
    assert "sha256" in strategy.describe() and "matrix" not in strategy.describe()
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 2)
    m, opt, loader, privacy = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), _data(80),
                                           strategy=strategy, sampling=FixedOrderSampling(4, 80), noise_multiplier=3.0,
                                           delta=1e-5, max_grad_norm=1.0, loss_fn=torch.nn.functional.cross_entropy,
                                           seed=0)
    for _, (x, y) in zip(range(3), loader):
        opt.zero_grad()
        opt.step(x, y)
    (tmp_path / "run").mkdir()
    (tmp_path / "elsewhere").mkdir()
    written = privacy.save_report(tmp_path / "run" / "report.json")
    assert [p.name for p in written] == ["report.json", f"{strategy.describe()['sha256']}.npz"]
    monkeypatch.chdir(tmp_path / "elsewhere")
    for given in (tmp_path / "run" / "report.json", "../run/report.json"):
        res = CliRunner().invoke(app, ["verify", str(given)])
        assert res.exit_code == 0, res.output
        assert res.stdout.startswith("HOLDS") and "trained: 3 of 80 planned steps" in res.stdout
    assert verify_report("../run/report.json").holds
