"""The canary games: the white-box game on the mechanism itself, the audit's pre-registered tests,
and the ideal Gaussian game an audit is measured against.

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
(two guess counts, :func:`~dpmf.auditing.bounds.fault_catchers`, on the fitted-noise scores
``"scalar"`` and ``"per-step"``), which catch runs that added far less noise than claimed (a
smaller sigma, the sigma of another strategy, steps without noise) at the claims where the
claim-optimal count saturates.

The *reference* (:func:`ideal_gaussian_reference`) is the Gaussian mechanism that is exactly as
private as claimed (``mu = gdp_mu(eps, delta)``) attacked by the optimal test with the same
canaries, guesses and confidence -- simulated, so an audit can say what fraction of the ideal
attacker's bound it reached.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpmf import validation as _v
from dpmf.auditing import bounds
from dpmf.auditing.bounds import Guesses, OneRunResult
from dpmf.auditing.whitebox import WhiteBoxScorer, participation_masks
from dpmf.errors import InvalidParameterError
from dpmf.privacy.gdp import gdp_mu

__all__ = ["simulate_released", "WhiteBoxTests", "preregister", "mechanism_audit", "TEST_WEIGHTS", "GaussianReference",
           "gaussian_game", "ideal_gaussian_reference", "substream_seed"]

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
        """``(scores, guesses, weight, label)`` for :func:`~dpmf.auditing.bounds.audit_one_run_tests`
        from the score variants of :meth:`WhiteBoxScorer.scores`."""
        w0, w1 = TEST_WEIGHTS
        out = [(variants["claimed"], self.claim_optimal, w0, "the claim-optimal test")]
        for key, words in (("scalar", "noise level"), ("per-step", "per-step noise")):
            for g in self.gross:
                out.append((variants[key], g, w1, f"a gross-fault test (fitted {words})"))
        return out

    def audit(self, variants: dict, coins, delta: float, confidence: float) -> OneRunResult:
        """The one-run bound over the five tests (weighted Bonferroni)."""
        return bounds.audit_one_run_tests(coins, delta, confidence, self.tests(variants))

    def describe(self) -> str:
        return (f"5 tests pre-registered on simulations of the claim, weighted Bonferroni ({TEST_WEIGHTS[0]:.0%} of the "
                f"level on the claim-optimal one, {TEST_WEIGHTS[1]:.0%} on each gross-fault one)")


def substream_seed(*parts) -> int:
    """An integer seed of its own for the stream ``parts`` (e.g. ``(seed, 5, trial)``) of an audit's
    seed: the coins, the sampler, the noise and every simulation draw from independent streams."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def preregister(scorer: WhiteBoxScorer, *, canaries: int, delta: float, confidence: float = 0.95,
                seed: int = 0, trials: int = 50) -> WhiteBoxTests:
    """Fix the tests of a white-box audit from the claimed mechanism alone: the claim-optimal guess
    count by :func:`~dpmf.auditing.bounds.choose_guesses` on ``trials`` simulated games of
    ``scorer``'s configuration, the gross-fault counts from the number of canaries."""
    m = _v.positive_int("canaries", canaries)

    def simulate(t: int):
        rel, c = simulate_released(scorer.strategy, scorer.scheme, scorer.sigma, canaries=m,
                                   num_examples=scorer.num_examples, seed=substream_seed(seed, 5, t))
        return scorer.score(rel), c

    g = bounds.choose_guesses(simulate, m, delta, confidence, trials=trials)
    return WhiteBoxTests(g, bounds.fault_catchers(m))


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
                                        seed=substream_seed(seed, 6))
    return tests.audit(scorer.scores(released), coins, delta, confidence)


# ---------------------------------------------------------------------------- the ideal reference


@dataclass(frozen=True)
class GaussianReference:
    """What the ideal attacker proves against the Gaussian mechanism that is exactly as private as
    claimed (:func:`ideal_gaussian_reference`): the median of ``trials`` simulated audits and their
    spread (10% and 90% quantiles), with the same canaries and confidence, and guess counts
    pre-registered the same way (:func:`~dpmf.auditing.bounds.choose_guesses` on separate simulations)."""

    epsilon_claimed: float
    delta: float
    mu: float
    canaries: int
    confidence: float
    trials: int
    seed: int
    median: float
    low: float
    high: float
    k_in: int
    k_out: int

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("epsilon_claimed", "delta", "mu", "canaries", "confidence", "trials",
                                              "seed", "median", "low", "high", "k_in", "k_out")}


def gaussian_game(mu: float, canaries: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One ideal Gaussian canary game: ``(scores, coins)`` with fair coins and scores ``N(mu coin, 1)``
    (each score is the optimal statistic of its canary)."""
    coins = rng.random(canaries) < 0.5
    return rng.normal(size=canaries) + mu * coins, coins


def ideal_gaussian_reference(epsilon: float, delta: float, canaries: int, confidence: float = 0.95, *,
                             trials: int = 25, seed: int = 0) -> GaussianReference:
    """Simulate the ideal white-box attacker on the Gaussian mechanism with the claimed privacy.

    The mechanism that is exactly ``(epsilon, delta)``-DP and Gaussian is the shift ``N(mu, 1)`` vs
    ``N(0, 1)`` with ``mu = gdp_mu(epsilon, delta)``; the optimal score of each canary is its own
    observation (:func:`gaussian_game`). Guess counts are pre-registered by :func:`~dpmf.auditing.bounds.choose_guesses`
    on 8 games, then ``trials`` fresh games are audited by :func:`~dpmf.auditing.bounds.audit_one_run` exactly as a real
    audit is. A seeded simulation: the reference an audit's power is measured against, not a bound.

    >>> ref = ideal_gaussian_reference(4.0, 1e-5, 1000, trials=5, seed=0)
    >>> round(ref.mu, 2), 0.8 < ref.median < 2.5
    (0.92, True)
    """
    eps = _v.positive("epsilon", epsilon)
    d = _v.open_unit("delta", delta)
    m = _v.positive_int("canaries", canaries)
    n = _v.positive_int("trials", trials)
    conf = _v.open_unit("confidence", confidence)
    mu = float(gdp_mu(eps, d))
    pick, test = np.random.SeedSequence([int(seed), 1]).spawn(2)
    pick_rng, test_rng = np.random.default_rng(pick), np.random.default_rng(test)
    g = bounds.choose_guesses(lambda t: gaussian_game(mu, m, pick_rng), m, d, conf)
    vals = [bounds.audit_one_run(*gaussian_game(mu, m, test_rng), d, conf, guesses=g).epsilon_lower for _ in range(n)]
    lo, med, hi = np.quantile(vals, [0.1, 0.5, 0.9])
    return GaussianReference(eps, d, mu, m, conf, n, int(seed), float(med), float(lo), float(hi), g.k_in, g.k_out)
