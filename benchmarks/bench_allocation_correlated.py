"""Correlated C under random allocation: Markov members vs spectral vs orthogonal groups vs the exact pair.

For banded / Toeplitz encoders under balls-in-bins (slot reused), at sigma 2-4 and delta 1e-5:
the Monte Carlo estimate of the exact pair's epsilon (importance sampled, ``exact_pair_mc.py``;
point and z = 4 confidence interval, 10^6 samples), the orthogonal-groups bound, the
spectral-groups family (the smallest over its members: ``allocation_pld`` before the Markov
members), the best Markov member alone (``allocation/surrogates/markov_*.py``) and ``allocation_pld`` now (each
direction the smallest over all members), each as a ratio to the Monte Carlo point estimate, with
the accountant's time; and the band's own moving average (``allocation/surrogates/moving_average.py``, bands of
order <= 3) alone.

    python benchmarks/bench_allocation_correlated.py [--samples 1000000] [--quick]
"""

from __future__ import annotations

import argparse
import math
import time

import dpmf
from exact_pair_mc import mc_epsilon
from dpmf.accounting.allocation.dominating_pair import mixture_means
from dpmf.accounting.allocation.pld import allocation_pld_epsilon
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import ToeplitzStrategy, bsr


#: (a script printing its own table; benchmarks/run.py finds no peer-vs-dpmf case here)
CASES: list = []

SCRIPT_CASES = [
    ("bsr(64, 4), k=1", lambda: bsr(64, 4), 1),
    ("bsr(64, 8), k=1", lambda: bsr(64, 8), 1),
    ("Toeplitz [1, .8, .6], N=64, k=1", lambda: ToeplitzStrategy([1.0, 0.8, 0.6], 64), 1),
    ("bsr(128, 4), k=2 (b=64)", lambda: bsr(128, 4), 2),
    ("bsr(256, 4), k=4 (b=64)", lambda: bsr(256, 4), 4),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--quick", action="store_true", help="first two cases, sigma 2 and 4, 2e5 samples")
    ap.add_argument("--cases", help="only the cases whose name contains this text (e.g. 'k=2')")
    a = ap.parse_args()
    cases, sigmas, n = SCRIPT_CASES, (2.0, 3.0, 4.0), a.samples
    if a.cases:
        cases = [c for c in SCRIPT_CASES if a.cases in c[0]]
    if a.quick:
        cases, sigmas, n = SCRIPT_CASES[:2], (2.0, 4.0), 200_000
    print("| case | sigma | MC eps [lower, upper] | orthogonal groups / MC | spectral family / MC | "
          "best Markov member / MC | moving average / MC | allocation_pld now | / MC | bound | s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for name, make, k in cases:
        strategy = make()
        scheme = BallsInBinsSampling(k, strategy.n)
        means = mixture_means(strategy, k, strategy.n)
        for sigma in sigmas:
            t0 = time.perf_counter()
            r = dpmf.account(strategy, scheme, sigma, a.delta, method="allocation_pld")
            secs = time.perf_counter() - t0
            rows = r.diagnostics["reductions"]
            row = rows[0]  # orthogonal groups (computed here if it was skipped)
            og = row["epsilon"] if row["epsilon"] is not None else allocation_pld_epsilon(
                sigma / math.sqrt(row["noise_scale_sq"]), row["slots"], a.delta)["epsilon"]
            spectral = min(x["epsilon"] for x in rows if not x["bound"].startswith(("Markov", "moving average"))
                           and x["epsilon"] is not None)
            markov = min((x["epsilon"] for x in rows if x["bound"].startswith("Markov")), default=math.inf)
            band = min((x["epsilon"] for x in rows if x["bound"].startswith("moving average")), default=math.inf)
            lo, mid, hi = mc_epsilon(means, sigma, a.delta, n, seed=1)
            assert r.epsilon >= lo, (name, sigma, r.epsilon, lo)  # never below the MC lower end
            assert r.epsilon <= spectral  # the Markov members never make it worse
            mk = f"{markov / mid:.3f}" if math.isfinite(markov) else "(not below the others)"
            ma = f"{band / mid:.3f}" if math.isfinite(band) else "-"
            print(f"| {name} | {sigma:g} | {mid:.4f} [{lo:.4f}, {hi:.4f}] | {og / mid:.3f} | {spectral / mid:.3f} | "
                  f"{mk} | {ma} | {r.epsilon:.4f} | **{r.epsilon / mid:.3f}** | {r.diagnostics['bound']} | {secs:.2f} |",
                  flush=True)

if __name__ == "__main__":
    main()
