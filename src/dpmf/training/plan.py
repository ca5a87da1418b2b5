"""The execution plan: one frozen description of a private training run, certified before step 0.

DESIGN.md (``training/``): the plan holds the strategy, the sampling scheme, the noise multiplier,
the clip norm, the public normalizer, the number of examples, delta and the
:class:`~dpmf.accounting.PrivacyReport` that certifies them. It drives the sampler, the noise and
the accountant of a framework adapter (:mod:`dpmf.training.torch`), is saved in every checkpoint,
and refuses a step it does not cover. Nothing here imports a framework.

The update of step ``t`` (0-based) is

    g_t = ( sum_{i in B_t} clip(grad_i, max_grad_norm) + noise_multiplier * max_grad_norm * (C^{-1} z)_t ) / normalizer

with ``z_t ~ N(0, I)`` and ``normalizer`` the *expected* batch size of the scheme (public: it does
not depend on which examples were drawn), never the realized ``|B_t|``, which would leak. Dividing
the mechanism ``C x + z`` (clip norm 1, DESIGN.md) by the public constant ``max_grad_norm /
normalizer`` is post-processing, so the report of ``(strategy, scheme, noise_multiplier, delta)``
covers the run. The default normalizer is computed from ``num_examples`` (``len(dataset)``), which is
public under zero-out adjacency (:data:`~dpmf.accounting.report.ADJACENCY`: neighbours have the same
size); where the size must stay private, pass a public constant as ``normalizer`` (then, for samplers
that draw each example's participation independently of the others, the report also covers a
neighbour with one example more or fewer; docs/tutorials/pytorch.md).

>>> from dpmf.strategies import Identity
>>> from dpmf.sampling import PoissonSampling
>>> plan = build_plan(Identity(100), PoissonSampling(0.01, 100), num_examples=6000,
...                   noise_multiplier=1.0, delta=1e-5, max_grad_norm=1.0)
>>> plan.normalizer, plan.report.method, round(plan.epsilon, 3)
(60.0, 'pld', 0.718)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.sampling.schemes import (
    SCHEMES,
    BallsInBinsSampling,
    CyclicPoissonSampling,
    FixedOrderSampling,
    MinSepSampling,
    MultiAttributionMinSepSampling,
    PoissonSampling,
)

__all__ = ["ExecutionPlan", "build_plan", "plan_from_row", "as_plan_row", "training_summary", "expected_batch_size",
           "StepOutOfPlanError", "description_fingerprint", "resolve_plan"]


class StepOutOfPlanError(UnsupportedConfigurationError):
    """A training step the plan (hence its privacy report) does not cover."""


def expected_batch_size(scheme, num_examples: int) -> float:
    """The expected number of examples per step, a public constant of the scheme and the dataset size.

    Poisson ``q m``; cyclic Poisson ``q m / b`` (one group of ``m / b`` active per step); b-min-sep the
    marginal rate ``p0 m`` (exact at every step with a warm start, the long-run mean cold); balls-in-bins
    ``m k / b`` (every example in ``k = num_selected`` steps per epoch of ``b`` steps) and fixed order ``m / b``; multi-attribution the
    marginal user rate times the number of examples (an upper bound on the mean with the cap).

    >>> expected_batch_size(PoissonSampling(0.01, 10), 6000)
    60.0
    >>> expected_batch_size(BallsInBinsSampling(2, 20), 500)
    50.0
    """
    m = _v.positive_int("num_examples", num_examples)
    if isinstance(scheme, (PoissonSampling, CyclicPoissonSampling, MinSepSampling)):
        if isinstance(scheme, MinSepSampling):
            size = scheme.participation_rate * m
        else:
            size = scheme.sampling_prob * m / getattr(scheme, "cycle_length", 1)
        # truncated: min(mean, max), an upper bound on the truncated mean E[min(size, max)]
        return float(min(size, scheme.max_batch_size)) if scheme.max_batch_size is not None else size
    if isinstance(scheme, BallsInBinsSampling):
        return m * scheme.num_selected / scheme.steps_per_epoch
    if isinstance(scheme, FixedOrderSampling):
        return m / scheme.steps_per_epoch
    if isinstance(scheme, MultiAttributionMinSepSampling):
        from dpmf.sampling.schemes import participation_rate

        return participation_rate(scheme.sampling_prob, scheme.min_sep) * m
    raise InvalidParameterError(f"scheme must be a dpmf sampling scheme, got {type(scheme).__name__}")


def description_fingerprint(description: dict) -> str:
    """The short hash :meth:`ExecutionPlan.fingerprint` gives a :meth:`ExecutionPlan.describe` dict
    (16 hex digits of the SHA-256 of its sorted JSON): a checkpoint stores both, and loading
    recomputes this one to catch a description edited after saving."""
    return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ExecutionPlan:
    """What a run will do and the report that certifies it (module docstring). Frozen."""

    strategy: object = field(repr=False)
    scheme: object
    noise_multiplier: float
    max_grad_norm: float
    normalizer: float
    num_examples: int
    delta: float
    report: object = field(repr=False)  # PrivacyReport
    #: The ``dpmf plan`` row the plan was built from (:meth:`~dpmf.planning.rows.PlanRow.describe_source`),
    #: or ``None`` (built from a strategy and a scheme).
    plan_row: dict | None = field(default=None, repr=False)

    @property
    def steps(self) -> int:
        return self.scheme.steps

    @property
    def epsilon(self) -> float:
        return self.report.epsilon

    @property
    def noise_std(self) -> float:
        """Standard deviation of ``z`` on the clipped *sum*: ``noise_multiplier * max_grad_norm``."""
        return self.noise_multiplier * self.max_grad_norm

    def describe(self) -> dict:
        """JSON-ready description; with :attr:`report` it is what a checkpoint must match."""
        return {
            "strategy": self.strategy.describe(),
            "scheme": self.scheme.describe(),
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "normalizer": self.normalizer,
            "num_examples": self.num_examples,
            "delta": self.delta,
            "epsilon": self.report.epsilon,
            "method": self.report.method,
            **({"plan_row": self.plan_row} if self.plan_row is not None else {}),
        }

    def fingerprint(self) -> str:
        """A short hash of :meth:`describe` (checkpoints compare it)."""
        return description_fingerprint(self.describe())

    def check_step(self, step: int) -> None:
        """Raise :class:`StepOutOfPlanError` unless ``0 <= step < steps``."""
        if not 0 <= step < self.steps:
            raise StepOutOfPlanError(
                f"step {step} is outside the plan: the privacy report covers steps 0..{self.steps - 1} "
                f"({self.steps} steps of {self.scheme.describe()['name']} with strategy "
                f"{self.strategy.describe()['name']}); build a new plan for a longer run"
            )


def build_plan(
    strategy,
    scheme,
    *,
    num_examples: int,
    delta: float,
    max_grad_norm: float,
    noise_multiplier: float | None = None,
    target_epsilon: float | None = None,
    accountant: str = "auto",
    normalizer: float | None = None,
    **accountant_options,
) -> ExecutionPlan:
    """Certify a run before its first step: exactly one of ``noise_multiplier`` (then
    ``dpmf.account``) or ``target_epsilon`` (then ``dpmf.calibrate``: the smallest noise whose
    certified epsilon meets the target).

    ``accountant`` is a ``dpmf.account`` method (``"auto"``: the tightest valid proved one). Monte
    Carlo is accepted only through calibration (Estimate-Verify-Release, certified); an uncertified
    report is refused. A pair no sound accountant covers raises
    :class:`~dpmf.errors.UnsupportedConfigurationError` here, before training. ``normalizer``
    defaults to :func:`expected_batch_size` (a public constant; any positive public constant is
    allowed).
    """
    from dpmf.accounting import account, calibrate

    m, clip, d = _check_run(strategy, scheme, num_examples, max_grad_norm, delta, normalizer)
    if (noise_multiplier is None) == (target_epsilon is None):
        raise InvalidParameterError("pass exactly one of noise_multiplier and target_epsilon")
    if target_epsilon is not None:
        cal = calibrate(strategy, scheme, _v.positive("target_epsilon", target_epsilon), d, accountant,
                        **accountant_options)
        sigma, report = cal.noise_multiplier, cal.report
    else:
        sigma = _v.positive("noise_multiplier", noise_multiplier)
        report = account(strategy, scheme, sigma, d, accountant, **accountant_options)
    if not report.certified:
        raise UnsupportedConfigurationError(
            f"the {report.method} accountant returned an estimate (certified=False), which cannot certify "
            "training; pass target_epsilon to calibrate with certification (Monte Carlo: Estimate-Verify-Release)"
        )
    norm = expected_batch_size(scheme, m) if normalizer is None else _v.positive("normalizer", normalizer)
    return ExecutionPlan(strategy, scheme, float(sigma), clip, float(norm), m, d, report)


def _check_run(strategy, scheme, num_examples, max_grad_norm, delta, normalizer) -> tuple[int, float, float]:
    """The checks every plan passes before any accounting: ``(num_examples, max_grad_norm, delta)``."""
    if not isinstance(scheme, SCHEMES):
        raise InvalidParameterError(f"sampling must be a dpmf sampling scheme, got {type(scheme).__name__}")
    n = getattr(strategy, "n", None)
    if n is None or not callable(getattr(strategy, "describe", None)):
        raise InvalidParameterError(f"strategy must be a dpmf strategy with n steps, got {type(strategy).__name__}")
    if n != scheme.steps:
        raise InvalidParameterError(
            f"the strategy covers n={n} steps but the sampler has steps={scheme.steps}: they must be equal "
            "(the noise of step t is row t of C^{-1}, and the accounting covers exactly the scheme's steps)"
        )
    m = _v.positive_int("num_examples", num_examples)
    clip = _v.positive("max_grad_norm", max_grad_norm)
    d = _v.open_unit("delta", delta)
    if normalizer is None and expected_batch_size(scheme, m) < 1:
        raise InvalidParameterError(
            f"the expected batch size is {expected_batch_size(scheme, m):.3g} examples (< 1) for {m} examples "
            f"under {scheme.describe()['name']}: dividing the noisy sum by it would amplify the noise "
            f"{1 / expected_batch_size(scheme, m):.3g}x and train on noise; use more data, fewer steps per epoch or "
            "a larger sampling probability, or pass a public normalizer= explicitly"
        )
    return m, clip, d


def as_plan_row(plan):
    """A :class:`~dpmf.planning.rows.PlanRow` from a row, a row dict (a row of ``dpmf plan --json``,
    or the JSON of ``dpmf plan --export``) or the path of a file ``dpmf plan --export`` wrote."""
    import os

    from dpmf.planning.rows import PlanRow, load_row, row_from_json

    if isinstance(plan, PlanRow):
        return plan
    if isinstance(plan, dict):
        return row_from_json(plan)[0]
    if isinstance(plan, (str, os.PathLike)):
        return load_row(plan)
    raise InvalidParameterError(
        "plan must be a dpmf plan row (dpmf.planner.plan(...)[k]), its dict or the path of a file written by "
        f"dpmf plan --export, or an ExecutionPlan; got {type(plan).__name__}"
    )


def plan_from_row(
    row,
    *,
    num_examples: int,
    max_grad_norm: float,
    delta: float | None = None,
    normalizer: float | None = None,
    search_dir=None,
    **execution_options,
) -> ExecutionPlan:
    """The execution plan of exactly what a ``dpmf plan`` row certified: its strategy, its scheme
    and its noise multiplier (:meth:`~dpmf.planning.rows.PlanRow.build`), with no second calibration.

    ``row``: a :class:`~dpmf.planning.rows.PlanRow`, its dict, or the path of a file ``dpmf plan
    --export`` wrote (:func:`as_plan_row`). The row is **re-checked**, not trusted: its accountant
    runs once at its noise multiplier (``dpmf.account(strategy, scheme, sigma, delta,
    method=row.method, **row.options)``, one evaluation where a calibration takes several), and
    that fresh report, for exactly the strategy, scheme, sigma and delta trained, certifies the run.
    ``execution_options`` (``workers=2`` for MMCC, ...) only change how that evaluation runs.

    Refused, before anything is computed: a pruned row (a lower bound, never calibrated), an
    uncertified one (a Monte Carlo ESTIMATE), a row planned for another dataset size than
    ``num_examples`` or another ``delta`` (when given; default the row's), a row without its specs
    (from an older dpmf). Refused after the evaluation: a row whose recomputed epsilon is above the
    epsilon it claims or above its run's target (edited, or from a dpmf whose accountant changed).
    """
    from dpmf.accounting import dispatch
    from dpmf.accounting.verify import REL_SLACK
    from dpmf.errors import DPMFError

    row = as_plan_row(row)
    where = f"the plan row {row.strategy} / {row.sampling} ({row.method}, sigma {row.noise_multiplier:.6g})"
    if row.pruned:
        row.build()  # raises: a pruned row certifies nothing
    if not row.certified:
        raise UnsupportedConfigurationError(
            f"{where} is an ESTIMATE (certified=False): it cannot certify training. Certify that configuration "
            "first: strategy, sampling, _ = row.build(); make_private(..., strategy=strategy, sampling=sampling, "
            "target_epsilon=..., accountant='montecarlo') calibrates with Estimate-Verify-Release"
        )
    if row.run is None or row.strategy_spec is None or row.scheme_spec is None:
        row.build()  # raises: no specs
    run = row.run
    m = _v.positive_int("num_examples", num_examples)
    if m != run["dataset_size"]:
        raise InvalidParameterError(
            f"the dataset has {m} examples but {where} was planned and certified for dataset_size="
            f"{run['dataset_size']} (batch {run['batch_size']}, {run['epochs']} epochs): its sampling probability "
            "and steps are those of that run; plan again for this dataset (TrainingRun(dataset_size="
            f"{m}, ...), dpmf plan --dataset-size {m})"
        )
    if delta is not None and _v.open_unit("delta", delta) != run["delta"]:
        raise InvalidParameterError(
            f"delta={delta!r} but {where} was certified at delta={run['delta']!r}: leave delta out (the row's is "
            "used) or plan again for this delta"
        )
    unknown = sorted(set(execution_options) - _EXECUTION_OPTIONS)
    if unknown:
        raise InvalidParameterError(
            f"accountant option(s) {', '.join(map(repr, unknown))} cannot be combined with a plan row: the row fixes "
            f"the accountant and its options ({row.method}, {row.options}); only execution options "
            f"({', '.join(sorted(_EXECUTION_OPTIONS))}) may be given"
        )
    strategy, scheme, sigma = row.build(search_dir=search_dir)
    m, clip, d = _check_run(strategy, scheme, m, max_grad_norm, run["delta"], normalizer)
    try:
        report = dispatch.account(strategy, scheme, sigma, d, method=row.method, **row.options,
                                  **{k: v for k, v in execution_options.items() if v is not None})
    except DPMFError as exc:
        raise type(exc)(f"{where} cannot be re-checked: {exc}") from None
    claim, target = row.epsilon, run["epsilon"]
    if not report.certified:
        raise UnsupportedConfigurationError(f"{where}: its accountant now returns an estimate (certified=False)")
    if report.epsilon > claim + REL_SLACK * abs(claim) or report.epsilon > target + REL_SLACK * target:
        raise InvalidParameterError(
            f"{where} claims epsilon {claim!r} <= its target {target!r}, but its accountant gives {report.epsilon!r} "
            f"at that noise and delta {d!r}: the row was edited or comes from a dpmf whose accountant changed; "
            "plan again"
        )
    norm = expected_batch_size(scheme, m) if normalizer is None else _v.positive("normalizer", normalizer)
    return ExecutionPlan(strategy, scheme, float(sigma), clip, float(norm), m, d, report,
                         plan_row=row.describe_source())


def resolve_plan(
    plan,
    *,
    strategy,
    sampling,
    num_examples: int,
    delta,
    max_grad_norm,
    noise_multiplier,
    target_epsilon,
    accountant: str,
    normalizer,
    accountant_options: dict | None,
) -> ExecutionPlan:
    """The execution plan of a framework adapter's ``make_private`` (PyTorch, JAX): built and
    certified from ``strategy``, ``sampling`` and the guarantee (:func:`build_plan`), or taken from
    ``plan`` (a ``dpmf plan`` row, re-checked and never recalibrated, or an :class:`ExecutionPlan`
    used as it is); the same refusals, with the same messages, for every framework."""
    if plan is None:
        missing = [k for k, v in (("strategy", strategy), ("sampling", sampling), ("delta", delta),
                                  ("max_grad_norm", max_grad_norm)) if v is None]
        if missing:
            raise InvalidParameterError(
                f"make_private needs {', '.join(missing)} (with noise_multiplier or target_epsilon), or plan=<a dpmf "
                "plan row, its exported file, or an ExecutionPlan>"
            )
        return build_plan(
            strategy, sampling, num_examples=num_examples, delta=delta, max_grad_norm=max_grad_norm,
            noise_multiplier=noise_multiplier, target_epsilon=target_epsilon, accountant=accountant,
            normalizer=normalizer, **(accountant_options or {}),
        )
    return _plan_from(plan, num_examples=num_examples, delta=delta, max_grad_norm=max_grad_norm,
                      normalizer=normalizer, conflicts={"strategy": strategy, "sampling": sampling,
                                                        "noise_multiplier": noise_multiplier,
                                                        "target_epsilon": target_epsilon,
                                                        "accountant": None if accountant == "auto" else accountant},
                      accountant_options=accountant_options)


def _plan_from(plan, *, num_examples, delta, max_grad_norm, normalizer, conflicts, accountant_options) -> ExecutionPlan:
    """``make_private(plan=...)``: the execution plan of a plan row (re-checked, never recalibrated) or
    an :class:`ExecutionPlan` used as it is; options that would contradict it are refused."""
    given = [k for k, v in conflicts.items() if v is not None]
    if given:
        raise InvalidParameterError(
            f"plan= fixes the strategy, the sampling scheme and the noise (hence epsilon); do not also pass "
            f"{', '.join(f'{k}={conflicts[k]!r}' for k in given)}: drop {'it' if len(given) == 1 else 'them'}, or "
            "drop plan= to choose them yourself"
        )
    if isinstance(plan, ExecutionPlan):
        if accountant_options:
            raise InvalidParameterError(
                f"accountant_options={accountant_options!r} have nothing to do with an ExecutionPlan: it is already "
                "certified (its report was computed when it was built); drop them"
            )
        for name, value, planned in (("delta", delta, plan.delta), ("max_grad_norm", max_grad_norm, plan.max_grad_norm),
                                     ("normalizer", normalizer, plan.normalizer)):
            if value is not None and value != planned:
                raise InvalidParameterError(
                    f"{name}={value!r} but the ExecutionPlan has {name}={planned!r}: leave {name} out (the plan's is "
                    "used) or build a new plan"
                )
        if num_examples != plan.num_examples:
            raise InvalidParameterError(
                f"the dataset has {num_examples} examples but the ExecutionPlan was built for num_examples="
                f"{plan.num_examples}: build a plan for this dataset"
            )
        return plan
    if max_grad_norm is None:
        raise InvalidParameterError(
            "max_grad_norm is needed with a plan row (a row fixes the mechanism, not the clip norm): pass "
            "max_grad_norm=<per-example clip norm>"
        )
    return plan_from_row(plan, num_examples=num_examples, max_grad_norm=max_grad_norm, delta=delta,
                         normalizer=normalizer, **(accountant_options or {}))


def training_summary(report) -> str | None:
    """One line saying what a training run's report covers (``privacy.report()``, or its JSON dict):
    steps done of steps planned, clip norm, normalizer, and the ``dpmf plan`` row it came from;
    ``None`` for a report that is not a training run's. ``dpmf verify`` prints it."""
    diag = getattr(report, "diagnostics", None) if not isinstance(report, dict) else report.get("diagnostics")
    t = diag.get("training") if isinstance(diag, dict) else None
    if not isinstance(t, dict):
        return None

    def num(key):
        v = t.get(key)
        return f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "?"

    line = (f"trained: {t.get('steps_done', '?')} of {t.get('steps_planned', '?')} planned steps, clip norm "
            f"{num('max_grad_norm')}, normalizer {num('normalizer')}, {num('num_examples')} examples, "
            f"per-example gradients {t.get('grad_sample_mode', '?')}")
    row = t.get("plan_row")
    if isinstance(row, dict):
        run = row.get("run") if isinstance(row.get("run"), dict) else {}
        rank = f" {row['rank']}" if row.get("rank") is not None else ""
        line += (f"; from dpmf plan row{rank}: {row.get('strategy')} / {row.get('sampling')} ({row.get('method')}, "
                 f"sigma {row.get('noise_multiplier', float('nan')):.6g}), planned for {run.get('dataset_size')} examples, "
                 f"batch {run.get('batch_size')}, {run.get('epochs')} epochs, target epsilon {run.get('epsilon')} at "
                 f"delta {run.get('delta')}")
    return line


#: Options that change how an accountant runs, never its value (:data:`dpmf.accounting.guard.EXECUTION_OPTIONS`).
_EXECUTION_OPTIONS = frozenset({"workers", "scheduler", "cache_dir"})
