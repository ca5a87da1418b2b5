"""``dpmf.resources.on_threads``: the one thread pool of the compiled kernels (allocation's tables)."""

from __future__ import annotations

import pytest


def test_on_threads_keeps_its_pool_and_runs_nested_calls_inline():
    """``resources.on_threads``: results in the order of the items, the first exception in that order raised
    after every call ended, one pool kept between calls (the same executor), a nested call from a pool
    thread run in that thread (no deadlock), and a forked child gets a pool of its own."""
    import os
    import threading

    from dpmf import resources

    if resources.available_cpus() < 2:
        pytest.skip("one CPU: on_threads runs serially")
    assert resources.on_threads(lambda x: x * x, range(6)) == [0, 1, 4, 9, 16, 25]
    pool = resources._thread_pool()
    assert resources.on_threads(lambda x: -x, range(3)) == [0, -1, -2] and resources._thread_pool() is pool
    names = resources.on_threads(lambda x: resources.on_threads(lambda y: threading.current_thread().name, range(2)),
                                 range(3))
    assert all(len(set(row)) == 1 and row[0].startswith("dpmf-on-threads") for row in names)
    done = []
    with pytest.raises(ZeroDivisionError):
        resources.on_threads(lambda x: done.append(x) or 1 / (x - 1), range(4))
    assert sorted(done) == [0, 1, 2, 3]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, repr(resources.on_threads(lambda x: x + 1, range(3))).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 100) == b"[1, 2, 3]"
