"""Data parallel training (``make_private(..., distributed=True)``) over 2 CPU processes (gloo).

Two ranks spawned with ``torch.multiprocessing`` (rendezvous through a ``FileStore`` in
``tmp_path``: no TCP port to race for) each build the same float64 model and dataset and train
the whole plan. We check, against a 1-process run in this process with the same seed:

* both ranks end with bit-identical parameters, equal to the 1-process run to float64 round-off
  (the all-reduce only reorders the sum);
* the global batch of every step is the disjoint union of the rank shards, and equals the
  1-process run's batch (the scheme's, from the same seed);
* the noise is added exactly once (argued and checked in ``test_noise_is_added_exactly_once``);
* secure mode: the ranks share one OS-drawn sampler seed and noise state, and end identical.

All runs of both ranks happen in one spawn (module fixture) to keep the file near 20 s.
"""

from __future__ import annotations

import datetime
import time
import traceback

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dpmf.errors import InvalidParameterError
from dpmf.sampling import CyclicPoissonSampling, PoissonSampling
from dpmf.strategies import Identity, bsr
from dpmf.training.torch import SchemeBatchSampler, make_private
from dpmf.training.torch.engine import _derived_seed

M, D, K = 48, 5, 3  # examples, features, classes
SEED = 11
LR = 0.5
SIGMA = 1.0
WORLD = 2
SPAWN_TIMEOUT_S = 240  # a hung rendezvous fails the test instead of hanging the suite

# name -> (strategy, scheme); both cover 6 steps
CONFIGS = {
    "bandmf-cyclic": (lambda: bsr(6, 2), lambda: CyclicPoissonSampling(0.5, 6, 2)),
    "dpsgd-poisson": (lambda: Identity(6), lambda: PoissonSampling(0.25, 6)),
    # ghost mode in the loss.backward() loop
    "bandmf-cyclic-ghost-loop": (lambda: bsr(6, 2), lambda: CyclicPoissonSampling(0.5, 6, 2)),
}


def _dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, D, generator=g, dtype=torch.float64)
    y = torch.randint(0, K, (M,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def _model():
    torch.manual_seed(0)  # same initialization on every rank and in the 1-process run
    return torch.nn.Sequential(torch.nn.Linear(D, 8), torch.nn.Tanh(), torch.nn.Linear(8, K)).to(torch.float64)


def _indices(x, data_x) -> list[int]:
    """Dataset rows of a batch (rows of ``_dataset`` are distinct random vectors)."""
    if len(x) == 0:
        return []
    hits = (x[:, None, :] == data_x[None, :, :]).all(-1).nonzero()
    assert hits.shape[0] == len(x), "every batch row is exactly one dataset row"
    return hits[:, 1].tolist()


def _train(config: str, *, distributed: bool, seed: int | None, noise_multiplier: float = SIGMA,
           accountant: str = "unamplified") -> dict:
    """Run the whole plan; return final parameters, every step's (shard) indices, seeds and noise state.

    The accountant only sets the reported epsilon, never the trajectory: the cheap unamplified one
    keeps the ranks' start-up short (the amplified ones are tested in test_torch_training.py)."""
    strategy, scheme = (f() for f in CONFIGS[config])
    data = _dataset()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.5)
    loop = config.endswith("-loop")
    loss = torch.nn.functional.cross_entropy
    run = make_private(model, opt, data, strategy=strategy, sampling=scheme, noise_multiplier=noise_multiplier,
                       delta=1e-5, max_grad_norm=1.0, loss_fn=None if loop else loss,
                       seed=seed, secure=seed is None, distributed=distributed, accountant=accountant)
    shards = []
    for x, y in run.data_loader:
        shards.append(_indices(x, data.tensors[0]))
        run.optimizer.zero_grad()
        if loop:
            loss(run.module(x), y).backward()
            run.optimizer.step()
        else:
            run.optimizer.step(x, y)
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "shards": shards,
        "steps_done": run.privacy.steps_done,
        "sampler_seed": run.privacy.sampler.seed,
        "noise_state": run.optimizer.noise.state_dict(),
        "normalizer": run.privacy.run_spec.normalizer,
    }


def _worker(rank: int, world: int, store: str, out_dir: str) -> None:
    torch.set_num_threads(1)  # 2 ranks on a 2-core machine
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=900))  # (a hang guard: ranks wait on each other)
    try:
        results = {name: _train(name, distributed=True, seed=SEED) for name in CONFIGS}
        results["secure"] = _train("bandmf-cyclic", distributed=True, seed=None)
        results["mismatch"] = {}
        for what, kwargs in {"seed": {"seed": SEED + rank}, "plan": {"noise_multiplier": SIGMA * (1 + rank)}}.items():
            try:
                _train("dpsgd-poisson", distributed=True, **{"seed": SEED, **kwargs})
                results["mismatch"][what] = "accepted"
            except InvalidParameterError as exc:
                results["mismatch"][what] = str(exc)
        torch.save(results, f"{out_dir}/rank{rank}.pt")
        # both ranks done before either tears down: a rank that destroys its gloo group while the
        # other still talks to it can abort ("terminate called without an active exception")
        dist.barrier()
    except Exception:  # make the child's traceback visible in the parent's failure message
        with open(f"{out_dir}/rank{rank}.err", "w") as fh:
            fh.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The results of both ranks (one spawn for all configurations)."""
    out = tmp_path_factory.mktemp("ddp")
    ctx = mp.start_processes(_worker, args=(WORLD, str(out / "filestore"), str(out)), nprocs=WORLD,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    try:
        while not ctx.join(timeout=2.0):
            if time.monotonic() > deadline:
                pytest.fail(f"the {WORLD} spawned ranks did not finish within {SPAWN_TIMEOUT_S} s")
    except mp.ProcessRaisedException as exc:
        errs = "\n".join(p.read_text() for p in sorted(out.glob("rank*.err")))
        pytest.fail(f"a rank failed:\n{errs or exc}")
    finally:
        for p in ctx.processes:  # only our own children, by handle
            if p.is_alive():
                p.terminate()
                p.join(5)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.fixture(scope="module")
def single():
    """The 1-process runs with the same seed."""
    return {name: _train(name, distributed=False, seed=SEED) for name in CONFIGS}


def _assert_params_close(a, b, rtol=1e-10, atol=1e-12):
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p, q, rtol=rtol, atol=atol)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_ranks_identical_and_equal_to_one_process(ranks, single, config):
    r0, r1 = ranks[0][config], ranks[1][config]
    assert r0["steps_done"] == r1["steps_done"] == 6
    for p, q in zip(r0["params"], r1["params"], strict=True):
        assert torch.equal(p, q), "the ranks must end with bit-identical parameters"
    # float64: the all-reduce adds two partial sums instead of one sum; nothing else differs
    _assert_params_close(r0["params"], single[config]["params"])
    init = list(_model().parameters())
    assert any(not torch.allclose(p, q) for p, q in zip(r0["params"], init)), "training moved the parameters"


@pytest.mark.parametrize("config", list(CONFIGS))
def test_global_batch_is_the_union_of_the_shards(ranks, single, config):
    strategy, scheme = (f() for f in CONFIGS[config])
    expected = [sorted(b) for b in SchemeBatchSampler(scheme, M, seed=_derived_seed(SEED, 0))]
    s0, s1 = ranks[0][config]["shards"], ranks[1][config]["shards"]
    assert len(s0) == len(s1) == len(expected) == 6
    for t, (a, b, want, one) in enumerate(zip(s0, s1, expected, single[config]["shards"])):
        assert not set(a) & set(b), f"step {t}: shards overlap"
        assert sorted(a + b) == want == sorted(one), f"step {t}: union of shards != the scheme's batch"
        assert abs(len(a) - len(b)) <= 1, f"step {t}: batch[rank::world] splits evenly"
    assert sum(len(b) for b in expected) > 0


def test_noise_is_added_exactly_once(ranks, single):
    """Why the 1-process equality catches wrong noise handling (sigma * C / normalizer = 1/16 per
    coordinate and step here, lr 0.5, against a tolerance of 1e-10):

    * noise added on each rank before the all-reduce (same stream on both ranks): the reduced sum
      carries ``2 z`` -- exactly a 1-process run with noise_multiplier ``2 sigma`` and the same seed,
      which we show lands far from the distributed result;
    * independent noise per rank before the all-reduce: ``z_0 + z_1 != z``, so the ranks agree
      with each other but not with the 1-process run;
    * noise added after the all-reduce but different per rank: the ranks differ (checked bit for
      bit above);
    * no noise at all: the distributed run would be (nearly) a run with sigma 1e-3, which lands
      far from the 1-process run with noise (checked below).
    """
    config = "bandmf-cyclic"
    dist_params = ranks[0][config]["params"]
    _assert_params_close(dist_params, single[config]["params"])
    double = _train(config, distributed=False, seed=SEED, noise_multiplier=2 * SIGMA)["params"]
    tiny = _train(config, distributed=False, seed=SEED, noise_multiplier=1e-3 * SIGMA)["params"]
    gap_double = max((p - q).abs().max().item() for p, q in zip(dist_params, double))
    gap_none = max((p - q).abs().max().item() for p, q in zip(dist_params, tiny))
    assert gap_double > 1e-3 and gap_none > 1e-3, (gap_double, gap_none)
    # and the noise state advanced once per step on each rank, in step with the 1-process run
    assert ranks[0][config]["noise_state"]["steps_done"] == single[config]["noise_state"]["steps_done"] == 6


def test_secure_mode_ranks_share_seed_noise_and_end_identical(ranks):
    r0, r1 = ranks[0]["secure"], ranks[1]["secure"]
    assert r0["steps_done"] == r1["steps_done"] == 6
    assert r0["sampler_seed"] == r1["sampler_seed"], "one OS-drawn sampler seed, broadcast from rank 0"
    assert r0["sampler_seed"] != _derived_seed(SEED, 0)
    for p, q in zip(r0["params"], r1["params"], strict=True):
        assert torch.equal(p, q)
    g0, g1 = r0["noise_state"]["generator_state"], r1["noise_state"]["generator_state"]
    assert torch.equal(g0, g1), "the same secure noise stream on both ranks"
    # the global batches are the scheme's batches from the broadcast seed, split across ranks
    scheme = CONFIGS["bandmf-cyclic"][1]()
    expected = [sorted(b) for b in SchemeBatchSampler(scheme, M, seed=r0["sampler_seed"])]
    assert [sorted(a + b) for a, b in zip(r0["shards"], r1["shards"])] == expected
    # secure noise differs from the seeded run's (it is fresh OS entropy)
    assert any(not torch.equal(p, q) for p, q in zip(r0["params"], ranks[0]["bandmf-cyclic"]["params"]))


def test_ranks_that_disagree_are_refused_on_every_rank(ranks):
    """Different seeds (different batches and noise) or different plans: each rank gets the error
    before its first step, naming what differs."""
    for r in ranks:
        assert "sampler seed" in r["mismatch"]["seed"] and "noise stream" in r["mismatch"]["seed"]
        assert "plan" in r["mismatch"]["plan"]
