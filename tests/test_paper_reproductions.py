"""The paper reproductions in ``benchmarks/papers/``: each script's ``--fast`` mode runs in a
subprocess (as a user runs it; pytest's warning filters stay out of it) into a temporary directory,
and the output is checked structurally (markdown page, JSON rows, PNGs referenced by the page, the
index) and on the verdicts of the rows that are supposed to reproduce, re-checking each published
vs dpmf difference against the row's stated tolerance.

000, 003 and 004 run in the default suite (~30-60 s together on 2 shared cores); 001 and 002 run
Monte Carlo / conditional composition and are marked slow.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "benchmarks" / "papers"
VERDICTS = {"reproduced", "differs-explained", "not reproduced"}


def run_fast(script: str, out: Path) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPTS / script), "--fast", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    paper = script[5:8]
    data = json.loads((out / f"paper{paper}.json").read_text())
    check_structure(data, out, paper)
    return {r["key"]: r for r in data["rows"]}


def check_structure(data: dict, out: Path, paper: str) -> None:
    assert data["meta"]["mode"] == "fast" and data["meta"]["paper"] == paper
    assert data["meta"]["runtime_seconds"] > 0
    page = (out / f"paper{paper}.md").read_text()
    assert "| item | source | published | dpmf | diff | verdict | note |" in page
    assert data["figures"], "every paper page has at least one figure"
    for f in data["figures"]:
        assert (out / f["filename"]).stat().st_size > 1000
        assert f"]({f['filename']})" in page  # relative link next to the page (mkdocs --strict)
    counts = {v: 0 for v in VERDICTS}
    for r in data["rows"]:
        assert r["verdict"] in VERDICTS
        counts[r["verdict"]] += 1
        assert r["item"] and r["source"] and r["published"]
        if r["verdict"] != "reproduced":
            assert r["note"], f"{r['key']}: a difference needs its explanation or reason"
        if r["published_value"] is not None:  # numeric row: the verdict agrees with the tolerance
            within = abs(r["ours_value"] - r["published_value"]) <= r["tolerance"] * (1 + 1e-12)
            assert within == (r["verdict"] == "reproduced"), r["key"]
    assert counts == data["counts"]
    index = (out / "index.md").read_text()
    assert f"(paper{paper}.md)" in index


def assert_reproduced(rows: dict, keys) -> None:
    for k in keys:
        assert rows[k]["verdict"] == "reproduced", (k, rows[k])


def assert_close(rows: dict, key: str, published: float, ours: float, tol: float) -> None:
    r = rows[key]
    assert r["published_value"] == pytest.approx(published, abs=1e-12)
    assert r["ours_value"] == pytest.approx(ours, abs=tol)


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reproductions")


def test_paper004_individual(out):
    rows = run_fast("paper004_individual.py", out)
    assert_reproduced(rows, ["eps_rdp_420", "rdp_steps_420", "gdp_steps_495", "fig3_ten_percent", "fig3_gdp_below",
                             "fig4_gdp_below", "fig5_more_steps", "mimic_eps"])
    assert rows["gdp_steps_495"]["ours_value"] == 495 and rows["rdp_steps_420"]["ours_value"] == 420
    assert_close(rows, "eps_rdp_420", 0.8, 0.81563, 1e-5)  # notes/individual-accounting.md P1
    assert rows["fig1_mnist"]["verdict"] == "not reproduced"


def test_paper000_mmcc(out):
    rows = run_fast("paper000_mmcc.py", out)
    # exact numbers: unamplified epsilons of Fig. 8 (printed to 3 significant digits) and App. F.5
    assert_reproduced(rows, ["fig8_unamp_c10", "fig8_unamp_c20", "fig8_unamp_c40", "f5_dpsgd", "f5_last_iterate_add"])
    assert_close(rows, "fig8_unamp_c40", 0.0901, 0.090139, 2e-5)
    assert_close(rows, "f5_dpsgd", 0.806, 0.80640, 2e-4)
    # the paper's .291 is one direction only: dpmf's two-sided value differs, with the reason
    assert rows["f5_last_iterate"]["verdict"] == "differs-explained"
    assert rows["f5_last_iterate"]["ours_value"] == pytest.approx(0.420, abs=1e-3)
    # Fig. 8 ratios vs the paper's regression lines at c = 20, 40: judged at the printed rounding they
    # differ (explained: the paper's delta split is unknown, notes/mmcc.md §5.3 measures ~±10% from it);
    # they stay within that documented range
    for key in (f"fig8_line_c{c}_n{n}" for c in (20, 40) for n in (2, 4, 8, 16)):
        assert rows[key]["verdict"] in ("reproduced", "differs-explained"), rows[key]
        assert abs(rows[key]["ours_value"] - rows[key]["published_value"]) <= 0.1 * rows[key]["published_value"]
    assert_close(rows, "fig8_line_c40_n8", 1.407, 1.443, 5e-3)  # notes §5.3a prototype: 1.443
    # figure claims: slopes ordered, ratios increasing, Fig. 4 MMCC below b-min-sep on 50..200
    assert_reproduced(rows, ["fig8_order", "fig8_increasing", "fig4_mmcc_wins", "fig4_small_sigma", "fig2_sqrtlog",
                             "fig2_gt1_c40"])


def test_paper003_multiepoch_mf(out):
    rows = run_fast("paper003_multiepoch_mf.py", out)
    table1 = [f"t1_{k}_{n}" for k in ("honaker", "honaker_opt", "fft", "fft_opt") for n in (400, 200, 100)]
    assert_reproduced(rows, table1 + ["t1_mf1_100", "t1_mf1_100_a"])
    # the notes' recomputations (notes/multi-epoch-mf.md §9 O6-O11), not only the 2-digit rounding
    for key, value in (("t1_honaker_200", 1.954e6), ("t1_honaker_opt_400", 1.225e6), ("t1_fft_400", 1.629e6),
                       ("t1_fft_opt_400", 1.133e6), ("t1_mf1_100", 2.474e6)):
        assert rows[key]["ours_value"] == pytest.approx(value, rel=1e-3)
    assert sum(k.startswith("t1_") and k != "t1_class_minima" for k in rows) == 30  # every Table 1 row is listed
    assert_reproduced(rows, ["t3_mf_0.341", "t3_mf_0.600", "t3_mf_2.231", "fig4_eps", "fig4_integral", "fig4_stamps",
                             "fig5_order", "fig2_white_diagonals"])
    # DP-GD: exact composition is tighter than the paper's legacy PLD by ~0.10 (explained, never looser)
    for z in ("15.518", "27.493", "106.023"):
        r = rows[f"t3_gd_{z}"]
        assert r["verdict"] == "differs-explained" and -0.11 < r["ours_value"] - r["published_value"] < 0
    assert rows["t1_mf20_2000"]["verdict"] == "not reproduced"
    # Fig. 14: the bound ratio (~6x), Monte Carlo = exact real-part MSE = Cor. J.1 / 4, the lower bound
    # below the optimal factorization; the text's 1.2x holds only as an RMSE ratio (explained)
    assert_reproduced(rows, ["fig14_ub_6x", "fig14_mc", "fig14_lower_bound_sound"])
    assert rows["fig14_real_1p2"]["verdict"] == "differs-explained"
    figures = json.loads((out / "paper003.json").read_text())["figures"]
    assert any(f["filename"] == "paper003_fig14.png" for f in figures)


@pytest.mark.slow
def test_paper002_allocation(out):
    rows = run_fast("paper002_allocation.py", out)
    assert_reproduced(rows, ["cc_beats_renyi_high_privacy", "renyi_beats_cc_low_privacy", "bandwidth_robust"])


@pytest.mark.slow
def test_paper001_bminsep(out):
    rows = run_fast("paper001_bminsep.py", out)
    assert_reproduced(rows, ["fig3_never_above_1", "sec41_small_sigma"])
    assert rows["fig2_improves"]["verdict"] in ("reproduced", "differs-explained")
    assert rows["sec74_production"]["verdict"] == "not reproduced"
    # 0.627 certifies the target, but dpmf's sound calibration is smaller (the page lists the hypotheses)
    assert rows["sec74_trunc_sound"]["verdict"] == "reproduced"
    assert rows["sec74_trunc_sigma"]["verdict"] == "not reproduced"
    assert float(rows["sec74_trunc_sigma"]["ours"]) < 0.627


def test_rounding_tolerance_and_verdicts():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import _common
    finally:
        sys.path.remove(str(SCRIPTS))
    assert _common.rounding_tolerance("0.397") == pytest.approx(5e-4)
    assert _common.rounding_tolerance("2.3e6") == pytest.approx(5e4)
    assert _common.rounding_tolerance("495") == 0.5
    rep = _common.Report("004", "t", "x.py", True, out=Path("/nonexistent"))
    assert rep.numeric("a", "a", "s", "0.397", 0.3969).verdict == "reproduced"
    assert rep.numeric("b", "b", "s", "0.397", 0.3980).verdict == "not reproduced"
    assert rep.numeric("c", "c", "s", "0.397", 0.3980, explain="why").verdict == "differs-explained"
    assert rep.numeric("d", "d", "s", "0.397", math.nan, explain="why").verdict == "differs-explained"
    assert rep.claim("e", "e", "s", "x", False, "ev").verdict == "not reproduced"
    with pytest.raises(ValueError):
        rep.numeric("a", "dup", "s", "1", 1.0)
