"""Plan rows build what they describe (issue 26, item 1): every row the planner can rank carries its
strategy and scheme as specs, its accountant's options and the run it was planned for;
``row.build()`` gives objects whose ``dpmf.account`` is the row's epsilon, exactly; rows round-trip
through JSON (``dpmf plan --json``, ``--export``), and the plan cache stores the specs too (its
format was bumped, so an old cached row is computed again, never misread).

Tiny runs (12 steps, delta 1e-3, so Monte Carlo rows need only 6,000 samples): every candidate kind
is calibrated once (a few seconds each)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

import dpmf
from dpmf.cli.main import app
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.planner import PlanRow, TrainingRun, candidates, evaluate, export_row, load_row, plan
from dpmf.planning.cache import PlanCache
from dpmf.sampling import scheme_from_dict
from dpmf.strategies import strategy_from_dict

#: 6 steps per epoch, q = 1/6: cyclic Poisson (cycle 4, rate 2/3), MMCC, balls-in-bins, b-min-sep.
RUN = TrainingRun(120, 20, 2, 1.0, 1e-3, montecarlo_samples=6_000)
#: BSR under balls-in-bins (the random-allocation bound) is costly: 6 steps keep it to seconds.
SMALL = TrainingRun(60, 20, 2, 1.0, 1e-3)


def _kind(cand) -> str:
    return f"{cand.spec.kind}/{cand.scheme.name}/{cand.method}"


def _one_per_kind() -> list:
    out = {}
    for run in (RUN, SMALL):
        for cand in candidates(run):
            if (cand.spec.kind == "bsr") == (run is SMALL):
                out.setdefault(_kind(cand), (cand, run))
    return list(out.values())


KINDS = _one_per_kind()


def test_every_strategy_and_sampler_family_is_covered():
    kinds = {c.spec.kind for c, _ in KINDS}
    samplers = {c.scheme.name for c, _ in KINDS}
    assert kinds == {"identity", "sqrt-toeplitz", "banded-toeplitz", "blt", "tree", "optimal", "bsr"}
    assert samplers == {"fixed-order", "poisson", "cyclic-poisson", "balls-in-bins", "b-min-sep"}
    assert {c.method for c, _ in KINDS} >= {"unamplified", "pld", "mmcc", "auto", "allocation_pld", "montecarlo"}


@pytest.mark.parametrize("cand,run", KINDS, ids=[_kind(c) for c, _ in KINDS])
def test_row_builds_objects_whose_account_is_the_rows_epsilon(cand, run):
    row = evaluate(cand, run)
    assert not row.pruned and row.epsilon <= run.epsilon * (1 + 1e-9)
    assert row.certified is (cand.method != "montecarlo")
    assert row.run == run.describe() and row.delta == run.delta
    # the specs are describe() dicts that the serializers rebuild; the recipe is the planner's
    strategy, scheme, sigma = row.build()
    assert json.loads(json.dumps(strategy.describe())) == row.strategy_spec
    assert scheme == scheme_from_dict(row.scheme_spec) == cand.scheme
    assert strategy_from_dict(row.strategy_spec, matrices=list(row.matrices) or None).describe() == strategy.describe()
    assert row.recipe == cand.spec.key() and sigma == row.noise_multiplier
    assert strategy.n == scheme.steps == run.steps
    # the row's accountant and options recompute its epsilon exactly, both directions
    again = dpmf.account(strategy, scheme, sigma, row.delta, method=row.method, **row.options)
    assert again.epsilon == row.epsilon
    assert again.epsilon_by_direction == row.epsilon_by_direction and row.epsilon_by_direction
    assert again.certified is row.certified
    # through JSON (dpmf plan --json, the cache, --export) and back: the same row, the same objects
    back = PlanRow.from_dict(json.loads(json.dumps(row.to_dict())))
    assert back == row
    s2, q2, sig2 = back.build()
    assert s2.describe() == strategy.describe() and q2 == scheme and sig2 == sigma


@pytest.fixture(scope="module")
def optimal_row():
    """The optimal factorization at 80 steps: a dense C named by hash (not inline) in its spec."""
    run = TrainingRun(800, 20, 2, 1.0, 1e-3, mmcc=False)
    (cand,) = [c for c in candidates(run) if c.spec.kind == "optimal"]
    return evaluate(cand, run)


def test_a_dense_strategy_travels_by_hash_with_its_matrix(optimal_row, tmp_path):
    row = optimal_row
    assert "matrix" not in row.strategy_spec and len(row.matrices) == 1  # in memory, not in the JSON
    assert "matrices" not in row.to_dict() and len(json.dumps(row.to_dict())) < 2_000
    strategy, scheme, sigma = row.build()
    assert np.array_equal(strategy.C, row.matrices[0])
    # --export writes the matrix next to the row; load_row finds it there
    paths = export_row(row, tmp_path / "row.json", rank=3)
    assert [p.name for p in paths] == ["row.json", f"{row.strategy_spec['sha256']}.npz"]
    loaded = load_row(tmp_path / "row.json")
    assert loaded == row and loaded.rank == 3 and np.array_equal(loaded.matrices[0], row.matrices[0])
    # without the matrix, build() rebuilds it from the recipe and checks its hash
    bare = PlanRow.from_dict(row.to_dict())
    assert bare.matrices == ()
    assert np.array_equal(bare.build().strategy.C, strategy.C)
    # ... and refuses a recipe that gives another matrix
    other = dataclasses.replace(bare, recipe={**bare.recipe, "gap": 1e-2})
    with pytest.raises(InvalidParameterError, match="sha256 .* is not at hand.*search_dir"):
        other.build()
    assert np.array_equal(other.build(search_dir=tmp_path).strategy.C, strategy.C)


def test_pruned_rows_say_what_they_are_and_do_not_build():
    only = [c for c in candidates(RUN) if (c.spec.kind, c.scheme.name) in
            {("identity", "fixed-order"), ("identity", "balls-in-bins"), ("tree", "poisson")}]
    rows = plan(RUN, only=only)  # the tree's MMCC row (wave 2) loses to DP-SGD under balls-in-bins (wave 1)
    ranked = [r for r in rows if not r.pruned]
    assert [r.rank for r in ranked] == list(range(1, len(ranked) + 1))
    pruned = [r for r in rows if r.pruned]
    assert pruned, "this plan must prune a row, or the test proves nothing"
    for r in pruned:
        assert r.rank is None and r.scheme_spec is not None and r.run is not None and r.epsilon > 1.0
        with pytest.raises(UnsupportedConfigurationError, match="pruned.*lower bound.*prune=False"):
            r.build()
        with pytest.raises(UnsupportedConfigurationError, match="pruned"):
            export_row(r, "unused.json")


def test_rank_and_matrices_are_not_part_of_a_rows_value(optimal_row):
    assert dataclasses.replace(optimal_row, rank=7, matrices=()) == optimal_row
    assert "rank" not in optimal_row.to_dict()


# ------------------------------------------------------------------------------------ bad rows
def _good() -> dict:
    return {
        "strategy": "identity", "sampling": "poisson", "method": "pld", "noise_multiplier": 1.5, "epsilon": 0.9,
        "certified": True, "prefix_sum_rmse": 3.0, "rmse_per_example_in_batch": 0.15, "seconds": 1.0,
        "pruned": False, "cached": False, "label": "DP-SGD, Poisson sampling", "note": "",
        "strategy_spec": {"name": "identity", "n": 12}, "scheme_spec": {"name": "poisson", "sampling_prob": 1 / 6,
                                                                         "steps": 12},
        "recipe": {"kind": "identity", "n": 12, "epochs": 1}, "options": {},
        "epsilon_by_direction": {"add": 0.8, "remove": 0.9}, "run": RUN.describe(),
    }


BAD = [
    ("missing", lambda d: d.pop("strategy_spec"), "missing key.*strategy_spec.*plan again"),
    ("unknown", lambda d: d.update(extra=1), "unknown key.*extra"),
    ("sigma", lambda d: d.update(noise_multiplier=0), "noise_multiplier.*> 0"),
    ("nan", lambda d: d.update(epsilon=float("nan")), "'epsilon' must be a number"),
    ("certified", lambda d: d.update(certified="yes"), "'certified' must be true or false"),
    ("run keys", lambda d: d.update(run={"dataset_size": 120}), "'run' must have the keys"),
    ("run delta", lambda d: d["run"].update(delta=2.0), "'delta' must be in \\(0, 1\\)"),
    ("run size", lambda d: d["run"].update(dataset_size=0), "'dataset_size' must be an integer >= 1"),
    ("spec", lambda d: d.update(scheme_spec="poisson"), "'scheme_spec' must be a dict or null"),
    ("no specs", lambda d: d.update(run=None), "calibrated row must carry"),
]


@pytest.mark.parametrize("name,edit,match", BAD, ids=[b[0] for b in BAD])
def test_malformed_rows_are_refused_naming_the_key(name, edit, match):
    d = _good()
    PlanRow.from_dict(d)  # the unedited dict is fine
    edit(d)
    with pytest.raises(InvalidParameterError, match=match):
        PlanRow.from_dict(d)


def test_an_edited_spec_does_not_build():
    d = _good()
    d["strategy_spec"] = {"name": "identity", "n": 13}
    with pytest.raises(InvalidParameterError, match="n=13 steps.*steps=12"):
        PlanRow.from_dict(d).build()
    d = _good()
    d["scheme_spec"] = {"name": "poisson", "sampling_prob": 1.5, "steps": 12}
    with pytest.raises(InvalidParameterError, match="scheme 'poisson'"):
        PlanRow.from_dict(d).build()


def test_row_files_are_checked(tmp_path):
    path = tmp_path / "row.json"
    path.write_text(json.dumps({"format": "dpmf-plan-row", "format_version": 1, "row": _good()}))
    with pytest.raises(InvalidParameterError, match="format_version 1.*export the row again"):
        load_row(path)
    path.write_text(json.dumps({"format": "something-else", "row": _good()}))
    with pytest.raises(InvalidParameterError, match="not a dpmf plan row"):
        load_row(path)
    path.write_text("{not json")
    with pytest.raises(InvalidParameterError, match="row.json"):
        load_row(path)
    path.write_text(json.dumps(_good()))  # a bare row of dpmf plan --json is read too
    assert load_row(path) == PlanRow.from_dict(_good())


# ------------------------------------------------------------------------------------ the cache
def test_cached_rows_carry_their_specs_and_old_rows_are_recomputed(tmp_path, monkeypatch):
    import dpmf.planning.cache as cache_mod

    (cand,) = [c for c in candidates(RUN) if (c.spec.kind, c.scheme.name) == ("sqrt-toeplitz", "fixed-order")]
    first = plan(RUN, only=[cand], cache=tmp_path)[0]
    second = plan(RUN, only=[cand], cache=tmp_path)[0]
    assert second.cached and not first.cached
    assert second.to_dict() | {"cached": False, "seconds": 0} == first.to_dict() | {"seconds": 0}
    assert second.build().strategy.describe() == first.build().strategy.describe()
    # a row written by the previous format (names only) sits under another key: never read
    cache = PlanCache(tmp_path)
    key = cand.key(RUN)
    monkeypatch.setattr(cache_mod, "FORMAT_VERSION", 1)
    old_path = cache.path(key)
    monkeypatch.undo()
    assert old_path != cache.path(key)
    # a file at the current key holding an old-style row (no specs) is ignored with a note, recomputed
    stored = json.loads(cache.path(key).read_text())
    for k in ("strategy_spec", "scheme_spec", "recipe", "options", "epsilon_by_direction", "run"):
        stored["row"].pop(k)
    cache.path(key).write_text(json.dumps(stored))
    assert cache.get(key) is None and "strategy_spec" in cache.ignored[-1]
    third = plan(RUN, only=[cand], cache=tmp_path)[0]
    assert not third.cached and third.strategy_spec == first.strategy_spec


def test_a_cached_dense_row_keeps_its_matrix(tmp_path):
    run = TrainingRun(800, 20, 2, 1.0, 1e-3, mmcc=False)
    (cand,) = [c for c in candidates(run) if c.spec.kind == "optimal"]
    row = plan(run, only=[cand], cache=tmp_path)[0]
    again = plan(run, only=[cand], cache=tmp_path)[0]
    assert again.cached and len(again.matrices) == 1 and np.array_equal(again.matrices[0], row.matrices[0])
    assert (tmp_path / "plan" / "matrices" / f"{row.strategy_spec['sha256']}.npz").is_file()


# ------------------------------------------------------------------------------------ the CLI
TINY = "plan --dataset-size 120 --batch-size 20 --epochs 2 --epsilon 1 --delta 1e-3 --no-mmcc --quiet".split()


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan_export")
    res = CliRunner().invoke(app, TINY + ["--json", "--export", str(folder / "row2.json"), "--rank", "2",
                                          "--cache-dir", str(folder / "cache")])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), folder, res


def test_plan_json_rows_carry_specs_and_run(plan_json):
    data, _, _ = plan_json
    for r in data["rows"]:
        row = PlanRow.from_dict(r)
        assert row.run == RUN.describe() | {"epsilon": 1.0}
        strategy, scheme, _ = row.build()
        assert strategy.n == scheme.steps == 12
    for r in data["pruned"]:
        assert r["scheme_spec"] is not None and r["run"] is not None


def test_plan_export_writes_the_chosen_row(plan_json):
    data, folder, res = plan_json
    loaded = load_row(folder / "row2.json")
    assert loaded.rank == 2 and {"rank": 2, **loaded.to_dict()} == data["rows"][1]
    assert "row 2 (" in res.stderr and "make_private(..., plan=" in res.stderr  # stdout stays JSON


def test_plan_export_options_are_checked_before_the_work(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, TINY + ["--rank", "2"])
    assert res.exit_code == 2 and "--rank" in res.stderr and "--export" in res.stderr
    res = runner.invoke(app, TINY + ["--export", str(tmp_path / "no" / "row.json")])
    assert res.exit_code == 2 and "--export" in res.stderr and "does not exist" in res.stderr
    res = runner.invoke(app, TINY + ["--export", str(tmp_path / "row.json"), "--rank", "0"])
    assert res.exit_code == 2 and "--rank" in res.stderr


def test_plan_export_rank_beyond_the_ranked_rows(plan_json):
    _, folder, _ = plan_json
    res = CliRunner().invoke(app, TINY + ["--export", str(folder / "x.json"), "--rank", "99",
                                          "--cache-dir", str(folder / "cache")])
    assert res.exit_code == 2 and "--rank must be between 1 and" in res.stderr
    assert not (folder / "x.json").exists()


def test_plan_row_epsilons_stay_finite_in_json(plan_json):
    data, _, _ = plan_json
    assert all(math.isfinite(r["epsilon"]) for r in data["rows"])
