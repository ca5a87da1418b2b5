"""Summaries and plots of a per-example ledger (used by ``dpmf individual report``)."""

from __future__ import annotations

import numpy as np

from dpmf.accounting.individual.gdp_filter import IndividualGDPLedger
from dpmf.files import check_output_file, save_figure
from dpmf.privacy.gdp import gdp_epsilon

QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def summarize(ledger: IndividualGDPLedger, delta: float) -> tuple[dict, np.ndarray]:
    """``(summary dict, per-example epsilons)`` at ``delta``."""
    eps = ledger.individual_epsilon(delta)
    exhausted = ledger.exhausted()
    summary = {
        "run_id": ledger.run_id,
        "num_examples": ledger.num_examples,
        "steps": ledger.steps,
        "delta": delta,
        "budget_mu": ledger.budget,
        "budget_epsilon": gdp_epsilon(ledger.budget, delta),
        "max_epsilon": float(eps.max()),
        "mean_epsilon": float(eps.mean()),
        "quantiles": {str(q): float(np.quantile(eps, q)) for q in QUANTILES},
        "exhausted": int(exhausted.sum()),
        "exhausted_fraction": float(exhausted.mean()),
    }
    return summary, eps


def plot_epsilons(eps: np.ndarray, summary: dict, path: str) -> None:
    """Histogram and empirical CDF of individual epsilons, with the budget marked (``path``'s
    folder must exist; checked before drawing)."""
    check_output_file(path, "path", plot=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax1.hist(eps, bins=40, color="tab:blue")
    ax1.set_xlabel(f"individual epsilon at delta={summary['delta']:g}")
    ax1.set_ylabel("examples")
    xs = np.sort(eps)
    ax2.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post")
    ax2.set_xlabel("individual epsilon")
    ax2.set_ylabel("fraction of examples <= epsilon")
    for ax in (ax1, ax2):
        ax.axvline(summary["budget_epsilon"], color="tab:red", ls="--", label="budget")
    ax2.legend(loc="lower right")
    fig.suptitle(f"{summary['num_examples']} examples, {summary['steps']} steps, {summary['exhausted']} exhausted")
    fig.tight_layout()
    save_figure(fig, path)
