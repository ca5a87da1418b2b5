"""Lazy package attributes (PEP 562): ``import dpmf`` stays cheap, heavy dependencies load on use.

``import dpmf`` used to import every layer, and with them ``dp_accounting`` (which imports
``scipy.signal`` and ``scipy.stats``): about a second before the first line of any CLI command or
script could run, even for a one-line error. Packages now map their public names to the submodule
that defines them and import that submodule on first access; ``dpmf.account``,
``from dpmf.privacy import gaussian``, ``dpmf.strategies.Identity`` ... work exactly as before.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Callable


def attach(package: str, exports: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package`` whose public ``name`` lives in the module
    ``exports[name]`` (relative to ``package``, e.g. ``".gdp"``). A value, once imported, is cached
    in ``namespace`` (the package's globals), so ``__getattr__`` runs once per name."""

    def __getattr__(name: str):
        target = exports.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(target, package)
        value = module if target.lstrip(".") == name and not hasattr(module, name) else getattr(module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__


def exports_of(package: str, init_file: str) -> dict[str, str]:
    """``{name: relative module}`` from the ``if TYPE_CHECKING:`` block of ``package``'s
    ``__init__.py`` (``init_file``): ``from package.mod import a, b`` exports ``a`` and ``b`` from
    ``.mod``; ``from package import sub`` exports the submodule ``sub``. That block is then the one
    list of a package's public names, read by type checkers and IDEs and, through this function,
    by :func:`attach_stub` at run time (the idea of ``lazy_loader.attach_stub``, without a stub
    file)."""
    exports: dict[str, str] = {}
    for node in ast.parse(Path(init_file).read_text(encoding="utf-8")).body:
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            continue
        for imp in node.body:
            if not isinstance(imp, ast.ImportFrom) or imp.level or not imp.module:
                continue
            for alias in imp.names:
                if imp.module == package:
                    exports[alias.asname or alias.name] = "." + alias.name
                elif imp.module.startswith(package + "."):
                    exports[alias.asname or alias.name] = imp.module[len(package):]
    return exports


def attach_stub(package: str, init_file: str, namespace: dict) -> tuple[Callable, Callable, list[str]]:
    """``(__getattr__, __dir__, __all__)`` of a package whose public names are the imports of the
    ``if TYPE_CHECKING:`` block of its ``__init__.py`` (:func:`exports_of`, :func:`attach`)::

        __getattr__, __dir__, __all__ = attach_stub(__name__, __file__, globals())

        if TYPE_CHECKING:  # the public names, imported on first use
            from dpmf.privacy.gdp import gdp_mu
    """
    exports = exports_of(package, init_file)
    return (*attach(package, exports, namespace), list(exports))


class LazyModule:
    """A module imported on first attribute access: ``pld_pmf = LazyModule("dp_accounting.pld.pld_pmf")``
    then ``pld_pmf.DensePLDPmf`` imports it (``dp_accounting`` brings SciPy's signal and stats
    packages, ~0.5 s, which no error path and no matrix-only command needs)."""

    def __init__(self, name: str) -> None:
        self.__dict__["_name"] = name
        self.__dict__["_module"] = None

    def __getattr__(self, attr: str):
        module = self.__dict__["_module"]
        if module is None:
            module = importlib.import_module(self.__dict__["_name"])
            self.__dict__["_module"] = module
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.__dict__['_name']!r}>"
