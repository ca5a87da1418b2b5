"""Ghost mode on the models people fine-tune, built here from ``transformers`` configurations (no
download): GPT-2 with tied and untied embeddings (``Conv1D`` layers, position ids of batch 1), a
Llama-style model (``LlamaRMSNorm``, rotary positions, grouped-query attention, padded sequences), and
PEFT LoRA adapters on it. Trained in the loop users already have (``out = model(**batch)``, a
per-example loss from the logits, ``loss.backward()``); the clipped sums must equal a float64
per-example reference (each example alone through ``torch.autograd.grad``), and no ghost norm may be
below the reference's.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dpmf.training.torch.clipping import clip_factors  # noqa: E402
from dpmf.training.torch.ghost import GhostClipper  # noqa: E402

F = torch.nn.functional
V, B, T = 97, 4, 10


pytestmark = pytest.mark.usefixtures("quiet_transformers")  # (tests/training/torch/conftest.py)


def gpt2(tie: bool, dtype=torch.float64):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=V, n_positions=32, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=tie, bos_token_id=0,
                                  eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).to(dtype)


def llama(tie: bool = False, dtype=torch.float64):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   tie_word_embeddings=tie, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg).to(dtype)


def batch(padded: bool):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    if padded:  # right padding of different lengths
        for i, n in enumerate([T, T - 3, 4, T - 1]):
            ids[i, n:], mask[i, n:] = 0, 0
    return {"input_ids": ids, "attention_mask": mask}


def per_example_loss(logits, b):
    """Each sequence's mean next-token loss over its own (unpadded) positions, ``(B,)``."""
    keep = (b["attention_mask"][:, 1:] * b["attention_mask"][:, :-1]).to(logits.dtype)
    tok = F.cross_entropy(logits[:, :-1].transpose(1, 2), b["input_ids"][:, 1:], reduction="none")
    return (tok * keep).sum(1) / keep.sum(1).clamp_min(1)


def reference(model, b, clip, margin):
    """``(sum_i f_i g_i, n_i)`` with each example alone through autograd, float64."""
    params = [p for p in model.parameters() if p.requires_grad]
    per, norms = [], []
    for i in range(B):
        one = {k: v[i : i + 1] for k, v in b.items()}
        grads = torch.autograd.grad(per_example_loss(model(**one).logits, one).sum(), params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g.double() for g, p in zip(grads, params)]
        per.append(grads)
        norms.append(torch.sqrt(sum((g * g).sum() for g in grads)))
    norms = torch.stack(norms)
    f = clip_factors(norms, clip, margin)
    return [sum(f[i] * per[i][k] for i in range(B)) for k in range(len(params))], norms


def ghost_loop(model, b, clip):
    """The Opacus-style loop on ``model(**batch)``; returns the clipper's sums and norms."""
    clipper = GhostClipper(model, None, clip)
    try:
        out = model(**b)
        per_example_loss(out.logits, b).mean().backward()
        sums, norms, backwards = clipper.collect()
        assert backwards == 1
        return clipper, sums, norms
    finally:
        clipper.close()


def check_against_reference(model, b, clip, rtol=1e-4):
    clipper, sums, norms = ghost_loop(model, b, clip)
    want_sums, want_norms = reference(model, b, clip, clipper.margin)
    assert (norms >= want_norms * (1 - 1e-12)).all(), (norms - want_norms) / want_norms
    assert torch.allclose(norms, want_norms, rtol=rtol)
    assert (want_norms > clip).sum() >= 2 and (want_norms < clip).sum() >= 1  # both sides of the clip
    flat = torch.cat([s.double().flatten() for s in sums])
    want = torch.cat([s.flatten() for s in want_sums])
    assert float((flat - want).norm() / want.norm()) < rtol
    for name, s, w in zip(clipper.param_names, sums, want_sums):
        assert torch.allclose(s.double(), w, rtol=rtol, atol=rtol * float(want.abs().max())), name
    return clipper


@pytest.mark.parametrize("tie", [True, False])
def test_gpt2_tied_and_untied_match_the_reference(tie):
    model = gpt2(tie)
    b = batch(padded=False)
    clipper = check_against_reference(model, b, clip=_median_norm(model, b))
    assert clipper.fallback_layers() == []  # Conv1D, LayerNorm, Embedding, Linear: all ghost rules
    shared = clipper.shared_parameters()
    assert shared == ({"transformer.wte.weight": ["transformer.wte", "lm_head"]} if tie else {})


@pytest.mark.parametrize("tie, padded", [(False, True), (True, False)])
def test_llama_gqa_matches_the_reference(tie, padded):
    model = llama(tie)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    b = batch(padded=padded)
    clipper = check_against_reference(model, b, clip=_median_norm(model, b))
    assert clipper.fallback_layers() == []  # LlamaRMSNorm recognized and checked


def test_lora_adapters_only_match_the_reference():
    peft = pytest.importorskip("peft")
    base = llama()
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                      lora_dropout=0.0))
    for p in model.parameters():  # LoRA B starts at zero: move it so that every gradient is non-trivial
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.1)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    b = batch(padded=True)
    clipper = check_against_reference(model, b, clip=_median_norm(model, b))
    assert len(clipper.params) == len(trainable) == 8  # 2 layers x (q, v) x (A, B)
    assert clipper.fallback_layers() == []


def test_float32_gpt2_norms_are_upper_bounds():
    m32, m64 = gpt2(True, torch.float32), gpt2(True, torch.float64)
    b = batch(padded=False)
    clipper, sums, norms = ghost_loop(m32, b, clip=1e9)
    _, want = reference(m64, b, 1e9, 0.0)
    assert (norms >= want).all() and torch.allclose(norms, want, rtol=1e-3)


def _median_norm(model, b):
    """A clip norm between the examples' norms, so that some are clipped and some are not."""
    _, norms = reference(model, b, 1e9, 0.0)
    return float(norms.median())


class _Sequences(torch.utils.data.Dataset):
    def __init__(self, n=12):
        g = torch.Generator().manual_seed(2)
        self.ids = torch.randint(1, V, (n, T), generator=g)
        self.mask = torch.ones(n, T, dtype=torch.long)
        self.mask[::3, 6:] = 0

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i]}


@pytest.mark.parametrize("kind", ["gpt2", "lora"])
def test_make_private_trains_in_the_opacus_loop(kind):
    from dpmf.sampling import FixedOrderSampling
    from dpmf.strategies import Identity
    from dpmf.training.torch import make_private

    if kind == "lora":
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(llama(dtype=torch.float32), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    else:
        model = gpt2(True, torch.float32)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    run = make_private(model, opt, _Sequences(), strategy=Identity(3), sampling=FixedOrderSampling(1, 3),
                       noise_multiplier=1.0, delta=1e-5, max_grad_norm=1.0, seed=0, accountant="unamplified")
    steps = 0
    for b in run.data_loader:
        run.optimizer.zero_grad()
        per_example_loss(run.module(**b).logits, b).mean().backward()
        run.optimizer.step()
        steps += 1
    assert steps == 3
    after = [p.detach() for p in model.parameters() if p.requires_grad]
    assert all(torch.isfinite(a).all() for a in after) and any(not torch.equal(a, b) for a, b in zip(after, before))
    training = run.privacy.report().diagnostics["training"]
    assert training["trainable_parameters"] == trainable
    assert training["ghost_fallback_layers"] == []
    if kind == "lora":
        assert trainable < sum(p.numel() for p in model.parameters()) / 10


class OddRMSNorm(torch.nn.Module):
    """Named like an RMSNorm, computes something else (a mean-centred norm): must go to the fallback."""

    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, d))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


@pytest.mark.parametrize("family", ["gemma", "qwen2", "odd"])
def test_rms_norm_like_layers_recognized_by_what_they_compute(family):
    from tests.training.torch.test_torch_ghost import naive  # noqa: PLC0415

    d = 6
    if family == "gemma":
        from transformers.models.gemma.modeling_gemma import GemmaRMSNorm as Norm
    elif family == "qwen2":
        from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm as Norm
    else:
        Norm = OddRMSNorm
    torch.manual_seed(0)
    norm = Norm(d).double()
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(-0.5, 1.5, d))
    model = torch.nn.Sequential(torch.nn.Linear(3, d).double(), norm, torch.nn.Linear(d, 2).double())
    x, y = torch.randn(5, 4, 3, dtype=torch.float64), torch.randn(5, 4, 2, dtype=torch.float64)

    def loss(out, target):
        return ((out - target) ** 2).sum((1, 2)).mean()

    clipper = GhostClipper(model, None, 0.5)
    loss(model(x), y).backward()
    sums, norms, _ = clipper.collect()
    clipper.close()
    assert clipper.fallback_layers() == (["1"] if family == "odd" else [])
    want_sums, want_norms = naive(model, loss, x, y, 0.5, clipper.margin)
    # these classes compute in float32 inside a float64 model, so the gradients reaching the first Linear
    # carry float32 rounding that differs between the batch and one example (kernel paths): 1e-6, not 1e-12
    assert torch.allclose(norms, want_norms, rtol=1e-6) and (norms >= want_norms * (1 - 1e-6)).all()
    for name, s, w in zip(clipper.param_names, sums, want_sums):
        assert torch.allclose(s.double(), w, rtol=1e-5, atol=1e-9), name
