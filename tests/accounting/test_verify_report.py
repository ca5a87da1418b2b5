"""verify_report: a saved report is rebuilt from its own descriptions and recomputed; the claim
holds iff recomputed epsilon <= claimed (1e-9 relative slack) and the certified flags agree.
Edited reports fail saying what does not hold; foreign or unrecomputable ones are refused with an
InvalidParameterError."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import dpmf
from dpmf.accounting.report import PrivacyReport
from dpmf.accounting.verify import REL_SLACK, Verification, verify_report
from dpmf.errors import InvalidParameterError
from dpmf.sampling import BallsInBinsSampling, FixedOrderSampling, MinSepSampling, PoissonSampling
from dpmf.strategies import BLT, BinaryTree, DenseStrategy, Identity, bisr, bsr, save_matrices


@pytest.fixture(scope="module")
def pld_report() -> PrivacyReport:
    return dpmf.account(Identity(100), PoissonSampling(0.05, 100), 2.0, 1e-5)


def test_a_fresh_report_holds_in_every_input_form(pld_report, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(pld_report.to_json(indent=2))
    for form in (pld_report, pld_report.to_dict(), pld_report.to_json(), path, str(path)):
        v = verify_report(form)
        assert isinstance(v, Verification)
        assert v.holds and not v.problems
        assert v.recomputed_epsilon == pld_report.epsilon == v.claimed_epsilon
        assert v.method == "pld" and v.claimed_certified and v.recomputed_certified and not v.estimate
        assert "certified upper bound" in v.message and v.summary().startswith("HOLDS")
    assert json.loads(json.dumps(v.to_dict()))["holds"] is True


def test_a_lowered_epsilon_does_not_hold_and_says_why(pld_report):
    d = pld_report.to_dict()
    d["epsilon"] = 0.5
    v = verify_report(d)
    assert not v.holds
    assert v.claimed_epsilon == 0.5 and v.recomputed_epsilon == pytest.approx(pld_report.epsilon, rel=1e-12)
    assert v.message == f"claimed epsilon 0.5 < recomputed {pld_report.epsilon:.10g} at delta 1e-05 (method pld)"
    assert v.summary().startswith("DOES NOT HOLD: claimed epsilon 0.5 <")


def test_slack_is_for_float_noise_only(pld_report):
    eps = pld_report.epsilon
    for claimed, holds in ((eps * (1 - 1e-12), True), (eps * (1 - 10 * REL_SLACK), False), (eps * 2, True)):
        d = pld_report.to_dict()
        d["epsilon"] = claimed
        d["epsilon_by_direction"] = {k: max(v, claimed) for k, v in d["epsilon_by_direction"].items()}
        assert verify_report(d).holds is holds, claimed


def test_a_lowered_direction_does_not_hold(pld_report):
    d = pld_report.to_dict()
    d["epsilon_by_direction"]["add"] = 0.1
    v = verify_report(d)
    assert not v.holds and "claimed add-direction epsilon 0.1 < recomputed" in v.message


def test_a_certified_claim_must_match(pld_report):
    d = pld_report.to_dict()
    d["certified"] = False
    v = verify_report(d)
    assert not v.holds and "claims certified=False but pld gives certified=True" in v.message


def test_an_edited_configuration_is_recomputed_as_written(pld_report):
    # the report now claims the same epsilon for a larger sampling probability: it does not hold
    d = pld_report.to_dict()
    d["scheme"]["sampling_prob"] = 0.2
    v = verify_report(d)
    assert not v.holds and v.recomputed_epsilon > 2 * pld_report.epsilon
    # a lower noise multiplier also breaks it
    d = pld_report.to_dict()
    d["noise_multiplier"] = 1.0
    assert not verify_report(d).holds


def test_recorded_options_are_used_and_missing_options_mean_defaults():
    r = dpmf.account(Identity(100), PoissonSampling(0.05, 100), 2.0, 1e-5, method="pld", discretization=1e-2)
    assert r.options == {"discretization": 1e-2}
    v = verify_report(r.to_dict())
    assert v.holds and v.recomputed_epsilon == r.epsilon
    d = r.to_dict()
    del d["options"]  # an older report: recomputed with the default (finer) discretization
    v = verify_report(d)
    assert v.holds and v.recomputed_epsilon < r.epsilon


@pytest.mark.parametrize(
    "strategy,scheme,method",
    [
        (bsr(24, 3), FixedOrderSampling(2, 24), "unamplified"),
        (bisr(24, 3), FixedOrderSampling(3, 24), "unamplified"),
        (BinaryTree(16), FixedOrderSampling(2, 16), "unamplified"),
        (BLT([0.5, 0.9], [0.1, 0.2]).to_toeplitz(20), FixedOrderSampling(2, 20), "unamplified"),
        (bsr(16, 2), PoissonSampling(0.1, 16), "mmcc"),
        (Identity(10), BallsInBinsSampling(1, 10), "allocation"),
        (DenseStrategy(np.tri(12) / np.sqrt(12)), FixedOrderSampling(1, 12), "unamplified"),
    ],
    ids=lambda x: x if isinstance(x, str) else type(x).__name__,
)
def test_reports_of_other_strategies_and_methods_hold(strategy, scheme, method):
    r = dpmf.account(strategy, scheme, 3.0, 1e-5, method=method)
    v = verify_report(json.loads(r.to_json()))
    assert v.holds, v.message
    assert v.recomputed_epsilon == r.epsilon
    assert v.edited is False  # the digest survives the JSON round trip of every report kind


def test_large_dense_strategy_needs_its_matrix(tmp_path):
    rng = np.random.default_rng(0)
    C = np.tril(rng.uniform(0.0, 0.1, (70, 70))) + np.eye(70)
    r = dpmf.account(DenseStrategy(C, name="optimal"), FixedOrderSampling(2, 70), 5.0, 1e-5, method="unamplified")
    assert "matrix" not in r.strategy and "sha256" in r.strategy
    with pytest.raises(InvalidParameterError, match="not found"):
        verify_report(r.to_dict())
    save_matrices(DenseStrategy(C), tmp_path)
    v = verify_report(r.to_dict(), search_dir=tmp_path)
    assert v.holds and v.recomputed_epsilon == r.epsilon
    assert verify_report(r.to_dict(), matrices=[C]).holds


def test_a_report_file_finds_the_matrix_beside_it(tmp_path, monkeypatch):
    """A report given as a path: its folder is searched by default (where ``save_report`` writes the
    matrix), whatever the working directory; a dict or text has no folder."""
    C = np.tril(np.random.default_rng(1).uniform(0.0, 0.1, (70, 70))) + np.eye(70)
    r = dpmf.account(DenseStrategy(C, name="optimal"), FixedOrderSampling(2, 70), 5.0, 1e-5, method="unamplified")
    (tmp_path / "run").mkdir()
    save_matrices(DenseStrategy(C), tmp_path / "run")
    path = tmp_path / "run" / "report.json"
    path.write_text(r.to_json())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for given in (path, str(path), Path("..") / "run" / "report.json"):
        v = verify_report(given)
        assert v.holds and v.recomputed_epsilon == r.epsilon, given
    with pytest.raises(InvalidParameterError, match="not found"):
        verify_report(r.to_json())  # text: no folder to search
    with pytest.raises(InvalidParameterError, match="not found"):  # an explicit folder replaces the default
        verify_report(path, search_dir=elsewhere)


# ----------------------------------------------------------------------------- Monte Carlo
@pytest.fixture(scope="module")
def mc_report() -> PrivacyReport:
    # no seed given: the entropy drawn from the OS is recorded in the diagnostics
    return dpmf.account(Identity(20), MinSepSampling(0.1, 20, 4), 2.0, 1e-2, method="montecarlo", num_samples=4000)


def test_montecarlo_report_is_reproduced_from_its_recorded_seed(mc_report):
    assert "seed" not in mc_report.options and mc_report.diagnostics["seed_entropy"] > 0
    v = verify_report(mc_report.to_json())
    assert v.holds and v.estimate and not v.recomputed_certified
    assert v.recomputed_epsilon == mc_report.epsilon  # same samples
    assert "ESTIMATE" in v.message
    d = mc_report.to_dict()
    d["epsilon"] = mc_report.epsilon * 0.9
    assert not verify_report(d).holds


def test_montecarlo_refusals(mc_report):
    d = mc_report.to_dict()
    del d["diagnostics"]["seed_entropy"]
    with pytest.raises(InvalidParameterError, match="records no seed"):
        verify_report(d)
    d = mc_report.to_dict()
    d["diagnostics"]["sampler"] = "mymodule:my_sampler"
    with pytest.raises(InvalidParameterError, match="custom sampler"):
        verify_report(d)
    d = mc_report.to_dict()
    d["diagnostics"]["complete"] = False
    with pytest.raises(InvalidParameterError, match="partial run"):
        verify_report(d)
    d = mc_report.to_dict()
    d["options"]["sampler"] = "<not recordable: a Python object>"
    with pytest.raises(InvalidParameterError, match="'sampler' set to a Python object"):
        verify_report(d)
    d = mc_report.to_dict()
    d["method"] = "montecarlo-evr"
    d["certified"] = True
    with pytest.raises(InvalidParameterError, match="'montecarlo-evr' is a Monte Carlo calibration.*verify does not"):
        verify_report(d)


# ----------------------------------------------------------------------------- refusals
def test_foreign_files_are_refused(tmp_path):
    (tmp_path / "a.txt").write_text("hello, world")
    (tmp_path / "b.json").write_text("[1, 2, 3]")
    (tmp_path / "c.json").write_text('{"name": "identity", "n": 3}')
    (tmp_path / "d.bin").write_bytes(bytes(range(256)))
    cases = {
        tmp_path / "a.txt": "not JSON",
        tmp_path / "b.json": "a JSON list, not an object",
        tmp_path / "c.json": "not a dpmf privacy report: missing key",
        tmp_path / "d.bin": "not a JSON text file",
        tmp_path / "missing.json": "cannot read the dpmf report",
        "{not json": "not JSON",
    }
    for report, match in cases.items():
        with pytest.raises(InvalidParameterError, match=match):
            verify_report(report)
    with pytest.raises(InvalidParameterError, match="must be a dict, a JSON string or a path"):
        verify_report(42)


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("method", "magic", "key 'method' must be one of"),
        ("method", 3, "key 'method' must be a string"),
        ("epsilon", "small", "key 'epsilon' must be a number >= 0"),
        ("epsilon", -1.0, "key 'epsilon' must be a number >= 0"),
        ("delta", 2.0, "key 'delta' must be in \\(0, 1\\)"),
        ("delta", "1e-5", "key 'delta' must be a finite number > 0"),
        ("noise_multiplier", 0, "key 'noise_multiplier' must be a finite number > 0"),
        ("certified", "yes", "key 'certified' must be true or false"),
        ("strategy", None, "key 'strategy' must be the strategy's description"),
        ("scheme", [1], "key 'scheme' must be the scheme's description"),
        ("options", [1], "key 'options' must be a dict"),
        ("options", {"discretisation": 1e-3}, "cannot be recomputed from its own inputs: unknown option"),
    ],
)
def test_malformed_reports_are_refused(pld_report, key, value, match):
    d = pld_report.to_dict()
    d[key] = value
    with pytest.raises(InvalidParameterError, match=match):
        verify_report(d)


def test_tampered_descriptions_are_refused(pld_report):
    d = pld_report.to_dict()
    d["strategy"] = {"name": "identity", "n": 100, "note": "trust me"}
    with pytest.raises(InvalidParameterError, match="unknown key 'note'"):
        verify_report(d)
    d = pld_report.to_dict()
    d["scheme"]["steps"] = 50  # the strategy still has 100 steps
    with pytest.raises(InvalidParameterError, match="cannot be recomputed.*n=100 steps"):
        verify_report(d)
    r = dpmf.account(bsr(24, 3), FixedOrderSampling(2, 24), 3.0, 1e-5, method="unamplified")
    d = r.to_dict()
    d["strategy"]["coefs"][1] = 0.1  # the band stays 3: a different strategy, recomputed as written
    v = verify_report(d)
    assert v.recomputed_epsilon != r.epsilon
    d["strategy"]["band"] = 2
    with pytest.raises(InvalidParameterError, match="key 'band' is 2 there, 3 rebuilt"):
        verify_report(d)


def test_infinite_claims(pld_report):
    d = pld_report.to_dict()
    d["epsilon"] = "inf"
    d["epsilon_by_direction"] = {"remove": "inf", "add": "inf"}
    v = verify_report(d)
    assert v.holds and math.isinf(v.claimed_epsilon)


# ----------------------------------------------------------------------------- edits (issue 24 item 14)
def test_a_fresh_report_carries_a_digest_and_is_not_edited(pld_report):
    d = json.loads(pld_report.to_json())
    assert d["digest"].startswith("sha256:") and len(d["digest"]) == len("sha256:") + 64
    v = verify_report(d)
    assert v.holds and v.edited is False
    assert v.edit_message.startswith("NOT EDITED")
    assert v.summary().splitlines() == [f"HOLDS: {v.message}", v.edit_message]
    assert v.to_dict()["edited"] is False


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.update(noise_multiplier=d["noise_multiplier"] * 1.5),  # sigma raised
        lambda d: d["scheme"].update(sampling_prob=d["scheme"]["sampling_prob"] / 2),  # q halved
        lambda d: d.update(epsilon=d["epsilon"] * 2),  # a looser claim
    ],
    ids=["sigma raised", "q halved", "epsilon raised"],
)
def test_an_edit_to_a_more_private_run_holds_but_is_reported_as_edited(pld_report, edit):
    d = pld_report.to_dict()
    edit(d)
    v = verify_report(d)
    assert v.holds, v.message
    assert v.edited is True and v.edit_message.startswith("EDITED since it was produced")
    assert v.summary().startswith("HOLDS: ") and "\nEDITED" in v.summary()


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.update(noise_multiplier=d["noise_multiplier"] / 2),  # sigma lowered
        lambda d: d.update(epsilon=d["epsilon"] / 2),  # epsilon lowered
    ],
    ids=["sigma lowered", "epsilon lowered"],
)
def test_an_edit_to_a_less_private_run_does_not_hold_and_is_edited(pld_report, edit):
    d = pld_report.to_dict()
    edit(d)
    v = verify_report(d)
    assert not v.holds and v.edited is True
    assert v.summary().startswith("DOES NOT HOLD: ") and "\nEDITED" in v.summary()


def test_without_a_digest_verify_cannot_tell(pld_report):
    d = pld_report.to_dict()
    del d["digest"]  # a report written before digests existed
    v = verify_report(d)
    assert v.holds and v.edited is None
    assert v.edit_message.startswith("NO DIGEST: cannot tell")
    assert v.to_dict()["edited"] is None
    d["noise_multiplier"] = 1.0  # and a claim that fails is still said to fail
    v = verify_report(d)
    assert not v.holds and v.edited is None


@pytest.mark.parametrize("digest", ["sha256:" + "0" * 64, "", 42, None, "md5:abc"])
def test_a_wrong_or_foreign_digest_counts_as_edited(pld_report, digest):
    d = pld_report.to_dict()
    d["digest"] = digest
    v = verify_report(d)
    assert v.holds and v.edited is True


def test_the_digest_covers_the_claim_and_description_but_not_presentation(pld_report):
    from dpmf.accounting.report import DIGEST_KEYS, report_digest

    d = pld_report.to_dict()
    for key in ("epsilon", "delta", "noise_multiplier", "method", "strategy", "scheme", "options",
                "adjacency", "diagnostics", "certified", "epsilon_by_direction"):
        assert key in DIGEST_KEYS
        e = json.loads(json.dumps(d))
        e[key] = "changed"
        assert report_digest(e) != d["digest"], key
    # fields added next to a report (a checkpoint path, the version) are not part of its claim
    e = dict(d, checkpoint="mc.npz", dpmf_version="9.9")
    assert report_digest(e) == d["digest"]
    # a calibration's target is part of its claim
    assert report_digest(dict(d, target_epsilon=2.0)) != d["digest"]


def test_digest_survives_json_round_trips_of_every_report_kind(mc_report):
    from dpmf.accounting.report import report_digest

    for r in (mc_report, dpmf.account(bsr(16, 2), PoissonSampling(0.1, 16), 3.0, 1e-5, method="mmcc")):
        d = json.loads(json.dumps(json.loads(r.to_json()), indent=2))
        assert report_digest(d) == d["digest"] == r.to_dict()["digest"]


# ----------------------------------------------------------------------------- adjacency (issue 24 item 13)
def test_every_report_form_states_the_adjacency(pld_report, mc_report):
    from dpmf.accounting.report import ADJACENCY

    for phrase in ("zero-out", "add or remove", "worst of both directions", "dataset size is public",
                   "len(dataset)", "normalizer="):
        assert phrase in ADJACENCY
    for r in (pld_report, mc_report):
        assert r.adjacency == ADJACENCY
        assert ADJACENCY in r.summary() and ADJACENCY in str(r)
        assert r.summary().splitlines()[1] == f"  adjacency: {ADJACENCY}"
        assert json.loads(r.to_json())["adjacency"] == ADJACENCY


# ------------------------------------------------- one word for one thing: RunSpec (issue 53 item 2)
_DEPRECATED_WORDS = ("build_plan", "ExecutionPlan", "execution plan")


def test_every_report_summary_says_make_private_and_runspec_and_no_deprecated_name(pld_report, mc_report):
    from dpmf.accounting.report import ADJACENCY

    composed = dpmf.compose([pld_report, pld_report])
    for r in (pld_report, mc_report, composed):
        text = r.summary()
        assert r.adjacency == ADJACENCY and "normalizer= to make_private (its RunSpec records it)" in text
        assert not [w for w in _DEPRECATED_WORDS if w.lower() in text.lower()], text


def test_a_report_written_before_the_rewording_still_verifies():
    """tests/data/report_adjacency_v1.json: a training report written by the dpmf whose adjacency
    sentence named ``build_plan`` (copied from examples/results). Its digest covers that wording, so
    it verifies as written: the claim holds and it is not edited."""
    from dpmf.accounting.report import ADJACENCY, ADJACENCY_VERSIONS

    path = Path(__file__).parents[1] / "data" / "report_adjacency_v1.json"
    saved = json.loads(path.read_text())
    assert saved["adjacency"] == ADJACENCY_VERSIONS[1] != ADJACENCY and "build_plan" in saved["adjacency"]
    v = verify_report(path)
    assert v.holds and v.edited is False, v.summary()
    assert v.report.adjacency == ADJACENCY  # (the recomputation is worded as today)
    saved["adjacency"] = ADJACENCY  # the new wording in an old report: an edit, said as one
    assert verify_report(saved).edited is True


# ------------------------------------------------- Python = CLI: the trained line (issue 53 item 4)
def _training_report(pld_report, **training):
    import dataclasses

    t = {"steps_done": 5, "steps_planned": 10, "max_grad_norm": 1.0, "normalizer": 20.0, "num_examples": 100,
         "grad_sample_mode": "ghost", **training}
    return dataclasses.replace(pld_report, diagnostics={**pld_report.diagnostics, "training": t})


def test_the_summary_of_a_training_report_says_what_was_trained(pld_report):
    v = verify_report(_training_report(pld_report).to_dict())
    lines = v.summary().splitlines()
    assert len(lines) == 3 and lines[0].startswith("HOLDS") and lines[1].startswith("NOT EDITED")
    assert lines[2] == ("trained: 5 of 10 planned steps, clip norm 1, normalizer 20, 100 examples, "
                        "per-example gradients ghost") == v.trained
    assert v.to_dict()["training"]["steps_done"] == 5
    assert len(verify_report(pld_report).summary().splitlines()) == 2  # not a training run: no such line
    assert verify_report(pld_report).trained is None and "training" not in verify_report(pld_report).to_dict()


def test_a_malformed_training_entry_prints_question_marks_not_a_crash(pld_report):
    v = verify_report(_training_report(pld_report, max_grad_norm="one", plan_row={"noise_multiplier": "x"}).to_dict())
    assert "clip norm ?," in v.trained and "sigma ?" in v.trained and v.holds
