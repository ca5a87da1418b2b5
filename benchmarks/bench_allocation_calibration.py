"""The README's training examples: calibrating BandMF (``bsr(32, 4)``) under balls-in-bins, before/after.

``make_private(..., strategy=bsr(32, bands=4), sampling=BallsInBinsSampling(epochs=2, steps=32),
target_epsilon=4)`` (README blocks 2 and 3) runs

    dpmf.calibrate(bsr(32, 4), BallsInBinsSampling(2, 32), 4.0, 1e-5)        # method "auto"

and ``dpmf.account`` on the same pair at sigma = 1.3 is the matching accounting call. This script
times both in fresh processes (so the first call pays the imports and the Rényi program's one-time
shape tables, as a user's script does) and then once more in the same process (warm), for the
working tree ("after") and for the working tree with the calibration-path files taken from a git
revision ("before", ``--before REV``), each copied once at the start: ``allocation/renyi.py``, ``allocation/_compiled.py``,
``allocation/accountant.py``, ``allocation/pld.py`` and ``accounting/dispatch.py``. Everything else
(notably the Markov members of ``allocation_pld``, which other work changes) is the same code in
both, so the ratio is that of these files alone.

Agreement check (the speed-up must not loosen anything): the calibrated sigma after is at most the
one before times ``1 + 1e-6``, both reports meet the target, and the epsilon of ``dpmf.account`` at
sigma = 1.3 agrees to ``1e-9`` relative (the same bounds, up to float rounding).

    python benchmarks/bench_allocation_calibration.py --before 8c6cdb3 [--repeats 3]

Not a ``run.py`` case (each measurement needs its own process): ``CASES`` is empty.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CASES: list = []  # (a script with its own child processes; benchmarks/run.py finds no case here)

ROOT = Path(__file__).resolve().parents[1]
FILES = (
    "src/dpmf/accounting/allocation/renyi.py",
    "src/dpmf/accounting/allocation/_compiled.py",
    "src/dpmf/accounting/allocation/accountant.py",
    "src/dpmf/accounting/allocation/pld.py",
    "src/dpmf/accounting/dispatch.py",
)

CHILD = r"""
import json, time
t0 = time.perf_counter()
import dpmf
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import bsr
out = {"import": time.perf_counter() - t0}
args = (bsr(32, 4), BallsInBinsSampling(2, 32))
for run in ("cold", "warm"):
    evals = []
    t0, c0 = time.perf_counter(), time.process_time()
    cal = dpmf.calibrate(*args, 4.0, 1e-5, callback=lambda s, e: evals.append(s))
    out[f"calibrate_{run}"], out[f"calibrate_{run}_cpu"] = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    rep = dpmf.account(*args, 1.3, 1e-5)
    out[f"account_{run}"], out[f"account_{run}_cpu"] = time.perf_counter() - t0, time.process_time() - c0
out.update(sigma=cal.noise_multiplier, method=cal.report.method, epsilon=cal.report.epsilon, evaluations=len(evals),
           account_epsilon=rep.epsilon, account_method=rep.method)
print(json.dumps(out))
"""


def _tree(into: Path, rev: str | None = None) -> Path:
    """A copy of the working tree's ``src`` (so edits during the run do not mix versions), with
    :data:`FILES` taken from ``rev`` when given."""
    into.mkdir()
    src = into / "src"
    subprocess.run(["cp", "-r", str(ROOT / "src"), str(into)], check=True)
    for path in FILES if rev else ():
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True, capture_output=True).stdout
        (into / path).write_bytes(text)
    for cache in src.rglob("__pycache__"):  # (numba's cached kernels may belong to another version)
        subprocess.run(["rm", "-rf", str(cache)], check=True)
    return src


def _measure(pythonpath: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="git revision whose calibration-path files are 'before'")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        before_src, after_src = _tree(Path(tmp) / "before", a.before), _tree(Path(tmp) / "after")
        _measure(before_src), _measure(after_src)  # (numba compiles and caches each version's kernels once)
        for _ in range(a.repeats):  # alternate, so load from other work falls on both
            runs["before"].append(_measure(before_src))
            runs["after"].append(_measure(after_src))
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0] if isinstance(v[0][f], float)} for k, v in runs.items()}
    b, f = runs["before"][-1], runs["after"][-1]
    sigma_ok = f["sigma"] <= b["sigma"] * (1 + 1e-6) and f["epsilon"] <= 4.0 and b["epsilon"] <= 4.0
    account_ok = abs(f["account_epsilon"] - b["account_epsilon"]) <= 1e-9 * b["account_epsilon"]
    print(f"calibrate(bsr(32, 4), BallsInBinsSampling(2, 32), 4.0, 1e-5), median of {a.repeats} fresh processes "
          f"(before = {a.before} for {len(FILES)} files)")
    print("| | before: wall (CPU) s | after: wall (CPU) s | ratio (wall) |\n|---|---:|---:|---:|")
    for key, label in (("calibrate_cold", "calibrate, first call"), ("calibrate_warm", "calibrate, second call"),
                       ("account_cold", "account at sigma 1.3, after the calibration"),
                       ("account_warm", "account at sigma 1.3, again")):
        b_, f_ = med["before"], med["after"]
        print(f"| {label} | {b_[key]:.2f} ({b_[key + '_cpu']:.2f}) | {f_[key]:.2f} ({f_[key + '_cpu']:.2f}) | "
              f"{b_[key] / f_[key]:.2f}x |")
    print(f"| import dpmf | {med['before']['import']:.2f} | {med['after']['import']:.2f} | |")
    print(f"| evaluations noted | {b['evaluations']} | {f['evaluations']} | |")
    print(f"| sigma | {b['sigma']!r} ({b['method']}) | {f['sigma']!r} ({f['method']}) | "
          f"{f['sigma'] / b['sigma'] - 1:+.2e} |")
    print(f"| epsilon at sigma 1.3 | {b['account_epsilon']!r} ({b['account_method']}) | "
          f"{f['account_epsilon']!r} ({f['account_method']}) | {f['account_epsilon'] / b['account_epsilon'] - 1:+.2e} |")
    print(f"agreement: sigma after <= before (1 + 1e-6): {sigma_ok}; account epsilon within 1e-9: {account_ok}")
    sys.exit(0 if sigma_ok and account_ok else 1)


if __name__ == "__main__":
    main()
