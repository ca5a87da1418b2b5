"""DP-SGD (identity, Poisson) accounting and calibration at T = 10^3, 10^5, 10^6 steps vs dp_accounting.

    python benchmarks/bench_dpsgd_scale.py [--repeats R] [--skip-calibrate]

For each length, the same input to both libraries in one run (alternating, median of R):

* account: ``PLDAccountant().compose(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), T)`` then
  ``get_epsilon(delta)`` vs ``dpmf.account(Identity(T), PoissonSampling(q, T), sigma, delta)``;
  same answer = |eps diff| <= 1e-6 relative (both use the pessimistic connect-the-dots PLD on the
  grid 1e-4);
* calibrate: ``calibrate_dp_mechanism(PLDAccountant, event(sigma), target, delta)`` vs
  ``dpmf.calibrate(..., target, delta)``; same answer = |sigma diff| <= 0.5% and dpmf's epsilon at
  its sigma <= target.

Prints time (s), peak traced memory (MiB, ``tracemalloc``: numpy buffers included), the ratio
peer / dpmf (> 1: dpmf faster) and the check. The module also exposes ``CASES`` for
``benchmarks/run.py`` (the T = 10^5 account case).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc

import dp_accounting as dpa

import dpmf
from case import Case

DELTA = 1e-6
#: (steps, sampling probability, noise multiplier for account, target epsilon for calibrate)
GRID = [(1_000, 1e-2, 1.0, 1.0), (100_000, 1e-3, 1.0, 2.0), (1_000_000, 1e-4, 0.8, 2.0)]


def _event(q: float, steps: int):
    return lambda sigma: dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)


def peer_account(steps, q, sigma) -> float:
    acc = dpa.pld.PLDAccountant()
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
    return float(acc.get_epsilon(DELTA))


def dpmf_account(steps, q, sigma) -> float:
    report = dpmf.account(dpmf.strategies.Identity(steps), dpmf.sampling.PoissonSampling(q, steps), sigma, DELTA)
    return float(report.epsilon)


def peer_calibrate(steps, q, target) -> float:
    return float(dpa.calibrate_dp_mechanism(dpa.pld.PLDAccountant, _event(q, steps), target, DELTA))


def dpmf_calibrate(steps, q, target) -> tuple[float, float]:
    cal = dpmf.calibrate(dpmf.strategies.Identity(steps), dpmf.sampling.PoissonSampling(q, steps), target, DELTA)
    return float(cal.noise_multiplier), float(cal.report.epsilon)


def timed(fn, *args) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def peak_mib(fn, *args) -> float:
    """Peak traced memory of one call (a separate, untimed call: tracemalloc slows Python code)."""
    tracemalloc.start()
    fn(*args)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return peak


def compare(peer_fn, ours_fn, args, repeats):
    peer_t, ours_t = [], []
    for _ in range(repeats):  # alternate, so machine noise hits both
        t, peer = timed(peer_fn, *args)
        peer_t.append(t)
        t, ours = timed(ours_fn, *args)
        ours_t.append(t)
    pm, om = peak_mib(peer_fn, *args), peak_mib(ours_fn, *args)
    return statistics.median(peer_t), statistics.median(ours_t), pm, om, peer, ours


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-calibrate", action="store_true")
    args = ap.parse_args(argv)
    dpmf_account(10, 0.5, 1.0), peer_account(10, 0.5, 1.0)  # imports and warm-up outside the timings
    ok = True
    print("| task | T | q | peer s | dpmf s | ratio | peer MiB | dpmf MiB | check |")
    print("|---|---|---|---|---|---|---|---|---|")
    for steps, q, sigma, target in GRID:
        pt, ot, pm, om, peer, ours = compare(peer_account, dpmf_account, (steps, q, sigma), args.repeats)
        good = abs(ours - peer) <= 1e-6 * peer
        ok &= good
        print(f"| account sigma={sigma} | {steps:.0e} | {q:g} | {pt:.2f} | {ot:.2f} | {pt / ot:.2f}x | {pm:.0f} | {om:.0f} | "
              f"{'ok' if good else 'FAIL'}: eps {ours:.6f} vs {peer:.6f} |")
        sys.stdout.flush()
        if args.skip_calibrate:
            continue
        pt, ot, pm, om, peer, ours = compare(peer_calibrate, dpmf_calibrate, (steps, q, target), max(1, args.repeats // 2))
        sigma_ours, eps_ours = ours
        good = abs(sigma_ours - peer) <= 5e-3 * peer and eps_ours <= target
        ok &= good
        print(f"| calibrate eps={target} | {steps:.0e} | {q:g} | {pt:.2f} | {ot:.2f} | {pt / ot:.2f}x | {pm:.0f} | {om:.0f} | "
              f"{'ok' if good else 'FAIL'}: sigma {sigma_ours:.5f} vs {peer:.5f}, dpmf eps {eps_ours:.6f} |")
        sys.stdout.flush()
    return 0 if ok else 1


def _compare_case(peer: float, ours: float) -> tuple[bool, str]:
    return abs(ours - peer) <= 1e-6 * peer, f"eps dpmf={ours:.6f} peer={peer:.6f}"


CASES = [
    Case(
        "dpsgd_account_T1e5",
        lambda: peer_account(100_000, 1e-3, 1.0),
        lambda: dpmf_account(100_000, 1e-3, 1.0),
        _compare_case,
        "|eps diff| <= 1e-6 relative",
    )
]

if __name__ == "__main__":
    sys.exit(main())
