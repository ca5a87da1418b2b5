"""make_private with a BandInvMF strategy (C^{-1} banded, C dense): the noise is the banded-inverse
recurrence with (bands - 1) x d floats of history, the first step is the clipped sum plus the
numpy twin's noise, the run is accounted, and a checkpoint resumes."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dpmf.sampling import BallsInBinsSampling  # noqa: E402
from dpmf.strategies.bandinv import optimize_banded_inverse_toeplitz  # noqa: E402
from dpmf.training.torch import make_private  # noqa: E402
from dpmf.training.torch.engine import _derived_seed  # noqa: E402

M, N = 60, 6


def _setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, 4, generator=g, dtype=torch.float64)
    data = torch.utils.data.TensorDataset(x, torch.randint(0, 2, (M,), generator=g))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)).to(torch.float64)
    return model, data


def _private(model, data, strategy=None, plan=None):
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    how = dict(plan=plan) if plan is not None else dict(
        strategy=strategy, sampling=BallsInBinsSampling(2, N), noise_multiplier=2.0, delta=1e-5, max_grad_norm=0.5,
        accountant="unamplified")  # (the allocation accountants: tests/accounting/test_bandinv_accounting.py)
    return make_private(model, opt, data, loss_fn=torch.nn.functional.cross_entropy, seed=5,
                        noise_dtype=torch.float64, **how)


def test_make_private_with_band_inv_noise_and_allocation_accounting():
    strategy = optimize_banded_inverse_toeplitz(N, 3, 2, nonnegative=True)
    model, data = _setup()
    before = [p.detach().clone() for p in model.parameters()]
    run = _private(model, data, strategy)
    noise = run.optimizer.noise
    history = int(np.flatnonzero(strategy.inverse_coefs)[-1])  # nonzero bands of C^{-1}, minus 1
    assert history >= 1 and noise.mode == "banded-inverse"
    assert noise.memory_floats == history * sum(p.numel() for p in before)
    # the step: p <- p - (clipped sum + sigma * clip * (C^{-1} z)_0) / normalizer, z from the run's noise seed
    x, y = next(iter(run.data_loader))
    grads, _ = run.optimizer.clipper.clipped_sum(x, y)
    run.optimizer.step(x, y)
    d = sum(p.numel() for p in before)
    z = strategy.streaming_noise(d, 0)  # numpy twin fed the torch draw below
    gen = torch.Generator().manual_seed(_derived_seed(5, 1))
    draw = torch.randn(d, generator=gen, dtype=torch.float64).numpy() * 2.0 * 0.5
    w0 = z.step(draw.copy())
    normalizer = run.privacy.run_spec.normalizer
    flat_before = torch.cat([p.reshape(-1) for p in before])
    flat_after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flat_grad = torch.cat([g.reshape(-1) for g in grads])
    np.testing.assert_allclose((flat_before - flat_after).numpy() * normalizer - flat_grad.numpy(), w0,
                               rtol=0, atol=1e-9)
    report = run.privacy.run_spec.report
    assert report.certified and report.method == "unamplified" and np.isfinite(report.epsilon)
    # a checkpoint after 1 step resumes into a fresh run of the same plan and finishes it
    state = run.privacy.state_dict()
    model2, data2 = _setup()
    run2 = _private(model2, data2, plan=run.privacy.run_spec)
    run2.privacy.load_state_dict(state)
    for x, y in run2.data_loader:
        run2.optimizer.step(x, y)
    assert run2.privacy.steps_done == N
