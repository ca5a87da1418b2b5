"""Batch samplers for torch DataLoaders (dpmf.training.torch.data): the batches are the scheme's
(same seed, same arrays), each scheme's participation law holds through the sampler (statistical
tests with fixed seeds and tolerances that catch a wrong rate or a biased sampler), resuming from
a state reproduces the uninterrupted run, foreign states are refused, and empty batches come out of
a DataLoader as correctly shaped empty tensors."""

from __future__ import annotations

import math
import pickle
from collections import namedtuple

import numpy as np
import pytest
from scipy import stats

from dpmf.training.torch._deps import require_torch

torch = require_torch()

from dpmf.errors import DPMFError, InvalidParameterError, UnsupportedConfigurationError  # noqa: E402
from dpmf.sampling import (  # noqa: E402
    BallsInBinsSampling,
    CyclicPoissonSampling,
    FixedOrderSampling,
    MinSepSampling,
    MultiAttributionMinSepSampling,
    PoissonSampling,
    participation_rate,
)
from dpmf.training.torch.data import (  # noqa: E402
    EmptyBatchCollate,
    SchemeBatchSampler,
    private_data_loader,
)

N = 60
USERS = [[e // 3, 100 + e % 7] for e in range(N)]  # each example has 2 users; <= 9 examples per user

SCHEMES = {
    "poisson": PoissonSampling(0.1, 30),
    "cyclic-equal": CyclicPoissonSampling(0.4, 30, 3),
    "cyclic-independent": CyclicPoissonSampling(0.4, 30, 3, partition="independent"),
    "min-sep-cold": MinSepSampling(0.3, 30, 4),
    "min-sep-warm": MinSepSampling(0.3, 30, 4, warm_start=True),
    "min-sep-truncated": MinSepSampling(0.5, 30, 2, max_batch_size=8, dataset_size=N),
    "balls-in-bins": BallsInBinsSampling(3, 30),
    "fixed-order": FixedOrderSampling(3, 30),
    "multi-attribution": MultiAttributionMinSepSampling(0.1, 30, 3, max_user_examples=9, warmup_steps=5),
}


def make(name: str, seed: int = 7, **kw) -> SchemeBatchSampler:
    scheme = SCHEMES[name]
    if isinstance(scheme, MultiAttributionMinSepSampling):
        return SchemeBatchSampler(scheme, seed=seed, attribution=USERS, **kw)
    return SchemeBatchSampler(scheme, N, seed=seed, **kw)


def reference(name: str, seed: int = 7) -> list[list[int]]:
    scheme = SCHEMES[name]
    data = USERS if isinstance(scheme, MultiAttributionMinSepSampling) else N
    return [b.tolist() for b in scheme.batches(data, np.random.default_rng(seed))]


def appearances(batches, n):
    out = [[] for _ in range(n)]
    for t, batch in enumerate(batches):
        for e in batch:
            out[e].append(t)
    return out


# ------------------------------------------------------------------- same batches as the scheme
@pytest.mark.parametrize("name", list(SCHEMES))
def test_batches_are_the_schemes_batches(name):
    sampler = make(name)
    batches = list(sampler)
    assert len(sampler) == SCHEMES[name].steps == len(batches)
    assert batches == reference(name)
    assert all(isinstance(i, int) for b in batches for i in b)
    assert sampler.steps_done == len(sampler)
    assert batches != list(make(name, seed=8))  # the seed matters


# ------------------------------------------------------------------- participation laws
def test_poisson_participation_counts_are_binomial():
    n, q, steps = 300, 0.1, 400
    batches = list(SchemeBatchSampler(PoissonSampling(q, steps), n, seed=11))
    counts = np.bincount(np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]), minlength=n)
    # total ~ Binomial(n*steps, q): a 5% error in q is ~ 8 sd away, we allow 5
    total, trials = counts.sum(), n * steps
    assert abs(total - trials * q) < 5 * math.sqrt(trials * q * (1 - q))
    # per-example counts ~ Binomial(steps, q), independent: dispersion statistic ~ chi2(n)
    chi2 = float(np.sum((counts - steps * q) ** 2) / (steps * q * (1 - q)))
    assert stats.chi2.sf(chi2, df=n) > 1e-6 and stats.chi2.cdf(chi2, df=n) > 1e-6
    # sorted, no repeats, in range
    assert all(b == sorted(set(b)) and (not b or 0 <= b[0] and b[-1] < n) for b in batches)


def test_poisson_empty_batches_occur_at_the_binomial_rate():
    n, q, steps = 10, 0.1, 2000
    sizes = np.array([len(b) for b in SchemeBatchSampler(PoissonSampling(q, steps), n, seed=3)])
    p_empty = (1 - q) ** n  # 0.349
    empties = int(np.sum(sizes == 0))
    assert abs(empties - steps * p_empty) < 5 * math.sqrt(steps * p_empty * (1 - p_empty))
    assert abs(sizes.mean() - n * q) < 5 * math.sqrt(n * q * (1 - q) / steps)


@pytest.mark.parametrize("partition", ["equal", "independent"])
def test_cyclic_poisson_examples_only_in_their_phase(partition):
    n, b, q, steps = 240, 4, 0.3, 400
    batches = list(SchemeBatchSampler(CyclicPoissonSampling(q, steps, b, partition=partition), n, seed=5))
    app = appearances(batches, n)
    phase = np.full(n, -1)
    for e, ts in enumerate(app):
        residues = {t % b for t in ts}
        assert len(residues) <= 1, f"example {e} appears in phases {residues}"
        if ts:
            phase[e] = ts[0] % b
    assert np.all(phase >= 0)  # with 100 active steps at q=0.3 every example appears
    if partition == "equal":
        assert np.bincount(phase, minlength=b).tolist() == [n // b] * b
    # in its phase each example is Poisson: counts ~ Binomial(steps / b, q), dispersion ~ chi2(n)
    active = steps // b
    counts = np.array([len(ts) for ts in app])
    chi2 = float(np.sum((counts - active * q) ** 2) / (active * q * (1 - q)))
    assert stats.chi2.sf(chi2, df=n) > 1e-6 and stats.chi2.cdf(chi2, df=n) > 1e-6


@pytest.mark.parametrize("warm", [False, True])
def test_min_sep_gap_and_rate(warm):
    n, p, b, steps = 3000, 0.5, 5, 100
    scheme = MinSepSampling(p, steps, b, warm_start=warm)
    batches = list(SchemeBatchSampler(scheme, n, seed=9))
    for ts in appearances(batches, n):
        assert np.all(np.diff(ts) >= b)
    p0 = participation_rate(p, b)  # 1/6
    first = len(batches[0])
    if warm:  # stationary from step 0: Binomial(n, p0) first batch
        assert abs(first - n * p0) < 5 * math.sqrt(n * p0 * (1 - p0))
        # total participations: n*steps*p0 exactly in mean; renewal variance ~ n*steps*var/mean^3
        # (inter-arrival b-1+Geom(p): mean 6, var 2) -> sd ~ 53; a rate off by 2% is 1000 away
        total = sum(len(x) for x in batches)
        assert abs(total - n * steps * p0) < 5 * math.sqrt(n * steps * 2 / 6**3)
    else:  # cold: everybody available at step 0
        assert abs(first - n * p) < 5 * math.sqrt(n * p * (1 - p))


def test_min_sep_truncation_caps_batches_and_keeps_the_gap():
    n, b = 200, 3
    scheme = MinSepSampling(0.9, 60, b, max_batch_size=20, dataset_size=n)
    batches = list(SchemeBatchSampler(scheme, n, seed=1))
    assert max(len(x) for x in batches) == 20  # truncation happens and caps
    for ts in appearances(batches, n):
        assert np.all(np.diff(ts) >= b)


def test_balls_in_bins_once_per_epoch_same_slot():
    n, epochs, per_epoch = 400, 3, 8
    batches = list(SchemeBatchSampler(BallsInBinsSampling(epochs, epochs * per_epoch), n, seed=2))
    for ts in appearances(batches, n):
        assert len(ts) == epochs
        assert ts == [ts[0] + k * per_epoch for k in range(epochs)]  # same slot every epoch
    # slot sizes ~ Multinomial(n, 1/b): chi-square with b-1 degrees of freedom, both tails
    sizes = np.array([len(x) for x in batches[:per_epoch]])
    chi2 = float(np.sum((sizes - n / per_epoch) ** 2) / (n / per_epoch))
    df = per_epoch - 1
    assert stats.chi2.sf(chi2, df) > 1e-6 and stats.chi2.cdf(chi2, df) > 1e-6


def test_fixed_order_once_per_epoch_same_order():
    n, epochs, per_epoch = 50, 4, 5
    batches = list(SchemeBatchSampler(FixedOrderSampling(epochs, epochs * per_epoch), n, seed=4))
    for ts in appearances(batches, n):
        assert len(ts) == epochs and np.all(np.diff(ts) == per_epoch)
    assert batches[:per_epoch] * (epochs - 1) == batches[per_epoch:]
    assert {len(x) for x in batches} == {n // per_epoch}


def test_fixed_order_position_is_uniform_over_seeds():
    # example 0's batch within the epoch is uniform over the seeds: chi2 with 4 dof
    n, per_epoch, runs = 20, 5, 500
    scheme = FixedOrderSampling(1, per_epoch)
    slot = [next(i for i, x in enumerate(SchemeBatchSampler(scheme, n, seed=s)) if 0 in x) for s in range(runs)]
    counts = np.bincount(slot, minlength=per_epoch)
    chi2 = float(np.sum((counts - runs / per_epoch) ** 2) / (runs / per_epoch))
    assert stats.chi2.sf(chi2, per_epoch - 1) > 1e-6


def test_multi_attribution_users_are_min_sep_apart():
    b = 3
    batches = list(make("multi-attribution"))
    last = {}
    for t, batch in enumerate(batches):
        for user in {u for e in batch for u in USERS[e]}:
            assert t - last.get(user, -b) >= b
            last[user] = t
    assert sum(len(x) for x in batches) > 0


# ------------------------------------------------------------------- resume
@pytest.mark.parametrize("name", list(SCHEMES))
@pytest.mark.parametrize("stop", [0, 1, 13, 29])
def test_resume_reproduces_the_uninterrupted_run(name, stop):
    full = reference(name)
    first = make(name)
    it = iter(first)
    head = [next(it) for _ in range(stop)]
    state = first.state_dict()
    assert state["steps_done"] == stop
    state = pickle.loads(pickle.dumps(state))  # what a checkpoint does to it
    fresh = make(name)
    fresh.load_state_dict(state)
    assert head + list(fresh) == full
    attribution = USERS if name == "multi-attribution" else None
    again = SchemeBatchSampler.from_state_dict(SCHEMES[name], state, attribution=attribution)
    assert head + list(again) == full


def test_breaking_out_and_iterating_again_continues():
    sampler = make("min-sep-warm")
    got = []
    for batch in sampler:
        got.append(batch)
        if len(got) == 11:
            break
    got += list(sampler)
    assert got == reference("min-sep-warm")


def test_load_rewinds_a_running_sampler():
    sampler = make("balls-in-bins")
    it = iter(sampler)
    for _ in range(20):
        next(it)
    state = make("balls-in-bins").state_dict(steps_done=5)
    sampler.load_state_dict(state)
    assert next(it) == reference("balls-in-bins")[5]  # a live iterator follows the new position
    assert list(sampler) == reference("balls-in-bins")[6:]


def test_exhausted_sampler_refuses_more_steps():
    sampler = make("poisson")
    list(sampler)
    with pytest.raises(UnsupportedConfigurationError, match="30 steps"):
        iter(sampler)


def test_secure_seed_is_fresh_and_resumable():
    a, b = make("poisson", seed=None, secure=True), make("poisson", seed=None, secure=True)
    assert a.seed != b.seed and a.seed.bit_length() > 64
    it = iter(a)
    head = [next(it) for _ in range(4)]
    resumed = SchemeBatchSampler.from_state_dict(SCHEMES["poisson"], a.state_dict())
    assert head + list(resumed) == [x.tolist() for x in SCHEMES["poisson"].batches(N, a.seed)]
    assert str(a.seed) not in repr(a)


# ------------------------------------------------------------------- refused states and input
@pytest.mark.parametrize(
    "change",
    [
        {"scheme": PoissonSampling(0.1, 31).describe()},
        {"scheme": CyclicPoissonSampling(0.1, 30, 1).describe()},
        {"num_examples": N + 1},
        {"seed": 8},
        {"steps_done": 31},
        {"steps_done": -1},
        {"steps_done": 2.0},
    ],
)
def test_foreign_state_is_refused(change):
    sampler = make("poisson")
    state = {**sampler.state_dict(), **change}
    with pytest.raises(InvalidParameterError):
        sampler.load_state_dict(state)
    assert sampler.steps_done == 0


def test_state_of_another_attribution_or_missing_keys_is_refused():
    sampler = make("multi-attribution")
    other = SchemeBatchSampler(
        SCHEMES["multi-attribution"], seed=7, attribution=[[e // 2] for e in range(N)]
    )
    with pytest.raises(InvalidParameterError, match="attribution_sha256"):
        sampler.load_state_dict(other.state_dict())
    state = sampler.state_dict()
    del state["seed"]
    with pytest.raises(InvalidParameterError, match="missing"):
        sampler.load_state_dict(state)
    with pytest.raises(InvalidParameterError, match="mapping"):
        sampler.load_state_dict([1, 2])
    with pytest.raises(InvalidParameterError, match="steps_done"):
        sampler.state_dict(steps_done=99)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"scheme": "poisson", "num_examples": N, "seed": 0}, "scheme must be one of"),
        ({"num_examples": N}, "seed is required"),
        ({"num_examples": N, "seed": 1, "secure": True}, "secure"),
        ({"num_examples": N, "seed": -1}, "seed"),
        ({"num_examples": N, "secure": 1}, "secure must be True or False"),
        ({"num_examples": N, "seed": True}, "seed"),
        ({"num_examples": N, "seed": 1.5}, "seed"),
        ({"num_examples": 0, "seed": 1}, "num_examples"),
        ({"num_examples": None, "seed": 1}, "num_examples"),
        ({"num_examples": N, "seed": 1, "attribution": USERS}, "attribution"),
    ],
)
def test_bad_sampler_input(kwargs, match):
    kwargs = {"scheme": SCHEMES["poisson"], **kwargs}
    with pytest.raises(InvalidParameterError, match=match):
        SchemeBatchSampler(kwargs.pop("scheme"), kwargs.pop("num_examples"), **kwargs)


def test_scheme_specific_checks_happen_at_construction():
    with pytest.raises(InvalidParameterError, match="steps per epoch"):
        SchemeBatchSampler(FixedOrderSampling(2, 20), 5, seed=0)  # 10 batches from 5 examples
    with pytest.raises(InvalidParameterError, match="dataset_size"):
        SchemeBatchSampler(MinSepSampling(0.5, 10, 2, max_batch_size=3, dataset_size=50), 40, seed=0)
    with pytest.raises(InvalidParameterError, match="attribution is required"):
        SchemeBatchSampler(SCHEMES["multi-attribution"], N, seed=0)
    with pytest.raises(InvalidParameterError, match="differs"):
        SchemeBatchSampler(SCHEMES["multi-attribution"], N + 1, seed=0, attribution=USERS)
    with pytest.raises(InvalidParameterError, match="max_user_examples"):
        SchemeBatchSampler(SCHEMES["multi-attribution"], seed=0, attribution=[[0]] * 20)


# ------------------------------------------------------------------- DataLoader and empty batches
def test_empty_batches_through_a_dataloader_have_the_right_shape():
    x = torch.randn(12, 3, 4)
    y = torch.arange(12)
    ds = torch.utils.data.TensorDataset(x, y)
    loader = private_data_loader(ds, PoissonSampling(0.05, 60), seed=0)
    assert len(loader) == 60
    reference_batches = [b.tolist() for b in PoissonSampling(0.05, 60).batches(12, 0)]
    assert sum(not b for b in reference_batches) > 10  # the test does exercise empty batches
    for (bx, by), idx in zip(loader, reference_batches):
        assert bx.shape == (len(idx), 3, 4) and bx.dtype == torch.float32
        assert by.shape == (len(idx),) and by.dtype == torch.int64
        assert torch.equal(bx, x[idx]) and torch.equal(by, y[idx])
    assert loader.batch_sampler.steps_done == 60


Pair = namedtuple("Pair", "image label")


class DictDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 5

    def __getitem__(self, i):
        return {"x": torch.full((2,), float(i), dtype=torch.float64), "pair": Pair(np.zeros((3,), np.int16), i)}


def test_empty_collate_keeps_nested_structure_and_dtypes():
    empty = EmptyBatchCollate(DictDataset())([])
    assert set(empty) == {"x", "pair"}
    assert empty["x"].shape == (0, 2) and empty["x"].dtype == torch.float64
    assert isinstance(empty["pair"], Pair)
    assert empty["pair"].image.shape == (0, 3) and empty["pair"].image.dtype == torch.int16
    assert empty["pair"].label.shape == (0,)
    full = EmptyBatchCollate(DictDataset())([DictDataset()[i] for i in (1, 3)])
    assert full["x"].shape == (2, 2)


def test_custom_collate_and_workers():
    def collate(items):  # module-level closures pickle under fork; keep it simple
        return torch.stack([torch.as_tensor(v) for v in items]) * 2

    data = [np.ones(4, dtype=np.float32) * i for i in range(8)]
    loader = private_data_loader(data, PoissonSampling(0.1, 40), seed=1, collate_fn=collate, num_workers=2)
    ref = [b.tolist() for b in PoissonSampling(0.1, 40).batches(8, 1)]
    out = list(loader)
    assert [tuple(o.shape) for o in out] == [(len(b), 4) for b in ref]
    assert all(o.dtype == torch.float32 for o in out)
    assert any(not b for b in ref)
    pickle.dumps(EmptyBatchCollate(torch.utils.data.TensorDataset(torch.zeros(2))))


def test_private_data_loader_refuses_conflicts():
    ds = torch.utils.data.TensorDataset(torch.zeros(10, 2))
    with pytest.raises(InvalidParameterError, match="batch_size"):
        private_data_loader(ds, PoissonSampling(0.1, 5), seed=0, batch_size=4)
    with pytest.raises(InvalidParameterError, match="shuffle"):
        private_data_loader(ds, PoissonSampling(0.1, 5), seed=0, shuffle=True)
    with pytest.raises(InvalidParameterError, match="len\\(dataset\\) = 10"):
        private_data_loader(ds, PoissonSampling(0.1, 5), seed=0, num_examples=9)
    with pytest.raises(DPMFError):
        private_data_loader(ds, PoissonSampling(0.1, 5))  # no seed
    loader = private_data_loader(
        torch.utils.data.TensorDataset(torch.zeros(N, 2)), SCHEMES["multi-attribution"], seed=0, attribution=USERS
    )
    assert len(list(loader)) == 30
