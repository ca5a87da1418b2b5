"""DP-SGD fresh slots and k-of-t random allocation: dpmf against PLD_accounting's upper and lower bounds.

For ``E`` epochs of ``t`` steps with ``k`` of them per example per epoch, slots drawn anew each
epoch (``C = I``), noise ``sigma`` and target ``delta``, this compares dpmf's certified
:func:`~dpmf.accounting.allocation.pld.allocation_pld_epsilon` (``fresh_slots=True``) with
PLD_accounting 2.0's ``gaussian_allocation_epsilon_range`` (Feldman & Shenfeld), which returns an
upper and a lower bound on the exact epsilon of the same mechanism (its ``num_epochs`` are fresh
epochs, its ``num_selected > 1`` the same floor/ceil split). Both run in this process on the same
input; printed per point: dpmf's epsilon (and per direction), PLD_accounting's (upper, lower),
``dpmf / upper`` (the goal of issue 40 item 4 is ``<= 1.03``) and ``dpmf / lower`` (must be
``>= 1``: below it dpmf would be optimistic, a soundness bug), and both times.

    python benchmarks/bench_allocation_fresh.py --fast        # 4 points
    nice -n 10 python benchmarks/bench_allocation_fresh.py    # the whole grid
    python benchmarks/bench_allocation_fresh.py --memory      # peak RSS of dpmf at t = 10^4

``--memory`` runs each case in a child process and reads its peak RSS (``ru_maxrss``), as
``bench_allocation_tightness.py --memory`` does (same cases: one epoch, ``t = 10^4``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: (sigma, steps per epoch t, selected k, epochs E, delta): 10-50 fresh epochs and k = 2-8
GRID = (
    (2.0, 50, 1, 40, 1e-5),   # issue 40's reproduction
    (3.0, 100, 4, 3, 1e-8),   # issue 40's reproduction
    (1.0, 100, 1, 10, 1e-5),
    (2.0, 100, 1, 10, 1e-6),
    (1.5, 50, 1, 20, 1e-5),
    (3.0, 20, 1, 50, 1e-5),
    (1.0, 100, 2, 10, 1e-5),
    (2.0, 100, 4, 10, 1e-6),
    (3.0, 100, 8, 10, 1e-5),
    (2.0, 64, 2, 20, 1e-8),
    (4.0, 200, 8, 5, 1e-6),
    (1.5, 30, 3, 1, 1e-5),
)
FAST = (GRID[1], GRID[2], GRID[6], GRID[11])
MEMORY_CASES = ((1.0, 10_000, 1e-5), (0.5, 10_000, 1e-12))


def run_point(sigma, t, k, epochs, delta) -> dict:
    from dpmf.accounting.allocation.pld import allocation_pld_epsilon

    import PLD_accounting

    t0 = time.perf_counter()
    ours = allocation_pld_epsilon(sigma, t, delta, epochs=epochs, num_selected=k, fresh_slots=True)
    t1 = time.perf_counter()
    upper, lower = PLD_accounting.gaussian_allocation_epsilon_range(
        delta=delta, sigma=sigma, num_steps=t, num_selected=k, num_epochs=epochs)
    t2 = time.perf_counter()
    return {"sigma": sigma, "t": t, "k": k, "epochs": epochs, "delta": delta, "dpmf": ours["epsilon"],
            "dpmf_by_direction": ours["epsilon_by_direction"], "upper": upper, "lower": lower,
            "ratio_upper": ours["epsilon"] / upper, "ratio_lower": ours["epsilon"] / lower,
            "dpmf_s": t1 - t0, "peer_s": t2 - t1}


def _child(sigma: float, t: int, delta: float) -> None:
    from dpmf.accounting.allocation.pld import allocation_pld_epsilon

    t0 = time.perf_counter()
    eps = allocation_pld_epsilon(sigma, t, delta)["epsilon"]
    print(json.dumps({"epsilon": eps, "seconds": time.perf_counter() - t0}))


def memory() -> list[dict]:
    rows = []
    for sigma, t, delta in MEMORY_CASES:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", repr(sigma), str(t), repr(delta)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        res = json.loads(out.strip().splitlines()[-1])
        rows.append({"t": t, "sigma": sigma, "delta": delta, **res, "max_rss_mib": usage.ru_maxrss / 1024})
        print(f"t={t} sigma={sigma:g} delta={delta:g}: epsilon {res['epsilon']:.6g}, {res['seconds']:.2f} s, "
              f"max RSS {usage.ru_maxrss / 1024:.0f} MiB", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true", help=f"{len(FAST)} points instead of {len(GRID)}")
    ap.add_argument("--memory", action="store_true", help="peak RSS of dpmf at t = 10^4 (no peer)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(float(args.child[0]), int(args.child[1]), float(args.child[2]))
        return 0
    if args.memory:
        memory()
        return 0
    rows = []
    print("| sigma | t | k | E | delta | dpmf (remove / add) | PLD_accounting [lower, upper] | dpmf/upper | dpmf/lower | s (dpmf / peer) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for point in FAST if args.fast else GRID:
        r = run_point(*point)
        rows.append(r)
        d = r["dpmf_by_direction"]
        miss = "" if r["ratio_upper"] <= 1.03 else " **miss**"
        print(f"| {r['sigma']:g} | {r['t']} | {r['k']} | {r['epochs']} | {r['delta']:g} | {r['dpmf']:.4f} "
              f"({d['remove']:.4f} / {d['add']:.4f}) | [{r['lower']:.4f}, {r['upper']:.4f}] | "
              f"{r['ratio_upper']:.4f}{miss} | {r['ratio_lower']:.4f} | {r['dpmf_s']:.1f} / {r['peer_s']:.1f} |",
              flush=True)
    ratios = [r["ratio_upper"] for r in rows]
    print(f"dpmf/upper: min {min(ratios):.4f}, median {statistics.median(ratios):.4f}, max {max(ratios):.4f}; "
          f"misses (> 1.03): {sum(x > 1.03 for x in ratios)} of {len(ratios)}; "
          f"below the lower bound: {sum(r['ratio_lower'] < 1 for r in rows)}")
    return 1 if any(r["ratio_lower"] < 1 or not math.isfinite(r["dpmf"]) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
