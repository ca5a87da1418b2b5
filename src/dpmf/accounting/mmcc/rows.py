"""MMCC rows: one PLD per distinct row (App. F.2 and F.4), serially, in processes or on Dask.

Paper: Choquette-Choo et al., "Privacy amplification for matrix mechanisms" (ICLR 2024),
App. F.2 (PMoG as MoG: round ``C`` up to the ``Delta_2`` grid and convolve the two-point laws)
and F.4 (rows are independent jobs; identical rows are computed once). Digest
``notes/mmcc.md`` §3.5.

A row (or unit) is the product mixture ``M_PMoG({p~_j}, {c_j})`` with Gaussian noise ``sigma``:
its sensitivity is ``S = sum_j B_j c_j`` with independent ``B_j ~ Bernoulli(p~_j)``.

* One entry: ``S`` is ``c`` with probability ``p~`` and 0 otherwise, the Poisson-subsampled
  Gaussian; its PLD is built exactly (no grid) by
  :func:`dpmf.privacy.gaussian_plds.subsampled_gaussian` (dp_accounting's closed-form inverse
  loss), which is also what the DP-SGD accountant uses, so ``C = I`` reproduces it exactly.
* Several entries: :func:`dpmf.privacy.product_mixtures.product_mixture` rounds every ``c_j``
  up to the grid ``Delta_2`` and returns a PMF that stochastically dominates the exact law
  (pessimistic, Cor. B.3); :func:`dpmf.privacy.mixture.mixture_of_gaussians` turns it into a
  pessimistic PLD (both adjacency directions, loss grid ``discretization``).
* Before that, low-mass grid points are merged **upward** (:func:`merge_upward`): a run of
  consecutive points becomes one point at the run's top whenever the mass moved, weighted by the
  grid steps it moves, stays <= ``merge_budget``. Moving mass up keeps stochastic dominance
  (Cor. B.3), so this is sound; it cuts the number of mixture components ~8x on MMCC rows
  (whose mass is concentrated on few participations) and changes epsilon by ~1e-7 relative at
  the default budget (measured on sqrt-Toeplitz rows; see tests).

Checkpoints: with ``cache_dir`` every finished row is written there at once (one ``.npz`` per
row, named by a SHA-256 of the row's sensitivities, probabilities, sigma and grid parameters,
written atomically), and rows already there are loaded instead of computed. An interrupted MMCC
run (or calibration: each trial sigma is its own set of rows) resumes where it stopped, and the
result is bit-for-bit the uninterrupted one.

Streaming: :func:`iter_row_plds` consumes its tasks lazily and yields the PLDs in order (at
most :data:`PROCESS_WINDOW` tasks per worker process in flight), so a caller can feed rows it
builds one at a time; :func:`compute_row_plds` is the list version.

Execution: ``workers`` (``None`` = serial below :data:`PARALLEL_MIN_ROWS` distinct rows, else one
process per CPU; ``1`` = serial; ``k > 1`` = a ``ProcessPoolExecutor`` with ``k`` processes, capped
at the number of rows and of CPUs: :func:`dpmf.resources.usable_workers`) or
``scheduler`` (a Dask ``distributed`` scheduler address such as ``"tcp://host:8786"`` or a
``distributed.Client``; Dask is an optional dependency imported only then).
"""

from __future__ import annotations

import hashlib
import math
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from dpmf import progress
from dpmf.errors import InvalidParameterError, NoiseTooSmallError
from dpmf.files import check_output_dir, read_npz, reading, write_npz
from dpmf.privacy.gaussian_plds import subsampled_gaussian
from dpmf.privacy.mixture import mixture_of_gaussians
from dpmf.privacy.pld import PrivacyLossDistribution
from dpmf.privacy.product_mixtures import product_mixture
from dpmf.resources import available_cpus, usable_workers

__all__ = ["row_pld", "compute_row_plds", "iter_row_plds", "merge_upward", "RowCache", "PARALLEL_MIN_ROWS", "DEFAULT_MERGE_BUDGET"]

#: With ``workers=None``, rows are computed in a process pool only from this many distinct rows.
PARALLEL_MIN_ROWS = 256

#: Tasks in flight per worker process in :func:`iter_row_plds` (bounds the rows held at once).
PROCESS_WINDOW = 32

#: Default budget of :func:`merge_upward` (probability mass x grid steps moved per merged point).
DEFAULT_MERGE_BUDGET = 1e-7

RowTask = tuple[np.ndarray, np.ndarray]
ProgressCallback = Callable[[int, int], None]


def merge_upward(probs: np.ndarray, budget: float) -> tuple[np.ndarray, np.ndarray]:
    """Merge runs of grid points upward: ``(grid indices, masses)`` of the kept points.

    Greedy from the bottom: a run ``lo..hi`` is extended while ``sum_k p_k (hi - k) <= budget``
    and its whole mass is placed at ``hi``. The result stochastically dominates the input (mass
    only moves up). Each merged mass is :func:`math.fsum` of its run (correctly rounded) moved
    up one ulp (capped at 1), so no mass is lost to rounding. ``budget = 0`` keeps every point
    with mass.

    >>> idx, mass = merge_upward(np.array([0.5, 1e-9, 1e-9, 0.25, 0.25 - 2e-9]), 2e-9)
    >>> idx.tolist(), bool(mass[1] >= 2e-9)
    ([0, 2, 3, 4], True)
    """
    p = probs.tolist()
    n = len(p)
    idx: list[int] = []
    mass: list[float] = []
    k = 0
    while k < n:
        m, cost, hi = p[k], 0.0, k
        while hi + 1 < n and cost + m <= budget:
            cost += m
            hi += 1
            m += p[hi]
        if hi > k:
            # one ulp up so no mass is lost to rounding, but a probability never exceeds 1 (all of
            # the mass in one point is exactly 1: nothing to round up)
            m = min(1.0, math.nextafter(math.fsum(p[k : hi + 1]), math.inf))
        if m > 0:
            idx.append(hi)
            mass.append(m)
        k = hi + 1
    return np.array(idx, dtype=np.int64), np.array(mass)


def row_pld(
    sensitivities: np.ndarray,
    probabilities: np.ndarray,
    noise_multiplier: float,
    grid_step: float,
    discretization: float,
    merge_budget: float = DEFAULT_MERGE_BUDGET,
) -> PrivacyLossDistribution | None:
    """Pessimistic PLD of ``M_PMoG(probabilities, sensitivities)`` (``None``: reveals nothing).

    ``S = sum_j B_j c_j``, ``B_j ~ Bernoulli(p_j)``; a single entry is the exact subsampled
    Gaussian, otherwise the sensitivities are rounded up to multiples of ``grid_step``.

    >>> pld = row_pld(np.array([1.0]), np.array([0.01]), 1.0, 0.01, 1e-4)
    >>> round(pld.self_compose(1000).epsilon(1e-6), 3)   # one DP-SGD step, 1000 times
    2.125
    """
    c = np.asarray(sensitivities, dtype=np.float64)
    p = np.asarray(probabilities, dtype=np.float64)
    keep = (c > 0) & (p > 0)
    c, p = c[keep], p[keep]
    if c.size == 0:
        return None
    if c.size == 1:
        try:
            return subsampled_gaussian(noise_multiplier, float(p[0]), float(c[0]), discretization=discretization)
        except NoiseTooSmallError:
            # its one-step grid exceeds the subsampled Gaussian's point limit at this grid (which the
            # MMCC accountant chose for all rows from memory, ``grid.row_discretization``): the same pair
            # as a two-point mixture, whose PLD has no point limit (equally pessimistic)
            if float(p[0]) >= 1.0:
                return mixture_of_gaussians(c, np.ones(1), noise_multiplier, discretization=discretization)
            return mixture_of_gaussians(np.array([0.0, float(c[0])]), np.array([1.0 - float(p[0]), float(p[0])]),
                                        noise_multiplier, discretization=discretization)
    dist = product_mixture(p, c, grid_step)
    if merge_budget > 0:
        idx, probs = merge_upward(dist.probs, merge_budget)
        sens = dist.support[idx]
    else:
        sens, probs = dist.nonzero()
    if sens[-1] == 0:
        return None
    return mixture_of_gaussians(sens, probs, noise_multiplier, discretization=discretization, lattice=grid_step)


class RowCache:
    """Finished row PLDs on disk: ``<dir>/<sha256>.npz`` per row (see the module docstring)."""

    VERSION = "dpmf-mmcc-row-1"

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = os.fspath(directory)
        check_output_dir(self.directory, "cache_dir")

    def path(self, job: tuple) -> str:
        c, p, sigma, grid_step, discretization, merge_budget = job
        h = hashlib.sha256()
        h.update(f"{self.VERSION}|{float(sigma)!r}|{float(grid_step)!r}|{float(discretization)!r}|{float(merge_budget)!r}|".encode())
        h.update(np.ascontiguousarray(c, dtype=np.float64).tobytes())
        h.update(b"|")
        h.update(np.ascontiguousarray(p, dtype=np.float64).tobytes())
        return os.path.join(self.directory, h.hexdigest() + ".npz")

    def load(self, job: tuple) -> tuple[bool, PrivacyLossDistribution | None]:
        """``(found, pld)``; a damaged file counts as missing (it is recomputed and replaced)."""
        path = self.path(job)
        if not os.path.exists(path):
            return False, None
        try:
            arrays = read_npz(path, "MMCC row checkpoint", metadata=False).arrays
            if "none" in arrays:
                return True, None
            with reading(path, "MMCC row checkpoint"):
                return True, PrivacyLossDistribution.from_arrays(arrays)
        except InvalidParameterError:
            return False, None

    def save(self, job: tuple, pld: PrivacyLossDistribution | None) -> None:
        arrays = {"none": np.array(1)} if pld is None else pld.to_arrays()
        write_npz(self.path(job), arrays, "MMCC row checkpoint", compressed=False, fsync=False)


def _job(args: tuple) -> PrivacyLossDistribution | None:
    return row_pld(*args)


def _resolve_workers(workers: int | None, count: int) -> int:
    """Processes to start: never more than the rows (``count``) or the CPUs
    (:func:`dpmf.resources.usable_workers`), whatever ``workers`` asks for."""
    if workers is None:
        return 1 if count < PARALLEL_MIN_ROWS else usable_workers(available_cpus(), count)
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise InvalidParameterError(f"workers must be an integer >= 1 or None, got {workers!r}")
    return usable_workers(int(workers), count)


def compute_row_plds(
    tasks: Sequence[RowTask],
    noise_multiplier: float,
    grid_step: float,
    discretization: float,
    *,
    merge_budget: float = DEFAULT_MERGE_BUDGET,
    workers: int | None = None,
    scheduler: object = None,
    callback: ProgressCallback | None = None,
    cache_dir: str | os.PathLike | None = None,
    description: str = "MMCC rows",
) -> tuple[list[PrivacyLossDistribution | None], dict]:
    """PLDs of all ``tasks`` (``(sensitivities, probabilities)`` pairs), in order.

    Returns the PLDs and ``{"backend": ..., "workers": ..., "rows_loaded": ...}``; see
    :func:`iter_row_plds` (which this collects into a list).
    """
    info: dict = {}
    out = [pld for _, pld in iter_row_plds(
        tasks, len(tasks), noise_multiplier, grid_step, discretization, merge_budget=merge_budget,
        workers=workers, scheduler=scheduler, callback=callback, cache_dir=cache_dir,
        description=description, info=info,
    )]
    return out, info


def iter_row_plds(
    tasks: Iterable[RowTask],
    count: int,
    noise_multiplier: float,
    grid_step: float,
    discretization: float,
    *,
    merge_budget: float = DEFAULT_MERGE_BUDGET,
    workers: int | None = None,
    scheduler: object = None,
    callback: ProgressCallback | None = None,
    cache_dir: str | os.PathLike | None = None,
    description: str = "MMCC rows",
    info: dict | None = None,
) -> Iterator[tuple[int, PrivacyLossDistribution | None]]:
    """Yield ``(k, pld)`` for the ``count`` tasks of the iterable ``tasks``, in order.

    ``tasks`` is consumed lazily: serially one task at a time, in processes with at most
    ``PROCESS_WINDOW`` x workers tasks in flight (finished PLDs that arrive ahead of their turn
    wait in a buffer), so the caller can stream rows it never holds all at once. ``info`` (a dict)
    receives ``{"backend": ..., "workers": ..., "rows_loaded": ...}``. ``callback(done, total)``
    is called after each row (a row loaded from ``cache_dir`` counts when it is reached). With
    ``cache_dir`` each computed row is saved as soon as it is finished. The loop is a
    :func:`dpmf.progress.task` named ``description`` (silent unless progress reporting is on, as
    in the CLI). The Dask backend collects the tasks first.
    """
    info = {} if info is None else info
    total = int(count)
    cache = RowCache(cache_dir) if cache_dir is not None else None
    n_workers = _resolve_workers(workers, total) if scheduler is None else None  # bad input: before any output
    params = (noise_multiplier, grid_step, discretization, merge_budget)
    state = {"done": 0, "loaded": 0}
    with progress.task(description, total=total, unit="rows") as bar:

        def finish(job: tuple, pld: PrivacyLossDistribution | None, computed: bool) -> None:
            if cache is not None and computed:
                cache.save(job, pld)
            if not computed:
                state["loaded"] += 1
            state["done"] += 1
            bar.advance()
            if callback is not None:
                callback(state["done"], total)

        def jobs() -> Iterator[tuple[int, tuple, bool, PrivacyLossDistribution | None]]:
            """``(k, job, found in the cache, pld)``."""
            for k, (c, p) in enumerate(tasks):
                job = (c, p, *params)
                if cache is not None:
                    found, pld = cache.load(job)
                    if found:
                        yield k, job, True, pld
                        continue
                yield k, job, False, None

        if scheduler is not None:
            listed = list(jobs())
            todo = [(k, job) for k, job, found, _ in listed if not found]
            results: dict[int, PrivacyLossDistribution | None] = {}
            for k, job, found, pld in listed:
                if found:
                    results[k] = pld
                    finish(job, pld, False)
            if todo:
                def done_dask(i: int, pld) -> None:
                    results[todo[i][0]] = pld
                    finish(todo[i][1], pld, True)

                _run_dask([job for _, job in todo], scheduler, done_dask)
            info.update({"backend": "dask" if todo else "serial", "workers": None if todo else 1,
                         "rows_loaded": state["loaded"]})
            for k in range(total):
                yield k, results[k]
            return
        if n_workers == 1 or total <= 1:
            for k, job, found, pld in jobs():
                if not found:
                    pld = _job(job)
                finish(job, pld, not found)
                yield k, pld
            info.update({"backend": "serial", "workers": 1, "rows_loaded": state["loaded"]})
            return
        window = max(1, PROCESS_WINDOW * n_workers)
        ready: dict[int, PrivacyLossDistribution | None] = {}
        nxt = 0
        with ProcessPoolExecutor(max_workers=n_workers) as pool:
            pending: dict = {}

            def collect(block: bool) -> None:
                if not pending:
                    return
                finished, _ = wait(pending, timeout=None if block else 0, return_when=FIRST_COMPLETED)
                for fut in finished:
                    k, job = pending.pop(fut)
                    pld = fut.result()
                    finish(job, pld, True)
                    ready[k] = pld

            for k, job, found, pld in jobs():
                if found:
                    finish(job, pld, False)
                    ready[k] = pld
                else:
                    pending[pool.submit(_job, job)] = (k, job)
                while len(pending) >= window:
                    collect(True)
                collect(False)
                while nxt in ready:
                    yield nxt, ready.pop(nxt)
                    nxt += 1
            while pending:
                collect(True)
                while nxt in ready:
                    yield nxt, ready.pop(nxt)
                    nxt += 1
        while nxt in ready:
            yield nxt, ready.pop(nxt)
            nxt += 1
        info.update({"backend": "processes", "workers": n_workers, "rows_loaded": state["loaded"]})


def _run_dask(jobs: list, scheduler: object, finish: Callable[[int, object], None]) -> None:
    from dpmf.accounting._dask import connect

    client, own = connect(scheduler)
    import distributed

    try:
        futures = client.map(_job, jobs, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        for fut in distributed.as_completed(futures):
            finish(index[fut.key], fut.result())
    finally:
        if own:
            client.close()
