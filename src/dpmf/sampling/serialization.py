"""Sampling schemes back from their descriptions: ``scheme_from_dict(s.describe()) == s``.

Every scheme of :mod:`dpmf.sampling.schemes` is a frozen dataclass whose ``describe()`` carries
its ``name`` and every constructor field (plus derived values such as b-min-sep's
``participation_rate``). :func:`scheme_from_dict` picks the class by ``name``, checks the type of
every field, builds the scheme (which validates the values) and refuses a description that differs
from what the rebuilt scheme describes (an edited derived value, an unknown key). Fields that have
a default may be missing (descriptions written before the field existed). Every refusal is an
:class:`~dpmf.errors.InvalidParameterError` naming the key.

>>> import json
>>> from dpmf.sampling import MinSepSampling, scheme_from_dict
>>> s = MinSepSampling(0.02, 100, 10, warm_start=True, max_batch_size=40, dataset_size=1000)
>>> scheme_from_dict(json.loads(json.dumps(s.describe()))) == s
True
>>> scheme_from_dict({"name": "poisson", "sampling_prob": "0.1", "steps": 10})
Traceback (most recent call last):
...
dpmf.errors.InvalidParameterError: scheme 'poisson': key 'sampling_prob' must be a finite number, got '0.1'
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from numbers import Real

import numpy as np

from dpmf.errors import InvalidParameterError
from dpmf.sampling.schemes import SCHEMES

__all__ = ["scheme_from_dict", "SCHEME_NAMES"]

#: ``describe()["name"]`` -> scheme class.
SCHEME_NAMES = {cls.name: cls for cls in SCHEMES}

# The JSON type of every constructor field (by field name; shared across schemes).
_NUMBER, _INT, _BOOL, _STR, _OPT_INT = "number", "integer", "boolean", "string", "integer or null"
_FIELD_TYPES = {
    "sampling_prob": _NUMBER,
    "steps": _INT,
    "epochs": _INT,
    "cycle_length": _INT,
    "min_sep": _INT,
    "partition": _STR,
    "warm_start": _BOOL,
    "max_batch_size": _OPT_INT,
    "dataset_size": _OPT_INT,
    "max_user_examples": _INT,
    "warmup_steps": _INT,
    "num_selected": _INT,
    "fresh_slots": _BOOL,
}
_EXPECTED = {
    _NUMBER: "a finite number",
    _INT: "an integer",
    _OPT_INT: "an integer or null",
    _BOOL: "true or false",
    _STR: "a string",
}


def _is_int(v: object) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer))


def _type_ok(kind: str, v: object) -> bool:
    if kind == _NUMBER:
        return not isinstance(v, bool) and isinstance(v, Real) and math.isfinite(float(v))
    if kind == _INT:
        return _is_int(v)
    if kind == _OPT_INT:
        return v is None or _is_int(v)
    if kind == _BOOL:
        return isinstance(v, (bool, np.bool_))
    return isinstance(v, str)


def _short(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _jsonify(obj):
    return json.loads(json.dumps(obj))


def scheme_from_dict(d: Mapping):
    """The sampling scheme that ``d`` (a ``describe()`` dict, possibly through JSON) describes.

    Covers :class:`~dpmf.sampling.PoissonSampling`, :class:`~dpmf.sampling.FixedOrderSampling`,
    :class:`~dpmf.sampling.CyclicPoissonSampling` (both partitions),
    :class:`~dpmf.sampling.MinSepSampling` (cold or warm start, ``max_batch_size``,
    ``dataset_size``), :class:`~dpmf.sampling.BallsInBinsSampling` (``num_selected``,
    ``fresh_slots``; descriptions written before they existed load as 1 and False) and
    :class:`~dpmf.sampling.MultiAttributionMinSepSampling` (its ``Attribution`` is data given to
    ``batches``, not part of the scheme).

    >>> from dpmf.sampling import CyclicPoissonSampling
    >>> scheme_from_dict({"name": "cyclic-poisson", "sampling_prob": 0.1, "steps": 20, "cycle_length": 4})
    CyclicPoissonSampling(sampling_prob=0.1, steps=20, cycle_length=4, partition='equal', max_batch_size=None, dataset_size=None)
    >>> scheme_from_dict({"name": "b-min-sep", "sampling_prob": 0.1, "steps": 20, "min_sep": 0})
    Traceback (most recent call last):
    ...
    dpmf.errors.InvalidParameterError: scheme 'b-min-sep': min_sep must be an integer >= 1, got 0
    """
    if not isinstance(d, Mapping):
        raise InvalidParameterError(f"a sampling scheme description must be a dict, got {type(d).__name__}")
    name = d.get("name")
    what = f"scheme {name!r}" if isinstance(name, str) else "scheme description"
    if "name" not in d:
        raise InvalidParameterError(f"{what}: key 'name' is missing")
    if not isinstance(name, str) or name not in SCHEME_NAMES:
        raise InvalidParameterError(
            f"{what}: key 'name' must be one of {sorted(SCHEME_NAMES)}, got {_short(name)}"
        )
    cls = SCHEME_NAMES[name]
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise InvalidParameterError(f"{what}: key {f.name!r} is missing")
            continue
        value = d[f.name]
        kind = _FIELD_TYPES.get(f.name)
        if kind is not None and not _type_ok(kind, value):
            raise InvalidParameterError(f"{what}: key {f.name!r} must be {_EXPECTED[kind]}, got {_short(value)}")
        kwargs[f.name] = value
    try:
        scheme = cls(**kwargs)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"{what}: {exc}") from None
    except (TypeError, ValueError, ArithmeticError) as exc:  # defensive: never a raw error
        raise InvalidParameterError(f"{what}: invalid description ({type(exc).__name__}: {exc})") from None
    given, rebuilt = _jsonify(dict(d)), _jsonify(scheme.describe())
    for key, value in given.items():
        if key not in rebuilt:
            raise InvalidParameterError(f"{what}: the description has an unknown key {key!r}")
        if value != rebuilt[key] and not _close_derived(key, value, rebuilt[key]):
            raise InvalidParameterError(
                f"{what}: the description does not match the scheme it describes: key {key!r} is "
                f"{_short(value)} there, {_short(rebuilt[key])} rebuilt"
            )
    return scheme


def _close_derived(key: str, given: object, rebuilt: object) -> bool:
    # derived floats (b-min-sep's participation_rate) are recomputed from the fields; a report
    # written by another numpy/python may differ in the last bit
    if key != "participation_rate" or not all(isinstance(v, float) for v in (given, rebuilt)):
        return False
    return math.isclose(given, rebuilt, rel_tol=1e-12, abs_tol=0.0)
