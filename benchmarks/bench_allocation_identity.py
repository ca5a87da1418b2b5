"""``method="auto"`` for DP-SGD (the identity) under random allocation, before and after the fast
paths of ``dpmf/accounting/allocation/identity.py`` (issue 23 item 3).

Before: auto ran ``allocation_pld`` and, only up to 64 steps, the Renyi/conditional accountant
("allocation") on the dense ``b x b`` means and Gram matrix (the general code); above 64 steps it
skipped it (``AUTO_ALLOCATION_MAX_STEPS``, unproved). After: auto runs both at every size, the
second through the identity's fast paths. The general code is still in the package (it serves
every other encoder), so "before" is measured by forcing it on ``I_b`` (``accountant._is_identity``
patched to ``False``), where it fits in memory (``--general-limit``, default 1000 steps: its
``b x b`` arrays take 0.8 GB each at ``b = 10^4``).

    python benchmarks/bench_allocation_identity.py [--steps 64 256 1000 10000] [--sigma 1.0]
        [--delta 1e-5] [--general-limit 1000]

``python benchmarks/run.py --only allocation_identity`` runs ``CASES``: "allocation" on the
identity at t = 64 and 256 steps, the general code (the peer) against the fast paths.

Per row: seconds and epsilon of allocation_pld, of the general and the fast "allocation" run, auto
before (allocation_pld + the general run where auto ran it, t <= 64) and auto after (measured, one
``dpmf.account`` call). Checks: fast = general to 1e-8 relative (1e-3 below delta 1e-6, :func:`_tolerance`) per accountant where both run, and
auto after = min(allocation_pld, fast allocation, unamplified). One run per cell (the machine is
shared: the ratios are the point, not the seconds).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import dpmf
from dpmf.accounting.allocation import accountant
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import Identity

sys.path.insert(0, str(Path(__file__).resolve().parent))

from case import Case  # noqa: E402

OLD_THRESHOLD = 64  # the old AUTO_ALLOCATION_MAX_STEPS


def _tolerance(delta: float) -> float:
    """Relative epsilon tolerance fast vs general: 1e-8 at delta >= 1e-6; below, 1e-3. The two
    compose the same PMFs in different orders (a tree vs a sequence); each of the b - 1
    compositions moves up to 1e-15 of tail mass up (to +inf on the right), and at delta - delta_E =
    5e-11 that is visible in epsilon. Measured at sigma 1.3, delta 1e-10, t = 2000 (add direction,
    the same PMFs): sequential with truncation 0.182941 (5.5e-13 at +inf), the tree 0.182905
    (2.0e-13 at +inf), sequential without truncation 0.182885: the difference is the truncation
    (both sound), growing with t (1.1e-6 relative at t = 64, 2.5e-5 at 300, 2.0e-4 at 2000)."""
    return 1e-8 if delta >= 1e-6 else 1e-3


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _general(strategy, scheme, sigma, delta):
    original = accountant._is_identity
    accountant._is_identity = lambda *args: False
    try:
        return dpmf.account(strategy, scheme, sigma, delta, method="allocation", force=True)
    finally:
        accountant._is_identity = original


def row(t: int, sigma: float, delta: float, general_limit: int) -> dict:
    strategy, scheme = Identity(t), BallsInBinsSampling(1, t)
    dpmf.account(Identity(8), BallsInBinsSampling(1, 8), sigma, delta)  # (imports, compiled kernels)
    pld, t_pld = _timed(lambda: dpmf.account(strategy, scheme, sigma, delta, method="allocation_pld"))
    fast, t_fast = _timed(lambda: dpmf.account(strategy, scheme, sigma, delta, method="allocation"))
    general, t_general = (None, None)
    if t <= general_limit:
        general, t_general = _timed(lambda: _general(strategy, scheme, sigma, delta))
        for key in ("renyi", "conditional"):
            for d in ("remove", "add"):
                a = fast.diagnostics[key]["epsilon_by_direction"][d]
                b = general.diagnostics[key]["epsilon_by_direction"][d]
                assert abs(a - b) <= _tolerance(delta) * max(abs(b), 1e-12), (t, key, d, a, b)
    auto, t_auto = _timed(lambda: dpmf.account(strategy, scheme, sigma, delta))
    unamp = dpmf.account(strategy, scheme, sigma, delta, method="unamplified").epsilon
    assert auto.epsilon == min(pld.epsilon, fast.epsilon, unamp), (auto.epsilon, pld.epsilon, fast.epsilon)
    before = t_pld + (t_general if t <= OLD_THRESHOLD and t_general is not None else 0.0)
    return {
        "t": t, "pld": (pld.epsilon, t_pld), "fast": (fast.epsilon, t_fast),
        "general": None if general is None else (general.epsilon, t_general),
        "auto_before": before, "auto_after": (auto.epsilon, t_auto, auto.method),
    }


def _agree(general, fast) -> tuple[bool, str]:
    worst = max(
        abs(fast.diagnostics[k]["epsilon_by_direction"][d] - general.diagnostics[k]["epsilon_by_direction"][d])
        / general.diagnostics[k]["epsilon_by_direction"][d]
        for k in ("renyi", "conditional") for d in ("remove", "add")
    )
    return worst <= 1e-8, f"max relative difference {worst:.2g} (Renyi and conditional, both directions)"


def _case(t: int, sigma: float = 1.0, delta: float = 1e-5) -> Case:
    strategy, scheme = Identity(t), BallsInBinsSampling(1, t)
    return Case(
        name=f"identity t={t} sigma={sigma} delta={delta:g}",
        peer=lambda: _general(strategy, scheme, sigma, delta),
        dpmf=lambda: dpmf.account(strategy, scheme, sigma, delta, method="allocation"),
        compare=_agree,
        tolerance="per accountant and direction, relative 1e-8 (float rounding, composition order)",
        peer_name="dpmf general code",
    )


CASES = [_case(64), _case(256)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[64, 256, 1000, 10_000])
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--general-limit", type=int, default=1000)
    args = ap.parse_args()
    print(f"identity, one epoch of t steps, sigma={args.sigma}, delta={args.delta:g}")
    print("| t | allocation_pld eps (s) | allocation general eps (s) | allocation fast eps (s) | general/fast |"
          " auto before s | auto after eps (s), method |")
    print("|---:|---|---|---|---:|---:|---|")
    for t in args.steps:
        r = row(t, args.sigma, args.delta, args.general_limit)
        g = r["general"]
        gen = "not run (b x b)" if g is None else f"{g[0]:.4f} ({g[1]:.2f})"
        ratio = "" if g is None else f"{g[1] / r['fast'][1]:.1f}x"
        before = f"{r['auto_before']:.2f}" + ("" if t <= OLD_THRESHOLD else " (skipped allocation)")
        a = r["auto_after"]
        print(f"| {t} | {r['pld'][0]:.4f} ({r['pld'][1]:.2f}) | {gen} | {r['fast'][0]:.4f} ({r['fast'][1]:.2f}) |"
              f" {ratio} | {before} | {a[0]:.4f} ({a[1]:.2f}), {a[2]} |", flush=True)


if __name__ == "__main__":
    main()
