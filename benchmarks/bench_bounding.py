"""Contribution bounding on a graph of 10^6 attribution edges (dpmf.sampling.bound_contributions).

Graph: 660,000 examples with 1-4 users each (geometric, mean ~1.5; duplicate pairs merged) drawn from 250,000 users with
Zipf-like popularity (a few users own thousands of examples), ~10^6 edges, seed 0.

* ``greedy_k1_1e6``: the user bound ``k_u = 1``. Peer: jax_privacy's GitHub
  ``greedy_contribution_bound`` (``jax_privacy/_multi_owner.py``, snapshot 8967688; not in the
  2.0.0 release: loaded from a checkout named by ``JAX_PRIVACY_SRC`` or a bare git
  repository of it named by ``JAX_PRIVACY_GIT``), a round-based vectorized greedy for ``k = 1``
  (priority: number of users, then example id), with its ``MultiOwnerGraph`` built from the edges.
  dpmf: ``attribution_from_edges`` + ``bound_contributions(k_u=1, seed=0)`` (ties in a random
  order). Agreement: both keep at most one example per user; dpmf's greedy run on the peer's order
  (degree, id) keeps exactly the peer's examples; the kept counts are printed.
* ``greedy_k2_1e6``: ``k_u = 2``, which the peer does not offer: the peer column is a plain-Python
  loop of the same greedy (as tests/sampling/test_bounding.py's literal reference, without ``k_e``),
  on the same (degree, id) order, against dpmf's compiled kernel on that order; agreement: identical
  kept sets. (The edge bound ``k_e`` has no peer; its time is in the scaling table.)

``python benchmarks/bench_bounding.py`` also prints dpmf's absolute time against the number of
edges (10^4 .. 10^6), the scaling table of benchmarks/README.md.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
from case import Case

from dpmf.sampling import attribution_from_edges, bound_contributions
from dpmf.sampling.bounding import _greedy



def make_graph(num_examples: int, num_users: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    degree = np.minimum(rng.geometric(0.65, num_examples), 4)
    ex = np.repeat(np.arange(num_examples), degree)
    popularity = 1.0 / np.arange(1, num_users + 1) ** 0.8
    us = rng.choice(num_users, size=ex.size, p=popularity / popularity.sum())
    key = np.unique(ex * num_users + us)  # no duplicate (example, user) pairs (the peer refuses them)
    return key // num_users, key % num_users


EX, US = make_graph(660_000, 250_000)


def _peer_source(name: str) -> str:
    root = os.environ.get("JAX_PRIVACY_SRC")
    if root:
        return (Path(root) / "jax_privacy" / name).read_text()
    git_dir = os.environ.get("JAX_PRIVACY_GIT")
    if not git_dir:
        raise SystemExit("set JAX_PRIVACY_SRC to a jax_privacy checkout (GitHub, not the 2.0.0 release) "
                         "or JAX_PRIVACY_GIT to a git repository of it")
    return subprocess.run(["git", "-C", git_dir, "show", f"HEAD:jax_privacy/{name}"], check=True,
                          capture_output=True, text=True).stdout


def _load_peer():
    """jax_privacy's GitHub ``_multi_owner`` as module ``_jp_github._multi_owner`` (its ``_validate``
    from the same snapshot; ``batch_selection`` from the installed release, for a base class)."""
    if "_jp_github._multi_owner" in sys.modules:
        return sys.modules["_jp_github._multi_owner"]
    from jax_privacy import batch_selection

    pkg = types.ModuleType("_jp_github")
    pkg.__path__ = []
    sys.modules["_jp_github"] = pkg
    sys.modules["_jp_github.batch_selection"] = batch_selection
    pkg.batch_selection = batch_selection
    for name in ("_validate", "_multi_owner"):
        spec = importlib.util.spec_from_loader(f"_jp_github.{name}", loader=None)
        mod = importlib.util.module_from_spec(spec)
        mod.__package__ = "_jp_github"
        sys.modules[f"_jp_github.{name}"] = mod
        exec(compile(_peer_source(f"{name}.py"), f"jax_privacy/{name}.py", "exec"), mod.__dict__)
        setattr(pkg, name, mod)
    return sys.modules["_jp_github._multi_owner"]


def _peer_k1():
    mo = _load_peer()
    graph = mo.MultiOwnerGraph(EX, US)
    return np.sort(mo.greedy_contribution_bound(graph, max_degree=64))


def _dpmf(k_u, k_e=None):
    def run():
        return bound_contributions(attribution_from_edges(EX, US), k_u, max_neighbourhood=k_e, seed=0)

    return run


def _degree_id_order(att):
    degree = np.diff(att.example_ptr)
    return np.lexsort((np.arange(att.num_examples), degree)).astype(np.int64)


def _per_user_max(att, kept):
    keep = np.zeros(att.num_examples, dtype=bool)
    keep[kept] = True
    ex_of_edge = np.repeat(np.arange(att.num_examples), np.diff(att.example_ptr))
    return int(np.bincount(att.user_of[keep[ex_of_edge]], minlength=att.num_users).max())


def _compare_k1(peer, ours):
    att = attribution_from_edges(EX, US)
    same_order = np.flatnonzero(
        _greedy(_degree_id_order(att), att.example_ptr, att.user_of, att.user_ptr, att.example_of, 1, -1,
                att.num_users) == 0)
    ok = (_per_user_max(att, peer) <= 1 and ours.report.max_user_examples <= 1
          and np.array_equal(same_order, peer))
    return ok, (f"kept: peer {peer.size}, dpmf {ours.report.kept_examples} (random ties), dpmf on the peer's "
                f"order {same_order.size}, identical to the peer: {np.array_equal(same_order, peer)}")


def _python_greedy(k_u):
    """The literal greedy in plain Python (the reference), on the (degree, id) order."""
    def run():
        att = attribution_from_edges(EX, US)
        ptr, user_of = att.example_ptr.tolist(), att.user_of.tolist()
        count = [0] * att.num_users
        kept = []
        for e in _degree_id_order(att).tolist():
            users = user_of[ptr[e]: ptr[e + 1]]
            if all(count[u] < k_u for u in users):
                kept.append(e)
                for u in users:
                    count[u] += 1
        return np.sort(np.array(kept))

    return run


def _dpmf_on_order(k_u):
    def run():
        att = attribution_from_edges(EX, US)
        code = _greedy(_degree_id_order(att), att.example_ptr, att.user_of, att.user_ptr, att.example_of, k_u, -1,
                       att.num_users)
        return np.flatnonzero(code == 0)

    return run


def _compare_same(peer, ours):
    ok = np.array_equal(peer, ours)
    return ok, f"kept {ours.size} of {EX.max() + 1}; identical: {ok}"


CASES = [
    Case("greedy_k1_1e6", _peer_k1, _dpmf(1), _compare_k1,
         "both <= 1 example per user; dpmf on the peer's (degree, id) order keeps exactly the peer's examples",
         peer_name="jax_privacy (GitHub 8967688)"),
    Case("greedy_k2_1e6", _python_greedy(2), _dpmf_on_order(2), _compare_same,
         "identical kept sets (same order, same greedy)", peer_name="plain Python reference"),
]


def scaling(repeats: int = 3) -> list[tuple]:
    """dpmf's median wall and CPU time (graph construction + bounding) against the number of edges."""
    rows = []
    for m in (6_600, 66_000, 660_000):
        ex, us = make_graph(m, max(1000, m * 25 // 66))
        for k_u, k_e in ((1, None), (2, None), (2, 4)):
            times, cpu = [], []
            for _ in range(repeats):
                t, c = time.perf_counter(), time.process_time()
                res = bound_contributions(attribution_from_edges(ex, us), k_u, max_neighbourhood=k_e, seed=0)
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
            rows.append((ex.size, k_u, k_e, float(np.median(times)), float(np.median(cpu)), res.report.kept_examples, m))
    return rows


if __name__ == "__main__":
    bound_contributions([[0]], 1, seed=0)  # compile / load the kernels first
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| edges | k_u | k_e | wall, median (s) | CPU, median (s) | kept / examples |")
    print("|---:|---:|---:|---:|---:|---:|")
    for edges, k_u, k_e, t, c, kept, m in scaling():
        print(f"| {edges:,} | {k_u} | {k_e or '-'} | {t:.3f} | {c:.3f} | {kept:,} / {m:,} |")
