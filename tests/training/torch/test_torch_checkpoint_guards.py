"""Issue 24 item 6: a checkpoint catches the accidents it can -- an edited plan description, step
counters changed after saving (rewound past what the noise stream produced), damaged noise state --
and never refuses a checkpoint as saved (every strategy kind, through a file)."""

from __future__ import annotations

import copy
from itertools import islice

import pytest

torch = pytest.importorskip("torch")

from dpmf.errors import InvalidParameterError  # noqa: E402
from dpmf.sampling import BallsInBinsSampling, PoissonSampling  # noqa: E402
from dpmf.strategies import BLT, BinaryTree, DenseStrategy, FFTMechanism, Identity, bsr  # noqa: E402
from dpmf.training.run_spec import description_fingerprint  # noqa: E402
from dpmf.training.torch import make_private  # noqa: E402

F = torch.nn.functional
M, D, K, N = 48, 5, 3, 6


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(M, D, generator=g), torch.randint(0, K, (M,), generator=g))


def _run(strategy=None, scheme=None, steps=0):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D, 8), torch.nn.Tanh(), torch.nn.Linear(8, K))
    run = make_private(model, torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9), _data(),
                       strategy=strategy or bsr(N, 2), sampling=scheme or BallsInBinsSampling(2, N),
                       noise_multiplier=1.0, delta=1e-5, max_grad_norm=0.5, loss_fn=F.cross_entropy,
                       accountant="unamplified", seed=3)
    _train(run, steps)
    return run


def _train(run, steps):
    for x, y in islice(run.data_loader, steps):  # draws exactly `steps` batches
        run.optimizer.zero_grad()
        run.optimizer.step(x, y)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint after 4 of 6 steps, and one of the same run after 2."""
    folder = tmp_path_factory.mktemp("ckpt")
    run = _run(steps=2)
    run.privacy.save_checkpoint(folder / "at2.pt")
    _train(run, 2)
    assert run.privacy.steps_done == 4
    run.privacy.save_checkpoint(folder / "at4.pt")
    return folder


def _load(path):
    return torch.load(path, weights_only=True)


def _refused(state, match):
    fresh = _run()
    with pytest.raises(InvalidParameterError, match=match):
        fresh.privacy.load_state_dict(state)
    assert fresh.privacy.steps_done == 0 and fresh.optimizer.noise.steps_done == 0  # nothing was loaded


# ----------------------------------------------------------------------- no false refusal
@pytest.mark.parametrize("strategy,scheme", [
    (Identity(N), PoissonSampling(0.3, N)),
    (bsr(N, 2), BallsInBinsSampling(2, N)),
    (BLT([0.9, 0.4], [0.3, 0.2]).to_toeplitz(N), BallsInBinsSampling(1, N)),
    (BinaryTree(8), PoissonSampling(0.3, 8)),
    (DenseStrategy(torch.tril(torch.ones(N, N)).double().numpy() + torch.eye(N).double().numpy()),
     PoissonSampling(0.3, N)),
    (FFTMechanism(N), PoissonSampling(0.3, N)),
])
def test_a_checkpoint_as_saved_is_accepted_for_every_strategy_kind(tmp_path, strategy, scheme):
    run = _run(strategy, scheme, steps=3)
    run.privacy.save_checkpoint(tmp_path / "c.pt")
    state = _load(tmp_path / "c.pt")
    assert description_fingerprint(state["plan"]) == state["plan_fingerprint"] == run.privacy.run_spec.fingerprint()
    fresh = _run(strategy, scheme)
    fresh.privacy.load_checkpoint(tmp_path / "c.pt")
    assert fresh.privacy.steps_done == fresh.optimizer.noise.steps_done == 3


def test_an_older_checkpoint_of_the_same_run_is_accepted(saved):
    fresh = _run()
    fresh.privacy.load_checkpoint(saved / "at2.pt")
    assert fresh.privacy.steps_done == 2


# ----------------------------------------------------------------------- (a) edited description
@pytest.mark.parametrize("key,value", [
    ("noise_multiplier", 2.0), ("delta", 1e-6), ("num_examples", M + 1),
    ("max_grad_norm", 1.0), ("normalizer", 1.0), ("strategy", {"name": "identity", "n": N}),
])
def test_a_plan_description_edited_after_saving_is_refused(saved, key, value):
    state = _load(saved / "at4.pt")
    state["plan"][key] = value
    _refused(state, "plan description does not match its plan_fingerprint")


def test_an_edited_claim_is_rechecked_not_hashed(saved):
    """Issue 51 item 5: the fingerprint holds the run's inputs, not the accountant's epsilon; an
    epsilon claim lowered after saving is refused by recomputation, a method label changed with
    the claim still holding is only a label."""
    state = _load(saved / "at4.pt")
    state["plan"]["epsilon"] = 0.5
    _refused(state, r"the checkpoint claims epsilon 0.5 \(unamplified\) for this run, but the accountant gives "
                    r".*: the claim no longer holds")
    state = _load(saved / "at4.pt")
    state["plan"]["method"] = "pld"
    fresh = _run()
    fresh.privacy.load_state_dict(state)
    assert fresh.privacy.steps_done == 4


def test_checkpoint_written_before_issue_51_resumes():
    """A checkpoint written by main at 5518073 (tests/training/data/make_old_checkpoints.py): its
    fingerprint hashes the whole description, the accountant's epsilon of that machine included."""
    import sys
    from pathlib import Path

    from dpmf.training.run_spec import legacy_description_fingerprint

    data = Path(__file__).parent.parent / "data"
    sys.path.insert(0, str(data))
    try:
        from make_old_checkpoints import torch_run
    finally:
        sys.path.remove(str(data))
    state = _load(data / "checkpoint_5518073.pt")
    assert state["plan_fingerprint"] == legacy_description_fingerprint(state["plan"]) == "4962d7fefb245d99"
    run = torch_run()
    assert run.privacy.run_spec.fingerprint() != state["plan_fingerprint"]
    run.privacy.load_checkpoint(data / "checkpoint_5518073.pt")
    assert run.privacy.steps_done == run.optimizer.noise.steps_done == 3
    _train(run, 3)  # and it runs to the end of its plan
    assert run.privacy.steps_done == 6


def test_an_edited_fingerprint_or_a_description_that_is_not_a_dict_is_refused(saved):
    state = _load(saved / "at4.pt")
    state["plan_fingerprint"] = "0" * 16
    _refused(state, "does not match its plan_fingerprint")
    state = _load(saved / "at4.pt")
    state["plan"] = "bsr"
    _refused(state, "does not match its plan_fingerprint")


def test_a_description_edited_consistently_is_another_plan(saved):
    state = _load(saved / "at4.pt")
    state["plan"]["noise_multiplier"] = 2.0
    state["plan_fingerprint"] = description_fingerprint(state["plan"])
    _refused(state, "another training plan .*noise_multiplier: 2.0 in the checkpoint, 1.0 here")


# ----------------------------------------------------------------------- (b) rewound counters
@pytest.mark.parametrize("steps", [0, 2, 3, 5])
def test_counters_changed_consistently_after_saving_are_refused(saved, steps):
    """All three counters set to another step while the noise generator and recurrence are step 4's."""
    state = _load(saved / "at4.pt")
    state["steps_done"] = state["noise"]["steps_done"] = state["sampler"]["steps_done"] = steps
    _refused(state, r"noise state \(steps_done=%d\) does not match the digest" % steps)


@pytest.mark.parametrize("which", ["run", "sampler", "noise"])
def test_one_counter_changed_is_an_inconsistent_checkpoint(saved, which):
    state = _load(saved / "at4.pt")
    if which == "run":
        state["steps_done"] = 2
    else:
        state[which]["steps_done"] = 2
    _refused(state, "inconsistent checkpoint: steps_done=.*noise state is at step .* sampler at step")


def test_an_earlier_checkpoint_spliced_with_later_noise_is_refused(saved):
    early, late = _load(saved / "at2.pt"), _load(saved / "at4.pt")
    spliced = copy.deepcopy(early)
    spliced["noise"]["generator_state"] = late["noise"]["generator_state"]  # the generator is step 4's
    _refused(spliced, "does not match the digest")
    spliced = copy.deepcopy(early)
    spliced["noise"]["recurrence"] = late["noise"]["recurrence"]
    _refused(spliced, "does not match the digest")


def test_a_rewound_checkpoint_file_is_refused_by_load_checkpoint(saved, tmp_path):
    state = _load(saved / "at4.pt")
    state["steps_done"] = state["noise"]["steps_done"] = state["sampler"]["steps_done"] = 1
    torch.save(state, tmp_path / "rewound.pt")
    fresh = _run()
    with pytest.raises(InvalidParameterError, match="rewound") as info:
        fresh.privacy.load_checkpoint(tmp_path / "rewound.pt")
    assert "\n" not in str(info.value)


def test_the_noise_state_digest_is_checked_by_the_noise_generator_itself():
    run = _run(steps=3)
    noise = run.optimizer.noise
    state = noise.state_dict()
    other = _run().optimizer.noise
    other.load_state_dict(state)  # as saved: fine
    assert other.steps_done == 3
    for key, value in [("steps_done", 1), ("seed", 12345), ("digest", "0" * 32)]:
        edited = {**state, key: value}
        fresh = _run().optimizer.noise
        with pytest.raises(InvalidParameterError, match="does not match the digest"):
            fresh.load_state_dict(edited)
        assert fresh.steps_done == 0
    with pytest.raises(InvalidParameterError, match="missing"):
        _run().optimizer.noise.load_state_dict({k: v for k, v in state.items() if k != "digest"})


# ----------------------------------------------------------------------- issue 44: another optimizer
def _run_with(make_optimizer, steps=0):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D, 8), torch.nn.Tanh(), torch.nn.Linear(8, K))
    run = make_private(model, make_optimizer(model.parameters()), _data(), strategy=bsr(N, 2),
                       sampling=BallsInBinsSampling(2, N), noise_multiplier=1.0, delta=1e-5, max_grad_norm=0.5,
                       loss_fn=F.cross_entropy, accountant="unamplified", seed=3)
    _train(run, steps)
    return run


def test_a_checkpoint_of_sgd_resumed_with_adam_is_refused_naming_both(saved, tmp_path):
    state = _load(saved / "at2.pt")
    assert state["optimizer_class"] == "torch.optim.sgd.SGD" and "momentum" in state["optimizer_hyperparameters"]
    adam = _run_with(lambda p: torch.optim.Adam(p, lr=0.01))
    with pytest.raises(InvalidParameterError, match=r"saved with the optimizer SGD .* this run uses Adam .*betas"):
        adam.privacy.load_checkpoint(saved / "at2.pt")
    assert adam.privacy.steps_done == 0 and adam.optimizer.noise.steps_done == 0  # nothing was loaded
    _train(adam, 1)  # and the run still trains from its own start
    # a checkpoint from before the class was recorded: told by the hyper-parameter names
    del state["optimizer_class"], state["optimizer_hyperparameters"]
    fresh = _run_with(lambda p: torch.optim.Adam(p, lr=0.01))
    with pytest.raises(InvalidParameterError, match=r"has no hyper-parameters? .*betas.* that this run's Adam reads"):
        fresh.privacy.load_state_dict(state)
    # the other way round: Adam's checkpoint into SGD
    adam_ckpt = _run_with(lambda p: torch.optim.Adam(p, lr=0.01), steps=1)
    adam_ckpt.privacy.save_checkpoint(tmp_path / "adam.pt")
    with pytest.raises(InvalidParameterError, match=r"saved with the optimizer Adam .* this run uses SGD"):
        _run().privacy.load_checkpoint(tmp_path / "adam.pt")
    # the same optimizer class resumes, with other hyper-parameter values (they are the checkpoint's)
    same = _run_with(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5))
    same.privacy.load_checkpoint(saved / "at2.pt")
    assert same.privacy.steps_done == 2 and same.optimizer.param_groups[0]["momentum"] == 0.9
