"""``dpmf audit``: is a training configuration as private as its report says? Parse, call, print.

The command takes ``dpmf account``'s options (the same option objects and the same strategy and
sampler parsing: :func:`register` receives them from :mod:`dpmf.cli.main`, which registers the
command) plus the audit's own: ``--canaries``, ``--threat``, ``--runs``, ``--seed``,
``--confidence``, ``--examples``, ``--reference-trials``, ``--plot``. The library does the work
(:func:`dpmf.training.torch.audit.audit_training`, on the built-in model; needs torch): the options
are parsed into one :class:`~dpmf.auditing.config.AuditConfig`.

Everything printed labels the audit's number as an **empirical lower bound** (not a certificate);
the certified upper bound of the same configuration is printed next to it.
"""

from __future__ import annotations

import json
from enum import Enum
from types import SimpleNamespace
from typing import Callable, Optional

import typer

from dpmf.cli.console import cli_errors, cli_progress, err, out

__all__ = ["register", "Threat"]


class Threat(str, Enum):
    white_box = "white-box"
    black_box = "black-box"


#: The ``dpmf account`` options ``dpmf audit`` reuses (keys of the ``options`` given to :func:`register`).
SHARED = ("strategy", "sampling", "steps", "sampling_prob", "epochs", "min_sep", "warm_start", "max_batch_size",
          "dataset_size", "num_selected", "fresh_slots", "bands", "delta", "method", "force", "json", "quiet")


def register(app: typer.Typer, *, options: dict, build: Callable) -> None:
    """Add ``dpmf audit`` to ``app``: ``options`` maps the names of :data:`SHARED` to ``dpmf account``'s
    option objects, ``build(strategy, sampling, steps, bands, force, **scheme_options)`` is its
    ``(strategy, scheme)`` builder (unused options refused, the strategy's cost checked)."""
    missing = [k for k in SHARED if k not in options]
    if missing:
        raise TypeError(f"register needs the options {missing}")
    app.command("audit")(_command(options, build))


def _command(o: dict, build: Callable) -> Callable:
    """The ``dpmf audit`` command, its options' defaults taken from ``o`` (``dpmf account``'s)."""

    def audit(
        strategy: str = o["strategy"],
        sampling=o["sampling"],
        steps: Optional[int] = o["steps"],
        sampling_prob: Optional[float] = o["sampling_prob"],
        epochs: Optional[int] = o["epochs"],
        min_sep: Optional[int] = o["min_sep"],
        warm_start: bool = o["warm_start"],
        max_batch_size: Optional[int] = o["max_batch_size"],
        dataset_size: Optional[int] = o["dataset_size"],
        num_selected: Optional[int] = o["num_selected"],
        fresh_slots: bool = o["fresh_slots"],
        bands: Optional[int] = o["bands"],
        noise_multiplier: Optional[float] = typer.Option(
            None, "--noise-multiplier", help="Noise std / clip norm (sigma) of the run; or give --epsilon."),
        epsilon: Optional[float] = typer.Option(
            None, "--epsilon", help="Calibrate sigma to this target epsilon (as make_private's target_epsilon) "
            "instead of giving --noise-multiplier."),
        delta: float = o["delta"],
        method=o["method"],
        clip_norm: float = typer.Option(1.0, "--clip-norm", help="Per-example clip norm (max_grad_norm)."),
        canaries: Optional[int] = typer.Option(
            None, "--canaries", help="Canaries M, each included with probability 1/2 (one run; default 1000); with "
            "--runs R > 1, one canary per run (M = R, the default)."),
        threat: Threat = typer.Option(
            Threat.white_box, "--threat", help="white-box: the attacker sees every noisy update (gradient canaries, "
            "C undone before testing); black-box: only the final model (input canaries, loss scores)."),
        runs: int = typer.Option(1, "--runs", help="1: one-run audit (the one-run theorem); R > 1: R trainings with "
                                 "one canary each (Clopper-Pearson; tiny models)."),
        seed: int = typer.Option(0, "--seed", help="The audit's seed (coins, canaries, sampler, noise, simulations)."),
        confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the empirical lower bound."),
        examples: Optional[int] = typer.Option(
            None, "--examples", help="Real examples of the built-in task (default 1000; the run has these plus the "
            "canaries)."),
        reference_trials: int = typer.Option(
            25, "--reference-trials", help="Simulations of the ideal attackers the audit is compared with (0: none)."),
        plot: Optional[str] = typer.Option(
            None, "--plot", help="Also save a PNG: the audit's empirical (FPR, TPR) against the certified trade-off "
            "curve (its folder must exist)."),
        force: bool = o["force"],
        as_json: bool = o["json"],
        quiet: bool = o["quiet"],
    ) -> None:
        """Audit a training configuration empirically: train the built-in model with canaries and
        report an EMPIRICAL LOWER BOUND on epsilon (evidence, not a certificate) next to the
        certified upper bound of the same configuration.

        A lower bound above the certified epsilon is an alarm (the run leaks more than its report
        says; a correct run raises it with probability at most 1 - confidence). A lower bound below
        it is no proof of privacy: only the certified bound is.

        Example: dpmf audit --strategy identity --sampling poisson --sampling-prob 0.1 --steps 64
        --epsilon 2 --delta 1e-5 --canaries 1000
        """
        a = SimpleNamespace(**locals())
        with cli_errors():
            config = _config(a, build)
            report = _run(config, quiet)
            if plot:
                report.plot(plot)
        _show(report, as_json, plot)

    return audit


def _check(a: SimpleNamespace) -> int:
    """The audit's own options, checked under the names the user typed; the number of canaries
    (default: one per run with ``--runs R > 1``, else 1000)."""
    from dpmf import validation as _v
    from dpmf.errors import InvalidParameterError

    _v.open_unit("delta", a.delta)
    if (a.noise_multiplier is None) == (a.epsilon is None):
        raise InvalidParameterError("give exactly one of --noise-multiplier and --epsilon")
    if a.noise_multiplier is not None:
        _v.positive("noise_multiplier", a.noise_multiplier)
    else:
        _v.positive("target_epsilon", a.epsilon)
    canaries = a.canaries if a.canaries is not None else (a.runs if a.runs > 1 else 1000)
    _v.positive("--clip-norm", a.clip_norm)
    for flag, value in (("--canaries", canaries), ("--runs", a.runs)) + ((("--examples", a.examples),) if
                                                                       a.examples is not None else ()):
        _v.positive_int(flag, value)
    _v.open_unit("--confidence", a.confidence)
    if a.seed < 0:
        raise InvalidParameterError(f"--seed must be an integer >= 0, got {a.seed}")
    if a.reference_trials < 0:
        raise InvalidParameterError(f"--reference-trials must be an integer >= 0, got {a.reference_trials}")
    if a.plot:
        from dpmf.files import check_output_file

        check_output_file(a.plot, "--plot", plot=True)  # before the training
    return canaries


def _real_examples(a: SimpleNamespace, canaries: int) -> int | None:
    """Real examples of the built-in task: ``--examples``, or ``--dataset-size`` less the canaries."""
    from dpmf.errors import InvalidParameterError

    if a.dataset_size is None:
        return a.examples
    per_run = 1 if a.runs > 1 else canaries
    if a.examples is not None and a.examples + per_run != a.dataset_size:
        raise InvalidParameterError("--dataset-size must equal --examples plus the canaries")
    real = a.dataset_size - per_run
    if real < 1:
        raise InvalidParameterError("--dataset-size must exceed the number of canaries (it counts both)")
    return real


def _config(a: SimpleNamespace, build: Callable):
    """The parsed options as one :class:`~dpmf.auditing.config.AuditConfig` (strategy and scheme by
    ``dpmf account``'s builder)."""
    from dpmf.auditing.config import AuditConfig

    canaries = _check(a)
    strategy, scheme = build(
        a.strategy, a.sampling, a.steps, a.bands, a.force, sampling_prob=a.sampling_prob, epochs=a.epochs,
        min_sep=a.min_sep, warm_start=a.warm_start, max_batch_size=a.max_batch_size, dataset_size=a.dataset_size,
        num_selected=a.num_selected, fresh_slots=a.fresh_slots,
    )
    return AuditConfig(
        strategy=strategy, sampling=scheme, delta=a.delta, noise_multiplier=a.noise_multiplier,
        target_epsilon=a.epsilon, max_grad_norm=a.clip_norm, accountant=a.method.value, canaries=canaries,
        threat=a.threat.value, seed=a.seed, confidence=a.confidence, runs=a.runs,
        num_examples=_real_examples(a, canaries), reference_trials=a.reference_trials,
    )


def _run(config, quiet: bool):
    """The audit (needs torch), with progress on stderr; Ctrl-C exits 130."""
    from dpmf.errors import InvalidParameterError

    try:
        from dpmf.training.torch.audit import audit_training
    except ImportError as exc:
        raise InvalidParameterError(f"dpmf audit trains a model and needs torch: {exc}") from None
    try:
        with cli_progress(quiet):
            return audit_training(config)
    except KeyboardInterrupt:
        err.print("interrupted", highlight=False)
        raise typer.Exit(code=130)


def _show(report, as_json: bool, plot: Optional[str]) -> None:
    if as_json:
        payload = report.to_dict()
        if plot:
            payload["plot"] = str(plot)
        out.print_json(json.dumps(payload))
        return
    out.print(report.summary(), highlight=False, markup=False)
    if plot:
        out.print(f"plot written to {plot}", highlight=False, markup=False)
