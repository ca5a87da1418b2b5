"""CUDA: ghost-mode training runs with everything on the GPU (parameters, activations, norms, noise
state and its generator) and equals the CPU run up to float round-off (the noise is tiny: CPU and CUDA generators draw different streams). Skipped without a GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpmf.sampling import PoissonSampling  # noqa: E402
from dpmf.strategies import bsr  # noqa: E402
from dpmf.training.torch import make_private  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _train(device: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(2, 4, 3), torch.nn.Flatten(), torch.nn.Linear(24, 3)).to(device)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 2, 8, generator=g), torch.randint(0, 3, (64,), generator=g))
    run = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), data, strategy=bsr(4, 2),
                       sampling=PoissonSampling(0.25, 4), noise_multiplier=1e-6, delta=1e-5, max_grad_norm=0.5,
                       seed=0, accountant="unamplified")
    assert run.optimizer.noise.device.type == torch.device(device).type
    for x, y in run.data_loader:
        run.optimizer.zero_grad()
        torch.nn.functional.cross_entropy(run.module(x.to(device)), y.to(device)).backward()
        run.optimizer.step()
    return [p.detach().cpu() for p in model.parameters()]


@cuda
def test_cuda_ghost_loop_equals_cpu():
    for p, q in zip(_train("cuda"), _train("cpu")):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
