"""The table of ``docs/fixed-size-batches.md``: epsilon of DP-SGD under each sampler at one sigma,
and the sigma each needs for a target epsilon, computed (never typed in).

Run (about ten minutes on a loaded 2-core machine)::

    nice -n 10 python benchmarks/fixed_size_batches_table.py            # print the table
    nice -n 10 python benchmarks/fixed_size_batches_table.py --write    # and put it in the docs page

Two runs (:data:`RUNS`): the issue's example (1,437 examples, batch 64, 100 epochs, delta 1e-5: 22
steps per epoch, 2,200 steps) and ``dpmf plan``'s default (50,000 examples, batch 500, 5 epochs,
delta 1e-6: 100 steps per epoch). Every value is a certified upper bound from ``dpmf.account`` /
``dpmf.calibrate`` (the method that gave it is in the table); ``--write`` replaces the lines between
the ``<!-- table:start -->`` and ``<!-- table:end -->`` markers of the page (``table-large`` for the
second run).
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

#: (marker, examples, batch, epochs, delta, target epsilon): the issue's run, and dpmf plan's default run
RUNS = (("table", 1437, 64, 100, 1e-5, 4.0), ("table-large", 50_000, 500, 5, 1e-6, 2.0))
PAGE = Path(__file__).resolve().parents[1] / "docs" / "fixed-size-batches.md"


def samplers(examples: int, batch: int, epochs: int):
    b = examples // batch  # steps per epoch (dpmf plan's choice)
    n = b * epochs
    out = [
        (f"Poisson, rate {batch}/{examples}", PoissonSampling(batch / examples, n)),
        ("balls-in-bins, one slot reused every epoch", BallsInBinsSampling(epochs, n)),
        ("balls-in-bins, fresh slot every epoch", BallsInBinsSampling(epochs, n, fresh_slots=True)),
    ]
    if epochs % 2 == 0:
        out.append((f"balls-in-bins, 2 of {2 * b} steps, fresh",
                    BallsInBinsSampling(epochs // 2, n, num_selected=2, fresh_slots=True)))
    out.append(("shuffled fixed order (no amplification)", FixedOrderSampling(epochs, n)))
    return n, b, out


def rows(examples: int, batch: int, epochs: int, delta: float, target: float):
    n, b, cases = samplers(examples, batch, epochs)
    strategy = Identity(n)
    poisson_sigma = dpmf.calibrate(strategy, cases[0][1], target, delta, method="pld").noise_multiplier
    out = []
    for label, scheme in cases:
        at = dpmf.account(strategy, scheme, poisson_sigma, delta)
        cal = dpmf.calibrate(strategy, scheme, target, delta)
        if isinstance(scheme, BallsInBinsSampling):
            shape = f"fixed: pad to {padded_batch_size(scheme, examples)}"
        elif isinstance(scheme, PoissonSampling):
            shape = f"random (Binomial, mean {batch})"
        else:
            lo = examples // b
            shape = f"fixed ({lo} or {lo + 1}: {examples} / {b})" if examples % b else f"fixed ({lo})"
        out.append((label, at.epsilon, at.method, cal.noise_multiplier, cal.report.method, shape))
        print(f"  {examples} examples, {label}: done", file=sys.stderr, flush=True)
    return poisson_sigma, target, out


def table(poisson_sigma: float, target: float, data) -> str:
    lines = [
        f"| sampler | epsilon at sigma {poisson_sigma:.4g} | accountant | sigma for epsilon {target:g} | "
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
    for marker, *run in RUNS:
        text = table(*rows(*run))
        print(text)
        if args.write:
            write(text, marker)


def write(text: str, marker: str = "table") -> None:
    """Put ``text`` between the page's ``<marker>:start`` and ``<marker>:end`` comments."""
    page = PAGE.read_text()
    new, count = re.subn(rf"(<!-- {marker}:start -->\n)(?:.*?\n)?(<!-- {marker}:end -->)",
                         lambda m: m.group(1) + text + "\n" + m.group(2), page, flags=re.S)
    if count != 1:
        raise SystemExit(f"{PAGE} has no single {marker}:start/{marker}:end block")
    PAGE.write_text(new)
    print(f"wrote {PAGE}", file=sys.stderr)


if __name__ == "__main__":
    main()
