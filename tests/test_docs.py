"""The documentation runs: docstring examples and the README's Python blocks."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import dpmf

README = Path(__file__).resolve().parents[1] / "README.md"


def _modules_with_examples() -> list[str]:
    """Every dpmf module whose source contains a doctest prompt (found, not listed by hand)."""
    names = []
    for info in pkgutil.walk_packages(dpmf.__path__, prefix="dpmf."):
        spec = importlib.util.find_spec(info.name)
        if spec and spec.origin and spec.origin.endswith(".py"):
            if ">>> " in Path(spec.origin).read_text():
                names.append(info.name)
    return sorted(names)


MODULES = _modules_with_examples()


def test_the_core_modules_have_examples():
    assert {"dpmf.privacy.gdp", "dpmf.privacy.mixture", "dpmf.accounting.dispatch"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0


#: The README's blocks in a fast form for the default run (``-m slow`` runs them as written;
#: tests/test_docs_site.py's FAST_FORMS for the docs pages): the toy plan's costly candidates get a
#: 1-second budget instead of 25 s (what they certify is checked by the planning tests).
README_FAST_FORMS = [("best = plan(run)[0]", "best = plan(run, budget=1)[0]")]


def _run_readme(tmp_path, monkeypatch, fast: bool) -> None:
    from test_docs_site import fast_form

    monkeypatch.chdir(tmp_path)  # the examples write files
    monkeypatch.setenv("DPMF_CACHE_DIR", str(tmp_path / "cache"))  # a first run, as a new user sees it
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    used: set[str] = set()
    for block in blocks:
        exec(compile(fast_form(block, README_FAST_FORMS if fast else [], used), "README.md", "exec"), {})
    assert not fast or used == {text for text, _ in README_FAST_FORMS}, "a fast form's text is no longer in README.md"


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    _run_readme(tmp_path, monkeypatch, fast=True)


@pytest.mark.slow
def test_readme_python_blocks_run_as_written(tmp_path, monkeypatch):
    _run_readme(tmp_path, monkeypatch, fast=False)


# ------------------------------------------------------------------ the docs against the CLI
DOCS = sorted((README.parent / "docs").rglob("*.md")) + [README]


def _cli_commands() -> dict:
    """``{"plan": {"--budget", ...}, "strategy build": {...}, ...}``: every command and its options."""
    import typer

    from dpmf.cli.main import app

    out = {}

    def walk(cmd, path):
        sub = getattr(cmd, "commands", None)
        if sub:
            for name, c in sub.items():
                walk(c, path + [name])
            return
        opts = {"--help"}
        for p in cmd.params:
            opts.update(o for o in list(p.opts) + list(p.secondary_opts) if o.startswith("--"))
        out[" ".join(path)] = opts

    walk(typer.main.get_command(app), [])
    return out


def _dpmf_commands(text: str):
    """Every ``dpmf ...`` command line in code blocks and code spans (continuation lines joined)."""
    chunks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S) + re.findall(r"`(dpmf [^`\n]+)`", text)
    for chunk in chunks:
        chunk = chunk.replace("\\\n", " ")
        for line in chunk.splitlines():
            m = re.search(r"(?:^|[\s;&|(])(?:\$ )?dpmf ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)(.*)", line)
            if m and not line.lstrip().startswith(("#", ">>>", "import", "from")):
                yield m.group(1), m.group(2)


def test_every_dpmf_command_in_the_docs_exists_with_its_options():
    commands = _cli_commands()
    checked, bad = 0, []
    for path in DOCS:
        for words, rest in _dpmf_commands(path.read_text(encoding="utf-8")):
            name = words if words in commands else words.split()[0]
            if name not in commands:
                if name not in {c.split()[0] for c in commands}:
                    bad.append(f"{path.name}: dpmf {words}: no such command")
                continue  # (a group named without its subcommand, e.g. "dpmf strategy --help")
            checked += 1
            for opt in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                if opt not in commands[name]:
                    bad.append(f"{path.name}: dpmf {name} {opt}")
    assert checked >= 20, checked
    assert not bad, bad


def test_every_accountant_is_selectable_from_the_cli():
    from dpmf.accounting.dispatch import METHODS
    from dpmf.cli.main import MethodName

    assert {m.value for m in MethodName} == {"auto", *METHODS}


def test_the_names_the_readme_says_dpmf_training_torch_exports_exist():
    pytest.importorskip("torch")
    import dpmf.training.torch as t

    text = README.read_text(encoding="utf-8")
    names = set(re.findall(r"`([A-Z][A-Za-z]+|[a-z_]+)`", text)) & set(t.__all__)
    assert "GhostClipper" in t.__all__ and hasattr(t, "GhostClipper")
    assert all(hasattr(t, n) for n in names)


# ------------------------------------------------------------------ the pages agree (issue 53 item 3)
TORCH_PAGES = [README, README.parent / "docs" / "getting-started.md", README.parent / "docs" / "tutorials" / "pytorch.md"]
CPU_FIRST = "pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"


def test_the_pages_agree_on_the_torch_build_the_extra_installs():
    """``.[torch]`` installs ``torch==2.13.0`` from PyPI: on Linux x86_64 the CUDA build (pip resolves
    it with triton and the NVIDIA CUDA 13 packages: ``pip install --isolated --dry-run
    --ignore-installed --report r.json torch==2.13.0``, 2026-12-02). Every page that says what the
    extra installs says so, with the same command for the CPU build, and the pin is pyproject's."""
    import tomllib

    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["torch"] == ["torch==2.13.0"] and "torch==2.13.0" in extras["test"]
    for page in TORCH_PAGES:
        text = " ".join(page.read_text(encoding="utf-8").split())
        assert ".[torch]" in text and "torch==2.13.0" in text, page.name
        assert "on Linux the CUDA build" in text and CPU_FIRST in text, page.name
        assert not re.search(r"installs the CPU build|\.\[torch\]\S* installs[^.]*CPU build", text), page.name


def test_the_docs_extra_installs_what_the_docs_configuration_needs():
    """mkdocstrings formats signatures (``separate_signature: true``) with Black or Ruff and only
    says so in a log line when neither is installed: ``.[docs]`` (and ``.[test]``, which builds the
    site) install one."""
    import tomllib

    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    if "separate_signature: true" in (README.parent / "mkdocs.yml").read_text():
        for extra in ("docs", "test"):
            assert any(re.match(r"(ruff|black)\b", req) for req in extras[extra]), extra
