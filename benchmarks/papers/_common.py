"""Shared helpers for the paper reproductions in ``benchmarks/papers/``.

Every script builds a :class:`Report`: rows that put a value typed in from the paper beside the value
dpmf computes (:meth:`Report.numeric`), rows that check a claim the paper makes in its text about a
figure (:meth:`Report.claim`), rows that cannot be reproduced with the reason
(:meth:`Report.not_reproduced`), and figures (:meth:`Report.figure`). :meth:`Report.write` writes
``<out>/paperNNN.md`` (markdown table + images), ``<out>/paperNNN.json`` (the same rows, machine
readable; the tests read it) and rebuilds ``<out>/index.md`` from every ``paper*.json`` present.

Verdicts:

* ``reproduced``: |dpmf - published| is within the stated tolerance (usually what the paper's
  rounding allows: half a unit of the last printed digit), or the claim holds in dpmf's numbers;
* ``differs-explained``: outside the tolerance, with the reason written next to it (a typo listed
  in the notes, an unknown delta split, a tighter bound of ours, Monte Carlo noise, ...). The
  scripts never tune a setting until a number matches;
* ``not reproduced``: dpmf does not produce the number, with the reason.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REPRODUCED = "reproduced"
EXPLAINED = "differs-explained"
NOT_REPRODUCED = "not reproduced"
VERDICTS = (REPRODUCED, EXPLAINED, NOT_REPRODUCED)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "docs" / "reproductions"
PAPERS = {
    "000": "Choquette-Choo, Ganesh, Steinke, Thakurta. Privacy Amplification for Matrix Mechanisms (MMCC), ICLR 2024",
    "001": "Dong, Ganesh. Privacy Amplification for BandMF via b-Min-Sep Subsampling, 2026",
    "002": "Schuchardt, Kalinin. Sampling-Free Privacy Accounting for Matrix Mechanisms under Random Allocation",
    "003": "Choquette-Choo, McMahan, Rush, Thakurta. Multi-Epoch Matrix Factorization Mechanisms for Private ML, ICML 2023",
    "004": "Koskela, Tobaben, Honkela. Individual Privacy Accounting with Gaussian Differential Privacy",
}


# ----------------------------------------------------------------------------------- formatting
def fmt(x, digits: int = 4) -> str:
    """A number for a table: ``digits`` significant digits, scientific notation when large/small."""
    if x is None:
        return "—"
    if isinstance(x, str):
        return x
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def rounding_tolerance(printed: str) -> float:
    """Half a unit of the last digit printed: ``"0.397"`` -> 5e-4, ``"2.3e6"`` -> 5e4, ``"495"`` -> 0.5.

    A value the paper prints as ``printed`` is any number that rounds to it, so this is the
    tolerance the paper's rounding allows.
    """
    s = printed.strip().lower().replace("−", "-")
    mant, _, exp = s.partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    return 0.5 * 10.0 ** (-decimals) * 10.0 ** (int(exp) if exp else 0)


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# ----------------------------------------------------------------------------------- rows
@dataclass
class Row:
    """One compared item. ``published``/``ours`` are display strings; ``published_value`` and
    ``ours_value`` keep the numbers (``None`` for claims) so tests can recheck the tolerance."""

    key: str
    item: str
    source: str
    published: str
    ours: str
    diff: str
    verdict: str
    note: str = ""
    published_value: float | None = None
    ours_value: float | None = None
    tolerance: float | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")


@dataclass
class Figure:
    filename: str
    caption: str


@dataclass
class Report:
    """Rows, figures and text of one paper's reproduction page."""

    paper: str  # "000" .. "004"
    title: str
    script: str  # file name of the script, for the "how to run" line
    fast: bool
    out: Path = DEFAULT_OUT
    rows: list[Row] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)  # (heading, markdown)
    setup: list[str] = field(default_factory=list)  # bullet points: settings used
    full_mode_estimate: str = ""
    started: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)

    # -------------------------------------------------------------- adding rows
    def _add(self, row: Row) -> Row:
        if any(r.key == row.key for r in self.rows):
            raise ValueError(f"duplicate row key {row.key!r}")
        self.rows.append(row)
        return row

    def numeric(
        self,
        key: str,
        item: str,
        source: str,
        published: str | float,
        ours: float,
        *,
        tol: float | None = None,
        explain: str = "",
        note: str = "",
        digits: int = 4,
        relative: bool = False,
    ) -> Row:
        """A published number beside dpmf's.

        ``published`` is best given as the string the paper prints (``"0.397"``); the tolerance
        then defaults to :func:`rounding_tolerance`. ``relative=True`` reads ``tol`` as relative.
        Within tolerance: reproduced. Outside: differs-explained if ``explain`` says why, else
        not reproduced. ``note`` is shown in both cases.
        """
        printed = published if isinstance(published, str) else fmt(published, digits)
        pub = float(printed.replace("−", "-")) if isinstance(published, str) else float(published)
        if tol is None:
            tol = rounding_tolerance(printed) if isinstance(published, str) else 0.0
        abs_tol = tol * abs(pub) if relative else tol
        diff = float(ours) - pub
        ok = math.isfinite(diff) and abs(diff) <= abs_tol * (1 + 1e-12)
        verdict = REPRODUCED if ok else (EXPLAINED if explain else NOT_REPRODUCED)
        text = note if ok else " ".join(t for t in (explain, note) if t)
        tol_text = f"±{fmt(tol, 2)}{' rel' if relative else ''}"
        return self._add(
            Row(key, item, source, printed, fmt(ours, digits), f"{diff:+.3g} (tol {tol_text})", verdict, text,
                pub, float(ours), abs_tol)
        )

    def claim(
        self, key: str, item: str, source: str, statement: str, holds: bool, evidence: str, *, explain: str = ""
    ) -> Row:
        """A qualitative/quantitative statement from the paper's text, checked on dpmf's numbers."""
        verdict = REPRODUCED if holds else (EXPLAINED if explain else NOT_REPRODUCED)
        note = "" if holds else (explain or "the claim does not hold in dpmf's numbers (dpmf column); no explanation "
                                 "found, left open")
        return self._add(Row(key, item, source, statement, evidence, "holds" if holds else "does not hold",
                             verdict, note))

    def not_reproduced(self, key: str, item: str, source: str, published: str, reason: str, ours: str = "—") -> Row:
        return self._add(Row(key, item, source, published, ours, "—", NOT_REPRODUCED, reason))

    # -------------------------------------------------------------- figures and text
    def figure(self, fig, name: str, caption: str) -> str:
        """Save a matplotlib figure as ``<out>/paperNNN_<name>.png`` and list it on the page."""
        self.out.mkdir(parents=True, exist_ok=True)
        filename = f"paper{self.paper}_{name}.png"
        fig.savefig(self.out / filename, dpi=110, bbox_inches="tight")
        plt.close(fig)
        self.figures.append(Figure(filename, caption))
        return filename

    def section(self, heading: str, markdown: str) -> None:
        self.sections.append((heading, markdown))

    def timed(self, label: str, fn: Callable):
        """Run ``fn()`` and record its wall time under ``label``."""
        t = time.perf_counter()
        try:
            return fn()
        finally:
            self.timings[label] = self.timings.get(label, 0.0) + time.perf_counter() - t

    # -------------------------------------------------------------- output
    def counts(self) -> dict[str, int]:
        return {v: sum(r.verdict == v for r in self.rows) for v in VERDICTS}

    def write(self) -> Path:
        """Write the markdown page and the JSON rows, then rebuild the index."""
        runtime = time.perf_counter() - self.started
        self.out.mkdir(parents=True, exist_ok=True)
        mode = "fast" if self.fast else "full"
        meta = {
            "paper": self.paper,
            "title": self.title,
            "citation": PAPERS[self.paper],
            "script": self.script,
            "mode": mode,
            "runtime_seconds": round(runtime, 1),
            "timings": {k: round(v, 2) for k, v in self.timings.items()},
            "full_mode_estimate": self.full_mode_estimate,
            "date": _dt.date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "dpmf_version": _dpmf_version(),
            "git": _git_commit(),
        }
        data = {"meta": meta, "counts": self.counts(), "rows": [asdict(r) for r in self.rows],
                "figures": [asdict(f) for f in self.figures]}
        (self.out / f"paper{self.paper}.json").write_text(json.dumps(data, indent=1) + "\n")
        (self.out / f"paper{self.paper}.md").write_text(self._markdown(meta))
        write_index(self.out)
        return self.out / f"paper{self.paper}.md"

    def _markdown(self, meta: dict) -> str:
        c = self.counts()
        lines = [
            f"# Paper {self.paper}: {self.title}",
            "",
            f"*{PAPERS[self.paper]}* (paper {self.paper} of the project's reference set).",
            "",
            f"Generated by `python benchmarks/papers/{self.script}{' --fast' if self.fast else ''}` "
            f"({meta['mode']} mode) in **{meta['runtime_seconds']:.1f} s** on {meta['machine']}, "
            f"dpmf {meta['dpmf_version']} (git {meta['git']}), {meta['date']}.",
            "",
        ]
        if self.fast:
            lines += ["This page holds the **fast-mode** results (small grid).", ""]
        if self.full_mode_estimate:
            lines += [f"Full mode: {self.full_mode_estimate}", ""]
        lines += [
            f"Verdicts: **{c[REPRODUCED]} reproduced**, **{c[EXPLAINED]} differ (explained)**, "
            f"**{c[NOT_REPRODUCED]} not reproduced**. Tolerances are what the paper's rounding allows "
            "unless the row says otherwise; `diff` is dpmf minus published.",
            "",
        ]
        if self.setup:
            lines += ["## Setup", ""] + [f"- {s}" for s in self.setup] + [""]
        lines += ["## Published vs dpmf", "", "| item | source | published | dpmf | diff | verdict | note |",
                  "|---|---|---|---|---|---|---|"]
        for r in self.rows:
            lines.append("| " + " | ".join(_md_escape(x) for x in (r.item, r.source, r.published, r.ours, r.diff,
                                                                     r.verdict, r.note)) + " |")
        lines.append("")
        if self.figures:
            lines += ["## Figures", ""]
            for f in self.figures:
                lines += [f"![{_md_escape(f.caption)}]({f.filename})", "", f"*{f.caption}*", ""]
        for heading, body in self.sections:
            lines += [f"## {heading}", "", body.strip(), ""]
        if self.timings:
            lines += ["## Timings", "", "| part | seconds |", "|---|---:|"]
            lines += [f"| {k} | {v:.1f} |" for k, v in self.timings.items()] + [""]
        return "\n".join(lines)


def write_index(out: Path) -> Path:
    """``<out>/index.md``: verdict counts per paper and every compared item, from ``paper*.json``."""
    out = Path(out)
    pages = []
    for p in sorted(out.glob("paper*.json")):
        try:
            pages.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    total = {v: 0 for v in VERDICTS}
    lines = [
        "# Reproductions of the papers' tables and figures",
        "",
        "Each script in `benchmarks/papers/` recomputes a paper's headline tables and figures with dpmf's "
        "public API and puts dpmf's value beside the value typed in from the paper. Figures cannot be read "
        "numerically from the papers' text, so for them the page redraws the curve and checks the claims the "
        "paper's text makes about it (a slope, a crossover, an ordering, a quoted value).",
        "",
        "Verdicts: *reproduced* (within the tolerance the paper's rounding allows, or the claim holds), "
        "*differs-explained* (outside it, with the reason: a typo listed in the notes, an unknown delta split, "
        "a tighter bound of ours, Monte Carlo noise), *not reproduced* (with the reason). Nothing is tuned to "
        "match.",
        "",
        "Run everything with `for s in benchmarks/papers/paper0*.py; do python $s; done` (full mode) or add "
        "`--fast` (the mode `tests/test_paper_reproductions.py` runs).",
        "",
        "| paper | page | mode | run time | reproduced | differs-explained | not reproduced |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for d in pages:
        m, c = d["meta"], d["counts"]
        for v in VERDICTS:
            total[v] += c[v]
        lines.append(
            f"| {m['paper']}: {_md_escape(m['title'])} | [paper{m['paper']}.md](paper{m['paper']}.md) | {m['mode']} | "
            f"{m['runtime_seconds']:.0f} s | {c[REPRODUCED]} | {c[EXPLAINED]} | {c[NOT_REPRODUCED]} |"
        )
    lines.append(f"| **total** | | | | **{total[REPRODUCED]}** | **{total[EXPLAINED]}** | **{total[NOT_REPRODUCED]}** |")
    lines.append("")
    for d in pages:
        m = d["meta"]
        lines += [f"## [{m['paper']}: {_md_escape(m['title'])}](paper{m['paper']}.md)", "",
                  "| item | published | dpmf | difference | verdict |", "|---|---|---|---|---|"]
        for r in d["rows"]:
            lines.append("| " + " | ".join(_md_escape(x) for x in (f"{r['item']} ({r['source']})", r["published"],
                                                                     r["ours"], r["diff"], r["verdict"])) + " |")
        lines.append("")
    path = out / "index.md"
    path.write_text("\n".join(lines))
    return path


# ----------------------------------------------------------------------------------- plumbing
def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _dpmf_version() -> str:
    import dpmf

    return dpmf.__version__


def parse_args(argv: Sequence[str] | None, description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--fast", action="store_true", help="small grid (well under 60 s); the mode the tests run")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    return ap.parse_args(argv)


def linear_fit(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares line ``y = slope x + intercept`` (as the paper's Fig. 8 regressions)."""
    import numpy as np

    slope, intercept = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    return float(slope), float(intercept)


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 4.2, height: float = 3.2):
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, axes


def main_guard(main: Callable[[Sequence[str] | None], Report]) -> None:
    """``if __name__ == "__main__"`` body: run and print where the page went."""
    report = main(sys.argv[1:])
    c = report.counts()
    print(f"paper {report.paper}: {c[REPRODUCED]} reproduced, {c[EXPLAINED]} differs-explained, "
          f"{c[NOT_REPRODUCED]} not reproduced -> {report.out / f'paper{report.paper}.md'}")
