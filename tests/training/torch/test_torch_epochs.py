"""Epochs for Opacus users (issue 52 item 5): ``make_private(..., epochs=, sample_rate=)`` is the run
of ``strategy=Identity(T), sampling=PoissonSampling(q, T)`` with ``T = epochs * round(1 / q)`` (the
rate from a batching ``DataLoader`` as Opacus takes it); ``privacy.steps_per_epoch`` / ``epochs`` /
``epoch_of`` / ``by_epoch`` cut the one pass over the loader into epochs, also after a resume. (The
migration page's converted CNN script runs in tests/test_docs_site.py.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpmf.errors import InvalidParameterError  # noqa: E402
from dpmf.sampling import BallsInBinsSampling, PoissonSampling  # noqa: E402
from dpmf.strategies import Identity  # noqa: E402
from dpmf.training.torch import make_private  # noqa: E402

N = 100
GUARANTEE = dict(delta=1e-5, max_grad_norm=1.0, seed=0, loss_fn=torch.nn.functional.cross_entropy)


def data():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(N, 4, generator=g), torch.randint(0, 2, (N,), generator=g))


def run(source=None, **kw):
    model = torch.nn.Linear(4, 2)
    return make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), data() if source is None else source,
                        **GUARANTEE, **kw)


def test_epochs_and_a_float_sample_rate_are_poisson_dp_sgd():
    got = run(epochs=2, sample_rate=0.064, noise_multiplier=1.2).privacy  # 1 / 0.064 = 15.6: 16 steps per epoch
    want = run(strategy=Identity(32), sampling=PoissonSampling(0.064, 32), noise_multiplier=1.2).privacy
    assert got.run_spec.scheme == want.run_spec.scheme == PoissonSampling(0.064, 32)
    assert got.run_spec.strategy.describe() == Identity(32).describe()
    assert got.report().epsilon == want.report().epsilon
    assert (got.steps_per_epoch, got.epochs) == (16, 2)


def test_target_epsilon_with_epochs_calibrates_the_same_run():
    got = run(epochs=2, sample_rate=0.25, target_epsilon=3.0).privacy
    want = run(strategy=Identity(8), sampling=PoissonSampling(0.25, 8), target_epsilon=3.0).privacy
    assert got.noise_multiplier == want.noise_multiplier and got.get_epsilon() <= 3.0


def test_a_batching_loader_gives_the_rate_as_opacus():
    loader = torch.utils.data.DataLoader(data(), batch_size=30)  # len 4: sample_rate 1/4, 4 steps per epoch
    _, _, out, privacy = run(loader, epochs=3, noise_multiplier=1.0)
    assert privacy.run_spec.scheme == PoissonSampling(0.25, 12)
    assert len(out) == 12 == privacy.epochs * privacy.steps_per_epoch


@pytest.mark.parametrize("kw, needle", [
    (dict(sample_rate=0.1), "sample_rate needs epochs="),
    (dict(epochs=2), "epochs= needs sample_rate="),
    (dict(epochs=2, sample_rate=0.1, sampling=PoissonSampling(0.1, 20)), "conflicts with sampling="),
    (dict(epochs=0, sample_rate=0.1), "epochs"),
    (dict(epochs=2, sample_rate=1.5), "sample_rate"),
    (dict(epochs=2, sample_rate=0.1, strategy=Identity(7)), "steps"),  # 20 steps: the strategy must match
])
def test_mistakes(kw, needle):
    with pytest.raises(InvalidParameterError, match=needle):
        run(noise_multiplier=1.0, **kw)


def _train(opt, batches):
    for x, y in batches:
        opt.zero_grad()
        opt.step(x, y)


def test_by_epoch_cuts_the_one_pass_and_resumes_mid_epoch(tmp_path):
    scheme = dict(strategy=Identity(12), sampling=BallsInBinsSampling(3, 12), noise_multiplier=1.0)
    _, opt, loader, privacy = run(**scheme)
    epochs = []
    for epoch, batches in privacy.by_epoch(loader):
        sizes = []
        for x, y in batches:
            sizes.append(len(x))
            _train(opt, [(x, y)])
        epochs.append((epoch, len(sizes), sum(sizes), privacy.epoch_of(privacy.steps_done - 1)))
    # balls-in-bins: every example once per epoch of 4 steps
    assert epochs == [(0, 4, N, 0), (1, 4, N, 1), (2, 4, N, 2)]

    _, opt, loader, privacy = run(**scheme)
    _train(opt, (b for _, b in zip(range(6), loader)))  # stop after 6 steps: inside epoch 1
    privacy.save_checkpoint(tmp_path / "ckpt.pt")
    _, opt2, loader2, resumed = run(**scheme)
    resumed.load_checkpoint(tmp_path / "ckpt.pt")
    left = []
    for epoch, batches in resumed.by_epoch(loader2):
        before = resumed.steps_done
        _train(opt2, batches)
        left.append((epoch, resumed.steps_done - before))
    assert left == [(1, 2), (2, 4)] and resumed.steps_done == 12
    with pytest.raises(InvalidParameterError, match="data loader make_private returned"):
        next(privacy.by_epoch(loader2))
