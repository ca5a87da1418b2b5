"""Ghost mode on encoder-decoders built here from ``transformers`` configurations (no download): T5
(relative position bias tables shared by the batch), a gated, untied mT5 / Flan-T5-style variant and
BART (learned position embeddings and scaled word embeddings tied to the output layer), trained in the
loop users have (``model(...)`` without labels, :func:`per_example_seq2seq_loss`, ``backward()``).
The clipped sums must equal a float64 per-example reference (each example alone through
``torch.autograd.grad``) and no ghost norm may be below the reference's.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError  # noqa: E402
from dpmf.training.torch import per_example_causal_lm_loss, per_example_seq2seq_loss  # noqa: E402
from dpmf.training.torch.grad_sample import PerExampleClipper  # noqa: E402
from dpmf.training.torch.losses import guard_model_loss  # noqa: E402

import ghost_reference  # noqa: E402  (beside this file)

V, B = 61, 4


pytestmark = pytest.mark.usefixtures("quiet_transformers")  # (tests/training/torch/conftest.py)


def t5(gated: bool = False, tie: bool = True):
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=V, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_decoder_layers=2,
                                num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                dropout_rate=0.0, feed_forward_proj="gated-gelu" if gated else "relu",
                                tie_word_embeddings=tie, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return transformers.T5ForConditionalGeneration(cfg).double()


def bart():
    torch.manual_seed(0)
    cfg = transformers.BartConfig(vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=2,
                                  encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24,
                                  decoder_ffn_dim=24, max_position_embeddings=32, dropout=0.0, attention_dropout=0.0,
                                  activation_dropout=0.0, scale_embedding=True, pad_token_id=1, bos_token_id=0,
                                  eos_token_id=2, decoder_start_token_id=2)
    return transformers.BartForConditionalGeneration(cfg).double()


def batch(model, source: int, target: int, seed: int = 1):
    """Padded sources (attention mask) and targets (``-100``), decoder inputs made from the labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (B, source), generator=g)
    mask = torch.ones(B, source, dtype=torch.long)
    labels = torch.randint(3, V, (B, target), generator=g)
    for i in range(1, B):
        mask[i, source - i:] = 0
        ids[i, source - i:] = model.config.pad_token_id
        labels[i, max(1, target - i):] = -100
    dec = model.prepare_decoder_input_ids_from_labels(labels=labels)
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec}, labels


def seq2seq_loss(labels):
    """Example ``i``'s summed loss alone (``i``), or the batch's mean (``None``)."""
    def loss(out, i):
        if i is None:
            return per_example_seq2seq_loss(out.logits, labels)
        return per_example_seq2seq_loss(out.logits, labels[i:i + 1], reduction="sum")
    return loss


def check(model, inputs, labels):
    return ghost_reference.check(model, inputs, seq2seq_loss(labels), B)


@pytest.fixture(scope="module")
def built():
    """The models, built once (``transformers`` initialization dominates these tests); copied per test."""
    return {"t5": t5(), "t5-gated": t5(gated=True, tie=False), "bart": bart()}


@pytest.mark.parametrize("source, target", [(6, 5), (7, B), (5, 1)])  # B query positions; one decoder step
def test_t5_bias_tables_match_the_reference(built, source, target):
    model = built["t5"]
    inputs, labels = batch(model, source, target)
    clipper = check(model, inputs, labels)
    assert clipper.fallback_layers() == []
    tables = [n for n in clipper.covered_layers() if n.endswith("relative_attention_bias")]
    assert len(tables) == 2  # one in the encoder, one in the decoder


def test_gated_untied_t5_like_mt5_and_flan_t5_matches_the_reference(built):
    model = built["t5-gated"]
    inputs, labels = batch(model, 6, 5, seed=2)
    assert check(model, inputs, labels).fallback_layers() == []


def test_bart_tied_scaled_embeddings_match_the_reference(built):
    model = built["bart"]
    inputs, labels = batch(model, 6, 5)
    clipper = check(model, inputs, labels)
    assert clipper.fallback_layers() == []
    assert "model.shared.weight" in clipper.shared_parameters()  # tied with both stacks and lm_head


def test_frozen_bias_tables_still_work(built):
    """Freezing the tables (the earlier workaround) still works and leaves the rest exact."""
    model = copy.deepcopy(built["t5"])
    for n, p in model.named_parameters():
        if n.endswith("relative_attention_bias.weight"):
            p.requires_grad_(False)
    inputs, labels = batch(model, 6, 5)
    check(model, inputs, labels)


def test_seq2seq_loss_is_the_unshifted_per_sequence_mean():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 7, generator=g, dtype=torch.float64)
    labels = torch.tensor([[1, 2, 3, 4], [5, 6, -100, -100], [-100] * 4])
    got = per_example_seq2seq_loss(logits, labels, reduction="none")
    logp = logits.log_softmax(-1)
    want = torch.stack([-logp[0, torch.arange(4), labels[0]].mean(), -logp[1, torch.arange(2), labels[1, :2]].mean(),
                        torch.zeros((), dtype=torch.float64)])
    assert torch.allclose(got, want, rtol=1e-12)
    assert torch.allclose(per_example_seq2seq_loss(logits, labels), want.mean(), rtol=1e-12)
    assert torch.equal(got, per_example_causal_lm_loss(logits, labels, reduction="none", shift=False))
    with pytest.raises(InvalidParameterError, match="reduction"):
        per_example_seq2seq_loss(logits, labels, reduction="avg")


def test_the_padded_labels_refusal_points_to_the_seq2seq_loss(built):
    model = built["t5"]
    inputs, labels = batch(model, 6, 5)
    handles = guard_model_loss(model)
    try:
        with pytest.raises(UnsupportedConfigurationError, match="per_example_seq2seq_loss"):
            model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels)
    finally:
        for h in handles:
            h.remove()


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, decoder_input_ids, attention_mask=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits


# torch's note that vmap has no batching rule for CPU flash attention (the fallback is slower, not wrong)
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
def test_t5_in_functorch_mode_without_an_attention_mask_and_a_clear_refusal_with_one(built):
    """functorch mode runs each example alone under vmap: equal to the reference without padding; with an
    attention mask ``transformers`` builds the mask with a data-dependent check, which vmap refuses."""
    model = built["t5"]
    inputs, labels = batch(model, 6, 5)
    inputs["attention_mask"][:] = 1
    del inputs["attention_mask"]
    wrapped = _Logits(model)
    clipper = PerExampleClipper(wrapped, lambda logits, y: per_example_seq2seq_loss(logits, y), 1.0, mode="functorch")
    got = clipper.clipped_sum((inputs["input_ids"], inputs["decoder_input_ids"]), labels)
    want_sums, want_norms = ghost_reference.reference(model, inputs, seq2seq_loss(labels), B, 1.0, clipper.margin)
    assert torch.allclose(got.norms, want_norms, rtol=1e-9)
    for s, w in zip(got.grads, want_sums):
        assert torch.allclose(s, w, rtol=1e-6, atol=1e-12)
    mask = torch.ones_like(inputs["input_ids"])
    with pytest.raises(UnsupportedConfigurationError, match="grad_sample_mode='ghost'"):
        clipper.clipped_sum((inputs["input_ids"], inputs["decoder_input_ids"], mask), labels)
