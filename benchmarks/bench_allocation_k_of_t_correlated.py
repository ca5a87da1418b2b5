"""Correlated C under k-of-t random allocation (``num_selected = k > 1``): ``allocation_pld``'s
amplified bound (``allocation/k_of_t_correlated.py``) against a Monte Carlo estimate of the exact pair
and against the unamplified Gaussian mechanism (what dpmf reported before; no peer accounts for it).

The exact pair is the uniform mixture over every pattern (enumerated), so the cases are small.
Printed per case: the Monte Carlo point and z = 4 interval, the bound and its ratio to the point, the
unamplified epsilon and its ratio, and the accountant's time. The script asserts the bound is never
below the Monte Carlo lower end.

    python benchmarks/bench_allocation_k_of_t_correlated.py [--samples 400000]
"""

from __future__ import annotations

import argparse

from bench_allocation_fresh_correlated import compare

from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import ToeplitzStrategy, bsr

#: (a script printing its own table; benchmarks/run.py finds no peer-vs-dpmf case here)
CASES: list = []

SCRIPT_CASES = [
    ("bsr(16, 4), 2 of 16", bsr(16, 4), BallsInBinsSampling(1, 16, num_selected=2)),
    ("bsr(32, 4), 2 of 16, 2 reused epochs", bsr(32, 4), BallsInBinsSampling(2, 32, num_selected=2)),
    ("bsr(24, 3), 2 of 12, 2 fresh epochs", bsr(24, 3), BallsInBinsSampling(2, 24, num_selected=2, fresh_slots=True)),
    ("Toeplitz [1, .8, .6], 3 of 12", ToeplitzStrategy([1.0, 0.8, 0.6], 12), BallsInBinsSampling(1, 12, num_selected=3)),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=400_000)
    ap.add_argument("--delta", type=float, default=1e-5)
    a = ap.parse_args()
    compare(SCRIPT_CASES, a.samples, a.delta, seed=1, show_bound=False)


if __name__ == "__main__":
    main()
