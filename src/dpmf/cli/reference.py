"""The command-line reference page (``docs/cli.md``), generated from the typer app itself.

The page walks the click command tree of :data:`dpmf.cli.main.app` -- every command, its help,
its usage line, its arguments and options with their defaults -- so it cannot drift from the CLI:
``tests/cli/test_cli_reference.py`` fails when the committed page differs from what this module
produces now. Regenerate it after changing a command, an option or a help text with::

    python -m dpmf.cli.reference docs/cli.md

(``--check`` compares instead of writing: exit status 1 when the page is out of date.)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: the one command that rewrites the page
REGENERATE = "python -m dpmf.cli.reference docs/cli.md"

_EXTRAS = re.compile(r"^(.*?)\s{2}\[([^\[\]]*)\]$", re.S)  # "help  [default: x; required]" (click's format)
_ESCAPE = re.compile(r"([\\`*_\[\]|#$])")


def _md(text: str) -> str:
    """Plain text as Markdown that renders as the same text (no emphasis, links, HTML or math)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _ESCAPE.sub(r"\\\1", text)


def _paragraphs(help_text: str | None) -> list[str]:
    """A command's help (already reflowed, :func:`dpmf.cli.console.reflow_help`) as Markdown blocks."""
    blocks = []
    for para in (help_text or "").partition("\f")[0].split("\n\n"):
        para = para.strip("\n")
        if not para.strip():
            continue
        if para.startswith("\b"):  # kept line by line
            blocks.append("```text\n" + para[1:].strip("\n") + "\n```")
        else:
            blocks.append(_md(para))
    return blocks


def _parameter(param, ctx) -> str | None:
    """One bullet: ``--name <type>`` (default / required), then the help text."""
    record = param.get_help_record(ctx)
    if record is None or "--help" in param.opts:
        return None
    names, text = record
    notes = []
    m = _EXTRAS.match(text)
    if m:
        text = m.group(1)
        for extra in m.group(2).split("; "):
            key, _, value = extra.partition(": ")
            notes.append(f"default `{value}`" if key == "default" and value else _md(extra))
    line = f"- `{names}`" + (f" ({', '.join(notes)})" if notes else "")
    return line + (f": {_md(text.strip())}" if text.strip() else "")


def _command(cmd, ctx, level: int) -> list[str]:
    from dpmf.cli.console import hide_flag_types, short_choice_metavars

    hide_flag_types(cmd, ctx)  # what --help shows: no <bool> for flags, <name> + "Choices: ..."
    short_choice_metavars(cmd, ctx)
    path = ctx.command_path
    lines = ["#" * level + f" {path}", ""]
    for block in _paragraphs(cmd.help):
        lines += [block, ""]
    usage = f"Usage: {path} {' '.join(cmd.collect_usage_pieces(ctx))}"
    lines += ["```text", usage, "```", ""]
    params = [p for p in cmd.get_params(ctx) if not getattr(p, "hidden", False)]
    for title, kind in (("Arguments", "argument"), ("Options", "option")):
        bullets = [b for p in params if getattr(p, "param_type_name", "") == kind for b in [_parameter(p, ctx)] if b]
        if bullets:
            lines += [f"**{title}**", "", *bullets, ""]
    subs = [(n, c) for n, c in (getattr(cmd, "commands", None) or {}).items() if not getattr(c, "hidden", False)]
    if subs:
        lines += ["**Commands**", ""]
        for name, sub in subs:
            anchor = f"{path} {name}".lower().replace(" ", "-")
            first = (sub.help or "").partition("\f")[0].split("\n\n")[0].lstrip("\b").strip()
            lines.append(f"- [`{path} {name}`](#{anchor}): {_md(first)}")
        lines.append("")
        for name, sub in subs:
            lines += _command(sub, sub.context_class(sub, info_name=name, parent=ctx), level + 1)
    return lines


def markdown() -> str:
    """The reference page for the current ``dpmf`` command line (Markdown, ends with a newline)."""
    import typer

    from dpmf.cli.main import app

    root = typer.main.get_command(app)
    head = [
        "# Command-line reference",
        "",
        f"<!-- Generated from the dpmf command line by `{REGENERATE}`; do not edit by hand. -->",
        "",
        "Every `dpmf` command, its arguments and its options with their defaults, generated from the command "
        f"line itself (`{REGENERATE}` rewrites this page; a test fails when it is out of date). Every command "
        "also prints this with `--help`. Errors are one line on stderr and exit status 2; Ctrl-C exits with "
        "status 130. What the refusals and errors mean, and how to resume a long run: "
        "[Troubleshooting](troubleshooting.md).",
        "",
    ]
    body = _command(root, root.context_class(root, info_name="dpmf"), 2)
    text = "\n".join(head + body)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m dpmf.cli.reference [--check] [PATH]`` (PATH defaults to ``docs/cli.md``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    path = Path(args[0] if args else "docs/cli.md")
    page = markdown()
    if check:
        current = path.read_text() if path.exists() else ""
        if current != page:
            print(f"{path} is out of date; regenerate it with: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    from dpmf.files import atomic_write

    with atomic_write(path, "CLI reference") as fh:
        fh.write(page.encode("utf-8"))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
