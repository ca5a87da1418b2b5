"""``dpmf compose REPORT.json ...``: the privacy of several runs on the same data. Parse, call, print.

The library does the work (:func:`dpmf.accounting.composition.compose`): every report file is
recomputed from its own description (never trusted for a stored number), parts with a PLD are
composed tightly, the others through their (epsilon, delta) claim, which the output names.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Optional

import typer

from dpmf.cli.console import cli_errors, cli_progress, err, out

__all__ = ["compose"]


def compose(
    reports: List[Path] = typer.Argument(
        ...,
        help="Report files written by 'dpmf account --json', 'calibrate --json', a training run "
        "(privacy.report().to_json()) or 'dpmf compose --json'. Repeat a file for repeated runs, or use --times.",
    ),
    times: int = typer.Option(1, "--times", help="Runs of each report (e.g. k runs of one configuration for "
                              "hyperparameter tuning)."),
    delta: Optional[float] = typer.Option(
        None, "--delta", help="Delta of the composed epsilon in (0, 1); default the sum of the parts' deltas."
    ),
    matrices: Optional[Path] = typer.Option(
        None, "--matrices", help="Directory of .npz files holding dense strategy matrices the reports reference."
    ),
    workers: Optional[int] = typer.Option(None, "--workers", help="MMCC / Monte Carlo: worker processes for the "
                                          "recomputation (same result)."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Also save the composed f-DP trade-off curve to this "
                                       "image file (e.g. curve.png)."),
    as_json: bool = typer.Option(False, "--json", help="Print the composed report as one JSON object."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr."),
) -> None:
    """Total privacy of several training runs on the same data (tuning, multi-stage training).

    Each report file is recomputed from its description (strategy, sampler, noise, delta, method,
    options) -- a stored epsilon is never trusted; a file that cannot be recomputed is refused.
    Reports with a privacy-loss distribution (DP-SGD, truncated_pld, MMCC with its phases,
    allocation_pld) and Gaussian ones (unamplified) compose tightly; the others (Renyi random
    allocation, Monte Carlo) only through their (epsilon, delta), and the output says so.

    Example: dpmf account --sampling poisson --sampling-prob 0.01 --steps 1000
    --noise-multiplier 1.0 --delta 1e-6 --json > run.json; dpmf compose run.json --times 10 --delta 1e-5
    """
    from dpmf import validation as _v
    from dpmf.cli.console import note_workers

    with cli_errors(hint="use a smaller --times or compose fewer reports"):
        _v.positive_int("--times", times)  # (named as typed: "times" is no library argument the console maps)
        if delta is not None:
            _v.open_unit("delta", delta)
        if workers is not None:
            _v.positive_int("workers", workers)
            note_workers(workers)
        if plot is not None:
            from dpmf.files import check_output_file

            check_output_file(plot, "--plot", plot=True)  # before the work
        from dpmf.accounting.composition import compose as _compose

        with cli_progress(quiet):
            report = _compose([str(r) for r in reports], delta, times=times, search_dir=matrices, workers=workers)
        if plot is not None:
            from dpmf.plots import tradeoff_plot

            tradeoff_plot(report, path=plot)
    diag = report.diagnostics
    for i, part in enumerate(diag["parts"], 1):  # a file whose own claim does not hold is worth a warning
        if part.get("claim_held") is False:
            err.print(f"warning: part {i} ({part['source']}): its own claim does not hold "
                      f"({part.get('claim_problem', '')}); "
                      "the composition uses the recomputed report", highlight=False, markup=False, soft_wrap=True)
        if part.get("edited"):
            err.print(f"note: part {i} ({part['source']}) was edited since it was produced; it was recomputed from "
                      "its description as it reads now", highlight=False, markup=False, soft_wrap=True)
    if plot is not None:
        (err if as_json else out).print(f"trade-off curve written to {plot}", highlight=False, markup=False,
                                        soft_wrap=True)
    if as_json:
        out.print_json(report.to_json())
        return
    out.print(report.summary(), highlight=False, markup=False, soft_wrap=True)
    out.print(f"  {diag['runs']} runs; delta: {diag['delta_choice']}", highlight=False, markup=False, soft_wrap=True)
    for i, part in enumerate(diag["parts"], 1):
        r = part["report"]
        eps = r["epsilon"] if isinstance(r["epsilon"], str) else f"{r['epsilon']:.6g}"
        out.print(
            f"  part {i}: {part['source']} x{part['times']}: {r['method']}, epsilon {eps} at delta {r['delta']:.3g}"
            f" -> {part['composed_as']}", highlight=False, markup=False, soft_wrap=True,
        )
    if not diag["tight"]:
        out.print("  NOT TIGHT: some parts carry no privacy-loss distribution and were composed through their "
                  "(epsilon, delta) only (above); the composed epsilon is sound but may be loose",
                  highlight=False, markup=False, soft_wrap=True)
    basic = diag["basic_composition"]
    if math.isfinite(basic["epsilon"]):
        out.print(f"  for comparison, basic composition: epsilon {basic['epsilon']:.6g} at delta {basic['delta']:.3g}",
                  highlight=False, markup=False, soft_wrap=True)
    mu, note = report.gdp_mu()
    if mu is not None:
        out.print(f"  GDP mu = {mu:.6g} ({note})", highlight=False, markup=False, soft_wrap=True)
