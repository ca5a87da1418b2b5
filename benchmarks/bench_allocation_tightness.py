"""DP-SGD under random allocation: how tight is ``allocation_pld`` on the issue-23 grid?

For one epoch of ``t`` steps (each example in one uniformly random step, ``C = I``), noise ``sigma``
and target ``delta``, this compares dpmf's :func:`~dpmf.accounting.allocation.pld.allocation_pld_epsilon`
(a certified upper bound) with

* PLD_accounting 2.0 (PyPI ``pld-accounting==2.0``, Feldman & Shenfeld):
  ``gaussian_allocation_epsilon_range`` returns an upper **and a lower** bound on the exact epsilon;
* random-allocation 1.0.5 (PyPI ``random-allocation==1.0.5``, the same authors' earlier package):
  ``allocation_epsilon_combined``, the smallest of its RDP / analytic / decomposition upper bounds.

Printed per point: dpmf's epsilon, ``dpmf / best upper`` (the smaller of the two peers' upper
bounds; the issue's goal is ``<= 1.05``), ``dpmf / PLD lower`` (must be ``>= 1``: below it dpmf
would be optimistic), and the time ratio ``peer s / dpmf s``.

    python benchmarks/bench_allocation_tightness.py --fast            # 4 points, a few minutes
    nice -n 10 python benchmarks/bench_allocation_tightness.py        # the whole grid (100 points)
    python benchmarks/bench_allocation_tightness.py --memory          # peak RSS at t = 10^4, 10^5
    python benchmarks/bench_allocation_tightness.py --cached-only --markdown   # dpmf now, peers cached

Every peer call runs in its own child process (after a small warm-up call, so numba compilation is
not timed) under ``--peer-timeout`` seconds; a peer that does not finish is reported as such, not
guessed. Peer results are cached in ``benchmarks/results/allocation_tightness_peers.json``
(git-ignored; ``--no-cache`` ignores it), so a rerun after a dpmf change recomputes only dpmf.
The peers are found on ``sys.path`` (``PYTHONPATH=<dir>`` if installed with ``pip install
--target <dir> --no-deps``: random-allocation pins ``numpy<2.2``, which must not downgrade the main
environment). random-allocation's package ``__init__`` imports pandas and matplotlib for its
plots; its accounting modules need neither, so the child loads them without running that
``__init__`` (``_load_random_allocation``).

``--memory``: dpmf alone in a fresh child per case (``t`` in 10^4, 10^5; ``sigma = 1, delta = 1e-5``
and the grid's hardest corner ``sigma = 0.5, delta = 1e-12``);
the child's maximum resident set size comes from ``os.wait4`` (the whole process: interpreter,
numpy, scipy and dpmf). The issue's goal is ``<= 300 MiB`` for every ``t <= 10^5``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / "results" / "allocation_tightness_peers.json"

SIGMAS = (0.5, 0.7, 1.0, 2.0, 4.0)
STEPS = (2, 10, 100, 1000, 10_000)
DELTAS = (1e-4, 1e-7, 1e-10, 1e-12)
FAST = ((1.0, 100, 1e-7), (0.5, 10, 1e-12), (2.0, 1000, 1e-10), (0.7, 2, 1e-4))
MEMORY_STEPS = (10_000, 100_000)
#: the issue's goal: within 5% of the best public upper bound
GOAL = 1.05


# ----------------------------------------------------------------------------- child side
def _load_random_allocation():
    """Import random-allocation's accounting modules without its package ``__init__`` (which pulls
    pandas/matplotlib for plotting): register the two packages as bare modules with their path."""
    spec = importlib.util.find_spec("random_allocation")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("random_allocation is not importable")
    root = list(spec.submodule_search_locations)[0]
    for name, sub in (("random_allocation", ""), ("random_allocation.comparisons", "comparisons")):
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [os.path.join(root, sub) if sub else root]
            sys.modules[name] = mod
    # definitions first: it star-imports the scheme package, which imports it back (the order the
    # package's own __init__ uses)
    import random_allocation.comparisons.definitions  # noqa: F401, PLC0415
    from random_allocation.comparisons.structs import PrivacyParams, SchemeConfig  # noqa: PLC0415
    from random_allocation.random_allocation_scheme.combined import allocation_epsilon_combined  # noqa: PLC0415

    # the direct RDP bound needs integer orders; 2..60 as in the package's paper experiments
    config = SchemeConfig(allocation_direct_alpha_orders=list(range(2, 61)))

    def run(sigma, t, delta):
        return allocation_epsilon_combined(PrivacyParams(sigma=sigma, num_steps=t, delta=delta), config)

    return run


def _load_pld_accounting():
    import PLD_accounting  # noqa: PLC0415

    def run(sigma, t, delta):
        return tuple(PLD_accounting.gaussian_allocation_epsilon_range(delta=delta, sigma=sigma, num_steps=t))

    return run


def _dpmf_run(sigma, t, delta):
    from dpmf.accounting.allocation.pld import allocation_pld_epsilon  # noqa: PLC0415

    out = allocation_pld_epsilon(sigma, t, delta)
    return {"epsilon": out["epsilon"], "by_direction": out["epsilon_by_direction"],
            "levels": {k: len(v) for k, v in out.get("refinements", {}).items()}}


def _child(which: str, sigma: float, t: int, delta: float) -> None:
    if which == "pld_accounting":
        run = _load_pld_accounting()
    elif which == "random_allocation":
        run = _load_random_allocation()
    else:
        run = _dpmf_run
    if which != "dpmf":
        run(1.0, 4, 1e-5)  # warm-up: numba compilation is not part of the timed call
    start = time.perf_counter()
    value = run(sigma, t, delta)
    print(json.dumps({"value": value, "seconds": time.perf_counter() - start}))


# ----------------------------------------------------------------------------- parent side
def _spawn(which: str, sigma: float, t: int, delta: float, timeout: float) -> dict:
    """Run one call in a child; returns its JSON plus ``max_rss_mib``, or ``{"error": ...}``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", which, repr(sigma), str(t), repr(delta)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": f"timeout {timeout:.0f} s"}
    if proc.returncode != 0:
        last = (err.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {last[:120]}"}
    return json.loads(out.strip().splitlines()[-1])


def _peer_available(which: str) -> bool:
    name = "PLD_accounting" if which == "pld_accounting" else "random_allocation"
    return importlib.util.find_spec(name) is not None


def _load_cache(use: bool) -> dict:
    if use and CACHE.exists():
        return json.loads(CACHE.read_text())
    return {}


def _save_cache(cache: dict) -> None:
    """Merge into the file's current content (another run may have added entries meanwhile)."""
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    merged = {**_load_cache(True), **cache}
    cache.update(merged)
    tmp = CACHE.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(merged, indent=1, sort_keys=True))
    tmp.replace(CACHE)


def _peer(cache: dict, which: str, sigma: float, t: int, delta: float, timeout: float, cached_only=False) -> dict:
    key = f"{which}|{sigma!r}|{t}|{delta!r}"
    hit = cache.get(key)
    if cached_only:
        return hit if hit is not None else {"error": "not run"}
    # a cached timeout is retried only with a longer timeout
    if hit is not None and not ("error" in hit and hit["error"].startswith("timeout") and hit.get("timeout", 0) < timeout):
        return hit
    res = _spawn(which, sigma, t, delta, timeout) if _peer_available(which) else {"error": "not installed"}
    res["timeout"] = timeout
    if "error" not in res or res["error"].startswith("timeout"):  # failures are not cached
        cache[key] = res
        _save_cache(cache)
    return res


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def run_grid(points, timeout: float, use_cache: bool, peers: tuple[str, ...], cached_only: bool = False) -> list[dict]:
    cache = _load_cache(use_cache)
    rows = []
    header = ("sigma", "t", "delta", "dpmf eps", "PLD [lower, upper]", "RA upper", "dpmf/best up",
              "dpmf/PLD lo", "dpmf s", "PLD s", "RA s", "flag")
    print(" | ".join(header), flush=True)
    for sigma, t, delta in points:
        start = time.perf_counter()
        ours = _dpmf_run(sigma, t, delta)
        dpmf_s = time.perf_counter() - start
        pld = (_peer(cache, "pld_accounting", sigma, t, delta, timeout, cached_only) if "pld_accounting" in peers
               else {"error": "skipped"})
        ra = (_peer(cache, "random_allocation", sigma, t, delta, timeout, cached_only) if "random_allocation" in peers
              else {"error": "skipped"})
        eps = ours["epsilon"]
        up = lo = ra_up = None
        if "value" in pld:
            up, lo = pld["value"]
        if "value" in ra and ra["value"] is not None and math.isfinite(ra["value"]):
            ra_up = float(ra["value"])
        best = min([v for v in (up, ra_up) if v is not None], default=None)
        r_up = eps / best if best else None
        r_lo = eps / lo if lo else None
        flag = []
        if r_lo is not None and eps < lo * (1 - 1e-9):
            flag.append("BELOW LOWER")
        if r_up is not None and r_up > GOAL:
            flag.append("LOOSE")
        if best is None:
            flag.append("no peer: " + "; ".join(p.get("error", "") for p in (pld, ra) if "error" in p))
        row = {"sigma": sigma, "t": t, "delta": delta, "dpmf": eps, "dpmf_by_direction": ours["by_direction"],
               "dpmf_levels": ours["levels"], "dpmf_s": dpmf_s, "pld": pld, "ra": ra, "best_upper": best,
               "ratio_upper": r_up, "ratio_lower": r_lo, "flag": " ".join(flag)}
        rows.append(row)
        print(" | ".join([
            f"{sigma:g}", str(t), f"{delta:.0e}", f"{eps:.6g}",
            f"[{_fmt(lo, '.6g')}, {_fmt(up, '.6g')}]" if up is not None else pld.get("error", "-"),
            _fmt(ra_up, ".6g") if ra_up is not None else ra.get("error", "-"),
            _fmt(r_up), _fmt(r_lo), f"{dpmf_s:.2f}",
            _fmt(pld.get("seconds"), ".2f"), _fmt(ra.get("seconds"), ".2f"), row["flag"],
        ]), flush=True)
    return rows


def markdown(rows) -> str:
    lines = ["| sigma | t | delta | dpmf eps | PLD_accounting [lower, upper] | random-allocation upper | "
             "dpmf / best upper | dpmf / lower | dpmf s | PLD_acc. s / dpmf s | random-alloc. s / dpmf s |",
             "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        pld, ra = r["pld"], r["ra"]
        rng = (f"[{pld['value'][1]:.5g}, {pld['value'][0]:.5g}]" if "value" in pld else pld.get("error", "-"))
        ra_txt = f"{ra['value']:.5g}" if "value" in ra and ra["value"] is not None else ra.get("error", "-")
        t_pld = _fmt(pld["seconds"] / r["dpmf_s"], ".3g") + "x" if "seconds" in pld else "-"
        t_ra = _fmt(ra["seconds"] / r["dpmf_s"], ".3g") + "x" if "seconds" in ra else "-"
        flag = f" **{r['flag']}**" if r["flag"] and not r["flag"].startswith("no peer") else ""
        lines.append(
            f"| {r['sigma']:g} | {r['t']} | {r['delta']:.0e} | {r['dpmf']:.5g} | {rng} | {ra_txt} | "
            f"{_fmt(r['ratio_upper'])}{flag} | {_fmt(r['ratio_lower'])} | {r['dpmf_s']:.2f} | {t_pld} | {t_ra} |"
        )
    return "\n".join(lines)


def summary(rows) -> str:
    ru = [r["ratio_upper"] for r in rows if r["ratio_upper"] is not None]
    rl = [r["ratio_lower"] for r in rows if r["ratio_lower"] is not None]
    loose = [r for r in rows if "LOOSE" in r["flag"]]
    below = [r for r in rows if "BELOW" in r["flag"]]
    nopeer = [r for r in rows if r["best_upper"] is None]
    parts = [f"{len(rows)} points; compared with a peer upper bound: {len(ru)}"]
    if ru:
        parts.append(f"dpmf / best upper in [{min(ru):.4f}, {max(ru):.4f}]; above {GOAL}: {len(loose)}")
    if rl:
        parts.append(f"dpmf / PLD lower in [{min(rl):.4f}, {max(rl):.4f}]; below 1: {len(below)}")
    if nopeer:
        parts.append(f"no peer value at {len(nopeer)} points")
    return "; ".join(parts)


#: (sigma, delta) of the memory runs: the usual case and the grid's hardest corner
MEMORY_CASES = ((1.0, 1e-5), (0.5, 1e-12))
#: no run.py cases: the grid runs each peer in its own child process under a timeout (see the docstring)
CASES: list = []


def _memory() -> list[dict]:
    rows = []
    for t in MEMORY_STEPS:
        for sigma, delta in MEMORY_CASES:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "dpmf", repr(sigma), str(t), repr(delta)]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            out = proc.stdout.read()
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            res = json.loads(out.strip().splitlines()[-1])
            rows.append({"t": t, "sigma": sigma, "delta": delta, "epsilon": res["value"]["epsilon"],
                         "seconds": res["seconds"], "max_rss_mib": usage.ru_maxrss / 1024})
            print(f"t={t} sigma={sigma:g} delta={delta:g}: epsilon {res['value']['epsilon']:.6g}, {res['seconds']:.2f} s, "
                  f"max RSS {usage.ru_maxrss / 1024:.0f} MiB", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true", help="4 points instead of the 100-point grid")
    ap.add_argument("--memory", action="store_true", help="peak RSS of dpmf at t = 10^4 and 10^5 (no peers)")
    ap.add_argument("--peer-timeout", type=float, default=600.0, help="seconds per peer call (default 600)")
    ap.add_argument("--no-cache", action="store_true", help="recompute the peers")
    ap.add_argument("--cached-only", action="store_true", help="peers from the cache only (no new peer calls)")
    ap.add_argument("--peers", default="pld_accounting,random_allocation", help="comma-separated peers to run")
    ap.add_argument("--sigmas", help="comma-separated subset of the grid's sigmas")
    ap.add_argument("--steps", help="comma-separated subset of the grid's t")
    ap.add_argument("--deltas", help="comma-separated subset of the grid's deltas")
    ap.add_argument("--markdown", action="store_true", help="also print the README table")
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        which, s, t, d = args.child
        _child(which, float(s), int(t), float(d))
        return 0
    if args.memory:
        _memory()
        return 0
    if args.fast:
        points = list(FAST)
    else:
        sig = [float(x) for x in args.sigmas.split(",")] if args.sigmas else SIGMAS
        stp = [int(x) for x in args.steps.split(",")] if args.steps else STEPS
        dl = [float(x) for x in args.deltas.split(",")] if args.deltas else DELTAS
        points = [(s, t, d) for t in stp for s in sig for d in dl]
    rows = run_grid(points, args.peer_timeout, not args.no_cache, tuple(args.peers.split(",")), args.cached_only)
    print(summary(rows))
    if args.markdown:
        print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if any("BELOW" in r["flag"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
