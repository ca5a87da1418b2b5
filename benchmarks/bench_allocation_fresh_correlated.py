"""Correlated C with a fresh slot each epoch: ``allocation_pld``'s amplified bound
(``allocation/fresh_correlated.py``) against a Monte Carlo estimate of the exact pair and against the
unamplified Gaussian mechanism (what dpmf reported before; no peer accounts for this case).

The exact pair is the mixture over all ``b^k`` patterns, so the cases are small. Printed per case:
the Monte Carlo point and z = 4 lower end (importance sampled, ``exact_pair_mc.py``), the bound
and its ratio to the point, the unamplified epsilon, and the accountant's time.

    python benchmarks/bench_allocation_fresh_correlated.py [--samples 400000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from exact_pair_mc import mc_epsilon

import dpmf
from dpmf.accounting.montecarlo._loss_bruteforce import allocation_patterns
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import ToeplitzStrategy, bsr

#: (a script printing its own table; benchmarks/run.py finds no peer-vs-dpmf case here)
CASES: list = []

SCRIPT_CASES = [
    ("bsr(16, 4), 2 epochs of 8", bsr(16, 4), 2),
    ("bsr(32, 4), 2 epochs of 16", bsr(32, 4), 2),
    ("Toeplitz [1, .8, .6], 3 epochs of 4", ToeplitzStrategy([1.0, 0.8, 0.6], 12), 3),
    ("bsr(24, 3), 3 epochs of 8", bsr(24, 3), 3),
    ("bsr(128, 4), 2 epochs of 64", bsr(128, 4), 2),
]


def pattern_means(strategy, scheme) -> np.ndarray:
    """One row per pattern of ``scheme`` (all equally likely, enumerated): ``C x``."""
    pats = allocation_patterns(scheme.epochs, scheme.steps_per_epoch, scheme.num_selected, scheme.fresh_slots)
    dense = np.asarray(strategy.encoder(), dtype=np.float64)
    return np.array([dense @ np.asarray(x, dtype=np.float64) for _, x in pats])


def compare(cases, samples: int, delta: float, seed: int, show_bound: bool) -> None:
    """Print the table (module docstring) for ``(name, strategy, scheme)`` cases at sigma 2, 3, 4;
    assert the bound is never below the Monte Carlo lower end."""
    bound_head = (" bound |", "---|") if show_bound else ("", "")
    print(f"| case | sigma | MC eps [lower, upper] | allocation_pld | / MC | unamplified | / MC |{bound_head[0]} s |")
    print(f"|---|---:|---|---:|---:|---:|---:|{bound_head[1]}---:|")
    for name, strategy, scheme in cases:
        pm = pattern_means(strategy, scheme)
        for sigma in (2.0, 3.0, 4.0):
            lo, point, hi = mc_epsilon(pm, sigma, delta, samples, seed=seed)
            t0 = time.perf_counter()
            rep = dpmf.account(strategy, scheme, sigma, delta, method="allocation_pld")
            sec = time.perf_counter() - t0
            un = dpmf.account(strategy, scheme, sigma, delta, method="unamplified").epsilon
            assert rep.epsilon >= lo, (name, sigma, rep.epsilon, lo)  # never below the Monte Carlo lower end
            bound = f" {rep.diagnostics['bound']} |" if show_bound else ""
            print(f"| {name} | {sigma:g} | {point:.4f} [{lo:.4f}, {hi:.4f}] | {rep.epsilon:.4f} | "
                  f"**{rep.epsilon / point:.3f}** | {un:.4f} | {un / point:.3f} |{bound} {sec:.2f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=400_000)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--cases", help="only the cases whose name contains this text (e.g. 'bsr(16')")
    args = ap.parse_args()
    cases = [(name, strategy, BallsInBinsSampling(k, strategy.n, fresh_slots=True)) for name, strategy, k in SCRIPT_CASES
             if not args.cases or args.cases in name]
    compare(cases, args.samples, args.delta, seed=3, show_bound=True)


if __name__ == "__main__":
    main()
