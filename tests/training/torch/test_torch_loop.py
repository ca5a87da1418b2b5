"""The loop users already have (``loss.backward(); optimizer.step()``) in ghost mode, any inputs,
the batch contract, resume, and the clip bound for the computed numbers under adversarial inputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError  # noqa: E402
from dpmf.sampling import BallsInBinsSampling, PoissonSampling  # noqa: E402
from dpmf.strategies import Identity, bsr  # noqa: E402
from dpmf.training.torch import make_private  # noqa: E402
from dpmf.training.torch.ghost import GhostClipper  # noqa: E402
from dpmf.training.torch.ghost import sequence  # noqa: E402

F = torch.nn.functional
M, D, K = 40, 5, 3


def _data(m=M):
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(m, D, generator=g), torch.randint(0, K, (m,), generator=g))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D, 8), torch.nn.Tanh(), torch.nn.Linear(8, K))


def _run(loop: bool, strategy=None, scheme=None, model=None, data=None, **kw):
    model = model or _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    return make_private(model, opt, data or _data(), strategy=strategy or bsr(6, 2),
                        sampling=scheme or BallsInBinsSampling(2, 6), noise_multiplier=1.0, delta=1e-5,
                        max_grad_norm=0.5, loss_fn=None if loop else F.cross_entropy, grad_sample_mode="ghost",
                        accountant="unamplified", seed=3, **kw)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_opacus_loop_is_bit_identical_to_step_with_the_batch(reduction):
    a, b = _run(False, loss_reduction=reduction), _run(True, loss_reduction=reduction)
    a.optimizer.clipper.loss_fn = lambda out, y: F.cross_entropy(out, y, reduction=reduction)
    for x, y in a.data_loader:
        a.optimizer.zero_grad()
        a.optimizer.step(x, y)
    for x, y in b.data_loader:
        b.optimizer.zero_grad()
        loss = F.cross_entropy(b.module(x), y, reduction=reduction)
        loss.backward()
        b.optimizer.step()
    assert b.privacy.steps_done == 6
    for p, q in zip(a.module.parameters(), b.module.parameters()):
        assert torch.equal(p, q)


def test_loop_equals_functorch_mode():
    a = _run(False)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    f = make_private(model, opt, _data(), strategy=bsr(6, 2), sampling=BallsInBinsSampling(2, 6),
                     noise_multiplier=1.0, delta=1e-5, max_grad_norm=0.5, loss_fn=F.cross_entropy,
                     accountant="unamplified", seed=3)
    assert f.optimizer.clipper.mode == "functorch"
    for (xa, ya), (xf, yf) in zip(a.data_loader, f.data_loader):
        a.optimizer.step(xa, ya)
        f.optimizer.step(xf, yf)
    for p, q in zip(a.module.parameters(), f.module.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_micro_batches_in_the_loop_equal_one_batch():
    a, b = _run(True), _run(True)
    for (xa, ya), (xb, yb) in zip(a.data_loader, b.data_loader):
        a.optimizer.zero_grad()
        F.cross_entropy(a.module(xa), ya).backward()
        a.optimizer.step()
        b.optimizer.zero_grad()
        for lo in range(0, len(xb), 3):
            F.cross_entropy(b.module(xb[lo : lo + 3]), yb[lo : lo + 3]).backward()
        b.optimizer.step()
    for p, q in zip(a.module.parameters(), b.module.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


class DictModel(torch.nn.Module):
    """Hugging Face shape: keyword inputs, returns an object with ``.loss`` (per-sequence mean over
    the non-padded tokens, then the mean over the batch)."""

    def __init__(self, vocab=13, d=8):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d, padding_idx=0)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, input_ids, attention_mask, labels=None):
        logits = self.head(self.norm(self.emb(input_ids)))
        out = type("Output", (), {})()
        out.logits = logits
        if labels is not None:
            tok = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
            mask = attention_mask.to(tok.dtype)
            out.loss = ((tok * mask).sum(1) / mask.sum(1).clamp_min(1)).mean()
        return out


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n=30, T=6):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(1, 13, (n, T), generator=g)
        self.mask = torch.ones(n, T, dtype=torch.long)
        for i in range(0, n, 3):
            self.ids[i, T // 2 :] = 0
            self.mask[i, T // 2 :] = 0

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.ids[i]}


def test_dict_inputs_and_a_model_returning_its_loss():
    torch.manual_seed(0)
    model = DictModel()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    run = make_private(model, opt, TokenDataset(), strategy=Identity(5), sampling=PoissonSampling(0.2, 5),
                       noise_multiplier=0.5, delta=1e-5, max_grad_norm=1.0, seed=0, accountant="pld")
    for batch in run.data_loader:
        run.optimizer.zero_grad()
        run.module(**batch).loss.backward()
        run.optimizer.step()
    assert run.privacy.steps_done == 5
    assert any(not torch.equal(p, q) for p, q in zip(before, model.parameters()))
    # step(batch) with the model's own loss (loss_fn=None) gives the same clipped sum as the loop
    batch = TokenDataset()[slice(0, 4)]
    ghost = run.optimizer.clipper
    direct = ghost.clipped_sum(batch)
    model(**batch).loss.backward()
    sums, norms, backwards = ghost.collect()
    assert backwards == 1 and torch.equal(norms, direct.norms)
    for s, t in zip(sums, direct.grads):
        assert torch.equal(s, t)


def test_empty_poisson_batches_step():
    run = _run(True, strategy=Identity(8), scheme=PoissonSampling(0.02, 8), data=_data(10), normalizer=1.0)
    sizes = []
    for x, y in run.data_loader:
        sizes.append(len(x))
        run.optimizer.zero_grad()
        if len(x):
            F.cross_entropy(run.module(x), y).backward()
        run.optimizer.step()  # an empty batch: noise only
    assert 0 in sizes and run.privacy.steps_done == 8


# ---------------------------------------------------------------------------- the batch contract
def test_wrong_batches_are_refused():
    run = _run(True, strategy=Identity(6), scheme=PoissonSampling(0.5, 6))
    it = iter(run.data_loader)
    x, y = next(it)
    with pytest.raises(InvalidParameterError, match="without a backward|clipped 0 examples"):
        run.optimizer.step()  # no backward
    F.cross_entropy(run.module(x[:-1]), y[:-1]).backward()  # another size
    with pytest.raises(InvalidParameterError, match="batch for this step"):
        run.optimizer.step()
    run.optimizer.zero_grad()
    F.cross_entropy(run.module(x), y).backward()
    F.cross_entropy(run.module(x), y).backward()  # the batch twice, no zero_grad
    with pytest.raises(InvalidParameterError, match="batch for this step"):
        run.optimizer.step()
    run.optimizer.zero_grad()
    F.cross_entropy(run.module(x), y).backward()
    run.optimizer.step()  # the right one
    next(it)
    x3, y3 = next(it)  # a skipped batch
    F.cross_entropy(run.module(x3), y3).backward()
    with pytest.raises(InvalidParameterError, match="skipped"):
        run.optimizer.step()


def test_forward_without_backward_and_second_backward_refused():
    run = _run(True)
    x, y = next(iter(run.data_loader))
    run.module(x)
    with pytest.raises(InvalidParameterError, match="without its backward"):
        run.optimizer.step()
    run.optimizer.zero_grad()
    loss = F.cross_entropy(run.module(x), y)
    loss.backward(retain_graph=True)
    with pytest.raises(UnsupportedConfigurationError, match="second backward"):
        loss.backward()


def test_evaluation_forward_with_grad_enabled_is_dropped():
    run = _run(True)
    x, y = next(iter(run.data_loader))
    run.module(torch.randn(3, D))  # e.g. an evaluation without torch.no_grad(): never backpropagated
    F.cross_entropy(run.module(x), y).backward()
    run.optimizer.step()
    assert run.privacy.steps_done == 1


def test_resume_in_the_loop_is_bit_for_bit(tmp_path):
    def train(run, it, steps):
        for _ in range(steps):
            x, y = next(it)
            run.optimizer.zero_grad()
            F.cross_entropy(run.module(x), y).backward()
            run.optimizer.step()

    a = _run(True)
    it = iter(a.data_loader)
    train(a, it, 3)
    a.privacy.save_checkpoint(tmp_path / "c.pt")
    train(a, it, 3)
    b = _run(True)
    b.privacy.load_checkpoint(tmp_path / "c.pt")
    train(b, iter(b.data_loader), 3)
    for p, q in zip(a.module.parameters(), b.module.parameters()):
        assert torch.equal(p, q)


def test_report_says_the_mode():
    run = _run(True)
    assert run.privacy.report().diagnostics["training"]["grad_sample_mode"] == "ghost"


def test_loss_fn_none_needs_ghost():
    with pytest.raises(InvalidParameterError, match="ghost"):
        make_private(_model(), torch.optim.SGD(_model().parameters(), lr=0.1), _data(), strategy=Identity(6),
                     sampling=PoissonSampling(0.5, 6), noise_multiplier=1.0, delta=1e-5, max_grad_norm=1.0,
                     grad_sample_mode="functorch", seed=0)


# ---------------------------------------------------------------------------- the clip bound
def _contribution_norms(model, inputs, targets, loss_fn, clip):
    """Each example alone: the float64 norm of its clipped contribution (the clipped sum of a batch of 1)."""
    g = GhostClipper(model, loss_fn, clip)
    out = []
    for i in range(targets.shape[0]):
        got = g.clipped_sum(inputs[i : i + 1], targets[i : i + 1])
        out.append(float(torch.sqrt(sum((s.double() ** 2).sum() for s in got.grads))))
    g.close()
    return out


def test_clip_bound_with_huge_activations():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    x = torch.randn(6, 16) * 1e15
    for n in _contribution_norms(model, x, torch.randint(0, 4, (6,)), F.cross_entropy, 0.1):
        assert n <= 0.1


@pytest.mark.parametrize("plan", ["gram", "keep", "materialize"])
def test_clip_bound_with_near_cancelling_sequences(plan, monkeypatch):
    """Equal input rows, output gradients that cancel up to a tiny remainder: the float32 Gram value is
    garbage, the exact norm tiny; the bound still holds, and the reported norm bounds the float64 one
    (each way to the norms: ``sequence.norm_plan``)."""
    monkeypatch.setattr(sequence, "norm_plan", lambda *args, **kw: plan)
    T, d = 64, 64
    lin = torch.nn.Linear(d, d, bias=False)
    a = torch.randn(1, 1, d).expand(3, T, d).contiguous() * 100
    signs = torch.ones(T)
    signs[1::2] = -1.0
    w = torch.randn(d)

    def loss_fn(out, target):  # sum_t s_t (1 + target eps_t) <w, out_t>: near cancellation over t
        scale = signs * (1 + 1e-6 * target[:, :1])
        return (out @ w * scale).sum()

    targets = torch.randn(3, T)
    g = GhostClipper(lin, loss_fn, 1e-3, loss_reduction="sum")
    got = g.clipped_sum(a, targets)
    lin64 = torch.nn.Linear(d, d, bias=False).double()
    lin64.weight.data = lin.weight.data.double()
    exact = []
    for i in range(3):
        out = lin64(a[i : i + 1].double())
        loss = (out @ w.double() * (signs.double() * (1 + 1e-6 * targets[i, :1].double()))).sum()
        (gr,) = torch.autograd.grad(loss, lin64.weight)
        exact.append(float(gr.norm()))
    assert all(float(n) >= e for n, e in zip(got.norms, exact))
    for n in _contribution_norms(lin, a, targets, loss_fn, 1e-3):
        assert n <= 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_clip_bound_under_autocast(dtype):
    model = torch.nn.Sequential(torch.nn.Embedding(50, 32), torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.LayerNorm(64), torch.nn.Linear(64, 50))
    ids = torch.randint(0, 50, (4, 24))

    def loss_fn(out, y):
        return F.cross_entropy(out.float().transpose(1, 2), y)

    with torch.autocast("cpu", dtype=dtype):
        norms = _contribution_norms(model, ids, ids, loss_fn, 0.05)
    assert all(n <= 0.05 for n in norms)
    g = GhostClipper(model, loss_fn, 0.05)
    with torch.autocast("cpu", dtype=dtype):
        got = g.clipped_sum(ids, ids)
    assert all(s.dtype == torch.float32 and torch.isfinite(s).all() for s in got.grads)


@pytest.mark.parametrize("scheme", [PoissonSampling(0.01, 6), BallsInBinsSampling(1, 6)])
def test_expected_batch_below_one_example_is_refused_before_training(scheme):
    with pytest.raises(InvalidParameterError, match="expected batch size"):
        make_private(_model(), torch.optim.SGD(_model().parameters(), lr=0.1), _data(5), strategy=Identity(6),
                     sampling=scheme, noise_multiplier=1.0, delta=1e-5, max_grad_norm=1.0, seed=0,
                     accountant="unamplified")


def test_non_finite_data_raises_by_default_and_is_counted_when_skipped():
    data = _data()
    data.tensors[0][::4, 0] = float("nan")  # a quarter of the examples
    run = _run(True, data=data)
    x, y = next(iter(run.data_loader))
    from dpmf.errors import NumericalError

    with pytest.raises(NumericalError, match="non-finite"):
        F.cross_entropy(run.module(x), y).backward()
    run = _run(True, data=data, nonfinite="skip")
    for x, y in run.data_loader:
        run.optimizer.zero_grad()
        F.cross_entropy(run.module(x), y).backward()
        run.optimizer.step()
    skipped = run.privacy.report().diagnostics["training"]["nonfinite_examples_skipped"]
    assert skipped == 2 * 10  # 10 bad examples, each once per epoch, 2 epochs
    assert all(torch.isfinite(p).all() for p in run.module.parameters())


# ---------------------------------------------------------------------------- misuse gets a DPMFError
@pytest.mark.parametrize("seed", ["abc", 1.5, -1, True])
def test_bad_seed(seed):
    with pytest.raises(InvalidParameterError, match="seed"):
        make_private(_model(), torch.optim.SGD(_model().parameters(), lr=0.1), _data(), strategy=Identity(6),
                     sampling=PoissonSampling(0.5, 6), noise_multiplier=1.0, delta=1e-5, max_grad_norm=1.0,
                     seed=seed, accountant="unamplified")


@pytest.mark.parametrize("mode", ["functorch", "ghost"])
def test_loss_with_reduction_none_is_refused(mode):
    model = _model()
    run = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), _data(), strategy=Identity(6),
                       sampling=PoissonSampling(0.5, 6), noise_multiplier=1.0, delta=1e-5, max_grad_norm=1.0,
                       loss_fn=lambda o, y: F.cross_entropy(o, y, reduction="none"), grad_sample_mode=mode,
                       seed=0, accountant="unamplified")
    x, y = next(iter(run.data_loader))
    with pytest.raises(InvalidParameterError, match="reduction='none'"):
        run.optimizer.step(x, y)


def test_checkpoint_unwritable_other_architecture_and_non_finite(tmp_path):
    run = _run(True)
    with pytest.raises(InvalidParameterError, match="cannot write"):
        run.privacy.save_checkpoint("/proc/dpmf-checkpoint.pt")  # /proc takes no new files
    run.privacy.save_checkpoint(tmp_path / "c.pt")
    other = torch.nn.Sequential(torch.nn.Linear(D, 8), torch.nn.Tanh(), torch.nn.Linear(8, K), torch.nn.Identity())
    wrapped = torch.nn.Sequential(other)  # same parameters, other keys
    run2 = _run(True, model=wrapped)
    with pytest.raises(InvalidParameterError, match="another architecture"):
        run2.privacy.load_checkpoint(tmp_path / "c.pt")
    state = torch.load(tmp_path / "c.pt", weights_only=True)
    state["model"]["0.weight"][0, 0] = float("nan")
    with pytest.raises(InvalidParameterError, match="NaN or inf"):
        run.privacy.load_state_dict(state)


def test_no_step_leaves_its_tensors_alive():
    """A finished layer call must let its tensors go: the output's tensor hook holds the call, so a
    call holding the output would be a cycle through autograd's C++ storage, invisible to the garbage
    collector (it leaked every step's activations)."""
    import gc
    import weakref

    run = _run(True)
    refs = []
    for x, y in run.data_loader:
        run.optimizer.zero_grad()
        out = run.module(x)
        refs.append(weakref.ref(out))
        F.cross_entropy(out, y).backward()
        run.optimizer.step()
        del out
    gc.collect()
    assert all(r() is None for r in refs)


@pytest.mark.parametrize("loop", [True, False], ids=["loop", "step(x, y)"])
def test_a_peek_at_the_loader_is_refused_saying_why_and_what_to_do(loop):
    """Issue 44: ``next(iter(loader))`` before the loop consumed step 0's batch; the first step then
    refuses (before any noise or update) and says the loader is one pass over every epoch."""
    run = _run(loop, scheme=PoissonSampling(0.3, 6), strategy=bsr(6, 2))
    next(iter(run.data_loader))  # the peek
    before = [p.detach().clone() for p in run.module.parameters()]
    x, y = next(iter(run.data_loader))
    run.optimizer.zero_grad()
    with pytest.raises(InvalidParameterError, match=r"at step 1 but the optimizer at step 0: 1 batch was skipped \(taken .*"
                       r"next\(iter\(loader\)\).* one pass over all the plan's steps \(every epoch\).*make_private"):
        if loop:
            F.cross_entropy(run.module(x), y).backward()
            run.optimizer.step()
        else:
            run.optimizer.step(x, y)
    assert run.privacy.steps_done == 0
    assert all(torch.equal(a, b) for a, b in zip(before, run.module.parameters()))  # nothing was stepped
