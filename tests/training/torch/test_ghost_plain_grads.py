"""Asking autograd for the gradients of parameters that ghost mode detaches in the loop (issue 51).

Layers with built-in rules run on detached copies of their parameters inside the model's forward, so
``torch.autograd.grad(loss, model.parameters())`` used to fail with torch's "appears to not have been
used in the graph" (and ``allow_unused=True`` gave ``None`` for them, or a tied parameter's direct
read alone). :mod:`dpmf.training.torch.ghost.detached` links those layers' outputs to the parameters,
so the request is refused by a dpmf error naming ``clipper.plain()``; ``loss.backward()``, its numbers
and gradients with respect to anything else are unchanged.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from dpmf.errors import UnsupportedConfigurationError  # noqa: E402
from dpmf.sampling import PoissonSampling  # noqa: E402
from dpmf.strategies import Identity  # noqa: E402
from dpmf.training.torch import make_private  # noqa: E402
from dpmf.training.torch.ghost import GhostClipper  # noqa: E402

CE = torch.nn.functional.cross_entropy


class Tied(torch.nn.Module):
    """An embedding whose weight the output layer reads directly (h @ W^T), with a Linear between."""

    def __init__(self, V=7, d=5):
        super().__init__()
        self.embed, self.mid = torch.nn.Embedding(V, d), torch.nn.Linear(d, d)

    def forward(self, ids):
        h = torch.tanh(self.mid(self.embed(ids)))
        return (h @ self.embed.weight.t()).mean(1)


def _private(model, X, Y):
    return make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.utils.data.TensorDataset(X, Y),
                        strategy=Identity(4), sampling=PoissonSampling(0.25, 4), noise_multiplier=1.0, delta=1e-5,
                        max_grad_norm=1.0, seed=0, accountant="unamplified", grad_sample_mode="ghost")


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)), \
        torch.randn(32, 3), torch.randint(0, 2, (32,))


@pytest.mark.parametrize("ask", [
    lambda loss, ps: torch.autograd.grad(loss, ps),
    lambda loss, ps: torch.autograd.grad(loss, ps, allow_unused=True),  # was: None for the detached ones
    lambda loss, ps: torch.autograd.grad(loss, ps[:1]),  # the first layer's weight alone
    lambda loss, ps: loss.backward(inputs=ps[-1:]),
], ids=["grad", "allow_unused", "first-weight", "backward-inputs"])
def test_autograd_on_detached_parameters_is_one_dpmf_error_naming_plain(ask):
    model, X, Y = _mlp()
    run = _private(model, X, Y)
    with pytest.raises(UnsupportedConfigurationError, match=r"detached copies .*\('0', '2'\).*clipper\.plain\(\)"):
        ask(CE(model(X[:4]), Y[:4]), list(model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    assert not run.optimizer.clipper.pending()  # the refused backward's captures dropped


def test_a_tied_weight_read_directly_is_refused_not_given_in_part():
    """With allow_unused=True torch gave the direct read's part of the embedding's gradient alone."""
    torch.manual_seed(0)
    ids, Y = torch.randint(0, 7, (32, 3)), torch.randint(0, 7, (32,))
    model = Tied()
    _private(model, ids, Y)
    with pytest.raises(UnsupportedConfigurationError, match="clipper.plain"):
        torch.autograd.grad(CE(model(ids[:4]), Y[:4]), [model.embed.weight], allow_unused=True)


def test_gradients_with_respect_to_the_input_are_unchanged():
    model, X, Y = _mlp()
    twin = copy.deepcopy(model)
    _private(model, X, Y)
    x, t = X[:4].clone().requires_grad_(), X[:4].clone().requires_grad_()
    (got,) = torch.autograd.grad(CE(model(x), Y[:4]), [x])
    (want,) = torch.autograd.grad(CE(twin(t), Y[:4]), [t])
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _train(model, X, Y, refuse_first: bool):
    run = _private(model, X, Y)
    opt = run.optimizer
    for k, (x, y) in enumerate(run.data_loader):
        opt.zero_grad()
        if refuse_first and k == 0:
            with pytest.raises(UnsupportedConfigurationError):
                torch.autograd.grad(CE(model(x), y), list(model.parameters()))
        CE(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_the_loop_after_a_refusal_trains_the_same_run():
    """The refusal leaves nothing behind: the same run bit for bit, first step included."""
    model, X, Y = _mlp()
    twin = copy.deepcopy(model)
    for a, b in zip(_train(model, X, Y, True), _train(twin, X, Y, False)):
        assert torch.equal(a, b)


def test_the_loop_form_equals_clipped_sum_on_the_parameters():
    """The link changes no number: the loop's norms and clipped sums (detached layers, linked outputs,
    an input needing no gradient) equal clipped_sum's, which differentiates the parameters themselves."""
    model, X, Y = _mlp()
    loss = lambda out, y: CE(out, y)  # noqa: E731
    ghost = GhostClipper(model, loss, max_grad_norm=0.5)
    try:
        want = ghost.clipped_sum(X[:8], Y[:8])
        loss(model(X[:8]), Y[:8]).backward()
        sums, norms, backwards = ghost.collect()
    finally:
        ghost.close()
    assert backwards == 1 and all(p.grad is None for p in model.parameters())
    assert torch.equal(norms, want.norms)
    for a, b in zip(sums, want.grads):
        assert torch.equal(a, b)


def test_hooks_on_detached_parameters_see_no_gradient():
    """What the link costs a hook on such a parameter: called with None in the loop's backward (no
    gradient formed there), where it was not called at all before."""
    model, X, Y = _mlp()
    _private(model, X, Y)
    seen = []
    model[0].weight.register_hook(lambda g: seen.append(g))
    CE(model(X[:4]), Y[:4]).backward()
    assert seen == [None] and model[0].weight.grad is None


def test_a_private_model_can_be_deep_copied_after_a_step():
    """The refusal's guard keeps no autograd node (they cannot be copied): ``copy.deepcopy`` of a model
    wrapped by make_private works after a training step, as users do for EMA or evaluation copies."""
    model, X, Y = _mlp()
    run = _private(model, X, Y)
    run.optimizer.zero_grad()
    CE(model(X[:4]), Y[:4]).backward()
    run.optimizer.step()
    copied = copy.deepcopy(model)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), copied.parameters()))
    # and the refusal still works on the original after the copy
    with pytest.raises(UnsupportedConfigurationError, match=r"clipper\.plain\(\)"):
        torch.autograd.grad(CE(model(X[:4]), Y[:4]), list(model.parameters()))
