"""make_private end to end: the noisy step, accounting from the same objects, refusals, resume."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

import dpmf
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.sampling import BallsInBinsSampling, CyclicPoissonSampling, MultiAttributionMinSepSampling, PoissonSampling
from dpmf.strategies import BLT, BinaryTree, Identity, bsr
from dpmf.training.run_spec import StepOutOfPlanError, build_run_spec
from dpmf.training.torch import correlated_noise, make_private
from dpmf.training.torch.engine import _derived_seed

M = 120  # examples


def _data(m=M, d=6, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=g, dtype=torch.float64).to(dtype)
    return torch.utils.data.TensorDataset(x, torch.randint(0, 3, (m,), generator=g))


def _model(seed=0, dropout=False, dtype=torch.float32):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(6, 8), torch.nn.Tanh()]
    if dropout:
        layers.append(torch.nn.Dropout(0.2))
    layers.append(torch.nn.Linear(8, 3))
    return torch.nn.Sequential(*layers).to(dtype)


LOSS = torch.nn.functional.cross_entropy


def _run(strategy, scheme, *, steps=None, optimizer=torch.optim.SGD, opt_kwargs=None, seed=1, dropout=False,
         noise_multiplier=1.0, **kw):
    model = _model(dropout=dropout)
    opt = optimizer(model.parameters(), **(opt_kwargs or {"lr": 0.1}))
    run = make_private(model, opt, _data(), strategy=strategy, sampling=scheme, noise_multiplier=noise_multiplier,
                       delta=1e-5, max_grad_norm=1.0, loss_fn=LOSS, seed=seed, **kw)
    for t, (x, y) in enumerate(run.data_loader):
        if steps is not None and t >= steps:
            break
        run.optimizer.zero_grad()
        run.optimizer.step(x, y)
    return run


# ----------------------------------------------------------------------------- the noisy step
def test_step_is_clipped_sum_plus_noise_over_expected_batch_size():
    """One SGD step with lr 1 moves the parameters by exactly -(clipped sum + noise_0) / (q m)."""
    strategy, scheme = bsr(5, 2), CyclicPoissonSampling(0.5, 5, 1)
    model = _model(dtype=torch.float64)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    run = make_private(model, opt, _data(dtype=torch.float64), strategy=strategy, sampling=scheme, noise_multiplier=0.7, delta=1e-5,
                       max_grad_norm=0.5, loss_fn=LOSS, seed=3, accountant="unamplified")
    x, y = next(iter(run.data_loader))
    grads, norms = run.optimizer.clipper.clipped_sum(x, y)
    run.optimizer.step(x, y)
    ref_noise = correlated_noise(strategy, before, noise_multiplier=0.7, max_grad_norm=0.5, seed=_derived_seed(3, 1),
                                 dtype=torch.float64)
    w = ref_noise.unflatten(ref_noise.draw())
    normalizer = 0.5 * M  # the expected batch size, public; never len(x)
    assert run.privacy.run_spec.normalizer == normalizer != len(x)
    for p0, p, g, n in zip(before, model.parameters(), grads, w):
        torch.testing.assert_close(p.detach(), p0 - (g + n) / normalizer, rtol=1e-12, atol=1e-12)
    assert torch.equal(run.optimizer.last_norms, norms)


def test_micro_batches_equal_one_batch():
    scheme = PoissonSampling(0.3, 4)
    a = _run(Identity(4), scheme, steps=1)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    b = make_private(model, opt, _data(), strategy=Identity(4), sampling=scheme, noise_multiplier=1.0, delta=1e-5,
                     max_grad_norm=1.0, loss_fn=LOSS, seed=1)
    x, y = next(iter(b.data_loader))
    b.optimizer.zero_grad()
    for lo in range(0, len(x), 7):  # micro-batches of 7: same step, same accounting
        b.optimizer.accumulate(x[lo : lo + 7], y[lo : lo + 7])
    b.optimizer.step()
    for p, q in zip(a.module.parameters(), b.module.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    assert b.privacy.steps_done == 1


@pytest.mark.parametrize("optimizer,kwargs", [(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                                              (torch.optim.Adam, {"lr": 1e-2}),
                                              (torch.optim.AdamW, {"lr": 1e-2})])
def test_any_inner_optimizer_and_a_scheduler(optimizer, kwargs):
    model = _model()
    opt = optimizer(model.parameters(), **kwargs)
    run = make_private(model, opt, _data(), strategy=bsr(6, 2), sampling=BallsInBinsSampling(2, 6),
                       noise_multiplier=2.0, delta=1e-5, max_grad_norm=1.0, loss_fn=LOSS, seed=0)
    sched = torch.optim.lr_scheduler.StepLR(run.optimizer, step_size=2, gamma=0.5)
    for x, y in run.data_loader:
        run.optimizer.zero_grad()
        run.optimizer.step(x, y)
        sched.step()
    assert run.privacy.steps_done == 6
    assert opt.param_groups[0]["lr"] == pytest.approx(kwargs["lr"] * 0.5**3)
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ----------------------------------------------------------------------------- accounting
def test_dpsgd_sigma_and_epsilon_equal_dp_accounting():
    """DP-SGD (identity + Poisson): the calibrated sigma and its epsilon agree with dp_accounting's PLD
    accountant (what Opacus' PRV accountant approximates) to 1e-3."""
    import dp_accounting

    q, T, delta, target = 0.05, 60, 1e-5, 2.0
    plan = build_run_spec(Identity(T), PoissonSampling(q, T), num_examples=1000, target_epsilon=target, delta=delta,
                      max_grad_norm=1.0)

    def eps(sigma):
        acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), T)
        return acc.get_epsilon(delta)

    assert plan.report.method == "pld"
    assert eps(plan.noise_multiplier) == pytest.approx(plan.epsilon, rel=1e-3)
    assert plan.epsilon <= target
    peer = dp_accounting.calibrate_dp_mechanism(
        lambda: dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4),
        lambda s: dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(s)), T),
        # a bracket of +-5% around ours: a peer root outside it raises, so the bracket cannot hide a disagreement
        target, delta, dp_accounting.ExplicitBracketInterval(0.95 * plan.noise_multiplier, 1.05 * plan.noise_multiplier),
        tol=1e-5)
    assert plan.noise_multiplier == pytest.approx(peer, rel=1e-3)


# Opacus' PRV domain search consults its RDP accountant, which notes its alpha range: the peer's note
@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha:UserWarning")
def test_dpsgd_equals_opacus_prv():
    opacus = pytest.importorskip("opacus")
    from opacus.accountants.utils import get_noise_multiplier

    q, T, delta, target = 0.05, 60, 1e-5, 2.0
    plan = build_run_spec(Identity(T), PoissonSampling(q, T), num_examples=1000, target_epsilon=target, delta=delta,
                      max_grad_norm=1.0)
    # Opacus' PRV accountant is an upper estimate within eps_error (default 0.01): ask it for 1e-3
    sigma = get_noise_multiplier(target_epsilon=target, target_delta=delta, sample_rate=q, steps=T, accountant="prv",
                                 epsilon_tolerance=1e-4, eps_error=1e-3)
    assert plan.noise_multiplier == pytest.approx(sigma, rel=1e-3)
    prv = opacus.accountants.PRVAccountant()
    prv.history = [(plan.noise_multiplier, q, T)]
    assert prv.get_epsilon(delta, eps_error=1e-3) == pytest.approx(plan.epsilon, rel=1e-3)


def test_report_comes_from_the_same_objects_and_is_json():
    run = _run(bsr(6, 2), BallsInBinsSampling(2, 6), steps=3)
    r = run.privacy.report()
    direct = dpmf.account(bsr(6, 2), BallsInBinsSampling(2, 6), 1.0, 1e-5)
    assert r.epsilon == direct.epsilon and r.method == direct.method and r.certified
    assert r.diagnostics["training"]["steps_done"] == 3
    assert '"epsilon"' in r.to_json()
    assert run.privacy.get_epsilon() == r.epsilon
    assert run.privacy.get_epsilon(1e-3) < r.epsilon


def test_target_epsilon_calibrates_for_correlated_noise():
    model = _model()
    run = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), _data(), strategy=BinaryTree(8),
                       sampling=PoissonSampling(0.1, 8), target_epsilon=3.0, delta=1e-5, max_grad_norm=1.0,
                       loss_fn=LOSS, seed=0)
    cal = dpmf.calibrate(BinaryTree(8), PoissonSampling(0.1, 8), 3.0, 1e-5)
    assert run.privacy.noise_multiplier == cal.noise_multiplier
    assert run.privacy.report().epsilon <= 3.0


# ----------------------------------------------------------------------------- refusals
def test_steps_mismatch_is_refused_before_training():
    with pytest.raises(InvalidParameterError, match="n=8 steps but the sampler has steps=10"):
        _run(bsr(8, 2), PoissonSampling(0.1, 10))


def test_pair_without_a_sound_accountant_is_refused():
    # MMCC does not cover multi-attribution sampling: refused before training (the user-level pair's
    # proved bounds are the unamplified one, which "auto" picks, and certified Monte Carlo)
    with pytest.raises(UnsupportedConfigurationError):
        build_run_spec(bsr(8, 2), MultiAttributionMinSepSampling(0.2, 8, 2, 2), num_examples=M, noise_multiplier=1.0,
                   delta=1e-5, max_grad_norm=1.0, accountant="mmcc")
    plan = build_run_spec(bsr(8, 2), MultiAttributionMinSepSampling(0.2, 8, 2, 2), num_examples=M, noise_multiplier=1.0,
                      delta=1e-5, max_grad_norm=1.0)
    assert plan.report.method == "unamplified" and plan.report.certified


def test_monte_carlo_estimate_cannot_certify_training():
    from dpmf.sampling import MinSepSampling

    with pytest.raises(UnsupportedConfigurationError, match="estimate"):
        build_run_spec(bsr(8, 2), MinSepSampling(0.2, 8, 2), num_examples=M, noise_multiplier=1.0, delta=1e-2,
                   max_grad_norm=1.0, accountant="montecarlo", accountant_options=None, num_samples=2000, seed=0)


def test_step_past_the_plan_is_refused():
    run = _run(Identity(3), PoissonSampling(0.2, 3))
    assert run.privacy.steps_done == 3
    x, y = _data()[:4]
    with pytest.raises(StepOutOfPlanError, match="outside the plan"):
        run.optimizer.step(x, y)
    with pytest.raises(dpmf.errors.DPMFError):  # the sampler has no batch 4 either
        next(iter(run.data_loader))


def test_bad_arguments():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    common = dict(strategy=Identity(4), sampling=PoissonSampling(0.1, 4), delta=1e-5, max_grad_norm=1.0, loss_fn=LOSS)
    with pytest.raises(InvalidParameterError, match="seed"):
        make_private(model, opt, _data(), noise_multiplier=1.0, **common)
    with pytest.raises(InvalidParameterError, match="exactly one"):
        make_private(model, opt, _data(), noise_multiplier=1.0, target_epsilon=1.0, seed=0, **common)
    with pytest.raises(InvalidParameterError, match="max_grad_norm"):
        make_private(model, opt, _data(), noise_multiplier=1.0, seed=0, **{**common, "max_grad_norm": -1.0})


# ----------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("strategy,scheme", [(bsr(8, 3), BallsInBinsSampling(2, 8)),
                                             (BLT([0.9, 0.4], [0.3, 0.2]).to_toeplitz(8), BallsInBinsSampling(1, 8)),
                                             (BinaryTree(8), PoissonSampling(0.2, 8))])
def test_resume_from_checkpoint_is_bit_for_bit(tmp_path, strategy, scheme):
    kw = dict(optimizer=torch.optim.Adam, opt_kwargs={"lr": 1e-2}, dropout=True, accountant="unamplified")
    full = _run(strategy, scheme, **kw)

    first = _run(strategy, scheme, steps=5, **kw)
    first.privacy.save_checkpoint(tmp_path / "ckpt.pt")
    torch.manual_seed(12345)  # a fresh process would not share the RNG: the checkpoint restores it
    model = _model(seed=99, dropout=True)  # different init: overwritten by the checkpoint
    second = make_private(model, torch.optim.Adam(model.parameters(), lr=1e-2), _data(), strategy=strategy,
                          sampling=scheme, noise_multiplier=1.0, delta=1e-5, max_grad_norm=1.0, loss_fn=LOSS, seed=1,
                          accountant="unamplified")
    second.privacy.load_checkpoint(tmp_path / "ckpt.pt")
    assert second.privacy.steps_done == 5
    for x, y in second.data_loader:
        second.optimizer.zero_grad()
        second.optimizer.step(x, y)
    assert second.privacy.steps_done == 8
    for p, q in zip(full.module.parameters(), second.module.parameters()):
        assert torch.equal(p, q)


def test_mismatched_or_corrupt_checkpoint_is_refused(tmp_path):
    run = _run(bsr(6, 2), BallsInBinsSampling(1, 6), steps=2)
    path = tmp_path / "ckpt.pt"
    run.privacy.save_checkpoint(path)
    other = _run(bsr(6, 2), BallsInBinsSampling(1, 6), steps=0, noise_multiplier=1.5)
    with pytest.raises(InvalidParameterError, match="noise_multiplier: 1.0 in the checkpoint, 1.5 here"):
        other.privacy.load_checkpoint(path)
    model = _model()
    bigger = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), _data(m=M + 1),
                          strategy=bsr(6, 2), sampling=BallsInBinsSampling(1, 6), noise_multiplier=1.0, delta=1e-5,
                          max_grad_norm=1.0, loss_fn=LOSS, seed=1)
    with pytest.raises(InvalidParameterError, match="num_examples"):
        bigger.privacy.load_checkpoint(path)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(path.read_bytes()[:200])
    with pytest.raises(InvalidParameterError, match="not a readable"):
        run.privacy.load_checkpoint(bad)
    with pytest.raises(InvalidParameterError, match="does not exist"):
        run.privacy.save_checkpoint(tmp_path / "missing" / "c.pt")


# ----------------------------------------------------------------------------- without torch
def test_import_dpmf_without_torch_and_a_clear_error():
    code = (  # a finder that makes torch uninstallable for this interpreter
        "import sys, importlib.abc\n"
        "class NoTorch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "import dpmf, dpmf.training\n"
        "from dpmf.strategies import Identity\n"
        "from dpmf.sampling import PoissonSampling\n"
        "assert dpmf.account(Identity(10), PoissonSampling(0.1, 10), 1.0, 1e-5).epsilon > 0\n"
        "assert 'torch' not in sys.modules\n"
        "try:\n"
        "    import dpmf.training.torch\n"
        "except ImportError as e:\n"
        "    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)  # (a hang guard, far above the work)
    assert out.returncode == 0, out.stderr
    assert "ERR dpmf.training.torch needs PyTorch" in out.stdout and "pip install 'dpmf[torch]'" in out.stdout


def test_import_dpmf_does_not_import_torch():
    out = subprocess.run([sys.executable, "-c", "import sys, dpmf; print('torch' in sys.modules)"],
                         capture_output=True, text=True, timeout=900)  # (a hang guard, far above the work)
    assert out.stdout.strip() == "False"


def test_expected_batch_size_matches_the_sampler_on_average():
    from dpmf.training.run_spec import expected_batch_size
    from dpmf.training.torch import SchemeBatchSampler

    for scheme in (PoissonSampling(0.1, 200), CyclicPoissonSampling(0.4, 200, 4), BallsInBinsSampling(2, 200)):
        sizes = [len(b) for b in SchemeBatchSampler(scheme, 1000, seed=0)]
        mean, sd = np.mean(sizes), np.std(sizes) / math.sqrt(len(sizes))
        assert abs(mean - expected_batch_size(scheme, 1000)) <= 5 * sd + 1e-9
