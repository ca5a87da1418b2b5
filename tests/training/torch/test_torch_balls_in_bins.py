"""Torch batch samplers for the balls-in-bins variants (issue 23): the same draws as
``scheme.batches`` for a seed, resumable from a state (also mid-epoch of fresh slots), data-parallel
shards that partition the global batch, and fixed shapes through a DataLoader."""

from __future__ import annotations

import numpy as np
import pytest

from dpmf.training.torch._deps import require_torch

torch = require_torch()

from dpmf.errors import InvalidParameterError  # noqa: E402
from dpmf.sampling import BallsInBinsSampling, fixed_shape_batches, padded_batch_size  # noqa: E402
from dpmf.training.torch.data import SchemeBatchSampler, private_data_loader  # noqa: E402
from dpmf.training.torch.engine import ShardedBatchSampler  # noqa: E402

N = 50
VARIANTS = {
    "k3-reused": BallsInBinsSampling(3, 30, num_selected=3),
    "k1-fresh": BallsInBinsSampling(3, 30, fresh_slots=True),
    "k2-fresh": BallsInBinsSampling(3, 30, num_selected=2, fresh_slots=True),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_sampler_equals_the_numpy_scheme(name):
    scheme = VARIANTS[name]
    want = [b.tolist() for b in scheme.batches(N, np.random.default_rng(5))]
    assert list(SchemeBatchSampler(scheme, N, seed=5)) == want
    assert list(SchemeBatchSampler(scheme, N, seed=6)) != want


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("stop", [4, 10, 17])  # mid-epoch, epoch boundary, mid second epoch
def test_resume_reproduces_the_uninterrupted_run(name, stop):
    scheme = VARIANTS[name]
    full = list(SchemeBatchSampler(scheme, N, seed=9))
    first = SchemeBatchSampler(scheme, N, seed=9)
    it = iter(first)
    head = [next(it) for _ in range(stop)]
    state = first.state_dict()
    resumed = SchemeBatchSampler.from_state_dict(scheme, state)
    assert head + list(resumed) == full
    other = BallsInBinsSampling(3, 30, num_selected=scheme.num_selected, fresh_slots=not scheme.fresh_slots)
    with pytest.raises(InvalidParameterError, match="only resumes the run"):
        SchemeBatchSampler(other, N, seed=9).load_state_dict(state)


@pytest.mark.parametrize("name", VARIANTS)
def test_data_parallel_shards_partition_the_global_batch(name):
    scheme = VARIANTS[name]
    world = 3
    shards = [list(ShardedBatchSampler(SchemeBatchSampler(scheme, N, seed=2), r, world)) for r in range(world)]
    for t, batch in enumerate(SchemeBatchSampler(scheme, N, seed=2)):
        got = sorted(i for r in range(world) for i in shards[r][t])
        assert got == batch and sum(len(shards[r][t]) for r in range(world)) == len(batch)


def test_fixed_shapes_through_a_data_loader():
    """Padded indices and zero weights load as fixed-shape tensors; the weighted sum over a batch is
    the sum over the scheme's examples only (padding changes nothing)."""
    scheme = VARIANTS["k2-fresh"]
    ds = torch.utils.data.TensorDataset(torch.arange(N, dtype=torch.float64))
    size = padded_batch_size(scheme, N)
    plain = list(private_data_loader(ds, scheme, seed=1))
    for (idx, w), (x,) in zip(fixed_shape_batches(scheme, N, 1, size), plain, strict=True):
        (values,) = ds[torch.as_tensor(idx)]
        assert values.shape == (size,)
        assert float((values * torch.as_tensor(w)).sum()) == float(x.sum())


@pytest.mark.slow  # (~20 s loaded: the plan accounts the run; the batches are checked fast above)
def test_make_private_trains_dp_sgd_with_fresh_slots():
    """End to end: make_private with fresh slots draws the scheme's batches and its report is the
    library's account of the same scheme (allocation_pld: the composition of the epochs)."""
    from dpmf import account
    from dpmf.strategies import Identity
    from dpmf.training.torch import make_private

    torch.manual_seed(0)
    scheme = BallsInBinsSampling(2, 8, fresh_slots=True)
    data = torch.utils.data.TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader, privacy = make_private(
        model, opt, data, strategy=Identity(8), sampling=scheme, noise_multiplier=2.0, delta=1e-5,
        max_grad_norm=1.0, loss_fn=torch.nn.functional.cross_entropy, seed=3)
    sizes = []
    for x, y in loader:
        opt.zero_grad()
        opt.step(x, y)
        sizes.append(len(x))
    assert privacy.steps_done == 8 and sum(sizes) == 2 * 40
    want = account(Identity(8), scheme, 2.0, 1e-5)
    assert (privacy.report().method, privacy.report().epsilon) == (want.method, want.epsilon)


def test_individual_filtering_refuses_the_variants():
    """Individual accounting relies on past participations being determined by the current step (one
    reused slot); the variants are refused with the reason, before any training."""
    from types import SimpleNamespace

    from dpmf.errors import UnsupportedConfigurationError
    from dpmf.strategies import Identity
    from dpmf.training.torch.individual import IndividualAccounting

    for scheme in (BallsInBinsSampling(2, 4, fresh_slots=True), BallsInBinsSampling(2, 4, num_selected=2)):
        privacy = SimpleNamespace(run_spec=SimpleNamespace(strategy=Identity(4), scheme=scheme))  # (checked first)
        with pytest.raises(UnsupportedConfigurationError, match=f"fresh_slots={scheme.fresh_slots}.*not proved"):
            IndividualAccounting(privacy)
