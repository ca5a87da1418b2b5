"""``dpmf verify REPORT.json``: re-check a saved privacy report. Parse, call, print.

The library does the work (:func:`dpmf.accounting.verify.verify_report`): it rebuilds the
strategy and the sampling scheme from the report's own descriptions, recomputes the report with
its method and options, and compares; separately it checks the report's digest to say whether the
report was edited since it was produced. A training run's report (``privacy.report()``) also gets one
line saying what was trained (steps done of steps planned, clip norm, normalizer, the ``dpmf plan``
row it came from). Exit status (:data:`EXIT_CODES`): 0 when the claim holds
and the report is not edited, 1 when the claim does not hold (the output says what), 2 when the
report cannot be checked (not JSON, not a dpmf report, an unknown method, a Monte Carlo
calibration, a dense matrix neither in ``--matrices`` nor beside the report ...: one line on stderr,
no traceback), 3 when the claim holds
but the report was edited since it was produced, 4 when the claim holds but the report has no
digest (cannot tell whether it was edited).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from dpmf.cli.console import err, out
from dpmf.errors import DPMFError

__all__ = ["verify", "EXIT_CODES", "exit_code"]

#: ``dpmf verify``'s exit status, by outcome (the command's help says the same).
EXIT_CODES = {
    "holds, not edited": 0,
    "does not hold": 1,
    "cannot be checked": 2,
    "holds, edited since produced": 3,
    "holds, no digest (cannot tell whether edited)": 4,
}


def exit_code(result) -> int:
    """The exit status of a :class:`~dpmf.accounting.verify.Verification` (:data:`EXIT_CODES`): a claim
    that does not hold wins over an edit."""
    if not result.holds:
        return EXIT_CODES["does not hold"]
    edited = {False: "not edited", True: "edited since produced", None: "no digest (cannot tell whether edited)"}
    return EXIT_CODES[f"holds, {edited[result.edited]}"]


def verify(
    report: Path = typer.Argument(
        ...,
        help="A report written by 'dpmf account --json', 'calibrate --json' or a training run "
        "(privacy.report().to_json()).",
    ),
    matrices: Optional[Path] = typer.Option(
        None,
        "--matrices",
        help="Directory of .npz files holding the dense strategy matrices the report references by "
        "sha256 (e.g. the FILE.npz of 'dpmf strategy build'). Default: the report's own folder (where "
        "privacy.save_report writes them).",
    ),
    workers: Optional[int] = typer.Option(
        None, "--workers", help="MMCC / Monte Carlo: worker processes for the recomputation (same result)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the verification as one JSON object."),
) -> None:
    """Recompute a saved privacy report and check its claimed epsilon; say whether it was edited.

    Two verdicts: whether the claim holds (recomputed epsilon <= claimed, certified flags agree),
    and whether the report was edited since it was produced (its digest of the description and
    claim no longer matches; "no digest: cannot tell" for older reports). The digest detects
    edits, not forgery: it is not a signature.

    Exit status: 0 the claim holds and the report is not edited; 1 the claim does not hold
    (edited or not); 2 the file cannot be checked; 3 the claim holds but the report was edited
    since it was produced; 4 the claim holds but the report has no digest.

    Example: dpmf account --sampling poisson --sampling-prob 0.01 --steps 1000
    --noise-multiplier 1.0 --delta 1e-6 --json > report.json; dpmf verify report.json
    """
    from dpmf.accounting.verify import verify_report
    from dpmf.cli.console import note_workers

    note_workers(workers)  # (the recomputation starts at most one process per CPU)
    try:
        if matrices is not None:
            from dpmf.files import check_input_dir

            check_input_dir(matrices, "--matrices")  # (a mistyped folder must not look like an empty one)
        with err.status(f"recomputing {report} ..."):
            result = verify_report(report, search_dir=matrices, workers=workers)
    except DPMFError as exc:
        # not console._fail: the names in these messages are report keys, not command-line options
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=2) from None
    if as_json:
        out.print_json(json.dumps(result.to_dict()))  # (a training run's report: with its "training")
    else:
        for line in result.summary().splitlines():  # the trained line: one line, whole (easy to grep)
            out.print(line, highlight=False, markup=False, soft_wrap=line == result.trained)
    raise typer.Exit(code=exit_code(result))
