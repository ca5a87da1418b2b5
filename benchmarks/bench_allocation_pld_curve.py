"""``dpmf.compose`` of random-allocation (``allocation_pld``) reports: the carried PLD (issue 40 item 6).

For ``E`` one-epoch DP-SGD reports under balls-in-bins (``t`` steps, noise ``sigma``), composed at
``delta``, this prints in one process, on the same input:

* ``old``: the composition through each report's (epsilon, delta) only (what ``dpmf.compose`` did
  before the reports carried a PLD: the report with its curve removed), each report at ``delta / E``;
* ``new``: the composition of the carried PLDs (``diagnostics["tight"]``);
* ``direct``: allocation_pld's own fresh-slot ``E``-epoch answer (the same mechanism, computed as one
  composition inside the accountant);
* the time of ``dpmf.account`` (median of interleaved rounds, fresh memo each round) and of building
  the carried PLD (``report.privacy_curve``, paid only on first use), and their ratio.

    python benchmarks/bench_allocation_pld_curve.py            # the grid
    python benchmarks/bench_allocation_pld_curve.py --fast     # two points
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import dpmf
from dpmf.accounting.allocation import pld as alloc_pld
from dpmf.accounting.allocation import pld_compose
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import Identity

#: (sigma, steps per epoch t, epochs E composed, delta of the composition)
GRID = ((2.0, 50, 2, 1e-5), (2.0, 50, 10, 1e-5), (1.0, 100, 10, 1e-5), (1.0, 100, 2, 1e-6), (3.0, 1000, 10, 1e-6),
        (0.9, 200, 2, 1e-5), (0.9, 200, 5, 1e-5))  # (the last two: where issue 53 measured the README's claim)
FAST = GRID[:2]


def _clear_memos() -> None:
    alloc_pld._MEMO.clear()  # noqa: SLF001 (a benchmark: each round recomputes)
    pld_compose._MEMO.clear()  # noqa: SLF001


def run(sigma: float, t: int, epochs: int, delta: float, rounds: int = 3) -> dict:
    scheme = BallsInBinsSampling(1, t)
    acc, build = [], []
    for _ in range(rounds):  # interleaved: account, then build the PLD
        _clear_memos()
        start = time.process_time()
        r = dpmf.account(Identity(t), scheme, sigma, delta / epochs, method="allocation_pld")
        acc.append(time.process_time() - start)
        start = time.process_time()
        r.privacy_curve  # noqa: B018 (builds the carried PLD)
        build.append(time.process_time() - start)
    start = time.process_time()
    new = dpmf.compose([r], times=epochs, delta=delta)
    t_new = time.process_time() - start
    bare = dataclasses.replace(r, curve=None, curve_source=None)
    old = dpmf.compose([bare], times=epochs, delta=delta)
    direct = alloc_pld.allocation_pld_epsilon(sigma, t, delta, epochs=epochs, fresh_slots=True)["epsilon"]
    row = {"sigma": sigma, "t": t, "E": epochs, "delta": delta, "one_epoch_eps": r.epsilon,
           "old": old.epsilon, "new": new.epsilon, "new_tight": new.diagnostics["tight"], "direct": direct,
           "new/direct": new.epsilon / direct, "old/new": old.epsilon / new.epsilon,
           "account_s": statistics.median(acc), "build_pld_s": statistics.median(build), "compose_s": t_new}
    row["build/account"] = row["build_pld_s"] / row["account_s"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true")
    args = ap.parse_args()
    print("sigma    t   E  delta   one-epoch eps   old (eps,delta)   new (PLD)   direct fresh   new/direct  "
          "old/new  account s  build PLD s  build/account  compose s")
    for case in FAST if args.fast else GRID:
        r = run(*case)
        print(f"{r['sigma']:4.1f} {r['t']:5d} {r['E']:3d} {r['delta']:.0e}  {r['one_epoch_eps']:12.5f}  "
              f"{r['old']:14.5f}  {r['new']:10.5f}  {r['direct']:12.5f}  {r['new/direct']:10.5f}  "
              f"{r['old/new']:6.3f}  {r['account_s']:8.3f}  {r['build_pld_s']:10.3f}  {r['build/account']:12.1f}  "
              f"{r['compose_s']:8.3f}  tight={r['new_tight']}")


if __name__ == "__main__":
    main()
