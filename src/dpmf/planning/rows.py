"""A row of ``dpmf plan`` that builds what it describes, and its file (``dpmf plan --export``).

A :class:`PlanRow` is one ranked configuration. Besides the names and numbers of the table it
carries everything needed to run it again:

* ``strategy_spec`` and ``scheme_spec``: the strategy's and the sampling scheme's ``describe()``
  dicts (:func:`~dpmf.strategies.serialization.strategy_from_dict` and
  :func:`~dpmf.sampling.serialization.scheme_from_dict` rebuild them exactly), and ``recipe``, how
  the planner built the strategy (:class:`~dpmf.planning.candidates.StrategySpec`);
* ``method`` and ``options``: the accountant that certified ``epsilon`` and its value-affecting
  options, so ``dpmf.account(strategy, scheme, row.noise_multiplier, row.delta, method=row.method,
  **row.options)`` recomputes ``row.epsilon`` (and ``epsilon_by_direction``) exactly;
* ``run``: the training run it was planned for (dataset size, batch size, epochs, target epsilon and
  delta, steps, sampling probability).

:meth:`PlanRow.build` returns ``(strategy, scheme, noise_multiplier)``;
``dpmf.training.torch.make_private(..., plan=row)`` trains exactly that
(:func:`dpmf.training.run_spec.run_spec_from_row`: one accountant evaluation re-checks the row, no
calibration). :func:`export_row` writes a row as JSON (``dpmf plan --export FILE``) and
:func:`load_row` reads it back (or a row of ``dpmf plan --json``).

Dense strategies (the optimal factorization) with more than
:data:`~dpmf.strategies.matrix_identity.INLINE_MAX_N` steps are described by the SHA-256 of their
matrix, not the matrix itself. A row from :func:`dpmf.planner.plan` keeps the matrix in memory
(:attr:`PlanRow.matrices`, never written to JSON); :func:`export_row` writes it next to the row as
``<sha256>.npz`` and :func:`load_row` finds it there; the plan cache keeps it in its folder. Failing
all of those, :meth:`PlanRow.build` rebuilds the strategy from ``recipe`` and uses it only if its
matrix has the very hash the row names.

Every refusal (a malformed or foreign row, a pruned row, a row from an older dpmf without specs) is
an :class:`~dpmf.errors.InvalidParameterError` or
:class:`~dpmf.errors.UnsupportedConfigurationError` that says what to do instead.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import NamedTuple

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError

__all__ = ["PlanRow", "BuiltRow", "export_row", "load_row", "row_from_json", "FORMAT", "FORMAT_VERSION"]

#: ``format`` of a row file (:func:`export_row`) and of a plan cache file.
FORMAT = "dpmf-plan-row"
#: 2: rows carry their strategy and scheme specs, the accountant options and the run (1: names only).
FORMAT_VERSION = 2
#: The keys of :attr:`PlanRow.run` (:meth:`dpmf.planning.candidates.TrainingRun.describe`).
RUN_KEYS = ("dataset_size", "batch_size", "epochs", "epsilon", "delta", "steps", "sampling_prob")


class BuiltRow(NamedTuple):
    """What :meth:`PlanRow.build` returns: ``strategy, scheme, noise_multiplier = row.build()``."""

    strategy: object
    scheme: object
    noise_multiplier: float


@dataclass(frozen=True)
class PlanRow:
    """One configuration: calibrated, or (``pruned``) shown to be worse than the best row.

    A calibrated row's ``epsilon <= target`` is the accountant's certified bound at
    ``noise_multiplier`` (an ESTIMATE when ``certified`` is False). A pruned row was not calibrated
    precisely: its accountant's epsilon at ``noise_multiplier`` (the noise at which it would tie
    the best row of an earlier wave) is already above the target, so it needs more noise and its
    prefix RMSE is larger than ``prefix_sum_rmse``, a lower bound; ``epsilon`` is the value at that
    noise (above the target). ``note`` says how the row was obtained when that is not plain. A *cut*
    row (``cut``) is one the plan's time budget stopped (:mod:`dpmf.planning.budget`): its noise is
    certified (epsilon <= target there), but not yet the smallest its accountant certifies.

    The specs, ``options``, ``epsilon_by_direction`` and ``run`` make the row rebuildable (module
    docstring); ``strategy_spec`` is ``None`` only for a pruned row whose strategy was never built
    (the optimal factorization pruned by a bound). ``matrices`` (dense matrices the strategy spec
    names by hash) and ``rank`` (1-based place among the ranked rows, when known) are not part of
    the row's value: not compared, not in :meth:`to_dict`."""

    strategy: str
    sampling: str
    method: str
    noise_multiplier: float
    epsilon: float
    certified: bool
    prefix_sum_rmse: float
    rmse_per_example_in_batch: float
    seconds: float
    pruned: bool = False
    cached: bool = False
    cut: bool = False
    label: str = ""
    note: str = ""
    strategy_spec: dict | None = None
    scheme_spec: dict | None = None
    recipe: dict | None = None
    options: dict = field(default_factory=dict)
    epsilon_by_direction: dict = field(default_factory=dict)
    run: dict | None = None
    matrices: tuple = field(default=(), compare=False, repr=False)
    rank: int | None = field(default=None, compare=False)

    @property
    def delta(self) -> float | None:
        """The delta of the run the row was planned for (``None`` without a run)."""
        return None if self.run is None else self.run["delta"]

    def to_dict(self) -> dict:
        """A JSON-ready dict of the row's value (everything but ``matrices`` and ``rank``)."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name in _VALUE_FIELDS}

    @classmethod
    def from_dict(cls, data) -> "PlanRow":
        """The row a :meth:`to_dict` dict (possibly through JSON) describes, or a row of ``dpmf plan
        --json`` (which also carries its ``rank``); every key checked
        (:class:`~dpmf.errors.InvalidParameterError` naming the key)."""
        return cls(**_checked(data))

    def describe_source(self) -> dict:
        """What a training report records about the row it trained (``diagnostics["training"]
        ["plan_row"]``): the row's names, accountant, noise, epsilon, run and rank."""
        out = {
            "label": self.label,
            "strategy": self.strategy,
            "sampling": self.sampling,
            "method": self.method,
            "noise_multiplier": self.noise_multiplier,
            "epsilon": self.epsilon,
            "certified": self.certified,
            "prefix_sum_rmse": self.prefix_sum_rmse,
            "run": copy.deepcopy(self.run),
        }
        if self.rank is not None:
            out["rank"] = self.rank
        return out

    def build(self, *, search_dir=None) -> BuiltRow:
        """``(strategy, scheme, noise_multiplier)``: the objects the row describes, rebuilt from its
        specs (module docstring for dense matrices; ``search_dir``: a folder holding
        ``<sha256>.npz``). A pruned row is refused: its noise multiplier is a bound, not a
        calibrated noise."""
        from dpmf.sampling.serialization import scheme_from_dict

        if self.pruned:
            raise UnsupportedConfigurationError(
                f"the plan row {self.strategy} / {self.sampling} is pruned: its noise multiplier "
                f"{self.noise_multiplier:.6g} is a lower bound on the noise it would need, not a calibrated noise, "
                "so it certifies nothing; pick a ranked row, or plan with prune=False (dpmf plan --no-prune) to "
                "calibrate this one"
            )
        if self.strategy_spec is None or self.scheme_spec is None:
            raise InvalidParameterError(
                f"the plan row {self.strategy} / {self.sampling} carries no strategy_spec / scheme_spec (a row "
                "written before plan rows carried their specs): plan again with this dpmf"
            )
        strategy = self._strategy(search_dir)
        scheme = scheme_from_dict(self.scheme_spec)
        if strategy.n != scheme.steps or (self.run is not None and scheme.steps != self.run["steps"]):
            steps = None if self.run is None else self.run["steps"]
            raise InvalidParameterError(
                f"the plan row's strategy has n={strategy.n} steps, its scheme steps={scheme.steps} and its run "
                f"steps={steps}: they must be equal (the row was edited); plan again"
            )
        return BuiltRow(strategy, scheme, self.noise_multiplier)

    def _strategy(self, search_dir):
        from dpmf.strategies.serialization import strategy_from_dict

        spec = self.strategy_spec
        try:
            return strategy_from_dict(spec, matrices=list(self.matrices) or None, search_dir=search_dir)
        except InvalidParameterError:
            if not _dense_by_hash(spec) or self.recipe is None:
                raise
        from dpmf.planning.candidates import StrategySpec

        try:
            rebuilt = StrategySpec(**self.recipe).build()
        except (TypeError, ValueError) as exc:
            raise InvalidParameterError(f"the plan row's recipe {self.recipe!r} cannot be built: {exc}") from None
        if _jsonify(rebuilt.describe()) != _jsonify(spec):
            raise InvalidParameterError(
                f"the {spec['rows']} x {spec['n']} matrix of the plan row's strategy (sha256 {spec['sha256']}) is not "
                f"at hand, and rebuilding it from the planner's recipe {self.recipe!r} gave another matrix (another "
                f"machine or BLAS): pass search_dir= (make_private: plan_search_dir=) a folder holding "
                f"{spec['sha256']}.npz, which dpmf plan --export writes next to the row"
            )
        return rebuilt


_VALUE_FIELDS = tuple(f.name for f in fields(PlanRow) if f.compare)
#: keys a row file may lack (rows written before they existed), with the value they then have
_OPTIONAL = {"cut": False}


def _jsonify(obj):
    return json.loads(json.dumps(obj))


def _dense_by_hash(spec) -> bool:
    """A dense strategy description that names its matrix by hash only (not inline)."""
    return isinstance(spec, dict) and spec.get("class") == "DenseStrategy" and "matrix" not in spec and "sha256" in spec


def dense_arrays(strategy) -> tuple:
    """The dense matrices a strategy's description names by hash only (the optimal factorization's
    ``C`` above :data:`~dpmf.strategies.matrix_identity.INLINE_MAX_N` steps); ``()`` otherwise."""
    if _dense_by_hash(strategy.describe()):
        return (strategy.C,)
    return ()


def attach_matrices(row: PlanRow, folder) -> PlanRow:
    """``row`` with the matrix its strategy spec names by hash, read from ``folder/<sha256>.npz``
    when that file exists (else ``row`` unchanged: :meth:`PlanRow.build` falls back on the recipe)."""
    from dataclasses import replace

    spec = row.strategy_spec
    if row.matrices or not _dense_by_hash(spec) or folder is None:
        return row
    path = Path(folder) / f"{spec['sha256']}.npz"
    if not path.is_file():
        return row
    from dpmf.strategies.serialization import find_matrix

    try:
        arr = find_matrix(spec["sha256"], (spec["rows"], spec["n"]), search_dir=folder)
    except InvalidParameterError:
        return row
    return replace(row, matrices=(arr,))


def save_row_matrices(row: PlanRow, folder) -> list[Path]:
    """Write ``row.matrices`` to ``folder/<sha256>.npz`` (key ``matrix``); the paths written."""
    import numpy as np

    from dpmf.files import write_npz
    from dpmf.strategies.matrix_identity import matrix_sha256

    out = []
    for arr in row.matrices:
        path = Path(folder) / f"{matrix_sha256(arr)}.npz"
        write_npz(path, {"matrix": np.ascontiguousarray(arr, dtype=np.float64)}, "matrix archive")
        out.append(path)
    return out


# ---------------------------------------------------------------------------------- checking
def _fail(key: str, msg: str) -> InvalidParameterError:
    return InvalidParameterError(f"plan row: key {key!r} {msg}")


def _number(key: str, v, *, positive: bool = False, finite: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or (finite and math.isinf(v)) or v < 0:
        raise _fail(key, f"must be a {'finite ' if finite else ''}number >= 0, got {v!r}")
    if positive and not v > 0:
        raise _fail(key, f"must be > 0, got {v!r}")
    return float(v)


def _check_rank(rank, where: str):
    """``rank`` (an integer >= 1, or ``None``), else an error naming ``where`` it was read."""
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        raise InvalidParameterError(f"{where}: key 'rank' must be an integer >= 1 or null, got {rank!r}")
    return rank


def _checked(data) -> dict:
    """The constructor arguments of the row ``data`` describes (every key and type checked)."""
    if not isinstance(data, dict):
        raise InvalidParameterError(f"a plan row must be a dict, got {type(data).__name__}")
    missing = [k for k in _VALUE_FIELDS if k not in data and k not in _OPTIONAL]
    unknown = sorted(k for k in data if k not in _VALUE_FIELDS and k != "rank")  # (rank: a row of --json)
    if missing or unknown:
        old = " (a row written before plan rows carried their specs: plan again)" if "strategy_spec" in missing else ""
        raise InvalidParameterError(
            f"plan row: missing key(s) {missing} and unknown key(s) {unknown}{old}" if unknown else
            f"plan row: missing key(s) {missing}{old}"
        )
    out = {k: v for k, v in _OPTIONAL.items() if k not in data}
    out.update(data)
    data = out
    _check_rank(data.get("rank"), "plan row")
    for k in ("strategy", "sampling", "method", "label", "note"):
        if not isinstance(data[k], str):
            raise _fail(k, f"must be text, got {data[k]!r}")
    for k in ("certified", "pruned", "cached", "cut"):
        if not isinstance(data[k], bool):
            raise _fail(k, f"must be true or false, got {data[k]!r}")
    for k in ("prefix_sum_rmse", "rmse_per_example_in_batch", "seconds"):
        out[k] = _number(k, data[k])
    out["noise_multiplier"] = _number("noise_multiplier", data["noise_multiplier"], positive=True)
    out["epsilon"] = _number("epsilon", data["epsilon"], finite=False)
    for k in ("strategy_spec", "scheme_spec", "recipe", "run"):
        if data[k] is not None and not isinstance(data[k], dict):
            raise _fail(k, f"must be a dict or null, got {type(data[k]).__name__}")
    for k in ("options", "epsilon_by_direction"):
        if not isinstance(data[k], dict):
            raise _fail(k, f"must be a dict, got {type(data[k]).__name__}")
    for d, v in data["epsilon_by_direction"].items():
        _number(f"epsilon_by_direction[{d!r}]", v, finite=False)
    if not data["pruned"] and (data["strategy_spec"] is None or data["scheme_spec"] is None or data["run"] is None):
        raise InvalidParameterError("plan row: a calibrated row must carry strategy_spec, scheme_spec and run")
    run = data["run"]
    if run is not None:
        if set(run) != set(RUN_KEYS):
            raise _fail("run", f"must have the keys {list(RUN_KEYS)}, got {sorted(run)}")
        for k in ("dataset_size", "batch_size", "epochs", "steps"):
            v = run[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise _fail("run", f"{k!r} must be an integer >= 1, got {v!r}")
        for k in ("epsilon", "delta", "sampling_prob"):
            _number(f"run[{k!r}]", run[k], positive=True)
        if not run["delta"] < 1:
            raise _fail("run", f"'delta' must be in (0, 1), got {run['delta']!r}")
    return out


# ---------------------------------------------------------------------------------- files
def row_from_json(data) -> tuple[PlanRow, int | None]:
    """``(row, rank)`` from a row file's JSON value (:func:`export_row`) or a bare row dict (a row of
    ``dpmf plan --json``, whose ``rank`` the row keeps)."""
    if isinstance(data, dict) and "format" in data:
        if data.get("format") != FORMAT:
            raise InvalidParameterError(f"not a dpmf plan row (format {data.get('format')!r}, expected {FORMAT!r})")
        if data.get("format_version") != FORMAT_VERSION:
            raise InvalidParameterError(
                f"a dpmf plan row of format_version {data.get('format_version')!r}; this dpmf reads "
                f"{FORMAT_VERSION}: export the row again (dpmf plan --export FILE)"
            )
        rank = _check_rank(data.get("rank"), "plan row file")
        row = PlanRow.from_dict(data.get("row"))
    else:
        row = PlanRow.from_dict(data)
        rank = row.rank
    from dataclasses import replace

    return replace(row, rank=rank if rank is not None else row.rank), rank


def export_row(row: PlanRow, path, *, rank: int | None = None) -> list[Path]:
    """Write ``row`` to ``path`` as JSON (``{"format", "format_version", "rank", "row"}``), and the
    dense matrices its strategy names by hash next to it (``<sha256>.npz``). Returns the paths
    written. ``path``'s folder must exist (checked before writing)."""
    from dpmf.files import atomic_write, check_output_file

    if not isinstance(row, PlanRow):
        raise InvalidParameterError(f"row must be a PlanRow, got {type(row).__name__}")
    if row.pruned:
        raise UnsupportedConfigurationError(
            f"the plan row {row.strategy} / {row.sampling} is pruned (a lower bound, never calibrated): export a "
            "ranked row, or plan with --no-prune"
        )
    rank = row.rank if rank is None else rank
    path = check_output_file(path, "path")
    payload = {"format": FORMAT, "format_version": FORMAT_VERSION, "rank": rank, "row": row.to_dict()}
    written = save_row_matrices(row, path.parent)
    with atomic_write(path, "plan row") as fh:
        fh.write((json.dumps(payload, indent=1) + "\n").encode("utf-8"))
    return [path, *written]


def load_row(source) -> PlanRow:
    """The row of a file written by :func:`export_row` (or holding one row of ``dpmf plan --json``),
    with the dense matrices found next to it; malformed or foreign files are refused naming the file."""
    from dpmf.files import read_json, reading

    data = read_json(source, "dpmf plan row")
    with reading(source, "dpmf plan row"):
        row, _ = row_from_json(data)
    return attach_matrices(row, Path(source).parent)
