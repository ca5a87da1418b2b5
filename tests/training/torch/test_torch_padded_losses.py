"""Padded batches never train silently on a loss that couples examples (``dpmf.training.torch.losses``).

Oracle: a float64 copy of the model, each example alone (a batch of 1), its own per-sequence mean
token loss differentiated by ``torch.autograd.grad``, clipped with the clipper's factors and summed.
Models are built from ``transformers`` configurations (no download): a tiny Llama-style causal LM.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError  # noqa: E402
from dpmf.sampling import PoissonSampling  # noqa: E402
from dpmf.strategies import Identity  # noqa: E402
from dpmf.training.torch import make_private, per_example_causal_lm_loss  # noqa: E402
from padded_tokens import PaddedTokens  # noqa: E402  (beside this file)
from dpmf.training.torch.clipping import clip_factors  # noqa: E402
from dpmf.training.torch.losses import guard_model_loss, is_causal_lm  # noqa: E402

V, T = 48, 10


def llama_config(**kw):
    return transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                    pad_token_id=0, **kw)


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(llama_config()).eval()  # eval: no dropout, so float64 and float32 agree


def tiny_gpt2(seed=0):
    """GPT-2 architecture with tied input/output embeddings (``wte`` is ``lm_head``)."""
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=0,
                                  tie_word_embeddings=True)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    return model


def Padded(n=40, seed=0):
    """Right-padded sequences of lengths 3..T: pad id 0, attention 0 and label -100 on the padding."""
    return PaddedTokens(n, vocab=V, length=T, min_length=3, seed=seed)


def batch_of(ds, idx):
    return {k: torch.stack([ds[i][k] for i in idx]) for k in ("input_ids", "attention_mask", "labels")}


# ---------------------------------------------------------------- the helper against a direct loop
def test_per_example_loss_is_each_sequences_own_mean_then_the_batch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 7, (3, 5), generator=g)
    labels[0, 3:] = -100
    labels[2, 1:] = -100  # nothing to predict after the shift: contributes 0
    per = []
    for i in range(3):
        terms = [torch.nn.functional.cross_entropy(logits[i, t], labels[i, t + 1]) for t in range(4)
                 if labels[i, t + 1] != -100]
        per.append(sum(terms) / len(terms) if terms else torch.zeros((), dtype=torch.float64))
    per = torch.stack(per)
    got = per_example_causal_lm_loss(logits, labels, reduction="none")
    torch.testing.assert_close(got, per, rtol=1e-12, atol=0)
    torch.testing.assert_close(per_example_causal_lm_loss(logits, labels), per.sum() / 3, rtol=1e-12, atol=0)
    torch.testing.assert_close(per_example_causal_lm_loss(logits, labels, reduction="sum"), per.sum(), rtol=1e-12,
                               atol=0)
    # unshifted (token classification) with token sums
    direct = torch.stack([sum(torch.nn.functional.cross_entropy(logits[i, t], labels[i, t], reduction="sum")
                              for t in range(5) if labels[i, t] != -100) for i in range(3)])
    torch.testing.assert_close(per_example_causal_lm_loss(logits, labels, reduction="none", token_reduction="sum",
                                                          shift=False), direct, rtol=1e-12, atol=0)


def test_without_padding_it_equals_the_hugging_face_loss_and_with_padding_it_does_not():
    model, ds = tiny_llama(), Padded(8)
    b = batch_of(ds, range(8))
    with torch.no_grad():
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"])
        hf_padded, logits = out.loss, out.logits
        full = b["input_ids"].clone()
        hf_full = model(input_ids=full, labels=full).loss
        ours_full = per_example_causal_lm_loss(model(input_ids=full).logits, full)
    torch.testing.assert_close(ours_full, hf_full, rtol=1e-5, atol=0)  # N = B (T - 1): the same number
    ours = per_example_causal_lm_loss(logits, b["labels"])
    assert abs(float(ours) - float(hf_padded)) > 1e-3  # the token mean weights long sequences more


def test_helper_bad_input():
    with pytest.raises(InvalidParameterError, match="reduction"):
        per_example_causal_lm_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), reduction="avg")
    with pytest.raises(InvalidParameterError, match="token_reduction"):
        per_example_causal_lm_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), token_reduction="x")
    with pytest.raises(InvalidParameterError, match=r"labels must have shape \(1, 2\)"):
        per_example_causal_lm_loss(torch.zeros(1, 2, 3), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(InvalidParameterError, match="logits must be a"):
        per_example_causal_lm_loss(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))


# ---------------------------------------------------------------- the guard in make_private
def reference(model, batch, clip, margin, reduction):
    """Float64 per-example reference: ``(sum_i f_i g_i, n_i)`` of each sequence's own mean loss."""
    m64 = copy.deepcopy(model).double()
    params = [p for p in m64.parameters() if p.requires_grad]
    B = batch["input_ids"].shape[0]
    per, norms = [], []
    for i in range(B):
        out = m64(input_ids=batch["input_ids"][i:i + 1], attention_mask=batch["attention_mask"][i:i + 1])
        loss = per_example_causal_lm_loss(out.logits, batch["labels"][i:i + 1], reduction="sum")
        g = torch.autograd.grad(loss, params, allow_unused=True)
        g = [torch.zeros_like(p) if gi is None else gi for gi, p in zip(g, params)]
        per.append(g)
        norms.append(torch.sqrt(sum((gi ** 2).sum() for gi in g)))
    norms = torch.stack(norms)
    f = clip_factors(norms, clip, margin)
    return [sum(f[i] * per[i][k] for i in range(B)) for k in range(len(params))], norms


@pytest.mark.parametrize(("build", "reduction"), [(tiny_llama, "mean"), (tiny_llama, "sum"), (tiny_gpt2, "mean")])
def test_model_loss_in_the_loop_is_per_example_and_matches_the_float64_reference(build, reduction):
    model, ds = build(), Padded(40)
    assert is_causal_lm(model)
    clip = 0.05  # small enough that every example is clipped: the factors matter
    model, optimizer, loader, privacy = make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), ds, strategy=Identity(3),
        sampling=PoissonSampling(0.3, 3), noise_multiplier=1.0, delta=1e-5, max_grad_norm=clip, seed=0,
        loss_reduction=reduction)
    batch = next(iter(loader))
    assert batch["input_ids"].shape[0] >= 4 and bool((batch["labels"] == -100).any())
    optimizer.zero_grad()
    out = model(**batch)
    per = per_example_causal_lm_loss(out.logits.detach(), batch["labels"], reduction=reduction)
    torch.testing.assert_close(out.loss.detach(), per, rtol=0, atol=0)  # the model's .loss was replaced
    out.loss.backward()
    sums, norms, backwards = optimizer.clipper.collect()
    assert backwards == 1
    ref_sums, ref_norms = reference(model, batch, clip, optimizer.clipper.margin, reduction)
    assert bool((norms >= ref_norms * (1 - 1e-5)).all())  # upper bounds (float32 model vs float64)
    torch.testing.assert_close(norms, ref_norms, rtol=1e-3, atol=0)
    assert float(ref_norms.min()) > clip  # every example clipped
    num = sum(float(((s.double() - r) ** 2).sum()) for s, r in zip(sums, ref_sums)) ** 0.5
    den = sum(float((r ** 2).sum()) for r in ref_sums) ** 0.5
    assert num / den < 1e-4, num / den


def test_the_loop_steps_to_the_end_with_padded_labels():
    model, ds = tiny_llama(), Padded(40)
    model, optimizer, loader, privacy = make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), ds, strategy=Identity(3),
        sampling=PoissonSampling(0.2, 3), noise_multiplier=1.0, delta=1e-5, max_grad_norm=1.0, seed=1)
    for batch in loader:
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    assert privacy.steps_done == 3


def test_other_heads_with_padded_labels_are_refused_and_unpadded_labels_pass():
    torch.manual_seed(0)
    model = transformers.LlamaForTokenClassification(llama_config(num_labels=3))
    assert not is_causal_lm(model)
    handles = guard_model_loss(model)
    ids = torch.randint(1, V, (4, T))
    labels = torch.randint(0, 3, (4, T))
    model(input_ids=ids, labels=labels).loss.backward()  # no ignored label: a mean over B * T, fixed
    labels[1, 5:] = -100
    with pytest.raises(UnsupportedConfigurationError, match=r"labels containing -100 \(padding\).*"
                                                             "per_example_causal_lm_loss"):
        model(input_ids=ids, labels=labels)
    for h in handles:
        h.remove()
    model(input_ids=ids, labels=labels)  # removable


def test_positional_labels_and_tuple_outputs_are_handled():
    model, ds = tiny_llama(), Padded(4)
    b = batch_of(ds, range(4))
    guard_model_loss(model, "sum")
    with torch.no_grad():
        logits = model(b["input_ids"], b["attention_mask"]).logits
        want = per_example_causal_lm_loss(logits, b["labels"], reduction="sum")
        # labels is the 6th parameter of LlamaForCausalLM.forward
        pos = model(b["input_ids"], b["attention_mask"], None, None, None, b["labels"])
        tup = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"],
                    return_dict=False)
    torch.testing.assert_close(pos.loss, want, rtol=0, atol=0)
    torch.testing.assert_close(tup[0], want, rtol=0, atol=0)


def test_a_lora_wrapped_causal_lm_gets_the_per_example_loss():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny_llama(), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    b = batch_of(Padded(6), range(6))
    handles = guard_model_loss(model)
    assert len(handles) == 2  # on the LlamaForCausalLM inside the PEFT wrappers
    with torch.no_grad():
        out = model(**b)
    torch.testing.assert_close(out.loss, per_example_causal_lm_loss(out.logits, b["labels"]), rtol=0, atol=0)
