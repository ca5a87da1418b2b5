"""Shared consoles, the one-line error exit of the ``dpmf`` CLI, and the one map from library
argument names to command-line options.

Every command prints a library error through :func:`_fail`, which rewrites the argument names the
library uses (``sampling_prob``, ``cache_dir``, ``workers`` ...) into the options the user typed
(``--sampling-prob``, ``--cache-dir``, ``--workers`` ...) using :data:`_OPTION_NAMES` -- the only
place that mapping lives -- and exits with status 2.
"""

from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape

from dpmf.errors import DPMFError

try:  # typer >= 0.16 vendors click and has its own command classes
    from typer.core import TyperCommand, TyperGroup
except ImportError:  # pragma: no cover
    TyperCommand = TyperGroup = None

out = Console(width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True, soft_wrap=True)

#: API argument names -> CLI option names, so errors name what the user typed. The one place
#: where library names meet command-line flags.
_OPTION_NAMES = {
    "sampling_prob": "--sampling-prob",
    "participation_rate": "--participation-rate",
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
    "warm_start": "--warm-start",
    "bands": "--bands",
    "buffers": "--buffers",
    "momentum": "--momentum",
    "learning_rates": "--learning-rates",
    "num_samples": "--samples",
    "montecarlo_samples": "--montecarlo-samples",
    "num_candidates": "--candidates",
    "candidates": "--candidates",
    "chunk_size": "--chunk-size",
    "confidence": "--confidence",
    "checkpoint": "--checkpoint",
    "workers": "--workers",
    "seed": "--seed",
    "scheduler": "--scheduler",
    "cache_dir": "--cache-dir",
    "run_id": "--run-id",
    "mmcc": "--mmcc",
}


def cli_message(message: str) -> str:
    """``message`` with library argument names replaced by the CLI options (:data:`_OPTION_NAMES`).

    Names with an underscore (``sampling_prob``) are unambiguous and replaced wherever they stand
    as a word; plain words (``delta``, ``steps``) only where they name an argument: at the start,
    before ``=`` or `` must``, after ``<= `` or inside ``option '...'``.
    """
    for api, opt in _OPTION_NAMES.items():
        if "_" in api:
            message = re.sub(rf"(?<![\w./-]){api}\b(?!/)", opt, message)  # (not inside a file path)
            continue
        message = re.sub(rf"^{api}\b(?!-)", opt, message)
        message = re.sub(rf"(?<=[ (]){api}(?==)", opt, message)
        message = re.sub(rf"(?<=<= ){api}\b", opt, message)
        message = re.sub(rf"(?<=option ')({api})(?=')", opt, message)
        message = re.sub(rf"(?<=[;:] ){api}(?= must\b)", opt, message)
    return message


def _fail(message: str) -> None:
    """Print ``error: message`` (API argument names mapped to CLI options) on one line and exit 2."""
    one_line = " ".join(cli_message(str(message)).split())
    err.print(f"[bold red]error:[/] {escape(one_line)}", highlight=False)
    raise typer.Exit(code=2)


@contextmanager
def cli_errors(hint: str = "use fewer --steps"):
    """Inside a command: a library error (or running out of memory) is one line and exit 2."""
    try:
        yield
    except DPMFError as exc:
        _fail(str(exc))
    except MemoryError:
        _fail(f"out of memory: the computation needs more memory than this machine has; {hint}")


def _hide_flag_types(command, ctx) -> None:
    """Plain on/off flags take no value: show no ``<bool>`` type for them in ``--help``."""
    for param in command.get_params(ctx):
        if getattr(param, "is_flag", False) and getattr(param, "metavar", None) is None:
            param.metavar = ""


if TyperCommand is not None:

    class Command(TyperCommand):
        """A typer command whose help shows no value type for flags."""

        def format_help(self, ctx, formatter):  # noqa: D102 - click API
            _hide_flag_types(self, ctx)
            return super().format_help(ctx, formatter)

    class Group(TyperGroup):
        """A typer group whose help (and whose commands' help) shows no value type for flags."""

        command_class = Command

        def format_help(self, ctx, formatter):  # noqa: D102 - click API
            _hide_flag_types(self, ctx)
            return super().format_help(ctx, formatter)

else:  # pragma: no cover
    Command = Group = None


class _Typer(typer.Typer):
    def command(self, *args, **kwargs):  # noqa: D102 - typer API
        if Command is not None:
            kwargs.setdefault("cls", Command)
        return super().command(*args, **kwargs)


def typer_app(**kwargs) -> typer.Typer:
    """A ``typer.Typer`` whose group and commands show no ``<bool>`` type next to flags in help."""
    if Group is not None:
        kwargs.setdefault("cls", Group)
    return _Typer(**kwargs)


@contextmanager
def cli_progress(quiet: bool = False):
    """Progress of the command's long computations on stderr (:mod:`dpmf.progress`): a rich bar
    on a terminal, timestamped lines otherwise. ``--quiet`` or ``DPMF_PROGRESS=off`` turns it off;
    ``DPMF_PROGRESS=log`` / ``bar`` forces a mode, ``DPMF_PROGRESS_INTERVAL`` (seconds, default 10)
    sets how often a log line may come."""
    from dpmf import progress

    mode = os.environ.get("DPMF_PROGRESS", "auto").strip().lower() or "auto"
    if quiet:
        mode = "off"
    if mode not in ("auto", "bar", "log", "off"):
        mode = "auto"
    try:
        interval = max(float(os.environ.get("DPMF_PROGRESS_INTERVAL", "10")), 0.0)
    except ValueError:
        interval = 10.0
    console = err if mode == "bar" or (mode == "auto" and err.is_terminal) else None
    if mode == "auto":
        mode = "bar" if console is not None else "log"
    with progress.reporting(mode, interval=interval, console=console):
        yield
