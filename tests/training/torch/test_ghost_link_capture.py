"""Output gradients of detached layers captured by their link node's backward (issue 52 item 3).

A detached layer's output passes through :class:`dpmf.training.torch.ghost.detached._Link`; the clipper
hands that node the capture (``capture_grad``) instead of registering a tensor hook on the output. The
node receives what the hook did: the gradient with respect to the layer's output, uses summed, taken
before any later in-place change of the output. Norms and clipped sums are bitwise those of the hook path.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpmf.training.torch.ghost import clipper as clipper_module  # noqa: E402
from dpmf.training.torch.ghost import detached  # noqa: E402

from ghost_reference import check, ghost_step  # noqa: E402


class InPlace(torch.nn.Module):
    """Linear outputs changed in place after the layer (``mul_``, a residual ``+=``) and read twice."""

    def __init__(self, d=6, k=3):
        super().__init__()
        self.a, self.b, self.out = torch.nn.Linear(d, d), torch.nn.Linear(d, d), torch.nn.Linear(d, k)

    def forward(self, x):
        h = self.a(x)
        h.mul_(1.5)
        g = self.b(torch.tanh(h))
        g += h
        return self.out(torch.tanh(g) * g)


def _data(batch=12):
    torch.manual_seed(0)
    return InPlace().double(), {"x": torch.randn(batch, 6, dtype=torch.float64)}, torch.randint(0, 3, (batch,))


def _loss(Y):
    def loss(out, i):
        return torch.nn.functional.cross_entropy(out, Y if i is None else Y[i:i + 1])
    return loss


def test_in_place_changed_outputs_match_the_per_example_reference(monkeypatch):
    model, inputs, Y = _data()
    taken = []
    real = clipper_module.capture_grad
    monkeypatch.setattr(clipper_module, "capture_grad", lambda t, sink: taken.append(real(t, sink)) or taken[-1])
    check(model, inputs, _loss(Y), 12)
    assert taken and all(taken)  # every detached layer's output went through its link node


def test_link_capture_is_bitwise_the_tensor_hook_path(monkeypatch):
    model, inputs, Y = _data()
    _, sums, norms = ghost_step(model, inputs, _loss(Y), 0.5)
    monkeypatch.setattr(clipper_module, "capture_grad", lambda t, sink: False)  # the hook on every output
    _, hook_sums, hook_norms = ghost_step(model, inputs, _loss(Y), 0.5)
    assert torch.equal(norms, hook_norms)
    assert all(torch.equal(s, h) for s, h in zip(sums, hook_sums))


def test_capture_grad_takes_only_a_link_output_once():
    x, token = torch.randn(3, requires_grad=True), torch.zeros((), requires_grad=True)
    y, seen = detached._link(x * 1, token), []
    assert not detached.capture_grad(x * 1, seen.append)  # not a link's output: the caller hooks it
    assert detached.capture_grad(y, seen.append)
    assert not detached.capture_grad(y, seen.append)  # the node has its sink: a second one is hooked instead
    hooked = []
    y.register_hook(hooked.append)
    y.mul_(2)  # an in-place change after the capture: both see the gradient before it
    (y * torch.arange(3.0)).sum().backward()
    assert len(seen) == 1 and torch.equal(seen[0], hooked[0]) and torch.equal(seen[0], 2 * torch.arange(3.0))
