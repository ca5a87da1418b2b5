"""From what the audited runs released to an :class:`~dpmf.auditing.report.AuditReport` (torch-free).

A training adapter (:mod:`dpmf.training.torch.audit`) trains with the canaries and hands over, per
run, a :class:`Released`: the coins, and what the attacker saw -- the audit block's noisy gradient
sums (white-box) or each canary's loss decrease (black-box). :func:`assess` then runs the audit's
stages, each a function of the configuration and what came before:

1. :func:`score` -- the attacker's scores, computed without the coins (white-box: the likelihood
   ratio of :class:`~dpmf.auditing.whitebox.WhiteBoxScorer` and its fitted-noise variants);
2. :func:`one_run_bound` or :func:`many_run_bound` -- the empirical lower bound
   (:mod:`dpmf.auditing.bounds`) with the tests or threshold pre-registered on simulations of the
   claimed mechanism (:mod:`dpmf.auditing.game`);
3. :func:`gaussian_reference` -- the ideal attacker on the Gaussian mechanism with the claim;
4. the report, with the run's certified upper bound beside the lower one.

The run's plan is read through its attributes only (``strategy``, ``scheme``, ``noise_multiplier``,
``delta``, ``report``, ``steps``, ``max_grad_norm``, ``normalizer``), so any framework's adapter
can hand it over.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpmf.auditing import bounds
from dpmf.auditing.config import AuditConfig
from dpmf.auditing.game import (
    ideal_gaussian_reference,
    mechanism_audit,
    preregister,
    simulate_released,
    substream_seed,
)
from dpmf.auditing.report import AuditReport
from dpmf.auditing.whitebox import WhiteBoxScorer

__all__ = ["Released", "Scores", "assess", "score", "one_run_bound", "many_run_bound", "gaussian_reference"]


@dataclass(frozen=True, eq=False)
class Released:
    """What one audited training run released to the attacker: ``plan`` (the run's certified plan),
    ``coins`` (``(m,)`` booleans: which canaries were included; the attacker never sees them), and
    ``sums`` (white-box: ``(steps, m)`` noisy gradient sums of the audit block in clip-norm units)
    or ``loss_decrease`` (black-box: ``(m,)`` initial minus final loss of each canary)."""

    plan: Any
    coins: np.ndarray
    sums: np.ndarray | None = None
    loss_decrease: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class Scores:
    """The attacker's scores (``values``, higher = "included") and how they were made (``info``,
    kept in the report); white-box also the ``scorer`` and its score ``variants``."""

    values: np.ndarray
    info: dict
    scorer: WhiteBoxScorer | None = None
    variants: dict | None = None


def score(config: AuditConfig, plan, runs: list[Released], num_examples: int) -> Scores:
    """Stage 1: every canary's score over all ``runs``, without their coins."""
    if not config.white_box:
        return Scores(np.concatenate([r.loss_decrease for r in runs]),
                      {"method": "loss decrease", "description": "loss of the initial model minus loss of the final "
                       "model on each canary (higher: more likely included)"})
    scorer = WhiteBoxScorer(plan.strategy, plan.scheme, plan.noise_multiplier, num_examples)
    variants = scorer.scores(np.concatenate([r.sums for r in runs], axis=1))
    info = {
        **scorer.describe(),
        "noise_check": {**variants["check"], "steps_below": variants["steps_below"]},
        "description": (f"log-likelihood ratio over the {plan.scheme.describe()['name']} sampler's law after whitening "
                        f"with {scorer.whitening}" + ("" if scorer.exact else " (an approximation: valid, less powerful)")
                        + f"; method {scorer.method}"),
    }
    return Scores(variants["claimed"], info, scorer, variants)


def one_run_bound(config: AuditConfig, plan, scores: Scores, coins: np.ndarray,
                  num_examples: int) -> tuple[dict, float, str, dict | None]:
    """Stage 2 of a one-run audit: ``(statistics, lower bound, its theorem, mechanism reference)``.
    White-box: the tests pre-registered on the claimed mechanism (:func:`~dpmf.auditing.game.preregister`)
    and the same tests on the mechanism alone; black-box: a short Bonferroni grid."""
    m, d, conf = config.per_run, plan.delta, config.confidence
    mech_ref = None
    if config.white_box:
        tests = preregister(scores.scorer, canaries=m, delta=d, confidence=conf, seed=config.seed)
        res = tests.audit(scores.variants, coins, d, conf)
        selection = f"{tests.describe()}; the bound is from {res.selection}"
        if config.reference_trials:
            vals = [mechanism_audit(plan.strategy, plan.scheme, plan.noise_multiplier, d, canaries=m,
                                    num_examples=num_examples, seed=config.seed * 1000 + t, confidence=conf,
                                    tests=tests, scorer=scores.scorer).epsilon_lower
                    for t in range(min(config.reference_trials, 10))]
            mech_ref = {"median": float(np.median(vals)), "trials": len(vals),
                        "what": "the same audit on the mechanism alone (numpy simulation, no training code)"}
    else:
        res = bounds.audit_one_run(scores.values, coins, d, conf)
        selection = res.selection
    return {**res.to_dict(), "selection": selection}, res.epsilon_lower, res.bound, mech_ref


def many_run_bound(config: AuditConfig, plan, scores: Scores, coins: np.ndarray,
                   num_examples: int) -> tuple[dict, float, str]:
    """Stage 2 of a many-run audit: ``(statistics, lower bound, its theorem)`` by Clopper-Pearson.
    White-box: the threshold pre-registered on simulated scores of the claimed mechanism; black-box:
    chosen on a random half of the runs, the bound from the other half."""
    d, conf, seed = plan.delta, config.confidence, config.seed
    if config.white_box:
        k = min(num_examples, 400)  # (canaries of one simulated run: only their scores' marginal law matters here)
        sims = [simulate_released(plan.strategy, plan.scheme, plan.noise_multiplier, canaries=k,
                                  num_examples=num_examples,
                                  seed=substream_seed(seed, 5, t))
                for t in range(max(5, 2000 // k))]
        s_in = np.concatenate([scores.scorer.score(r)[c] for r, c in sims])
        s_out = np.concatenate([scores.scorer.score(r)[~c] for r, c in sims])
        thr = bounds.choose_threshold(s_in, s_out, config.runs, d, conf)
        res = bounds.audit_many_runs(scores.values, coins, d, conf, threshold=thr)
    else:
        res = bounds.audit_many_runs(scores.values, coins, d, conf, seed=seed)
    return res.to_dict(), res.epsilon_lower, res.bound


def gaussian_reference(config: AuditConfig, plan) -> dict | None:
    """Stage 3: the ideal attacker on the Gaussian mechanism with the claimed (epsilon, delta)
    (one-run audits with ``reference_trials``; else None)."""
    if not (config.reference_trials and config.runs == 1):
        return None
    ref = ideal_gaussian_reference(plan.report.epsilon, plan.delta, config.per_run, config.confidence,
                                   trials=config.reference_trials, seed=config.seed)
    return {**ref.to_dict(), "what": "ideal attacker on the Gaussian mechanism with the claimed (epsilon, "
            "delta), same canaries and confidence (simulated)"}


def assess(config: AuditConfig, runs: list[Released], *, num_examples: int, model: str = "built-in",
           start: float | None = None) -> AuditReport:
    """The audit's report from what ``runs`` released (module docstring). ``num_examples``: the
    dataset size of each run (real examples plus its canaries); ``model``: ``"built-in"`` or
    ``"user"``; ``start``: the ``time.perf_counter()`` the audit began at (for ``seconds``)."""
    start = time.perf_counter() if start is None else start
    plan = runs[-1].plan
    certified, d, conf, m = plan.report, plan.delta, config.confidence, config.per_run
    coins = np.concatenate([r.coins for r in runs])
    scores = score(config, plan, runs, num_examples)
    mech_ref = None
    if config.runs == 1:
        stats_d, lower, bound, mech_ref = one_run_bound(config, plan, scores, coins, num_examples)
    else:
        stats_d, lower, bound = many_run_bound(config, plan, scores, coins, num_examples)
    configuration = {
        "strategy": plan.strategy.describe(), "scheme": plan.scheme.describe(),
        "noise_multiplier": plan.noise_multiplier, "max_grad_norm": plan.max_grad_norm,
        "normalizer": plan.normalizer, "num_examples": num_examples, "real_examples": num_examples - m,
        "canary_examples": m, "steps": plan.steps, "method": certified.method,
    }
    return AuditReport(
        epsilon_lower=float(lower), epsilon_certified=float(certified.epsilon), delta=d, confidence=conf,
        threat_model=config.threat, canaries=config.canaries, mode=config.mode, bound=bound, runs=config.runs,
        statistics=stats_d, configuration=configuration, score=scores.info, reference=gaussian_reference(config, plan),
        mechanism_reference=mech_ref, roc=bounds.empirical_roc(scores.values, coins, points=8, confidence=conf),
        roc_estimates=bounds.empirical_roc(scores.values, coins, points=24), seed=config.seed,
        seconds=time.perf_counter() - start, model=model, certified=certified,
    )
