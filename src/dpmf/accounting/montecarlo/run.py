"""Long Monte Carlo accounting runs: chunked, reproducible, checkpointed, resumable, distributable.

The privacy-loss samples of Dong & Ganesh 2026 (``papers/001``) Sec. 5 / App. A are drawn in chunks.
Chunk ``i`` of direction ``d`` (``remove = 0``, ``add = 1``) uses its own generator
``numpy.random.default_rng(SeedSequence(entropy, spawn_key=key + (d, i)))`` -- the child that
``SeedSequence(entropy).spawn`` would give at that position -- so the counts of a run depend only
on ``(entropy, num_samples, chunk_size)``: not on the order chunks finish, on interruptions, or on
which machine ran them. Each finished chunk is reduced to a
:class:`~dpmf.accounting.montecarlo.statistics.LossHistogram` (exact integer counts) and merged.

**Checkpoints.** After every chunk the whole state (configuration, seed, the set of finished
chunks, the merged counts, and the strategy) is written to ``checkpoint`` (an ``.npz``) via a
temporary file and ``os.replace``, so the file on disk is always one consistent state. A
``KeyboardInterrupt`` (SIGINT) at any moment loses at most the chunks in flight; :func:`resume`
recomputes exactly those, so no sample is lost or counted twice.

**Local processes.** ``workers=k`` (``k > 1``) computes chunks in ``k`` worker processes (the
strategy and scheme are sent to each worker once; at most ``4 k`` chunks are in flight), ``k``
capped at the chunks left and the CPUs (:func:`dpmf.resources.usable_workers`). The counts equal
those of a serial run.

**Dask.** ``scheduler=ADDRESS`` (a ``distributed`` scheduler address, or a ``distributed.Client``)
runs the chunks on a cluster; ``distributed`` is imported only then. Results are merged in the
order they finish; the counts equal those of a local run.

**Samplers.** Any callable ``sampler(strategy, scheme, noise_multiplier, num_samples, rng, *,
direction, **sampler_options)`` returning float64 losses (``remove``: ln P/Q with y ~ P; ``add``:
ln Q/P with y ~ Q) can be injected; the default is
:func:`dpmf.accounting.montecarlo.losses.privacy_loss_samples` (``sampler_options`` such as
``dataset_size`` for truncated b-min-sep are recorded in the checkpoint).
"""

from __future__ import annotations

import importlib
import io
import json
import os
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

import numpy as np

from dpmf import validation as _v
from dpmf._version import __version__
from dpmf.accounting.montecarlo.statistics import DEFAULT_RESOLUTION, DEFAULT_UPPER, LossHistogram
from dpmf.errors import InvalidParameterError
from dpmf.files import check_output_file, read_npz, reading, write_npz

DIRECTIONS = ("remove", "add")
DEFAULT_SAMPLER = "dpmf.accounting.montecarlo.losses:privacy_loss_samples"
FILE_KIND = "dpmf.montecarlo.checkpoint"
FILE_FORMAT = 1

Sampler = Callable[..., np.ndarray]
RunCallback = Callable[[int, int], None]
"""Called as ``callback(samples_done, samples_total)`` (over both directions) after each chunk."""


def default_sampler() -> Sampler:
    """Part A's loss sampler (imported lazily: the module may be absent in partial installs)."""
    module, name = DEFAULT_SAMPLER.split(":")
    return getattr(importlib.import_module(module), name)


class _ReadOnlySampler:
    """Stands in for the recorded sampler of a checkpoint loaded only to be reported."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args, **kwargs):
        raise InvalidParameterError(f"this run was loaded read-only; resume it with its sampler ({self.name})")


def sampler_name(sampler: Sampler | None) -> str:
    """``module:qualname`` recorded in checkpoints (the default sampler has a fixed name)."""
    if sampler is None:
        return DEFAULT_SAMPLER
    if isinstance(sampler, _ReadOnlySampler):
        return sampler.name
    return f"{getattr(sampler, '__module__', '?')}:{getattr(sampler, '__qualname__', repr(sampler))}"


def new_entropy() -> int:
    """Fresh OS entropy for a seed (secure mode: never reused, always recorded)."""
    return int(np.random.SeedSequence().entropy)


def _as_entropy(seed: int | None) -> int:
    if seed is None:
        return new_entropy()
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or int(seed) < 0:
        raise InvalidParameterError(f"seed must be a non-negative integer or None, got {seed!r}")
    return int(seed)


class ChunkSet:
    """Immutable set of finished chunk indices stored as ``prefix`` (all of ``0..prefix-1``) plus the
    few ``extras`` finished out of order, so adding a chunk and saving stay O(1) for in-order runs
    of any length (a 1e9-sample run has ~1e5 chunks)."""

    __slots__ = ("prefix", "extras")

    def __init__(self, prefix: int = 0, extras=()) -> None:
        extras = frozenset(int(i) for i in extras if int(i) >= prefix)
        while prefix in extras:
            extras = extras - {prefix}
            prefix += 1
        self.prefix, self.extras = int(prefix), extras

    def add(self, chunk: int) -> "ChunkSet":
        return ChunkSet(self.prefix, self.extras | {int(chunk)})

    def __contains__(self, chunk: object) -> bool:
        return isinstance(chunk, (int, np.integer)) and (0 <= chunk < self.prefix or chunk in self.extras)

    def __len__(self) -> int:
        return self.prefix + len(self.extras)

    def __iter__(self):
        yield from range(self.prefix)
        yield from sorted(self.extras)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChunkSet) and (self.prefix, self.extras) == (other.prefix, other.extras)

    def __repr__(self) -> str:
        return f"ChunkSet(prefix={self.prefix}, extras={sorted(self.extras)})"

    def to_json(self) -> dict:
        return {"prefix": self.prefix, "extras": sorted(self.extras)}

    @classmethod
    def from_json(cls, data) -> "ChunkSet":
        return cls(int(data["prefix"]), [int(i) for i in data["extras"]])


def chunk_generator(entropy: int, key: tuple[int, ...], direction: str, chunk: int) -> np.random.Generator:
    """The generator of one chunk (see module docstring)."""
    d = DIRECTIONS.index(direction)
    return np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=tuple(key) + (d, chunk)))


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's counts (besides strategy, scheme and sampler)."""

    noise_multiplier: float
    num_samples: int
    chunk_size: int
    entropy: int
    directions: tuple[str, ...] = DIRECTIONS
    spawn_key: tuple[int, ...] = ()
    resolution: float = DEFAULT_RESOLUTION
    upper: float = DEFAULT_UPPER
    sampler_options: tuple = ()  # sorted (name, value) pairs passed to the sampler, e.g. dataset_size

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", _v.noise_scale("noise_multiplier", self.noise_multiplier))
        object.__setattr__(self, "num_samples", _v.positive_int("num_samples", self.num_samples))
        object.__setattr__(self, "chunk_size", _v.positive_int("chunk_size", self.chunk_size))
        object.__setattr__(self, "entropy", _as_entropy(self.entropy))
        dirs = tuple(self.directions)
        if not dirs or any(d not in DIRECTIONS for d in dirs) or len(set(dirs)) != len(dirs):
            raise InvalidParameterError(f"directions must be a non-empty subset of {DIRECTIONS}, got {dirs!r}")
        object.__setattr__(self, "directions", tuple(d for d in DIRECTIONS if d in dirs))
        object.__setattr__(self, "spawn_key", tuple(int(k) for k in self.spawn_key))
        object.__setattr__(self, "resolution", _v.positive("resolution", self.resolution))
        object.__setattr__(self, "upper", _v.positive("upper", self.upper))
        opts = dict(self.sampler_options)
        for k, v in opts.items():
            if not isinstance(k, str) or k == "direction" or not isinstance(v, (int, float, str, bool, type(None))):
                raise InvalidParameterError(
                    f"sampler_options must map names to JSON scalars (not 'direction'), got {k!r}: {v!r}"
                )
        object.__setattr__(self, "sampler_options", tuple(sorted(opts.items())))

    @property
    def num_chunks(self) -> int:
        return -(-self.num_samples // self.chunk_size)

    def chunk_length(self, chunk: int) -> int:
        return min(self.chunk_size, self.num_samples - chunk * self.chunk_size)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["directions"], out["spawn_key"] = list(self.directions), list(self.spawn_key)
        out["sampler_options"] = dict(self.sampler_options)
        return out


_WORKER_JOB: tuple | None = None  # (strategy, scheme, config, sampler) in a worker process


def _init_worker(strategy, scheme, config, sampler) -> None:
    global _WORKER_JOB
    _WORKER_JOB = (strategy, scheme, config, sampler)


def _worker_chunk(direction: str, chunk: int) -> LossHistogram:
    assert _WORKER_JOB is not None
    strategy, scheme, config, sampler = _WORKER_JOB
    return compute_chunk(strategy, scheme, config, sampler, direction, chunk)


def compute_chunk(
    strategy, scheme, config: RunConfig, sampler: Sampler | None, direction: str, chunk: int
) -> LossHistogram:
    """Counts of one chunk: a pure function of its arguments (runs locally or on a Dask worker)."""
    fn = default_sampler() if sampler is None else sampler
    rng = chunk_generator(config.entropy, config.spawn_key, direction, chunk)
    losses = np.asarray(
        fn(
            strategy, scheme, config.noise_multiplier, config.chunk_length(chunk), rng, direction=direction,
            **dict(config.sampler_options),
        ),
        dtype=np.float64,
    )
    if losses.shape != (config.chunk_length(chunk),):
        raise InvalidParameterError(
            f"the sampler returned shape {losses.shape}, expected ({config.chunk_length(chunk)},)"
        )
    return LossHistogram.from_losses(losses, config.resolution, config.upper)


class MonteCarloRun:
    """A (possibly long) Monte Carlo run of privacy losses for one noise multiplier.

    >>> import numpy as np
    >>> def gauss(strategy, scheme, sigma, m, rng, *, direction="remove"):  # Gaussian mechanism
    ...     y = rng.normal(1.0 if direction == "remove" else 0.0, sigma, m)
    ...     ll = (2 * y - 1) / (2 * sigma**2)
    ...     return ll if direction == "remove" else -ll
    >>> run = MonteCarloRun(None, None, 1.0, 20_000, seed=1, chunk_size=5_000, sampler=gauss).run()
    >>> run.samples_done, run.complete
    (40000, True)
    >>> lo, est, hi = run.histograms["remove"].delta_interval(1.0, 0.99)
    >>> lo <= 0.1269 <= hi   # exact Gaussian delta(1) at sigma = 1
    True
    """

    def __init__(
        self,
        strategy,
        scheme,
        noise_multiplier: float,
        num_samples: int,
        *,
        seed: int | None = None,
        chunk_size: int = 10_000,
        directions: tuple[str, ...] = DIRECTIONS,
        checkpoint: str | os.PathLike | None = None,
        sampler: Sampler | None = None,
        resolution: float = DEFAULT_RESOLUTION,
        upper: float = DEFAULT_UPPER,
        spawn_key: tuple[int, ...] = (),
        sampler_options: dict | None = None,
    ) -> None:
        self.strategy = strategy
        self.scheme = scheme
        self.config = RunConfig(
            noise_multiplier, num_samples, chunk_size, _as_entropy(seed), tuple(directions), tuple(spawn_key),
            resolution, upper, tuple((sampler_options or {}).items()),
        )
        self.sampler = sampler
        self.sampler_name = sampler_name(sampler)
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.histograms: dict[str, LossHistogram] = {
            d: LossHistogram.empty(self.config.resolution, self.config.upper) for d in self.config.directions
        }
        self.done: dict[str, ChunkSet] = {d: ChunkSet() for d in self.config.directions}
        #: What a report of this run is for (``delta``, ``confidence``), saved in the checkpoint so
        #: that ``dpmf montecarlo resume FILE`` / ``report FILE`` need no options.
        self.report_defaults: dict = {}

    # ----------------------------------------------------------------- progress
    @property
    def entropy(self) -> int:
        return self.config.entropy

    @property
    def samples_total(self) -> int:
        return self.config.num_samples * len(self.config.directions)

    @property
    def samples_done(self) -> int:
        return sum(h.total for h in self.histograms.values())

    def samples(self, direction: str) -> int:
        return self.histograms[direction].total

    @property
    def complete(self) -> bool:
        return all(len(self.done[d]) == self.config.num_chunks for d in self.config.directions)

    def pending(self) -> list[tuple[str, int]]:
        """Chunks not yet merged, in the canonical order (chunk-major, remove before add)."""
        return [
            (d, i) for i in range(self.config.num_chunks) for d in self.config.directions if i not in self.done[d]
        ]

    # ----------------------------------------------------------------- running
    def run(
        self,
        *,
        callback: RunCallback | None = None,
        scheduler=None,
        workers: int | None = None,
        max_chunks: int | None = None,
    ) -> "MonteCarloRun":
        """Compute every pending chunk (or at most ``max_chunks``), checkpointing after each.

        ``scheduler``: ``None`` (this machine) or a Dask scheduler address / ``distributed.Client``.
        ``workers``: local worker processes (``None`` or 1: this process); never more are started than
        chunks left or CPUs (:func:`dpmf.resources.usable_workers`).
        """
        todo = self.pending()
        if max_chunks is not None:
            todo = todo[: _v.positive_int("max_chunks", max_chunks)]
        if workers is not None:
            from dpmf.resources import usable_workers

            workers = usable_workers(_v.positive_int("workers", workers), len(todo))
        if scheduler is None and workers is not None and workers > 1 and len(todo) > 1:
            self._run_processes(workers, todo, callback)
        elif scheduler is None:
            for direction, chunk in todo:
                hist = compute_chunk(self.strategy, self.scheme, self.config, self.sampler, direction, chunk)
                self._merge(direction, chunk, hist, callback)
        else:
            self._run_dask(scheduler, todo, callback)
        return self

    def _merge(self, direction: str, chunk: int, hist: LossHistogram, callback: RunCallback | None) -> None:
        if chunk in self.done[direction]:  # a duplicate result (e.g. a retried task): never count twice
            return
        merged = self.histograms[direction].merge(hist)
        done = self.done[direction].add(chunk)
        # swap both in one statement: an interrupt leaves either the old or the new state
        self.histograms, self.done = {**self.histograms, direction: merged}, {**self.done, direction: done}
        if self.checkpoint is not None:
            self.save(self.checkpoint)
        if callback is not None:
            callback(self.samples_done, self.samples_total)

    def _run_processes(self, workers: int, todo: list[tuple[str, int]], callback: RunCallback | None) -> None:
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        queue = list(todo)
        running: dict = {}
        job = (self.strategy, self.scheme, self.config, self.sampler)
        pool = ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=job)
        try:
            while queue or running:
                while queue and len(running) < 4 * workers:
                    direction, chunk = queue.pop(0)
                    running[pool.submit(_worker_chunk, direction, chunk)] = (direction, chunk)
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    direction, chunk = running.pop(fut)
                    self._merge(direction, chunk, fut.result(), callback)
        finally:  # on an interrupt: drop the queued chunks, keep the checkpoint (resume redoes them)
            pool.shutdown(wait=True, cancel_futures=True)

    def _run_dask(self, scheduler, todo: list[tuple[str, int]], callback: RunCallback | None) -> None:
        from dpmf.accounting._dask import connect

        client, own = connect(scheduler)
        distributed = importlib.import_module("distributed")
        try:
            workers = max(1, sum(client.nthreads().values()))
            window = 4 * workers  # bounded number of tasks in flight (bounded memory for huge runs)
            strategy, scheme = client.scatter([self.strategy, self.scheme], broadcast=True)
            queue = list(todo)
            futures = {}
            pool = distributed.as_completed()

            def submit() -> None:
                direction, chunk = queue.pop(0)
                fut = client.submit(
                    compute_chunk, strategy, scheme, self.config, self.sampler, direction, chunk, pure=False
                )
                futures[fut] = (direction, chunk)
                pool.add(fut)

            for _ in range(min(window, len(queue))):
                submit()
            try:
                for fut in pool:
                    direction, chunk = futures.pop(fut)
                    self._merge(direction, chunk, fut.result(), callback)
                    if queue:
                        submit()
            except BaseException:
                client.cancel(list(futures))
                raise
        finally:
            if own:
                client.close()

    # ----------------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike) -> None:
        """Write the state atomically (:func:`dpmf.files.write_npz`: a temporary file beside it,
        synced, then ``os.replace``)."""
        from dpmf.strategies import catalog

        path = Path(path)
        meta = {
            "kind": FILE_KIND,
            "format": FILE_FORMAT,
            "dpmf_version": __version__,
            "config": self.config.to_dict(),
            "scheme": _scheme_record(self.scheme),
            "strategy": None if self.strategy is None else self.strategy.describe(),
            "sampler": self.sampler_name,
            "done": {d: self.done[d].to_json() for d in self.config.directions},
            "tails": {
                d: [h.underflow, h.overflow, h.infinite] for d, h in self.histograms.items()
            },
            "report": dict(self.report_defaults),
        }
        arrays: dict[str, np.ndarray] = {"metadata": np.array(json.dumps(meta))}
        for d, h in self.histograms.items():
            sp = h.to_sparse()
            arrays[f"{d}_bins"] = sp["bins"]
            arrays[f"{d}_counts"] = sp["bin_counts"]
        if self.strategy is not None:
            cached = getattr(self, "_strategy_blob", None)
            if cached is None or cached[0] is not self.strategy:
                cached = (self.strategy, _strategy_bytes(self.strategy, catalog))
                self._strategy_blob = cached
            arrays["strategy_npz"] = cached[1]
        check_output_file(path, "checkpoint")
        # uncompressed: zlib would dominate the per-chunk cost
        write_npz(path, arrays, "Monte Carlo checkpoint", compressed=False)

    @classmethod
    def load(
        cls, path: str | os.PathLike, *, sampler: Sampler | None = None, read_only: bool = False
    ) -> "MonteCarloRun":
        """Read a checkpoint written by :meth:`save` (refuses foreign or corrupt files).

        A run made with a custom sampler must be given the same sampler again (checked by name),
        unless ``read_only`` (for reports: the loaded run refuses to sample).
        """
        from dpmf.strategies import catalog

        path = Path(path)
        what = "dpmf Monte Carlo checkpoint"
        contents = read_npz(path, what, kind=FILE_KIND)
        meta, arrays = contents.metadata, contents.arrays
        if meta.get("format") != FILE_FORMAT:
            raise InvalidParameterError(f"{path}: not a {what} (format {meta.get('format')!r}, expected {FILE_FORMAT})")
        with reading(path, what):
            return cls._from_contents(path, meta, arrays, sampler, read_only, catalog)

    @classmethod
    def _from_contents(cls, path, meta, arrays, sampler, read_only, catalog) -> "MonteCarloRun":
        recorded = meta["sampler"]
        if read_only:
            sampler = _ReadOnlySampler(recorded)
        elif sampler is None and recorded != DEFAULT_SAMPLER:
            raise InvalidParameterError(
                f"{path} was made with sampler {recorded}; pass the same sampler to resume it"
            )
        if sampler is not None and sampler_name(sampler) != recorded:
            raise InvalidParameterError(
                f"{path} was made with sampler {recorded}, got {sampler_name(sampler)}"
            )
        strategy = None
        if "strategy_npz" in arrays:
            strategy = catalog.load(io.BytesIO(arrays["strategy_npz"].tobytes()))
            if strategy.describe() != meta["strategy"]:
                raise InvalidParameterError(f"{path}: corrupt checkpoint (strategy does not match its metadata)")
        scheme = _scheme_from_record(meta["scheme"], path)
        cfg = meta["config"]
        run = cls(
            strategy,
            scheme,
            cfg["noise_multiplier"],
            cfg["num_samples"],
            seed=cfg["entropy"],
            chunk_size=cfg["chunk_size"],
            directions=tuple(cfg["directions"]),
            sampler=sampler,
            resolution=cfg["resolution"],
            upper=cfg["upper"],
            spawn_key=tuple(cfg["spawn_key"]),
            sampler_options=cfg.get("sampler_options") or {},
            checkpoint=path,
        )
        hist, done = {}, {}
        for d in run.config.directions:
            under, over, inf = meta["tails"][d]
            hist[d] = LossHistogram.from_sparse(
                {
                    "resolution": cfg["resolution"], "upper": cfg["upper"], "underflow": under, "overflow": over,
                    "infinite": inf, "bins": arrays[f"{d}_bins"], "bin_counts": arrays[f"{d}_counts"],
                }
            )
            try:
                done[d] = ChunkSet.from_json(meta["done"][d])
            except (KeyError, TypeError, ValueError) as exc:
                raise InvalidParameterError(f"{path}: corrupt checkpoint (finished chunks: {exc})") from None
            nchunks = run.config.num_chunks
            bad = done[d].prefix > nchunks or any(not 0 <= i < nchunks for i in done[d].extras)
            expected = 0 if bad else sum(run.config.chunk_length(i) for i in done[d])
            if bad or hist[d].total != expected:
                raise InvalidParameterError(
                    f"{path}: corrupt checkpoint ({d}: {hist[d].total} samples counted, chunks say {expected})"
                )
        run.histograms, run.done = hist, done
        report = meta.get("report") or {}
        run.report_defaults = {k: float(report[k]) for k in ("delta", "confidence") if k in report}
        return run

    def to_dict(self) -> dict:
        """Summary for reports: seed, chunks, samples per direction."""
        return {
            "seed_entropy": self.entropy,
            "spawn_key": list(self.config.spawn_key),
            "chunk_size": self.config.chunk_size,
            "num_samples": self.config.num_samples,
            "samples": {d: self.samples(d) for d in self.config.directions},
            "sampler": self.sampler_name,
            "grid_resolution": self.config.resolution,
            "grid_upper": self.config.upper,
            "sampler_options": dict(self.config.sampler_options),
        }


def resume(
    path: str | os.PathLike,
    *,
    sampler: Sampler | None = None,
    callback: RunCallback | None = None,
    scheduler=None,
) -> MonteCarloRun:
    """Load the checkpoint at ``path`` and compute its missing chunks (checkpointing as it goes)."""
    return MonteCarloRun.load(path, sampler=sampler).run(callback=callback, scheduler=scheduler)


# --------------------------------------------------------------------- (de)serialization helpers
def _scheme_record(scheme) -> dict | None:
    if scheme is None:
        return None
    return {"class": type(scheme).__name__, "describe": scheme.describe()}


def _scheme_from_record(record: dict | None, path):
    if record is None:
        return None
    from dpmf.sampling import schemes as _schemes

    cls = {c.__name__: c for c in _schemes.SCHEMES}.get(record.get("class"))
    if cls is None:
        raise InvalidParameterError(f"{path}: unknown sampling scheme {record.get('class')!r}")
    desc = record["describe"]
    kwargs = {f.name: desc[f.name] for f in fields(cls) if f.name in desc}
    scheme = cls(**kwargs)
    if _jsonify(scheme.describe()) != _jsonify(desc):
        raise InvalidParameterError(f"{path}: corrupt checkpoint (scheme does not match its description)")
    return scheme


def _jsonify(obj):
    return json.loads(json.dumps(obj))


def _strategy_bytes(strategy, catalog) -> np.ndarray:
    fd, tmp = tempfile.mkstemp(suffix=".npz")
    os.close(fd)
    try:
        catalog.save(strategy, tmp)
        return np.frombuffer(Path(tmp).read_bytes(), dtype=np.uint8)
    finally:
        os.unlink(tmp)

