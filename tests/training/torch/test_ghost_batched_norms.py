"""Norms formed for many layers at once (``ghost.sequence.gram_norms``, ``per_example_norms``,
``per_example_sums``) equal each layer's own, and stay upper bounds of the exact float64 norms.

The batched forms share one rounding bound across layers (and, off the CPU, one float64 copy); each
entry must be what the layer alone gives (the same formula; float64 sums in another order), a layer that overflows float32 must still be retried in float64, and a whole model must still
equal the per-example float64 loop (``test_torch_ghost``, ``test_ghost_vit``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpmf.training.torch.ghost import sequence  # noqa: E402
from dpmf.training.torch.ghost.sequence import (  # noqa: E402
    F64,
    gram_norms,
    per_example_norms,
    per_example_sums,
    rows_sq_norms,
    sequence_parts,
    step_cache,
    weighted_rows,
)


def _exact(A, G):
    """``||G_i^T A_i||_F^2`` in float64, ``(B,)``."""
    P = torch.bmm(G.to(F64).transpose(1, 2), A.to(F64))
    return (P * P).sum((1, 2))


def _pairs(gen):
    """Layers of several widths and two sequence lengths; q/k/v-like layers share an input."""
    B = 5
    shared = torch.randn(B, 9, 24, generator=gen)
    pairs = [(shared, torch.randn(B, 9, 24, generator=gen)), (shared, torch.randn(B, 9, 24, generator=gen)),
             (torch.randn(B, 9, 40, generator=gen), torch.randn(B, 9, 12, generator=gen)),
             (torch.randn(B, 6, 30, generator=gen), torch.randn(B, 6, 20, generator=gen)),
             (torch.randn(B, 6, 16, generator=gen), torch.randn(B, 6, 28, generator=gen))]
    return [(A, G, torch.float32) for A, G in pairs]


def test_gram_norms_equal_each_layer_alone():
    """All layers of a (B, T) formed together (each its own contraction, one bound), the same as alone."""
    pairs = _pairs(torch.Generator().manual_seed(0))
    for A, G, _ in pairs:
        assert sequence.norm_plan(A.shape[1], A.shape[2], G.shape[2]) == "gram"
    alone = [sequence_parts(A, G, w)[0] for A, G, w in pairs]  # outside step_cache: per layer
    with step_cache():
        gram_norms(pairs)
        together = [sequence_parts(A, G, w)[0] for A, G, w in pairs]
        formed = [sequence._GRAMS.get((id(A), id(G), w)) is not None for A, G, w in pairs]
        assert formed == [True] * 5
    for a, t, (A, G, _) in zip(alone, together, pairs):
        assert torch.allclose(t, a, rtol=1e-12, atol=0)
        exact = _exact(A, G)
        assert bool((t >= exact).all())  # still upper bounds
        # and no looser than the float32 rounding terms (sequence's docstring: about 1.2e-7 max(d) s_i^2)
        s = (A.to(F64).norm(dim=2) * G.to(F64).norm(dim=2)).sum(1)
        assert bool((t - exact <= 2e-7 * max(A.shape[2], G.shape[2]) * s * s).all())


def test_gram_norms_shared_input_with_and_without_ones_equal_alone():
    """Layers reading one input, some with a bias folded in (``[A, 1]``) and some without: the input's Gram and its
    float64 copy are formed once per kind (``_input_gram64``) and every layer's norms equal its own alone (the
    same numbers), also ``contract`` given the float64 copy."""
    gen = torch.Generator().manual_seed(3)
    B = 4
    shared = torch.randn(B, 7, 20, generator=gen)
    pairs = [(shared, torch.randn(B, 7, 20, generator=gen), torch.float32, ones) for ones in (True, True, False)]
    pairs.append((torch.randn(B, 7, 24, generator=gen), torch.randn(B, 7, 12, generator=gen), torch.float32, True))
    alone = [sequence_parts(A, G, w, ones)[0] for A, G, w, ones in pairs]
    with step_cache():
        gram_norms(pairs)
        together = [sequence_parts(A, G, w, ones)[0] for A, G, w, ones in pairs]
        keys = [k for k in sequence._GRAMS if isinstance(k, tuple) and k[-1] in ("gram64", "gram64-1")]
        assert len(keys) == 3  # the shared input with and without ones, the other input with
    for a, t in zip(alone, together):
        assert torch.equal(t, a)
    a, b = sequence.symmetric_gram(pairs[0][1], torch.float32), sequence.symmetric_gram(shared, torch.float32)
    assert torch.equal(sequence.contract(a, b, b.to(F64)), sequence.contract(a, b))


def test_gram_norms_overflow_retried_in_float64():
    """A layer whose float32 Grams overflow gets the float64 Gram form; the others keep float32's."""
    gen = torch.Generator().manual_seed(1)
    pairs = _pairs(gen)
    A, G, w = pairs[2]
    pairs[2] = (A, G * 1e20, w)  # ||g||^2 ~ 1e41 > float32's max
    with step_cache():
        gram_norms(pairs)
        big = sequence_parts(*pairs[2])[0]
        small = sequence_parts(*pairs[0])[0]
    assert bool(torch.isfinite(big).all())
    assert torch.allclose(big, _exact(A, G * 1e20), rtol=1e-9)
    assert torch.allclose(small, sequence_parts(*pairs[0])[0], rtol=1e-12, atol=0)


def test_per_example_norms_and_sums_equal_each_tensor_alone():
    gen = torch.Generator().manual_seed(2)
    B = 6
    tensors = [torch.randn(B, 7, generator=gen), torch.randn(B, 3, 4, generator=gen), torch.randn(B, generator=gen),
               torch.randn(B, 5, generator=gen).double()]
    f = torch.rand(B, generator=gen, dtype=F64)
    alone_sq = [rows_sq_norms(t) for t in tensors]
    alone_sum = [weighted_rows(t, f) for t in tensors]
    with step_cache():
        per_example_norms(tensors)
        per_example_sums(tensors, f)
        together_sq = [rows_sq_norms(t) for t in tensors]
        together_sum = [weighted_rows(t, f) for t in tensors]
        other = weighted_rows(tensors[0], f * 0.5)  # other factors: not the cached sum
    for t, a, b in zip(tensors, alone_sq, together_sq):
        exact = (t.to(F64) ** 2).reshape(B, -1).sum(1)
        assert torch.allclose(b, a, rtol=1e-14, atol=0) and torch.allclose(b, exact, rtol=1e-14, atol=0)
    for t, a, b in zip(tensors, alone_sum, together_sum):
        assert b.shape == t.shape[1:]
        assert torch.allclose(b, a, rtol=1e-12, atol=1e-15)
    assert torch.allclose(other, together_sum[0] * 0.5, rtol=1e-12, atol=1e-15)


def _exact_with_bias(A, G):
    """``||G_i^T A_i||_F^2 + ||sum_t g_{i,t}||^2`` in float64, ``(B,)``."""
    b = G.to(F64).sum(1)
    return _exact(A, G) + (b * b).sum(1)


def _squared_loss(out, t):
    return ((out - t) ** 2).flatten(1).sum(1).mean()


def _ghost_and_reference(model, x, y):
    """The ghost clipper's result (bound 0.5) on ``model`` and the float64 per-example reference:
    ``(got, margin, per-example gradients, their norms)``."""
    from dpmf.training.torch.ghost import GhostClipper

    ghost = GhostClipper(model, _squared_loss, 0.5)
    try:
        got = ghost.clipped_sum(x, y)
    finally:
        ghost.close()
    model64 = model.double()
    params = list(model64.parameters())
    per, norms = [], []
    for i in range(x.shape[0]):
        g = torch.autograd.grad(_squared_loss(model64(x[i : i + 1].double()), y[i : i + 1].double()), params)
        per.append(g)
        norms.append(torch.sqrt(sum((gi ** 2).sum() for gi in g)))
    return got, ghost.margin, per, torch.stack(norms)


@pytest.mark.parametrize("batched", [False, True])
def test_folded_bias_norms_bound_weight_and_bias(batched):
    """A Linear's bias folded into the Gram (``ones``: the input ``[A, 1]``): the norm of (weight, bias) is within
    the rounding allowance of the separate norms (weight's Gram bound + the bias's float64 norm) and never below
    the exact float64 norm, also of the float32-summed bias that the clipped sum adds; alone or with other layers
    (one bound for all), and with large offsets in the output gradients (cancelling bias sums)."""
    gen = torch.Generator().manual_seed(5)
    pairs = _pairs(gen)
    A, G, w = pairs[1]
    pairs[1] = (A, G + 30.0, w)  # a bias much larger than the weight's rows
    folded_pairs = [(A, G, w, True) for A, G, w in pairs]
    with step_cache():
        if batched:
            gram_norms(folded_pairs + pairs)
        folded = [sequence_parts(A, G, w, ones=True)[0] for A, G, w in pairs]
        separate = [sequence_parts(A, G, w)[0] + rows_sq_norms(G.sum(1)) for A, G, w in pairs]
    for fo, se, (A, G, _) in zip(folded, separate, pairs):
        exact = _exact_with_bias(A, G)
        assert bool((fo >= exact).all())
        b32 = G.sum(1).to(F64)  # the bias the clipped sum adds, summed in float32
        assert bool((fo >= _exact(A, G) + (b32 * b32).sum(1)).all())
        # within the allowance: ~1.2e-7 (max(d) + T) s_i^2, s over the rows [a_t, 1]
        s = (torch.sqrt(A.to(F64).norm(dim=2) ** 2 + 1) * G.to(F64).norm(dim=2)).sum(1)
        allowance = 2e-7 * (max(A.shape[2] + 1, G.shape[2]) + 3 * A.shape[1]) * s * s
        assert bool((fo - exact <= allowance).all())
        assert bool(((fo - se).abs() <= allowance).all())
        assert bool(((fo - se).abs() <= 1e-5 * se).all())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_folded_bias_linear_rule_clipped_sums(monkeypatch, dtype):
    """A model of Linear layers on 17 positions: the ghost clipper folds the biases into their weights' Gram
    norms, and its norms and clipped sums equal the float64 per-example reference (a float64 model: to float64
    precision and never below; a float32 one: within its forward's rounding)."""
    from dpmf.training.torch.clipping import clip_factors
    from dpmf.training.torch.ghost import joint

    folds = []
    orig = joint.sequence_parts

    def spy(A, G, work=torch.float32, ones=False):
        folds.append(ones)
        return orig(A, G, work, ones)

    monkeypatch.setattr(joint, "sequence_parts", spy)
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.Tanh(), torch.nn.Linear(32, 48), torch.nn.Tanh(),
                                torch.nn.Linear(48, 40)).to(dtype)  # (the last one's sum from the scaled rows)
    x, y = torch.randn(6, 17, 24, dtype=dtype), torch.randn(6, 17, 40, dtype=dtype)
    got, margin, per, norms = _ghost_and_reference(model, x, y)
    assert folds == [True, True, True]
    rtol = 1e-9 if dtype == torch.float64 else 1e-4
    if dtype == torch.float64:
        assert bool((got.norms >= norms * (1 - 1e-12)).all())
    assert torch.allclose(got.norms, norms, rtol=rtol, atol=0)
    f = clip_factors(norms, 0.5, margin)
    for k, a in enumerate(got.grads):
        want = sum(f[i] * per[i][k] for i in range(6))
        assert torch.allclose(a.double(), want, rtol=rtol * 10, atol=1e-10 if dtype == torch.float64 else 1e-6)


def test_folded_bias_not_taken_for_a_layer_called_twice():
    """A Linear layer called twice (its parameters joined across calls, cross terms needed) keeps the separate
    weight and bias contributions: norms and sums equal the float64 per-example reference."""
    from dpmf.training.torch.clipping import clip_factors

    torch.manual_seed(3)
    lin = torch.nn.Linear(32, 32).double()
    model = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.Tanh(), lin, torch.nn.Tanh(), lin).double()
    x, y = torch.randn(5, 17, 24, dtype=F64), torch.randn(5, 17, 32, dtype=F64)
    got, margin, per, norms = _ghost_and_reference(model, x, y)
    assert bool((got.norms >= norms * (1 - 1e-12)).all())
    assert torch.allclose(got.norms, norms, rtol=1e-9, atol=0)
    f = clip_factors(norms, 0.5, margin)
    for k, a in enumerate(got.grads):
        assert torch.allclose(a, sum(f[i] * per[i][k] for i in range(5)), rtol=1e-8, atol=1e-10)
