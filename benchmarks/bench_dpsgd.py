"""DP-SGD accounting and calibration, and a composition of mixture PLDs.

* ``dpsgd_epsilon``: Poisson q = 0.01, sigma = 1, T = 1000, delta = 1e-6 (epsilon ~ 2.1245).
  peer ``PLDAccountant().compose(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), T)``;
  dpmf ``dpmf.account(Identity(T), PoissonSampling(q, T), sigma, delta)``.
* ``dpsgd_calibrate_eps1``: smallest sigma with epsilon <= 1 for the same setting, each library
  with its default tolerance (dp_accounting ``calibrate_dp_mechanism``: 1e-6 absolute in sigma;
  dpmf ``calibrate``: 1e-4 relative).
* ``mog_composition``: MoG(sigma=1, [0,1,2], [.2,.6,.2]) x3 composed with
  MoG(sigma=2, [0,2,3], [.33,.34,.33]) x2, epsilon at delta = 1e-6 (reference 17.193115).
"""

from __future__ import annotations

import dp_accounting as dpa

import dpmf
from case import Case

Q, SIGMA, T, DELTA = 0.01, 1.0, 1000, 1e-6
TARGET_EPS = 1.0

MOG_A = (1.0, [0.0, 1.0, 2.0], [0.2, 0.6, 0.2], 3)  # sigma, sensitivities, probabilities, count
MOG_B = (2.0, [0.0, 2.0, 3.0], [0.33, 0.34, 0.33], 2)
MOG_REFERENCE = 17.193115


def _dpsgd_event(sigma: float) -> dpa.DpEvent:
    return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(Q, dpa.GaussianDpEvent(sigma)), T)


# ----------------------------------------------------------------------------- epsilon
def _peer_epsilon() -> float:
    acc = dpa.pld.PLDAccountant()
    acc.compose(dpa.PoissonSampledDpEvent(Q, dpa.GaussianDpEvent(SIGMA)), T)
    return float(acc.get_epsilon(DELTA))


def _dpmf_epsilon() -> float:
    report = dpmf.account(dpmf.strategies.Identity(T), dpmf.sampling.PoissonSampling(Q, T), SIGMA, DELTA)
    return float(report.epsilon)


def _compare_epsilon(peer: float, ours: float) -> tuple[bool, str]:
    diff = ours - peer
    return abs(diff) <= 1e-5, f"eps dpmf={ours:.6f} peer={peer:.6f} diff={diff:+.1e}"


# ----------------------------------------------------------------------------- calibration
def _peer_calibrate() -> float:
    return float(
        dpa.calibrate_dp_mechanism(dpa.pld.PLDAccountant, _dpsgd_event, TARGET_EPS, DELTA)
    )


def _dpmf_calibrate():
    return dpmf.calibrate(
        dpmf.strategies.Identity(T), dpmf.sampling.PoissonSampling(Q, T), TARGET_EPS, DELTA
    )


def _compare_calibrate(peer_sigma: float, cal) -> tuple[bool, str]:
    diff = cal.noise_multiplier - peer_sigma
    eps = cal.report.epsilon
    ok = abs(diff) <= 0.005 and eps <= TARGET_EPS
    return ok, (
        f"sigma dpmf={cal.noise_multiplier:.5f} peer={peer_sigma:.5f} diff={diff:+.1e}; "
        f"dpmf eps={eps:.6f} ({cal.evaluations} evaluations)"
    )


# ----------------------------------------------------------------------------- MoG composition
def _peer_mog_composition() -> float:
    acc = dpa.pld.PLDAccountant()
    for sigma, sens, probs, count in (MOG_A, MOG_B):
        acc.compose(dpa.dp_event.MixtureOfGaussiansDpEvent(sigma, sens, probs), count)
    return float(acc.get_epsilon(DELTA))


def _dpmf_mog_composition() -> float:
    a, b = (
        dpmf.privacy.mixture_of_gaussians(sens, probs, sigma).self_compose(count)
        for sigma, sens, probs, count in (MOG_A, MOG_B)
    )
    return float(a.compose(b).epsilon(DELTA))


def _compare_mog(peer: float, ours: float) -> tuple[bool, str]:
    diff = ours - peer
    return abs(diff) <= 1e-3, (
        f"eps dpmf={ours:.6f} peer={peer:.6f} diff={diff:+.1e} (reference {MOG_REFERENCE})"
    )


CASES = [
    Case("dpsgd_epsilon", _peer_epsilon, _dpmf_epsilon, _compare_epsilon, "|eps diff| <= 1e-5"),
    Case(
        "dpsgd_calibrate_eps1",
        _peer_calibrate,
        _dpmf_calibrate,
        _compare_calibrate,
        "|sigma diff| <= 0.005 and dpmf eps <= 1",
    ),
    Case(
        "mog_composition",
        _peer_mog_composition,
        _dpmf_mog_composition,
        _compare_mog,
        "|eps diff| <= 1e-3",
        slow=True,
    ),
]
