"""Machine resources (bottom layer, next to :mod:`dpmf.errors`): the memory available now, and a
check that refuses a dense allocation that cannot fit with a :class:`~dpmf.errors.DPMFError`
instead of numpy's ``MemoryError`` (or the machine swapping to a halt); the CPUs available, and
the one cap on worker processes every process pool in dpmf goes through (:func:`usable_workers`);
:func:`on_threads`, the one thread pool of the compiled kernels that release the GIL."""

from __future__ import annotations

import math
import os
import threading

from dpmf.errors import InvalidParameterError

__all__ = ["available_memory", "available_cpus", "check_allocation", "format_bytes", "format_seconds", "on_threads",
           "usable_workers", "workers_note"]

_GIB = 2.0**30
#: Allocations up to this many bytes are never refused (and cost no look at the machine's memory).
_ALWAYS_FITS = 64.0 * 2**20


def available_memory() -> float:
    """Bytes of memory available to a new allocation (``MemAvailable`` of ``/proc/meminfo``;
    otherwise the physical memory; ``inf`` when unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - exotic platforms
        return math.inf


def available_cpus() -> int:
    """CPUs this process may run on: its CPU affinity where the platform reports one, else
    ``os.cpu_count()``, else 1 (unknown: one process is the only count known to be usable)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        return max(1, os.cpu_count() or 1)


def on_threads(fn, items) -> list:
    """``[fn(x) for x in items]``, one thread per CPU (:func:`available_cpus`): for independent calls of
    compiled kernels that release the GIL (results in the order of ``items``, the same on any number of
    threads; the first exception in that order is raised once every call has ended). A waiting thread
    sleeps on a lock: no CPU is spent spinning, unlike an OpenMP team on a loaded machine.

    The threads are kept between calls (one pool per process, made on first use; a forked child makes its
    own): starting a pool per call cost ~0.7 of ~6 CPU-s in the README snippet's calibration, whose
    tables make ~500 calls. A call from one of the pool's own threads runs its items in that thread (a
    nested call cannot wait on threads that wait on it)."""
    items = list(items)
    workers = min(available_cpus(), len(items))
    if workers <= 1 or getattr(_POOL_THREAD, "inside", False):
        return [fn(x) for x in items]
    pool = _thread_pool()
    futures = [pool.submit(fn, x) for x in items]
    for f in futures:  # (every call ends before any result or exception is taken)
        f.exception()
    return [f.result() for f in futures]


_POOL: list = []  # [(pid, ThreadPoolExecutor)]: on_threads' pool, made on first use in this process
_POOL_THREAD = threading.local()


def _mark_pool_thread() -> None:
    _POOL_THREAD.inside = True


def _thread_pool():
    from concurrent.futures import ThreadPoolExecutor

    with _POOL_LOCK:
        if not _POOL or _POOL[0][0] != os.getpid():
            _POOL[:] = [(os.getpid(), ThreadPoolExecutor(available_cpus(), thread_name_prefix="dpmf-on-threads",
                                                         initializer=_mark_pool_thread))]
        return _POOL[0][1]


_POOL_LOCK = threading.Lock()


def usable_workers(workers: int, tasks: int | None = None) -> int:
    """How many worker processes to start for ``workers`` requested and ``tasks`` jobs:
    ``min(workers, tasks, available_cpus())``, at least 1.

    More processes than jobs would sit idle, and more than the CPUs would only share them (each
    process costs memory and start-up time; ``workers=100000`` would fork until the machine
    stalls). Results never depend on the number of processes, so the cap is silent here; the CLI
    says so in a note (:func:`workers_note`). ``workers`` must already be validated (an int >= 1).
    """
    cap = min(int(workers), available_cpus())
    if tasks is not None:
        cap = min(cap, int(tasks))
    return max(1, cap)


def workers_note(workers: int | None) -> str | None:
    """The one-line note the CLI prints when ``--workers`` asks for more processes than this
    machine's CPUs (``None`` when it does not)."""
    cpus = available_cpus()
    if workers is None or isinstance(workers, bool) or not isinstance(workers, int) or workers <= cpus:
        return None
    return (
        f"--workers {workers:,} is more than the {cpus} CPU{'s' if cpus != 1 else ''} this process can use; "
        f"starting at most {cpus} worker process{'es' if cpus != 1 else ''} (and never more than there are tasks)"
    )


def one_blas_thread():
    """A context in which BLAS/LAPACK run on one thread. For loops of small products and eigenvalue
    problems (``b x b`` with ``b <= ~256``): on a shared 2-core machine a threaded OpenBLAS was 10-30x
    *slower* on them (measured: ``eigvalsh`` of 100 x 100, 4.4 ms -> 0.25 ms of CPU per call;
    conditional composition's per-step ``(6 r) x b`` by ``b x b`` products, 10-15x; the ghost rules'
    Grams 25x; the recurrent rules' per-step ``gemm``, 10x). Entering costs a few microseconds (each
    library's count read, and set only where it is not 1 already), so nesting is free."""
    return _OneBlasThread(_blas_libraries())


_BLAS_LIBRARIES: list = []


def _blas_libraries() -> list:
    """threadpoolctl's controllers of the loaded BLAS libraries (numpy's and SciPy's, whose BLAS numba's
    ``np.dot`` calls), found once: ``threadpool_limits`` scans every loaded library at each entry, 6-14 ms
    in a process holding torch and JAX (a quarter of a recurrent training step; seconds a call late in a
    long test process, where allocation's accountant enters it at every memoized call). A library
    loaded later is not limited."""
    if not _BLAS_LIBRARIES:
        import scipy.linalg.cython_blas  # noqa: F401  (SciPy's BLAS loaded before the scan)
        from threadpoolctl import ThreadpoolController

        _BLAS_LIBRARIES.append([lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"])
    return _BLAS_LIBRARIES[0]


class _OneBlasThread:
    """:func:`one_blas_thread`'s context: each library's thread count read, set to 1 where it is not, and
    put back on exit."""

    def __init__(self, libraries: list):
        self._libraries = libraries

    def __enter__(self):
        self._old = [(lib, lib.num_threads) for lib in self._libraries]
        for lib, n in self._old:
            if n != 1:
                lib.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        for lib, n in self._old:
            if n != 1:
                lib.set_num_threads(n)
        return False


def format_bytes(b: float) -> str:
    """``"149 GiB"``, ``"12 MiB"`` (binary units)."""
    if not math.isfinite(b):
        return "unbounded memory"
    if b < 2**20:
        return "under 1 MiB"
    if b < _GIB:
        return f"{b / 2**20:.0f} MiB"
    return f"{b / _GIB:.3g} GiB"


def format_seconds(s: float) -> str:
    """``"40 s"``, ``"12 min"``, ``"3 h"``, ``"5 days"``, ``"2.3e+08 years"``."""
    if not math.isfinite(s):
        return "forever"
    if s < 1:
        return "under 1 s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.0f} h"
    if s < 2 * 365 * 86400:
        return f"{s / 86400:.0f} days"
    return f"{s / (365 * 86400):.2g} years"


def check_allocation(rows: int, cols: int, what: str, *, copies: float = 1.0, itemsize: int = 8,
                     hint: str = "use fewer steps") -> None:
    """Raise :class:`InvalidParameterError` when ``copies`` dense ``rows x cols`` arrays of
    ``itemsize``-byte entries (float64 / int64 by default) would not fit in the memory available.

    The one memory guard every dense form and buffer sized by user input goes through (the
    strategies' dense encoders, decoders and coefficient vectors, the streaming noise buffers, the
    samplers' per-example arrays, the accountants' dense rows): one line naming ``what`` needs the
    memory, the estimate, what is available and ``hint`` (how to go smaller), before numpy's
    ``MemoryError`` ("Unable to allocate 8.00 TiB") or the machine swapping to a halt."""
    need = float(itemsize) * float(copies) * float(rows) * float(cols)
    if need <= _ALWAYS_FITS:
        return  # (no /proc read for the small arrays of inner loops)
    have = available_memory()
    if need > have:
        shape = f"a dense {rows:,} x {cols:,} array" if rows != 1 else f"an array of {cols:,} entries"
        times = "" if copies == 1 else f" ({copies:g} copies)"
        raise InvalidParameterError(
            f"{what} needs {shape}{times} ({format_bytes(need)}), more than the "
            f"{format_bytes(have)} of memory available; {hint}"
        )
