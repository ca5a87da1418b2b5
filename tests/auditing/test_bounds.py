"""The statistics of empirical audits (dpmf.auditing.bounds): the one-run theorem's p-value against
its formula and a brute-force computation on tiny m, its inversion, ceilings, Clopper-Pearson
against scipy, and the validity of the bounds on mechanisms whose privacy is known exactly."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from dpmf.errors import DPMFError, InvalidParameterError
from dpmf.auditing import bounds as A
from dpmf.auditing.game import gaussian_game, ideal_gaussian_reference


def _p_value_by_formula(m, r, v, eps, delta):
    """The theorem's right-hand side written out term by term with scipy (the oracle)."""
    p = math.exp(eps) / (1 + math.exp(eps))

    def f(k):  # P[Binomial(r, p) >= k]
        return 1.0 if k <= 0 else float(stats.binom.sf(k - 1, r, p))

    extra = max([(f(v - i) - f(v)) / i for i in range(1, m + 1)] + [0.0])
    return min(1.0, f(v) + 2 * m * delta * extra)


@pytest.mark.parametrize("m,r,v,eps,delta", [
    (10, 10, 10, 0.0, 0.0), (10, 6, 5, 0.7, 0.0), (50, 20, 15, 1.3, 1e-3), (50, 20, 20, 2.0, 1e-2),
    (200, 100, 80, 1.0, 1e-5), (1000, 200, 190, 2.5, 1e-5), (7, 7, 0, 1.0, 0.1), (30, 12, 12, 4.0, 0.05),
])
def test_p_value_matches_the_formula(m, r, v, eps, delta):
    assert A.one_run_p_value(m, r, v, eps, delta) == pytest.approx(_p_value_by_formula(m, r, v, eps, delta),
                                                                   rel=1e-9, abs=1e-15)


def test_p_value_with_delta_zero_is_the_binomial_tail():
    for r, v, eps in [(100, 70, 0.5), (100, 100, 3.0), (40, 1, 0.0)]:
        p = math.exp(eps) / (1 + math.exp(eps))
        assert A.one_run_p_value(500, r, v, eps, 0.0) == pytest.approx(stats.binom.sf(v - 1, r, p), rel=1e-12)


def _exact_tail_of_correct_guesses(m: int, eps: float, delta: float) -> np.ndarray:
    """P[W >= v] for v = 0..m, by enumerating every coin vector and every output of the (eps,
    delta)-DP mechanism that, with probability delta, reveals all coins and otherwise answers each
    coin by randomized response with e^eps / (1 + e^eps); the attacker guesses each coin's answer."""
    p = math.exp(eps) / (1 + math.exp(eps))
    probs = np.zeros(m + 1)
    for coins in itertools.product((0, 1), repeat=m):
        for answers in itertools.product((0, 1), repeat=m):
            right = sum(a == c for a, c in zip(answers, coins))
            rr = p**right * (1 - p) ** (m - right)
            probs[right] += (1 - delta) * rr / 2**m
        probs[m] += delta / 2**m  # the revealing branch: every guess right
    return np.cumsum(probs[::-1])[::-1]


@pytest.mark.parametrize("eps,delta", [(0.5, 0.0), (1.0, 0.0), (1.0, 0.01), (2.0, 0.05)])
def test_the_theorem_bounds_a_brute_forced_mechanism(eps, delta):
    """Tiny m: the exact law of the number of correct guesses of a mechanism that is (eps, delta)-DP
    in each coin never exceeds the theorem's bound (and equals it for randomized response, delta 0)."""
    m = 6
    tail = _exact_tail_of_correct_guesses(m, eps, delta)
    for v in range(m + 1):
        bound = A.one_run_p_value(m, m, v, eps, delta)
        assert tail[v] <= bound + 1e-12, (v, tail[v], bound)
        if delta == 0:
            assert tail[v] == pytest.approx(bound, rel=1e-12)
    # and at a smaller epsilon the same mechanism breaks the bound (the check can fail)
    assert any(tail[v] > A.one_run_p_value(m, m, v, eps / 2, delta) + 1e-9 for v in range(m + 1))


@pytest.mark.parametrize("m,r,v,delta,conf", [(1000, 100, 90, 1e-5, 0.95), (1000, 300, 200, 0.0, 0.9),
                                              (5000, 400, 380, 1e-6, 0.99), (100, 10, 10, 1e-3, 0.95)])
def test_one_run_epsilon_inverts_the_p_value(m, r, v, delta, conf):
    eps = A.one_run_epsilon(m, r, v, delta, conf)
    beta = 1 - conf
    assert eps > 0
    assert A.one_run_p_value(m, r, v, eps, delta) <= beta  # rejected at the bound (never overstated)
    assert A.one_run_p_value(m, r, v, eps + 1e-5, delta) > beta  # and tight to 1e-5


def test_one_run_epsilon_is_zero_without_evidence():
    assert A.one_run_epsilon(1000, 100, 50, 1e-5) == 0.0  # a coin flip's accuracy
    assert A.one_run_epsilon(1000, 100, 0, 1e-5) == 0.0
    assert A.one_run_epsilon(1000, 0, 0, 1e-5) == 0.0


def test_ceilings_of_the_notes():
    """notes/privacy-auditing.md Sec. 1 (computed at beta = 0.05)."""
    assert A.one_run_ceiling(1000, 0.0) == pytest.approx(5.81, abs=0.01)
    assert A.one_run_ceiling(100, 0.0) == pytest.approx(3.49, abs=0.01)
    assert A.one_run_ceiling(1000, 1e-5) == pytest.approx(5.78, abs=0.01)
    assert A.one_run_ceiling(10**4, 0.0) == pytest.approx(8.11, abs=0.01)
    # every guess right with r = 100, delta 0: p^100 = 0.05
    p = 0.05 ** (1 / 100)
    assert A.one_run_ceiling(1000, 0.0, guesses=100) == pytest.approx(math.log(p / (1 - p)), abs=1e-5)


def test_one_run_bound_is_valid_on_randomized_response():
    """Randomized response at eps is exactly eps-DP and makes the theorem tight: the rate at which the
    bound exceeds eps must stay at or below 1 - confidence (and it is close to it, so the test has
    power against an off-by-one in the inversion: that would double the rate)."""
    rng = np.random.default_rng(7)
    eps, m, trials = 1.0, 200, 2000
    p = math.exp(eps) / (1 + math.exp(eps))
    g = A.Guesses(60, 40)
    exceed = 0
    for _ in range(trials):
        coins = rng.random(m) < 0.5
        answers = np.where(rng.random(m) < p, coins, ~coins)
        scores = answers + 1e-3 * rng.random(m)  # rank by the answers; ties broken at random
        res = A.audit_one_run(scores, coins, 0.0, 0.95, guesses=g)
        exceed += res.epsilon_lower > eps
    rate = exceed / trials
    # the exact exceedance probability is P[W >= v*] <= 0.05 with W ~ Binomial(100, p) when the 100
    # guesses are all answered by randomized response; ranking mixes in a few ties, so allow 3 SE
    assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)
    assert rate > 0.01  # the bound is not trivially loose either


def test_audit_one_run_on_pure_noise_finds_nothing():
    rng = np.random.default_rng(0)
    lows = []
    for _ in range(40):
        coins = rng.random(1000) < 0.5
        lows.append(A.audit_one_run(rng.normal(size=1000), coins, 1e-5).epsilon_lower)
    assert np.mean(np.asarray(lows) > 0) <= 0.15  # Bonferroni: at most ~5% of runs, with slack
    assert max(lows) < 0.6


def test_audit_one_run_detects_a_strong_signal_and_reports_its_guesses():
    rng = np.random.default_rng(1)
    coins = rng.random(1000) < 0.5
    res = A.audit_one_run(rng.normal(size=1000) + 6 * coins, coins, 1e-5, guesses=A.Guesses(400, 400))
    assert res.correct == 800 and res.guesses == 800
    assert res.epsilon_lower == pytest.approx(res.ceiling)
    assert res.epsilon_lower > 4.5
    d = res.to_dict()
    assert d["bound"].startswith("one-run theorem") and d["included"] == int(coins.sum())


def test_weighted_bonferroni_levels():
    rng = np.random.default_rng(2)
    coins = rng.random(500) < 0.5
    s = rng.normal(size=500) + 1.5 * coins
    g = A.Guesses(50, 50)
    alone = A.audit_one_run(s, coins, 1e-5, guesses=g).epsilon_lower
    shared = A.audit_one_run_tests(coins, 1e-5, 0.95, [(s, g, 0.5, "a"), (s, A.Guesses(5, 0), 0.5, "b")])
    assert shared.epsilon_lower <= alone + 1e-12  # half the level: never a larger bound
    assert shared.epsilon_lower == pytest.approx(A.one_run_epsilon(500, 100, shared.correct, 1e-5, 0.975)) or \
        shared.selection == "b"
    with pytest.raises(InvalidParameterError):
        A.audit_one_run_tests(coins, 1e-5, 0.95, [(s, g, 0.7, "a"), (s, g, 0.7, "b")])  # levels sum above beta


def test_choose_guesses_is_deterministic_and_uses_only_simulations():
    g1 = A.choose_guesses(lambda t: gaussian_game(0.9, 1000, np.random.default_rng(t)), 1000, 1e-5, trials=10)
    g2 = A.choose_guesses(lambda t: gaussian_game(0.9, 1000, np.random.default_rng(t)), 1000, 1e-5, trials=10)
    assert g1 == g2 and 10 <= g1.total <= 600
    with pytest.raises(InvalidParameterError):
        A.choose_guesses(lambda t: gaussian_game(0.9, 999, np.random.default_rng(t)), 1000, 1e-5, trials=2)


def test_ideal_gaussian_reference_grows_with_epsilon_and_stays_below_the_claim():
    refs = [ideal_gaussian_reference(e, 1e-5, 1000, trials=5, seed=0) for e in (2.0, 4.0, 8.0)]
    meds = [r.median for r in refs]
    assert meds[0] < meds[1] < meds[2]
    assert all(r.median < r.epsilon_claimed for r in refs)
    assert refs[1].mu == pytest.approx(0.92, abs=0.01)  # notes Sec. 7: eps 4 <-> mu 0.92
    assert 0.9 < refs[1].median < 1.9  # notes Sec. 7 (Steinke, m = 1e3, eps 4): 1.2-1.5, with our guesses
    again = ideal_gaussian_reference(4.0, 1e-5, 1000, trials=5, seed=0)
    assert again == refs[1]


# ---------------------------------------------------------------------------- Clopper-Pearson


@pytest.mark.parametrize("k,n,conf", [(0, 100, 0.95), (3, 100, 0.975), (50, 100, 0.9), (99, 100, 0.99), (7, 13, 0.95)])
def test_clopper_pearson_matches_scipy(k, n, conf):
    assert A.clopper_pearson_upper(k, n, conf) == pytest.approx(stats.beta.ppf(conf, k + 1, n - k), rel=1e-12)
    assert A.clopper_pearson_upper(n, n, conf) == 1.0


def test_clopper_pearson_covers_by_enumeration():
    """Exact coverage: for every true rate p on a grid, P[upper bound < p] <= 1 - confidence."""
    n, conf = 30, 0.9
    ub = np.array([A.clopper_pearson_upper(k, n, conf) for k in range(n + 1)])
    for p in np.linspace(0.01, 0.99, 99):
        miss = stats.binom.pmf(np.arange(n + 1), n, p)[ub < p].sum()
        assert miss <= 1 - conf + 1e-12


def test_clopper_pearson_epsilon_of_the_notes():
    """notes/privacy-auditing.md Sec. 4: zero errors at beta 0.05, delta 1e-5."""
    for n, want in [(100, 3.28), (500, 4.91), (1000, 5.60), (10000, 7.90)]:
        assert A.clopper_pearson_epsilon(0, n, 0, n, 1e-5, 0.95) == pytest.approx(want, abs=0.01)
    assert A.clopper_pearson_epsilon(50, 100, 50, 100, 1e-5) == 0.0


def test_many_run_bound_is_valid_on_randomized_response():
    rng = np.random.default_rng(11)
    eps, runs, trials = 1.0, 400, 300
    p = math.exp(eps) / (1 + math.exp(eps))
    exceed = 0
    for _ in range(trials):
        coins = rng.random(runs) < 0.5
        answers = np.where(rng.random(runs) < p, coins, ~coins).astype(float)
        res = A.audit_many_runs(answers, coins, 0.0, 0.95, threshold=0.5)
        exceed += res.epsilon_lower > eps
    assert exceed / trials <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)
    split = A.audit_many_runs(answers, coins, 0.0, 0.95)
    assert 0 <= split.epsilon_lower <= 1.5 and split.runs == runs


def test_choose_threshold_and_roc():
    rng = np.random.default_rng(5)
    t = A.choose_threshold(rng.normal(size=2000) + 3, rng.normal(size=2000), 200, 1e-5)
    assert 0.5 < t < 3.5
    coins = rng.random(400) < 0.5
    s = rng.normal(size=400) + 2 * coins
    est = A.empirical_roc(s, coins)
    conservative = A.empirical_roc(s, coins, confidence=0.95)
    assert len(est) == len(conservative) > 5
    for (f, t_), (fu, tl) in zip(est, conservative):
        assert fu >= f and tl <= t_  # bounds on the safe side of the estimates


@pytest.mark.parametrize("call", [
    lambda: A.one_run_p_value(10, 11, 3, 1.0, 0.0),          # more guesses than canaries
    lambda: A.one_run_p_value(10, 5, 6, 1.0, 0.0),           # more right than guesses
    lambda: A.one_run_p_value(10, 5, 3, -1.0, 0.0),          # negative epsilon
    lambda: A.one_run_p_value(10, 5, 3, float("nan"), 0.0),
    lambda: A.one_run_epsilon(10, 5, 3, 1e-5, 1.5),          # confidence out of range
    lambda: A.audit_one_run([0.0, float("nan")], [True, False], 1e-5),
    lambda: A.audit_one_run([0.0, 1.0], [True], 1e-5),        # shapes differ
    lambda: A.audit_one_run([0.0, 1.0], [2, 0], 1e-5),        # not coins
    lambda: A.audit_one_run([0.0, 1.0, 2.0], [1, 0, 1], 1e-5, guesses=A.Guesses(3, 1)),
    lambda: A.clopper_pearson_upper(5, 4, 0.95),
    lambda: A.guess_grid(1),
    lambda: ideal_gaussian_reference(0.0, 1e-5, 100),
])
def test_bad_input_is_a_dpmf_error(call):
    with pytest.raises(DPMFError):
        call()
