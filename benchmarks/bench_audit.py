"""Empirical audits (issue 25): how long an audit of the built-in model takes per mechanism, and how
much of the provable it reaches (power against the ideal references).

Standalone (the measurements; dpmf only -- there is no peer that audits correlated-noise training):

    python benchmarks/bench_audit.py                 # fast mode: one audit per mechanism (< 1 min)
    python benchmarks/bench_audit.py --power         # the power table (claims eps 1-4; ~30 min here)

**Time** (fast mode): one white-box one-run audit of the built-in task (a 8-16-2 MLP on synthetic
data) per mechanism, 32 steps, 500 canaries + 500 real examples, 5 reference simulations:
DP-SGD under Poisson sampling (q = 0.2), BandMF (``bsr``, 8 bands) under cyclic Poisson (rate 1, 4
epochs of 8 steps), BLT (2 buffers, optimized for 4 epochs) under fixed order (4 epochs) -- the BLT
row under balls-in-bins is in the power table (its accountant alone takes 5-100 s). The plan
(calibration to epsilon 2 at delta 1e-5) is timed separately from the audit (training with canaries,
pre-registration by simulation, scoring, statistics and references). Medians of ``--repeats``.
torch runs on one thread (``torch.set_num_threads(1)``).

**Power** (``--power``): 64 steps, 1000 canaries + 1000 real examples (4000 canaries at epsilon 1,
where 1000 are below the one-run audit's detection floor), claims epsilon 1, 2, 3, 4 at delta 1e-5,
``--seeds`` audits per cell: DP-SGD / Poisson q = 0.1 and q = 0.5, BandMF (``bsr`` 4 bands) / cyclic
Poisson q = 0.5 (MMCC), BandMF (``bsr`` 16 bands) / cyclic Poisson rate 1, BLT / balls-in-bins (4
epochs; random allocation). Per cell: the median empirical lower bound of the training-path audit,
the ideal attacker on the Gaussian mechanism with the claimed (epsilon, delta) (median of 25
simulations, same canaries, confidence 95%, guesses chosen the same way) and the ideal attacker on
this mechanism without training code (median of 10 simulations), and the ratio audit / Gaussian
reference (the goal: >= 0.8).

``CASES`` (for ``benchmarks/run.py``): the one-run bound against jax_privacy's
``auditing._epsilon_one_run`` on the same counts when jax-privacy is installed (the ``bench``
extra); agreement 1e-4 in epsilon.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from case import Case

DELTA = 1e-5


def _torch():
    import torch

    torch.set_num_threads(1)
    return torch


def _fast_configs():
    from dpmf.sampling import CyclicPoissonSampling, FixedOrderSampling, PoissonSampling
    from dpmf.strategies import Identity, catalog

    n = 32
    return {
        "DP-SGD / Poisson q=0.2": (Identity(n), PoissonSampling(0.2, n)),
        "BandMF bsr(8) / cyclic Poisson": (catalog.build("bsr", n, bands=8), CyclicPoissonSampling(1.0, n, 8)),
        "BLT / fixed order": (catalog.build("blt", n, epochs=4), FixedOrderSampling(4, n)),
    }


def time_audits(repeats: int = 1, canaries: int = 500, real: int = 500) -> list[dict]:
    """Fast mode: per mechanism, the plan's and the audit's wall time (medians of ``repeats``)."""
    _torch()
    from dpmf.training.run_spec import build_run_spec
    from dpmf.training.torch.audit import audit_training

    rows = []
    for name, (strategy, scheme) in _fast_configs().items():
        plans, audits, lows = [], [], []
        for r in range(repeats):
            t = time.perf_counter()
            plan = build_run_spec(strategy, scheme, num_examples=real + canaries, delta=DELTA, max_grad_norm=1.0,
                              target_epsilon=2.0)
            plans.append(time.perf_counter() - t)
            t = time.perf_counter()
            rep = audit_training(plan=plan, canaries=canaries, num_examples=real, seed=r, reference_trials=5)
            audits.append(time.perf_counter() - t)
            lows.append(rep.epsilon_lower)
            assert rep.epsilon_lower <= rep.epsilon_certified
        rows.append({"mechanism": name, "plan_seconds": statistics.median(plans),
                     "audit_seconds": statistics.median(audits), "epsilon_lower": statistics.median(lows),
                     "epsilon_certified": rep.epsilon_certified, "method": rep.certified.method})
    return rows


def _power_configs():
    from dpmf.sampling import BallsInBinsSampling, CyclicPoissonSampling, PoissonSampling
    from dpmf.strategies import Identity, catalog

    n = 64
    return {
        "DP-SGD / Poisson q=0.1": (Identity(n), PoissonSampling(0.1, n)),
        "DP-SGD / Poisson q=0.5": (Identity(n), PoissonSampling(0.5, n)),
        "BandMF bsr(4) / cyclic Poisson q=0.5": (catalog.build("bsr", n, bands=4), CyclicPoissonSampling(0.5, n, 4)),
        "BandMF bsr(16) / cyclic Poisson rate 1": (catalog.build("bsr", n, bands=16),
                                                   CyclicPoissonSampling(1.0, n, 16)),
        "BLT / balls-in-bins": (catalog.build("blt", n, epochs=4), BallsInBinsSampling(4, n)),
    }


def power(claims=(1.0, 2.0, 3.0, 4.0), seeds: int = 3, real: int = 1000, only: str | None = None) -> list[dict]:
    """The power table (module docstring)."""
    _torch()
    from dpmf.training.run_spec import build_run_spec
    from dpmf.training.torch.audit import audit_training

    rows = []
    for name, (strategy, scheme) in _power_configs().items():
        if only and only not in name:
            continue
        for eps in claims:
            m = 4000 if eps <= 1.0 else 1000
            t = time.perf_counter()
            plan = build_run_spec(strategy, scheme, num_examples=real + m, delta=DELTA, max_grad_norm=1.0,
                              target_epsilon=eps)
            plan_s = time.perf_counter() - t
            lows, secs, ref, mech = [], [], None, None
            for s in range(seeds):
                t = time.perf_counter()
                rep = audit_training(plan=plan, canaries=m, num_examples=real, seed=s,
                                     reference_trials=25 if s == 0 else 0)
                secs.append(time.perf_counter() - t)
                lows.append(rep.epsilon_lower)
                if s == 0:
                    ref, mech = rep.reference["median"], rep.mechanism_reference["median"]
                assert not rep.exceeds, rep.summary()
            med = float(np.median(lows))
            rows.append({"mechanism": name, "claim": eps, "certified": plan.epsilon, "canaries": m,
                         "audit_median": med, "audit_min": min(lows), "audit_max": max(lows),
                         "gaussian_reference": ref, "mechanism_reference": mech,
                         "ratio": med / ref if ref else float("nan"), "plan_seconds": plan_s,
                         "audit_seconds": float(np.median(secs)), "exact": rep.score["exact_likelihood_ratio"]})
            print(_power_line(rows[-1]), flush=True)
    return rows


def _power_line(r: dict) -> str:
    return (f"| {r['mechanism']} | {r['claim']:g} | {r['canaries']} | {r['audit_median']:.2f} "
            f"({r['audit_min']:.2f}-{r['audit_max']:.2f}) | {r['gaussian_reference']:.2f} | "
            f"{r['mechanism_reference']:.2f} | {r['ratio']:.0%} | {r['audit_seconds']:.1f} |")


# ---------------------------------------------------------------------------- runner cases


def _jax_case():
    try:
        from jax_privacy import auditing as jpa  # noqa: F401
    except ImportError:
        return []
    from dpmf.auditing.bounds import one_run_epsilon

    counts = [(1000, 100, 90), (1000, 200, 150), (10000, 1000, 700), (500, 60, 60)]

    def peer():
        return [jpa._epsilon_one_run(0.0, m, r, v, 0.05, DELTA) for m, r, v in counts]

    def mine():
        return [one_run_epsilon(m, r, v, DELTA, 0.95) for m, r, v in counts]

    def compare(a, b):
        diff = max(abs(x - y) for x, y in zip(a, b))
        return diff <= 1e-4, f"max |difference| {diff:.2e} (dpmf {['%.4f' % x for x in b]})"

    return [Case("one_run_epsilon_vs_jax_privacy", peer, mine, compare, "epsilon within 1e-4 on four count sets",
                 peer_name="jax_privacy 2.0.0")]


CASES = _jax_case()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="dpmf audit: time per mechanism (fast) and power (--power)")
    p.add_argument("--power", action="store_true", help="the power table (claims 1-4, long)")
    p.add_argument("--seeds", type=int, default=3, help="audits per power cell")
    p.add_argument("--only", default=None, help="power: mechanisms whose name contains this")
    p.add_argument("--repeats", type=int, default=1, help="fast mode: repeats per mechanism")
    args = p.parse_args(argv)
    if args.power:
        print("| mechanism / sampler | claim eps | canaries | audit (median, min-max) | ideal Gaussian | "
              "ideal on mechanism | audit / Gaussian | audit s |")
        print("|---|---|---|---|---|---|---|---|")
        power(seeds=args.seeds, only=args.only)
        return 0
    start = time.perf_counter()
    rows = time_audits(args.repeats)
    print("| mechanism / sampler | accountant | plan s | audit s | empirical lower bound | certified |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mechanism']} | {r['method']} | {r['plan_seconds']:.1f} | {r['audit_seconds']:.1f} | "
              f"{r['epsilon_lower']:.3f} | {r['epsilon_certified']:.3g} |")
    print(f"total {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
