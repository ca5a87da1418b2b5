"""Deprecated path: the frozen run description is :mod:`dpmf.training.run_spec`.

"Plan" now means one thing, choosing a configuration (``dpmf plan``, :mod:`dpmf.planner`); the
description one run executes is a :class:`~dpmf.training.run_spec.RunSpec`. The old names resolve
here, each with a :class:`DeprecationWarning`: ``ExecutionPlan`` -> ``RunSpec``, ``build_plan`` ->
``build_run_spec``, ``resolve_plan`` -> ``resolve_run_spec``, ``plan_from_row`` ->
``run_spec_from_row``; the other names (``expected_batch_size``, ``as_plan_row``,
``training_summary``, ``description_fingerprint``, ``StepOutOfPlanError``) are the same objects,
imported from :mod:`dpmf.training.run_spec`.
"""

from __future__ import annotations

import warnings

from dpmf.training import run_spec as _run_spec

#: old name -> its name in :mod:`dpmf.training.run_spec`
RENAMED = {"ExecutionPlan": "RunSpec", "build_plan": "build_run_spec", "resolve_plan": "resolve_run_spec",
           "plan_from_row": "run_spec_from_row"}
_SAME = ("expected_batch_size", "as_plan_row", "training_summary", "description_fingerprint", "StepOutOfPlanError")

__all__ = [*RENAMED, *_SAME]


def __getattr__(name: str):
    new = RENAMED.get(name, name if name in _SAME else None)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"dpmf.training.plan.{name} is deprecated: use dpmf.training.run_spec.{new}",
                  DeprecationWarning, stacklevel=2)
    return getattr(_run_spec, new)


def __dir__() -> list[str]:
    return sorted(__all__)
