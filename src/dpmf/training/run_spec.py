"""The run spec: one frozen description of a private training run, certified before step 0.

Named *spec*, not *plan*: "plan" is the choosing of a configuration (``dpmf plan``,
:mod:`dpmf.planner`, :mod:`dpmf.planning`), whose rows a spec can be built from
(:func:`run_spec_from_row`); a :class:`RunSpec` is what one run then executes, like the frozen,
validated parameter objects of the sampling schemes. (The old names ``ExecutionPlan``,
``build_plan``, ``resolve_plan`` and ``plan_from_row`` in :mod:`dpmf.training.plan` still work
and warn.)

DESIGN.md (``training/``): the spec holds the strategy, the sampling scheme, the noise multiplier,
the clip norm, the public normalizer, the number of examples, delta and the
:class:`~dpmf.accounting.PrivacyReport` that certifies them. It drives the sampler, the noise and
the accountant of a framework adapter (:mod:`dpmf.training.torch`, :mod:`dpmf.training.jax`), is
saved in every checkpoint (under the keys ``"plan"`` and ``"plan_fingerprint"``, unchanged since
the first checkpoint format), and refuses a step it does not cover. Nothing here imports a framework.

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
>>> spec = build_run_spec(Identity(100), PoissonSampling(0.01, 100), num_examples=6000,
...                       noise_multiplier=1.0, delta=1e-5, max_grad_norm=1.0)
>>> spec.normalizer, spec.report.method, round(spec.epsilon, 3)
(60.0, 'pld', 0.718)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from dpmf import progress
from dpmf import validation as _v
from dpmf.accounting.verify import training_summary  # (its home: verify reads reports; re-exported)
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

__all__ = ["RunSpec", "HasRunSpec", "build_run_spec", "run_spec_from_row", "as_plan_row", "training_summary", "expected_batch_size",
           "steps_per_epoch", "epoch_steps_at_rate",
           "StepOutOfPlanError", "description_fingerprint", "legacy_description_fingerprint", "IDENTITY_KEYS",
           "resolve_run_spec"]


class StepOutOfPlanError(UnsupportedConfigurationError):
    """A training step the run spec (hence its privacy report) does not cover (the name predates
    :class:`RunSpec`; kept because it is documented and caught by users)."""


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


def steps_per_epoch(scheme) -> int:
    """The steps of one epoch of ``scheme`` (what a learning-rate schedule or a per-epoch evaluation
    counts in), from its public parameters only.

    The epoch schemes (:class:`~dpmf.sampling.FixedOrderSampling`, balls-in-bins): their
    ``steps_per_epoch``, one pass over the data. The rate-based schemes: ``1 / r`` rounded to the
    nearest integer (at least 1, at most ``steps``), the steps in which an example is expected to be
    drawn once, ``r`` its participation rate per step -- Poisson ``q`` (Opacus' ``len(data_loader)``
    under Poisson sampling, ``1 / sample_rate``), cyclic Poisson ``q / b``, b-min-sep and
    multi-attribution their marginal rate ``1 / (1/p + b - 1)``.

    >>> steps_per_epoch(PoissonSampling(0.01, 300)), steps_per_epoch(BallsInBinsSampling(3, 300))
    (100, 100)
    """
    if isinstance(scheme, (BallsInBinsSampling, FixedOrderSampling)):
        return scheme.steps_per_epoch
    if isinstance(scheme, (PoissonSampling, CyclicPoissonSampling)):
        rate = scheme.sampling_prob / getattr(scheme, "cycle_length", 1)
    elif isinstance(scheme, (MinSepSampling, MultiAttributionMinSepSampling)):
        from dpmf.sampling.schemes import participation_rate

        rate = participation_rate(scheme.sampling_prob, scheme.min_sep)
    else:
        raise InvalidParameterError(f"scheme must be a dpmf sampling scheme, got {type(scheme).__name__}")
    return min(scheme.steps, epoch_steps_at_rate(rate))


def epoch_steps_at_rate(rate: float) -> int:
    """``1 / rate`` rounded to the nearest integer (at least 1): the steps of an epoch when every example
    joins each step with probability ``rate`` (Poisson sampling; Opacus' ``len(data_loader)``, whose
    ``sample_rate`` is ``1 / len(data_loader)``).

    >>> epoch_steps_at_rate(0.1), epoch_steps_at_rate(64 / 1000)
    (10, 16)
    """
    return max(1, round(1.0 / _v.probability("sample_rate", rate)))


#: The keys of :meth:`RunSpec.describe` that are the run's *inputs* (what the user chose, or what
#: follows from it by exact arithmetic: the normalizer from the dataset size), hence a checkpoint's
#: identity (:func:`description_fingerprint`). Not in it: the accountant's ``epsilon`` and ``method``
#: (derived; they differ in the last digits between numpy versions and machines, and ``auto`` may
#: pick another method after an upgrade: a checkpoint's claim is re-checked instead,
#: :meth:`RunSpec.check_checkpoint`) and the ``dpmf plan`` row's own numbers (its strategy, scheme
#: and noise are already here). The seed lives in the framework's noise and sampler states.
IDENTITY_KEYS = ("strategy", "scheme", "noise_multiplier", "max_grad_norm", "normalizer", "num_examples", "delta")


def _canonical(value):
    """``value`` with every number as a Python ``int`` / ``float`` (numpy scalars included) and
    tuples as lists, so its JSON (floats by ``repr``: the shortest digits that round-trip) is the
    same on every machine, numpy and Python."""
    import numbers

    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


def description_fingerprint(description: dict) -> str:
    """The short hash :meth:`RunSpec.fingerprint` gives a :meth:`RunSpec.describe` dict: 16 hex digits
    of the SHA-256 of the sorted, canonical JSON (:func:`_canonical`) of its *inputs* only
    (:data:`IDENTITY_KEYS`; a missing key counts as ``null``), so the same run has the same
    fingerprint on every machine and numpy. A checkpoint stores both; loading recomputes this one to
    catch a description edited after saving (:meth:`RunSpec.check_checkpoint`)."""
    identity = {k: _canonical(description.get(k)) for k in IDENTITY_KEYS}
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def legacy_description_fingerprint(description: dict) -> str:
    """The fingerprint checkpoints stored before issue 51 (dpmf main up to 5518073): the hash of the
    *whole* description, the accountant's epsilon to the last digit included. Loading still accepts
    it (recomputed from the stored description, which it protects against edits), then compares the
    inputs as for a new checkpoint."""
    return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()[:16]


class HasRunSpec:
    """A run's privacy side (``privacy`` of the torch and JAX ``make_private``) holds its
    :class:`RunSpec` as ``run_spec``; ``plan``, its name before the rename, still reads it with a
    :class:`DeprecationWarning` (*plan* is a ``dpmf plan`` row)."""

    run_spec: "RunSpec"

    @property
    def plan(self) -> "RunSpec":
        import warnings

        warnings.warn("privacy.plan is deprecated: use privacy.run_spec (the RunSpec; a 'plan' is a dpmf plan row)",
                      DeprecationWarning, stacklevel=2)
        return self.run_spec


@dataclass(frozen=True)
class RunSpec:
    """What a run will do and the report that certifies it (module docstring). Frozen."""

    strategy: object = field(repr=False)
    scheme: object
    noise_multiplier: float
    max_grad_norm: float
    normalizer: float
    num_examples: int
    delta: float
    report: object = field(repr=False)  # PrivacyReport
    #: The ``dpmf plan`` row the spec was built from (:meth:`~dpmf.planning.rows.PlanRow.describe_source`),
    #: or ``None`` (built from a strategy and a scheme).
    plan_row: dict | None = field(default=None, repr=False)

    @property
    def steps(self) -> int:
        return self.scheme.steps

    @property
    def epsilon(self) -> float:
        return self.report.epsilon

    @property
    def steps_per_epoch(self) -> int:
        """Steps of one epoch (:func:`steps_per_epoch`); :attr:`steps` counts every epoch."""
        return steps_per_epoch(self.scheme)

    @property
    def epochs(self) -> int:
        """Epochs of the run, ``ceil(steps / steps_per_epoch)`` (the last one shorter when the steps
        are not a multiple of an epoch)."""
        return -(-self.steps // self.steps_per_epoch)

    def epoch_of(self, step: int) -> int:
        """The 0-based epoch of the 0-based ``step``: ``step // steps_per_epoch``
        (:class:`StepOutOfPlanError` outside ``0..steps - 1``)."""
        if isinstance(step, bool) or not isinstance(step, int):
            raise InvalidParameterError(f"step must be an integer, got {step!r}")
        self.check_step(step)
        return step // self.steps_per_epoch

    @property
    def noise_std(self) -> float:
        """Standard deviation of ``z`` on the clipped *sum*: ``noise_multiplier * max_grad_norm``."""
        return self.noise_multiplier * self.max_grad_norm

    def describe(self) -> dict:
        """JSON-ready description: the run's inputs (:data:`IDENTITY_KEYS`, what a checkpoint must
        match) and the report's claim (``epsilon``, ``method``: re-checked on resume, not matched)."""
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
        """A short hash of the run's inputs in :meth:`describe` (:func:`description_fingerprint`;
        checkpoints compare it): the same on every machine and numpy, whatever the accountant's last digits."""
        return description_fingerprint(self.describe())

    def training_report(self, steps_done: int, **fields):
        """The plan's certified report with ``diagnostics["training"]``: steps done of steps planned,
        clip norm, normalizer, dataset size, the plan row, and the adapter's ``fields`` (e.g. how
        per-example gradients were computed). What ``Privacy.report()`` returns in every framework
        (releasing the first ``t`` steps' models is post-processing of the whole planned run)."""
        import dataclasses

        r = self.report
        training = {"steps_done": steps_done, "steps_planned": self.steps, "max_grad_norm": self.max_grad_norm,
                    "normalizer": self.normalizer, **fields, "num_examples": self.num_examples,
                    **({"plan_row": self.plan_row} if self.plan_row else {})}
        return dataclasses.replace(r, diagnostics={**r.diagnostics, "training": training})

    def checkpoint_entries(self) -> dict:
        """``{"plan": describe(), "plan_fingerprint": fingerprint()}``: what every framework's checkpoint
        stores of its spec (the keys of the first checkpoint format), read back by :meth:`check_checkpoint`."""
        return {"plan": self.describe(), "plan_fingerprint": self.fingerprint()}

    def epsilon_at(self, delta: float) -> float:
        """Epsilon of this run at another ``delta``, recomputed with the report's accountant and options."""
        from dpmf.accounting import account

        r = self.report
        return account(self.strategy, self.scheme, self.noise_multiplier, delta, r.method, **r.options).epsilon

    def save_report(self, make_report, path) -> list:
        """Write ``make_report()`` (a training report of this run, made once ``path`` is checked) as JSON
        to ``path`` (its folder must exist), and next to it, as ``<sha256>.npz``, the dense matrix a
        large dense strategy's description names by hash only, so ``dpmf verify path`` (which searches
        the report's folder) re-checks it from the files alone. Returns the paths written. Every file is replaced
        atomically (:func:`dpmf.files.atomic_write`): a failed write leaves the previous report whole;
        the matrix is written first, so a report never names a matrix that is not beside it."""
        from dpmf.files import atomic_write, check_output_file
        from dpmf.strategies.serialization import save_matrices

        path = check_output_file(path, "path")
        text = make_report().to_json(indent=1) + "\n"
        desc = self.strategy.describe()
        matrices = save_matrices(self.strategy, path.parent) if "matrix" not in desc and "sha256" in desc else []
        with atomic_write(path, "privacy report") as fh:
            fh.write(text.encode("utf-8"))
        return [path, *matrices]

    def check_checkpoint(self, state: dict) -> None:
        """Refuse a checkpoint ``state`` whose plan description no longer hashes to its stored
        ``plan_fingerprint`` (edited or damaged after saving), that belongs to another run (its inputs,
        :data:`IDENTITY_KEYS`, differ: the differences named) or whose epsilon claim no longer holds
        (:meth:`_check_claim`). Every framework's ``load_state_dict`` runs this first. A checkpoint
        written before issue 51 (its fingerprint hashes the whole description,
        :func:`legacy_description_fingerprint`) is checked the same way."""
        there, stored = state.get("plan"), state.get("plan_fingerprint")
        recomputed = description_fingerprint(there) if isinstance(there, dict) else None
        if recomputed is None or stored not in (recomputed, legacy_description_fingerprint(there)):
            raise InvalidParameterError(
                f"the checkpoint's plan description does not match its plan_fingerprint (stored {stored!r}, "
                f"recomputed from the description {recomputed!r}): the description was edited or damaged after "
                "saving, so the checkpoint cannot say which plan it belongs to; resume from an unedited checkpoint"
            )
        if recomputed != self.fingerprint():
            here = self.describe()
            diff = [k for k in IDENTITY_KEYS if _canonical(here.get(k)) != _canonical(there.get(k))]
            detail = "; ".join(f"{k}: {there.get(k)!r} in the checkpoint, {here.get(k)!r} here" for k in diff[:4])
            raise InvalidParameterError(f"the checkpoint belongs to another training plan ({detail or 'fingerprint differs'})")
        self._check_claim(there)

    def _check_claim(self, there: dict) -> None:
        """The epsilon a checkpoint of this run claims must still hold: this spec's report (the
        accountant evaluated on this machine, with this dpmf, when the spec was built) confirms it up
        to :data:`~dpmf.accounting.verify.REL_SLACK` (floating-point noise between machines and
        numpy versions is not a difference); failing that, the checkpoint's own accountant, where it
        is another, is evaluated once at the run's noise and delta. A claim neither confirms is refused."""
        from dpmf.accounting import account
        from dpmf.accounting.verify import REL_SLACK
        from dpmf.errors import DPMFError

        claim, method = there.get("epsilon"), there.get("method")
        if isinstance(claim, bool) or not isinstance(claim, (int, float)) or not claim >= 0:
            raise InvalidParameterError(
                f"the checkpoint's plan description has no valid epsilon claim (epsilon={claim!r}): it was edited or "
                "damaged after saving; resume from an unedited checkpoint"
            )
        r = self.report
        holds = lambda eps: eps <= claim + REL_SLACK * abs(claim)  # noqa: E731
        if holds(r.epsilon):
            return
        again = None
        if isinstance(method, str) and method != r.method:
            try:
                again = account(self.strategy, self.scheme, self.noise_multiplier, self.delta, method).epsilon
            except DPMFError:
                again = None
            if again is not None and holds(again):
                return
        by_theirs = f"; its own accountant {method} gives {again!r}" if again is not None else ""
        raise InvalidParameterError(
            f"the checkpoint claims epsilon {claim!r} ({method}) for this run, but the accountant gives {r.epsilon!r} "
            f"({r.method}) at noise multiplier {self.noise_multiplier!r} and delta {self.delta!r}{by_theirs}: the "
            "claim no longer holds (the description was edited, or the dpmf that wrote it certified too little): the run, "
            "and the models it saved, are covered only by the recomputed epsilon; report that one, or start a new run"
        )

    def check_step(self, step: int) -> None:
        """Raise :class:`StepOutOfPlanError` unless ``0 <= step < steps``."""
        if not 0 <= step < self.steps:
            raise StepOutOfPlanError(
                f"step {step} is outside the plan: the privacy report covers steps 0..{self.steps - 1} "
                f"({self.steps} steps of {self.scheme.describe()['name']} with strategy "
                f"{self.strategy.describe()['name']}); build a new plan for a longer run"
            )


def build_run_spec(
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
) -> RunSpec:
    """Certify a run before its first step: exactly one of ``noise_multiplier`` (then
    ``dpmf.account``) or ``target_epsilon`` (then ``dpmf.calibrate``: the smallest noise whose
    certified epsilon meets the target).

    ``accountant`` is a ``dpmf.account`` method (``"auto"``: the tightest valid proved one). Monte
    Carlo is accepted only through calibration (Estimate-Verify-Release, certified); an uncertified
    report is refused. A pair no sound accountant covers raises
    :class:`~dpmf.errors.UnsupportedConfigurationError` here, before training. ``normalizer``
    defaults to :func:`expected_batch_size` (a public constant; any positive public constant is
    allowed).

    A calibration whose rough estimate (:func:`~dpmf.accounting.cost.accounting_cost`) is 5 s or
    more says so on stderr and shows its progress (:func:`dpmf.progress.shown_if_long`: a bar on a
    terminal, log lines in a notebook or a log; ``DPMF_PROGRESS=off`` silences it); inside a
    ``dpmf.progress.reporting()`` block, that block's reporter shows it instead.
    """
    from dpmf.accounting import account, calibrate

    m, clip, d = _check_run(strategy, scheme, num_examples, max_grad_norm, delta, normalizer)
    if (noise_multiplier is None) == (target_epsilon is None):
        raise InvalidParameterError("pass exactly one of noise_multiplier and target_epsilon")
    if target_epsilon is not None:
        target = _v.positive("target_epsilon", target_epsilon)
        with progress.shown_if_long(f"calibrating the noise to epsilon {target:g} at delta {d:g} before the first step",
                                    _calibration_seconds(strategy, scheme, target, d, accountant, accountant_options)):
            cal = calibrate(strategy, scheme, target, d, accountant, **accountant_options)
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
    return RunSpec(strategy, scheme, float(sigma), clip, float(norm), m, d, report)


def _calibration_seconds(strategy, scheme, target: float, delta: float, accountant, options: dict) -> float:
    """The rough estimate of :func:`~dpmf.accounting.cost.accounting_cost` for this calibration (0
    when there is none: a pair or option the accountants will refuse by name, with a better message)."""
    from dpmf.accounting.cost import accounting_cost
    from dpmf.errors import DPMFError

    try:
        return accounting_cost(strategy, scheme, method=accountant if isinstance(accountant, str) else "auto",
                               calibrate=True, num_samples=options.get("num_samples"), target_epsilon=target,
                               delta=delta).seconds
    except (DPMFError, TypeError, ValueError, MemoryError):
        return 0.0


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
        f"dpmf plan --export, or a RunSpec; got {type(plan).__name__}"
    )


def run_spec_from_row(
    row,
    *,
    num_examples: int,
    max_grad_norm: float,
    delta: float | None = None,
    normalizer: float | None = None,
    search_dir=None,
    **execution_options,
) -> RunSpec:
    """The run spec of exactly what a ``dpmf plan`` row certified: its strategy, its scheme
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
    return RunSpec(strategy, scheme, float(sigma), clip, float(norm), m, d, report,
                         plan_row=row.describe_source())


def resolve_run_spec(
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
) -> RunSpec:
    """The run spec of a framework adapter's ``make_private`` (PyTorch, JAX): built and
    certified from ``strategy``, ``sampling`` and the guarantee (:func:`build_run_spec`), or taken from
    ``plan`` (a ``dpmf plan`` row, re-checked and never recalibrated, or a :class:`RunSpec`
    used as it is); the same refusals, with the same messages, for every framework."""
    if plan is None:
        missing = [k for k, v in (("strategy", strategy), ("sampling", sampling), ("delta", delta),
                                  ("max_grad_norm", max_grad_norm)) if v is None]
        if missing:
            raise InvalidParameterError(
                f"make_private needs {', '.join(missing)} (with noise_multiplier or target_epsilon), or plan=<a dpmf "
                "plan row, its exported file, or a RunSpec>"
            )
        return build_run_spec(
            strategy, sampling, num_examples=num_examples, delta=delta, max_grad_norm=max_grad_norm,
            noise_multiplier=noise_multiplier, target_epsilon=target_epsilon, accountant=accountant,
            normalizer=normalizer, **(accountant_options or {}),
        )
    return _run_spec_from(plan, num_examples=num_examples, delta=delta, max_grad_norm=max_grad_norm,
                      normalizer=normalizer, conflicts={"strategy": strategy, "sampling": sampling,
                                                        "noise_multiplier": noise_multiplier,
                                                        "target_epsilon": target_epsilon,
                                                        "accountant": None if accountant == "auto" else accountant},
                      accountant_options=accountant_options)


def _run_spec_from(plan, *, num_examples, delta, max_grad_norm, normalizer, conflicts, accountant_options) -> RunSpec:
    """``make_private(plan=...)``: the run spec of a plan row (re-checked, never recalibrated) or
    a :class:`RunSpec` used as it is; options that would contradict it are refused."""
    given = [k for k, v in conflicts.items() if v is not None]
    if given:
        raise InvalidParameterError(
            f"plan= fixes the strategy, the sampling scheme and the noise (hence epsilon); do not also pass "
            f"{', '.join(f'{k}={conflicts[k]!r}' for k in given)}: drop {'it' if len(given) == 1 else 'them'}, or "
            "drop plan= to choose them yourself"
        )
    if isinstance(plan, RunSpec):
        if accountant_options:
            raise InvalidParameterError(
                f"accountant_options={accountant_options!r} have nothing to do with a RunSpec: it is already "
                "certified (its report was computed when it was built); drop them"
            )
        for name, value, planned in (("delta", delta, plan.delta), ("max_grad_norm", max_grad_norm, plan.max_grad_norm),
                                     ("normalizer", normalizer, plan.normalizer)):
            if value is not None and value != planned:
                raise InvalidParameterError(
                    f"{name}={value!r} but the RunSpec has {name}={planned!r}: leave {name} out (the plan's is "
                    "used) or build a new plan"
                )
        if num_examples != plan.num_examples:
            raise InvalidParameterError(
                f"the dataset has {num_examples} examples but the RunSpec was built for num_examples="
                f"{plan.num_examples}: build a plan for this dataset"
            )
        return plan
    if max_grad_norm is None:
        raise InvalidParameterError(
            "max_grad_norm is needed with a plan row (a row fixes the mechanism, not the clip norm): pass "
            "max_grad_norm=<per-example clip norm>"
        )
    return run_spec_from_row(plan, num_examples=num_examples, max_grad_norm=max_grad_norm, delta=delta,
                         normalizer=normalizer, **(accountant_options or {}))


#: Options that change how an accountant runs, never its value (:data:`dpmf.accounting.guard.EXECUTION_OPTIONS`).
_EXECUTION_OPTIONS = frozenset({"workers", "scheduler", "cache_dir"})
