"""The coverage guard every public accountant function goes through.

An accountant is sound only for the (strategy, sampling scheme) pairs its theorem covers; each
method module says which through ``supports(strategy, scheme) -> reason | None``, the same
function :mod:`dpmf.accounting.dispatch` uses to pick methods. :func:`guarded` wraps a method's
public functions (``account_*`` and ``calibrate_*``) so that calling one directly on a pair it does
not cover raises :class:`~dpmf.errors.UnsupportedConfigurationError` with the reason, before any
work: there is no way to obtain a certified report for a pair the method does not cover.

The wrapper also records, in the returned :class:`~dpmf.accounting.report.PrivacyReport`, the
options the method was called with that can change its value (``report.options``), so that a
saved report can be recomputed (:mod:`dpmf.accounting.verify`). Options that only change how the
work is executed (:data:`EXECUTION_OPTIONS`) are not recorded.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import numpy as np

from dpmf.accounting.report import PrivacyReport
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.sampling.schemes import SCHEMES

#: Options that change how a result is computed (processes, cluster, progress, caches), never its value.
EXECUTION_OPTIONS = frozenset({"workers", "scheduler", "callback", "cache_dir", "checkpoint"})

#: Marker recorded for an option whose value cannot be written to JSON (a user function).
NOT_RECORDABLE = "<not recordable: a Python object>"


def check_pair(
    name: str, supports: Callable[..., str | None], strategy, scheme, pair_options: dict | None = None
) -> None:
    """Raise unless method ``name`` covers ``(strategy, scheme)``.

    :class:`~dpmf.errors.InvalidParameterError` for a ``scheme`` that is not a dpmf sampling scheme or
    whose number of steps differs from the strategy's; :class:`~dpmf.errors.UnsupportedConfigurationError`
    with ``supports``' reason when the method does not apply.
    """
    if not (isinstance(strategy, (np.ndarray, list, tuple)) or callable(getattr(strategy, "describe", None))):
        raise InvalidParameterError(
            f"strategy must be a dpmf strategy (dpmf.strategies) or a 2-D numpy matrix, got {type(strategy).__name__}"
        )
    if not isinstance(scheme, SCHEMES):
        raise InvalidParameterError(
            f"scheme must be a dpmf.sampling scheme ({', '.join(s.__name__ for s in SCHEMES)}), "
            f"got {type(scheme).__name__}"
        )
    n = strategy.shape[1] if isinstance(strategy, np.ndarray) and strategy.ndim == 2 else getattr(strategy, "n", None)
    if isinstance(n, (int, np.integer)) and n != scheme.steps:
        raise InvalidParameterError(f"the strategy has n={n} steps but the sampling scheme has steps={scheme.steps}")
    why = supports(strategy, scheme, **(pair_options or {}))
    if why is not None:
        raise UnsupportedConfigurationError(f"method {name!r} does not apply to this strategy and sampler: {why}")


def _recordable(value):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (np.integer, np.floating)):
        return _recordable(value.item())
    if isinstance(value, (list, tuple, np.ndarray)):
        items = [_recordable(v) for v in (value.tolist() if isinstance(value, np.ndarray) else value)]
        return NOT_RECORDABLE if NOT_RECORDABLE in items else items
    return NOT_RECORDABLE


def recorded_options(options: dict) -> dict:
    """The value-affecting options of a call, JSON-ready (``None`` and execution options dropped)."""
    return {
        k: _recordable(v) for k, v in sorted(options.items()) if v is not None and k not in EXECUTION_OPTIONS
    }


def guarded(
    name: str,
    supports: Callable[..., str | None],
    *,
    hidden: tuple[str, ...] = (),
    pair_options: tuple[str, ...] = (),
):
    """Decorator for a public accountant function ``f(strategy, scheme, ...)`` (module docstring).

    ``hidden`` lists keyword arguments that are internal plumbing (e.g. a precomputed problem) and
    are not recorded as options; ``pair_options`` those that change which pairs the method covers
    (e.g. MMCC's ``adaptive``): they are passed on to ``supports``.
    """

    def decorate(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(strategy, scheme, *args, **kwargs):
            check_pair(name, supports, strategy, scheme, {k: kwargs[k] for k in pair_options if k in kwargs})
            out = func(strategy, scheme, *args, **kwargs)
            if isinstance(out, PrivacyReport) and out.method == name:
                recorded = recorded_options({k: v for k, v in kwargs.items() if k not in hidden})
                out = dataclasses.replace(out, options=recorded)
            return out

        wrapper.guarded_method = name  # lets tests enumerate the guarded public functions
        return wrapper

    return decorate


__all__ = ["check_pair", "guarded", "recorded_options", "EXECUTION_OPTIONS", "NOT_RECORDABLE"]
