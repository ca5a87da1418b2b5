"""MMCC cost model vs measured CPU time on a (T, sigma) grid (issue 40 item 5).

For each binary tree / 4-banded Toeplitz strategy of T steps under Poisson sampling (q = 1/16)
(kinds ``tree``, ``bsr4``; and ``bsr4-bib2``: bsr(T, 4) under 2 reused balls-in-bins epochs, method
auto, i.e. the allocation accountants) and each noise multiplier, runs ``dpmf.account(..., method="mmcc")`` once in a fresh subprocess
and compares ``time.process_time()`` (CPU: the machine is shared) with the estimate of
:func:`dpmf.accounting.cost.accounting_cost`. Prints estimate, measured and their ratio; a
case over ``--limit`` CPU seconds is reported as ``> limit``.

    PYTHONPATH=src python benchmarks/bench_mmcc_cost.py [--steps 16 64 256] [--sigmas 0.5 1 2 4] [--limit 300]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, time
import dpmf
from dpmf.accounting.cost import accounting_cost
from dpmf.sampling import BallsInBinsSampling, PoissonSampling
from dpmf.strategies import BinaryTree, bsr
kind, T, sigma = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
strategy = BinaryTree(T) if kind == "tree" else bsr(T, 4)
scheme = BallsInBinsSampling(2, T) if kind == "bsr4-bib2" else PoissonSampling(1 / 16, T)
method = "auto" if kind == "bsr4-bib2" else "mmcc"
est = accounting_cost(strategy, scheme, sigma, method=method).seconds
t = time.process_time()
r = dpmf.account(strategy, scheme, sigma, 1e-5, method=method, force=True)
print(json.dumps({"estimate": est, "measured": time.process_time() - t, "epsilon": r.epsilon}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", nargs="+", default=["tree", "bsr4"])
    ap.add_argument("--steps", nargs="+", type=int, default=[16, 64, 256])
    ap.add_argument("--sigmas", nargs="+", type=float, default=[0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--limit", type=float, default=300.0)
    a = ap.parse_args()
    print(f"{'kind':5s} {'T':>4s} {'sigma':>5s} {'estimate s':>10s} {'measured s':>10s} {'ratio':>6s}", flush=True)
    for kind in a.kinds:
        for T in a.steps:
            for s in a.sigmas:
                cmd = [sys.executable, "-c", CHILD, kind, str(T), str(s)]
                try:
                    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3 * a.limit)
                    row = json.loads(out.stdout.strip().splitlines()[-1])
                    m = f"{row['measured']:10.2f}"
                    ratio = f"{row['estimate'] / row['measured']:6.2f}"
                    est = row["estimate"]
                except subprocess.TimeoutExpired:
                    from dpmf.accounting.cost import accounting_cost  # noqa: F401 (estimate only)
                    m, ratio, est = f"> {a.limit:g}".rjust(10), "   n/a", float("nan")
                except (IndexError, ValueError):
                    m, ratio, est = "error".rjust(10), "   n/a", float("nan")
                print(f"{kind:5s} {T:4d} {s:5g} {est:10.2f} {m} {ratio}", flush=True)


if __name__ == "__main__":
    main()
