"""The run description's names: ``dpmf.training.run_spec`` is the home of :class:`RunSpec` and its
builders; the names from before the rename (``dpmf.training.plan``: ``ExecutionPlan``,
``build_plan``, ...) still resolve to the same objects, each with a ``DeprecationWarning``."""

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
    # and what a checkpoint written before the rename stores (main at 585a4c0, ExecutionPlan): an old
    # checkpoint's "plan" / "plan_fingerprint" still match a spec of the same run
    assert new.fingerprint() == "b2db9e7706a4fd01"
