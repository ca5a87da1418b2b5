"""Correlated C with a fresh slot each epoch: ``allocation_pld``'s amplified bound
(``allocation/fresh_correlated.py``) against a Monte Carlo estimate of the exact pair and against the
unamplified Gaussian mechanism (what dpmf reported before; no peer accounts for this case).

The exact pair is the mixture over all ``b^k`` patterns, so the cases are small. Printed per case:
the Monte Carlo point and z = 4 lower end (importance sampled: remove from P, add from Q), the bound
and its ratio to the point, the unamplified epsilon, and the accountant's time.

    python benchmarks/bench_allocation_fresh_correlated.py [--samples 400000]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
from bench_allocation_correlated import mc_epsilon

import dpmf
from dpmf.accounting.allocation.dominating_pair import mixture_means
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import ToeplitzStrategy, bsr

#: (a script printing its own table; benchmarks/run.py finds no peer-vs-dpmf case here)
CASES: list = []

SCRIPT_CASES = [
    ("bsr(16, 4), 2 epochs of 8", bsr(16, 4), 2),
    ("bsr(32, 4), 2 epochs of 16", bsr(32, 4), 2),
    ("Toeplitz [1, .8, .6], 3 epochs of 4", ToeplitzStrategy([1.0, 0.8, 0.6], 12), 3),
    ("bsr(24, 3), 3 epochs of 8", bsr(24, 3), 3),
]


def pattern_means(strategy, k: int) -> np.ndarray:
    m = mixture_means(strategy, 1, strategy.n)
    b = strategy.n // k
    return np.array([sum(m[e * b + t] for e, t in enumerate(tau)) for tau in itertools.product(range(b), repeat=k)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=400_000)
    ap.add_argument("--delta", type=float, default=1e-5)
    args = ap.parse_args()
    print("| case | sigma | MC eps [lower, upper] | allocation_pld | / MC | unamplified | / MC | bound | s |")
    print("|---|---:|---|---:|---:|---:|---:|---|---:|")
    for name, strategy, k in SCRIPT_CASES:
        scheme = BallsInBinsSampling(k, strategy.n, fresh_slots=True)
        pm = pattern_means(strategy, k)
        for sigma in (2.0, 3.0, 4.0):
            lo, point, hi = mc_epsilon(pm, sigma, args.delta, args.samples, seed=3)
            t0 = time.perf_counter()
            rep = dpmf.account(strategy, scheme, sigma, args.delta, method="allocation_pld")
            sec = time.perf_counter() - t0
            un = dpmf.account(strategy, scheme, sigma, args.delta, method="unamplified").epsilon
            assert rep.epsilon >= lo, (name, sigma, rep.epsilon, lo)  # never below the Monte Carlo lower end
            print(f"| {name} | {sigma:g} | {point:.4f} [{lo:.4f}, {hi:.4f}] | {rep.epsilon:.4f} | "
                  f"**{rep.epsilon / point:.3f}** | {un:.4f} | {un / point:.3f} | {rep.diagnostics['bound']} | {sec:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
