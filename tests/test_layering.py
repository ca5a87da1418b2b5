"""The package's import graph is one-way: lower layers never import higher ones.

Every ``import`` statement of every module is read (module level *and* inside functions: a lazy
import is still a dependency), and the layers of ``docs/design.md`` are checked:
accountants (``dpmf.accounting.<method>``) never import the dispatcher, the numerical core
(``privacy``, ``strategies``, ``sampling``) never imports ``accounting``, ``planning`` or the CLI,
and nothing below the CLI imports it. An import cycle between modules fails the last test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "dpmf"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute module name of ``from <module> import ...`` inside ``package``."""
    if node.level:
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module or ""


def _imports(path: Path) -> set[str]:
    """Every dpmf module ``path`` imports (absolute names; ``from X import y`` yields ``X.y`` when
    that is a module, else ``X``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("dpmf"))
        elif isinstance(node, ast.ImportFrom):
            mod = _from_module(node, package)
            if not mod.startswith("dpmf"):
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                found.add(sub if sub in MODULES else mod)
    return found


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def _violations(lower: str, higher: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{m} imports {dep}"
        for m, deps in GRAPH.items()
        if m == lower or m.startswith(lower + ".")
        for dep in deps
        if any(dep == h or dep.startswith(h + ".") for h in higher)
    )


ACCOUNTANTS = ["allocation", "mmcc", "montecarlo", "individual", "dpsgd", "unamplified", "reductions", "guard", "report"]


def test_the_graph_was_read():
    assert len(MODULES) > 50
    assert "dpmf.accounting.montecarlo" in GRAPH["dpmf.accounting.dispatch"]  # (dispatch uses it)


@pytest.mark.parametrize("name", ACCOUNTANTS)
def test_accountants_never_import_the_dispatcher(name):
    assert _violations(f"dpmf.accounting.{name}", ("dpmf.accounting.dispatch", "dpmf.planning", "dpmf.planner", "dpmf.cli")) == []


@pytest.mark.parametrize("name", ["privacy", "strategies", "sampling", "validation", "errors"])
def test_the_numerical_core_never_imports_higher_layers(name):
    assert _violations(f"dpmf.{name}", ("dpmf.accounting", "dpmf.planning", "dpmf.planner", "dpmf.cli", "dpmf.training")) == []


def test_nothing_below_the_cli_imports_it():
    assert [v for v in _violations("dpmf", ("dpmf.cli",)) if not v.startswith(("dpmf.cli", "dpmf.__main__"))] == []


def test_no_import_cycle_between_modules():
    """Cycles through a package ``__init__`` that only re-exports are not real dependencies, so
    the graph is taken between leaf modules (``__init__`` files are skipped)."""
    leaves = {m for m, p in MODULES.items() if p.name != "__init__.py"}
    graph = {m: {d for d in GRAPH[m] if d in leaves and d != m} for m in leaves}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (cycle := visit(d)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(leaves):
        if m not in state and (cycle := visit(m)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


# The house rules of docs/design.md ("One place for each idea"): what the redesign removed must not
# come back unnoticed.


def _private_imports() -> list[str]:
    found = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = _from_module(node, package)
                if not mod.startswith("dpmf"):
                    continue
                found += [f"{name} imports {mod}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    return sorted(found)


def test_no_private_name_is_imported_from_another_module():
    assert _private_imports() == []


def test_no_module_is_passed_as_a_value():
    offenders = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "modules" and getattr(node.value, "id", "") == "sys":
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


def test_no_function_is_longer_than_150_lines():
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 150:
                long.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert long == []
