"""The compiled float64 reductions of ghost mode (``ghost._norms_compiled``, used for large CPU tensors:
``sequence.compiled_form``) give the numbers of the tensor forms they replace, keep inf/NaN, and a model whose
every reduction runs compiled still equals the float64 per-example reference (issue 52 item 3)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpmf.training.torch.ghost import sequence  # noqa: E402
from dpmf.training.torch.ghost.normalization import layer_norm_rule  # noqa: E402
from dpmf.training.torch.ghost.registry import LayerCall, rule_for  # noqa: E402
from dpmf.training.torch.ghost.sequence import (  # noqa: E402
    F64,
    contract,
    per_example_norms,
    per_example_sums,
    rows_sq_norms,
    rows_sum_and_abs,
    step_cache,
    weighted_rows,
)

import ghost_reference  # noqa: E402  (beside this file)


@pytest.fixture
def compiled(monkeypatch):
    """Every reduction takes the compiled form (no size threshold)."""
    monkeypatch.setattr(sequence, "COMPILED_FLOATS", 0)


def test_small_tensors_keep_the_tensor_forms():
    assert not sequence.compiled_form(torch.zeros(32, 17 * 17))
    assert sequence.compiled_form(torch.zeros(16, 128 * 128))
    assert not sequence.compiled_form(torch.zeros(16, 128 * 128, dtype=torch.float16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_contraction_equals_the_float64_product(compiled, dtype):
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 7, 7, generator=gen, dtype=dtype), torch.randn(4, 7, 7, generator=gen, dtype=dtype)
    want = (a.to(F64) * b.to(F64)).sum((1, 2))
    assert torch.allclose(contract(a, b), want, rtol=1e-14, atol=0)
    a[1, 2, 3] = float("inf")  # an overflowed Gram stays non-finite (the float64 retry runs)
    a[2, 0, 0] = float("nan")
    got = contract(a, b)
    assert not bool(torch.isfinite(got[1])) and bool(torch.isnan(got[2])) and bool(torch.isfinite(got[[0, 3]]).all())


def test_per_example_norms_sums_and_add_up_check_equal_the_tensor_forms(compiled):
    gen = torch.Generator().manual_seed(1)
    B = 5
    tensors = [torch.randn(B, 7, generator=gen), torch.randn(B, 3, 4, generator=gen), torch.randn(B, generator=gen),
               torch.randn(B, 6, generator=gen).double()]
    f = torch.rand(B, generator=gen, dtype=F64)
    with step_cache():
        per_example_norms(tensors)
        per_example_sums(tensors, f)
        sq = [rows_sq_norms(t) for t in tensors]
        sums = [weighted_rows(t, f) for t in tensors]
    for t, s, w in zip(tensors, sq, sums):
        r = t.to(F64).reshape(B, -1)
        assert torch.allclose(s, (r * r).sum(1), rtol=1e-14, atol=0)
        assert w.shape == t.shape[1:] and torch.allclose(w, torch.tensordot(f, t.to(F64), dims=1), rtol=1e-13, atol=1e-15)
        total, absolute = rows_sum_and_abs(t)
        assert torch.allclose(total, t.to(F64).sum(0), rtol=1e-13, atol=1e-15)
        assert torch.allclose(absolute, t.to(F64).abs().sum(0), rtol=1e-14, atol=0)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_normalization_rule_compiled_equals_float64(compiled, kind):
    gen = torch.Generator().manual_seed(2)
    m = torch.nn.LayerNorm(16) if kind == "layer" else torch.nn.RMSNorm(16, eps=1e-6)
    x, g = torch.randn(4, 5, 16, generator=gen) * 3 + 1, torch.randn(4, 5, 16, generator=gen)
    x64 = x.to(F64)
    if kind == "layer":
        xhat = torch.nn.functional.layer_norm(x64, (16,), eps=m.eps)
    else:
        xhat = x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + m.eps)
    lg = rule_for(m)(m, LayerCall((x,), {}, [torch.zeros(1)], [g], 4, versions=[]), dict(m.named_parameters()))
    assert torch.allclose(lg.contributions["weight"].grads, (xhat * g.to(F64)).sum(1), rtol=1e-12, atol=1e-12)
    if kind == "layer":
        assert rule_for(m) is layer_norm_rule
        assert torch.allclose(lg.contributions["bias"].grads, g.to(F64).sum(1), rtol=1e-12, atol=1e-12)


def test_model_with_every_reduction_compiled_equals_the_reference(compiled):
    """Linear layers along a sequence (Gram form), LayerNorm, biases: clipped sums = the float64 loop."""
    torch.manual_seed(3)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(12, 24)
            self.norm = torch.nn.LayerNorm(24)
            self.b = torch.nn.Linear(24, 24)
            self.head = torch.nn.Linear(24, 3)

        def forward(self, x):
            return self.head(self.b(torch.tanh(self.norm(self.a(x)))).mean(1))

    model = Net().double()
    B = 6
    inputs = {"x": torch.randn(B, 4, 12, dtype=torch.float64)}
    y = torch.randint(0, 3, (B,))

    def loss(out, i):
        return torch.nn.functional.cross_entropy(out, y if i is None else y[i:i + 1])

    clipper = ghost_reference.check(model, inputs, loss, B)
    assert clipper.fallback_layers() == []
