"""Individual accounting / filtering of DP-SGD runs (``dpmf.training.torch.individual``) and the
per-example ``weights`` of the clipper and the optimizer it relies on."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from dpmf.accounting.individual import IndividualGDPLedger, filtered_step
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.privacy.gdp import gdp_delta, gdp_epsilon, gdp_mu
from dpmf.sampling import BallsInBinsSampling, CyclicPoissonSampling, MinSepSampling, PoissonSampling
from dpmf.strategies import Identity, bsr
from dpmf.training.torch import PerExampleClipper, SchemeBatchSampler, correlated_noise, make_private
from dpmf.training.torch.engine import _derived_seed
from dpmf.training.torch.individual import IndividualAccounting

LOSS = torch.nn.functional.cross_entropy
SEED = 5


def _data(m=30, d=4, scale=None):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(m, d, generator=g, dtype=torch.float64)
    if scale is not None:
        x = x * torch.as_tensor(scale, dtype=torch.float64)[:, None]
    return torch.utils.data.TensorDataset(x, torch.randint(0, 3, (m,), generator=g))


def _model(d=4, linear=False):
    """A small MLP; ``linear``: one bias-free layer, whose per-example gradient norm is proportional
    to the input norm (tiny inputs, tiny gradients)."""
    torch.manual_seed(0)
    if linear:
        return torch.nn.Sequential(torch.nn.Linear(d, 3, bias=False)).to(torch.float64)
    return torch.nn.Sequential(torch.nn.Linear(d, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)).to(torch.float64)


def _square_loss(out, y):
    """``|out - onehot(y)|^2 / 2`` up to a constant: it does not saturate, so the gradient norm of a
    bias-free linear model stays proportional to the input norm (``gather``: vmap-friendly)."""
    return 0.5 * (out**2).sum() - out.gather(-1, y[:, None]).sum()


def _run(scheme, data, *, clip, sigma=1.0, strategy=None, lr=0.2, linear=False, loss=LOSS, **kw):
    model = _model(data.tensors[0].shape[1], linear)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return make_private(model, opt, data, strategy=strategy or Identity(scheme.steps), sampling=scheme,
                        noise_multiplier=sigma, delta=1e-5, max_grad_norm=clip, loss_fn=loss, seed=SEED,
                        accountant="unamplified", **kw)


def _autograd_norms(model, params, x, y) -> np.ndarray:
    """Per-example gradient norms by plain autograd, one example at a time (the oracle)."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p, v in zip(ref.parameters(), params):
            p.copy_(v)
    out = []
    for i in range(len(x)):
        ref.zero_grad()
        LOSS(ref(x[i : i + 1]), y[i : i + 1]).backward()
        out.append(math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in ref.parameters())))
    return np.array(out)


# ----------------------------------------------------------------------------- ledger = direct computation
@pytest.mark.parametrize("mode", ["account-only", "filter"])
def test_ledger_equals_the_direct_computation(mode):
    """Replay the run by hand: the scheme's batches from the seed, autograd norms at every step's
    parameters, mu = min(n, C) / (sigma C) for admitted members, the pre-check filter rule; the
    adapter's ledger equals it, and equals the library's filtered_step fed the same norms."""
    scheme, clip, sigma, m = PoissonSampling(0.5, 10), 1.0, 2.0, 30
    data = _data(m, scale=np.linspace(0.1, 3.0, m))  # small and large gradients: some clipped, some not
    model, opt, loader, privacy = _run(scheme, data, clip=clip, sigma=sigma)
    mu_max = 1.0 / sigma
    budget = 2.2 * mu_max if mode == "filter" else None  # ~4.8 worst-case steps
    acct = IndividualAccounting(privacy, budget=budget)
    snapshots, used_weights = [], []
    for x, y in loader:
        snapshots.append([p.detach().clone() for p in model.parameters()])
        used_weights.append(acct.weights(acct.batch_indices()).numpy())
        opt.zero_grad()
        acct.step(x, y)
    assert privacy.steps_done == acct.ledger.steps == 10

    batches = [np.asarray(b) for b in SchemeBatchSampler(scheme, m, seed=_derived_seed(SEED, 0))]
    b2 = acct.budget**2
    spent = np.zeros(m)
    oracle = IndividualGDPLedger(m, acct.budget, noise_multiplier=sigma)
    x_all, y_all = data.tensors
    filtered_any, clipped_any, unclipped_any = False, False, False
    for t, (batch, params) in enumerate(zip(batches, snapshots)):
        norms = _autograd_norms(model, params, x_all[batch], y_all[batch])
        admitted = spent[batch] + mu_max**2 <= b2
        np.testing.assert_array_equal(used_weights[t], admitted.astype(float))
        mu = np.where(admitted, np.minimum(norms, clip) / (sigma * clip), 0.0)
        spent[batch] += mu**2
        full = np.zeros(m)
        full[batch] = np.where(admitted, norms, 0.0)
        filtered_step(oracle, full, clip_norm=clip, noise_multiplier=sigma, normalizer=privacy.run_spec.normalizer)
        filtered_any |= bool((~admitted).any())
        clipped_any |= bool((admitted & (norms > clip)).any())
        unclipped_any |= bool((admitted & (norms < clip)).any())
    np.testing.assert_allclose(acct.ledger.spent_sq, spent, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(acct.ledger.spent_sq, oracle.spent_sq, rtol=1e-10, atol=1e-14)
    assert clipped_any and unclipped_any, "the run must exercise both sides of min(norm, C)"
    assert filtered_any == (mode == "filter")
    assert np.all(acct.ledger.spent_sq <= b2)
    # epsilons from the exact mu-GDP curve, never above the filter's guarantee
    eps = acct.individual_epsilon()
    for i in (0, m // 2, m - 1):
        assert eps[i] == pytest.approx(gdp_epsilon(math.sqrt(spent[i]), 1e-5), rel=1e-6)
    if mode == "filter":
        assert eps.max() <= acct.epsilon() and acct.summary()["exhausted"] == int(acct.exhausted().sum()) > 0


def test_target_epsilon_sets_the_budget():
    scheme = PoissonSampling(0.5, 6)
    *_, privacy = _run(scheme, _data(), clip=1.0, sigma=2.0)  # a full step costs mu = 1/2
    acct = IndividualAccounting(privacy, target_epsilon=3.0)
    assert acct.budget == gdp_mu(3.0, 1e-5) and gdp_delta(acct.budget, 3.0) <= 1e-5 and acct.filtering
    assert acct.epsilon() == pytest.approx(3.0, rel=1e-12)
    acct = IndividualAccounting(privacy, target_epsilon=3.0, delta=1e-6)
    assert acct.budget == gdp_mu(3.0, 1e-6)
    assert not IndividualAccounting(privacy).filtering


# ----------------------------------------------------------------------------- exhausted -> zero gradient
def test_exhausted_example_contributes_zero_gradient():
    """Full-batch DP-GD (Poisson q = 1). Example 0 has a huge gradient (always clipped: mu = 1/sigma a
    step), the others tiny ones. With B^2 = 2.5 / sigma^2 example 0 pays steps 0 and 1, then is
    exhausted: from step 2 on the noiseless part of the update is exactly the clipped sum of the
    others, while at steps 0-1 it includes example 0's clipped gradient (norm ~C)."""
    m, steps, clip, sigma = 12, 5, 1.0, 1.0
    scale = np.full(m, 1e-3)
    scale[0] = 30.0
    data = _data(m, scale=scale)
    model, opt, loader, privacy = _run(PoissonSampling(1.0, steps), data, clip=clip, sigma=sigma, lr=0.01,
                                       linear=True, loss=_square_loss)
    acct = IndividualAccounting(privacy, budget=math.sqrt(2.5) / sigma)
    ref_noise = correlated_noise(Identity(steps), list(model.parameters()), noise_multiplier=sigma,
                                 max_grad_norm=clip, seed=_derived_seed(SEED, 1), dtype=torch.float64)
    clipper = PerExampleClipper(model, _square_loss, clip)
    others = torch.arange(1, m)
    for t, (x, y) in enumerate(loader):
        assert len(x) == m
        with_0 = clipper.clipped_sum(x, y).grads
        without_0 = clipper.clipped_sum(x[others], y[others]).grads
        opt.zero_grad()
        acct.step(x, y)
        noise = ref_noise.unflatten(ref_noise.draw())
        signal = [p.grad * privacy.run_spec.normalizer - w for p, w in zip(model.parameters(), noise)]
        expected = with_0 if t < 2 else without_0
        for s, e in zip(signal, expected):
            torch.testing.assert_close(s, e, rtol=1e-9, atol=1e-9)
        gap = math.sqrt(sum(float(((a - b) ** 2).sum()) for a, b in zip(with_0, without_0)))
        assert gap == pytest.approx(clip, rel=1e-3)  # the dropped contribution is example 0's clipped gradient
        assert bool(acct.exhausted()[0]) == (t >= 1)  # after paying step 1 it cannot pay another full step
        # its norm is still computed (and reported), only its gradient is dropped
        assert opt.last_norms[0] > 5 * clip and opt.last_norms[1:].max() < 0.01 * clip
    assert acct.ledger.spent_sq[0] == pytest.approx(2 / sigma**2, rel=1e-12)
    assert not acct.exhausted()[1:].any()
    assert np.all(acct.ledger.spent_sq[1:] < 0.01 * acct.ledger.spent_sq[0])


def test_clipped_sum_weights_scale_each_clipped_gradient():
    data = _data(8, scale=np.linspace(0.2, 5, 8))
    model = _model()
    clipper = PerExampleClipper(model, LOSS, 0.7, chunk_size=3)
    x, y = data.tensors
    w = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.25, 0.0, 1.0, 0.9], dtype=torch.float64)
    grads, norms = clipper.clipped_sum(x, y, weights=w)
    per = clipper.clipped_per_example(x, y)
    for g, pe in zip(grads, per):
        torch.testing.assert_close(g, torch.tensordot(w, pe, dims=1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(norms, clipper.clipped_sum(x, y).norms)
    ones, _ = clipper.clipped_sum(x, y, weights=[1.0] * 8)
    for a, b in zip(ones, clipper.clipped_sum(x, y).grads):
        assert torch.equal(a, b)
    for bad in ([1.0] * 7, [1.5] + [1.0] * 7, [-0.1] + [1.0] * 7, [float("nan")] + [1.0] * 7, "abc"):
        with pytest.raises(InvalidParameterError, match="weights"):
            clipper.clipped_sum(x, y, weights=bad)


def test_optimizer_weights_and_micro_batches():
    """``step(x, y, weights=w)`` equals accumulating micro-batches with the sliced weights; weights
    without a batch are refused."""
    scheme = PoissonSampling(0.6, 2)
    data = _data(20)
    runs = [_run(scheme, data, clip=0.5) for _ in range(2)]
    (xa, ya), (xb, yb) = next(iter(runs[0].data_loader)), next(iter(runs[1].data_loader))
    assert torch.equal(xa, xb)
    w = torch.linspace(0, 1, len(xa), dtype=torch.float64)
    runs[0].optimizer.step(xa, ya, weights=w)
    for lo in range(0, len(xb), 4):
        runs[1].optimizer.accumulate(xb[lo : lo + 4], yb[lo : lo + 4], weights=w[lo : lo + 4])
    runs[1].optimizer.step()
    for p, q in zip(runs[0].module.parameters(), runs[1].module.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
    with pytest.raises(InvalidParameterError, match="weights"):
        runs[1].optimizer.step(weights=w)


# ----------------------------------------------------------------------------- refusals and misuse
@pytest.mark.parametrize("strategy,scheme", [(bsr(6, 2), CyclicPoissonSampling(0.5, 6, 2)),
                                             (bsr(6, 2), BallsInBinsSampling(3, 6))])
def test_non_identity_strategy_is_refused(strategy, scheme):
    *_, privacy = _run(scheme, _data(), clip=1.0, strategy=strategy)
    with pytest.raises(UnsupportedConfigurationError, match="identity strategy.*correlated noise"):
        IndividualAccounting(privacy, budget=1.0)


def test_unsupported_scheme_and_distributed_are_refused():
    *_, privacy = _run(MinSepSampling(0.5, 6, 2), _data(), clip=1.0)
    with pytest.raises(UnsupportedConfigurationError, match="MinSepSampling"):
        IndividualAccounting(privacy, budget=1.0)
    *_, privacy = _run(PoissonSampling(0.5, 6), _data(), clip=1.0)
    privacy.optimizer.distributed = True  # as make_private(distributed=True) sets it
    with pytest.raises(UnsupportedConfigurationError, match="distributed"):
        IndividualAccounting(privacy, budget=1.0)


def test_misuse_is_refused():
    model, opt, loader, privacy = _run(PoissonSampling(1.0, 4), _data(10), clip=1.0)
    with pytest.raises(InvalidParameterError, match="at most one"):
        IndividualAccounting(privacy, budget=1.0, target_epsilon=2.0)
    with pytest.raises(InvalidParameterError, match="delta goes with"):
        IndividualAccounting(privacy, budget=1.0, delta=1e-6)
    with pytest.raises(InvalidParameterError, match="budget"):
        IndividualAccounting(privacy, budget=-1.0)
    with pytest.raises(InvalidParameterError, match="below one worst-case step"):
        IndividualAccounting(privacy, budget=0.99)  # sigma = 1: one full step costs mu = 1
    acct = IndividualAccounting(privacy, budget=1.0)  # B = 1/sigma: after any charge, no full step fits
    x, y = next(iter(loader))
    idx = acct.batch_indices()
    with pytest.raises(InvalidParameterError, match="right after"):
        acct.observe(idx, torch.ones(len(idx)))  # no step taken yet
    with pytest.raises(InvalidParameterError, match="examples"):
        acct.step(x[:3], y[:3])
    acct.step(x, y)
    x, y = next(iter(loader))
    idx = acct.batch_indices()
    assert acct.exhausted()[idx].all() and not acct.weights(idx).any()
    opt.step(x, y)  # a step that ignores the filter cannot be charged
    with pytest.raises(InvalidParameterError, match="exhausted example had a nonzero weight"):
        acct.observe(idx, opt.last_norms)
    with pytest.raises(InvalidParameterError, match="repeat"):
        acct.weights([0, 0])


def test_resume_with_a_saved_ledger(tmp_path):
    scheme, data = PoissonSampling(0.5, 6), _data(16, scale=np.linspace(0.1, 3, 16))

    def start():
        run = _run(scheme, data, clip=0.8)
        return run, IndividualAccounting(run.privacy, budget=1.6)

    (model, opt, loader, privacy), acct = start()
    for x, y in loader:
        opt.zero_grad()
        acct.step(x, y)
    (model2, opt2, loader2, privacy2), acct2 = start()
    for t, (x, y) in enumerate(loader2):
        opt2.zero_grad()
        acct2.step(x, y)
        if t == 2:
            break
    privacy2.save_checkpoint(tmp_path / "ckpt.pt")
    acct2.ledger.save(tmp_path / "ledger.npz")
    (model3, opt3, loader3, privacy3), _ = start()
    privacy3.load_checkpoint(tmp_path / "ckpt.pt")
    acct3 = IndividualAccounting(privacy3, ledger=IndividualGDPLedger.load(tmp_path / "ledger.npz"))
    for x, y in loader3:
        opt3.zero_grad()
        acct3.step(x, y)
    np.testing.assert_array_equal(acct3.ledger.spent_sq, acct.ledger.spent_sq)
    for p, q in zip(model.parameters(), model3.parameters()):
        assert torch.equal(p, q)
    (_, _, _, fresh), _ = start()
    with pytest.raises(InvalidParameterError, match="recorded 3 steps"):
        IndividualAccounting(fresh, ledger=IndividualGDPLedger.load(tmp_path / "ledger.npz"))
