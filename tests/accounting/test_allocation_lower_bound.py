"""Lower bounds of the random-allocation (Rényi / conditional) accountant's epsilon: the small Rényi
programs of ``RenyiAllocation.remove_epsilon_lower_bound`` and ``accountant.epsilon_lower_bound``, which
let a calibration's probe at another accountant's noise stop without the full Rényi program (issue 50
item 3, 2026-12-03)."""

from __future__ import annotations

import numpy as np
import pytest

import dpmf
from dpmf.accounting.allocation import accountant as acc
from dpmf.accounting.allocation.accountant import AllocationProblem, account_allocation, epsilon_lower_bound
from dpmf.accounting.allocation.renyi import RenyiAllocation
from dpmf.privacy.calibration import NoiseLimitExceeded
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import bsr, catalog

DELTA = 1e-5

# (strategy, scheme) pairs: banded (the program exact at the true bandwidth), a dense Toeplitz (levels with
# tau > 0 only), a nearly diagonal C where conditional composition wins (sigma 4)
PAIRS = {
    "bsr(32, 4) x 2": (lambda: bsr(32, 4), lambda: BallsInBinsSampling(2, 32)),
    "bsr(24, 3) x 1": (lambda: bsr(24, 3), lambda: BallsInBinsSampling(1, 24)),
    "sqrt-toeplitz(20) x 2": (lambda: catalog.build("sqrt-toeplitz", 20), lambda: BallsInBinsSampling(2, 20)),
    "near-diagonal(64)": (lambda: np.eye(64) + 0.05 * np.eye(64, k=-1), lambda: BallsInBinsSampling(1, 64)),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
@pytest.mark.parametrize("sigma", [0.8, 1.2679705063104634, 2.0, 4.0])
def test_remove_lower_bound_is_below_the_reported_remove_epsilon(name, sigma):
    """The small programs' bound is at most the Rényi remove epsilon (every level run: no skip) and not
    vacuous (above 0; how close it comes depends on the order that decides: 0.53 of it on bsr(24, 3) at
    sigma 4, where orders above the bandwidth-3 program's 14 decide); the add direction's closed form is
    the one ``epsilon`` reports."""
    strategy, scheme = PAIRS[name][0](), PAIRS[name][1]()
    problem = AllocationProblem.create(strategy, scheme)
    ren = problem.renyi
    rho, _ = ren.remove(sigma)  # (no delta: every level, nothing skipped)
    from dpmf.privacy.rdp import rdp_to_epsilon

    full = rdp_to_epsilon(ren.orders, rho, DELTA)[0]
    low = ren.remove_epsilon_lower_bound(sigma, DELTA)
    assert 0 < low <= full
    assert ren.add_epsilon(sigma, DELTA) == ren.epsilon(sigma, DELTA)["epsilon_by_direction"]["add"]


def test_remove_lower_bound_with_few_orders_and_one_bandwidth():
    """With the caller's orders (2..6) and a single explicit bandwidth below the true one (tau > 0),
    the bound is still below what the accountant reports; ``above`` stops after the first program
    once exceeded (the diagonal's bound, which is below the two programs' one)."""
    strategy, scheme = bsr(32, 4), BallsInBinsSampling(2, 32)
    for kwargs in ({"orders": [2, 3, 4, 5, 6]}, {"bandwidth": 2}, {"bandwidth": 4, "orders": [3, 9]}):
        problem = AllocationProblem.create(strategy, scheme, **kwargs)
        for joint in ("per-direction", "joint"):
            r = account_allocation(strategy, scheme, 1.5, DELTA, which="renyi", problem=problem, renyi_conversion=joint)
            assert problem.renyi.remove_epsilon_lower_bound(1.5, DELTA) <= r.epsilon_by_direction["remove"]
    ren = AllocationProblem.create(strategy, scheme).renyi
    both, first = ren.remove_epsilon_lower_bound(1.3, DELTA), ren.remove_epsilon_lower_bound(1.3, DELTA, above=1.0)
    assert 1.0 < first < both


@pytest.mark.parametrize("name", sorted(PAIRS))
@pytest.mark.parametrize("sigma", [0.8, 1.2679705063104634, 2.0, 4.0])
def test_epsilon_lower_bound_is_below_the_report(name, sigma):
    """``epsilon_lower_bound`` (with ``above=0``: whatever it can prove) is at most the combined and the
    Rényi-only epsilon of ``account_allocation``; on the nearly diagonal C at sigma 4, where conditional
    composition is below the Rényi bound in both directions, it proves nothing above that epsilon."""
    strategy, scheme = PAIRS[name][0](), PAIRS[name][1]()
    problem = AllocationProblem.create(strategy, scheme)
    for which in ("combined", "renyi"):
        r = account_allocation(strategy, scheme, sigma, DELTA, which=which, problem=problem)
        low = epsilon_lower_bound(problem, sigma, DELTA, 0.0, which=which)
        assert low is None or low <= r.epsilon
    if name == "near-diagonal(64)" and sigma == 4.0:
        r = account_allocation(strategy, scheme, sigma, DELTA, problem=problem)
        assert "epsilon_by_direction" in r.diagnostics["conditional"]  # (conditional composition won)
        low = epsilon_lower_bound(problem, sigma, DELTA, 0.0)
        assert low is None or low <= r.epsilon


def test_epsilon_lower_bound_none_where_conditional_may_be_below(monkeypatch):
    """Negative control: where conditional composition's own lower bound cannot exclude it (its
    ``composition_delta_lower_bound`` replaced by 0), nothing is proved in ``"combined"`` mode, while the
    Rényi-only mode (which never runs it) still has its bound."""
    strategy, scheme = bsr(32, 4), BallsInBinsSampling(2, 32)
    problem = AllocationProblem.create(strategy, scheme)
    assert epsilon_lower_bound(problem, 1.2679705063104634, DELTA, 4.0) is not None
    monkeypatch.setattr(acc, "composition_delta_lower_bound", lambda *args: 0.0)
    assert epsilon_lower_bound(problem, 1.2679705063104634, DELTA, 4.0) is None
    assert epsilon_lower_bound(problem, 1.2679705063104634, DELTA, 4.0, which="renyi") is not None


def test_probe_at_the_readme_snippet_noise_stops_on_the_lower_bound(monkeypatch):
    """README snippet, bsr(32, 4) over 2 epochs: the probe of the Renyi/conditional accountant at
    allocation_pld's answer (sigma 1.26797) ends on the small programs' bound (>= 4.086 > 4; the full
    Rényi epsilon there is 4.230), raising with ``lower_bound=True``, without the full program; the
    same probe with the bound disabled raises with the accountant's value (negative control)."""
    strategy, scheme, sigma = bsr(32, 4), BallsInBinsSampling(2, 32), 1.2679705063104634
    full = []
    real = RenyiAllocation.epsilon
    monkeypatch.setattr(RenyiAllocation, "epsilon", lambda self, *a: full.append(a) or real(self, *a))
    with pytest.raises(NoiseLimitExceeded) as info:
        acc.noise_and_report(strategy, scheme, 4.0, DELTA, limit=sigma)
    assert info.value.lower_bound and 4.0 < info.value.epsilon <= 4.230164635993194 and not full
    monkeypatch.setattr(acc, "epsilon_lower_bound", lambda *a, **k: None)
    with pytest.raises(NoiseLimitExceeded) as info:
        acc.noise_and_report(strategy, scheme, 4.0, DELTA, limit=sigma)
    assert not info.value.lower_bound and info.value.epsilon == pytest.approx(4.230164635993194, rel=1e-12) and full


def test_calibration_notes_the_lower_bound():
    """A whole calibration (bsr(16, 2) over 2 epochs, epsilon 4): the same answer as allocation_pld alone,
    and ``not_calibrated`` says the Renyi/conditional accountant's epsilon at that noise is at least a
    value above the target."""
    strategy, scheme = bsr(16, 2), BallsInBinsSampling(2, 16)
    cal = dpmf.calibrate(strategy, scheme, 4.0, DELTA)
    alone = dpmf.calibrate(strategy, scheme, 4.0, DELTA, method="allocation_pld")
    assert cal.noise_multiplier == alone.noise_multiplier and cal.report.epsilon == alone.report.epsilon
    note = cal.report.diagnostics["not_calibrated"]["allocation"]
    assert note.startswith("epsilon >= ")
    low = float(note.split()[2])
    assert low > 4.0 and low <= account_allocation(strategy, scheme, cal.noise_multiplier, DELTA).epsilon * (1 + 1e-5)


@pytest.mark.parametrize("budget", [1.0e6, 60.0])
def test_remove_lower_bound_below_the_exact_divergence_by_enumeration(monkeypatch, budget):
    """A dense non-negative Gram on b = 5 slots (true cyclic bandwidth 3: every level but the exact one
    has tau > 0), orders 2..6: the bound is below the conversion of the exact ``R_a`` of Lemma 3.2, summed
    over all ``b^a`` tuples; also with a budget so small that the programs stop at order 2-3 and the
    higher orders come from ``R_a >= R_A``."""
    import itertools
    import math

    from dpmf.accounting.allocation import renyi
    from dpmf.privacy.rdp import rdp_to_epsilon

    monkeypatch.setattr(renyi, "LOWER_BOUND_BUDGET", budget)
    rng = np.random.default_rng(3)
    m = rng.uniform(0.0, 1.0, (5, 7))
    g = m @ m.T
    sigma, orders = 0.9, np.arange(2, 7)
    exact = []
    for a in orders:
        terms = [sum(g[r[i], r[j]] for i in range(a) for j in range(a) if i != j) / (2 * sigma**2)
                 for r in itertools.product(range(5), repeat=int(a))]
        exact.append((float(np.logaddexp.reduce(terms)) - a * math.log(5)) / (a - 1))
    ren = RenyiAllocation.create(g, orders=orders)
    assert ren.true_bandwidth == 3
    eps_exact = rdp_to_epsilon(orders, np.array(exact), DELTA)[0]
    low = ren.remove_epsilon_lower_bound(sigma, DELTA)
    assert 0 < low <= eps_exact
    if budget > 1e3:  # (the exact program at the true bandwidth reaches every order: the same value)
        assert low == pytest.approx(eps_exact, rel=1e-9)
