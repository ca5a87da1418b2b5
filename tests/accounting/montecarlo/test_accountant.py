"""account_montecarlo (estimate with confidence) and calibrate_montecarlo (Alg. 5, certified),
checked against the exact PLD of DP-SGD with Poisson sampling (the b = 1 case) and, for the
calibration, the Gaussian mechanism's closed-form delta (its proved fallback is fast)."""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm

from _dpsgd_sampler import dpsgd_loss_samples
from dpmf.accounting.montecarlo import accountant as acc
from dpmf.accounting.dispatch import certified_fallback
from dpmf.accounting.montecarlo.accountant import account_montecarlo, calibrate_montecarlo
from dpmf.accounting.montecarlo.certify import minimum_samples, overall_delta
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.privacy.gaussian_plds import subsampled_gaussian
from dpmf.sampling import PoissonSampling
from dpmf.strategies import Identity

Q, T = 0.1, 10


def gaussian_delta(eps: float, sigma: float) -> float:
    a = 1.0 / (2 * sigma)
    return norm.cdf(a - eps * sigma) - math.exp(eps) * norm.cdf(-a - eps * sigma)


def _pld(sigma):
    return subsampled_gaussian(sigma, Q).self_compose(T)


def test_estimate_brackets_the_exact_epsilon():
    delta = 1e-2
    rep = account_montecarlo(
        Identity(T), PoissonSampling(Q, T), 1.0, delta, num_samples=100_000, seed=3, sampler=dpsgd_loss_samples,
        chunk_size=50_000,
    )
    exact = _pld(1.0).epsilon_by_direction(delta)
    # sample noise at 1e5 samples and delta = 1e-2: the 99.5% KL bound adds about
    # sqrt(2 ln 200 / (s delta)) ~ 10% to delta; so the upper bound must lie between the exact
    # epsilon at delta and the exact epsilon at delta / 1.3
    looser = _pld(1.0).epsilon_by_direction(delta / 1.3)
    for d in ("remove", "add"):
        assert exact[d] <= rep.epsilon_by_direction[d] <= looser[d], (d, exact[d], rep.epsilon_by_direction[d])
    assert rep.epsilon == max(rep.epsilon_by_direction.values())
    assert not rep.certified and rep.method == "montecarlo"
    diag = rep.diagnostics
    assert diag["samples_used"] == 100_000
    assert diag["samples_needed_for_certification"] == minimum_samples(delta)
    assert diag["seed_entropy"] == 3
    assert diag["epsilon_point_estimate"] <= rep.epsilon
    assert "ESTIMATE" in rep.summary()


def test_seed_none_is_recorded_and_reproduces():
    kw = dict(num_samples=5000, sampler=dpsgd_loss_samples, chunk_size=2500)
    a = account_montecarlo(Identity(T), PoissonSampling(Q, T), 1.0, 1e-2, **kw)
    seed = a.diagnostics["seed_entropy"]
    b = account_montecarlo(Identity(T), PoissonSampling(Q, T), 1.0, 1e-2, seed=seed, **kw)
    assert a.epsilon_by_direction == b.epsilon_by_direction


def test_checkpoint_is_continued_and_mismatch_refused(tmp_path):
    ck = tmp_path / "acc.npz"
    kw = dict(num_samples=6000, sampler=dpsgd_loss_samples, chunk_size=2000, seed=5, checkpoint=ck)
    a = account_montecarlo(Identity(T), PoissonSampling(Q, T), 1.0, 1e-2, **kw)
    calls = []
    b = account_montecarlo(Identity(T), PoissonSampling(Q, T), 1.0, 1e-2, callback=lambda d, t: calls.append(d), **kw)
    assert calls == []  # nothing left to compute
    assert a.epsilon_by_direction == b.epsilon_by_direction
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        account_montecarlo(Identity(T), PoissonSampling(Q, T), 1.1, 1e-2, **kw)
    with pytest.raises(InvalidParameterError, match="scheme"):
        account_montecarlo(Identity(T), PoissonSampling(0.2, T), 1.0, 1e-2, **kw)


def test_unsupported_configuration_without_sampler(monkeypatch):
    monkeypatch.setattr(acc, "supports", lambda strategy, scheme: "no sampler for this")
    with pytest.raises(UnsupportedConfigurationError, match="no sampler"):
        account_montecarlo(Identity(T), PoissonSampling(Q, T), 1.0, 1e-2, num_samples=10)
    with pytest.raises(UnsupportedConfigurationError):
        calibrate_montecarlo(Identity(T), PoissonSampling(Q, T), 1.0, 1e-2)


def test_bad_input():
    with pytest.raises(InvalidParameterError):
        account_montecarlo(Identity(T), PoissonSampling(Q, T), 1.0, 1.5, sampler=dpsgd_loss_samples)
    with pytest.raises(InvalidParameterError):
        account_montecarlo(Identity(T), PoissonSampling(Q, T), 1.0, 1e-3, confidence=1.0, sampler=dpsgd_loss_samples)
    with pytest.raises(InvalidParameterError):
        calibrate_montecarlo(
            Identity(T), PoissonSampling(Q, T), 1.0, 1e-3, num_samples=1000, base_delta=5e-4,
            sampler=dpsgd_loss_samples, fallback_noise_multiplier=2.0,
        )  # 1000 samples cannot certify 1e-3


def test_calibration_is_certified_and_releases_a_truly_private_noise():
    # one Gaussian step (q = 1): the proved fallback is the exact Gaussian calibration
    eps, delta = 1.0, 1e-2
    scheme, strat = PoissonSampling(1.0, 1), Identity(1)
    s = minimum_samples(delta)
    inner = overall_delta(s, delta / 2).delta
    sigma_fb, method = certified_fallback(strat, scheme, eps, inner)
    assert gaussian_delta(eps, sigma_fb) == pytest.approx(inner, rel=1e-3)
    # two candidates whose true delta is far below delta' = delta / 2 (they pass except with
    # negligible probability), one below the fallback (true delta > inner: must be rejected)
    from scipy.optimize import brentq

    safe = [brentq(lambda x, t=t: gaussian_delta(eps, x) - t, 0.5, 20) for t in (delta / 8, delta / 16)]
    cands = [0.9 * sigma_fb, *safe]
    cal = calibrate_montecarlo(
        strat, scheme, eps, delta, candidates=cands, seed=21, sampler=dpsgd_loss_samples,
        fallback_noise_multiplier=sigma_fb,
    )
    rep = cal.report
    assert rep.certified and rep.method == "montecarlo-evr"
    assert rep.epsilon == eps and rep.delta == delta
    assert rep.diagnostics["overall_delta"] <= delta
    assert rep.diagnostics["samples_per_direction_per_candidate"] == s
    # the released noise really is (eps, delta)-DP
    assert gaussian_delta(eps, cal.noise_multiplier) <= delta
    assert cal.noise_multiplier in cands[1:]
    # 0.9 * fallback has true delta > inner delta > delta': the verifier rejects it (w.p. >= 1 - q)
    assert gaussian_delta(eps, cands[0]) > inner
    assert cal.verdicts[0] is False


def test_calibration_default_candidates_come_from_the_pilot():
    # fallback deliberately 2x too large (a valid, if loose, claim: more noise is more private);
    # the pilot must land near the exact noise at delta' = delta / 2 and Alg. 5 must release a
    # candidate close to it that is truly (eps, delta)-DP
    from scipy.optimize import brentq

    eps, delta = 1.0, 1e-2
    exact_at_base = brentq(lambda x: gaussian_delta(eps, x) - delta / 2, 0.3, 20)
    cal = calibrate_montecarlo(
        Identity(1), PoissonSampling(1.0, 1), eps, delta, seed=4, sampler=dpsgd_loss_samples,
        fallback_noise_multiplier=2 * exact_at_base, pilot_samples=minimum_samples(delta),
    )
    # s = 5788 pilot samples (as many as a verification) see ~29 events at delta' = 5e-3: delta~ has relative sd ~ 19%; delta has
    # elasticity ~ -6.8 in sigma here, so 3 sd is ~ 9% in sigma
    d = cal.report.diagnostics
    assert d["pilot_noise_multiplier"] == pytest.approx(exact_at_base, rel=0.1)
    assert not cal.fallback and cal.report.certified
    assert gaussian_delta(eps, cal.noise_multiplier) <= delta
    assert cal.noise_multiplier == pytest.approx(exact_at_base, rel=0.1)
    assert all(c < 2 * exact_at_base for c in cal.candidates)


def test_calibration_with_an_exact_fallback_releases_something_private():
    cal = calibrate_montecarlo(
        Identity(1), PoissonSampling(1.0, 1), 1.0, 1e-2, num_candidates=4, seed=5, sampler=dpsgd_loss_samples,
        fallback=certified_fallback,
    )
    assert cal.report.diagnostics["fallback_method"] in ("pld", "unamplified")
    assert cal.noise_multiplier <= cal.report.diagnostics["fallback_noise_multiplier"]
    assert gaussian_delta(1.0, cal.noise_multiplier) <= 1e-2


def test_calibration_without_a_fallback_is_refused():
    # the certified fallback comes from the dispatcher (one-way layering); without it, or a caller's
    # noise, Algorithm 5 has no M_k and must refuse rather than guess
    with pytest.raises(InvalidParameterError, match="fallback"):
        calibrate_montecarlo(Identity(1), PoissonSampling(1.0, 1), 1.0, 1e-2, sampler=dpsgd_loss_samples)


@pytest.mark.parametrize(
    "warm, eps, remove, add, point",
    [
        (False, 5.334402322769165, 5.334402322769165, 2.3265503644943237, 4.7416927218437195),
        (True, 5.233397424221039, 5.233397424221039, 2.3168509006500244, 4.653442859649658),
    ],
)
def test_bminsep_estimates_for_a_fixed_seed_are_unchanged_by_the_speed_up(warm, eps, remove, add, point):
    """Values computed on eb60cda (before the fused kernel and the histogram fast path):
    the same random stream, so the same epsilons to the last bit (1e-12 allowed for the order of
    the band's sums, which BLAS does not fix)."""
    from dpmf.sampling import MinSepSampling
    from dpmf.strategies import catalog

    strat = catalog.build("banded-toeplitz", 64, bands=4)
    scheme = MinSepSampling.from_participation_rate(0.05, 64, 4, warm_start=warm)
    r = account_montecarlo(strat, scheme, 0.8, 1e-3, num_samples=20_000, seed=11, chunk_size=5_000)
    assert r.epsilon == pytest.approx(eps, rel=1e-12)
    assert r.epsilon_by_direction["remove"] == pytest.approx(remove, rel=1e-12)
    assert r.epsilon_by_direction["add"] == pytest.approx(add, rel=1e-12)
    assert r.diagnostics["epsilon_point_estimate"] == pytest.approx(point, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_default_pilot_and_ladder_release_a_private_noise_near_the_exact_one(seed):
    """The defaults at few samples (s = 5788 < PRECISE_PILOT_SAMPLES: a pilot of s samples on a common
    stream, candidates up to ratio**9 above it): the release is truly (eps, delta)-DP (the certified
    claim; false with probability <= q) and, when not the fallback, within the pilot's error of the
    exact noise at delta': s = 5788 samples see ~29 events at delta' (delta~ relative sd ~19%, i.e.
    ~2.8% in sigma at elasticity -6.8; 3 sd ~8.4%), times the ladder's top step of 1.01**9. (A pilot of
    s // 4 with a ladder 3% high released the fallback on the tutorial's pair.)"""
    from scipy.optimize import brentq

    eps, delta = 1.0, 1e-2
    exact_at_base = brentq(lambda x: gaussian_delta(eps, x) - delta / 2, 0.3, 20)
    cal = calibrate_montecarlo(
        Identity(1), PoissonSampling(1.0, 1), eps, delta, seed=100 + seed, sampler=dpsgd_loss_samples,
        fallback_noise_multiplier=2 * exact_at_base,
    )
    d = cal.report.diagnostics
    assert gaussian_delta(eps, cal.noise_multiplier) <= delta
    assert d["pilot_samples_used"] > 0 and d["samples_drawn"] >= d["pilot_samples_used"] + 2 * minimum_samples(delta)
    assert max(cal.candidates) == pytest.approx(d["pilot_noise_multiplier"] * 1.01**9)
    assert len(cal.candidates) == 12
    if not cal.fallback:
        assert cal.noise_multiplier <= exact_at_base * 1.084 * 1.01**9
