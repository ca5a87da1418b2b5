"""The run description's names: ``dpmf.training.run_spec`` is the home of :class:`RunSpec` and its
builders; the names from before the rename (``dpmf.training.plan``: ``ExecutionPlan``,
``build_plan``, ...) still resolve to the same objects, each with a ``DeprecationWarning``."""

import dataclasses
import warnings

import pytest

from dpmf.sampling import PoissonSampling
from dpmf.strategies import Identity
from dpmf.training import run_spec


@pytest.mark.parametrize("old, new", [("ExecutionPlan", "RunSpec"), ("build_plan", "build_run_spec"),
                                      ("resolve_plan", "resolve_run_spec"), ("plan_from_row", "run_spec_from_row"),
                                      ("training_summary", "training_summary")])
def test_old_names_warn_and_are_the_same_objects(old, new):
    import dpmf.training.plan as old_module

    with pytest.warns(DeprecationWarning, match=f"dpmf.training.plan.{old} is deprecated: use "
                                                f"dpmf.training.run_spec.{new}"):
        got = getattr(old_module, old)
    assert got is getattr(run_spec, new)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_privacy_holds_its_run_spec_and_plan_is_a_deprecated_alias(framework):
    """``privacy.run_spec`` is the RunSpec (issue 53: one word for one thing); ``privacy.plan`` reads
    the same object with a DeprecationWarning, in both engines."""
    engine = pytest.importorskip(f"dpmf.training.{framework}.engine")
    spec = run_spec.build_run_spec(Identity(10), PoissonSampling(0.1, 10), num_examples=100, noise_multiplier=1.0,
                                   delta=1e-5, max_grad_norm=1.0)
    privacy = engine.Privacy(spec, *[None] * (len(dataclasses.fields(engine.Privacy)) - 1))
    assert privacy.run_spec is spec and "plan" not in {f.name for f in dataclasses.fields(privacy)}
    with pytest.warns(DeprecationWarning, match="privacy.plan is deprecated: use privacy.run_spec"):
        assert privacy.plan is spec


def test_unknown_name_is_an_attribute_error():
    import dpmf.training.plan as old_module

    with pytest.raises(AttributeError, match="no attribute 'RunSpec'"):
        old_module.RunSpec  # noqa: B018  (only the old names live there)


def test_a_spec_built_by_the_old_name_is_the_new_one():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from dpmf.training.plan import build_plan
    args = (Identity(10), PoissonSampling(0.1, 10))
    kw = dict(num_examples=100, noise_multiplier=1.0, delta=1e-5, max_grad_norm=1.0)
    old, new = build_plan(*args, **kw), run_spec.build_run_spec(*args, **kw)
    assert isinstance(old, run_spec.RunSpec)
    # the checkpoint keys hold this description: the same before and after the rename
    assert old.describe() == new.describe() and old.fingerprint() == new.fingerprint()
    # the fingerprint of the run's inputs only (issue 51 item 5): the same on every machine and numpy.
    # (It pinned "b2db9e7706a4fd01" before, a hash that held the accountant's epsilon to the last digit
    # and so differed on other machines; checkpoints that store such a hash still resume:
    # test_checkpoint_written_before_issue_51_resumes in torch/ and jax/.)
    assert new.fingerprint() == "04b44f00f01aa4f0"


# ----------------------------------------------------------------------- issue 51 item 5: the identity
import dataclasses  # noqa: E402
import hashlib  # noqa: E402

import numpy as np  # noqa: E402

from dpmf.errors import InvalidParameterError  # noqa: E402

ARGS = (Identity(10), PoissonSampling(0.1, 10))
KW = dict(num_examples=100, noise_multiplier=1.0, delta=1e-5, max_grad_norm=1.0)


@pytest.fixture(scope="module")
def spec():
    return run_spec.build_run_spec(*ARGS, **KW)


def _with_epsilon(spec, epsilon, method=None):
    """The same run whose accountant (another numpy, machine or dpmf) answered ``epsilon``."""
    report = dataclasses.replace(spec.report, epsilon=epsilon, method=method or spec.report.method)
    return dataclasses.replace(spec, report=report)


def test_the_fingerprint_is_the_hash_of_the_inputs_written_canonically(spec):
    text = ('{"delta":1e-05,"max_grad_norm":1.0,"noise_multiplier":1.0,"normalizer":10.0,"num_examples":100,'
            '"scheme":{"name":"poisson","sampling_prob":0.1,"steps":10},"strategy":{"n":10,"name":"identity"}}')
    assert spec.fingerprint() == hashlib.sha256(text.encode()).hexdigest()[:16] == "04b44f00f01aa4f0"
    # numpy scalars where Python numbers were (another numpy, a value computed in numpy) change nothing
    desc = {**spec.describe(), "noise_multiplier": np.float64(1.0), "num_examples": np.int64(100),
            "normalizer": np.float32(10.0)}
    assert run_spec.description_fingerprint(desc) == spec.fingerprint()


def test_the_accountants_last_digits_method_and_plan_row_are_not_the_identity(spec):
    eps = spec.epsilon
    for other in (_with_epsilon(spec, eps * (1 + 1e-10)), _with_epsilon(spec, eps * (1 - 1e-10)),
                  _with_epsilon(spec, eps, method="allocation_pld"),
                  dataclasses.replace(spec, plan_row={"epsilon": 1.2345678901234})):
        assert other.fingerprint() == spec.fingerprint()
        other.check_checkpoint(spec.checkpoint_entries())  # a checkpoint moves across these
        spec.check_checkpoint(other.checkpoint_entries())
    changed = run_spec.build_run_spec(*ARGS, **{**KW, "noise_multiplier": 1.1})
    assert changed.fingerprint() != spec.fingerprint()
    with pytest.raises(InvalidParameterError, match="another training plan .noise_multiplier: 1.1 in the checkpoint, 1.0 here"):
        spec.check_checkpoint(changed.checkpoint_entries())


def _legacy(entries: dict) -> dict:
    """The same entries as a checkpoint written before issue 51 stores them."""
    return {**entries, "plan_fingerprint": run_spec.legacy_description_fingerprint(entries["plan"])}


def test_a_checkpoint_of_the_old_format_with_other_last_digits_resumes(spec):
    moved = _with_epsilon(spec, spec.epsilon * (1 + 3e-11))  # the machine it was written on
    old = _legacy(moved.checkpoint_entries())
    assert old["plan_fingerprint"] != spec.fingerprint()
    spec.check_checkpoint(old)


@pytest.mark.parametrize("legacy", [False, True])
def test_a_claim_that_no_longer_holds_is_refused_a_weaker_one_resumes(spec, legacy):
    fmt = _legacy if legacy else dict
    low = fmt(_with_epsilon(spec, spec.epsilon * 0.99).checkpoint_entries())
    with pytest.raises(InvalidParameterError, match=r"the checkpoint claims epsilon .* \(pld\) for this run, but the "
                                                    r"accountant gives .*: the claim no longer holds"):
        spec.check_checkpoint(low)
    spec.check_checkpoint(fmt(_with_epsilon(spec, spec.epsilon * 1.5).checkpoint_entries()))


@pytest.mark.parametrize("value", [None, "2.8", float("nan"), -1.0, True])
def test_a_checkpoint_without_a_valid_claim_is_refused(spec, value):
    entries = spec.checkpoint_entries()
    entries["plan"]["epsilon"] = value
    with pytest.raises(InvalidParameterError, match="no valid epsilon claim"):
        spec.check_checkpoint(entries)


def test_a_claim_of_another_accountant_is_rechecked_by_that_accountant(spec):
    """A run resumed with a looser accountant than the one that wrote the checkpoint: the
    checkpoint's accountant is evaluated once at the run's noise and delta, and confirms it."""
    loose = run_spec.build_run_spec(*ARGS, **KW, accountant="unamplified")
    assert loose.fingerprint() == spec.fingerprint() and loose.epsilon > 2 * spec.epsilon
    loose.check_checkpoint(spec.checkpoint_entries())
    wrong = _with_epsilon(spec, spec.epsilon * 0.9).checkpoint_entries()
    with pytest.raises(InvalidParameterError, match="unamplified.*its own accountant pld gives .*no longer holds"):
        loose.check_checkpoint(wrong)


def test_the_shared_report_writer_puts_the_matrix_where_verify_looks(tmp_path, monkeypatch):
    """``RunSpec.save_report`` (the writer of torch's and JAX's ``privacy.save_report``): a dense strategy
    named by hash verifies from the report file alone, from another working directory (issue 52)."""
    from dpmf.accounting.verify import verify_report
    from dpmf.sampling import FixedOrderSampling
    from dpmf.strategies import catalog

    strategy = catalog.build("banded", 70, bands=3)
    spec = run_spec.build_run_spec(strategy, FixedOrderSampling(2, 70), num_examples=70, noise_multiplier=4.0,
                                   delta=1e-5, max_grad_norm=1.0)
    (tmp_path / "run").mkdir()
    (tmp_path / "elsewhere").mkdir()
    written = spec.save_report(lambda: spec.training_report(0), tmp_path / "run" / "report.json")
    assert [p.name for p in written] == ["report.json", f"{strategy.describe()['sha256']}.npz"]
    monkeypatch.chdir(tmp_path / "elsewhere")
    v = verify_report("../run/report.json")
    assert v.holds and v.recomputed_epsilon == spec.epsilon


# ------------------------------------- a long calibration says so, from Python too (issue 53 item 1)
def _calibrated(**kw):
    return run_spec.build_run_spec(Identity(10), PoissonSampling(0.1, 10), num_examples=100, target_epsilon=2.0,
                                   delta=1e-5, max_grad_norm=1.0, **kw)


def test_a_calibration_estimated_long_says_so_and_shows_its_progress(monkeypatch, capsys):
    monkeypatch.setenv("DPMF_PROGRESS", "log")
    monkeypatch.setenv("DPMF_PROGRESS_INTERVAL", "0")
    assert run_spec._calibration_seconds(Identity(10), PoissonSampling(0.1, 10), 2.0, 1e-5, "auto", {}) < 5
    monkeypatch.setattr(run_spec, "_calibration_seconds", lambda *args: 60.0)  # the same run, estimated long
    spec = _calibrated()
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("dpmf: calibrating the noise to epsilon 2 at delta 1e-05 before the first step: about 60 s "
                      "by a rough estimate; progress below (DPMF_PROGRESS=off silences it)")
    assert any("calibrating noise" in line and "done" in line for line in err[1:]), err
    assert spec.epsilon <= 2.0


def test_a_quick_calibration_stays_quiet(monkeypatch, capsys):
    monkeypatch.setenv("DPMF_PROGRESS", "log")
    spec = _calibrated()
    assert capsys.readouterr() == ("", "") and spec.epsilon <= 2.0


@pytest.mark.parametrize("scheme, per", [
    (PoissonSampling(0.1, 40), 10),
    (PoissonSampling(64 / 1000, 160), 16),  # 1 / q = 15.6: the nearest integer
    (PoissonSampling(0.001, 40), 40),  # an epoch longer than the run: the run
    ("cyclic", 20),  # q / b = 0.05
    ("minsep", 12),  # p0 = 1 / (1/p + b - 1) = 1 / (10 + 2)
    ("balls", 25),
    ("fixed", 8),
])
def test_steps_per_epoch_of_every_scheme(scheme, per):
    from dpmf.sampling import BallsInBinsSampling, CyclicPoissonSampling, FixedOrderSampling, MinSepSampling

    scheme = {"cyclic": CyclicPoissonSampling(0.2, 60, 4), "minsep": MinSepSampling(0.1, 60, 3),
              "balls": BallsInBinsSampling(2, 50), "fixed": FixedOrderSampling(5, 40)}.get(scheme, scheme)
    assert run_spec.steps_per_epoch(scheme) == per


def test_epochs_and_the_epoch_of_a_step(spec):
    from dpmf.training.run_spec import StepOutOfPlanError

    # Identity(10), Poisson 0.1: one epoch of 10 steps; 25 steps at q = 0.1 are 3 epochs, the last one of 5
    assert (spec.steps_per_epoch, spec.epochs, spec.epoch_of(9)) == (10, 1, 0)
    longer = run_spec.build_run_spec(Identity(25), PoissonSampling(0.1, 25), **KW)
    assert longer.epochs == 3 and [longer.epoch_of(t) for t in (0, 9, 10, 19, 20, 24)] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(StepOutOfPlanError, match="step 25 is outside the plan"):
        longer.epoch_of(25)
    with pytest.raises(InvalidParameterError, match="step must be an integer"):
        longer.epoch_of(2.0)
    with pytest.raises(InvalidParameterError, match="sample_rate"):
        run_spec.epoch_steps_at_rate(0.0)
