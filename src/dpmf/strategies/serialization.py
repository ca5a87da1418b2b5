"""Strategies back from their descriptions: ``strategy_from_dict(s.describe())`` rebuilds ``s``.

Every strategy's ``describe()`` is a small JSON-able dict that a :class:`~dpmf.PrivacyReport`
carries; :func:`strategy_from_dict` turns it back into the strategy it describes, so a saved report
can be re-checked (:func:`dpmf.accounting.verify.verify_report`). Structured strategies stay
structured: a Toeplitz strategy is rebuilt from its coefficients (``coefs``, exact float64: JSON
writes the shortest ``repr`` of a float, which reads back to the same double), a BLT from its
parameters, the binary tree and the FFT mechanism from ``n`` (and the tree's ``scale``).

Dense matrices (``DenseStrategy``, the block of a ``StampedEncoder``) are written inline when small
(at most :data:`INLINE_MAX_N` columns and twice as many rows) and always carry ``sha256``, the
SHA-256 of the matrix's float64 C-order bytes (:func:`matrix_sha256`). A larger matrix is found by
that hash, in ``matrices`` (arrays given by the caller) or in the ``.npz`` files of ``search_dir``
(``<sha256>.npz`` first, as :func:`save_matrices` writes it, then any other ``.npz``, e.g. a
``dpmf strategy build`` file), loaded with ``allow_pickle=False``. A missing matrix, a file named
by the hash that does not hold it, or an inline matrix that does not match its hash is refused.

Every refusal (unknown ``name``, missing key, wrong type, a value the strategy's own validation
rejects, a description that differs from what the rebuilt strategy describes) is an
:class:`~dpmf.errors.InvalidParameterError` naming the key.

>>> import json
>>> from dpmf.strategies import ToeplitzStrategy, strategy_from_dict
>>> s = ToeplitzStrategy.sqrt_prefix_sum(8)
>>> back = strategy_from_dict(json.loads(json.dumps(s.describe())))
>>> type(back).__name__, bool((back.coefs == s.coefs).all())
('ToeplitzStrategy', True)
>>> strategy_from_dict({"name": "identity"})
Traceback (most recent call last):
...
dpmf.errors.InvalidParameterError: strategy 'identity': key 'n' is missing
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from numbers import Real
from pathlib import Path

import numpy as np

from dpmf.errors import InvalidParameterError
from dpmf.files import check_output_dir, read_npz, write_npz
from dpmf.strategies.matrix_identity import INLINE_MAX_N, inline_matrix, matrix_sha256

__all__ = [
    "INLINE_MAX_N",
    "matrix_sha256",
    "inline_matrix",
    "strategy_from_dict",
    "participation_from_dict",
    "save_matrices",
    "find_matrix",
]

# ---------------------------------------------------------------------------------- field readers
class _Desc:
    """Typed access to the keys of one description, with errors naming the key."""

    def __init__(self, d: Mapping, what: str) -> None:
        self.d = d
        self.what = what

    def fail(self, msg: str) -> InvalidParameterError:
        return InvalidParameterError(f"{self.what}: {msg}")

    def has(self, key: str) -> bool:
        return key in self.d

    def raw(self, key: str):
        if key not in self.d:
            raise self.fail(f"key {key!r} is missing")
        return self.d[key]

    def int(self, key: str, *, minimum: int = 1) -> int:
        v = self.raw(key)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < minimum:
            raise self.fail(f"key {key!r} must be an integer >= {minimum}, got {v!r}")
        return int(v)

    def float(self, key: str) -> float:
        v = self.raw(key)
        if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(float(v)):
            raise self.fail(f"key {key!r} must be a finite number, got {v!r}")
        return float(v)

    def bool(self, key: str) -> bool:
        v = self.raw(key)
        if not isinstance(v, (bool, np.bool_)):
            raise self.fail(f"key {key!r} must be true or false, got {v!r}")
        return bool(v)

    def str(self, key: str) -> str:
        v = self.raw(key)
        if not isinstance(v, str) or not v:
            raise self.fail(f"key {key!r} must be a non-empty string, got {v!r}")
        return v

    def floats(self, key: str) -> np.ndarray:
        v = self.raw(key)
        if not isinstance(v, (list, tuple)) or not v or not all(_is_number(x) for x in v):
            raise self.fail(f"key {key!r} must be a non-empty list of finite numbers, got {_short(v)}")
        return np.array([float(x) for x in v], dtype=np.float64)

    def matrix(self, key: str) -> np.ndarray:
        v = self.raw(key)
        ok = isinstance(v, (list, tuple)) and v and all(isinstance(r, (list, tuple)) for r in v)
        if ok:
            width = len(v[0])
            ok = width > 0 and all(len(r) == width and all(_is_number(x) for x in r) for r in v)
        if not ok:
            raise self.fail(f"key {key!r} must be a matrix (a non-empty list of equal-length lists of finite numbers)")
        return np.array([[float(x) for x in r] for r in v], dtype=np.float64)

    def sha256(self, key: str = "sha256") -> str:
        v = self.raw(key)
        if not isinstance(v, str) or len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
            raise self.fail(f"key {key!r} must be a lowercase hex SHA-256 (64 characters), got {_short(v)}")
        return v


def _is_number(x: object) -> bool:
    return not isinstance(x, bool) and isinstance(x, Real) and math.isfinite(float(x))


def _short(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _jsonify(obj):
    return json.loads(json.dumps(obj))


# ---------------------------------------------------------------------------------- matrix lookup
def _load_npz_arrays(path: Path) -> dict[str, np.ndarray]:
    return read_npz(path, "matrix archive (.npz)", metadata=False).arrays


def _hash_if_shape(arr: np.ndarray, shape: tuple[int, int]) -> str | None:
    if arr.shape != shape or arr.dtype.kind not in "biuf":
        return None
    return matrix_sha256(arr)


def find_matrix(
    sha256: str,
    shape: tuple[int, int],
    *,
    matrices: Mapping | Iterable | None = None,
    search_dir: str | Path | None = None,
) -> np.ndarray:
    """The float64 matrix of the given ``shape`` whose :func:`matrix_sha256` is ``sha256``.

    Looks in ``matrices`` (a mapping or an iterable of arrays; keys do not matter, contents do),
    then in ``search_dir``: ``<sha256>.npz`` (which must hold it) and then every other ``.npz``
    there (unreadable ones are skipped). Files are read with ``allow_pickle=False``. Raises
    :class:`InvalidParameterError` when the matrix is nowhere or ``<sha256>.npz`` does not hold it.
    """
    shape = (int(shape[0]), int(shape[1]))
    if matrices is not None:
        values = matrices.values() if isinstance(matrices, Mapping) else matrices
        for value in values:
            try:
                arr = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError):
                continue
            if _hash_if_shape(arr, shape) == sha256:
                return np.array(arr)
    searched = ""
    if search_dir is not None:
        folder = Path(search_dir)
        if not folder.is_dir():
            raise InvalidParameterError(f"search_dir {str(folder)!r} is not a directory")
        named = folder / f"{sha256}.npz"
        if named.is_file():
            arrays = _load_npz_arrays(named)
            for arr in arrays.values():
                if _hash_if_shape(arr, shape) == sha256:
                    return np.asarray(arr, dtype=np.float64)
            raise InvalidParameterError(
                f"{named}: holds no {shape[0]} x {shape[1]} matrix with sha256 {sha256} (mismatching file)"
            )
        others = sorted(p for p in folder.glob("*.npz") if p != named)
        for path in others:
            try:
                arrays = _load_npz_arrays(path)
            except InvalidParameterError:
                continue
            for arr in arrays.values():
                if _hash_if_shape(arr, shape) == sha256:
                    return np.asarray(arr, dtype=np.float64)
        searched = f" (searched {len(others)} .npz file(s) in {str(folder)!r})"
    raise InvalidParameterError(
        f"the {shape[0]} x {shape[1]} matrix with sha256 {sha256} is not inline in the description and was "
        f"not found{searched}; pass matrices=... or search_dir=... (the CLI's --matrices DIR) holding an .npz "
        "with it, e.g. written by dpmf.strategies.serialization.save_matrices"
    )


def save_matrices(strategy: object, directory: str | Path) -> list[Path]:
    """Write the dense matrix a strategy's description references (``DenseStrategy.C``, the block
    of a ``StampedEncoder``) to ``directory/<sha256>.npz`` (key ``matrix``); returns the paths
    written (none for a structured strategy)."""
    from dpmf.strategies.dense import DenseStrategy
    from dpmf.strategies.stamping import StampedEncoder

    if isinstance(strategy, DenseStrategy):
        arrays = [strategy.C]
    elif isinstance(strategy, StampedEncoder):
        arrays = [strategy.block]
    else:
        return []
    folder = check_output_dir(directory, "directory")
    paths = []
    for arr in arrays:
        path = folder / f"{matrix_sha256(arr)}.npz"
        write_npz(path, {"matrix": np.ascontiguousarray(arr, dtype=np.float64)}, "matrix archive")
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------- builders
def _identity(r: _Desc, ctx: dict):
    from dpmf.strategies.identity import Identity

    return Identity(r.int("n"))


def _fft(r: _Desc, ctx: dict):
    from dpmf.strategies.fft import FFTMechanism

    return FFTMechanism(r.int("n"))


def _tree(r: _Desc, ctx: dict):
    from dpmf.strategies.tree import BinaryTree

    scale = r.float("scale") if r.has("scale") else 1.0
    return BinaryTree(r.int("n"), scale)


def _toeplitz(r: _Desc, ctx: dict):
    from dpmf.strategies.toeplitz import ToeplitzStrategy

    n = r.int("n")
    inv = r.floats("inverse_coefs") if r.has("inverse_coefs") else None
    return ToeplitzStrategy(r.floats("coefs"), n, inv)


def _band_inv(r: _Desc, ctx: dict):
    from dpmf.strategies.bandinv import BandInvStrategy

    return BandInvStrategy.from_noising_coefficients(r.floats("inverse_coefs"), r.int("n"))


def _blt(r: _Desc, ctx: dict):
    from dpmf.strategies.blt import BLT, BLTStrategy

    blt = BLT(r.floats("buf_decay"), r.floats("output_scale"), nonnegative=r.bool("nonnegative"))
    if not r.has("n"):  # the BLT itself (no number of steps)
        return blt
    n = r.int("n")
    scale = r.float("scale") if r.has("scale") else 1.0
    if scale <= 0:
        raise r.fail(f"key 'scale' must be > 0, got {scale!r}")
    coefs = r.floats("coefs") if r.has("coefs") else scale * blt.toeplitz_coefs(n)
    inv = r.floats("inverse_coefs") if r.has("inverse_coefs") else None
    return BLTStrategy(coefs, n, inv, blt=blt, scale=scale)


def _dense_matrix(r: _Desc, key: str, shape: tuple[int, int], ctx: dict) -> np.ndarray:
    sha = r.sha256()
    if r.has(key):
        arr = r.matrix(key)
        if arr.shape != shape:
            raise r.fail(f"key {key!r} has shape {arr.shape}, the description says {shape}")
        if matrix_sha256(arr) != sha:
            raise r.fail(f"key {key!r} does not match its sha256 (the description was edited)")
        return arr
    return find_matrix(sha, shape, matrices=ctx["matrices"], search_dir=ctx["search_dir"])


def _dense(r: _Desc, ctx: dict):
    from dpmf.strategies.dense import DenseStrategy

    shape = (r.int("rows"), r.int("n"))
    C = _dense_matrix(r, "matrix", shape, ctx)
    return DenseStrategy(C, adaptive=r.bool("adaptive"), name=r.str("name"))


def _stamped(r: _Desc, ctx: dict):
    from dpmf.strategies.stamping import StampedEncoder

    bs = r.raw("block_shape")
    if not (isinstance(bs, (list, tuple)) and len(bs) == 2 and all(
        not isinstance(k, bool) and isinstance(k, (int, np.integer)) and k >= 1 for k in bs
    )):
        raise r.fail(f"key 'block_shape' must be two integers >= 1, got {_short(bs)}")
    block = _dense_matrix(r, "block", (int(bs[0]), int(bs[1])), ctx)
    return StampedEncoder(block, r.int("copies"))


_BUILDERS = {
    "identity": _identity,
    "fft": _fft,
    "binary_tree": _tree,
    "toeplitz": _toeplitz,
    "blt": _blt,
    "band-inv": _band_inv,
    "stamped": _stamped,
}
#: ``class`` values of descriptions whose ``name`` is free (dense matrices).
_CLASSES = {"DenseStrategy": _dense}


def strategy_from_dict(
    d: Mapping,
    *,
    matrices: Mapping | Iterable | None = None,
    search_dir: str | Path | None = None,
):
    """The strategy that ``d`` (a ``describe()`` dict, possibly through JSON) describes.

    Handles every strategy class of :mod:`dpmf.strategies`: ``Identity``, ``ToeplitzStrategy``
    (also from ``bsr``, ``bisr``, ``optimize_banded_toeplitz``), ``BandInvStrategy``, ``BLTStrategy`` and ``BLT`` (a
    BLT description without ``n``), ``BinaryTree``, ``FFTMechanism``, ``DenseStrategy`` (optimal,
    BandMF, any matrix) and ``StampedEncoder``. ``matrices`` / ``search_dir`` supply dense
    matrices referenced by hash (:func:`find_matrix`). The rebuilt strategy must describe itself
    exactly as ``d`` does (up to JSON: tuples are lists), so an edited description is refused.

    >>> from dpmf.strategies import BinaryTree, bsr, strategy_from_dict
    >>> strategy_from_dict(BinaryTree(8, 0.5).describe())
    BinaryTree(n=8, scale=0.5)
    >>> d = bsr(16, 4).describe()
    >>> d["coefs"], d["band"]
    ([1.0, 0.5, 0.375, 0.3125], 4)
    >>> strategy_from_dict(dict(d, band=5))
    Traceback (most recent call last):
    ...
    dpmf.errors.InvalidParameterError: strategy 'toeplitz': the description does not match the strategy it
    describes: key 'band' is 5 there, 4 rebuilt
    """
    if not isinstance(d, Mapping):
        raise InvalidParameterError(f"a strategy description must be a dict, got {type(d).__name__}")
    name = d.get("name")
    what = f"strategy {name!r}" if isinstance(name, str) else "strategy description"
    r = _Desc(d, what)
    name = r.str("name")
    cls = d.get("class")
    if cls is not None:
        if not isinstance(cls, str) or cls not in _CLASSES:
            raise r.fail(f"key 'class' must be one of {sorted(_CLASSES)}, got {_short(cls)}")
        builder = _CLASSES[cls]
    elif name in _BUILDERS:
        builder = _BUILDERS[name]
    else:
        hint = ""
        if {"n", "adaptive", "nonnegative"} <= set(d):
            hint = " (a dense strategy description from an older dpmf: it carries no matrix, so it cannot be rebuilt)"
        raise r.fail(
            f"key 'name' must be one of {sorted(_BUILDERS)} (or a dense strategy with 'class': "
            f"'DenseStrategy'), got {name!r}{hint}"
        )
    ctx = {"matrices": matrices, "search_dir": search_dir}
    try:
        strategy = builder(r, ctx)
    except InvalidParameterError as exc:
        msg = str(exc)
        raise InvalidParameterError(msg if msg.startswith(what) else f"{what}: {msg}") from None
    except (TypeError, ValueError, ArithmeticError) as exc:  # defensive: never a raw error
        raise r.fail(f"invalid description ({type(exc).__name__}: {exc})") from None
    _check_same(r, _jsonify(dict(d)), _jsonify(strategy.describe()))
    return strategy


def _check_same(r: _Desc, given: dict, rebuilt: dict) -> None:
    if given == rebuilt:
        return
    for key in list(given) + [k for k in rebuilt if k not in given]:
        if key not in rebuilt:
            raise r.fail(f"the description has an unknown key {key!r}")
        if key not in given:
            raise r.fail(f"key {key!r} is missing")
        if given[key] != rebuilt[key]:
            raise r.fail(
                "the description does not match the strategy it describes: "
                f"key {key!r} is {_short(given[key])} there, {_short(rebuilt[key])} rebuilt"
            )


def participation_from_dict(d: Mapping):
    """The participation schema a ``Participation`` / ``FixedEpochParticipation`` ``describe()``
    dict describes (``"schema": "fixed-epoch"`` for the latter).

    >>> from dpmf.strategies import FixedEpochParticipation
    >>> participation_from_dict(FixedEpochParticipation(3, 2).describe())
    FixedEpochParticipation(max_participations=3, separation=2)
    """
    from dpmf.strategies.participation import Participation
    from dpmf.strategies.sensitivity import FixedEpochParticipation

    if not isinstance(d, Mapping):
        raise InvalidParameterError(f"a participation description must be a dict, got {type(d).__name__}")
    r = _Desc(d, "participation")
    schema = d.get("schema")
    if schema == "fixed-epoch":
        out = FixedEpochParticipation(r.int("max_participations"), r.int("separation"))
    elif schema is None:
        out = Participation(r.int("max_participations"), r.int("min_sep"))
    else:
        raise r.fail(f"key 'schema' must be 'fixed-epoch' or absent, got {_short(schema)}")
    _check_same(r, _jsonify(dict(d)), _jsonify(out.describe()))
    return out
