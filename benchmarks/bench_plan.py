"""``dpmf plan`` on the README example: wall time, CPU time and peak memory, cold and warm cache.

The README's plan -- 60,000 examples, batch 600, 10 epochs (1,000 steps), epsilon 1, delta 1e-6,
every default on (MMCC rows, band and min-sep sweeps, pruning) -- run as the command a user types,
``dpmf plan ... --json``, in a fresh process each time:

* **cold**: an empty ``--cache-dir`` (everything computed);
* **warm**: the same command again with that cache (every row read back; must be identical).

There is no peer library for this (a whole-workflow benchmark), so it is not a ``Case`` for
``benchmarks/run.py``; run it directly::

    python benchmarks/bench_plan.py [--repeat 3] [--case readme|default] [--no-prune] [--extra ARGS...]

``--case default`` runs the bare ``dpmf plan`` (500 steps) instead; ``--extra --thorough`` (or
``--extra --budget 60``) changes the time budget (default 25 s: the costly candidates it stops are
listed in the JSON's ``cut``, and cut rows carry ``cut: true``).

It prints one markdown row per run: wall seconds, CPU seconds (user + system, the part a loaded
machine cannot inflate), peak resident memory of the process, the load average when it started,
and the best row. The check: the warm run's rows equal the cold run's (apart from timings and the
``cached`` flag), and every calibrated row's epsilon is at most the target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES: list = []  # not a peer comparison (see the docstring)

README_ARGS = ["--dataset-size", "60000", "--batch-size", "600", "--epochs", "10", "--epsilon", "1", "--delta", "1e-6"]


def _timed_child(cmd: list[str]) -> tuple[str, str, int, float, float, int]:
    """Run ``cmd``; (stdout, stderr, returncode, wall, cpu, peak rss bytes) of that child alone."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as fout, tempfile.TemporaryFile("w+") as ferr:
        proc = subprocess.Popen(cmd, stdout=fout, stderr=ferr, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        fout.seek(0), ferr.seek(0)
        return fout.read(), ferr.read(), os.waitstatus_to_exitcode(status), wall, \
            usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def measure(cache_dir: str, extra: list[str], case: str = "readme") -> dict:
    args = README_ARGS if case == "readme" else []
    cmd = [sys.executable, "-m", "dpmf.cli.main", "plan", *args, "--json", "--quiet",
           "--cache-dir", cache_dir, *extra]
    load = os.getloadavg()[0]
    out, errs, code, wall, cpu, rss = _timed_child(cmd)
    if code != 0:
        raise SystemExit(f"dpmf plan failed ({code}):\n{errs}")
    return {"json": json.loads(out), "wall": wall, "cpu": cpu, "rss": rss, "load": load}


def _strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("seconds", "cached")} for r in rows]


def check(cold: dict, warm: dict, target: float) -> None:
    a, b = cold["json"], warm["json"]
    assert _strip(a["rows"]) == _strip(b["rows"]) and _strip(a["pruned"]) == _strip(b["pruned"]), "warm != cold"
    fresh = [(r["strategy"], r["sampling"]) for r in b["rows"] + b["pruned"] if not r["cached"]]
    assert not fresh, f"the warm run recomputed {fresh} (did dpmf's source change in between?)"
    assert all(r["epsilon"] <= target for r in a["rows"]), "a calibrated row misses the target"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--no-prune", action="store_true")
    p.add_argument("--case", choices=("readme", "default"), default="readme")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[])
    args = p.parse_args(argv)
    extra = (["--no-prune"] if args.no_prune else []) + list(args.extra)
    print("| run | wall s | CPU s | peak RSS | load avg | rows / pruned / cut | best row |")
    print("|---|---:|---:|---:|---:|---:|---|")
    walls = {"cold": [], "warm": []}
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as cache:
            cold = measure(cache, extra, args.case)
            warm = measure(cache, extra, args.case)
            check(cold, warm, 1.0 if args.case == "readme" else 2.0)
            for name, m in (("cold", cold), ("warm", warm)):
                best = m["json"]["rows"][0]
                walls[name].append(m["wall"])
                print(f"| {name} | {m['wall']:.1f} | {m['cpu']:.1f} | {m['rss'] / 2**20:.0f} MiB | {m['load']:.1f} | "
                      f"{len(m['json']['rows'])} / {len(m['json']['pruned'])} / "
                      f"{len(m['json'].get('cut', [])) + sum(r.get('cut', False) for r in m['json']['rows'])} | "
                      f"{best['strategy']} / "
                      f"{best['sampling']} ({best['method']}), RMSE {best['prefix_sum_rmse']:.4g} |", flush=True)
    if args.repeat > 1:
        print(f"median wall: cold {statistics.median(walls['cold']):.1f} s, warm {statistics.median(walls['warm']):.2f} s")


if __name__ == "__main__":
    main()
