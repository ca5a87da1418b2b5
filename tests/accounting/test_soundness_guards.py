"""Soundness guards (issue 16): no public accountant function certifies a pair it does not cover,
unknown options are refused, and exact reductions hold for every accountant that owns the pair."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dpmf
from dpmf.accounting import METHODS
from dpmf.accounting.allocation import account_allocation, calibrate_allocation
from dpmf.accounting.allocation.pld import account_allocation_pld, calibrate_allocation_pld
from dpmf.accounting.dispatch import certified_fallback
from dpmf.accounting.dpsgd import account_dpsgd
from dpmf.accounting.mmcc import account_mmcc, calibrate_mmcc
from dpmf.accounting.montecarlo import account_montecarlo, calibrate_montecarlo
from dpmf.accounting.unamplified import account_unamplified, calibrate_unamplified
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.sampling import (
    BallsInBinsSampling,
    CyclicPoissonSampling,
    FixedOrderSampling,
    MinSepSampling,
    MultiAttributionMinSepSampling,
    PoissonSampling,
)
from dpmf.strategies import BLT, BinaryTree, DenseStrategy, FFTMechanism, Identity, ToeplitzStrategy, bsr
from dpmf.strategies.stamping import StampedEncoder

N = 8
DELTA = 1e-3

STRATEGIES = {
    "identity": Identity(N),
    "bsr": bsr(N, 2),
    "toeplitz-negative": ToeplitzStrategy(np.array([1.0, -0.5]), N),
    "blt": BLT([0.9, 0.4], [0.3, 0.2]).to_toeplitz(N),
    "tree": BinaryTree(N),
    "dense": DenseStrategy(np.tril(np.ones((N, N)))),
    "fft": FFTMechanism(N),
    "stamped": StampedEncoder(np.tril(np.ones((4, 4))), 2),
    "matrix": np.tril(np.full((N, N), 0.5)) + 0.5 * np.eye(N),
}
SCHEMES = {
    "poisson": PoissonSampling(0.25, N),
    "cyclic-poisson": CyclicPoissonSampling(0.5, N, 2),
    "min-sep": MinSepSampling(0.3, N, 2),
    "min-sep-warm": MinSepSampling(0.3, N, 2, warm_start=True),
    "balls-in-bins-1": BallsInBinsSampling(1, N),
    "balls-in-bins-2": BallsInBinsSampling(2, N),
    "fixed-order": FixedOrderSampling(2, N),
    "multi-attribution": MultiAttributionMinSepSampling(0.3, N, 2, 2),
}

MC = {"num_samples": 2000, "seed": 7}
#: the same options go to the function and to the dispatcher; they keep the 648-case matrix quick
OPTIONS = {
    "montecarlo": MC,
    "mmcc": {"discretization": 1e-3, "grid_step": 0.125},
    "allocation": {"which": "renyi"},
}
CAL_OPTIONS = {
    "montecarlo": {"seed": 3, "num_candidates": 2, "pilot_samples": 500},
    "mmcc": {"discretization": 1e-3, "grid_step": 0.125},
    "allocation": {"which": "renyi"},
}


def _account_call(func, method):
    extra = OPTIONS.get(method, {})
    return lambda s, p: func(s, p, 2.0, DELTA, **extra), lambda s, p: dpmf.account(s, p, 2.0, DELTA, method, **extra)


def _calibrate_call(func, method):
    extra = CAL_OPTIONS.get(method, {})
    if method == "montecarlo":
        # (the dispatcher supplies Algorithm 5's certified fallback; called directly, so do we)
        return (lambda s, p: func(s, p, 4.0, 0.05, fallback=certified_fallback, **extra).noise_multiplier,
                lambda s, p: dpmf.calibrate(s, p, 4.0, 0.05, method, **extra).noise_multiplier)
    tol = {} if method == "unamplified" else {"rel_tol": 1e-2}
    return (lambda s, p: func(s, p, 4.0, DELTA, **tol, **extra),
            lambda s, p: dpmf.calibrate(s, p, 4.0, DELTA, method, rel_tol=1e-2, **extra).noise_multiplier)


#: every public accountant function, with the dispatcher call it must agree with
FUNCTIONS = {
    "account_dpsgd": ("pld", *_account_call(account_dpsgd, "pld")),
    "account_unamplified": ("unamplified", *_account_call(account_unamplified, "unamplified")),
    "account_mmcc": ("mmcc", *_account_call(account_mmcc, "mmcc")),
    "account_allocation": ("allocation", *_account_call(account_allocation, "allocation")),
    "account_allocation_pld": ("allocation_pld", *_account_call(account_allocation_pld, "allocation_pld")),
    "account_montecarlo": ("montecarlo", *_account_call(account_montecarlo, "montecarlo")),
    "calibrate_unamplified": ("unamplified", *_calibrate_call(calibrate_unamplified, "unamplified")),
    "calibrate_mmcc": ("mmcc", *_calibrate_call(calibrate_mmcc, "mmcc")),
    "calibrate_allocation": ("allocation", *_calibrate_call(calibrate_allocation, "allocation")),
    "calibrate_allocation_pld": ("allocation_pld", *_calibrate_call(calibrate_allocation_pld, "allocation_pld")),
    "calibrate_montecarlo": ("montecarlo", *_calibrate_call(calibrate_montecarlo, "montecarlo")),
}

#: Monte Carlo calibration is the slow one: its supported pairs run in the slow suite, but one
SLOW = {
    ("calibrate_montecarlo", s, p)
    for s in STRATEGIES
    for p in SCHEMES
    if dpmf.accounting.valid_methods(STRATEGIES[s], SCHEMES[p])["montecarlo"] is None
} - {
    ("calibrate_montecarlo", "identity", "min-sep")
}
#: allocation_pld for a correlated C evaluates the spectral-groups family at every noise the search
#: tries (25-80 s per calibration on an idle 2-core machine): bsr stays in the default run, the other
#: correlated strategies run in the slow suite
SLOW |= {
    (f, s, p)
    for f in ("calibrate_allocation_pld", "account_allocation_pld")
    for s in STRATEGIES
    for p in SCHEMES
    if s not in ("identity", "bsr") and p.startswith("balls-in-bins")
    and dpmf.accounting.valid_methods(STRATEGIES[s], SCHEMES[p])["allocation_pld"] is None
}
MATRIX = [
    pytest.param(f, s, p, marks=[pytest.mark.slow] if (f, s, p) in SLOW else [])
    for f in sorted(FUNCTIONS)
    for s in sorted(STRATEGIES)
    for p in sorted(SCHEMES)
]


def test_every_guarded_function_is_in_the_matrix():
    import dpmf.accounting.allocation.accountant as a
    import dpmf.accounting.allocation.pld as ap
    import dpmf.accounting.dpsgd as d
    import dpmf.accounting.mmcc.accountant as m
    import dpmf.accounting.montecarlo.accountant as mc
    import dpmf.accounting.unamplified as u

    public = {
        name
        for mod in (a, ap, d, m, mc, u)
        for name in dir(mod)
        if name.startswith(("account_", "calibrate_")) and callable(getattr(mod, name))
    }
    assert public == set(FUNCTIONS)
    for mod in (a, ap, d, m, mc, u):
        for name in public & set(dir(mod)):
            assert getattr(getattr(mod, name), "guarded_method", None) == FUNCTIONS[name][0], name


@pytest.mark.parametrize("function,strategy_name,scheme_name", MATRIX)
def test_function_equals_dispatcher_or_refuses(function, strategy_name, scheme_name):
    method, direct, via_dispatch = FUNCTIONS[function]
    strategy, scheme = STRATEGIES[strategy_name], SCHEMES[scheme_name]
    why = dpmf.accounting.valid_methods(strategy, scheme)[method]
    if why is not None:
        with pytest.raises(UnsupportedConfigurationError):
            direct(strategy, scheme)
        return
    try:
        out = direct(strategy, scheme)
    except UnsupportedConfigurationError:  # e.g. Monte Carlo calibration with no proved fallback
        with pytest.raises(UnsupportedConfigurationError):
            via_dispatch(strategy, scheme)
        return
    ref = via_dispatch(strategy, scheme)
    if isinstance(out, float):
        if method in ("unamplified", "montecarlo"):  # closed form / same candidates: float rounding only
            assert ref == pytest.approx(out, rel=1e-9)
        else:  # the dispatcher starts the search from a cheap upper bracket (search_hint), so both
            # land within the search tolerance (rel_tol = 1e-2) of the smallest passing noise
            assert ref == pytest.approx(out, rel=2e-2)
    else:
        assert out.certified == ref.certified
        assert out.epsilon == ref.epsilon
        assert out.epsilon_by_direction == ref.epsilon_by_direction


def test_the_audit_case_is_refused():
    """The audit's case: DP-SGD's value for a correlated strategy used to come back certified."""
    with pytest.raises(UnsupportedConfigurationError, match="identity"):
        account_dpsgd(bsr(20, 4), PoissonSampling(0.05, 20), 2.0, 1e-6)
    with pytest.raises(UnsupportedConfigurationError, match="Poisson"):
        account_dpsgd(Identity(20), FixedOrderSampling(1, 20), 2.0, 1e-6)
    r = dpmf.account(bsr(20, 4), PoissonSampling(0.05, 20), 2.0, 1e-6)
    assert r.method == "mmcc" and r.epsilon > 5  # the sound value (10.6), not DP-SGD's 0.619


def test_non_scheme_and_non_strategy_are_bad_input():
    with pytest.raises(InvalidParameterError, match="scheme"):
        account_dpsgd(Identity(4), "poisson", 1.0, 1e-6)
    with pytest.raises(InvalidParameterError, match="strategy"):
        account_unamplified("identity", PoissonSampling(0.1, 4), 1.0, 1e-6)
    with pytest.raises(InvalidParameterError, match="steps"):
        account_allocation(Identity(4), BallsInBinsSampling(1, 8), 1.0, 1e-6)


# --------------------------------------------------------------------------- options
def test_misspelled_option_fails_for_account_with_a_suggestion():
    with pytest.raises(InvalidParameterError, match=r"'worker' \(did you mean 'workers'\?\)") as exc:
        dpmf.account(bsr(16, 2), PoissonSampling(0.1, 16), 2.0, 1e-6, worker=3)
    accepted = str(exc.value).split("Accepted when accounting with")[1]
    assert "mmcc: " in accepted and "workers" in accepted


def test_misspelled_option_fails_for_calibrate():
    with pytest.raises(InvalidParameterError, match="discretisation.*did you mean 'discretization'"):
        dpmf.calibrate(Identity(16), PoissonSampling(0.1, 16), 2.0, 1e-6, discretisation=1e-3)


def test_option_no_selected_method_takes_is_refused():
    # num_samples exists (Monte Carlo) but the pld method does not take it
    with pytest.raises(InvalidParameterError, match="'num_samples' is not used.*option of montecarlo.*pld: discretization"):
        dpmf.account(Identity(16), PoissonSampling(0.1, 16), 2.0, 1e-6, method="pld", num_samples=10)


def test_known_options_still_reach_their_method():
    r = dpmf.account(Identity(16), PoissonSampling(0.1, 16), 2.0, 1e-6, method="pld", discretization=1e-3)
    assert r.diagnostics["discretization"] == 1e-3
    assert r.options == {"discretization": 1e-3}
    # execution options are not recorded; None values are dropped
    r = dpmf.account(bsr(8, 2), PoissonSampling(0.2, 8), 2.0, 1e-6, method="mmcc", workers=None, heuristic=False)
    assert r.options == {"heuristic": False}


def test_registry_lists_match_signatures():
    """The explicit option lists name real keyword parameters of the functions they feed."""
    import inspect

    for m in METHODS.values():
        run_params = set(inspect.signature(m.run).parameters)
        assert m.run_options <= run_params, (m.name, m.run_options - run_params)
        assert m.pair_options <= m.run_options
        assert {k for k, _ in m.probe_options} <= m.run_options  # (a probe only switches off diagnostics)
        cal = m.own_calibration or m.fast_calibration
        if cal is not None and m.calibration_options is not None:
            params = inspect.signature(cal).parameters
            named = set(params)
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                named |= run_params  # **kwargs go on to run
            assert m.calibration_options <= named, (m.name, m.calibration_options - named)


def test_registry_names_are_the_accountants_and_allocation_loads_on_first_use():
    """The allocation accountants are registered by name and imported on first use (a run of MMCC
    or DP-SGD does not import SciPy's optimizer and their kernels); the names are the modules'."""
    import subprocess
    import sys

    from dpmf.accounting.allocation import accountant as allocation_accountant
    from dpmf.accounting.allocation import pld as allocation_pld

    assert METHODS[allocation_accountant.NAME].run.__wrapped__ is allocation_accountant.account_allocation
    assert METHODS[allocation_pld.NAME].run.__wrapped__ is allocation_pld.account_allocation_pld
    code = ("import sys, dpmf\n"
            "from dpmf.strategies import bsr\nfrom dpmf.sampling import PoissonSampling\n"
            "dpmf.account(bsr(8, 2), PoissonSampling(0.2, 8), 2.0, 1e-5, method='mmcc', heuristic=False)\n"
            "print('dpmf.accounting.allocation.accountant' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --------------------------------------------------------------------------- reduction
@pytest.mark.parametrize("epochs", [2, 4])
@pytest.mark.parametrize("sigma", [0.8, 2.0])
def test_identity_balls_in_bins_epochs_equal_one_epoch_at_scaled_noise_allocation(epochs, sigma):
    b = 6
    k_epochs = account_allocation(Identity(epochs * b), BallsInBinsSampling(epochs, epochs * b), sigma, 1e-6)
    one = account_allocation(Identity(b), BallsInBinsSampling(1, b), sigma / math.sqrt(epochs), 1e-6)
    assert k_epochs.epsilon_by_direction == one.epsilon_by_direction
    assert "reduction" in k_epochs.diagnostics


def test_identity_reduction_agrees_with_the_unreduced_renyi_program():
    """Without the reduction the Renyi program on the k-epoch Gram matrix k*I gives the same value:
    the reduction is exact, not a new bound (issue: k = 4 at sigma 2 equals one epoch at sigma 1)."""
    from dpmf.accounting.allocation import RenyiAllocation, gram_matrix, mixture_means

    b, k, sigma = 8, 4, 2.0
    full = RenyiAllocation.create(gram_matrix(mixture_means(Identity(k * b), k, k * b)))
    reduced = account_allocation(Identity(k * b), BallsInBinsSampling(k, k * b), sigma, 1e-6, which="renyi")
    direct = full.epsilon(sigma, 1e-6)["epsilon_by_direction"]
    for d in ("remove", "add"):
        assert reduced.epsilon_by_direction[d] == pytest.approx(direct[d], rel=1e-9)


@pytest.mark.parametrize("epochs", [2, 3])
def test_identity_balls_in_bins_reduction_unamplified(epochs):
    b, sigma = 5, 1.3
    k_epochs = account_unamplified(Identity(epochs * b), BallsInBinsSampling(epochs, epochs * b), sigma, 1e-6)
    one = account_unamplified(Identity(b), BallsInBinsSampling(1, b), sigma / math.sqrt(epochs), 1e-6)
    assert k_epochs.epsilon == pytest.approx(one.epsilon, rel=1e-12)


@pytest.mark.parametrize("epochs", [2, 4])
def test_identity_balls_in_bins_reduction_montecarlo(epochs):
    b, sigma = 6, 1.0
    opts = {"num_samples": 4000, "seed": 11}
    k_epochs = account_montecarlo(Identity(epochs * b), BallsInBinsSampling(epochs, epochs * b), sigma, 1e-2, **opts)
    one = account_montecarlo(Identity(b), BallsInBinsSampling(1, b), sigma / math.sqrt(epochs), 1e-2, **opts)
    assert k_epochs.epsilon_by_direction == one.epsilon_by_direction  # same law, same stream


def test_identity_reduction_montecarlo_is_the_same_law_as_the_direct_sampler():
    """The reduced sampler and the unreduced k-epoch mixture sampler draw the same law (KS test)."""
    from scipy.stats import ks_2samp

    from dpmf.accounting.montecarlo import losses

    b, k, sigma = 4, 3, 1.0
    rng = np.random.default_rng(5)
    reduced = losses.privacy_loss_samples(Identity(k * b), BallsInBinsSampling(k, k * b), sigma, 20000, rng)
    strategy = DenseStrategy(np.eye(k * b))  # same C, but not recognized as the identity: no reduction
    direct = losses.privacy_loss_samples(strategy, BallsInBinsSampling(k, k * b), sigma, 20000, rng)
    assert ks_2samp(reduced, direct).pvalue > 1e-3
    wrong = losses.privacy_loss_samples(Identity(b), BallsInBinsSampling(1, b), sigma, 20000, rng)
    assert ks_2samp(wrong, direct).pvalue < 1e-6  # the test can tell different noise levels apart


# --------------------------------------------------------------------------- auto skips what cannot win
def test_auto_dpsgd_at_100k_steps_skips_mmcc_and_says_why():
    """Issue 13: auto used to run MMCC on the identity (a dense n x n encoder: 74.5 GiB at 10^5 steps)."""
    r = dpmf.account(Identity(100_000), PoissonSampling(0.001, 100_000), 1.0, 1e-6)
    assert r.method == "pld" and "mmcc" in r.diagnostics["skipped_methods"]
    assert "mmcc" not in r.diagnostics["all_methods"]
    assert r.epsilon == dpmf.account(Identity(100_000), PoissonSampling(0.001, 100_000), 1.0, 1e-6, "pld").epsilon
    cal = dpmf.calibrate(Identity(1000), PoissonSampling(0.01, 1000), 2.0, 1e-6)
    assert cal.report.method == "pld" and "mmcc" in cal.report.diagnostics["skipped_methods"]
    # an option only the skipped method takes would be unused: refused as with method="pld" (issue 44),
    # saying which method auto skipped and why
    with pytest.raises(InvalidParameterError, match=r"'workers' is not used .* auto runs pld.* mmcc is skipped: MMCC on"):
        dpmf.account(Identity(100), PoissonSampling(0.01, 100), 1.0, 1e-6, workers=2)
    with pytest.raises(InvalidParameterError, match="'workers' is not used when accounting with pld"):
        dpmf.account(Identity(100), PoissonSampling(0.01, 100), 1.0, 1e-6, "pld", workers=2)


def test_skipping_mmcc_on_the_identity_loses_nothing():
    """C = I MMCC is DP-SGD: the skipped method could not have won (small n, both run explicitly)."""
    for q, sigma in ((0.05, 1.0), (0.2, 2.0)):
        pld = dpmf.account(Identity(32), PoissonSampling(q, 32), sigma, 1e-6, "pld").epsilon
        mm = dpmf.account(Identity(32), PoissonSampling(q, 32), sigma, 1e-6, "mmcc").epsilon
        assert pld <= mm * (1 + 1e-6)
