"""Ghost mode (``grad_sample_mode="ghost"``): clipped sums equal the naive per-example loop.

The oracle is the definition: each example alone (a batch of 1) through ``torch.autograd.grad`` in
float64, its norm over all trainable parameters, ``f_i = min(1, C (1 - margin) / n_i)``, and
``sum_i f_i g_i``. Every covered layer, both branches of the Gram/materialized rule, the fallback
for unknown layers, and a model mixing them on padded sequences with dict inputs.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpmf.errors import DPMFError, NumericalError, UnsupportedConfigurationError  # noqa: E402
from dpmf.training.torch.clipping import clip_factors  # noqa: E402
from dpmf.training.torch.ghost import GhostClipper  # noqa: E402
from dpmf.training.torch.ghost import joint, sequence  # noqa: E402
from dpmf.training.torch.ghost.sequence import norm_plan, use_gram  # noqa: E402

F = torch.nn.functional


def call_model(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


def slice_inputs(inputs, i):
    if isinstance(inputs, dict):
        return {k: v[i : i + 1] for k, v in inputs.items()}
    if isinstance(inputs, tuple):
        return tuple(v[i : i + 1] for v in inputs)
    return inputs[i : i + 1]


def naive(model, loss_fn, inputs, targets, clip, margin):
    """``(sum_i f_i g_i, n_i)`` by one autograd call per example (the definition)."""
    params = [p for p in model.parameters() if p.requires_grad]
    B = next(iter(inputs.values())).shape[0] if isinstance(inputs, dict) else (
        inputs[0].shape[0] if isinstance(inputs, tuple) else inputs.shape[0])
    per, norms = [], []
    for i in range(B):
        out = call_model(model, slice_inputs(inputs, i))
        loss = loss_fn(out, targets[i : i + 1])
        g = torch.autograd.grad(loss, params, allow_unused=True)
        g = [torch.zeros_like(p) if gi is None else (gi.to_dense() if gi.is_sparse else gi) for gi, p in zip(g, params)]
        per.append(g)
        norms.append(torch.sqrt(sum((gi.double() ** 2).sum() for gi in g)))
    norms = torch.stack(norms)
    f = clip_factors(norms, clip, margin)
    sums = [sum(f[i] * per[i][k].double() for i in range(B)) for k in range(len(params))]
    return sums, norms


def check_equal(model, loss_fn, inputs, targets, clip=1.0, rtol=1e-9, reduction="mean", **kw):
    ghost = GhostClipper(model, loss_fn, clip, loss_reduction=reduction, **kw)
    try:
        got = ghost.clipped_sum(inputs, targets)
    finally:
        ghost.close()
    want_sums, want_norms = naive(model, _per_example(loss_fn, reduction), inputs, targets, clip, ghost.margin)
    # ghost norms are upper bounds with explicit rounding terms: equal to float64 precision here
    assert torch.allclose(got.norms, want_norms, rtol=rtol, atol=1e-12), ((got.norms - want_norms) / want_norms)
    assert (got.norms >= want_norms * (1 - 1e-12)).all()
    for name, a, b in zip(ghost.param_names, got.grads, want_sums):
        assert torch.allclose(a.double(), b, rtol=rtol * 10, atol=1e-10), name
    return got


def _per_example(loss_fn, reduction):
    # the oracle sees one example: a mean and a sum over a batch of 1 agree
    return loss_fn


def ce(out, y):
    return F.cross_entropy(out, y)


def ce_sum(out, y):
    return F.cross_entropy(out, y, reduction="sum")


def mse_seq(out, y):  # per-example: sum over positions and features, mean over the batch
    return ((out - y) ** 2).flatten(1).sum(1).mean()


torch.set_default_dtype(torch.float64)


@pytest.fixture(autouse=True)
def _float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(old)


torch.set_default_dtype(torch.float32)


# ---------------------------------------------------------------------------- one layer at a time
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_linear_vector_input(reduction):
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x, y = torch.randn(7, 6) * 3, torch.randint(0, 3, (7,))
    check_equal(model, ce if reduction == "mean" else ce_sum, x, y, clip=0.7, reduction=reduction)


@pytest.mark.parametrize("shape, d_in, d_out", [((5, 4), 16, 16), ((9,), 3, 2), ((2, 3, 4), 4, 5)])
def test_linear_sequence_both_branches(shape, d_in, d_out):
    T = 1
    for s in shape:
        T *= s
    model = torch.nn.Linear(d_in, d_out)
    x = torch.randn(6, *shape, d_in)
    y = torch.randn(6, *shape, d_out)
    check_equal(model, mse_seq, x, y, clip=2.0)


def test_gram_rule_takes_both_branches():
    assert use_gram(4, 16, 16) and not use_gram(9, 3, 2)


def test_norm_plan_by_cost_and_memory():
    assert norm_plan(128, 768, 256) == "gram"  # GPT-2 width 256 at T = 128: P would outgrow A and G
    assert norm_plan(128, 128, 128) == "keep"  # width 128: per-example gradients are cheaper and fit
    # kept, P would take 3/4 of A's and G's memory; of the other two, general Grams (another device) cost more
    # than materializing, the CPU's symmetric ones less (measured 6.8 vs 7.6 ms at B 16, issue 52)
    assert norm_plan(128, 128, 384, syrk=False) == "materialize"
    assert norm_plan(128, 128, 384) == "gram"
    # k/v projections of a Llama block (256 -> 128): their input's Gram, formed once for q, k and v
    assert norm_plan(128, 256, 128, syrk=False) == "materialize"
    assert norm_plan(128, 256, 128, syrk=False, input_share=3) == "gram"
    assert norm_plan(128, 256, 8) == "keep"  # a LoRA adapter
    assert norm_plan(17, 128, 128) == "gram"  # ViT's 17 tokens
    assert norm_plan(2, 1, 1) == "materialize"  # (the passes cost more than the products)
    assert norm_plan(128, 4096, 256, keep=False, float64=True) == "gram"  # the tied GPT-2 weight's joint form


@pytest.mark.parametrize("plan", ["gram", "keep", "materialize"])
def test_every_norm_plan_equals_the_reference(plan, monkeypatch):
    """Each way to a sequence layer's norms and clipped sum (``sequence.norm_plan``: the Gram form, the
    per-example gradients kept for the sum, materialized for the norms only) equals the float64 loop, on
    Linear layers (contiguous ``A``, ``G``) and a grouped convolution (transposed views)."""
    monkeypatch.setattr(sequence, "norm_plan", lambda *args, **kw: plan)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    check_equal(model, mse_seq, torch.randn(6, 4, 5), torch.randn(6, 4, 3), clip=0.8)
    conv = torch.nn.Sequential(torch.nn.Conv2d(4, 6, 3, groups=2, padding=1), torch.nn.Flatten(), torch.nn.LazyLinear(3))
    x = torch.randn(5, 4, 6, 5)
    conv(x)
    check_equal(conv, ce, x, torch.randint(0, 3, (5,)))


@pytest.mark.parametrize("plan", ["gram", "materialize"])
def test_every_joint_plan_equals_the_reference(plan, monkeypatch):
    """The joint norm of a tied weight and a twice-called layer, by the stacked Grams and by the float64
    materialized sum, equals the float64 loop."""
    monkeypatch.setattr(joint, "norm_plan", lambda *args, **kw: plan)
    model = TiedLM(11, 6, 0, True)
    x, y = torch.randint(0, 11, (5, 7)), torch.randint(0, 11, (5, 7))
    check_equal(model, lm_sum, x, y, clip=0.5)


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(padding="same", dilation=2),
                                dict(groups=2, padding=1), dict(padding=1, padding_mode="reflect"),
                                dict(bias=False, stride=(2, 1))])
def test_conv2d(kw):
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 6, 3, **kw), torch.nn.Flatten(), torch.nn.LazyLinear(3))
    x = torch.randn(5, 4, 8, 7)
    model(x)  # materialize the lazy layer
    check_equal(model, ce, x, torch.randint(0, 3, (5,)))


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=2, dilation=2), dict(groups=3, padding="same"),
                                dict(padding=1, padding_mode="circular")])
def test_conv1d(kw):
    model = torch.nn.Sequential(torch.nn.Conv1d(3, 6, 4 if kw.get("padding") != "same" else 3, **kw),
                                torch.nn.Flatten(), torch.nn.LazyLinear(2))
    x = torch.randn(6, 3, 20)
    model(x)
    check_equal(model, ce, x, torch.randint(0, 2, (6,)))


def test_conv_large_positions_materialized_branch():
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 2), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    x = torch.randn(3, 1, 12, 12)  # T = 121 positions, d_in d_out = 8: materialized
    model(x)
    assert not use_gram(121, 4, 2)
    check_equal(model, ce, x, torch.randint(0, 2, (3,)))


@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding_with_repeats_and_padding(padding_idx):
    emb = torch.nn.Embedding(7, 5, padding_idx=padding_idx)
    model = torch.nn.Sequential(emb, torch.nn.Flatten(), torch.nn.Linear(30, 2))
    ids = torch.tensor([[1, 1, 1, 2, 0, 0], [3, 4, 3, 0, 0, 0], [0, 0, 0, 0, 0, 0], [6, 5, 4, 3, 2, 1]])
    check_equal(model, ce, ids, torch.tensor([0, 1, 1, 0]))


def test_embedding_max_norm_falls_back_exactly():
    emb = torch.nn.Embedding(7, 5, scale_grad_by_freq=True)
    model = torch.nn.Sequential(emb, torch.nn.Flatten(), torch.nn.Linear(15, 2))
    ids = torch.tensor([[1, 1, 2], [3, 4, 3], [6, 6, 6]])
    check_equal(model, ce, ids, torch.tensor([0, 1, 1]))


@pytest.mark.parametrize("norm", ["layer", "group", "rms", "layer2d"])
def test_normalization_layers(norm):
    if norm == "layer":
        layer, x = torch.nn.LayerNorm(6), torch.randn(5, 4, 6) * 2 + 1
    elif norm == "layer2d":
        layer, x = torch.nn.LayerNorm((4, 6)), torch.randn(5, 4, 6)
    elif norm == "group":
        layer, x = torch.nn.GroupNorm(2, 6), torch.randn(5, 6, 3, 2)
    else:
        layer, x = torch.nn.RMSNorm(6), torch.randn(5, 4, 6)
    model = torch.nn.Sequential(layer, torch.nn.Flatten(), torch.nn.LazyLinear(2))
    model(x)
    check_equal(model, ce, x, torch.randint(0, 2, (5,)))


# ---------------------------------------------------------------------------- fallback
class Scale(torch.nn.Module):
    """A layer no rule knows: y = x * w + b (elementwise, per feature)."""

    def __init__(self, d):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(d))
        self.b = torch.nn.Parameter(torch.randn(d))

    def forward(self, x):
        return x * self.w + self.b


class WithOwnParameter(torch.nn.Module):
    """A parameter held by a container next to children (positional encoding style)."""

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Parameter(torch.randn(4, 3))
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(torch.tanh(x + self.pos)).sum(1)


def test_fallback_for_unknown_layer():
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), Scale(5), torch.nn.Linear(5, 2))
    ghost = GhostClipper(model, ce, 1.0)
    ghost.clipped_sum(torch.randn(6, 4), torch.randint(0, 2, (6,)))  # x * w: not a broadcast addition
    assert ghost.covered_layers() == {"0": "ghost", "1": "fallback", "2": "ghost"}
    ghost.close()
    check_equal(model, ce, torch.randn(6, 4), torch.randint(0, 2, (6,)))


# torch's note that vmap has no batching rule for CPU flash attention (the fallback is slower, not wrong)
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
def test_fallback_for_container_parameter_and_attention():
    check_equal(WithOwnParameter(), ce, torch.randn(5, 4, 3), torch.randint(0, 2, (5,)))
    attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.head = attn, torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.attn(x, x, x, need_weights=False)[0].mean(1))

    check_equal(Attn(), ce, torch.randn(4, 5, 8), torch.randint(0, 2, (4,)))


# ---------------------------------------------------------------------------- a mixed model
class TinySeqModel(torch.nn.Module):
    """Embedding + Conv1d + LayerNorm + Linear on padded sequences, dict inputs, a masked loss."""

    def __init__(self, vocab=11, d=8):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d, padding_idx=0)
        self.pos = torch.nn.Embedding(6, d)
        self.conv = torch.nn.Conv1d(d, d, 3, padding=1)
        self.norm = torch.nn.LayerNorm(d)
        self.mix = torch.nn.Linear(d, d)
        self.out = torch.nn.Linear(d, vocab)

    def forward(self, input_ids, attention_mask):
        T = input_ids.shape[1]
        h = self.emb(input_ids) + self.pos(torch.arange(T).expand_as(input_ids))
        h = h * attention_mask.unsqueeze(-1)
        h = h + self.conv(h.transpose(1, 2)).transpose(1, 2)
        h = self.mix(torch.relu(self.norm(h)))
        return self.out(h)


def masked_lm_loss(logits, batch_targets):
    labels, mask = batch_targets[:, 0], batch_targets[:, 1].to(logits.dtype)
    tok = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
    per_seq = (tok * mask).sum(1) / mask.sum(1).clamp_min(1)
    return per_seq.mean()


def test_mixed_sequence_model_with_padding_and_dict_inputs():
    model = TinySeqModel()
    ids = torch.randint(1, 11, (5, 6))
    mask = torch.ones(5, 6)
    ids[0, 4:], mask[0, 4:] = 0, 0
    ids[3, 2:], mask[3, 2:] = 0, 0
    labels = torch.randint(0, 11, (5, 6))
    targets = torch.stack([labels, mask.long()], 1)
    got = check_equal(model, masked_lm_loss, {"input_ids": ids, "attention_mask": mask}, targets, clip=0.5)
    # the padded positions contribute nothing: changing their ids changes no clipped sum
    ids2 = ids.clone()
    ids2[0, 4:] = 0
    assert got.norms.shape == (5,)


def test_padding_positions_contribute_nothing():
    model = TinySeqModel()
    ids = torch.randint(1, 11, (3, 6))
    mask = torch.ones(3, 6)
    mask[1, 3:] = 0
    labels = torch.randint(0, 11, (3, 6))
    g = GhostClipper(model, masked_lm_loss, 100.0)
    a = g.clipped_sum({"input_ids": ids, "attention_mask": mask}, torch.stack([labels, mask.long()], 1))
    ids[1, 3:] = torch.randint(1, 11, (3,))
    labels[1, 3:] = torch.randint(0, 11, (3,))
    b = g.clipped_sum({"input_ids": ids, "attention_mask": mask}, torch.stack([labels, mask.long()], 1))
    # the word embedding rows of the padded tokens receive h * 0: nothing changes
    for name, x, y in zip(g.param_names, a.grads, b.grads):
        assert torch.allclose(x, y, atol=1e-12), name


def test_model_returning_its_own_loss():
    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x, labels):
            return {"loss": F.cross_entropy(self.lin(x), labels), "logits": None}

    model = WithLoss()
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    g = GhostClipper(model, None, 0.3)
    got = g.clipped_sum({"x": x, "labels": y})
    sums, norms = naive(torch.nn.Sequential(model.lin), ce, x, y, 0.3, g.margin)
    assert torch.allclose(got.norms, norms)
    for a, b in zip(got.grads, sums):
        assert torch.allclose(a, b)


# ---------------------------------------------------------------------------- refusals
class TiedLM(torch.nn.Module):
    """Input and output embeddings tied, a Linear called twice: every cross term of the joint norm."""

    def __init__(self, V=7, d=5, padding_idx=None, twice=True):
        super().__init__()
        self.emb = torch.nn.Embedding(V, d, padding_idx=padding_idx)
        self.mid = torch.nn.Linear(d, d)
        self.head = torch.nn.Linear(d, V, bias=False)
        self.head.weight = self.emb.weight
        self.twice = twice

    def forward(self, x):
        h = torch.tanh(self.mid(self.emb(x)))
        if self.twice:
            h = torch.tanh(self.mid(h))
        return self.head(h)


def lm_sum(out, y):  # per-sequence sum of token losses, mean over the batch
    return F.cross_entropy(out.transpose(1, 2), y, reduction="none").sum(1).mean()


@pytest.mark.parametrize("V, d, padding_idx, twice", [(7, 5, None, True), (7, 5, 0, True), (40, 16, None, True),
                                                      (40, 16, 3, False)])
def test_tied_weights_and_reused_layer_exact(V, d, padding_idx, twice):
    # (7, 5): T = 5 (10 stacked) positions, the materialized joint form; (40, 16): the Gram form
    model = TiedLM(V, d, padding_idx, twice)
    x, y = torch.randint(0, V, (6, 5)), torch.randint(0, V, (6, 5))
    x[0, :2] = 3
    g = GhostClipper(model, lm_sum, 0.5)
    assert g.shared_parameters() == {"emb.weight": ["emb", "head"]}
    g.close()
    check_equal(model, lm_sum, x, y, clip=0.5)


def test_tied_cross_term_matters():
    # the joint norm is not the root of the per-layer squares: with the cross term dropped it differs
    model = TiedLM(40, 16, None, False)
    x, y = torch.randint(0, 40, (4, 6)), torch.randint(0, 40, (4, 6))
    _, norms = naive(model, lm_sum, x, y, 1e9, 0.0)
    untied = TiedLM(40, 16, None, False)
    untied.load_state_dict(model.state_dict())
    untied.head.weight = torch.nn.Parameter(model.emb.weight.detach().clone())
    _, separate = naive(untied, lm_sum, x, y, 1e9, 0.0)
    assert not torch.allclose(norms, separate, rtol=1e-3)
    check_equal(model, lm_sum, x, y, clip=1e9)


class SharedPositions(torch.nn.Module):
    """Position ids of batch 1 (GPT-2's) and without a batch dimension, broadcast over the batch."""

    def __init__(self):
        super().__init__()
        self.emb, self.pos, self.out = torch.nn.Embedding(7, 4), torch.nn.Embedding(5, 4), torch.nn.Linear(4, 7)
        self.const = torch.nn.Linear(3, 4)

    def forward(self, x):
        T = x.shape[1]
        h = self.emb(x) + self.pos(torch.arange(T).unsqueeze(0)) + self.pos(torch.arange(T))
        return self.out(h + self.const(torch.ones(1, T, 3)))


@pytest.mark.parametrize("B", [1, 6])
def test_inputs_shared_by_the_batch_are_expanded(B):
    model = SharedPositions()
    x, y = torch.randint(0, 7, (B, 5)), torch.randint(0, 7, (B, 5))
    check_equal(model, lm_sum, x, y, clip=0.5)


def test_unbatched_input_refusal_names_the_layer():
    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.pos = torch.nn.Linear(3, 3), torch.nn.Linear(2, 3)

        def forward(self, x):
            return self.lin(x) @ self.pos(torch.ones(3, 2))  # a (3, 2) input, its output multiplying the batch

    g = GhostClipper(Bad(), ce, 1.0)
    with pytest.raises(UnsupportedConfigurationError, match="'pos'") as info:
        g.clipped_sum(torch.randn(6, 3), torch.randint(0, 3, (6,)))
    assert "MultiheadAttention" not in str(info.value)


def test_inplace_on_captured_input_refused_and_inplace_relu_after_linear_exact():
    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)

        def forward(self, x):
            h = self.a(x)
            out = self.b(h)
            h.mul_(2)  # modifies b's captured input after its forward
            return out + h.sum(1, keepdim=True) * 0

    g = GhostClipper(Bad(), ce, 1.0)
    with pytest.raises((DPMFError, RuntimeError), match="in ?place"):  # torch's own check, or dpmf's
        g.clipped_sum(torch.randn(4, 3), torch.randint(0, 2, (4,)))
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(inplace=True), torch.nn.Linear(4, 2))
    check_equal(model, ce, torch.randn(6, 3), torch.randint(0, 2, (6,)))


def test_batchnorm_in_training_refused():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    g = GhostClipper(model, ce, 1.0)
    with pytest.raises(UnsupportedConfigurationError, match="BatchNorm"):
        g.clipped_sum(torch.randn(4, 3), torch.randint(0, 2, (4,)))


def test_non_finite_gradient_raises():
    model = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    x[2, 1] = float("nan")
    with pytest.raises(NumericalError, match="1 of 4"):
        GhostClipper(model, ce, 1.0).clipped_sum(x, torch.randint(0, 2, (4,)))


def test_non_finite_examples_skipped_on_request():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    bad = x.clone()
    bad[1, 2] = float("inf")
    g = GhostClipper(model, ce_sum, 0.5, loss_reduction="sum", nonfinite="skip")
    got = g.clipped_sum(bad, y)
    keep = [0, 2, 3, 4]
    want = GhostClipper(model, ce_sum, 0.5, loss_reduction="sum").clipped_sum(x[keep], y[keep])
    assert g.skipped_nonfinite == 1 and not torch.isfinite(got.norms[1])
    for a, b in zip(got.grads, want.grads):
        assert torch.allclose(a, b)


def test_empty_batch_gives_zero_sums():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    got = GhostClipper(model, ce_sum, 1.0).clipped_sum(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    assert got.norms.shape == (0,)
    assert all(float(s.abs().max()) == 0.0 for s in got.grads)


def test_chunks_and_weights():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    x, y = torch.randn(7, 3) * 4, torch.randint(0, 2, (7,))
    w = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 0.25, 1.0])
    whole = GhostClipper(model, ce, 0.5).clipped_sum(x, y, weights=w)
    chunked = GhostClipper(model, ce, 0.5, chunk_size=3).clipped_sum(x, y, weights=w)
    assert torch.allclose(whole.norms, chunked.norms)
    for a, b in zip(whole.grads, chunked.grads):
        assert torch.allclose(a, b)


def test_layer_shared_across_the_batch_expanded():
    """A position embedding called once and broadcast over the batch runs on ids expanded to the batch."""

    class Broadcast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = torch.nn.Embedding(4, 3)
            self.lin = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.lin(x + self.pos(torch.arange(4))).sum(1)

    check_equal(Broadcast(), ce, torch.randn(5, 4, 3), torch.randint(0, 2, (5,)))


def test_sparse_embedding_ghost_rule_and_clear_refusal_elsewhere():
    from dpmf.training.torch import PerExampleClipper

    emb = torch.nn.Embedding(10, 4, sparse=True)
    model = torch.nn.Sequential(emb, torch.nn.Flatten(), torch.nn.Linear(12, 2))
    ids, y = torch.randint(0, 10, (5, 3)), torch.randint(0, 2, (5,))
    ids[0] = 4  # a row looked up three times
    check_equal(model, ce, ids, y, clip=0.3)
    with pytest.raises(UnsupportedConfigurationError, match="sparse=False"):
        PerExampleClipper(model, ce, 1.0)


@pytest.mark.parametrize("case", ["tied", "inplace_relu", "positions", "conv"])
def test_loop_backward_with_detached_parameters_exact(case):
    """The loop form (``loss.backward()``) runs layers with built-in rules on detached parameters, so
    autograd forms no batch gradient for them; the clipped sums still equal the definition, and the
    parameters are whole again after the forward."""
    if case == "tied":
        model, loss_fn = TiedLM(40, 16, 0, True), lm_sum
        x, y = torch.randint(0, 40, (5, 6)), torch.randint(0, 40, (5, 6))
    elif case == "inplace_relu":
        model, loss_fn = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(inplace=True),
                                             torch.nn.Linear(4, 2)), ce
        x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    elif case == "positions":
        model, loss_fn = SharedPositions(), lm_sum
        x, y = torch.randint(0, 7, (4, 5)), torch.randint(0, 7, (4, 5))
    else:
        model = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3), torch.nn.GroupNorm(2, 4), torch.nn.Flatten(),
                                    torch.nn.Linear(24, 2))
        loss_fn, x, y = ce, torch.randn(5, 3, 8), torch.randint(0, 2, (5,))
    g = GhostClipper(model, None, 0.5)
    loss_fn(model(x), y).backward()
    sums, norms, backwards = g.collect()
    assert backwards == 1
    assert all(p is None or isinstance(p, torch.nn.Parameter) for m in model.modules() for p in m._parameters.values())
    assert all(p.grad is None for p in model.parameters())  # no batch gradient was formed
    g.close()
    want_sums, want_norms = naive(model, loss_fn, x, y, 0.5, g.margin)
    assert torch.allclose(norms, want_norms, rtol=1e-9) and (norms >= want_norms * (1 - 1e-12)).all()
    for name, a, b in zip(g.param_names, sums, want_sums):
        assert torch.allclose(a.double(), b, rtol=1e-8, atol=1e-10), name
