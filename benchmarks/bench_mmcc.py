"""MMCC (matrix-mechanism amplification, Choquette-Choo et al. ICLR 2024): time and peak memory.

No public library implements MMCC (notes/peer-public-code.md §0), so the "peer" column of these
cases is a reference dpmf computes another way:

* ``mmcc_identity_n512``: C = I, q = 1/512, sigma = 1: MMCC must *equal* dpmf's DP-SGD PLD
  accountant (peer), per direction, exactly.
* ``mmcc_tree_n512`` / ``mmcc_sqrt_toeplitz_n512``: binary tree (n = 512, 1023 rows) and the
  square-root Toeplitz factorization (n = 512), p = 1/n, sigma = c * (largest column norm) with
  c = 20 (the paper's Fig. 2 / Fig. 8 settings), delta = 1e-6. Peer: the unamplified
  single-participation Gaussian epsilon (closed form); the check is that MMCC's epsilon is
  finite and below it (amplification helps at this c) and that max p~/p is below 1.5.
  The dpmf side runs with ``workers=None`` (auto: processes from 256 distinct rows) and
  ``heuristic=False`` (the bound only), and returns its wall time and peak Python-heap memory of the main process (tracemalloc; numpy arrays included;
  the worker processes hold one row at a time).
* ``mmcc_*_n1024`` / ``mmcc_*_n2048``: the same at n = 1024 and 2048, only when
  ``DPMF_BENCH_MMCC_2048=1`` is set (about 3 minutes together).

Besides wall time the dpmf side reports CPU seconds (main process plus worker processes: the
number to compare on a loaded machine) and the peak resident memory of the main process
(``ru_maxrss``; only meaningful when each case runs in a fresh process, as
``python benchmarks/bench_mmcc.py --scaling`` does).

Cyclic Poisson (generalized MMCC, Alg. 3 / Thm D.1): ``python benchmarks/bench_mmcc.py --cyclic``
times the structured tail bounds (:func:`dpmf.accounting.mmcc.structured.toeplitz_cyclic_structure`)
against the dense reference path (``structured=False``: the encoder and its reduced Gram matrix)
on the same input, each in a fresh process, checks that both give the same epsilon (bit for bit)
and prints the ratio of the wall times and the traced peak memory of both.

Targets (issue 4): n = 512 in <= 60 s, n = 2048 in <= 10 min on a 2-core machine; (issue 13
item 4) binary tree n = 2048 in <= 30 s and sqrt-Toeplitz n = 2048 in <= 120 s.
"""

from __future__ import annotations

import math
import os
import resource
import time
import tracemalloc

import dpmf
from case import Case
from dpmf.accounting.dpsgd import dpsgd_epsilon_by_direction
from dpmf.accounting.mmcc import account_mmcc
from dpmf.privacy import gaussian_epsilon
from dpmf.sampling import PoissonSampling
from dpmf.strategies import BinaryTree, Identity, ToeplitzStrategy

DELTA = 1e-6
C_FACTOR = 20.0
WORKERS = None  # auto: serial below 256 distinct rows, else one process per CPU


def _identity_peer() -> dict:
    return dpsgd_epsilon_by_direction(1.0, 1 / 512, 512, DELTA)


def _identity_dpmf() -> dict:
    return account_mmcc(Identity(512), PoissonSampling(1 / 512, 512), 1.0, DELTA).epsilon_by_direction


def _compare_identity(peer: dict, ours: dict) -> tuple[bool, str]:
    return peer == ours, f"dpmf MMCC {ours} vs DP-SGD PLD {peer}"


def _strategy(kind: str, n: int):
    if kind == "tree":
        s = BinaryTree(n)
        return s, float(s.column_norms().max())
    s = ToeplitzStrategy.sqrt_prefix_sum(n)
    return s, float(s.column_norms()[0])


def _unamplified(kind: str, n: int):
    def run() -> float:
        _, norm = _strategy(kind, n)
        return gaussian_epsilon(C_FACTOR * norm, DELTA, norm)

    return run


def _mmcc(kind: str, n: int):
    def run() -> dict:
        strategy, norm = _strategy(kind, n)
        tracemalloc.start()
        start = time.perf_counter()
        cpu0 = _cpu()
        rep = account_mmcc(
            strategy, PoissonSampling(1 / n, n), C_FACTOR * norm, DELTA, heuristic=False, workers=WORKERS
        )
        seconds = time.perf_counter() - start
        cpu = _cpu() - cpu0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        d = rep.diagnostics
        return {
            "epsilon": rep.epsilon,
            "seconds": seconds,
            "cpu_seconds": cpu,
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "peak_mb": peak / 2**20,
            "max_ratio": d["max_probability_ratio"],
            "computed": d["distinct_units_computed"],
            "reused": d["units_reused"],
            "setup_seconds": d["setup_seconds"],
        }

    return run


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the row worker processes)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _compare_mmcc(unamplified: float, res: dict) -> tuple[bool, str]:
    ok = math.isfinite(res["epsilon"]) and res["epsilon"] < unamplified and res["max_ratio"] < 1.5
    return ok, (
        f"eps MMCC={res['epsilon']:.5f} unamplified={unamplified:.5f} ratio={unamplified / res['epsilon']:.3f}; "
        f"max p~/p={res['max_ratio']:.3f}; rows computed {res['computed']}, reused {res['reused']}; "
        f"{res['seconds']:.1f} s (setup {res['setup_seconds']:.1f} s, CPU {res['cpu_seconds']:.1f} s), "
        f"peak {res['peak_mb']:.0f} MiB traced, {res['maxrss_mb']:.0f} MiB resident"
    )


CASES = [
    Case("mmcc_identity_n512", _identity_peer, _identity_dpmf, _compare_identity, "equal per direction",
         peer_name="dpmf DP-SGD PLD"),
]
for _kind in ("tree", "sqrt_toeplitz"):
    CASES.append(
        Case(f"mmcc_{_kind}_n512", _unamplified(_kind, 512), _mmcc(_kind, 512), _compare_mmcc,
             "MMCC eps < unamplified eps, max p~/p < 1.5", peer_name="unamplified (closed form)",
             slow=_kind != "tree")
    )
if os.environ.get("DPMF_BENCH_MMCC_2048") == "1":
    for _n in (1024, 2048):
        for _kind in ("tree", "sqrt_toeplitz"):
            CASES.append(
                Case(f"mmcc_{_kind}_n{_n}", _unamplified(_kind, _n), _mmcc(_kind, _n), _compare_mmcc,
                     "MMCC eps < unamplified eps, max p~/p < 1.5", peer_name="unamplified (closed form)", slow=True)
            )


def _scaling(sizes=(512, 1024, 2048)) -> None:
    """Time, CPU and memory of both kinds at each size, each in a fresh process, and the growth
    exponents between consecutive sizes (``python benchmarks/bench_mmcc.py --scaling``)."""
    import json
    import subprocess
    import sys

    rows = {}
    for kind in ("tree", "sqrt_toeplitz"):
        for n in sizes:
            code = (
                "import json, sys; sys.path.insert(0, 'benchmarks'); import bench_mmcc as b; "
                f"r = b._mmcc({kind!r}, {n})(); print(json.dumps(r))"
            )
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            rows[kind, n] = r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{kind:14s} n={n:5d}  wall {r['seconds']:7.1f} s  CPU {r['cpu_seconds']:7.1f} s  "
                  f"traced peak {r['peak_mb']:6.0f} MiB  resident {r['maxrss_mb']:6.0f} MiB  eps {r['epsilon']:.8f}",
                  flush=True)
    for kind in ("tree", "sqrt_toeplitz"):
        for a, b in zip(sizes, sizes[1:]):
            ra, rb = rows[kind, a], rows[kind, b]
            grow = lambda key: math.log(rb[key] / ra[key]) / math.log(b / a)  # noqa: E731
            print(f"{kind:14s} n {a}->{b}: exponent wall {grow('seconds'):.2f}, CPU {grow('cpu_seconds'):.2f}, "
                  f"traced memory {grow('peak_mb'):.2f}")


def _cyclic_case(kind: str, n: int, b: int, structured: bool):
    """Generalized MMCC under cyclic Poisson (cycle ``b``, ``q = b / n``: one expected
    participation per example), sigma = 20 x the largest column norm."""

    def run() -> dict:
        from dpmf.accounting.mmcc import MMCCAccountant
        from dpmf.sampling import CyclicPoissonSampling
        from dpmf.strategies.banded import bsr

        if kind == "sqrt_toeplitz":
            strategy = ToeplitzStrategy.sqrt_prefix_sum(n)
        elif kind == "tree":  # all b phases are analysed
            strategy = BinaryTree(n)
        else:  # a banded Toeplitz C with band 64 > cycle
            strategy = bsr(n, 64)
        norm = float(strategy.column_norms().max())
        _warm_up()
        tracemalloc.start()
        start = time.perf_counter()
        cpu0 = _cpu()
        acc = MMCCAccountant(strategy, CyclicPoissonSampling(b / n, n, b), DELTA, structured=structured, workers=WORKERS)
        setup = time.perf_counter() - start
        _, setup_peak = tracemalloc.get_traced_memory()
        rep = acc.report(C_FACTOR * norm, heuristic=False)
        seconds = time.perf_counter() - start
        cpu = _cpu() - cpu0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return {
            "epsilon": rep.epsilon,
            "structured": acc.structured,
            "seconds": seconds,
            "setup_seconds": setup,
            "cpu_seconds": cpu,
            "setup_peak_mb": setup_peak / 2**20,
            "peak_mb": peak / 2**20,
            "units": rep.diagnostics["units"],
            "computed": rep.diagnostics["distinct_units_computed"],
        }

    return run


def _warm_up() -> None:
    """Import scipy.stats and the MMCC modules before timing (~1 s in a fresh process, paid by
    both paths alike: not part of the setup being compared)."""
    from dpmf.accounting.mmcc.tail_bounds import binomial_thresholds

    binomial_thresholds(4, 0.5, 0.1)


def _cyclic(cases=(("sqrt_toeplitz", 512, 8), ("sqrt_toeplitz", 1024, 8), ("sqrt_toeplitz", 2048, 8),
                   ("sqrt_toeplitz", 1024, 2),
                   ("banded64", 1024, 16), ("banded64", 2048, 16), ("tree", 512, 8), ("tree", 1024, 8),
                   ("tree", 2048, 8))) -> None:
    """Structured vs dense generalized MMCC under cyclic Poisson, each in a fresh process
    (``python benchmarks/bench_mmcc.py --cyclic``); the epsilons must be equal."""
    import json
    import subprocess
    import sys

    for kind, n, b in cases:
        res = {}
        for structured in (True, False):
            code = (
                "import json, sys, warnings; warnings.simplefilter('ignore'); sys.path.insert(0, 'benchmarks'); "
                f"import bench_mmcc as b; r = b._cyclic_case({kind!r}, {n}, {b}, {structured})(); print(json.dumps(r))"
            )
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            res[structured] = json.loads(out.stdout.strip().splitlines()[-1])
        s, d = res[True], res[False]
        assert s["structured"] and not d["structured"]
        same = s["epsilon"] == d["epsilon"]
        print(f"{kind:14s} n={n:5d} b={b:3d} units {s['units']:5d} (distinct {s['computed']:5d}): "
              f"structured {s['seconds']:7.2f} s (setup {s['setup_seconds']:6.2f} s, {s['setup_peak_mb']:5.1f} MiB; "
              f"peak {s['peak_mb']:4.0f} MiB) | "
              f"dense {d['seconds']:7.2f} s (setup {d['setup_seconds']:6.2f} s, {d['setup_peak_mb']:5.1f} MiB; "
              f"peak {d['peak_mb']:4.0f} MiB) | "
              f"ratio dense/structured: wall {d['seconds'] / s['seconds']:.2f}x, setup "
              f"{d['setup_seconds'] / s['setup_seconds']:.1f}x, setup memory {d['setup_peak_mb'] / s['setup_peak_mb']:.1f}x | "
              f"eps {s['epsilon']:.8f} {'==' if same else '!='} {d['epsilon']:.8f}", flush=True)
        if not same:
            raise SystemExit("structured and dense epsilons differ")


if __name__ == "__main__":
    import sys

    if "--scaling" in sys.argv:
        _scaling()
    if "--cyclic" in sys.argv:
        _cyclic()

__all__ = ["CASES", "dpmf"]
