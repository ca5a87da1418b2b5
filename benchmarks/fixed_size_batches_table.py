"""The table of ``docs/fixed-size-batches.md``: epsilon of DP-SGD under each sampler at one sigma,
and the sigma each needs for a target epsilon, computed (never typed in).

Run (about two minutes on a loaded 2-core machine)::

    nice -n 10 python benchmarks/fixed_size_batches_table.py            # print the table
    nice -n 10 python benchmarks/fixed_size_batches_table.py --write    # and put it in the docs page

The run is the issue's example (1,437 examples, batch 64, 100 epochs, delta 1e-5): 22 steps per
epoch, 2,200 steps. Every value is a certified upper bound from ``dpmf.account`` /
``dpmf.calibrate`` (the method that gave it is in the table); ``--write`` replaces the lines between
the ``<!-- table:start -->`` and ``<!-- table:end -->`` markers of the page.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import dpmf
from dpmf.sampling import BallsInBinsSampling, FixedOrderSampling, PoissonSampling, padded_batch_size
from dpmf.strategies import Identity

EXAMPLES, BATCH, EPOCHS, DELTA, TARGET = 1437, 64, 100, 1e-5, 4.0
PAGE = Path(__file__).resolve().parents[1] / "docs" / "fixed-size-batches.md"


def samplers():
    b = EXAMPLES // BATCH  # 22 steps per epoch (dpmf plan's choice for this run)
    n = b * EPOCHS
    return n, b, [
        ("Poisson, rate 64/1437", PoissonSampling(BATCH / EXAMPLES, n), "random (Binomial)"),
        ("balls-in-bins, one slot reused every epoch", BallsInBinsSampling(EPOCHS, n), "padded"),
        ("balls-in-bins, fresh slot every epoch", BallsInBinsSampling(EPOCHS, n, fresh_slots=True), "padded"),
        ("balls-in-bins, 2 of 44 steps, fresh", BallsInBinsSampling(EPOCHS // 2, n, num_selected=2, fresh_slots=True),
         "padded"),
        ("shuffled fixed order (no amplification)", FixedOrderSampling(EPOCHS, n), "fixed"),
    ]


def rows():
    n, b, cases = samplers()
    strategy = Identity(n)
    poisson_sigma = dpmf.calibrate(strategy, cases[0][1], TARGET, DELTA, method="pld").noise_multiplier
    out = []
    for label, scheme, shape in cases:
        at = dpmf.account(strategy, scheme, poisson_sigma, DELTA)
        cal = dpmf.calibrate(strategy, scheme, TARGET, DELTA)
        if isinstance(scheme, BallsInBinsSampling):
            shape = f"fixed: pad to {padded_batch_size(scheme, EXAMPLES)}"
        elif isinstance(scheme, PoissonSampling):
            shape = "random (Binomial, mean 64)"
        else:
            shape = "fixed (65 or 66: 1437 / 22)"
        out.append((label, at.epsilon, at.method, cal.noise_multiplier, cal.report.method, shape))
        print(f"  {label}: done", file=sys.stderr, flush=True)
    return poisson_sigma, out


def table(poisson_sigma: float, data) -> str:
    lines = [
        f"| sampler | epsilon at sigma {poisson_sigma:.4g} | accountant | sigma for epsilon {TARGET:g} | "
        "x Poisson's sigma | accountant | batch shape |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, eps, method, sigma, cmethod, shape in data:
        e = "inf" if math.isinf(eps) else f"{eps:.3f}"
        lines.append(
            f"| {label} | {e} | `{method}` | {sigma:.3f} | {sigma / data[0][3]:.2f} | `{cmethod}` | {shape} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"replace the table in {PAGE.name}")
    args = parser.parse_args()
    text = table(*rows())
    print(text)
    if args.write:
        write(text)


def write(text: str) -> None:
    """Put ``text`` between the page's ``table:start`` and ``table:end`` markers."""
    page = PAGE.read_text()
    new, count = re.subn(r"(<!-- table:start -->\n)(?:.*?\n)?(<!-- table:end -->)",
                         lambda m: m.group(1) + text + "\n" + m.group(2), page, flags=re.S)
    if count != 1:
        raise SystemExit(f"{PAGE} has no single table:start/table:end block")
    PAGE.write_text(new)
    print(f"wrote {PAGE}", file=sys.stderr)


if __name__ == "__main__":
    main()
