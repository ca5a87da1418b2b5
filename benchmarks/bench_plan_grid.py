"""``dpmf plan`` over a grid of runs (issue 49, "Done when"): how each candidate ended, the time, the
best row, and -- for some runs -- whether the budgeted plan picked the thorough plan's best row.

Each run of the grid (dataset 1e3-1e6, 1-20 epochs, epsilon 0.5-16) is planned with
:func:`dpmf.planner.plan` under a time budget, in a fresh process, with an empty cache, the way the
command runs (``workers`` auto). Per run it prints: rows certified / pruned / cut (cut rows with a
certified noise, and cut candidates with none: "could rank anywhere"), wall and CPU seconds, the
load average when it started, and the best row. With ``--thorough K`` the first ``K`` runs marked
``check`` are also planned thorough (no budget) and the best rows compared: the budgeted plan must
pick the same row or one within 2% prefix RMSE (``OK`` / ``DIFFERS``).

There is no peer library for this (a whole-workflow benchmark), so it is not a ``Case`` for
``benchmarks/run.py``; run it directly::

    python benchmarks/bench_plan_grid.py [--budget 25] [--thorough 3] [--only 0,3]

The check column is the issue's acceptance test; times are a loaded 2-core machine's (quote the load).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CASES: list = []  # not a peer comparison (see the docstring)

#: (dataset size, batch size, epochs, epsilon, delta, thorough check?)
GRID = [
    (1_000, 100, 1, 1.0, 1e-5, False),
    (1_000, 50, 20, 8.0, 1e-5, False),
    (10_000, 200, 5, 2.0, 1e-6, True),
    (10_000, 500, 10, 0.5, 1e-6, False),
    (50_000, 500, 5, 2.0, 1e-6, True),  # the default dpmf plan
    (60_000, 600, 10, 1.0, 1e-6, True),  # the README's 10-epoch example
    (100_000, 1_000, 2, 16.0, 1e-6, False),
    (1_000_000, 10_000, 3, 4.0, 1e-7, False),
]

_CHILD = r"""
import json, os, resource, sys, time
from dpmf.planner import TrainingRun, plan
n, b, k, eps, delta, budget, cache = json.loads(sys.argv[1])
t0 = time.perf_counter()
res = plan(TrainingRun(n, b, k, eps, delta), budget=budget, thorough=budget is None, cache=cache)
wall = time.perf_counter() - t0
ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
cpu = sum(r.ru_utime + r.ru_stime for r in ru)
counts = res.counts()
best = res[0]
print(json.dumps({"wall": wall, "cpu": cpu, "counts": counts,
                  "cut_rows": sum(1 for r in res if r.cut),
                  "unranked": sum(1 for c in res.cut if c.by_budget),
                  "best": [best.strategy, best.sampling, best.method, best.noise_multiplier, best.prefix_sum_rmse,
                           best.cut],
                  "min_sep": min((r.rank or 0, r.strategy, r.sampling, r.prefix_sum_rmse) for r in res
                                 if r.sampling.startswith("b-min-sep") and not r.pruned) if any(
                                 r.sampling.startswith("b-min-sep") and not r.pruned for r in res) else None}))
"""


def plan_once(case, budget):
    with tempfile.TemporaryDirectory() as cache:
        load = os.getloadavg()[0]
        out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([*case[:5], budget, cache])],
                             capture_output=True, text=True, check=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    data["load"] = load
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=25.0)
    ap.add_argument("--thorough", type=int, default=3, help="thorough checks of the first K marked runs")
    ap.add_argument("--only", default="", help="comma-separated indices of GRID to run")
    args = ap.parse_args()
    picks = [int(i) for i in args.only.split(",") if i] or list(range(len(GRID)))
    print(f"budget {args.budget:g} s, {os.cpu_count()} CPUs\n")
    print("| # | run (N, batch, epochs, eps, delta) | steps | certified / pruned / cut (rows, unranked) | wall s | CPU s "
          "| load | best row (prefix RMSE) | b-min-sep best (rank, RMSE) | thorough best | check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    checks = 0
    for i in picks:
        case = GRID[i]
        d = plan_once(case, args.budget)
        c = d["counts"]
        best = d["best"]
        line = (f"| {i} | {case[0]:,}, {case[1]:,}, {case[2]}, {case[3]:g}, {case[4]:g} | "
                f"{case[2] * (case[0] // case[1]):,} | {c['certified']} / {c['pruned']} / {c['cut']} "
                f"({d['cut_rows']}, {d['unranked']}) | {d['wall']:.1f} | {d['cpu']:.1f} | {d['load']:.1f} | "
                f"{best[0]} / {best[1]} ({best[2]}, sigma {best[3]:.4g}{', cut' if best[5] else ''}): {best[4]:.4g} | ")
        ms = d["min_sep"]
        line += (f"{ms[1]} / {ms[2]}: #{ms[0]}, {ms[3]:.4g} | " if ms else "none fits | ")
        if case[5] and checks < args.thorough:
            checks += 1
            t = plan_once(case, None)
            tb = t["best"]
            same = (tb[0], tb[1]) == (best[0], best[1]) or best[4] <= 1.02 * tb[4]
            line += f"{tb[0]} / {tb[1]}: {tb[4]:.4g} ({t['wall']:.0f} s) | {'OK' if same else 'DIFFERS'} |"
        else:
            line += "- | - |"
        print(line, flush=True)


if __name__ == "__main__":
    main()
