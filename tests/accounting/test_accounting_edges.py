"""Accounting at the edges users reach (issue 40 item 5): huge sizes refused up front by the memory
guard in one line that names the size and what fits; explicit MMCC at a huge target searching from
the unamplified bracket; the cost model's shape."""

import dataclasses

import math

import pytest

import dpmf
import dpmf.resources as resources
from dpmf.accounting import unamplified
from dpmf.accounting.cost import accounting_cost
from dpmf.errors import CostLimitError
from dpmf.sampling import BallsInBinsSampling, CyclicPoissonSampling, FixedOrderSampling, PoissonSampling
from dpmf.strategies import BinaryTree, Identity, bsr

HUGE = 2**40
HAVE = 16.0 * 2**30  # the memory the guard is told is available (deterministic on any machine)

REFUSED = {
    "account identity poisson": lambda: dpmf.account(Identity(HUGE), PoissonSampling(0.01, HUGE), 1.0, 1e-6),
    "account identity balls-in-bins": lambda: dpmf.account(Identity(HUGE), BallsInBinsSampling(1, HUGE), 1.0, 1e-6),
    "calibrate identity balls-in-bins": lambda: dpmf.calibrate(Identity(HUGE), BallsInBinsSampling(1, HUGE), 1.0, 1e-6),
    "account identity 2 epochs": lambda: dpmf.account(Identity(HUGE), BallsInBinsSampling(2, HUGE), 1.0, 1e-6),
    "account identity cyclic": lambda: dpmf.account(Identity(HUGE), CyclicPoissonSampling(0.01, HUGE, 4), 1.0, 1e-6),
    "account tree poisson": lambda: dpmf.account(BinaryTree(HUGE), PoissonSampling(0.01, HUGE), 1.0, 1e-6),
    "account tree epochs": lambda: dpmf.account(BinaryTree(HUGE), FixedOrderSampling(1, HUGE), 1.0, 1e-6),
    "account bsr poisson": lambda: dpmf.account(bsr(HUGE, 4), PoissonSampling(0.01, HUGE), 1.0, 1e-6),
    "account bsr balls-in-bins": lambda: dpmf.account(bsr(HUGE, 4), BallsInBinsSampling(1, HUGE), 1.0, 1e-6),
    "calibrate tree mmcc": lambda: dpmf.calibrate(BinaryTree(HUGE), PoissonSampling(0.01, HUGE), 1.0, 1e-6, method="mmcc"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_size_the_guard_cannot_afford_is_refused_in_one_line_naming_the_size_and_what_fits(case, monkeypatch, evaluations,
                                                                                             peak_memory):
    """Each of these used to end in numpy's ``ArrayMemoryError`` or run for minutes (balls-in-bins
    calibration of the identity at 2^40 steps: > 45 s, no estimate)."""
    monkeypatch.setattr(resources, "available_memory", lambda: HAVE)
    with peak_memory() as peak, pytest.raises(CostLimitError) as info:
        REFUSED[case]()
    # up front: the estimate and its bisection look at types only (no accountant ran, nothing big allocated)
    assert evaluations == [] and peak.bytes < 2**28, peak.bytes
    msg = str(info.value)
    assert "\n" not in msg
    assert f"{HUGE:,} steps" in msg and "16 GiB available" in msg and "force=True" in msg
    assert "at most " in msg and " steps fit" in msg
    fits = int(msg.split("at most ")[1].split(" steps fit")[0].replace(",", ""))
    assert 0 < fits < HUGE


def test_the_steps_the_refusal_says_fit_do_fit_and_one_epoch_more_does_not(monkeypatch):
    """The 'what fits' is the estimate's own boundary (by bisection): at that size the guard lets the
    run through, one more epoch of steps it refuses."""
    from dpmf.accounting.dispatch import _check_memory

    monkeypatch.setattr(resources, "available_memory", lambda: HAVE)
    strategy, scheme = Identity(HUGE), BallsInBinsSampling(2, HUGE)
    with pytest.raises(CostLimitError) as info:
        _check_memory(strategy, scheme, 1.0, "auto")
    fits = int(str(info.value).split("at most ")[1].split(" steps fit")[0].replace(",", ""))
    assert fits % 2 == 0
    _check_memory(dataclasses.replace(strategy, n=fits), dataclasses.replace(scheme, steps=fits), 1.0, "auto")
    with pytest.raises(CostLimitError):
        _check_memory(dataclasses.replace(strategy, n=fits + 2), dataclasses.replace(scheme, steps=fits + 2), 1.0, "auto")


def test_calibrate_force_skips_the_guard_and_a_size_that_fits_calibrates_as_before(monkeypatch):
    monkeypatch.setattr(resources, "available_memory", lambda: HAVE)
    scheme = BallsInBinsSampling(1, 1000)
    cal = dpmf.calibrate(Identity(1000), scheme, 2.0, 1e-6)
    assert cal.report.epsilon <= 2.0
    # force=True reaches the accountant (whose own refusal is no longer the guard's CostLimitError)
    monkeypatch.setattr(resources, "available_memory", lambda: 1.0)
    with pytest.raises(CostLimitError):
        dpmf.calibrate(Identity(1000), scheme, 2.0, 1e-6)
    forced = dpmf.calibrate(Identity(1000), scheme, 2.0, 1e-6, force=True, method="allocation")
    assert forced.report.epsilon <= 2.0


def test_explicit_mmcc_at_a_huge_target_searches_from_the_unamplified_noise(monkeypatch):
    """``method="mmcc"`` at target epsilon 1e3 starts where ``auto``'s closed form would (the
    unamplified noise, an upper bracket: amplification only lowers epsilon), never at sigma = 1
    walking down nor at a tiny noise: the evaluated noises, not the time, are checked."""
    from dpmf.accounting.mmcc import accountant as A

    tried = []
    orig = A.MMCCAccountant.report

    def report(self, sigma, *args, **kwargs):
        tried.append(sigma)
        return orig(self, sigma, *args, **kwargs)

    monkeypatch.setattr(A.MMCCAccountant, "report", report)
    strategy, scheme = bsr(8, 2), PoissonSampling(0.1, 8)
    cal = dpmf.calibrate(strategy, scheme, 1e3, 1e-5, method="mmcc")
    start = unamplified.calibrate_unamplified(strategy, scheme, 1e3, 1e-5)
    assert tried[0] == start
    assert min(tried) >= start / 8  # (a search step shrinks 8x at most)
    assert cal.noise_multiplier <= start and 0.99e3 <= cal.report.epsilon <= 1e3


def _mmcc_seconds(strategy, scheme, sigma):
    return accounting_cost(strategy, scheme, sigma, method="mmcc").seconds


@pytest.mark.parametrize("strategy_of", [BinaryTree, lambda n: bsr(n, 4)], ids=["tree", "bsr4"])
def test_the_mmcc_cost_model_grows_with_steps_and_falls_with_noise(strategy_of, monkeypatch):
    # on the requested grid (memory without limit: no row is coarsened)
    monkeypatch.setattr("dpmf.resources.available_memory", lambda: math.inf)
    sigmas = [0.3, 0.5, 1.0, 2.0, 4.0, 10.0, 40.0]
    for n in (16, 64, 256):
        secs = [_mmcc_seconds(strategy_of(n), PoissonSampling(1 / 16, n), s) for s in sigmas]
        assert all(a > b for a, b in zip(secs, secs[1:])), (n, secs)  # more noise: narrower loss grids
    for s in sigmas:
        secs = [_mmcc_seconds(strategy_of(n), PoissonSampling(1 / 16, n), s) for n in (16, 64, 256, 1024)]
        assert all(a < b for a, b in zip(secs, secs[1:])), (s, secs)  # more steps: more rows


def test_the_mmcc_cost_model_follows_the_coarser_grid_memory_forces(monkeypatch):
    """BinaryTree(256) at sigma 0.5: its widest row spans 2.7e9 points of the 1e-4 grid, far beyond
    16 GiB, so the accountant coarsens it (2026-12-02: the old fit test planned 1e8 points and the run
    was killed for memory at 22 GiB); the estimate then counts the coarser grid's points and time."""
    from dpmf.accounting.mmcc.grid import row_grid

    monkeypatch.setattr("dpmf.resources.available_memory", lambda: 16.0 * 2**30)
    strategy, scheme = BinaryTree(256), PoissonSampling(1 / 16, 256)
    step, points = row_grid(256.0, 0.5)
    assert step > 1e-4 and points <= 2**22 + 1
    est = accounting_cost(strategy, scheme, 0.5, method="mmcc")
    assert est.memory_bytes < 8 * 2**30  # what the accountant plans for, not the 1e-4 grid's 400 GiB
    monkeypatch.setattr("dpmf.resources.available_memory", lambda: math.inf)
    assert row_grid(256.0, 0.5)[0] == 1e-4
    assert accounting_cost(strategy, scheme, 0.5, method="mmcc").seconds > 10 * est.seconds


def test_a_memory_forced_coarser_mmcc_grid_is_never_below_the_requested_one(monkeypatch):
    """The coarser grid memory forces (``mmcc/grid.py``) rounds every loss up: its epsilon is above the
    requested grid's, never below (a rounding gone the optimistic way would fail here)."""
    from dpmf.accounting.mmcc import MMCCAccountant

    strategy, scheme = BinaryTree(8), PoissonSampling(1 / 8, 8)
    fine = MMCCAccountant(strategy, scheme, 1e-5, check_grids=False).report(1.0)  # (the requested grid itself)
    monkeypatch.setattr("dpmf.resources.available_memory", lambda: 512.0 * 2**20)  # room for 1.7e6 points: 2.2e6 needed
    coarse = dpmf.account(strategy, scheme, 1.0, 1e-5, method="mmcc")
    assert coarse.diagnostics["discretization"] > fine.diagnostics["discretization"] == 1e-4
    assert fine.epsilon <= coarse.epsilon <= 1.05 * fine.epsilon
