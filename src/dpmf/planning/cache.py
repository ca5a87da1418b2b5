"""On-disk cache of ``dpmf plan`` rows: a rerun of the same plan is instant.

One small JSON file per candidate, named by the SHA-256 of its *key*: the strategy recipe, the
scheme, the accountant and its options, the target (epsilon, delta), the run (dataset size, batch
size, epochs) and the calibration tolerance -- plus the file format
(:data:`~dpmf.planning.rows.FORMAT_VERSION`: rows that predate a change of what a row carries are
never read, they are computed again) and the code: dpmf's version and a fingerprint of its source files, and
the versions of numpy, scipy and dp_accounting. Anything that can change a row changes the key, so
a stale row is never reused (a changed dpmf gets a fresh cache). The file stores the full key
again, and a hit requires it to match exactly.

Files are read through :func:`dpmf.files.read_json` (the one loader); a file that is malformed,
truncated, foreign or for another key is ignored -- the row is computed again and the file
replaced -- and the reason is kept in :attr:`PlanCache.ignored` for the caller to show. Writes go
to a temporary file first and are renamed into place, so an interrupted run never leaves half a
file. A *pruned* row is stored with the threshold it was pruned against and reused only for a
threshold at most as large (it then still proves the candidate cannot win). A row's dense matrix
(the optimal factorization above 64 steps, named by hash in its strategy spec) is kept in
``plan/matrices/<sha256>.npz`` and attached to the row when it is read
(:meth:`~dpmf.planning.rows.PlanRow.build` rebuilds it from the recipe if that file is gone).

Default folder: ``$DPMF_CACHE_DIR``, else ``$XDG_CACHE_HOME/dpmf``, else ``~/.cache/dpmf``
(rows go in its ``plan/`` subfolder).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from pathlib import Path

from dpmf.errors import DPMFError
from dpmf.planning.rows import FORMAT, FORMAT_VERSION, PlanRow, attach_matrices, save_row_matrices  # noqa: F401

# FORMAT_VERSION 2: rows carry their strategy and scheme specs, accountant options and run; a file
# of version 1 has another key, hence another name: it is never read, the row is computed again.


def default_cache_dir() -> Path:
    """``$DPMF_CACHE_DIR``, else ``$XDG_CACHE_HOME/dpmf``, else ``~/.cache/dpmf``.

    ``DPMF_CACHE_DIR`` is an explicit request: it is created if missing, and a value that is not a
    writable folder (a file, a folder that cannot be created or written) is refused with an
    :class:`~dpmf.errors.InvalidParameterError` naming the variable -- silently not caching would
    make every rerun start from scratch. The fallback folders are not checked here (see
    :func:`default_plan_cache`)."""
    value = os.environ.get("DPMF_CACHE_DIR")
    if value:
        try:
            return check_cache_dir(value, "environment variable DPMF_CACHE_DIR")
        except DPMFError as exc:
            raise type(exc)(f"{exc} (point it to a writable folder, or unset it)") from None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dpmf"


def check_cache_dir(value, name: str) -> Path:
    """``value`` as a cache folder (:func:`dpmf.files.check_output_dir`: created if missing, must be
    writable); a path the system refuses outright (a name longer than the file system takes) is an
    :class:`~dpmf.errors.InvalidParameterError` naming ``name``, never a traceback."""
    from dpmf.errors import InvalidParameterError
    from dpmf.files import check_output_dir

    try:
        return check_output_dir(value, name)
    except OSError as exc:  # (e.g. ENAMETOOLONG from the checks' stat calls)
        text = str(value)
        shown = repr(text) if len(text) <= 80 else f"{text[:40]!r}... ({len(text):,} characters)"
        raise InvalidParameterError(f"{name} {shown} cannot be used as a folder: {exc.strerror or exc}") from None


def default_plan_cache() -> "tuple[PlanCache | None, str | None]":
    """``(cache, note)`` for ``dpmf plan`` without ``--cache-dir``: the cache in
    :func:`default_cache_dir` (a bad ``DPMF_CACHE_DIR`` raises). When the *fallback* folder
    (``$XDG_CACHE_HOME/dpmf`` or ``~/.cache/dpmf``, which nobody asked for) cannot be written,
    ``(None, note)``: the plan runs without a cache and the caller shows the note once -- refusing
    would be wrong, the cache only saves time."""
    folder = default_cache_dir()
    if os.environ.get("DPMF_CACHE_DIR"):
        return PlanCache(folder), None
    try:
        check_cache_dir(folder, "the default cache folder")
    except DPMFError as exc:
        return None, f"{exc}: rows will not be cached (set DPMF_CACHE_DIR or --cache-dir to a writable folder)"
    return PlanCache(folder), None


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> dict:
    """Versions of dpmf and the numeric libraries, and a hash of dpmf's source files."""
    import importlib.metadata as md

    import dpmf
    from dpmf._version import __version__

    root = Path(dpmf.__file__).parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    out = {"dpmf": __version__, "source_sha256": h.hexdigest()}
    for lib in ("numpy", "scipy", "dp-accounting"):
        try:
            out[lib] = md.version(lib)
        except md.PackageNotFoundError:  # pragma: no cover - depends on the environment
            out[lib] = None
    return out


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _row_from(data: object) -> PlanRow:
    """A :class:`PlanRow` from its stored dict; ``ValueError`` for anything malformed
    (:meth:`PlanRow.from_dict`)."""
    row = PlanRow.from_dict(data)
    if not row.pruned and not row.noise_multiplier > 0:  # pragma: no cover - from_dict checks it
        raise ValueError("noise_multiplier is not positive")
    return row


class PlanCache:
    """Plan rows on disk under ``folder/plan`` (see the module docstring)."""

    def __init__(self, folder) -> None:
        self.folder = Path(folder) / "plan"
        self.ignored: list[str] = []  # why files were ignored (malformed, another key, ...)

    def full_key(self, key: dict) -> dict:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "code": code_fingerprint(), **key}

    def path(self, key: dict) -> Path:
        text = json.dumps(self.full_key(key), sort_keys=True, separators=(",", ":"))
        return self.folder / (hashlib.sha256(text.encode()).hexdigest()[:32] + ".json")

    def get(self, key: dict, threshold: float = math.inf, *, budget: float | None = None) -> PlanRow | None:
        """The stored row for ``key`` (``cached=True``), or ``None``: not stored, ignored (see
        :attr:`ignored`), pruned against a smaller threshold than ``threshold``, or cut by a time
        budget smaller than ``budget`` (``None``: no budget, a cut row is never reused)."""
        from dpmf.files import read_json, reading

        path = self.path(key)
        if not path.exists():
            return None
        try:
            data = read_json(path, "dpmf plan cache file")
            with reading(path, "dpmf plan cache file"):
                if not isinstance(data, dict) or data.get("key") != json.loads(json.dumps(self.full_key(key))):
                    raise ValueError("written for another configuration or another dpmf")
                if "row" not in data and "cut" in data:
                    return None  # (a candidate the budget stopped before any row: get_cut)
                row = _row_from(data.get("row"))
                pruned_at = data.get("threshold")
                cut_at = data.get("budget")
                if row.cut and not _is_number(cut_at):
                    raise ValueError("a cut row without its budget")
                if row.pruned and not (isinstance(pruned_at, (int, float)) and not isinstance(pruned_at, bool)):
                    raise ValueError("a pruned row without its threshold")
        except DPMFError as exc:
            self.ignored.append(f"ignored the cache file {path}: {exc}")
            return None
        if row.pruned and not threshold <= pruned_at:
            return None  # pruned against a smaller best row: not a proof for this threshold
        if row.cut and not (budget is not None and budget <= cut_at):
            return None  # cut by a smaller budget: this run may tighten it
        from dataclasses import replace

        return attach_matrices(replace(row, cached=True), self.folder / "matrices")

    def get_cut(self, key: dict, budget: float | None):
        """The stored :class:`~dpmf.planning.budget.Cut` for ``key`` (a candidate a budget at least
        ``budget`` stopped before it certified any noise), or ``None``."""
        from dpmf.files import read_json
        from dpmf.planning.budget import Cut

        path = self.path(key)
        if budget is None or not path.exists():
            return None
        try:
            data = read_json(path, "dpmf plan cache file")
        except DPMFError:
            return None
        try:
            if data.get("key") != json.loads(json.dumps(self.full_key(key))) or "row" in data:
                return None
            if not (_is_number(data.get("budget")) and budget <= data["budget"]):
                return None
            return Cut(**data["cut"])
        except (AttributeError, TypeError):
            return None

    def put_cut(self, key: dict, cut, budget: float) -> None:
        """Store a :class:`~dpmf.planning.budget.Cut` with the budget that stopped it."""
        from dataclasses import asdict

        self._write(key, {"key": self.full_key(key), "cut": asdict(cut), "budget": budget}, None)

    def put(self, key: dict, row: PlanRow, threshold: float = math.inf, *, budget: float | None = None) -> None:
        """Store ``row`` (atomically; an unwritable folder only costs the cache); a cut row with the
        ``budget`` that cut it."""
        from dataclasses import replace

        payload = {"key": self.full_key(key), "row": replace(row, cached=False).to_dict()}
        if row.pruned:
            payload["threshold"] = threshold
        if row.cut:
            payload["budget"] = budget
        self._write(key, payload, row)

    def _write(self, key: dict, payload: dict, row) -> None:
        path = self.path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if row is not None and row.matrices:  # a dense strategy named by hash: its matrix next to the rows
                (self.folder / "matrices").mkdir(exist_ok=True)
                save_row_matrices(row, self.folder / "matrices")
            tmp.write_text(json.dumps(payload, sort_keys=True), encoding="utf-8")
            os.replace(tmp, path)
        except (OSError, DPMFError) as exc:
            self.ignored.append(f"could not write the cache file {path}: {exc}")
            try:
                tmp.unlink()
            except OSError:
                pass
