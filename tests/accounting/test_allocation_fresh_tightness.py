"""Fresh slots and k-of-t random allocation for DP-SGD against PLD_accounting 2.0 (issue 40 item 4).

PLD_accounting's ``gaussian_allocation_epsilon_range`` returns an upper and a lower bound on the
exact epsilon of the same mechanism (fresh epochs, the same floor/ceil split for k > 1), computed
live here (it is a benchmark peer, not a dependency: skipped when it is not installed). dpmf's
certified epsilon must be >= the lower bound (else it is optimistic) and <= 1.03x the upper bound.
The full grid is ``benchmarks/bench_allocation_fresh.py`` (slow test below).
"""

import pytest

from dpmf.accounting.allocation.pld import allocation_pld_epsilon

PLD_accounting = pytest.importorskip(
    "PLD_accounting", reason="PLD_accounting (benchmark peer, pip install pld-accounting) is not installed")

#: (sigma, steps per epoch, selected per epoch, fresh epochs, delta)
# (the first case failed before the add profile's fix: 1.054x the upper bound)
FAST = [(3.0, 100, 4, 3, 1e-8), (2.0, 20, 1, 10, 1e-5)]
SLOW = [
    (2.0, 40, 2, 10, 1e-6),
    (2.0, 50, 1, 40, 1e-5), (1.0, 100, 1, 10, 1e-5), (2.0, 100, 1, 10, 1e-6), (1.5, 50, 1, 20, 1e-5),
    (3.0, 20, 1, 50, 1e-5), (1.0, 100, 2, 10, 1e-5), (2.0, 100, 4, 10, 1e-6), (3.0, 100, 8, 10, 1e-5),
    (2.0, 64, 2, 20, 1e-8), (4.0, 200, 8, 5, 1e-6),
]


def _check(sigma, t, k, epochs, delta):
    ours = allocation_pld_epsilon(sigma, t, delta, epochs=epochs, num_selected=k, fresh_slots=True)["epsilon"]
    upper, lower = PLD_accounting.gaussian_allocation_epsilon_range(
        delta=delta, sigma=sigma, num_steps=t, num_selected=k, num_epochs=epochs)
    assert ours >= lower, f"dpmf {ours} below PLD_accounting's lower bound {lower}: optimistic"
    assert ours <= 1.03 * upper, f"dpmf {ours} is {ours / upper:.4f}x PLD_accounting's upper bound {upper}"


@pytest.mark.parametrize("case", FAST)
def test_fresh_and_k_of_t_between_peer_bounds(case):
    _check(*case)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW)
def test_fresh_and_k_of_t_between_peer_bounds_grid(case):
    _check(*case)
