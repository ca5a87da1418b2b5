"""Ghost mode on vision and audio encoders built here from ``transformers`` configurations (no
download): their embeddings add learned parameters to the activations by broadcasting -- ViT's
``cls_token`` and ``position_embeddings`` (also interpolated to another image size), DeiT's cls and
distillation tokens -- and every layer must have an exact ghost rule (``fallback_layers()`` empty),
with clipped sums equal to a float64 per-example reference. Whisper's encoder (its position table is
frozen) and decoder (``WhisperPositionalEmbedding`` slices its table) likewise.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ghost_reference  # noqa: E402  (beside this file)

F = torch.nn.functional
B = 4


pytestmark = pytest.mark.usefixtures("quiet_transformers")  # (tests/training/torch/conftest.py)


def _vision(config_class, model_class):
    torch.manual_seed(0)
    cfg = config_class(image_size=16, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=24, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0, num_labels=3)
    return model_class(cfg).double()


def classification_loss(labels):
    def loss(out, i):
        if i is None:
            return F.cross_entropy(out.logits, labels)
        return F.cross_entropy(out.logits, labels[i:i + 1], reduction="sum")
    return loss


def images(size: int = 16, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, 3, size, size, generator=g, dtype=torch.float64), torch.randint(0, 3, (B,), generator=g)


class _Interpolating(torch.nn.Module):
    """ViT on another image size: its position embeddings interpolated (bicubic) to the patch grid."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values, interpolate_pos_encoding=True)


@pytest.mark.parametrize("size", [16, 24])
def test_vit_embeddings_have_a_ghost_rule_and_match_the_reference(size):
    model = _vision(transformers.ViTConfig, transformers.ViTForImageClassification)
    x, y = images(size)
    model, prefix = (model, "") if size == 16 else (_Interpolating(model), "model.")
    clipper = ghost_reference.check(model, {"pixel_values": x}, classification_loss(y), B)
    assert clipper.fallback_layers() == []
    assert clipper.covered_layers()[prefix + "vit.embeddings"] == "ghost"


def test_deit_cls_and_distillation_tokens_match_the_reference():
    model = _vision(transformers.DeiTConfig, transformers.DeiTForImageClassificationWithTeacher)
    x, y = images(seed=2)
    clipper = ghost_reference.check(model, {"pixel_values": x}, classification_loss(y), B)
    assert clipper.fallback_layers() == []


def _whisper():
    torch.manual_seed(0)
    return transformers.WhisperConfig(vocab_size=37, num_mel_bins=8, encoder_layers=1, decoder_layers=1,
                                      encoder_attention_heads=2, decoder_attention_heads=2, d_model=16,
                                      encoder_ffn_dim=24, decoder_ffn_dim=24, max_source_positions=6,
                                      max_target_positions=12, num_labels=3, dropout=0.0, pad_token_id=0,
                                      decoder_start_token_id=1)


def test_whisper_encoder_classifier_matches_the_reference():
    model = transformers.WhisperForAudioClassification(_whisper()).double()
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(B, 8, 12, generator=g, dtype=torch.float64), torch.randint(0, 3, (B,), generator=g)
    clipper = ghost_reference.check(model, {"input_features": x}, classification_loss(y), B)
    assert clipper.fallback_layers() == []


def test_whisper_decoder_positions_match_the_reference():
    """``WhisperPositionalEmbedding`` (an Embedding subclass with its own forward) slices its table by the
    decoder length; the slice is added to every example's token embeddings."""
    model = transformers.WhisperForConditionalGeneration(_whisper()).double()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(B, 8, 12, generator=g, dtype=torch.float64)
    labels = torch.randint(2, 37, (B, 5), generator=g)
    inputs = {"input_features": x, "decoder_input_ids": torch.cat([torch.ones(B, 1, dtype=torch.long), labels[:, :-1]], 1)}

    def loss(out, i):
        if i is None:
            return F.cross_entropy(out.logits.transpose(1, 2), labels, reduction="none").mean(1).mean()
        return F.cross_entropy(out.logits.transpose(1, 2), labels[i:i + 1], reduction="none").mean(1).sum()

    clipper = ghost_reference.check(model, inputs, loss, B)
    assert clipper.fallback_layers() == []
    assert clipper.covered_layers()["model.decoder.embed_positions"] == "ghost"
