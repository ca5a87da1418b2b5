"""``dpmf individual``: per-example privacy (GDP filters, ledgers). Parse, call, print."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table

from dpmf.cli.console import fail, cli_errors, out, typer_app
from dpmf.errors import DPMFError
from dpmf.files import check_output_file

app = typer_app(
    help="Individual (per-example) privacy accounting with Gaussian-DP filters "
    "(Koskela, Tobaben & Honkela 2023).",
    no_args_is_help=True,
)


@app.command()
def steps(
    noise_multiplier: float = typer.Option(..., "--noise-multiplier", help="Noise std / clip norm (sigma)."),
    epsilon: float = typer.Option(..., "--epsilon", help="Target epsilon for every example."),
    delta: float = typer.Option(..., "--delta", help="Target delta."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """How many full-gradient (worst-case) steps one example can take: GDP filter vs Rényi filter.

    Example: dpmf individual steps --noise-multiplier 100 --epsilon 0.81563 --delta 1e-5
    (495 steps with the GDP filter, 420 with the Rényi filter).
    """
    from dpmf.accounting.individual import full_gradient_steps

    try:
        res = full_gradient_steps(noise_multiplier, epsilon, delta)
    except DPMFError as exc:
        fail(str(exc))
    if as_json:
        out.print_json(json.dumps(res))
        return
    out.print(
        f"GDP filter: {res['gdp_steps']} full-gradient steps (epsilon {res['gdp_epsilon_at_steps']:.6g})\n"
        f"Rényi filter: {res['rdp_steps']} full-gradient steps (epsilon {res['rdp_epsilon_at_steps']:.6g})\n"
        f"at noise multiplier {noise_multiplier:g}, target (epsilon={epsilon:g}, delta={delta:g})",
        highlight=False,
    )


@app.command()
def report(
    ledger: str = typer.Argument(..., help="A ledger file written by IndividualGDPLedger.save (.npz)."),
    delta: float = typer.Option(1e-5, "--delta", help="Delta at which to report each example's epsilon."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Refuse a ledger from another run."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Save a histogram and CDF of epsilons (PNG)."),
) -> None:
    """Distribution of individual epsilon across examples, exhausted examples, the worst case."""
    from dpmf.accounting.individual import IndividualGDPLedger
    from dpmf.accounting.individual.report import plot_epsilons, summarize

    with cli_errors(hint="the ledger is too large for this machine"):
        if plot:
            check_output_file(plot, "--plot", plot=True)  # before the work
        led = IndividualGDPLedger.load(ledger, run_id=run_id)
        summary, eps = summarize(led, delta)
        if plot:
            plot_epsilons(eps, summary, plot)
    if as_json:
        out.print_json(json.dumps(summary))
        return
    table = Table(title=f"individual privacy: {summary['num_examples']} examples after {summary['steps']} steps")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("GDP budget B (every example)", f"{summary['budget_mu']:.6g}"),
        (f"budget as epsilon at delta={delta:g}", f"{summary['budget_epsilon']:.6g}"),
        ("worst individual epsilon", f"{summary['max_epsilon']:.6g}"),
        ("median individual epsilon", f"{summary['quantiles']['0.5']:.6g}"),
        ("10% / 90% quantiles", f"{summary['quantiles']['0.1']:.4g} / {summary['quantiles']['0.9']:.4g}"),
        ("exhausted examples", f"{summary['exhausted']} ({100 * summary['exhausted_fraction']:.1f}%)"),
    ]
    for r in rows:
        table.add_row(*r)
    out.print(table)
    if plot:
        out.print(f"plot written to {plot}")
