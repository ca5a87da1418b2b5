"""Allocation calibrations over a grid of BandMF pairs, before / after: noise, evaluations, CPU seconds.

Each cell is ``dpmf.calibrate(bsr(n, bands), BallsInBinsSampling(epochs, n), target, 1e-5)`` (method
``auto``: ``allocation_pld`` with its Markov members wins on every cell) in a fresh process per side,
the two sides alternated, so a busy machine slows both alike. A cell prints both noises (they may
differ within the calibration's ``rel_tol`` window, 1e-4, where the search's path changed), the number
of ``allocation_pld`` evaluations (every member set the search ran, steering sets included) and the CPU
seconds (``time.process_time``, every thread) of the call; the last line the totals.

    git worktree add /tmp/before df856f4
    python benchmarks/bench_allocation_calibration_grid.py [--before /tmp/before/src] [--rounds 2] [--quick | --fresh]

Each cell also prints today's up-front cost estimate (``dpmf.accounting.cost.accounting_cost``) over its
measured CPU time, and the last line their range (issue 50 item 6: within 2x).

Why a grid: the calibration steers by cheaper member sets whose gain depends on the pair (where the
ring family wins near the answer, a steering set's epsilons are above the accountant's): a change is
judged over many pairs, not on the README's alone (benchmarks/README.md, "the way down steered by the
members before the ring family").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CASES: list = []  # (a script with its own child processes; benchmarks/run.py finds no case here)

ROOT = Path(__file__).resolve().parents[1]

#: (slots n, bands, epochs, target epsilon): the README snippet's and `dpmf calibrate` pairs first
GRID = [
    (32, 4, 2, 4.0), (100, 4, 2, 2.0),
    (24, 4, 2, 2.98), (24, 4, 2, 3.6), (24, 4, 2, 2.0), (28, 4, 2, 3.0), (32, 4, 2, 2.5), (40, 4, 2, 3.0),
    (32, 4, 1, 3.0), (48, 4, 2, 2.0), (48, 4, 2, 4.0), (64, 4, 2, 3.0), (24, 3, 2, 2.5), (36, 3, 3, 3.0),
    (33, 4, 3, 5.0), (20, 4, 2, 1.5), (56, 4, 1, 2.0), (32, 2, 2, 3.0), (40, 4, 2, 6.0),
]
QUICK = GRID[:1] + GRID[2:9]  # (without the 20-CPU-s `dpmf calibrate` pair and the last ten)
#: ``--fresh``: (slots n, bands, epochs, target epsilon, delta), a fresh slot each epoch (composed members);
#: the last is the default ``dpmf plan``'s costly row (bsr-4, 5 fresh epochs of 100, epsilon 2 at 1e-6)
FRESH_GRID = [
    (64, 4, 2, 3.0, 1e-5), (128, 4, 2, 2.0, 1e-5), (96, 4, 3, 2.5, 1e-5), (320, 4, 5, 3.0, 1e-5),
    (48, 4, 2, 4.0, 1e-5), (200, 4, 4, 2.0, 1e-5), (160, 4, 5, 3.0, 1e-5), (500, 4, 5, 2.0, 1e-6),
]

_CHILD = """
import json, time
import dpmf
from dpmf.accounting.allocation import pld
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import bsr
n, bands, epochs, target, *rest = {cell!r}
delta = rest[0] if rest else 1e-5
scheme = BallsInBinsSampling(epochs, n, fresh_slots=bool(rest))
count = [0]
real = pld._epsilon
def counted(*args):
    count[0] += 1
    return real(*args)
pld._epsilon = counted
t0 = time.process_time()
cal = dpmf.calibrate(bsr(n, bands), scheme, target, delta)
cpu = time.process_time() - t0
from dpmf.accounting.cost import accounting_cost
est = accounting_cost(bsr(n, bands), scheme, calibrate=True, target_epsilon=target, delta=delta).seconds
print("@@" + json.dumps({{"sigma": cal.noise_multiplier, "epsilon": cal.report.epsilon, "method": cal.report.method,
                         "evaluations": count[0], "cpu": cpu, "estimate": est}}))
"""


def run_cell(cell: tuple, src: str) -> dict:
    env = dict(os.environ, PYTHONPATH=src)
    proc = subprocess.run([sys.executable, "-c", _CHILD.format(cell=cell)], env=env, capture_output=True, text=True,
                          cwd="/tmp")
    line = next((x for x in proc.stdout.splitlines() if x.startswith("@@")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"{cell} failed under {src}:\n{proc.stderr[-2000:]}")
    out = json.loads(line[2:])
    if not out["epsilon"] <= cell[3]:
        raise RuntimeError(f"{cell} under {src}: epsilon {out['epsilon']} above the target")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="src directory of the code before (a git worktree); without it, today's "
                        "code alone (its noises, evaluations, CPU-s and cost estimates)")
    parser.add_argument("--rounds", type=int, default=1, help="runs per side and cell (CPU-s: the median)")
    parser.add_argument("--quick", action="store_true", help="eight cells of about 3-7 CPU-s each")
    parser.add_argument("--fresh", action="store_true", help="the fresh-slot grid instead (8 cells, 20-190 CPU-s each)")
    args = parser.parse_args(argv)
    if args.before is not None and not Path(args.before, "dpmf").is_dir():
        parser.error(f"no dpmf under {args.before}")
    sides = {"after": str(ROOT / "src")} if args.before is None else {"before": args.before, "after": str(ROOT / "src")}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_accounting_speed import compiled_sources

    compiled_sources(*sides.values())
    totals = {side: 0.0 for side in sides}
    ratios = []  # today's cost estimate over its measured CPU time, per cell
    for cell in FRESH_GRID if args.fresh else QUICK if args.quick else GRID:
        runs: dict[str, list] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, src in sides.items():
                runs[side].append(run_cell(cell, src))
        cpu = {side: sorted(r["cpu"] for r in runs[side])[len(runs[side]) // 2] for side in sides}
        for side in sides:
            totals[side] += cpu[side]
        a = runs["after"][0]
        ratios.append(a["estimate"] / cpu["after"])
        est = f"estimate {a['estimate']:.1f} s = {ratios[-1]:.2f}x measured"
        name = f"bsr({cell[0]}, {cell[1]}) x {cell[2]} {'fresh ' if len(cell) > 4 else ''}epochs to {cell[3]:g}" + (
            f" at delta {cell[4]:g}" if len(cell) > 4 else "")
        if "before" not in sides:
            print(f"{name}: sigma {a['sigma']:.8g}, evaluations {a['evaluations']}, CPU-s {cpu['after']:.2f}, {est}",
                  flush=True)
            continue
        b = runs["before"][0]
        shift = a["sigma"] / b["sigma"] - 1
        print(f"{name}: sigma {b['sigma']:.8g} -> {a['sigma']:.8g} "
              f"({shift:+.1e}), evaluations {b['evaluations']} -> {a['evaluations']}, "
              f"CPU-s {cpu['before']:.2f} -> {cpu['after']:.2f} ({cpu['after'] / cpu['before']:.2f}x), {est}", flush=True)
    if "before" in sides:
        print(f"total CPU-s: before {totals['before']:.1f}, after {totals['after']:.1f} "
              f"({totals['after'] / totals['before']:.3f}x)")
    else:
        print(f"total CPU-s: {totals['after']:.1f}")
    print(f"cost estimate / measured CPU time: {min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} cells "
          "(issue 50 item 6: within 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
