"""The ghost step's faster paths (issue 52 item 3, second round) give the numbers of the paths they replace.

* ``sequence.symmetric_gram``: on the CPU the Gram ``X Xᵀ`` is numpy's product of ``X`` with its own transpose
  (BLAS ``?syrk``, one thread); it must equal ``torch.bmm`` to the rounding of one dot product per entry, be
  exactly symmetric, write into ``out=``, take any layout and float64, and give inf (not a warning) where
  float32 overflows, so the norms' float64 retry still runs;
* ``sequence.norm_plan``'s ``input_share``: layers reading one input are counted by ``gram_norms`` and their
  plans chosen with the shared Gram (the k/v projections of a Llama block go to the Gram form), every plan
  still an upper bound equal to the exact norm up to its rounding slack;
* ``sequence.gram_norms``: each layer's Grams contracted in turn (on the CPU by a compiled float64 pass), one rounding bound for all (``_gram_each``), row norms from the Grams' diagonals on
  the CPU: equal to each layer alone and upper bounds within the float32 slack;
* ``sequence.sequence_weighted_sum`` on transposed views (the convolution rule), in chunks of examples or
  at once, equals the float64 sum of clipped per-example gradients;
* ``DPOptimizer.step`` adds the noise and scales with fused passes over all parameters (in place, on its
  copy of the clipper's sums): the gradient is ``(sum + noise) / normalizer`` exactly, and the tensors the
  clipper handed over are not written; the copy is one buffer (each ``.grad`` a view of it) where the sums
  share a dtype and device, bitwise the numbers of the per-parameter passes.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpmf.training.torch.ghost import sequence  # noqa: E402
from dpmf.training.torch.ghost.sequence import (  # noqa: E402
    F64,
    gram_norms,
    sequence_parts,
    sequence_weighted_sum,
    step_cache,
    symmetric_gram,
)


def _bmm_gram(X, dtype):
    Xw = X.to(dtype)
    return torch.bmm(Xw, Xw.transpose(1, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "half"])
@pytest.mark.parametrize("T", [11, sequence.BMM_GRAM_T + 9])  # torch.bmm (short sequences), numpy's syrk
def test_symmetric_gram_equals_bmm(dtype, layout, T):
    gen = torch.Generator().manual_seed(3)
    B, d = 4, 37
    if layout == "transposed":  # a (B, d, T) tensor viewed as (B, T, d), as the convolution rule's
        X = torch.randn(B, d, T, generator=gen).transpose(1, 2)
    elif layout == "half":
        X = torch.randn(B, T, d, generator=gen).to(torch.bfloat16)
    else:
        X = torch.randn(B, T, d, generator=gen)
    got = symmetric_gram(X, dtype)
    assert got.dtype == dtype and got.shape == (B, T, T)
    if T > sequence.BMM_GRAM_T:
        assert bool((got == got.transpose(1, 2)).all())  # one triangle, copied
    exact = _bmm_gram(X, F64)
    # each entry is one dot product of length d in ``dtype``: |error| <= gamma_d |x_s| |x_t|
    norms = X.to(F64).norm(dim=2)
    slack = sequence.gamma(d, dtype) * norms.unsqueeze(2) * norms.unsqueeze(1)
    assert bool(((got.to(F64) - exact).abs() <= slack).all())
    assert torch.allclose(got, _bmm_gram(X, dtype), rtol=0, atol=float(slack.max()) * 2)
    with step_cache():  # BLAS held to one thread for the block: the same numbers
        out = torch.empty(B, T, T, dtype=dtype)
        assert symmetric_gram(X, dtype, out=out) is out
        assert torch.equal(out, got)


def test_symmetric_gram_edge_shapes_and_overflow():
    assert symmetric_gram(torch.zeros(0, 5, 3), torch.float32).shape == (0, 5, 5)
    assert symmetric_gram(torch.zeros(2, 0, 3), torch.float32).shape == (2, 0, 0)
    X = torch.full((2, 3, 4), 2.0**66)
    assert bool(torch.isinf(symmetric_gram(X, torch.float32)).all())  # 2^134 > float32's max: inf, no warning
    assert torch.equal(symmetric_gram(X, F64), torch.full((2, 3, 3), 2.0**134, dtype=F64))
    leaf = torch.randn(2, 3, 4, requires_grad=True)  # (a tensor numpy cannot view: torch's product)
    assert torch.allclose(symmetric_gram(leaf, torch.float32), _bmm_gram(leaf.detach(), torch.float32), rtol=1e-6)


def _exact(A, G):
    P = torch.bmm(G.to(F64).transpose(1, 2), A.to(F64))
    return (P * P).sum((1, 2))


def test_shared_input_counted_and_plans_exact():
    """A Llama-like block at T = 128: q (256 -> 256), k and v (256 -> 128) read one input. Alone, k's plan
    is by its own cost; inside ``step_cache`` after ``gram_norms`` saw the three, the input's Gram is
    counted as shared. Every way still gives an upper bound within the float32 slack of the exact norm."""
    gen = torch.Generator().manual_seed(5)
    B, T = 3, 128
    x = torch.randn(B, T, 256, generator=gen)
    pairs = [(x, torch.randn(B, T, d, generator=gen), torch.float32) for d in (256, 128, 128)]
    assert sequence.norm_plan(T, 256, 128, syrk=False) == "materialize"
    assert sequence.norm_plan(T, 256, 128, syrk=False, input_share=3) == "gram"
    alone = [sequence_parts(A, G, w)[0] for A, G, w in pairs]
    with step_cache():
        gram_norms(pairs)
        key = sequence._memory_key(x, torch.float32, "share")
        assert sequence._GRAMS[key] == 3
        assert sequence._plan(x, pairs[1][1], torch.float32) == sequence.norm_plan(T, 256, 128, input_share=3)
        shared = [sequence_parts(A, G, w)[0] for A, G, w in pairs]
    for a, s, (A, G, _) in zip(alone, shared, pairs):
        exact = _exact(A, G)
        scale = (A.to(F64).norm(dim=2) * G.to(F64).norm(dim=2)).sum(1) ** 2
        for got in (a, s):
            assert bool((got >= exact).all())
            assert bool((got - exact <= 2e-7 * 256 * scale).all())


def test_gram_norms_of_long_layers_equal_each_alone(monkeypatch):
    gen = torch.Generator().manual_seed(9)
    B, T = 3, 8
    x = torch.randn(B, T, 40, generator=gen)
    pairs = [(x, torch.randn(B, T, 32, generator=gen), torch.float32), (x, torch.randn(B, T, 32, generator=gen),
             torch.float32), (torch.randn(B, T, 48, generator=gen), torch.randn(B, T, 36, generator=gen), torch.float32)]
    for A, G, _ in pairs:
        assert sequence.norm_plan(T, A.shape[2], G.shape[2]) == "gram"
    calls = []
    each = sequence._gram_each
    monkeypatch.setattr(sequence, "_gram_each", lambda jobs, *a: calls.append(len(jobs)) or each(jobs, *a))
    alone = [sequence_parts(A, G, w)[0] for A, G, w in pairs]
    with step_cache():
        gram_norms(pairs)
        assert calls == [3] and all(sequence._GRAMS.get((id(A), id(G), w)) is not None for A, G, w in pairs)
        together = [sequence_parts(A, G, w)[0] for A, G, w in pairs]
    for a, t, (A, G, _) in zip(alone, together, pairs):
        assert torch.allclose(t, a, rtol=1e-12, atol=0)
        exact = _exact(A, G)
        s = (A.to(F64).norm(dim=2) * G.to(F64).norm(dim=2)).sum(1)
        assert bool((t >= exact).all()) and bool((t - exact <= 2e-7 * 48 * s * s).all())


@pytest.mark.parametrize("chunk", [sequence.CHUNK_FLOATS, 3 * 7 * (12 + 5)])
def test_weighted_sum_of_transposed_views(chunk, monkeypatch):
    """The convolution rule's ``(B, T, d)`` views of ``(B, d, T)`` tensors: copies a chunk of examples at a time
    (here 3 of 8, or all at once), each chunk one product, = the float64 sum of ``f_i G_i^T A_i``."""
    monkeypatch.setattr(sequence, "CHUNK_FLOATS", chunk)
    gen = torch.Generator().manual_seed(7)
    B, T = 8, 7
    for d_in, d_out in ((12, 5), (5, 12)):  # the factors scale G, then A
        A = torch.randn(B, d_in, T, generator=gen).transpose(1, 2)
        G = torch.randn(B, d_out, T, generator=gen).transpose(1, 2)
        f = torch.rand(B, generator=gen, dtype=F64)
        got = sequence_weighted_sum(A, G, f, torch.float32)
        exact = torch.einsum("b,bto,bti->oi", f, G.to(F64), A.to(F64))
        assert got.dtype == torch.float32 and got.shape == (d_out, d_in)
        assert torch.allclose(got.to(F64), exact, rtol=1e-5, atol=1e-5)
        contiguous = sequence_weighted_sum(A.contiguous(), G.contiguous(), f, torch.float32)
        assert torch.allclose(got, contiguous, rtol=1e-5, atol=1e-5)


def test_step_adds_noise_without_writing_the_clippers_sums(monkeypatch):
    """One loop backward, then step(): each ``.grad`` equals ``(S + w) * (1 / normalizer)`` computed here per
    parameter (the same float32 operations), and the sums ``collect`` returned keep their values."""
    import torch.nn.functional as F

    from dpmf.sampling import FixedOrderSampling
    from dpmf.strategies import Identity
    from dpmf.training.torch import make_private

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3))
    data = torch.utils.data.TensorDataset(torch.randn(12, 4, 5), torch.randint(0, 3, (12,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the parameters stay, .grad is what step formed
    run = make_private(model, opt, data, strategy=Identity(2), sampling=FixedOrderSampling(1, 2), noise_multiplier=1.0,
                       delta=1e-5, max_grad_norm=0.5, seed=1, accountant="unamplified")
    clipper, optimizer = run.optimizer.clipper, run.optimizer
    handed = []
    collect = clipper.collect

    def recording():
        sums, norms, backwards = collect()
        handed.append(([s.clone() for s in sums], sums))
        return sums, norms, backwards

    monkeypatch.setattr(clipper, "collect", recording)
    draws = []
    draw = optimizer.noise.draw
    monkeypatch.setattr(optimizer.noise, "draw", lambda: draws.append(draw()) or draws[-1])
    for x, y in run.data_loader:
        optimizer.zero_grad()
        F.cross_entropy(run.module(x).mean(1), y).backward()
        optimizer.step()
        (before, sums), w = handed[-1], optimizer.noise.unflatten(draws[-1])
        scale = 1.0 / optimizer.plan.normalizer
        for p, s0, s, wp in zip(optimizer.params, before, sums, w):
            assert torch.equal(s, s0)  # the clipper's tensors were not written
            assert torch.equal(p.grad, (s0 + wp.to(s0.dtype)) * scale)
    assert len(handed) == 2


def _steps(flat: bool) -> tuple:
    """Two loop steps of a small private model: ``(the .grad of each step, the optimizer)``; ``flat=False``
    forces the per-parameter path of ``DPOptimizer.step`` (no one buffer)."""
    import torch.nn.functional as F

    from dpmf.sampling import FixedOrderSampling
    from dpmf.strategies import Identity
    from dpmf.training.torch import make_private

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3))
    data = torch.utils.data.TensorDataset(torch.randn(12, 4, 5), torch.randint(0, 3, (12,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = make_private(model, opt, data, strategy=Identity(2), sampling=FixedOrderSampling(1, 2), noise_multiplier=1.0,
                       delta=1e-5, max_grad_norm=0.5, seed=1, accountant="unamplified")
    optimizer = run.optimizer
    assert optimizer._flat_noise  # the noise is laid out as the parameters
    optimizer._flat_noise = flat
    grads = []
    for x, y in run.data_loader:
        optimizer.zero_grad()
        F.cross_entropy(run.module(x).mean(1), y).backward()
        optimizer.step()
        grads.append([p.grad for p in optimizer.params])
    return grads, optimizer


def test_step_on_one_buffer_equals_per_parameter():
    """``DPOptimizer`` copies the clipped sums into one buffer (each ``.grad`` a view of it, in order) and adds
    and scales the noise there in two elementwise passes: bitwise the numbers of the per-parameter passes,
    over two steps (the second step's parameters depend on the first's gradients)."""
    flat, _ = _steps(True)
    each, _ = _steps(False)
    for got, want in zip(flat, each):
        base = got[0]._base
        assert base is not None and all(g._base is base for g in got)  # one buffer
        assert base.numel() == sum(g.numel() for g in got)
        assert all(w._base is None for w in want)  # the per-parameter path: own tensors
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_copied_sums_are_copies():
    """``optimizer._copied``: new memory whatever the sums are (views of one tensor, as a rule may hand out; a
    single sum; mixed dtypes, which keep one tensor each), values and dtypes kept."""
    from dpmf.training.torch.optimizer import _copied

    held = torch.randn(4, 6)
    views = [held[:, :3], held[1], held.t()]  # a rule's sums that are views of a tensor it keeps
    for sums, flat_ok, one_buffer in [(views, True, True), (views, False, False), ([held], True, False),
                                      ([held, held.double()], True, False)]:
        flat, copies = _copied(sums, flat_ok)
        assert (flat is not None) == one_buffer
        for s, c in zip(sums, copies):
            assert torch.equal(c, s) and c.dtype == s.dtype and c.shape == s.shape
            assert c.untyped_storage().data_ptr() != held.untyped_storage().data_ptr()
        before = held.clone()
        for c in copies:
            c.add_(1.0)
        assert torch.equal(held, before)  # writing the copies leaves the rule's tensor alone
    flat, copies = _copied([held, held.to_sparse()], True)  # a sparse sum: one tensor each
    assert flat is None and copies[1].layout == torch.sparse_coo and torch.equal(copies[1].to_dense(), held)
