"""The documentation runs: docstring examples and the README's Python blocks."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

import dpmf.accounting.dispatch
import dpmf.privacy.gdp
import dpmf.privacy.mixture

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize("module", [dpmf.privacy.gdp, dpmf.privacy.mixture, dpmf.accounting.dispatch])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the examples write files
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
