"""Shared consoles, the one-line error exit of the ``dpmf`` CLI, and the one map from library
argument names to command-line options.

Every command prints a library error through :func:`fail`, which rewrites the argument names the
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
from dpmf.progress import PROGRESS_MODES, settings as progress_settings  # noqa: F401 (their home: dpmf.progress)

try:  # typer >= 0.16 vendors click and has its own command classes
    from typer.core import TyperCommand, TyperGroup
except ImportError:  # pragma: no cover
    TyperCommand = TyperGroup = None

#: characters dpmf's output may contain, and the ASCII each degrades to where the output encoding
#: cannot take it (accented letters lose their accent through Unicode decomposition instead)
_ASCII_FALLBACK = {
    "\u2014": "--", "\u2013": "-", "\u2212": "-", "\u2010": "-", "\u2011": "-", "\u2026": "...",
    "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00ab": '"', "\u00bb": '"',
    "\u2264": "<=", "\u2265": ">=", "\u2260": "!=", "\u2248": "~", "\u00b1": "+/-", "\u00d7": "x",
    "\u00b7": ".", "\u2022": "*", "\u2192": "->", "\u2190": "<-", "\u21d2": "=>", "\u221e": "inf",
    "\u221a": "sqrt", "\u2229": "&", "\u222a": "|", "\u2016": "||", "\u00a7": "Sec.", "\u00b0": "deg",
    "\u03b5": "eps", "\u03b4": "delta", "\u03c3": "sigma", "\u03bc": "mu", "\u00b5": "mu",
    "\u03b1": "alpha", "\u03bb": "lambda", "\u00a0": " ", "\u2713": "ok", "\u2717": "x",
    "\u2501": "-", "\u2500": "-", "\u2578": "-", "\u257a": "-", "\u2588": "#", "\u2502": "|",
}


def _ascii_degrade(exc: UnicodeError):
    """Codec error handler ``"dpmf-ascii"``: each character the output encoding cannot take
    becomes ASCII (:data:`_ASCII_FALLBACK`, else its decomposition without accents: "Rényi" ->
    "Renyi", else ``?``), so dpmf writes in a C/ASCII locale instead of failing mid-line."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    import unicodedata

    pieces = []
    for ch in exc.object[exc.start:exc.end]:
        sub = _ASCII_FALLBACK.get(ch)
        if sub is None:
            sub = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode("ascii") or "?"
        pieces.append(sub)
    return "".join(pieces), exc.end


#: Python's own error handlers of stdout/stderr (``strict``; ``backslashreplace`` on stderr;
#: ``surrogateescape`` in the POSIX locale): these are replaced, a handler the user chose is kept
_DEFAULT_ERRORS = ("strict", "backslashreplace", "surrogateescape")


def degrade_unencodable_output(*streams) -> None:
    """Make ``streams`` (default: ``sys.stdout`` and ``sys.stderr``) degrade characters their
    encoding cannot take to ASCII (:func:`_ascii_degrade`) instead of raising
    ``UnicodeEncodeError``: ``PYTHONIOENCODING=ascii`` or a minimal container's locale. Streams
    whose encoding takes every character (UTF-8), or that cannot be reconfigured, are left alone."""
    import codecs

    try:
        codecs.lookup_error("dpmf-ascii")
    except LookupError:
        codecs.register_error("dpmf-ascii", _ascii_degrade)
    for stream in streams or (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None)
        reconfigure = getattr(stream, "reconfigure", None)
        if not encoding or reconfigure is None:
            continue
        try:
            if codecs.lookup(encoding).name == "utf-8" or getattr(stream, "errors", "strict") not in _DEFAULT_ERRORS:
                continue  # UTF-8 takes every character; a chosen handler (replace, ...) is the user's
            reconfigure(errors="dpmf-ascii")
        except (LookupError, ValueError, OSError, AttributeError):  # pragma: no cover - odd streams
            continue


degrade_unencodable_output()

#: stdout: the terminal's width (or $COLUMNS when set); 120 columns into a pipe or file
out = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else 120)
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


def fail(message: str) -> None:
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
        fail(str(exc))
    except MemoryError:
        fail(f"out of memory: the computation needs more memory than this machine has; {hint}")


def note_workers(workers) -> None:
    """One ``note:`` line on stderr when ``--workers`` asks for more processes than this machine's
    CPUs: the library starts at most that many (and never more than there are tasks), so the
    user learns why fewer processes run (:func:`dpmf.resources.workers_note`)."""
    from dpmf.resources import workers_note

    note = workers_note(workers)
    if note:
        err.print(f"note: {note}", highlight=False, markup=False)


def hide_flag_types(command, ctx) -> None:
    """Plain on/off flags take no value: show no ``<bool>`` type for them in ``--help``."""
    for param in command.get_params(ctx):
        if getattr(param, "is_flag", False) and getattr(param, "metavar", None) is None:
            param.metavar = ""


#: a list of choices longer than this is shown as ``<name>`` (the choices go into the help text),
#: so the options table keeps room for the help and never cuts an option name
_LONGEST_CHOICE_METAVAR = 16


def param_choices(param) -> list[str]:
    """The values a command-line parameter accepts when it is a choice (an Enum), else ``[]``."""
    desc = getattr(param, "type_descriptor", None)  # typer >= 0.20 describes types itself
    if desc is not None:
        found = desc.choices if getattr(desc, "is_choice", False) else None
    else:  # pragma: no cover - click's own parameters
        found = getattr(getattr(param, "type", None), "choices", None)
    return [str(getattr(c, "value", c)) for c in found or ()]


def short_choice_metavars(command, ctx) -> None:
    """An option with many choices shows ``<name>`` as its value and lists the choices in its help
    (``Choices: a, b, c.`` unless the help already names every one), instead of a long
    ``<a|b|c|...>`` that squeezes the help column and gets folded mid-word at 80 columns."""
    for param in command.get_params(ctx):
        choices = param_choices(param)
        if not choices or getattr(param, "metavar", None) is not None:
            continue
        if len("|".join(choices)) + 2 <= _LONGEST_CHOICE_METAVAR:
            continue
        param.metavar = "<name>"
        help_text = param.help or ""
        if not all(re.search(rf"(?<![\w-]){re.escape(c)}(?![\w-])", help_text) for c in choices):
            param.help = (help_text.rstrip() + " " if help_text else "") + f"Choices: {', '.join(choices)}."


def reflow_help(text: str | None) -> str | None:
    """A command's help (its docstring) with the line breaks inside each paragraph removed, so the
    terminal wraps sentences at its own width: typer's rich help keeps a docstring's hard line
    breaks after the first paragraph, which breaks sentences mid-line at 80 columns. A paragraph
    that starts with ``\\b`` (click's "do not rewrap" marker) keeps its lines."""
    if not text:
        return text
    import inspect

    body, sep, tail = inspect.cleandoc(text).partition("\f")
    paragraphs = []
    for para in re.split(r"\n[ \t]*\n", body.strip()):
        if para.startswith("\b"):
            paragraphs.append(para)
        else:
            paragraphs.append(" ".join(line.strip() for line in para.splitlines() if line.strip()))
    return "\n\n".join(paragraphs) + sep + tail


#: below this many columns help is plain click text (option, then its help, wrapped): typer's rich
#: options table has no room for its columns there and cuts option names and values
_NARROW_HELP = 80


def _format_help(command, base, ctx, formatter) -> None:
    """``--help`` of a dpmf command or group: typer's rich panels, plain text on a narrow terminal."""
    from rich.console import Console

    hide_flag_types(command, ctx)
    short_choice_metavars(command, ctx)
    width = Console().width  # (the terminal's, or $COLUMNS)
    if width < _NARROW_HELP:
        formatter.write(narrow_help(command, ctx, width))
        return None
    return base.format_help(command, ctx, formatter)


def narrow_help(command, ctx, width: int) -> str:
    """Help as plain lines for a narrow terminal: each option on its own line, its help below it,
    wrapped at spaces only (an option name or value is never split or cut)."""
    import textwrap

    def wrap(text: str, indent: int) -> list[str]:
        return textwrap.wrap(text, max(width - 1, indent + 20), break_on_hyphens=False,
                             break_long_words=False, initial_indent=" " * indent, subsequent_indent=" " * indent)

    lines = wrap(f"Usage: {ctx.command_path} {' '.join(command.collect_usage_pieces(ctx))}", 0)
    for para in (command.help or "").partition("\f")[0].split("\n\n"):
        lines.append("")
        lines += [" " * 2 + line for line in para[1:].splitlines()] if para.startswith("\b") else wrap(para, 2)
    sections = {"Arguments": [], "Options": []}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is not None:
            where = "Options" if getattr(param, "param_type_name", "") == "option" else "Arguments"
            sections[where].append(record)
    commands = getattr(command, "commands", None) or {}
    if commands:
        sections["Commands"] = [(name, (sub.help or "").split("\n\n")[0]) for name, sub in commands.items()
                                if not getattr(sub, "hidden", False)]
    for title, records in sections.items():
        if records:
            lines += ["", f"{title}:"]
            for name, text in records:
                lines += wrap(name, 2) + wrap(text, 6)
    return "\n".join(lines) + "\n"


if TyperCommand is not None:

    class Command(TyperCommand):
        """A typer command whose help shows no value type for flags, short value names for long
        lists of choices, and docstring paragraphs wrapped at the terminal's width."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.help = reflow_help(self.help)

        def format_help(self, ctx, formatter):  # noqa: D102 - click API
            return _format_help(self, TyperCommand, ctx, formatter)

    class Group(TyperGroup):
        """A typer group whose help (and whose commands' help) shows no value type for flags."""

        command_class = Command

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.help = reflow_help(self.help)

        def format_help(self, ctx, formatter):  # noqa: D102 - click API
            return _format_help(self, TyperGroup, ctx, formatter)

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
    sets how often a log line may come; a bad value of either is refused (:func:`progress_settings`)."""
    from dpmf import progress

    mode, interval = progress_settings()
    if quiet:
        mode = "off"
    console = err if mode == "bar" or (mode == "auto" and err.is_terminal) else None
    if mode == "auto":
        mode = "bar" if console is not None else "log"
    with progress.reporting(mode, interval=interval, console=console):
        yield
