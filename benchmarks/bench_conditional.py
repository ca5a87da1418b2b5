"""Conditional composition for random allocation at N = 150 / 400 / 1000 steps: the fast path
against the implementation it replaced (same inputs, same answer, ratio printed).

Two uses:

* ``python benchmarks/run.py --only conditional``: the ``CASES`` below (BSR with 4 bands, 10
  epochs, N = 150; both implementations; the peer is the old implementation).
* ``python benchmarks/bench_conditional.py [--old-limit SECONDS] [--only NAME]``: the table of
  ``benchmarks/README.md`` ("Conditional composition at N = 1000"): BSR with 4 bands (BandMF-like
  banded Toeplitz) and the dense square-root Toeplitz (BSR with ``bands = N``) at
  ``(epochs, N)`` in ``{1, 4, 10} x {150, 400, 1000}`` (where ``epochs`` divides ``N``). The old implementation runs only where
  its own cost model (``old conditional_cost``) is at most ``--old-limit`` seconds (default 600);
  the new one where :func:`conditional_cost` is at most ``--new-limit`` (default 600).

The old implementation is the file ``src/dpmf/accounting/allocation/conditional.py`` at commit
``REFERENCE_COMMIT`` (the last one before the speed-up), read with ``git show`` and imported
under another name; it uses the same (unchanged) mixture PLDs and composition. Agreement: per
direction ``|eps_new - eps_old| <= 1e-9 eps_old`` (float rounding; the old run gets the
discretization the new one chose automatically, so both compose on the same grid).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from case import Case  # noqa: E402

from dpmf.accounting.allocation.conditional import conditional_cost, conditional_epsilon  # noqa: E402
from dpmf.accounting.allocation.dominating_pair import mixture_means  # noqa: E402
from dpmf.strategies import bsr  # noqa: E402

REFERENCE_COMMIT = "5ce44af"
DELTA = 1e-5
_OLD = None


def old_module():
    """The pre-speed-up ``conditional`` module (see the module docstring)."""
    global _OLD
    if _OLD is None:
        src = subprocess.run(
            ["git", "show", f"{REFERENCE_COMMIT}:src/dpmf/accounting/allocation/conditional.py"],
            cwd=HERE.parent, check=True, capture_output=True, text=True,
        ).stdout
        path = Path(tempfile.mkdtemp()) / "_conditional_reference.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location("_conditional_reference", path)
        _OLD = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_OLD)
    return _OLD


def strategy(name: str, n: int):
    return {"bsr4": lambda: bsr(n, 4), "sqrt-toeplitz": lambda: bsr(n, n)}[name]()


def sigma_for(epochs: int) -> float:
    return {1: 4.0, 4: 5.0, 10: 6.0}[epochs]


def compare(old, new):
    eo, en = old["epsilon_by_direction"], new["epsilon_by_direction"]
    ok = all(abs(en[d] - eo[d]) <= 1e-9 * abs(eo[d]) for d in eo)
    rel = max((en[d] - eo[d]) / eo[d] for d in eo)
    return ok, f"eps new {new['epsilon']:.6f} old {old['epsilon']:.6f} (max rel diff {rel:+.1e})"


def _case(name, epochs, n):
    M = mixture_means(strategy(name, n), epochs, n)
    sigma = sigma_for(epochs)
    disc = 1e-3
    return Case(
        name=f"conditional_{name}_k{epochs}_N{n}",
        peer=lambda: old_module().conditional_epsilon(M, sigma, DELTA, discretization=disc),
        dpmf=lambda: conditional_epsilon(M, sigma, DELTA, discretization=disc),
        compare=compare,
        tolerance="same epsilon per direction within 1e-9 relative (float rounding)",
        peer_name="dpmf@" + REFERENCE_COMMIT,
    )


CASES = [_case("bsr4", 10, 150)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-limit", type=float, default=600.0)
    ap.add_argument("--new-limit", type=float, default=600.0)
    ap.add_argument("--only", default="")
    args = ap.parse_args(argv)
    old = old_module()
    failed = False
    print("| strategy | k | N | b | sigma | old s | new s | ratio | new est s | eps remove / add (new) | max rel diff |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for name in ("bsr4", "sqrt-toeplitz"):
        for epochs in (1, 4, 10):
            for n in (150, 400, 1000):
                if n % epochs or (args.only and args.only not in f"{name}_k{epochs}_N{n}"):
                    continue
                M = mixture_means(strategy(name, n), epochs, n)
                b = M.shape[0]
                sigma = sigma_for(epochs)
                est_new = conditional_cost(M)
                est_old = old.conditional_cost(b, n)
                if est_new > args.new_limit:
                    print(f"| {name} | {epochs} | {n} | {b} | {sigma} | skipped | skipped (est {est_new:.0f} s) | | {est_new:.1f} | | |", flush=True)
                    continue
                t = time.perf_counter()
                new = conditional_epsilon(M, sigma, DELTA)  # automatic grid; the old run reuses it
                t_new = time.perf_counter() - t
                disc = new["discretization"]
                eps = new["epsilon_by_direction"]
                if est_old <= args.old_limit:
                    t = time.perf_counter()
                    ref = old.conditional_epsilon(M, sigma, DELTA, discretization=disc)
                    t_old = time.perf_counter() - t
                    ok, _ = compare(ref, new)
                    failed |= not ok
                    rel = max((eps[d] - ref["epsilon_by_direction"][d]) / ref["epsilon_by_direction"][d] for d in eps)
                    old_s, ratio, rel_s = f"{t_old:.1f}", f"{t_old / t_new:.1f}x", f"{rel:+.1e}" + ("" if ok else " FAIL")
                else:
                    old_s, ratio, rel_s = f"skipped (est {est_old:.0f} s)", "", ""
                print(
                    f"| {name} | {epochs} | {n} | {b} | {sigma} | {old_s} | {t_new:.1f} | {ratio} | {est_new:.1f} | "
                    f"{eps['remove']:.4f} / {eps['add']:.4f} | {rel_s} |",
                    flush=True,
                )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
