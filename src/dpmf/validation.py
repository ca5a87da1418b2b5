"""Input checks shared by the public entry points (bottom layer, next to :mod:`dpmf.errors`).

Each checker returns the value converted to the canonical Python/numpy type, or raises
:class:`~dpmf.errors.InvalidParameterError` with a message naming the argument.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np

from dpmf.errors import InvalidParameterError


def _as_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (Real, np.floating, np.integer)):
        raise InvalidParameterError(f"{name} must be a real number, got {value!r}")
    out = float(value)
    if math.isnan(out):
        raise InvalidParameterError(f"{name} must be a number, got NaN")
    return out


def positive(name: str, value: object, *, allow_inf: bool = False) -> float:
    """A real number > 0 (finite unless ``allow_inf``)."""
    out = _as_float(name, value)
    if not out > 0 or (math.isinf(out) and not allow_inf):
        raise InvalidParameterError(f"{name} must be a finite number > 0, got {value!r}")
    return out


def noise_scale(name: str, value: object) -> float:
    """A noise multiplier (a Gaussian standard deviation): finite, > 0, and with a square that is a
    positive, finite float64 (``1.5e-154 <= value <= 1.3e154``): privacy losses divide by the
    variance ``value^2``, which underflows to 0 below that range and overflows above it."""
    out = positive(name, value)
    if out * out < 2.2250738585072014e-308:  # (sys.float_info.min: the smallest normal float64)
        raise InvalidParameterError(
            f"{name} {value!r} is too small: its square, the noise variance, underflows float64 (the privacy "
            f"losses divide by it); use {name} >= 1.5e-154 (epsilon is infinite long before)"
        )
    if math.isinf(out * out):
        raise InvalidParameterError(
            f"{name} {value!r} is too large: its square, the noise variance, overflows float64; use {name} <= "
            "1.3e154 (epsilon is 0 long before)"
        )
    return out


def non_negative(name: str, value: object) -> float:
    """A finite real number >= 0."""
    out = _as_float(name, value)
    if not (out >= 0 and math.isfinite(out)):
        raise InvalidParameterError(f"{name} must be a finite number >= 0, got {value!r}")
    return out


def open_unit(name: str, value: object) -> float:
    """A real number in the open interval (0, 1), e.g. a delta."""
    out = _as_float(name, value)
    if not 0 < out < 1:
        raise InvalidParameterError(f"{name} must be in (0, 1), got {value!r}")
    return out


def probability(name: str, value: object, *, allow_zero: bool = False) -> float:
    """A sampling probability in (0, 1] (or [0, 1] with ``allow_zero``)."""
    out = _as_float(name, value)
    ok = (0 <= out <= 1) if allow_zero else (0 < out <= 1)
    if not ok:
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise InvalidParameterError(f"{name} must be in {interval}, got {value!r}")
    return out


def positive_int(name: str, value: object) -> int:
    """An integer >= 1 (a float with an integral value is accepted)."""
    if isinstance(value, bool):
        raise InvalidParameterError(f"{name} must be an integer >= 1, got {value!r}")
    if isinstance(value, (Integral, np.integer)):
        out = int(value)
    elif isinstance(value, (Real, np.floating)) and float(value).is_integer():
        out = int(value)
    else:
        raise InvalidParameterError(f"{name} must be an integer >= 1, got {value!r}")
    if out < 1:
        raise InvalidParameterError(f"{name} must be an integer >= 1, got {value!r}")
    return out


def finite_array(name: str, value: object, *, ndim: int = 1) -> np.ndarray:
    """A float64 array of the given number of dimensions with only finite entries."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"{name} must be an array of numbers: {exc}") from None
    if arr.ndim != ndim:
        raise InvalidParameterError(f"{name} must be {ndim}-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise InvalidParameterError(f"{name} must not be empty")
    if not np.all(np.isfinite(arr)):
        raise InvalidParameterError(f"{name} must contain only finite numbers (no NaN/inf)")
    return arr


def distribution(
    name_values: str, values: object, name_probs: str, probs: object, *, atol: float = 1e-9
) -> tuple[np.ndarray, np.ndarray]:
    """A finite random variable: support ``values >= 0`` and probabilities summing to 1.

    Returns float64 copies. Probabilities are renormalized only within ``atol``.
    """
    v = finite_array(name_values, values)
    p = finite_array(name_probs, probs)
    if v.shape != p.shape:
        raise InvalidParameterError(
            f"{name_values} and {name_probs} must have the same length, got {v.size} and {p.size}"
        )
    if np.any(v < 0):
        raise InvalidParameterError(f"{name_values} must be >= 0, got min {v.min()!r}")
    if np.any((p < 0) | (p > 1 + atol)):
        raise InvalidParameterError(f"{name_probs} must lie in [0, 1], got {float(p.min())!r}..{float(p.max())!r}")
    p = np.minimum(p, 1.0)  # within atol of 1: float rounding of a probability, as for the sum below
    total = math.fsum(p.tolist())
    if abs(total - 1.0) > atol:
        raise InvalidParameterError(f"{name_probs} must sum to 1, got {total!r}")
    return v.copy(), p / total
