"""Per-example gradients and joint clipping (dpmf.training.torch.grad_sample): per-example
gradients equal a naive one-example-at-a-time backward loop (MLP, CNN, embedding model; float32
and float64), every clipped per-example gradient has norm <= max_grad_norm in the computed numbers
(naive min(1, C/n) clipping in float32 breaks this for ~1/3 of examples, so the property test can
fail), the clipped sum equals the naive clipped sum, empty batches, frozen parameters, chunking,
non-finite examples, bad input, and (when opacus is installed) the Opacus hook mode."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmf.training.torch._deps import require_torch

torch = require_torch()
nn = torch.nn
F = nn.functional

from dpmf.errors import NumericalError, InvalidParameterError, UnsupportedConfigurationError  # noqa: E402
from dpmf.training.torch.grad_sample import (  # noqa: E402
    ClippedGradients,
    PerExampleClipper,
    clip_factors,
    clip_margin,
)

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


class MeanEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, tokens):  # needs the batch dim: (B, L) -> (B, 3)
        return self.head(self.emb(tokens).mean(dim=1))


def mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.ReLU(), nn.GroupNorm(1, 3), nn.Flatten(), nn.Linear(3 * 4 * 4, 3)
    )


def batch_for(name, n, dtype, gen):
    if name == "mlp":
        return torch.randn(n, 6, generator=gen, dtype=dtype)
    if name == "cnn":
        return torch.randn(n, 1, 6, 6, generator=gen, dtype=dtype)
    return torch.randint(0, 20, (n, 7), generator=gen)


MODELS = {"mlp": mlp, "cnn": cnn, "embedding": MeanEmbedding}


def build(name, dtype, seed=0):
    torch.manual_seed(seed)
    model = MODELS[name]().to(dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    x = batch_for(name, 9, dtype, gen)
    y = torch.randint(0, 3, (9,), generator=gen)
    return model, x, y


def naive_grads(model, loss_fn, x, y):
    """One backward per example: list over examples of [grad of each trainable parameter]."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(x.shape[0]):
        model.zero_grad(set_to_none=True)
        loss_fn(model(x[i : i + 1]), y[i : i + 1]).backward()
        out.append([p.grad.detach().clone() for p in params])
    model.zero_grad(set_to_none=True)
    return out


def naive_clipped_sum(per_example, c):
    total = [torch.zeros_like(g) for g in per_example[0]]
    norms = []
    for grads in per_example:
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
        norms.append(norm)
        for t, g in zip(total, grads):
            t += g * min(1.0, c / norm)
    return total, norms


# ------------------------------------------------------------------- equal to the naive loop
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(MODELS))
def test_per_example_grads_equal_naive_loop(name, dtype):
    model, x, y = build(name, dtype)
    clipper = PerExampleClipper(model, F.cross_entropy, 1.0)
    got = clipper.per_example_grads(x, y)
    want = naive_grads(model, F.cross_entropy, x, y)
    assert len(got) == len(clipper.param_names) == len(list(model.parameters()))
    for p_index, g in enumerate(got):
        assert g.shape == (9, *clipper.params[p_index].shape) and g.dtype == dtype
        for i in range(9):
            torch.testing.assert_close(g[i], want[i][p_index], atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(MODELS))
def test_clipped_sum_equals_naive_clipped_sum(name, dtype):
    model, x, y = build(name, dtype)
    want_grads = naive_grads(model, F.cross_entropy, x, y)
    norms_only = [math.sqrt(sum(float(g.double().pow(2).sum()) for g in gs)) for gs in want_grads]
    c = sum(sorted(norms_only)[4:6]) / 2  # 4 examples are clipped, 5 are not
    result = PerExampleClipper(model, F.cross_entropy, c).clipped_sum(x, y)
    assert isinstance(result, ClippedGradients)
    grads, norms = result
    want_sum, want_norms = naive_clipped_sum(want_grads, c)
    assert norms.dtype == torch.float64 and norms.shape == (9,)
    torch.testing.assert_close(norms, torch.tensor(want_norms, dtype=torch.float64), atol=0, rtol=TOL[dtype])
    assert (norms > c).sum() == 4 and (norms < c).sum() == 5
    for got, want, p in zip(grads, want_sum, model.parameters()):
        assert got.shape == p.shape and got.dtype == p.dtype
        torch.testing.assert_close(got, want, atol=TOL[dtype], rtol=TOL[dtype])
    assert all(p.grad is None for p in model.parameters())  # .grad untouched


def test_norms_are_unclipped_and_chunking_changes_nothing():
    model, x, y = build("mlp", torch.float64)
    clipper = PerExampleClipper(model, F.cross_entropy, 1e-3)
    grads, norms = clipper.clipped_sum(x, y)
    assert torch.all(norms > 1e-2)  # far above C: these are not the clipped norms
    torch.testing.assert_close(norms, clipper.norms(clipper.per_example_grads(x, y)), atol=0, rtol=1e-14)
    chunked = PerExampleClipper(model, F.cross_entropy, 1e-3, chunk_size=4).clipped_sum(x, y)
    torch.testing.assert_close(chunked.norms, norms, atol=0, rtol=1e-14)
    for a, b in zip(chunked.grads, grads):
        torch.testing.assert_close(a, b, atol=1e-15, rtol=1e-12)
    # every example clipped to C: the sum has norm <= 9 C, and each clipped gradient has norm ~ C
    clipped = clipper.clipped_per_example(x, y)
    each = PerExampleClipper.norms(clipped)
    assert torch.all(each <= 1e-3) and torch.all(each > 1e-3 * (1 - 1e-9))


# ------------------------------------------------------------------- the bound, in computed numbers
class Scaled:
    def __init__(self, scale):
        self.scale = scale

    def __call__(self, out, y):
        return self.scale * F.cross_entropy(out, y)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    log_scale=st.floats(-30, 36),
    log_c=st.floats(-8, 4),
    seed=st.integers(0, 2**16),
    name=st.sampled_from(["mlp", "cnn"]),
)
def test_every_clipped_gradient_is_within_the_clip_norm(log_scale, log_c, seed, name):
    model, x, y = build(name, torch.float32, seed)
    c = 10.0**log_c
    clipper = PerExampleClipper(model, Scaled(10.0**log_scale), c)
    clipped = clipper.clipped_per_example(x, y)
    each = PerExampleClipper.norms(clipped)  # float64 norms of the float32 numbers we produced
    assert torch.all(each <= c), (each.max().item(), c)
    # the sum is the sum of these clipped gradients
    grads, norms = clipper.clipped_sum(x, y)
    for s, g in zip(grads, clipped):
        torch.testing.assert_close(s, g.sum(0), rtol=1e-5, atol=1e-6 * c)


def test_bound_holds_where_naive_float32_clipping_fails():
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(256, 1000, generator=gen) * 10 ** torch.empty(256, 1).uniform_(-3, 3, generator=gen)
    naive = g * torch.clamp(1.0 / g.norm(dim=1), max=1)[:, None]
    assert (naive.double().norm(dim=1) > 1).sum() > 20  # the trap is real
    model = nn.Linear(1000, 1, bias=False)
    clipper = PerExampleClipper(model, lambda out, y: (out[:, 0] * y).sum(), 1.0)
    # d loss / d w = y x for a linear model with loss out*y: choose y = 1 so g_i = x_i
    clipped = clipper.clipped_per_example(g, torch.ones(256))
    assert torch.all(PerExampleClipper.norms(clipped) <= 1.0)


def test_bound_holds_when_the_factor_is_subnormal_in_float32():
    # gradients of norm ~1e38 and C ~1e-7: f = C / n ~ 1e-45 is a float32 subnormal, where
    # rounding to nearest can add 50%; the factor is rounded toward zero instead
    tiny = torch.finfo(torch.float32).smallest_normal * 2.0**-23  # 1.4e-45
    x = torch.full((6, 100), 1e37)
    model = nn.Linear(100, 1, bias=False)
    loss = lambda out, y: (out[:, 0] * y).sum()  # noqa: E731  (g_i = x_i)
    norm = float(PerExampleClipper.norms([x]).max())
    for k in (1.6, 2.6, 3.7, 5.6):
        c = k * tiny * norm
        clipped = PerExampleClipper(model, loss, c).clipped_per_example(x, torch.ones(6))
        assert torch.all(PerExampleClipper.norms(clipped) <= c), k
        assert torch.all(PerExampleClipper.norms(clipped) >= (k - 1) / k * c * 0.99)


def test_clip_factors_formula():
    norms = torch.tensor([0.0, 0.5, 2.0, 4.0, float("inf"), float("nan")], dtype=torch.float64)
    assert clip_factors(norms, 2.0, 0.0).tolist()[:5] == [1.0, 1.0, 1.0, 0.5, 0.0]
    assert clip_factors(norms, 2.0, 0.0)[5] == 0.0
    assert clip_factors(norms, 2.0, 0.25).tolist()[:4] == [1.0, 1.0, 0.75, 0.375]
    assert clip_margin([torch.float32]) == 8 * torch.finfo(torch.float32).eps
    assert clip_margin([torch.float64]) == 2.0**-40
    assert clip_margin([torch.float64, torch.bfloat16]) == 8 * torch.finfo(torch.bfloat16).eps


def test_non_finite_example_raises_or_contributes_zero():
    model, x, y = build("mlp", torch.float32)
    bad = x.clone()
    bad[2, 0] = float("nan")
    with pytest.raises(NumericalError, match="1 of 9 examples"):
        PerExampleClipper(model, F.cross_entropy, 0.5).clipped_sum(bad, y)
    clipper = PerExampleClipper(model, F.cross_entropy, 0.5, nonfinite="skip")
    grads, norms = clipper.clipped_sum(bad, y)
    assert clipper.skipped_nonfinite == 1
    assert math.isnan(norms[2]) and torch.isfinite(norms[[0, 1, 3, 4, 5, 6, 7, 8]]).all()
    keep = [i for i in range(9) if i != 2]
    want, _ = clipper.clipped_sum(x[keep], y[keep])
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------- shapes and special cases
def test_empty_batch():
    model, x, y = build("cnn", torch.float32)
    grads, norms = PerExampleClipper(model, F.cross_entropy, 1.0).clipped_sum(x[:0], y[:0])
    assert norms.shape == (0,) and norms.dtype == torch.float64
    for g, p in zip(grads, model.parameters()):
        assert g.shape == p.shape and g.dtype == p.dtype and not g.any()
    per = PerExampleClipper(model, F.cross_entropy, 1.0, chunk_size=2).per_example_grads(x[:0], y[:0])
    assert [tuple(g.shape) for g in per] == [(0, *p.shape) for p in model.parameters()]
    clipped = PerExampleClipper(model, F.cross_entropy, 1.0).clipped_per_example(x[:0], y[:0])
    assert [tuple(g.shape) for g in clipped] == [(0, *p.shape) for p in model.parameters()]


def test_frozen_parameter_is_skipped():
    model, x, y = build("embedding", torch.float64)
    model.emb.weight.requires_grad_(False)
    clipper = PerExampleClipper(model, F.cross_entropy, 0.1)
    assert clipper.param_names == ["head.weight", "head.bias"]
    got = clipper.per_example_grads(x, y)
    want = naive_grads(model, F.cross_entropy, x, y)
    for i in range(9):
        for g, w in zip(got, want[i]):
            torch.testing.assert_close(g[i], w, atol=1e-10, rtol=1e-10)
    grads, norms = clipper.clipped_sum(x, y)
    want_sum, want_norms = naive_clipped_sum(want, 0.1)  # norms over the trainable parameters only
    torch.testing.assert_close(norms, torch.tensor(want_norms, dtype=torch.float64), atol=0, rtol=1e-10)
    assert len(grads) == 2
    for g, w in zip(grads, want_sum):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10)


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 2)
        self.b = nn.Linear(4, 2)

    def forward(self, u, v):
        return self.a(u) * self.b(v)


def test_tuple_inputs_and_no_targets():
    torch.manual_seed(3)
    model = TwoInputs().double()
    u, v = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    loss = lambda out: out.pow(2).sum()  # noqa: E731
    got = PerExampleClipper(model, loss, 1.0).per_example_grads((u, v))
    for i in range(5):
        model.zero_grad()
        loss(model(u[i : i + 1], v[i : i + 1])).backward()
        for g, p in zip(got, model.parameters()):
            torch.testing.assert_close(g[i], p.grad, atol=1e-10, rtol=1e-10)


def test_dropout_runs_with_independent_masks():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.5), nn.Linear(64, 1)).train()
    x = torch.ones(8, 4)  # identical examples: differences come from the masks
    per = PerExampleClipper(model, lambda out, y: out.sum(), 1.0).per_example_grads(x, torch.zeros(8))
    assert not torch.allclose(per[0][0], per[0][1])


def test_batchnorm_in_training_mode_is_refused():
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    clipper = PerExampleClipper(model, lambda out, y: out.sum(), 1.0)
    with pytest.raises(UnsupportedConfigurationError, match="BatchNorm"):
        clipper.clipped_sum(torch.randn(4, 4), torch.zeros(4))
    model.eval()
    assert clipper.clipped_sum(torch.randn(4, 4), torch.zeros(4)).norms.shape == (4,)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
        ({"max_grad_norm": -1.0}, "max_grad_norm"),
        ({"max_grad_norm": float("nan")}, "max_grad_norm"),
        ({"max_grad_norm": float("inf")}, "max_grad_norm"),
        ({"mode": "ghost"}, "mode"),
        ({"loss_reduction": "avg"}, "loss_reduction"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"loss_fn": 3}, "loss_fn"),
        ({"module": "net"}, "module"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"module": mlp(), "loss_fn": F.cross_entropy, "max_grad_norm": 1.0, **kwargs}
    with pytest.raises(InvalidParameterError, match=match):
        PerExampleClipper(args.pop("module"), args.pop("loss_fn"), args.pop("max_grad_norm"), **args)


def test_bad_batches():
    model = mlp()
    with pytest.raises(InvalidParameterError, match="no trainable"):
        PerExampleClipper(model.requires_grad_(False), F.cross_entropy, 1.0)
    clipper = PerExampleClipper(mlp(), F.cross_entropy, 1.0)
    with pytest.raises(InvalidParameterError, match="batch size"):
        clipper.clipped_sum(torch.randn(4, 6), torch.zeros(3, dtype=torch.long))
    with pytest.raises(InvalidParameterError, match="inputs"):
        clipper.clipped_sum([1, 2], torch.zeros(2, dtype=torch.long))
    with pytest.raises(InvalidParameterError, match="targets"):
        clipper.clipped_sum(torch.randn(4, 6), 3)


# ------------------------------------------------------------------- opacus hooks mode
def test_opacus_mode_without_opacus_says_how():
    try:
        import opacus  # noqa: F401
    except ImportError:
        with pytest.raises(UnsupportedConfigurationError, match="pip install opacus"):
            PerExampleClipper(mlp(), F.cross_entropy, 1.0, mode="opacus")
    else:
        pytest.skip("opacus is installed")


@pytest.mark.parametrize("name", list(MODELS))
def test_opacus_mode_equals_functorch(name):
    pytest.importorskip("opacus")
    model, x, y = build(name, torch.float32)
    twin = copy.deepcopy(model)  # opacus' backward hooks cannot share a module with torch.func
    ref = PerExampleClipper(model, F.cross_entropy, 0.5)
    hooked = PerExampleClipper(twin, F.cross_entropy, 0.5, mode="opacus")
    for _ in range(2):  # nothing accumulates between calls
        for a, b in zip(hooked.per_example_grads(x, y), ref.per_example_grads(x, y)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    (ga, na), (gb, nb) = hooked.clipped_sum(x, y), ref.clipped_sum(x, y)
    torch.testing.assert_close(na, nb, atol=0, rtol=1e-5)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert all(p.grad is None for p in twin.parameters())
    empty = hooked.clipped_sum(x[:0], y[:0])
    assert empty.norms.shape == (0,)
    twin.eval()
    with pytest.raises(UnsupportedConfigurationError, match="eval"):
        hooked.clipped_sum(x, y)
    hooked.close()
    assert not any(hasattr(p, "grad_sample") for p in twin.parameters())
