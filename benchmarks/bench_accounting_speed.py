"""Accounting speed before / after (issue 50): CPU seconds of the same call on the code before the
speed-up and on today's, medians of interleaved rounds, the answers checked equal, and the up-front
cost estimate (``dpmf.accounting.cost.accounting_cost``) over the measured CPU time.

    git worktree add /tmp/before 2cb94a5                      # the code before the speed-up
    python benchmarks/bench_accounting_speed.py [--before /tmp/before/src] [--rounds 3] [--only NAME] [--quick]

Each round runs every side in a fresh subprocess (so no in-process memo is reused; numba kernels load
from their cache as they do for a user) that imports ``dpmf`` from the side's ``src`` and reports the
CPU time (``time.process_time``: every thread of the process, not wall time) of the call alone, and
its answer. Rounds alternate before/after, so a busy machine slows both alike.

A case is one entry of :data:`CASES`: a name, a call (a code string that sets ``answer``: a tuple of
floats), the setup (a code string building ``strategy``, ``scheme`` and the cost-estimate keywords),
the rounds, whether ``--quick`` skips it, the samples it draws (Monte Carlo: samples per CPU-second
are printed) and, where a case says why, a looser agreement than 1e-6. Add cases to the list (MMCC
cases go here too).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the code before the speed-up (``git worktree add /tmp/before 2cb94a5``)
BEFORE_SRC = "/tmp/before/src"
#: relative agreement the answers must have (numbers equal to 1e-6, as the reference tests require)
REL = 1e-6


@dataclass(frozen=True)
class SpeedCase:
    name: str
    setup: str  # builds ``strategy``, ``scheme`` and ``cost`` (accounting_cost keywords)
    call: str  # sets ``answer`` (a tuple of floats)
    rounds: int = 3
    slow: bool = False
    samples: int = 0  # privacy-loss samples the call draws (both directions): samples per CPU-second printed
    rel: float = 0.0  # agreement the answers must have (0: REL); a case says why it needs more
    after_only: bool = False  # measure today's code only (the code before would take too long)


#: agreement of a calibration by allocation_pld with the old one: its search takes secant steps since a4842c9
#: (``smallest_noise(secant=True)``), so it lands elsewhere in the calibration's ``rel_tol = 1e-4`` window --
#: the noise within 1e-4, the epsilon (``~ sigma^-1.7``, both at or below the target) within ~2e-4
_SECANT_REL = 2e-4

_BSR32 = (
    "from dpmf.sampling import BallsInBinsSampling\nfrom dpmf.strategies import bsr\n"
    "strategy, scheme = bsr(32, 4), BallsInBinsSampling(epochs=2, steps=32)\n"
)
_BSR100 = (
    "from dpmf.sampling import BallsInBinsSampling\nfrom dpmf.strategies import bsr\n"
    "strategy, scheme = bsr(100, 4), BallsInBinsSampling(epochs=2, steps=100)\n"
)

_MC = (
    "from dpmf.sampling import MinSepSampling\nfrom dpmf.strategies import catalog\n"
    "strategy = catalog.build('banded-toeplitz', 500, bands=16)\n"
    "scheme = MinSepSampling.from_participation_rate(0.01, 500, 16)\n"
)

CASES: list[SpeedCase] = [
    SpeedCase(
        "allocation: bsr(32, 4) balls-in-bins, 2 epochs, calibrate eps 4 (README PyTorch snippet)",
        _BSR32 + "cost = dict(calibrate=True, target_epsilon=4.0, delta=1e-5)\n",
        "import dpmf\ncal = dpmf.calibrate(strategy, scheme, 4.0, 1e-5)\n"
        "answer = (cal.noise_multiplier, cal.report.epsilon)\n",
        rel=_SECANT_REL,
    ),
    SpeedCase(
        "allocation: bsr(32, 4) balls-in-bins, 2 epochs, account allocation_pld at sigma 1.2679",
        _BSR32 + "cost = dict(noise_multiplier=1.2679117273087428, method='allocation_pld')\n",
        "from dpmf.accounting.allocation.pld import account_allocation_pld\n"
        "r = account_allocation_pld(strategy, scheme, 1.2679117273087428, 1e-5)\n"
        "answer = (r.epsilon, r.epsilon_by_direction['remove'], r.epsilon_by_direction['add'])\n",
    ),
    SpeedCase(
        "allocation: bsr(100, 4) balls-in-bins, 2 epochs, calibrate eps 2 (README `dpmf calibrate` example)",
        _BSR100 + "cost = dict(calibrate=True, target_epsilon=2.0, delta=1e-5)\n",
        "import dpmf\ncal = dpmf.calibrate(strategy, scheme, 2.0, 1e-5)\n"
        "answer = (cal.noise_multiplier, cal.report.epsilon)\n",
        rounds=1,
        slow=True,
        rel=_SECANT_REL,
    ),
    SpeedCase(
        # (issue 50's "bsr(64, 4) fresh slots 5 epochs": 5 epochs of 64 slots, a fresh slot each epoch)
        "allocation: bsr(320, 4) balls-in-bins, 5 fresh epochs of 64 slots, account allocation_pld at sigma 2",
        "from dpmf.sampling import BallsInBinsSampling\nfrom dpmf.strategies import bsr\n"
        "strategy, scheme = bsr(320, 4), BallsInBinsSampling(epochs=5, steps=320, fresh_slots=True)\n"
        "cost = dict(noise_multiplier=2.0, method='allocation_pld')\n",
        "from dpmf.accounting.allocation.pld import account_allocation_pld\n"
        "r = account_allocation_pld(strategy, scheme, 2.0, 1e-5)\n"
        "answer = (r.epsilon, r.epsilon_by_direction['remove'], r.epsilon_by_direction['add'])\n",
        rounds=2,
    ),
    SpeedCase(
        # (the default dpmf plan's costly row that ranks first when calibrated: bsr-4, 5 fresh epochs of 100)
        "allocation: bsr(500, 4) balls-in-bins, 5 fresh epochs of 100 slots, calibrate eps 2 delta 1e-6 (default plan)",
        "from dpmf.sampling import BallsInBinsSampling\nfrom dpmf.strategies import bsr\n"
        "strategy, scheme = bsr(500, 4), BallsInBinsSampling(epochs=5, steps=500, fresh_slots=True)\n"
        "cost = dict(calibrate=True, target_epsilon=2.0, delta=1e-6)\n",
        "import dpmf\ncal = dpmf.calibrate(strategy, scheme, 2.0, 1e-6, method='allocation_pld')\n"
        "answer = (cal.noise_multiplier, cal.report.epsilon)\n",
        rounds=1,
        rel=_SECANT_REL,
    ),
    SpeedCase(
        "montecarlo: b-min-sep BandMF-16 x 500, p0 0.01, sigma 1, 200,000 samples per direction (samples/s)",
        _MC + "cost = dict(noise_multiplier=1.0, method='montecarlo', num_samples=200_000)\n",
        "from dpmf.accounting.montecarlo import account_montecarlo\n"
        "r = account_montecarlo(strategy, scheme, 1.0, 1e-3, num_samples=200_000, seed=1)\n"
        "answer = (r.epsilon, r.epsilon_by_direction['remove'], r.epsilon_by_direction['add'])\n",
        samples=400_000,
    ),
    SpeedCase(
        "montecarlo: b-min-sep BandMF-16 x 500, certified calibration (Algorithm 5) to eps 2 at delta 1e-3",
        _MC + "cost = dict(method='montecarlo', calibrate=True, target_epsilon=2.0, delta=1e-3)\n",
        "from dpmf.accounting.dispatch import certified_fallback\n"
        "from dpmf.accounting.montecarlo import calibrate_montecarlo\n"
        "cal = calibrate_montecarlo(strategy, scheme, 2.0, 1e-3, seed=1, fallback=certified_fallback)\n"
        "answer = (cal.noise_multiplier,)\n",
        rounds=2,
        # the ladders differ (before: 9.4% above the pilot, pilot with s samples; after: 3%, s/4), so
        # the released sigmas differ by the pilot's error and the ladder's 1% steps: agree within 3%
        rel=0.03,
    ),
]


_MMCC_BSR16 = (
    "from dpmf.sampling import PoissonSampling\nfrom dpmf.strategies import bsr\n"
    "strategy, scheme = bsr(500, 16), PoissonSampling(0.01, 500)\n"
)
_MMCC_TREE = (
    "from dpmf.sampling import PoissonSampling\nfrom dpmf.strategies import BinaryTree\n"
    "strategy, scheme = BinaryTree({n}), PoissonSampling(1 / 16, {n})\n"
)
_MMCC_SQRT = (
    "from dpmf.sampling import PoissonSampling\nfrom dpmf.strategies import ToeplitzStrategy\n"
    "strategy, scheme = ToeplitzStrategy.sqrt_prefix_sum(48), PoissonSampling(0.05, 48)\n"
)


def _mmcc_call(sigma: float, delta: float) -> str:
    return ("import dpmf\n"
            f"r = dpmf.account(strategy, scheme, {sigma!r}, {delta!r}, method='mmcc')\n"
            "answer = (r.epsilon, r.diagnostics['independent_rows_heuristic_epsilon'])\n")


CASES += [
    SpeedCase("mmcc: BandMF bsr(500, 16), Poisson q 0.01, sigma 2, account",
              _MMCC_BSR16 + "cost = dict(noise_multiplier=2.0, method='mmcc')\n", _mmcc_call(2.0, 1e-6), rounds=2),
    SpeedCase("mmcc: BandMF bsr(500, 16), Poisson q 0.01, sigma 1, account",
              _MMCC_BSR16 + "cost = dict(noise_multiplier=1.0, method='mmcc')\n", _mmcc_call(1.0, 1e-6), rounds=1,
              slow=True),
    SpeedCase("mmcc: binary tree T = 64, Poisson q 1/16, sigma 2, account",
              _MMCC_TREE.format(n=64) + "cost = dict(noise_multiplier=2.0, method='mmcc')\n", _mmcc_call(2.0, 1e-5),
              rounds=1, slow=True),
    SpeedCase("mmcc: square-root Toeplitz n = 48, Poisson q 0.05, sigma 4, account",
              _MMCC_SQRT + "cost = dict(noise_multiplier=4.0, method='mmcc')\n", _mmcc_call(4.0, 1e-6), rounds=1,
              slow=True),
    SpeedCase("mmcc: binary tree T = 256, Poisson q 1/16, sigma 4, account (today's code only)",
              _MMCC_TREE.format(n=256) + "cost = dict(noise_multiplier=4.0, method='mmcc')\n", _mmcc_call(4.0, 1e-5),
              rounds=1, slow=True, after_only=True),
    SpeedCase("mmcc: binary tree T = 256, Poisson q 1/16, sigma 0.5, account (today's code only: 2cb94a5 was killed for "
              "memory at 22 GiB)",
              _MMCC_TREE.format(n=256) + "cost = dict(noise_multiplier=0.5, method='mmcc')\n", _mmcc_call(0.5, 1e-5),
              rounds=1, slow=True, after_only=True),
]

_CHILD = """
import json, sys, time
{setup}
t0 = time.process_time()
{call}
cpu = time.process_time() - t0
from dpmf.accounting.cost import accounting_cost
est = accounting_cost(strategy, scheme, **cost).seconds
print("@@" + json.dumps({{"cpu": cpu, "answer": list(answer), "estimate": est}}))
"""


def _run(case: SpeedCase, src: str) -> dict:
    env = dict(os.environ, PYTHONPATH=src)
    code = _CHILD.format(setup=case.setup, call=case.call)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd="/tmp")
    line = next((x for x in proc.stdout.splitlines() if x.startswith("@@")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"{case.name} failed under {src}:\n{proc.stderr[-2000:]}")
    return json.loads(line[2:])


def _equal(a: list, b: list, rel: float = REL) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b))


def measure(case: SpeedCase, before: str, rounds: int | None = None) -> dict:
    """Interleaved rounds (before, after, before, ...): the median CPU seconds of each side, whether
    every answer agrees to :data:`REL`, and the estimate / measured ratio of today's code."""
    times: dict[str, list[float]] = {"before": [], "after": []}
    answers: dict[str, list] = {"before": [], "after": []}
    estimate = None
    sides = (("after", str(ROOT / "src")),) if case.after_only else (("before", before), ("after", str(ROOT / "src")))
    for _ in range(rounds or case.rounds):
        for side, src in sides:
            out = _run(case, src)
            times[side].append(out["cpu"])
            answers[side].append(out["answer"])
            if side == "after":
                estimate = out["estimate"]
    ref = answers["after" if case.after_only else "before"][0]
    equal = all(_equal(a, ref, case.rel or REL) for side in answers for a in answers[side])
    b = statistics.median(times["before"]) if times["before"] else math.nan
    a = statistics.median(times["after"])
    return {"case": case.name, "before_cpu_s": b, "after_cpu_s": a, "speedup": b / a, "equal": equal,
            "answer": answers["after"][0], "estimate_s": estimate, "estimate_over_measured": estimate / a,
            "rounds": len(times["after"]), "samples": case.samples, "rel": case.rel or REL}


def compiled_sources(*srcs: str) -> None:
    """Byte-compile each side's ``dpmf`` once, as an installed package is: with ``PYTHONDONTWRITEBYTECODE``
    set (as on this machine) a module never imported without it has no ``.pyc`` and is compiled from source
    in every child (measured: 51 modules, 0.13 CPU-s of the README snippet's call)."""
    import compileall

    for src in srcs:
        compileall.compile_dir(str(Path(src, "dpmf")), quiet=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE_SRC, help="src directory of the code before (a git worktree)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per case (default: the case's)")
    parser.add_argument("--only", default=None, help="run the cases whose name contains this")
    parser.add_argument("--quick", action="store_true", help="skip the slow cases")
    args = parser.parse_args(argv)
    if not Path(args.before, "dpmf").is_dir():
        parser.error(f"no dpmf under {args.before}: git worktree add /tmp/before 2cb94a5")
    compiled_sources(args.before, str(ROOT / "src"))
    ok = True
    for case in CASES:
        if (args.quick and case.slow) or (args.only and args.only not in case.name):
            continue
        r = measure(case, args.before, args.rounds)
        ok &= r["equal"]
        print(f"{r['case']}\n  before {r['before_cpu_s']:8.2f} CPU-s   after {r['after_cpu_s']:8.2f} CPU-s   "
              f"speed-up {r['speedup']:5.2f}x   answers {'equal' if r['equal'] else 'DIFFER'} {r['answer']}   "
              f"estimate {r['estimate_s']:.1f} s = {r['estimate_over_measured']:.2f}x measured   "
              f"(medians of {r['rounds']} interleaved rounds; answers to {r['rel']:g})", flush=True)
        if r["samples"]:
            print(f"  samples per CPU-second: before {r['samples'] / r['before_cpu_s']:,.0f}   "
                  f"after {r['samples'] / r['after_cpu_s']:,.0f}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
