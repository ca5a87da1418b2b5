"""Empirical audits of training runs (dpmf.training.torch.audit): correct runs stay below their
certified epsilon, runs with faults planted in the real training path are caught, for DP-SGD,
BandMF and BLT under their samplers; the user's-model path, many-run mode, the report, bad input.

Faults are planted by monkeypatching the training path only for the test (never by changing the
library): the noise generator ``make_private`` builds (``engine.correlated_noise``) with a tenth
of the noise, with the sigma a DP-SGD accountant would give at the same expected batch size, or
without noise on every other step; and the clip factors of the per-example clipper
(``grad_sample.clip_factors``) set to 1 (no clipping).

The default run keeps one fast version of each check (32 steps, 400 canaries; BandMF and BLT with
fixed-order sampling, whose accounting is instant); ``-m slow`` runs the full ones (64 steps, 1000
canaries, the mechanisms' own amplified samplers, many seeds).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

torch = pytest.importorskip("torch")

import dpmf  # noqa: E402
from dpmf.errors import DPMFError, InvalidParameterError  # noqa: E402
from dpmf.sampling import BallsInBinsSampling, CyclicPoissonSampling, FixedOrderSampling, PoissonSampling  # noqa: E402
from dpmf.strategies import Identity, catalog  # noqa: E402
from dpmf.training.run_spec import build_run_spec, expected_batch_size  # noqa: E402
from dpmf.training.torch import engine, grad_sample  # noqa: E402
from dpmf.training.torch.audit import AuditConfig, audit_training, builtin_task  # noqa: E402

REAL, M = 100, 300


# ---------------------------------------------------------------------------- planted faults


def _noise_scaled(monkeypatch, factor=None, sigma=None):
    real = engine.correlated_noise

    def faulty(strategy, params, *, noise_multiplier, **kw):
        return real(strategy, params, noise_multiplier=sigma if sigma is not None else noise_multiplier / factor, **kw)

    monkeypatch.setattr(engine, "correlated_noise", faulty)


def _noise_on_half_the_steps(monkeypatch):
    real = engine.correlated_noise

    def faulty(strategy, params, **kw):
        gen = real(strategy, params, **kw)
        draw, calls = gen.draw, [0]

        def every_other():
            calls[0] += 1
            return draw() if calls[0] % 2 else torch.zeros(gen.numel, dtype=gen.dtype)

        gen.draw = every_other
        return gen

    monkeypatch.setattr(engine, "correlated_noise", faulty)


def _no_clipping(monkeypatch):
    real = grad_sample.clip_factors

    def faulty(norms, max_grad_norm, margin):
        f = real(norms, max_grad_norm, margin)
        return torch.where(f > 0, torch.ones_like(f), f)

    monkeypatch.setattr(grad_sample, "clip_factors", faulty)


def _dpsgd_sigma(plan) -> float:
    """The sigma a DP-SGD accountant (Poisson at the run's expected batch size, same steps) gives for
    the plan's epsilon: the bug of attaching a DP-SGD accountant to correlated noise."""
    q = expected_batch_size(plan.scheme, plan.num_examples) / plan.num_examples
    return dpmf.calibrate(Identity(plan.steps), PoissonSampling(q, plan.steps), plan.epsilon, plan.delta).noise_multiplier


FAULTS = {
    "noise / 10": lambda mp, plan: _noise_scaled(mp, factor=10),
    "DP-SGD sigma with correlated C": lambda mp, plan: _noise_scaled(mp, sigma=_dpsgd_sigma(plan)),
    "no clipping": lambda mp, plan: _no_clipping(mp),
    "noise on half the steps": lambda mp, plan: _noise_on_half_the_steps(mp),
}


# ---------------------------------------------------------------------------- configurations


def _plan(strategy, scheme, epsilon=2.0, real=REAL, m=M):
    return build_run_spec(strategy, scheme, num_examples=real + m, delta=1e-5, max_grad_norm=1.0, target_epsilon=epsilon)


@pytest.fixture(scope="module")
def fast_plans():
    """DP-SGD under Poisson; BandMF and BLT under fixed-order sampling (4 epochs of 8 steps), whose
    accounting is instant; and BandMF with 16 bands under cyclic Poisson at rate 1 (4 epochs of 16
    steps, 1000 canaries: a DP-SGD accountant's sigma is a gross enough fault there for a one-run
    audit to exceed the claim)."""
    n = 32
    return {
        "DP-SGD": _plan(Identity(n), PoissonSampling(0.2, n)),
        "BandMF": _plan(catalog.build("bsr", n, bands=8), FixedOrderSampling(4, n)),
        "BLT": _plan(catalog.build("blt", n, epochs=4), FixedOrderSampling(4, n)),
        "BandMF-16": _plan(catalog.build("bsr", 64, bands=16), CyclicPoissonSampling(1.0, 64, 16), m=1000),
    }


def _audit(plan, seed=0, m=M, real=REAL, **kw):
    kw.setdefault("reference_trials", 0)
    return audit_training(plan=plan, canaries=m, seed=seed, num_examples=real, **kw)


# ---------------------------------------------------------------------------- fast checks


def test_a_correct_white_box_audit_reports_and_stays_below_its_claim(fast_plans, tmp_path):
    rep = _audit(fast_plans["DP-SGD"], reference_trials=4)
    assert 0 < rep.epsilon_lower <= rep.epsilon_certified == pytest.approx(2.0, abs=1e-6)
    assert not rep.exceeds and rep.gap == pytest.approx(rep.epsilon_certified - rep.epsilon_lower)
    assert rep.threat_model == "white-box" and rep.canaries == M and rep.mode == "one-run"
    assert rep.score["method"] == "poisson" and rep.score["exact_likelihood_ratio"]
    assert rep.score["noise_check"]["checked"] and rep.score["noise_check"]["directions_below"] == 0
    assert rep.statistics["included"] + 0 < M and rep.configuration["num_examples"] == REAL + M
    assert rep.reference["trials"] == 4 and rep.mechanism_reference["trials"] == 4
    assert rep.fraction_of_reference is not None
    d = json.loads(rep.to_json())
    for key in ("epsilon_lower", "epsilon_certified", "confidence", "threat_model", "canaries"):
        assert key in d
    assert d["epsilon_lower_is"] == "empirical lower bound (not a certificate)"
    assert d["certified_report"]["epsilon"] == rep.epsilon_certified
    text = rep.summary()
    assert "empirical lower bound" in text and "not a certificate" in text and "certified upper bound" in text
    assert "this audit reached" in text
    assert "cannot prove privacy" in rep.verdict()
    path = rep.plot(tmp_path / "audit.png")
    assert path.exists() and path.stat().st_size > 10_000
    # the conservative ROC points of a correct run lie under the certified curve
    fpr, tpr = np.array(rep.roc).T
    assert np.all(tpr <= rep.certified.tradeoff(fpr).tpr + 1e-9)


def test_the_audit_is_reproducible_and_does_not_depend_on_the_clip_norm():
    """The same seed gives the same audit; the released sums are read in clip-norm units and the Dirac
    canaries scale with the clip norm, so the audit of a run is the same at any clip norm."""
    def plan(clip):
        return build_run_spec(Identity(8), PoissonSampling(0.3, 8), num_examples=90, delta=1e-5, max_grad_norm=clip,
                          noise_multiplier=1.0)

    a, b = (_audit(plan(1.0), seed=3, m=60, real=30) for _ in range(2))
    assert a.epsilon_lower == b.epsilon_lower and a.statistics == b.statistics and a.roc == b.roc
    # the same audit from its configuration object, with a field replaced by a keyword
    config = AuditConfig(plan=plan(1.0), canaries=60, seed=0, num_examples=30, reference_trials=0)
    c = audit_training(config, seed=3)
    assert c.epsilon_lower == a.epsilon_lower and c.statistics == a.statistics and c.roc == a.roc
    for clip in (0.01, 300.0):
        c = _audit(plan(clip), seed=3, m=60, real=30)
        assert c.statistics["correct"] == a.statistics["correct"] and c.epsilon_lower == pytest.approx(a.epsilon_lower)


@pytest.mark.parametrize("mechanism", ["BandMF", "BLT"])
def test_correct_correlated_runs_stay_below_their_claim(fast_plans, mechanism):
    rep = _audit(fast_plans[mechanism], seed=1)
    assert rep.epsilon_lower <= rep.epsilon_certified
    assert rep.score["whitening"].startswith("C") and rep.score["noise_check"]["directions_below"] == 0


@pytest.mark.parametrize("mechanism,fault", [
    ("DP-SGD", "noise / 10"), ("BLT", "no clipping"), ("BandMF", "noise on half the steps"),
    ("BandMF-16", "DP-SGD sigma with correlated C"),
])
def test_planted_faults_are_caught(fast_plans, monkeypatch, mechanism, fault):
    plan = fast_plans[mechanism]
    FAULTS[fault](monkeypatch, plan)
    rep = _audit(plan, seed=2, m=1000 if mechanism == "BandMF-16" else M)
    assert rep.exceeds and rep.epsilon_lower > plan.epsilon, rep.summary()
    assert "ALARM" in rep.verdict()
    chk = rep.score["noise_check"]
    if fault == "noise on half the steps":  # the noise check sees it too
        assert chk["directions_below"] >= 8 and chk["steps_below"] == 16
        assert "LESS noise than claimed" in rep.summary()
    elif fault != "no clipping":
        assert chk["directions_below"] > 0


def test_black_box_audit_of_the_built_in_task_catches_gross_faults(fast_plans, monkeypatch):
    """Black-box audits are weak (the correct-run check is in the own-model test below); they catch
    gross faults: no clipping and (almost) no noise."""
    _no_clipping(monkeypatch)
    _noise_scaled(monkeypatch, factor=100)
    gross = _audit(fast_plans["DP-SGD"], threat="black-box")
    assert gross.threat_model == "black-box" and gross.score["method"] == "loss decrease"
    assert "Bonferroni" in gross.statistics["selection"]
    assert gross.exceeds, gross.summary()


def test_auditing_your_own_model_through_make_private():
    """A user's model, optimizer, dataset and loss: white-box with Dirac canaries in an audit block
    added to the model, black-box with the user's own canaries."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(150, 5, generator=g)
    data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    config = dict(strategy=catalog.build("bsr", 16, bands=4), sampling=CyclicPoissonSampling(0.5, 16, 4),
                  noise_multiplier=4.0, delta=1e-5, canaries=200, seed=0, reference_trials=0)
    rep = audit_training(model=model, optimizer=opt, dataset=data, loss_fn=torch.nn.functional.cross_entropy, **config)
    assert rep.model == "user" and rep.epsilon_lower <= rep.epsilon_certified
    assert rep.configuration["real_examples"] == 150 and rep.configuration["canary_examples"] == 200
    assert len(opt.param_groups) == 2 and opt.param_groups[1]["lr"] == 0.0  # the audit block, never moved
    cx = torch.randn(200, 5, generator=g) * 4
    bb = audit_training(model=model, optimizer=opt, dataset=data, loss_fn=torch.nn.functional.cross_entropy,
                        threat="black-box", canary_data=(cx, torch.randint(0, 2, (200,), generator=g)), **config)
    assert bb.threat_model == "black-box" and bb.epsilon_lower <= bb.epsilon_certified


def test_many_run_mode_on_a_tiny_model():
    plan = build_run_spec(Identity(4), PoissonSampling(0.5, 4), num_examples=21, delta=1e-5, max_grad_norm=1.0,
                      noise_multiplier=1.0)
    rep = audit_training(plan=plan, canaries=12, runs=12, seed=0, num_examples=20)
    assert rep.mode == "many-run" and rep.runs == 12 and rep.canaries == 12
    assert rep.bound.startswith("Clopper-Pearson") and "pre-registered threshold" in rep.bound
    assert rep.statistics["positives"] + rep.statistics["negatives"] == 12
    assert rep.epsilon_lower <= rep.epsilon_certified


@pytest.mark.parametrize("kwargs", [
    dict(threat="grey-box"),
    dict(canaries=1),
    dict(runs=3, canaries=5),
    dict(confidence=1.0),
    dict(seed=-1),
    dict(num_examples=REAL + 1),             # the plan was built for REAL + M examples
    dict(noise_multiplier=1.0),              # conflicts with plan=
    dict(dataset=[(torch.zeros(2), 0)]),     # a dataset without the model
    dict(model=torch.nn.Linear(2, 2), dataset=[(torch.zeros(2), 0)], loss_fn=torch.nn.functional.cross_entropy),
                                             # a model without its optimizer
])
def test_bad_input_is_a_dpmf_error(fast_plans, kwargs):
    kw = dict(plan=fast_plans["DP-SGD"], canaries=M, num_examples=REAL, reference_trials=0)
    kw.update(kwargs)
    with pytest.raises(DPMFError):
        audit_training(**kw)


def test_builtin_task_black_box_canaries_use_their_own_features():
    data, make, (cx, cy) = builtin_task(50, canary_features=7)
    x, _ = data.tensors
    assert x.shape == (50, 15) and torch.all(x[:, 8:] == 0)
    assert torch.all(cx[:, :8] == 0) and torch.all((cx[:, 8:] != 0).sum(dim=1) == 1)
    assert make(0)[0].in_features == 15


# ---------------------------------------------------------------------------- slow checks


def _critical(seeds: int, beta: float, level: float = 1e-3) -> int:
    """The largest exceedance count a correct implementation reaches with probability > level."""
    return int(stats.binom.isf(level, seeds, beta))


@pytest.fixture(scope="module")
def slow_plans():
    """The mechanisms under their own samplers, 64 steps, 1000 canaries + 200 real examples:
    DP-SGD / Poisson (PLD), BandMF with 16 bands / cyclic Poisson (4 epochs of 16 steps), BLT /
    balls-in-bins (random allocation)."""
    n, real, m = 64, 200, 1000
    return {
        "DP-SGD": _plan(Identity(n), PoissonSampling(0.1, n), real=real, m=m),
        "BandMF": _plan(catalog.build("bsr", n, bands=16), CyclicPoissonSampling(1.0, n, 16), real=real, m=m),
        "BLT": _plan(catalog.build("blt", n, epochs=4), BallsInBinsSampling(4, n), real=real, m=m),
    }


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["DP-SGD", "BandMF", "BLT"])
def test_correct_runs_never_exceed_their_claim_over_many_seeds(slow_plans, mechanism):
    """12 seeds of a correct run: the number whose lower bound exceeds the certified epsilon must be
    consistent with Binomial(12, 0.05) (at most its 1e-3 critical count, 4; the planted-fault tests
    show the count reaching every seed for a faulty run, so the check can fail)."""
    plan, seeds = slow_plans[mechanism], 12
    reps = [_audit(plan, seed=s, m=1000, real=200) for s in range(seeds)]
    exceed = sum(r.exceeds for r in reps)
    assert exceed <= _critical(seeds, 0.05)
    assert all(r.score["noise_check"]["directions_below"] == 0 for r in reps)
    lows = [r.epsilon_lower for r in reps]
    assert np.median(lows) > 0.1  # the audit has power on a correct run too


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["DP-SGD", "BandMF", "BLT"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_planted_faults_are_caught_under_their_samplers(slow_plans, monkeypatch, mechanism, fault):
    if mechanism == "DP-SGD" and fault == "DP-SGD sigma with correlated C":
        pytest.skip("DP-SGD has no correlated C")
    plan = slow_plans[mechanism]
    FAULTS[fault](monkeypatch, plan)
    reps = [_audit(plan, seed=s, m=1000, real=200) for s in range(2)]
    assert all(r.exceeds for r in reps), [r.epsilon_lower for r in reps]


@pytest.mark.slow
def test_many_run_white_box_catches_missing_noise(monkeypatch):
    plan = build_run_spec(Identity(8), PoissonSampling(0.5, 8), num_examples=21, delta=1e-5, max_grad_norm=1.0,
                      target_epsilon=1.0)
    fine = audit_training(plan=plan, canaries=60, runs=60, seed=0, num_examples=20)
    assert fine.epsilon_lower <= fine.epsilon_certified
    _noise_scaled(monkeypatch, factor=100)
    bad = audit_training(plan=plan, canaries=60, runs=60, seed=0, num_examples=20)
    assert bad.exceeds, bad.summary()
