"""Reference values for the allocation speed-up (issue 50, item 3): epsilons and calibrated noises of
the correlated random-allocation cases, computed on the code before the speed-up (commit 2cb94a5).

    git worktree add /tmp/before 2cb94a5
    PYTHONPATH=/tmp/before/src python benchmarks/allocation_speed_reference.py > tests/accounting/data/allocation_speed_reference.json

tests/accounting/test_allocation_speed_reference.py compares today's code against the stored file.
"""

from __future__ import annotations

import json
import sys

import dpmf
from dpmf.accounting.allocation.pld import account_allocation_pld
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import bsr

#: (name, bsr n, bands, epochs, steps, fresh slots, sigmas)
ACCOUNT_CASES = [
    ("bsr32x4 reused 2 epochs", 32, 4, 2, 32, False, [0.9326489806331935, 1.2679117273087428, 1.3079477120605187,
                                                      1.865297961266387, 3.0]),
    ("bsr32x4 fresh 2 epochs", 32, 4, 2, 32, True, [1.3, 2.0]),
    ("bsr100x4 reused 2 epochs", 100, 4, 2, 100, False, [1.6]),
]
#: (name, bsr n, bands, epochs, steps, target epsilon, delta): the README's snippet (make_private's calibration)
CALIBRATIONS = [("README snippet bsr32x4 eps 4", 32, 4, 2, 32, 4.0, 1e-5),
                ("README CLI bsr100x4 eps 2", 100, 4, 2, 100, 2.0, 1e-5)]  # (dpmf calibrate --strategy bsr --bands 4 ...)


def main() -> None:
    out = {"commit": "2cb94a5", "delta": 1e-5, "account": [], "calibrate": []}
    for name, n, bands, epochs, steps, fresh, sigmas in ACCOUNT_CASES:
        scheme = BallsInBinsSampling(epochs=epochs, steps=steps, fresh_slots=fresh)
        for s in sigmas:
            r = account_allocation_pld(bsr(n, bands), scheme, s, 1e-5)
            out["account"].append({"case": name, "n": n, "bands": bands, "epochs": epochs, "steps": steps,
                                   "fresh_slots": fresh, "sigma": s, "epsilon": r.epsilon,
                                   "epsilon_by_direction": dict(r.epsilon_by_direction)})
            print(name, s, r.epsilon, file=sys.stderr, flush=True)
    for name, n, bands, epochs, steps, target, delta in CALIBRATIONS:
        cal = dpmf.calibrate(bsr(n, bands), BallsInBinsSampling(epochs=epochs, steps=steps), target, delta)
        out["calibrate"].append({"case": name, "n": n, "bands": bands, "epochs": epochs, "steps": steps,
                                 "target_epsilon": target, "delta": delta, "noise_multiplier": cal.noise_multiplier,
                                 "epsilon": cal.report.epsilon, "method": cal.report.method})
        print(name, cal.noise_multiplier, cal.report.epsilon, file=sys.stderr, flush=True)
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
