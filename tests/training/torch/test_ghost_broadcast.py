"""Ghost norms of tensors the model broadcasts over the batch (``dpmf.training.torch.ghost.broadcast``):
parameters added to activations by a layer without a rule, and bias tables -- layers called without a
batch dimension whose output is added to every example -- on small models, against a float64
per-example loop; and the uses that are not broadcasts: the fallback (parameters) or a clear refusal
(bias tables)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpmf.errors import UnsupportedConfigurationError  # noqa: E402
from dpmf.training.torch.ghost import GhostClipper  # noqa: E402

import ghost_reference  # noqa: E402  (beside this file)

F = torch.nn.functional


def mse(y):
    """Per-example sum of squares; the batch's mean (``i=None``) or example ``i``'s own."""
    def loss(out, i):
        if i is None:
            return ((out - y) ** 2).flatten(1).sum(1).mean()
        return ((out - y[i:i + 1]) ** 2).sum()
    return loss


class RelativeBias(torch.nn.Module):
    """Attention scores plus a (query, key) bucket table shared by the batch, T5-style."""

    def __init__(self, table_name: str = "relative_attention_bias", heads: int = 2, d: int = 6):
        super().__init__()
        self.heads, self.table_name = heads, table_name
        self.proj = torch.nn.Linear(d, 2 * heads * d)
        self.add_module(table_name, torch.nn.Embedding(5, heads))
        self.out = torch.nn.Linear(heads * d, d)

    def forward(self, x):
        B, T, d = x.shape
        q, k = self.proj(x).view(B, T, 2, self.heads, d).permute(2, 0, 3, 1, 4)
        rel = torch.arange(T)[None, :] - torch.arange(T)[:, None]
        buckets = rel.clamp(-2, 2) + 2  # (T, T), no batch dimension
        bias = getattr(self, self.table_name)(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, heads, T, T)
        att = (q @ k.transpose(-1, -2) + bias).softmax(-1)
        return self.out((att @ k).transpose(1, 2).reshape(B, T, -1))


@pytest.mark.parametrize("table_name, B, T", [("relative_attention_bias", 5, 5),  # by name, T = B
                                              ("relative_attention_bias", 4, 1),  # one query position
                                              ("table", 4, 5)])  # found by its input's rows
def test_bias_table_matches_the_reference(table_name, B, T):
    torch.manual_seed(0)
    model = RelativeBias(table_name).double()
    x = torch.randn(B, T, 6, dtype=torch.float64)
    clipper = ghost_reference.check(model, {"x": x}, mse(torch.randn(B, T, 6, dtype=torch.float64)), B)
    assert clipper.fallback_layers() == []


class Added(torch.nn.Module):
    """A cls token expanded to the batch and concatenated, position embeddings added, a bias added twice."""

    def __init__(self, T: int = 3, d: int = 4):
        super().__init__()
        self.cls = torch.nn.Parameter(torch.randn(1, 1, d))
        self.pos = torch.nn.Parameter(torch.randn(T + 1, d))
        self.bias = torch.nn.Parameter(torch.randn(d))
        self.lin = torch.nn.Linear(d, d)

    def forward(self, x):
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.lin(torch.tanh(h + self.bias)) - self.bias


def test_parameters_added_to_activations_have_a_ghost_rule():
    torch.manual_seed(0)
    model = Added().double()
    x, y = torch.randn(6, 3, 4, dtype=torch.float64), torch.randn(6, 4, 4, dtype=torch.float64)
    clipper = ghost_reference.check(model, {"x": x}, mse(y), 6)
    assert clipper.covered_layers() == {"Added": "ghost", "lin": "ghost"}


def test_a_layer_on_an_input_without_the_batch_reduced_then_added():
    """(Refused before: a (4, 2) input.) Its output, reduced, is added to every example: exact."""

    class Reduced(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.pos = torch.nn.Linear(3, 3), torch.nn.Linear(2, 3)

        def forward(self, x):
            return self.lin(x) + self.pos(torch.linspace(-1, 1, 8, dtype=torch.float64).view(4, 2)).sum(0)

    torch.manual_seed(0)
    model = Reduced().double()
    x = torch.randn(6, 3, dtype=torch.float64)
    clipper = ghost_reference.check(model, {"x": x}, mse(torch.randn(6, 3, dtype=torch.float64)), 6)
    assert clipper.fallback_layers() == []


def test_a_parameter_multiplying_the_batch_uses_the_fallback_exactly():
    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            return x * self.w + self.b

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Gate()).double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    clipper = ghost_reference.check(model, {"input": x}, mse(y), 6)
    assert clipper.fallback_layers() == ["1"]


def test_a_bias_table_used_other_than_by_broadcasting_is_refused():
    class Leaky(RelativeBias):
        def forward(self, x):
            return super().forward(x), self.relative_attention_bias(torch.zeros(2, 2, dtype=torch.long))

    def loss(out, y):  # the table's second output reaches the loss without meeting the batch
        return ((out[0] - y) ** 2).sum((1, 2)).mean() + out[1].sum()

    torch.manual_seed(0)
    ghost = GhostClipper(Leaky().double(), loss, 1.0)
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    with pytest.raises(UnsupportedConfigurationError, match="'relative_attention_bias'.*other than by broadcasting"):
        ghost.clipped_sum(x, torch.zeros_like(x))


def test_a_shared_scalar_added_to_every_example_is_a_broadcast():
    """The table's output summed to a scalar and added to every example's output: exact, per example."""

    class Scalar(RelativeBias):
        def forward(self, x):
            return super().forward(x) + self.relative_attention_bias(torch.zeros(2, 2, dtype=torch.long)).sum()

    torch.manual_seed(0)
    x, y = torch.randn(3, 4, 6, dtype=torch.float64), torch.randn(3, 4, 6, dtype=torch.float64)
    assert ghost_reference.check(Scalar().double(), {"x": x}, mse(y), 3).fallback_layers() == []


def test_a_non_finite_example_is_skipped_with_a_bias_table():
    torch.manual_seed(0)
    model = RelativeBias().double()
    x, y = torch.randn(5, 4, 6, dtype=torch.float64), torch.randn(5, 4, 6, dtype=torch.float64)
    x[2, 1, 0] = float("inf")
    loss = lambda o, t: ((o - t) ** 2).sum((1, 2)).mean()  # noqa: E731
    ghost = GhostClipper(model, loss, 0.5, nonfinite="skip")
    got = ghost.clipped_sum(x, y)
    assert ghost.skipped_nonfinite == 1
    keep = torch.tensor([0, 1, 3, 4])
    want = GhostClipper(model, loss, 0.5).clipped_sum(x[keep], y[keep])
    for a, b in zip(got.grads, want.grads):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)


def test_empty_batch_with_tracked_parameters():
    model = Added().double()
    got = GhostClipper(model, lambda o, y: ((o - y) ** 2).sum(), 1.0).clipped_sum(
        torch.zeros(0, 3, 4, dtype=torch.float64), torch.zeros(0, 4, 4, dtype=torch.float64))
    assert all(float(g.abs().sum()) == 0 for g in got.grads) and got.norms.shape == (0,)


def test_two_clippers_on_one_model_stay_exact_and_leave_its_parameters():
    torch.manual_seed(0)
    model = Added().double()
    params = dict(model.named_parameters())
    x, y = torch.randn(5, 3, 4, dtype=torch.float64), torch.randn(5, 4, 4, dtype=torch.float64)
    loss = lambda o, t: ((o - t) ** 2).sum((1, 2)).mean()  # noqa: E731
    first, second = GhostClipper(model, loss, 0.5), GhostClipper(model, loss, 0.5)
    a = first.clipped_sum(x, y)
    b, _, backwards = second.collect()  # the second clipper captured that backward too
    first.close(), second.close()
    assert backwards == 1 and all(p is params[n] for n, p in model.named_parameters())
    assert second.fallback_layers() == ["Added"]  # (tracking is for a model's only clipper)
    alone = GhostClipper(model, loss, 0.5).clipped_sum(x, y)
    for u, v, w in zip(a.grads, b, alone.grads):
        assert torch.allclose(u, w, rtol=1e-12) and torch.allclose(v, w, rtol=1e-12)
