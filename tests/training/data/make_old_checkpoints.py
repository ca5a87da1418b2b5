"""How the checkpoint fixtures beside this file were made (issue 51 item 5): with main at 5518073,
*before* a checkpoint's identity became the run's inputs (its ``plan_fingerprint`` then hashed the
whole description, the accountant's epsilon to the last digit included). The tests resume them with
today's code: ``python tests/training/data/make_old_checkpoints.py`` must NOT be rerun to refresh
them (they stand for checkpoints users already hold)."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
M, D, K, N = 48, 5, 3, 6


def torch_run():
    import torch

    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity
    from dpmf.training.torch import make_private

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(M, D, generator=g), torch.randint(0, K, (M,), generator=g))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D, 4), torch.nn.Tanh(), torch.nn.Linear(4, K))
    return make_private(model, torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9), data,
                        strategy=Identity(N), sampling=PoissonSampling(0.25, N), noise_multiplier=1.5, delta=1e-5,
                        max_grad_norm=0.5, loss_fn=torch.nn.functional.cross_entropy, accountant="pld", seed=3)


def jax_run():
    import jax
    import optax

    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity
    from dpmf.training.jax import make_private

    def loss(params, example):
        x, y = example
        return -jax.nn.log_softmax(x @ params["w"] + params["b"])[y]

    params = {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}
    run = make_private(loss, params, M, strategy=Identity(N), sampling=PoissonSampling(0.25, N), optimizer=optax.sgd(0.1),
                       noise_multiplier=1.5, delta=1e-5, max_grad_norm=1.0, accountant="pld", seed=0)
    return run, params


def jax_data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(M, 4)).astype(np.float32), (np.arange(M) % 3).astype(np.int32)


if __name__ == "__main__":
    run = torch_run()
    for x, y in islice(run.data_loader, 3):
        run.optimizer.zero_grad()
        run.optimizer.step(x, y)
    run.privacy.save_checkpoint(HERE / "checkpoint_5518073.pt")
    run, params = jax_run()
    X, Y = jax_data()
    opt_state = run.tx.init(params)
    for _ in range(3):
        b = next(run.batches)
        params, opt_state = run.step(params, opt_state, (X[b.indices], Y[b.indices]), b.is_padding)
    run.privacy.save_checkpoint(HERE / "checkpoint_5518073_jax.npz", params, opt_state)
