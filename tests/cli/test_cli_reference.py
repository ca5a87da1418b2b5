"""docs/cli.md, the command-line reference, is generated from the typer app and cannot drift."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import typer

from dpmf.cli.main import app
from dpmf.cli.reference import REGENERATE, main, markdown

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cli.md"


def test_the_committed_cli_reference_is_what_the_cli_generates_now():
    expected = markdown()
    current = PAGE.read_text() if PAGE.exists() else ""
    if current != expected:
        diff = "".join(list(difflib.unified_diff(current.splitlines(True), expected.splitlines(True),
                                                 "docs/cli.md (committed)", "docs/cli.md (generated)"))[:40])
        raise AssertionError(f"docs/cli.md is out of date with the CLI; regenerate it with:\n\n    {REGENERATE}\n\n{diff}")


def test_the_reference_lists_every_command_and_every_option():
    page = markdown()

    def walk(cmd, path):
        yield path, cmd
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, [*path, name])

    commands = list(walk(typer.main.get_command(app), ["dpmf"]))
    assert len(commands) >= 15
    for path, cmd in commands:
        assert re.search(rf"^#+ {' '.join(path)}$", page, flags=re.M), path
        for param in cmd.params:
            for opt in param.opts:
                if opt != "--help" and opt.startswith("-"):
                    assert f"`{opt}" in page or f", {opt}" in page or f"/ {opt}" in page, (path, opt)
    assert "- `--sampling <name>` (default `poisson`)" in page
    assert "- `--noise-multiplier <float>` (required)" in page
    assert "- `--dataset-size <int>` (default `50000`)" in page


def test_check_mode_says_which_command_regenerates_the_page(tmp_path, capsys):
    stale = tmp_path / "cli.md"
    stale.write_text("# old\n")
    assert main(["--check", str(stale)]) == 1
    assert REGENERATE in capsys.readouterr().err
    assert main([str(stale)]) == 0 and stale.read_text() == markdown()
    assert main(["--check", str(stale)]) == 0


def test_the_reference_and_troubleshooting_pages_are_in_the_nav_and_the_readme():
    nav = (ROOT / "mkdocs.yml").read_text()
    readme = (ROOT / "README.md").read_text()
    for page in ("cli.md", "troubleshooting.md"):
        assert re.search(rf"^\s+- [^:]+: {page}$", nav, flags=re.M), page
        assert f"(docs/{page})" in readme, page
