"""Strategies by name, their summaries, and ``.npz`` persistence (used by ``dpmf strategy``).

``build(kind, steps, ...)`` makes a strategy; ``summarize(strategy, participation)`` reports its
sensitivity (exact or bound, with the method), the RMSE of the ``n`` prefix sums per unit noise
multiplier *with the strategy normalized to sensitivity 1*, and the max error (and the same for a
momentum / learning-rate workload, when one is given); ``save``/``load`` write and read an ``.npz``
holding the encoder and a JSON metadata record (kind, parameters, workload, dpmf version),
refusing foreign or corrupt files.

Workloads (multi-epoch MF paper Sec. 5.3, notes §2.3): ``workload_spec(momentum, learning_rates)``
describes ``A = tri(n) diag(lr) M_beta`` (:func:`dpmf.strategies.workloads.momentum_sgd`); the
``optimal`` kind is optimized for it (Newton on the dual, notes §4.3, any ``epochs``; or the
single-epoch fixed point of Denisov et al., notes §4.4, with ``solver="fixed-point"``). Other kinds
do not depend on the workload; it is recorded so that ``summarize`` reports their error on it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from dpmf import validation as _v
from dpmf._version import __version__
from dpmf.errors import InvalidParameterError
from dpmf.files import check_output_file, read_npz, reading, write_npz
from dpmf.strategies import error as _err
from dpmf.strategies.dense import DenseStrategy
from dpmf.strategies.fft import FFTMechanism
from dpmf.strategies.blt import BLT, BLTStrategy
from dpmf.strategies.identity import Identity
from dpmf.strategies.sensitivity import sensitivity_squared
from dpmf.strategies.toeplitz import ToeplitzStrategy
from dpmf.strategies.tree import BinaryTree
from dpmf.strategies.workloads import momentum_sgd

KINDS = (
    "identity", "tree", "sqrt-toeplitz", "banded-toeplitz", "banded", "bsr", "bisr", "band-inv", "blt", "optimal", "fft",
    "matrix",
)
FILE_KIND = "dpmf.strategy"
SOLVERS = ("newton", "fixed-point")
CONSTRAINTS = ("nonneg", "orthogonal", "all_signs")


def workload_spec(steps: int, momentum: float = 0.0, learning_rates: object = None) -> dict | None:
    """A validated JSON-able description of the SGD-with-momentum workload, or ``None`` for the
    plain prefix sum (``momentum = 0`` and all learning rates 1)."""
    n = _v.positive_int("steps", steps)
    if learning_rates is None and isinstance(momentum, (int, float)) and momentum == 0:
        return None  # the plain prefix sum (no n x n matrix to build for validation)
    A = momentum_sgd(n, momentum, learning_rates)  # validates momentum and learning_rates
    del A
    beta = float(momentum)
    lr = None if learning_rates is None else [float(x) for x in np.asarray(learning_rates, dtype=np.float64)]
    if beta == 0.0 and (lr is None or all(x == 1.0 for x in lr)):
        return None
    return {"kind": "momentum", "momentum": beta, "learning_rates": lr}


def workload_matrix(spec: dict | None, steps: int) -> np.ndarray | None:
    """The ``steps x steps`` matrix of a :func:`workload_spec` (``None``: the prefix sum)."""
    if spec is None:
        return None
    if not isinstance(spec, dict) or spec.get("kind") != "momentum":
        raise InvalidParameterError(f"workload must be None or a momentum workload spec, got {spec!r}")
    return momentum_sgd(steps, spec.get("momentum", 0.0), spec.get("learning_rates"))


def build(
    kind: str,
    steps: int,
    *,
    epochs: int = 1,
    bands: int | None = None,
    buffers: int = 2,
    matrix=None,
    workload: dict | None = None,
    solver: str = "newton",
    constraints: str = "nonneg",
    callback=None,
):
    """A strategy of the given kind for ``steps`` steps (``optimal``, ``blt``, ``band-inv`` and
    ``banded-toeplitz`` use ``epochs``; ``banded-toeplitz``, ``banded``, ``bsr``, ``bisr`` and
    ``band-inv`` need ``bands``: for ``band-inv`` the bands of ``C^{-1}``, BandInvMF, with
    ``constraints="nonneg"`` (default) keeping ``C >= 0`` through ``C^{-1}``'s off-diagonal
    coefficients ``<= 0`` and ``"all_signs"`` unconstrained). ``optimal`` is optimized for
    ``workload`` (a :func:`workload_spec`; default prefix sum) with ``solver`` ``"newton"`` (multi-epoch dual, ``constraints`` one of
    ``nonneg``/``orthogonal``/``all_signs``) or ``"fixed-point"`` (single epoch, §4.4);
    ``callback(iteration, loss, gap)`` reports its progress."""
    n = _v.positive_int("steps", steps)
    A = workload_matrix(workload, n)
    if solver not in SOLVERS:
        raise InvalidParameterError(f"solver must be one of {', '.join(SOLVERS)}; got {solver!r}")
    if constraints not in CONSTRAINTS:
        raise InvalidParameterError(f"constraints must be one of {', '.join(CONSTRAINTS)}; got {constraints!r}")
    if kind == "band-inv":
        from dpmf.strategies.bandinv import optimize_banded_inverse_toeplitz

        if bands is None:
            raise InvalidParameterError(f"kind {kind!r} needs bands (1 <= bands <= steps)")
        if constraints == "orthogonal":
            raise InvalidParameterError("kind 'band-inv' takes constraints 'nonneg' or 'all_signs', got 'orthogonal'")
        return optimize_banded_inverse_toeplitz(n, bands, epochs, nonnegative=constraints == "nonneg")
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
        from dpmf.strategies.optimal import optimal_multi_epoch_gram, single_epoch_optimal

        k = _v.positive_int("epochs", epochs)
        if n % k:
            raise InvalidParameterError(f"epochs must divide steps for the optimal strategy, got steps={n}, epochs={k}")
        target = n if A is None else A
        if solver == "fixed-point":
            if k != 1:
                raise InvalidParameterError(
                    f"solver 'fixed-point' is the single-epoch fixed point (epochs=1), got epochs={k}; "
                    "use solver 'newton' for several epochs"
                )
            res = single_epoch_optimal(target, callback=callback)
        else:
            res = optimal_multi_epoch_gram(target, k, constraints=constraints, callback=callback)
        return DenseStrategy(res.C, name="optimal")
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


def summarize(strategy, participation, workload: dict | None = None) -> dict:
    """Sensitivity and errors of ``strategy`` under ``participation`` (see module docstring).

    ``rmse`` / ``max_error``: the ``n`` prefix sums; with a momentum ``workload`` (a
    :func:`workload_spec`) also ``workload_rmse``, ``workload_max_error`` and
    ``workload_total_error`` (the square root of the paper's loss Eq. 4, Table 6's "Error"), all
    per unit noise multiplier at sensitivity 1."""
    C = strategy.encoder()
    sens = sensitivity_squared(C, participation)
    B = _decoder(strategy)
    per_query = np.sum(B * B, axis=1)  # variance of each prefix sum per unit sigma, C as given
    s = sens.sensitivity
    out = {
        "strategy": strategy.describe(),
        "participation": participation.describe(),
        "sensitivity": s,
        "sensitivity_exact": bool(sens.exact),
        "sensitivity_method": sens.method,
        "rmse": s * math.sqrt(float(per_query.mean())),
        "max_error": s * math.sqrt(float(per_query.max())),
    }
    A = workload_matrix(workload, strategy.n)
    if A is not None:
        if isinstance(strategy, (BinaryTree, FFTMechanism)):
            Bw = strategy.optimal_decoder(A)
        else:
            Bw = _err.decoder(C, A)
        pq = np.sum(Bw * Bw, axis=1)
        out["workload"] = workload
        out["workload_rmse"] = s * math.sqrt(float(pq.mean()))
        out["workload_max_error"] = s * math.sqrt(float(pq.max()))
        out["workload_total_error"] = s * math.sqrt(float(pq.sum()))
    return out


def save(strategy, path: str | Path, *, workload: dict | None = None) -> None:
    """Write ``strategy`` to ``path`` (``.npz``): its encoder plus JSON metadata (and the
    :func:`workload_spec` it is meant for, if any)."""
    meta = {"kind": FILE_KIND, "dpmf_version": __version__, "strategy": strategy.describe()}
    if workload is not None:
        workload_matrix(workload, strategy.n)  # validate
        meta["workload"] = workload
    arrays = {"encoder": strategy.encoder()}
    if isinstance(strategy, ToeplitzStrategy):
        arrays["coefs"] = np.asarray(strategy.coefs)
        if strategy.inverse_coefs is not None:
            arrays["inverse_coefs"] = np.asarray(strategy.inverse_coefs)
    check_output_file(path, "path")
    write_npz(path, {"metadata": np.array(json.dumps(meta)), **arrays}, "strategy file")


def _check_recorded_sha256(desc: dict, C: np.ndarray, where: str) -> None:
    """A dense encoder (or a stamped one's block) must still hash to the ``sha256`` its description
    recorded when the file was written (:func:`~dpmf.strategies.matrix_identity.matrix_sha256`);
    a file whose matrix was changed afterwards is refused, naming the file."""
    from dpmf.strategies.matrix_identity import matrix_sha256
    from dpmf.strategies.stamping import stamp

    if "sha256" not in desc:
        return  # a description without a recorded hash (nothing to verify)
    recorded, matrix, what = desc["sha256"], C, "encoder"
    if desc.get("name") == "stamped":
        bs, copies = desc.get("block_shape"), desc.get("copies")
        ok = isinstance(bs, list) and len(bs) == 2 and all(isinstance(k, int) and k >= 1 for k in bs)
        if not ok or not isinstance(copies, int) or copies < 1 or C.shape != (bs[0] * copies, bs[1] * copies):
            raise InvalidParameterError(f"{where}: corrupt strategy file (the stamped encoder does not match its "
                                        "block_shape and copies)")
        matrix, what = C[: bs[0], : bs[1]], "encoder's block"
        if not np.array_equal(stamp(matrix, copies), C):
            raise InvalidParameterError(f"{where}: corrupt strategy file (the encoder is not {copies} copies of its "
                                        "block: it was changed after the file was written)")
    actual = matrix_sha256(matrix)
    if actual != recorded:
        raise InvalidParameterError(
            f"{where}: corrupt strategy file (the {what} hashes to sha256 {actual[:16]}..., but the file records "
            f"{str(recorded)[:16]}...: the matrix or its record was changed after the file was written; rebuild it "
            "with 'dpmf strategy build')"
        )


def load(path: str | Path):
    """Read a strategy written by :func:`save`; refuses foreign, corrupt or inconsistent files."""
    return read(path)[0]


def read(path) -> tuple[object, dict | None]:
    """``(strategy, workload_spec)`` from a file written by :func:`save` (validated as in
    :func:`load`; the workload is ``None`` for the prefix sum). ``path`` is a path or a binary
    file object; any malformed file is an :class:`InvalidParameterError` naming it
    (:mod:`dpmf.files`)."""
    what = "dpmf strategy file"
    contents = read_npz(path, what, kind=FILE_KIND, required=("encoder",))
    meta, arrays = contents.metadata, contents.arrays
    with reading(path, what):
        desc = meta.get("strategy", {})
        if not isinstance(desc, dict):
            raise InvalidParameterError(f"{contents.path}: corrupt {what} (the strategy record is not an object)")
        name, n = desc.get("name"), desc.get("n")
        C = np.asarray(arrays["encoder"], dtype=np.float64)
        if C.ndim != 2 or C.size == 0:
            raise InvalidParameterError(f"{contents.path}: corrupt {what} (the encoder is not a matrix)")
        if not np.all(np.isfinite(C)):
            raise InvalidParameterError(f"{contents.path}: corrupt strategy file (non-finite encoder)")
        workload = meta.get("workload")
        if workload is not None:
            workload_matrix(workload, C.shape[1])
        if name == "identity":
            strat = Identity(n)
        elif name == "binary_tree":
            strat = BinaryTree(n, desc.get("scale", 1.0))
        elif name == "fft":
            strat = FFTMechanism(n)
        elif name == "band-inv" and "inverse_coefs" in arrays:
            from dpmf.strategies.bandinv import BandInvStrategy

            strat = BandInvStrategy.from_noising_coefficients(arrays["inverse_coefs"], n)
        elif name == "toeplitz" and "coefs" in arrays:
            strat = ToeplitzStrategy(arrays["coefs"], n, arrays.get("inverse_coefs"))
        elif name == "blt":
            blt = BLT(desc["buf_decay"], desc["output_scale"], nonnegative=bool(desc.get("nonnegative", True)))
            strat = BLTStrategy.from_blt(blt, n, desc.get("scale", 1.0))
        else:
            _check_recorded_sha256(desc, C, contents.path)
            return DenseStrategy(C, name=str(name or "matrix")), workload
        if strat.encoder().shape != C.shape or not np.allclose(strat.encoder(), C, rtol=0, atol=1e-12):
            raise InvalidParameterError(f"{contents.path}: corrupt strategy file (encoder does not match its metadata)")
    return strat, workload
