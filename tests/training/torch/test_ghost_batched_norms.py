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
