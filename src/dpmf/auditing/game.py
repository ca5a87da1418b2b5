"""The white-box canary game on the mechanism itself, and the audit's pre-registered tests.

What a white-box audit of a training run observes in its audit block
(:mod:`dpmf.auditing.whitebox`) is, by construction, the matrix mechanism alone: canary ``i``'s
released sums are ``x_hat_i = S_i p_i + sigma L z_i`` with ``S_i`` its coin, ``p_i`` its
participation drawn by the scheme's own batch generator and ``L`` the strategy's noising matrix.
:func:`simulate_released` draws exactly that. It serves three purposes:

* **pre-registration** (:func:`preregister`): the audit's guess counts are chosen on simulations of
  the *claimed* mechanism -- public information only -- before the audited run's coins exist, so
  no multiple-testing correction is paid for choosing them;
* **the reference** "ideal attacker on this very mechanism" (:func:`mechanism_audit`: no model, no
  optimizer, no float32): a training-path audit should match it in law;
* **fast statistical checks**: a correct mechanism must not exceed its certified epsilon more often
  than the confidence allows (it is a simulation of a correct implementation: it can never detect a
  bug in training code).

The tests (:class:`WhiteBoxTests`), each on one of the scores of
:meth:`~dpmf.auditing.whitebox.WhiteBoxScorer.scores`, share the level ``1 - confidence`` by a
weighted Bonferroni correction: 80% for the claim-optimal guess count on the likelihood ratio of
the claimed mechanism (the audit's power against the claim), 5% for each of four gross-fault tests
(two guess counts, :func:`~dpmf.privacy.auditing.fault_catchers`, on the fitted-noise scores
``"scalar"`` and ``"per-step"``), which catch runs that added far less noise than claimed (a
smaller sigma, the sigma of another strategy, steps without noise) at the claims where the
claim-optimal count saturates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpmf import validation as _v
from dpmf.auditing.whitebox import WhiteBoxScorer, participation_masks
from dpmf.errors import InvalidParameterError
from dpmf.privacy import auditing as _stats
from dpmf.privacy.auditing import Guesses, OneRunResult

__all__ = ["simulate_released", "WhiteBoxTests", "preregister", "mechanism_audit", "TEST_WEIGHTS"]

#: Shares of the level ``1 - confidence``: the claim-optimal test, then each gross-fault test.
TEST_WEIGHTS = (0.8, 0.05)


def simulate_released(strategy, scheme, noise_multiplier: float, *, canaries: int, num_examples: int,
                      seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(released, coins)``: the audit block's released sums ``(n, canaries)`` in clip-norm units and
    the canaries' coins, for a run on ``num_examples`` examples of which the first ``canaries`` are
    the canaries (the coins, the sampler and the noise use independent streams of ``seed``)."""
    m = _v.positive_int("canaries", canaries)
    N = _v.positive_int("num_examples", num_examples)
    sigma = _v.non_negative("noise_multiplier", noise_multiplier)
    if m > N:
        raise InvalidParameterError(f"canaries ({m}) must be at most num_examples ({N})")
    coin_seed, sampler_seed, noise_seed = np.random.SeedSequence([int(seed), 25]).generate_state(3)
    coins = np.random.default_rng(coin_seed).random(m) < 0.5
    P = participation_masks(scheme, N, int(sampler_seed), examples=np.arange(m)).astype(np.float64)
    L = np.asarray(strategy.noising_matrix(), dtype=np.float64)
    Z = np.random.default_rng(noise_seed).standard_normal((L.shape[1], m))
    return P * coins[None, :] + sigma * (L @ Z), coins


@dataclass(frozen=True)
class WhiteBoxTests:
    """The five pre-registered tests of a white-box one-run audit (module docstring)."""

    claim_optimal: Guesses
    gross: tuple

    def tests(self, variants: dict) -> list:
        """``(scores, guesses, weight, label)`` for :func:`~dpmf.privacy.auditing.audit_one_run_tests`
        from the score variants of :meth:`WhiteBoxScorer.scores`."""
        w0, w1 = TEST_WEIGHTS
        out = [(variants["claimed"], self.claim_optimal, w0, "the claim-optimal test")]
        for key, words in (("scalar", "noise level"), ("per-step", "per-step noise")):
            for g in self.gross:
                out.append((variants[key], g, w1, f"a gross-fault test (fitted {words})"))
        return out

    def audit(self, variants: dict, coins, delta: float, confidence: float) -> OneRunResult:
        """The one-run bound over the five tests (weighted Bonferroni)."""
        return _stats.audit_one_run_tests(coins, delta, confidence, self.tests(variants))

    def describe(self) -> str:
        return (f"5 tests pre-registered on simulations of the claim, weighted Bonferroni ({TEST_WEIGHTS[0]:.0%} of the "
                f"level on the claim-optimal one, {TEST_WEIGHTS[1]:.0%} on each gross-fault one)")


def _seed(*parts) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def preregister(scorer: WhiteBoxScorer, *, canaries: int, delta: float, confidence: float = 0.95,
                seed: int = 0, trials: int = 50) -> WhiteBoxTests:
    """Fix the tests of a white-box audit from the claimed mechanism alone: the claim-optimal guess
    count by :func:`~dpmf.privacy.auditing.choose_guesses` on ``trials`` simulated games of
    ``scorer``'s configuration, the gross-fault counts from the number of canaries."""
    m = _v.positive_int("canaries", canaries)

    def simulate(t: int):
        rel, c = simulate_released(scorer.strategy, scorer.scheme, scorer.sigma, canaries=m,
                                   num_examples=scorer.num_examples, seed=_seed(seed, 5, t))
        return scorer.score(rel), c

    g = _stats.choose_guesses(simulate, m, delta, confidence, trials=trials)
    return WhiteBoxTests(g, _stats.fault_catchers(m))


def mechanism_audit(strategy, scheme, noise_multiplier: float, delta: float, *, canaries: int,
                    num_examples: int, seed: int, confidence: float = 0.95, tests: WhiteBoxTests | None = None,
                    scorer: WhiteBoxScorer | None = None,
                    released_noise_multiplier: float | None = None) -> OneRunResult:
    """One simulated white-box audit of the mechanism (module docstring): the empirical lower bound at
    ``confidence`` for this seed, with the tests of a real audit (``tests``, default
    :func:`preregister`). ``released_noise_multiplier`` simulates a run that adds another noise than
    the claimed ``noise_multiplier`` (a planted fault, for checking the audit's power)."""
    scorer = scorer or WhiteBoxScorer(strategy, scheme, noise_multiplier, num_examples)
    tests = tests or preregister(scorer, canaries=canaries, delta=delta, confidence=confidence, seed=seed)
    sigma = noise_multiplier if released_noise_multiplier is None else released_noise_multiplier
    released, coins = simulate_released(strategy, scheme, sigma, canaries=canaries, num_examples=num_examples,
                                        seed=_seed(seed, 6))
    return tests.audit(scorer.scores(released), coins, delta, confidence)
