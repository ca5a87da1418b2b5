"""Run the peer-vs-dpmf benchmarks.

    python benchmarks/run.py [--quick] [--only NAME] [--repeats R] [--markdown]

Discovers ``benchmarks/bench_*.py`` (each exposes ``CASES``, see ``case.py``). For every case it
runs the peer and dpmf ``R`` times (alternating), reports the median seconds of each, the ratio
peer/dpmf (> 1: dpmf is faster) and the agreement check; prints a table, writes
``benchmarks/results/latest.json`` and, with ``--markdown``, prints a markdown table. The exit
status is 1 if any agreement check fails (or a case raises).

``--quick``: one repeat and no ``slow`` cases. ``--only NAME``: cases whose ``module/case`` name
contains NAME (e.g. ``--only mixture``, ``--only dpsgd_epsilon``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402


def discover() -> list[tuple[str, object]]:
    """``(module_name, case)`` for every case in ``bench_*.py``, in file order."""
    found = []
    for path in sorted(HERE.glob("bench_*.py")):
        module = importlib.import_module(path.stem)
        found += [(path.stem.removeprefix("bench_"), case) for case in module.CASES]
    return found


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def run_case(case, repeats: int, console: Console) -> dict:
    row = {"tolerance": case.tolerance, "peer_name": case.peer_name, "peer_seconds": [], "dpmf_seconds": []}
    try:
        for i in range(repeats):
            console.log(f"{case.name}: repeat {i + 1}/{repeats}, peer")
            t, peer_result = timed(case.peer)
            row["peer_seconds"].append(t)
            console.log(f"{case.name}: repeat {i + 1}/{repeats}, dpmf")
            t, dpmf_result = timed(case.dpmf)
            row["dpmf_seconds"].append(t)
        ok, detail = case.compare(peer_result, dpmf_result)
    except Exception as exc:  # a crash is a failed case, not a crashed run
        traceback.print_exc()
        ok, detail = False, f"raised {type(exc).__name__}: {exc}"
    row["ok"], row["detail"] = bool(ok), detail
    if row["peer_seconds"] and row["dpmf_seconds"]:
        row["peer_median"] = statistics.median(row["peer_seconds"])
        row["dpmf_median"] = statistics.median(row["dpmf_seconds"])
        row["ratio"] = row["peer_median"] / row["dpmf_median"]
    return row


def machine() -> dict:
    def version(pkg):
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {p: version(p) for p in ("dpmf", "dp-accounting", "numpy", "scipy")},
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--", "src")),
    }


def fmt_s(x) -> str:
    return "-" if x is None else (f"{x:.3f}" if x < 10 else f"{x:.1f}")


def fmt_ratio(x) -> str:
    return "-" if x is None else (f"{x:.2f}x" if x < 10 else f"{x:.0f}x")


def print_table(console: Console, rows: list[dict], repeats: int) -> None:
    peers = ", ".join(sorted({r["peer_name"] for r in rows}))
    table = Table(title=f"{peers} (peer) vs dpmf (median of {repeats} run(s), seconds)")
    for col, kw in [
        ("case", {"no_wrap": True}),
        ("peer s", {"justify": "right", "no_wrap": True}),
        ("dpmf s", {"justify": "right", "no_wrap": True}),
        ("peer/dpmf", {"justify": "right", "no_wrap": True}),
        ("agree", {"no_wrap": True}),
        ("detail", {"overflow": "fold"}),
    ]:
        table.add_column(col, **kw)
    for r in rows:
        table.add_row(
            r["name"],
            fmt_s(r.get("peer_median")),
            fmt_s(r.get("dpmf_median")),
            fmt_ratio(r.get("ratio")),
            "[green]ok[/]" if r["ok"] else "[red]FAIL[/]",
            r["detail"],
        )
    console.print(table)


def md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(rows: list[dict], info: dict, repeats: int) -> str:
    lines = [
        f"Measured {info['date'][:10]} on {info['cpu_count']} cores ({info['processor']}), no GPU; "
        f"dpmf {info['versions']['dpmf']} (git {info['git_commit']}{', dirty' if info['git_dirty'] else ''}), "
        f"dp-accounting {info['versions']['dp-accounting']}, Python {info['python']}; "
        f"median of {repeats} run(s).",
        "",
        "| case | peer s | dpmf s | peer/dpmf | agreement | tolerance |",
        "|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        verdict = ("ok: " if r["ok"] else "**FAIL**: ") + r["detail"]
        lines.append(
            f"| `{r['name']}` | {fmt_s(r.get('peer_median'))} | {fmt_s(r.get('dpmf_median'))} | "
            f"{fmt_ratio(r.get('ratio'))} | {md_cell(verdict)} | {md_cell(r['tolerance'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repeat, skip slow cases")
    parser.add_argument("--only", metavar="NAME", help="run cases whose 'module/case' name contains NAME")
    parser.add_argument("--repeats", type=int, default=None, help="runs per library and case (default 3; 1 with --quick)")
    parser.add_argument("--markdown", action="store_true", help="also print a markdown table")
    args = parser.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if repeats < 1:
        parser.error("--repeats must be >= 1")

    console = Console() if sys.stdout.isatty() else Console(width=160)  # logs: keep rows readable
    cases = [
        (mod, c)
        for mod, c in discover()
        if (not args.quick or not c.slow) and (args.only is None or args.only in f"{mod}/{c.name}")
    ]
    if not cases:
        console.print("[red]no benchmark case matches[/]")
        return 2

    info = machine()
    rows = []
    for mod, case in cases:
        row = {"module": mod, "name": case.name, **run_case(case, repeats, console)}
        rows.append(row)
        status = "ok" if row["ok"] else "FAIL"
        console.log(f"{case.name}: {status}, peer {fmt_s(row.get('peer_median'))} s, dpmf {fmt_s(row.get('dpmf_median'))} s")

    print_table(console, rows, repeats)
    out = HERE / "results" / "latest.json"
    out.parent.mkdir(exist_ok=True)
    payload = {"machine": info, "args": {**vars(args), "repeats": repeats}, "cases": rows}
    out.write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"wrote {out.relative_to(HERE.parent)}")
    if args.markdown:
        print(markdown(rows, info, repeats))
    failed = [r["name"] for r in rows if not r["ok"]]
    if failed:
        console.print(f"[red]agreement failed: {', '.join(failed)}[/]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
