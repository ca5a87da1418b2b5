"""Strategies by name, their summaries, and ``.npz`` persistence (used by ``dpmf strategy``).

``build(kind, steps, ...)`` makes a strategy; ``summarize(strategy, participation)`` reports its
sensitivity (exact or bound, with the method), the RMSE of the ``n`` prefix sums per unit noise
multiplier *with the strategy normalized to sensitivity 1*, and the max error; ``save``/``load``
write and read an ``.npz`` holding the encoder and a JSON metadata record (kind, parameters,
dpmf version), refusing foreign or corrupt files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from dpmf import validation as _v
from dpmf._version import __version__
from dpmf.errors import InvalidParameterError
from dpmf.strategies import error as _err
from dpmf.strategies.dense import DenseStrategy
from dpmf.strategies.fft import FFTMechanism
from dpmf.strategies.identity import Identity
from dpmf.strategies.sensitivity import sensitivity_squared
from dpmf.strategies.toeplitz import ToeplitzStrategy
from dpmf.strategies.tree import BinaryTree

KINDS = (
    "identity", "tree", "sqrt-toeplitz", "banded-toeplitz", "banded", "bsr", "bisr", "blt", "optimal", "fft", "matrix",
)
FILE_KIND = "dpmf.strategy"


def build(
    kind: str, steps: int, *, epochs: int = 1, bands: int | None = None, buffers: int = 2, matrix=None
):
    """A strategy of the given kind for ``steps`` steps (``optimal`` and ``banded-toeplitz`` use
    ``epochs``; ``banded-toeplitz``, ``bsr`` and ``bisr`` need ``bands``)."""
    n = _v.positive_int("steps", steps)
    if kind in ("banded-toeplitz", "banded", "bsr", "bisr"):
        from dpmf.strategies import banded

        if bands is None:
            raise InvalidParameterError(f"kind {kind!r} needs bands (1 <= bands <= steps)")
        if kind == "banded":
            from dpmf.strategies.bandmf import optimize_bandmf

            return optimize_bandmf(n, bands)
        if kind == "bsr":
            return banded.bsr(n, bands)
        if kind == "bisr":
            return banded.bisr(n, bands)
        return banded.optimize_banded_toeplitz(n, bands, epochs)
    if kind == "blt":
        from dpmf.strategies.blt import optimize_blt

        k = _v.positive_int("epochs", epochs)
        if n % k:
            raise InvalidParameterError(f"epochs must divide steps for the blt strategy, got steps={n}, epochs={k}")
        blt, _ = optimize_blt(n, _v.positive_int("buffers", buffers), k)
        return blt.to_toeplitz(n)
    if kind == "identity":
        return Identity(n)
    if kind == "tree":
        return BinaryTree(n)
    if kind == "sqrt-toeplitz":
        return ToeplitzStrategy.sqrt_prefix_sum(n)
    if kind == "fft":
        return FFTMechanism(n)
    if kind == "optimal":
        from dpmf.strategies.optimal import optimal_multi_epoch_gram

        k = _v.positive_int("epochs", epochs)
        if n % k:
            raise InvalidParameterError(f"epochs must divide steps for the optimal strategy, got steps={n}, epochs={k}")
        return DenseStrategy(optimal_multi_epoch_gram(n, k).C, name="optimal")
    if kind == "matrix":
        if matrix is None:
            raise InvalidParameterError("kind 'matrix' needs a matrix (an n x n lower-triangular encoder)")
        strat = DenseStrategy(np.asarray(matrix, dtype=np.float64), name="matrix")
        if strat.n != n:
            raise InvalidParameterError(f"the matrix is {strat.n} x {strat.n} but steps={n}")
        return strat
    raise InvalidParameterError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")


def _decoder(strategy) -> np.ndarray:
    if isinstance(strategy, BinaryTree):
        return strategy.optimal_decoder()
    if isinstance(strategy, FFTMechanism):
        return strategy.optimal_decoder()
    return _err.decoder(strategy.encoder())


def summarize(strategy, participation) -> dict:
    """Sensitivity and errors of ``strategy`` under ``participation`` (see module docstring)."""
    C = strategy.encoder()
    sens = sensitivity_squared(C, participation)
    B = _decoder(strategy)
    per_query = np.sum(B * B, axis=1)  # variance of each prefix sum per unit sigma, C as given
    s = sens.sensitivity
    return {
        "strategy": strategy.describe(),
        "participation": participation.describe(),
        "sensitivity": s,
        "sensitivity_exact": bool(sens.exact),
        "sensitivity_method": sens.method,
        "rmse": s * math.sqrt(float(per_query.mean())),
        "max_error": s * math.sqrt(float(per_query.max())),
    }


def save(strategy, path: str | Path) -> None:
    """Write ``strategy`` to ``path`` (``.npz``): its encoder plus JSON metadata."""
    meta = {"kind": FILE_KIND, "dpmf_version": __version__, "strategy": strategy.describe()}
    arrays = {"encoder": strategy.encoder()}
    if isinstance(strategy, ToeplitzStrategy):
        arrays["coefs"] = np.asarray(strategy.coefs)
    with open(path, "wb") as fh:
        np.savez_compressed(fh, metadata=np.array(json.dumps(meta)), **arrays)


def load(path: str | Path):
    """Read a strategy written by :func:`save`; refuses foreign, corrupt or inconsistent files."""
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["metadata"]))
            arrays = {k: np.asarray(data[k]) for k in data.files if k != "metadata"}
    except (OSError, KeyError, ValueError) as exc:
        raise InvalidParameterError(f"{path}: not a dpmf strategy file ({exc})") from None
    if meta.get("kind") != FILE_KIND or "encoder" not in arrays:
        raise InvalidParameterError(f"{path}: not a dpmf strategy file (kind {meta.get('kind')!r})")
    desc = meta.get("strategy", {})
    name, n = desc.get("name"), desc.get("n")
    C = arrays["encoder"]
    if not np.all(np.isfinite(C)):
        raise InvalidParameterError(f"{path}: corrupt strategy file (non-finite encoder)")
    if name == "identity":
        strat = Identity(n)
    elif name == "binary_tree":
        strat = BinaryTree(n)
    elif name == "fft":
        strat = FFTMechanism(n)
    elif name == "toeplitz" and "coefs" in arrays:
        strat = ToeplitzStrategy(arrays["coefs"], n)
    else:
        return DenseStrategy(C, name=str(name or "matrix"))
    if strat.encoder().shape != C.shape or not np.allclose(strat.encoder(), C, rtol=0, atol=1e-12):
        raise InvalidParameterError(f"{path}: corrupt strategy file (encoder does not match its metadata)")
    return strat
