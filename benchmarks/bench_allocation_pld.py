"""DP-SGD under random allocation (balls-in-bins): dpmf's PLD accountant against Feldman & Shenfeld's.

``python benchmarks/run.py --only allocation_pld [--quick]``. For ``t in {8, 64, 128, 1000, 10^4}``
steps (one epoch, each example in exactly one step) and ``sigma in {0.8, 1, 2}`` at
``delta = 1e-5``, the peer is ``PLD_accounting.gaussian_allocation_epsilon_range`` (PyPI
``pld-accounting==2.0``, ``bench`` extra), which returns an upper and a lower bound on the exact
epsilon; dpmf is :func:`dpmf.accounting.allocation.pld.account_allocation_pld` (defaults).

Agreement check: ``peer lower <= dpmf <= 1.01 * peer upper``. The detail prints dpmf / peer upper
and dpmf / peer lower. ``k`` epochs: dpmf reuses the slot every epoch (the exact reduction to one
epoch at ``sigma / sqrt(k)``); the peer's ``num_epochs`` composes *independent* allocations, a
different sampler, so those cases give the peer ``num_epochs=1`` at ``sigma / sqrt(k)``.
``t = 10^4`` cases are ``slow`` (the peer takes 4 to 20 minutes each here). Without the package the
peer is the pinned pair from ``tests/accounting/test_allocation_pld.py`` (no timing meaning then).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from case import Case  # noqa: E402

from dpmf.accounting.allocation.pld import account_allocation_pld  # noqa: E402
from dpmf.sampling import BallsInBinsSampling  # noqa: E402
from dpmf.strategies import Identity  # noqa: E402

try:  # Feldman & Shenfeld's PLD accountant for random allocation (bench extra)
    import PLD_accounting as _peer_pkg  # type: ignore
except ImportError:  # pragma: no cover - optional
    _peer_pkg = None

DELTA = 1e-5
STEPS = (8, 64, 128, 1000, 10_000)
SIGMAS = (0.8, 1.0, 2.0)
#: (steps, epochs, sigma): multi-epoch cases (slot reused)
EPOCH_CASES = ((64, 4, 2.0), (128, 4, 2.0))


def _pinned(t: int, sigma: float):
    sys.path.insert(0, str(HERE.parent / "tests" / "accounting"))
    from test_allocation_pld import PEER  # noqa: PLC0415

    lower, upper = PEER[(t, sigma)]
    return upper, lower


def _peer(t: int, sigma: float):
    def run():
        if _peer_pkg is None:
            return _pinned(t, sigma)
        return tuple(_peer_pkg.gaussian_allocation_epsilon_range(delta=DELTA, sigma=sigma, num_steps=t))

    return run


def _ours(t: int, epochs: int, sigma: float):
    def run():
        return account_allocation_pld(Identity(epochs * t), BallsInBinsSampling(epochs, epochs * t), sigma, DELTA)

    return run


def _compare(peer, report):
    upper, lower = peer
    eps = report.epsilon
    ok = lower <= eps <= 1.01 * upper
    return ok, (
        f"dpmf eps={eps:.6f} (remove {report.epsilon_by_direction['remove']:.6f}, "
        f"add {report.epsilon_by_direction['add']:.6f}); peer [{lower:.6f}, {upper:.6f}]; "
        f"dpmf/upper={eps / upper:.4f}, dpmf/lower={eps / lower:.4f}"
    )


CASES = [
    Case(
        name=f"dpsgd_alloc_pld_t{t}_sigma{s:g}",
        peer=_peer(t, s),
        dpmf=_ours(t, 1, s),
        compare=_compare,
        tolerance="peer lower <= dpmf <= 1.01 x peer upper",
        peer_name="PLD_accounting" if _peer_pkg is not None else "pinned PLD_accounting values",
        slow=t > 1000,
    )
    for t in STEPS
    for s in SIGMAS
] + [
    Case(
        name=f"dpsgd_alloc_pld_t{t}_k{k}_sigma{s:g}",
        peer=_peer(t, s / math.sqrt(k)),
        dpmf=_ours(t, k, s),
        compare=_compare,
        tolerance="peer (one epoch at sigma/sqrt(k)) lower <= dpmf <= 1.01 x upper",
        peer_name="PLD_accounting",
    )
    for t, k, s in EPOCH_CASES
]
