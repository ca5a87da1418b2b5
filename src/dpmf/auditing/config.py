"""The options of an audit of a training run, as one frozen value: :class:`AuditConfig`.

:func:`dpmf.training.torch.audit.audit_training` takes these options as keywords (or an
``AuditConfig``), and ``dpmf audit`` parses its command line into one. Everything that can be
checked without the training framework is checked when the value is made (the numbers, the
threat model, which options go together), so a bad option fails before any work; what needs the
framework (the model's type, a plan's size against the dataset) is checked by the adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from dpmf import validation as _v
from dpmf.auditing.report import THREAT_MODELS
from dpmf.errors import InvalidParameterError

__all__ = ["AuditConfig", "DEFAULT_REAL_EXAMPLES"]

#: Real examples of the built-in task when ``num_examples`` is not given.
DEFAULT_REAL_EXAMPLES = 1000

#: The options that describe the private run itself (as :func:`~dpmf.training.torch.engine.make_private` takes them).
_PRIVACY_OPTIONS = ("strategy", "sampling", "delta", "max_grad_norm", "noise_multiplier", "target_epsilon",
                    "accountant", "accountant_options")


@dataclass(frozen=True, kw_only=True)
class AuditConfig:
    """What to audit and how (the options of :func:`~dpmf.training.torch.audit.audit_training`).

    Attributes:
        strategy, sampling, delta, noise_multiplier | target_epsilon, max_grad_norm, accountant,
            accountant_options: the configuration, exactly as for
            :func:`~dpmf.training.torch.engine.make_private`; or ``plan``: an
            :class:`~dpmf.training.run_spec.RunSpec` built for ``len(dataset) + canaries`` examples
            (reused as it is: no second accounting).
        canaries: ``m``, the number of canaries (one run); in many-run mode the number of runs.
        threat: ``"white-box"`` (every noisy update) or ``"black-box"`` (the final model only).
        seed: the audit's seed: coins, canaries, sampler, noise and simulations use independent
            streams of it (the scorer never sees the coins).
        confidence: of the lower bound (default 0.95).
        runs: 1 for a one-run audit; ``> 1``: that many independent runs with one canary each
            (tiny models; Clopper-Pearson).
        reference_trials: simulations of the ideal attacker (0: no references).
        model, optimizer, dataset, loss_fn: your model, its optimizer, your dataset of ``(input,
            target)`` pairs and ``loss_fn(output, target)`` (a scalar, as in ``make_private``). All
            ``None``: the built-in task (``builtin_task`` with ``num_examples`` real examples,
            SGD at ``learning_rate``). For ``runs > 1`` pass ``model`` as a function
            ``run -> (module, optimizer)``.
        canary_data: black-box only: ``(inputs, targets)`` of your own canaries (default: far-away
            inputs with random labels; needs integer class labels).
        callback: ``callback(steps_done, steps_total)`` after every training step.

    Made values are checked and normalized (``canaries``, ``runs``, ``seed``, ``reference_trials``
    to ``int``, ``confidence`` to ``float``); a bad option is an
    :class:`~dpmf.errors.InvalidParameterError` naming it.
    """

    # the private run (as make_private takes it), or a plan
    strategy: Any = None
    sampling: Any = None
    delta: float | None = None
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    max_grad_norm: float = 1.0
    plan: Any = None
    accountant: str = "auto"
    accountant_options: dict | None = None
    # the audit
    canaries: int = 1000
    threat: str = "white-box"
    seed: int = 0
    confidence: float = 0.95
    runs: int = 1
    reference_trials: int = 25
    # the model trained (all None: the built-in task)
    model: Any = None
    optimizer: Any = None
    dataset: Any = None
    loss_fn: Callable | None = None
    canary_data: Any = None
    num_examples: int | None = None
    learning_rate: float = 2.0
    callback: Callable[[int, int], None] | None = None

    def __post_init__(self) -> None:
        if self.threat not in THREAT_MODELS:
            raise InvalidParameterError(f"threat must be one of {tuple(THREAT_MODELS)}, got {self.threat!r}")
        m = _v.positive_int("canaries", self.canaries)
        runs = _v.positive_int("runs", self.runs)
        conf = _v.open_unit("confidence", self.confidence)
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InvalidParameterError(f"seed must be an integer >= 0, got {seed!r}")
        _v.positive("learning_rate", self.learning_rate)
        trials = 0 if self.reference_trials == 0 else _v.positive_int("reference_trials", self.reference_trials)
        if runs == 1 and m < 2:
            raise InvalidParameterError(f"a one-run audit needs at least 2 canaries, got {m}")
        if runs > 1 and m != runs:
            raise InvalidParameterError(
                f"many-run mode trains one canary per run: canaries must equal runs ({runs}), got {m}"
            )
        if not self.white_box and self.canary_data is not None and runs > 1:
            raise InvalidParameterError("canary_data is for one-run audits (m canaries in one run)")
        for name, value in (("canaries", m), ("runs", runs), ("confidence", conf), ("seed", int(seed)),
                            ("reference_trials", trials)):
            object.__setattr__(self, name, value)
        self._check_model_options()

    def _check_model_options(self) -> None:
        """The built-in task takes none of the model options; your own model needs its dataset and loss."""
        if self.builtin:
            if self.dataset is not None or self.loss_fn is not None or self.optimizer is not None:
                raise InvalidParameterError("dataset, loss_fn and optimizer go with model=; leave all four out for "
                                            "the built-in task")
            if self.canary_data is not None:
                raise InvalidParameterError("canary_data goes with your own model; the built-in task makes its own")
            return
        if self.dataset is None or self.loss_fn is None:
            raise InvalidParameterError("auditing your own model needs dataset= and loss_fn= too")
        if self.num_examples is not None:
            raise InvalidParameterError("num_examples is for the built-in task; your dataset's size is len(dataset)")

    # ------------------------------------------------------------------ derived
    @property
    def white_box(self) -> bool:
        return self.threat == "white-box"

    @property
    def builtin(self) -> bool:
        """Whether the built-in task is trained (no model given)."""
        return self.model is None

    @property
    def per_run(self) -> int:
        """Canaries in each run: all of them in one run, one per run in many-run mode."""
        return 1 if self.runs > 1 else self.canaries

    @property
    def mode(self) -> str:
        return "one-run" if self.runs == 1 else "many-run"

    def privacy_options(self) -> dict:
        """The private run's options, as keywords of ``make_private``."""
        return {k: getattr(self, k) for k in _PRIVACY_OPTIONS}
