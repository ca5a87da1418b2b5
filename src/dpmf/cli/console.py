"""Shared consoles and the one-line error exit of the ``dpmf`` CLI."""

from __future__ import annotations

import re
import sys

import typer
from rich.console import Console

out = Console(width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True, soft_wrap=True)

#: API argument names -> CLI option names, so errors name what the user typed.
_OPTION_NAMES = {
    "sampling_prob": "--sampling-prob",
    "noise_multiplier": "--noise-multiplier",
    "target_epsilon": "--epsilon",
    "epsilon": "--epsilon",
    "delta": "--delta",
    "steps": "--steps",
    "epochs": "--epochs",
    "dataset_size": "--dataset-size",
    "batch_size": "--batch-size",
    "n": "--steps",
    "min_sep": "--min-sep",
    "cycle_length": "--min-sep",
    "max_batch_size": "--max-batch-size",
    "bands": "--bands",
    "num_samples": "--samples",
    "montecarlo_samples": "--montecarlo-samples",
    "workers": "--workers",
    "seed": "--seed",
    "scheduler": "--scheduler",
    "cache_dir": "--cache-dir",
}


def _fail(message: str) -> None:
    """Print ``error: message`` (API argument names mapped to CLI options) and exit 2."""
    for api, opt in _OPTION_NAMES.items():
        message = re.sub(rf"^{api}\b", opt, message)
        message = re.sub(rf"(?<=[ (]){api}(?==)", opt, message)
        message = re.sub(rf"(?<=<= ){api}\b", opt, message)
        message = re.sub(rf"(?<=option ')({api})(?=')", opt, message)
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code=2)
