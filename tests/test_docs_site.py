"""The documentation site runs: every code block in ``docs/**/*.md``, and ``mkdocs build --strict``.

How a page's blocks are checked (the conventions ``docs/index.md``'s sources follow):

* ```` ```python ```` blocks run in order, in one namespace per page (later blocks see earlier
  names), in a temporary working directory shared by the page's blocks.
* A ```` ```text ```` block that follows a ``python`` block with only blank lines between is that
  block's expected standard output, compared like a doctest (``...`` matches anything, whitespace
  is normalized).
* ```` ```console ```` blocks hold ``$ dpmf ...`` commands (``\\`` continues a line) each followed
  by its expected standard output, compared the same way. Commands run in-process through the
  typer app (``dpmf.cli.main.app``) and must exit with status 0.
* ```` ```bash ```` blocks whose first command starts with ``dpmf `` run the same way (every line
  must then be a ``dpmf`` command or a comment; the output is not compared). Other ``bash`` blocks
  (``pip install ...``) are not run.
* ``<!-- skip: REASON -->`` on the line before a block leaves it out, with its reason. Use it
  sparingly: a skipped block is one nobody checks.
* A block that takes long runs in a fast form by default (:data:`FAST_FORMS`: a text of the page's
  code and what replaces it, e.g. fewer steps) and as written under ``-m slow``
  (``test_docs_page_blocks_run_as_written``). Every text must occur in its page, so a fast form
  follows the page.

README.md's own blocks are run by ``tests/test_docs.py``.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_SKIP = re.compile(r"<!--\s*skip:\s*(.+?)\s*-->\s*$")
_CHECKER = doctest.OutputChecker()
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclass
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    skip: str | None  # the reason, when marked <!-- skip: ... -->
    output: str | None = None  # for python blocks: the text block right after


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a page, with skip markers and the expected outputs attached."""
    text = path.read_text()
    found: list[tuple[Block, int, int]] = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = _SKIP.search(before)
        line = text.count("\n", 0, m.start()) + 1
        found.append((Block(m.group(1), m.group(2), line, skip.group(1) if skip else None), m.start(), m.end()))
    result = []
    for k, (block, _, end) in enumerate(found):
        prev = found[k - 1] if k else None
        if (
            block.lang == "text"
            and prev is not None
            and prev[0].lang == "python"
            and not text[prev[2] : found[k][1]].strip()
        ):
            prev[0].output = block.code
            continue
        result.append(block)
    return result


#: page (relative to docs/) -> [(a text of its code, the fast form the default test run uses)];
#: ``-m slow`` runs the page as written. Measured on a shared 2-core machine (CPU time):
FAST_FORMS: dict[str, list[tuple[str, str]]] = {
    # overview.md: BSR under balls-in-bins over 100 steps, 13 CPU-s (allocation_pld's Markov members);
    # 12 steps take 2 CPU-s through the same accountants
    "overview.md": [("bsr(100, 4), BallsInBinsSampling(epochs=2, steps=100)",
                     "bsr(12, 4), BallsInBinsSampling(epochs=2, steps=12)")],
}


def fast_form(code: str, forms: list[tuple[str, str]], used: set[str]) -> str:
    """``code`` with each text of ``forms`` replaced by its fast form; the texts found go in ``used``."""
    for text, fast in forms:
        if text in code:
            code = code.replace(text, fast)
            used.add(text)
    return code


def _same(expected: str, got: str) -> bool:
    return _CHECKER.check_output(expected.strip() + "\n", got.strip() + "\n", _FLAGS)


def _commands(code: str) -> list[tuple[str, str]]:
    """``(command, expected output)`` pairs of a console block (``$ `` prompts, ``\\`` joins)."""
    pairs: list[list] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            cmd = line[2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
            pairs.append([cmd, []])
        elif pairs:
            pairs[-1][1].append(line)
        i += 1
    return [(c, "\n".join(out)) for c, out in pairs]


def _bash_commands(code: str) -> list[str]:
    cmds, cur = [], ""
    for raw in code.splitlines():
        line = raw.strip()
        if not cur and (not line or line.startswith("#")):
            continue
        cur = cur + " " + line if cur else line
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
            continue
        cmds.append(cur.split(" #")[0].strip())
        cur = ""
    return cmds


def run_cli(command: str) -> str:
    """Run one ``dpmf ...`` command line in-process; return its standard output."""
    from typer.testing import CliRunner

    from dpmf.cli.main import app

    args = shlex.split(command)
    assert args[0] == "dpmf", f"not a dpmf command: {command!r}"
    if any(a in {"|", ">", ">>", "&&", ";", "<"} for a in args):
        raise AssertionError(f"shell operators are not run in docs blocks: {command!r}")
    res = CliRunner().invoke(app, args[1:])
    if res.exit_code != 0:
        raise AssertionError(
            f"{command!r} exited with {res.exit_code}:\n{res.output}\n{res.exception!r}"
        )
    return res.stdout


def run_page(path: Path, workdir: Path, fast: bool = True) -> int:
    """Run every block of one page in ``workdir`` (``fast``: in the fast forms of :data:`FAST_FORMS`);
    returns how many ran."""
    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    rel = path.relative_to(ROOT)
    forms = FAST_FORMS.get(path.relative_to(DOCS).as_posix(), []) if fast and path.is_relative_to(DOCS) else []
    used: set[str] = set()
    for block in blocks(path):
        where = f"{rel}:{block.line}"
        if block.skip is not None:
            continue
        if block.lang == "python":
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                exec(compile(fast_form(block.code, forms, used), str(where), "exec"), namespace)
            if block.output is not None and not _same(block.output, buf.getvalue()):
                raise AssertionError(f"{where}: output differs.\nexpected:\n{block.output}\ngot:\n{buf.getvalue()}")
            ran += 1
        elif block.lang == "console":
            pairs = _commands(block.code)
            assert pairs, f"{where}: a console block without a '$ dpmf' command"
            for cmd, expected in pairs:
                got = run_cli(cmd)
                if expected.strip() and not _same(expected, got):
                    raise AssertionError(f"{where}: output of {cmd!r} differs.\nexpected:\n{expected}\ngot:\n{got}")
            ran += 1
        elif block.lang == "bash":
            cmds = _bash_commands(block.code)
            if cmds and cmds[0].startswith("dpmf "):
                for cmd in cmds:
                    run_cli(cmd)
                ran += 1
    missing = [text for text, _ in forms if text not in used]
    assert not missing, f"{rel}: FAST_FORMS texts no longer in the page's code: {missing}"
    return ran


PAGES = sorted(DOCS.rglob("*.md"))


def test_docs_pages_found():
    names = {p.relative_to(DOCS).as_posix() for p in PAGES}
    assert {"index.md", "getting-started.md", "concepts.md", "accountants.md", "design.md"} <= names
    assert len([n for n in names if n.startswith("tutorials/")]) >= 6


def test_block_parser(tmp_path):
    page = (
        "intro\n\n```python\nprint(1 + 1)\n```\n\n```text\n2\n```\n\n<!-- skip: needs a cluster -->\n"
        "```console\n$ dpmf --version\ndpmf ...\n```\n\n```bash\ndpmf account \\\n  --json  # c\n```\n"
    )
    path = tmp_path / "probe.md"
    path.write_text(page)
    got = blocks(path)
    assert [(b.lang, b.skip, b.output and b.output.strip()) for b in got] == [
        ("python", None, "2"),
        ("console", "needs a cluster", None),
        ("bash", None, None),
    ]
    assert _commands("$ dpmf a \\\n  --b 1\nout\n$ dpmf c\n") == [("dpmf a --b 1", "out"), ("dpmf c", "")]
    assert _bash_commands("# x\ndpmf a \\\n  --b 1  # note\n") == ["dpmf a --b 1"]
    assert _same("epsilon = 2.12...", "epsilon = 2.12452\n") and not _same("2.13", "2.12")


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(DOCS).as_posix() for p in PAGES])
def test_docs_page_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # pages write files (strategies, checkpoints, ledgers, plots)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("DPMF_CACHE_DIR", str(tmp_path / "cache"))  # a first run, as a new user sees it
    run_page(page, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(FAST_FORMS))
def test_docs_page_blocks_run_as_written(page, tmp_path, monkeypatch):
    """The pages the default run checks in a fast form, as a reader runs them."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("DPMF_CACHE_DIR", str(tmp_path / "cache"))
    run_page(DOCS / page, tmp_path, fast=False)


def test_mkdocs_build_strict(tmp_path):
    if not all(_has_module(m) for m in ("mkdocs", "material", "mkdocstrings_handlers.python")):
        pytest.skip('mkdocs is not installed (pip install -e ".[docs]")')
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )
    assert res.returncode == 0, f"mkdocs build --strict failed:\n{res.stdout}\n{res.stderr}"
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "api" / "accounting" / "index.html").exists()


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
