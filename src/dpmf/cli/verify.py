"""``dpmf verify REPORT.json``: re-check a saved privacy report. Parse, call, print.

The library does the work (:func:`dpmf.accounting.verify.verify_report`): it rebuilds the
strategy and the sampling scheme from the report's own descriptions, recomputes the report with
its method and options, and compares. Exit status: 0 when the claim holds, 1 when it does not
(the output says what does not hold), 2 when the report cannot be checked (not JSON, not a dpmf
report, an unknown method, a Monte Carlo calibration, a missing dense matrix ...): one line on
stderr, no traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from dpmf.cli.console import err, out
from dpmf.errors import DPMFError

__all__ = ["verify"]


def verify(
    report: Path = typer.Argument(..., help="A report written by 'dpmf account --json' (or 'calibrate --json')."),
    matrices: Optional[Path] = typer.Option(
        None,
        "--matrices",
        help="Directory of .npz files holding the dense strategy matrices the report references by "
        "sha256 (e.g. the FILE.npz of 'dpmf strategy build').",
    ),
    workers: Optional[int] = typer.Option(
        None, "--workers", help="MMCC / Monte Carlo: worker processes for the recomputation (same result)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the verification as one JSON object."),
) -> None:
    """Recompute a saved privacy report and check its claimed epsilon.

    Exit status 0 if the claimed epsilon holds (recomputed <= claimed, certified flags agree),
    1 if it does not, 2 if the file cannot be checked.

    Example: dpmf account --sampling poisson --sampling-prob 0.01 --steps 1000
    --noise-multiplier 1.0 --delta 1e-6 --json > report.json; dpmf verify report.json
    """
    from dpmf.accounting.verify import verify_report

    try:
        with err.status(f"recomputing {report} ..."):
            result = verify_report(report, search_dir=matrices, workers=workers)
    except DPMFError as exc:
        # not console._fail: the names in these messages are report keys, not command-line options
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=2) from None
    if as_json:
        out.print_json(json.dumps(result.to_dict()))
    else:
        out.print(result.summary(), highlight=False, markup=False)
    raise typer.Exit(code=0 if result.holds else 1)
