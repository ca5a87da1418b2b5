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


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the examples write files
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
