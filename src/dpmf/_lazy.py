"""Lazy package attributes (PEP 562): ``import dpmf`` stays cheap, heavy dependencies load on use.

``import dpmf`` used to import every layer, and with them ``dp_accounting`` (which imports
``scipy.signal`` and ``scipy.stats``): about a second before the first line of any CLI command or
script could run, even for a one-line error. Packages now map their public names to the submodule
that defines them and import that submodule on first access; ``dpmf.account``,
``from dpmf.privacy import gaussian``, ``dpmf.strategies.Identity`` ... work exactly as before.
"""

from __future__ import annotations

import importlib
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
