"""The registry's MMCC and Monte Carlo entries are imported on first use (issue 50 item 3, 2026-12-03): a
balls-in-bins calibration (the README snippet) imports neither, MMCC's ``supports`` answers a scheme it
never covers without its module, word for word as the module does, and ``auto`` asks only the methods it may
choose (Monte Carlo's loss samplers are asked only for the refusal that lists every method)."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest

import dpmf
from dpmf.accounting import dispatch
from dpmf.accounting.dispatch import METHODS
from dpmf.errors import UnsupportedConfigurationError
from dpmf.sampling import (BallsInBinsSampling, CyclicPoissonSampling, FixedOrderSampling, MinSepSampling,
                           MultiAttributionMinSepSampling, PoissonSampling)
from dpmf.sampling.schemes import SCHEMES
from dpmf.strategies import Identity, bsr

SCHEME_INSTANCES = [PoissonSampling(0.2, 8), FixedOrderSampling(1, 8), CyclicPoissonSampling(0.5, 8, 2),
                    MinSepSampling(0.2, 8, 2), BallsInBinsSampling(1, 8), MultiAttributionMinSepSampling(0.2, 8, 2, 2)]


def test_every_scheme_type_is_covered():
    assert {type(s) for s in SCHEME_INSTANCES} == set(SCHEMES)


def test_the_deferred_entries_are_the_accountants():
    from dpmf.accounting.mmcc import accountant as mmcc
    from dpmf.accounting.montecarlo import accountant as montecarlo

    m, mc = METHODS[mmcc.NAME], METHODS[montecarlo.NAME]
    assert m.name == mmcc.NAME and mc.name == montecarlo.NAME
    assert m.supports.__wrapped__ is mmcc.supports and m.run.__wrapped__ is mmcc.account_mmcc
    assert m.fast_calibration.__wrapped__ is mmcc.noise_and_report and m.probe.__wrapped__ is mmcc.probe_mmcc
    assert mc.supports.__wrapped__ is montecarlo.supports and mc.run.__wrapped__ is montecarlo.account_montecarlo
    assert isinstance(mc.own_calibration, functools.partial)
    assert mc.own_calibration.func.__wrapped__ is montecarlo.calibrate_montecarlo


@pytest.mark.parametrize("scheme", SCHEME_INSTANCES, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("strategy", [Identity(8), bsr(8, 2)], ids=["identity", "bsr"])
def test_mmcc_supports_answers_as_the_module(strategy, scheme):
    """The registry's MMCC ``supports`` (a scheme outside Poisson / cyclic Poisson answered without the
    module) gives the module's answer for every scheme type, with and without ``adaptive``."""
    from dpmf.accounting.mmcc import accountant as mmcc

    for kwargs in ({}, {"adaptive": False}):
        assert METHODS["mmcc"].supports(strategy, scheme, **kwargs) == mmcc.supports(strategy, scheme, **kwargs)


def test_auto_refusal_still_lists_every_method(monkeypatch):
    """Where no method auto may choose applies, the refusal lists every method's reason (Monte Carlo's
    too), as before; where one applies, Monte Carlo's ``supports`` is not asked."""
    asked = []
    mc = METHODS["montecarlo"]
    spy = dispatch.dataclasses.replace(mc, supports=lambda *a, **k: asked.append(1) or mc.supports(*a, **k))
    monkeypatch.setitem(METHODS, "montecarlo", spy)
    dpmf.calibrate(bsr(8, 2), BallsInBinsSampling(1, 8), 4.0, 1e-5, method="auto")
    assert asked == []
    for name in [n for n, m in METHODS.items() if m.in_auto]:
        real = METHODS[name]
        monkeypatch.setitem(METHODS, name, dispatch.dataclasses.replace(real, supports=lambda *a, **k: "not this one"))
    with pytest.raises(UnsupportedConfigurationError, match="no accountant covers") as info:
        dpmf.account(bsr(8, 2), MinSepSampling(0.2, 8, 2), 1.0, 1e-5)
    assert asked == [1] and "montecarlo: " in str(info.value) and "mmcc: not this one" in str(info.value)


def test_a_balls_in_bins_calibration_imports_neither_mmcc_nor_montecarlo():
    code = ("import sys, dpmf\n"
            "from dpmf.strategies import bsr\nfrom dpmf.sampling import BallsInBinsSampling\n"
            "dpmf.calibrate(bsr(8, 2), BallsInBinsSampling(1, 8), 4.0, 1e-5)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('dpmf.accounting.mmcc', 'dpmf.accounting.montecarlo'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
