"""``DPTrainer``: the ``transformers.Trainer`` API trains with dpmf's batches, noise and accountant.

The oracle is dpmf's own Opacus-style loop: the same model, optimizer (SGD, constant lr), data and
seed through ``make_private`` and ``for batch in loader: ...`` must give the same parameters, bit
for bit, as ``DPTrainer(...).train()`` -- so the Trainer stepped on exactly the scheme's batches, with
the same per-example loss, clipping and noise. A tiny Llama-style config (no download), CPU only,
``report_to="none"``, nothing saved outside a temporary folder.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError  # noqa: E402
from dpmf.sampling import BallsInBinsSampling, PoissonSampling  # noqa: E402
from dpmf.strategies import Identity, bsr  # noqa: E402
from dpmf.training.torch import make_private, per_example_causal_lm_loss  # noqa: E402
from padded_tokens import PaddedTokens  # noqa: E402  (beside this file)
from dpmf.training.torch.huggingface import DPTrainer  # noqa: E402

V, T = 40, 8


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                   pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg)


def Padded(n=30, seed=0):
    """Right-padded sequences of lengths 2..T: pad id 0, attention 0 and label -100 on the padding."""
    return PaddedTokens(n, vocab=V, length=T, min_length=2, seed=seed)


def targs(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), report_to="none", use_cpu=True, learning_rate=0.05, optim="sgd",
                lr_scheduler_type="constant", weight_decay=0.0, logging_steps=1, save_strategy="no",
                disable_tqdm=True, seed=0)
    return transformers.TrainingArguments(**{**base, **kw})


DP = dict(strategy=bsr(6, 2), sampling=BallsInBinsSampling(2, 6), noise_multiplier=1.0, delta=1e-5,
          max_grad_norm=0.5, seed=3)


def test_trainer_equals_the_make_private_loop_and_logs_the_privacy(tmp_path):
    model, ds = tiny_llama(), Padded()
    twin = copy.deepcopy(model)
    trainer = DPTrainer(model, targs(tmp_path), train_dataset=ds, **DP)
    assert trainer.args.max_steps == 6 and trainer.args.max_grad_norm == 0.0
    out = trainer.train()
    assert trainer.state.global_step == 6 and trainer.privacy.steps_done == 6
    report = trainer.privacy.report()
    assert report.certified and report.method.startswith("allocation")
    assert out.metrics["epsilon"] == report.epsilon and out.metrics["delta"] == 1e-5
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 6 and all(h["epsilon"] == report.epsilon for h in logged)
    assert [h["dp_steps"] for h in logged] == [1, 2, 3, 4, 5, 6]
    assert not any("grad_norm" in h for h in trainer.state.log_history)

    # the same run through dpmf's own loop
    twin.train()
    m, opt, loader, privacy = make_private(twin, torch.optim.SGD(twin.parameters(), lr=0.05), ds, **DP)
    for batch in loader:
        opt.zero_grad()
        m(**batch).loss.backward()
        opt.step()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p, q), name
    assert privacy.report().epsilon == report.epsilon


def test_empty_poisson_batches_and_the_second_pass(tmp_path):
    model, ds = tiny_llama(), Padded(12)
    # q = 0.1 over 12 examples: P(empty batch) = 0.28 per step; seed 0 draws three
    trainer = DPTrainer(model, targs(tmp_path), train_dataset=ds, eval_dataset=Padded(6, seed=1), strategy=Identity(8),
                        sampling=PoissonSampling(0.1, 8), noise_multiplier=2.0, delta=1e-5, max_grad_norm=1.0,
                        seed=0)
    sizes = [len(b) for b in trainer.privacy.sampler.scheme.batches(12, np.random.default_rng(trainer.privacy.sampler.seed))]
    assert sizes.count(0) == 3  # the run below meets empty batches
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    assert trainer.privacy.steps_done == 8 and trainer.state.global_step == 8
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # noise reached every weight
    with pytest.raises(UnsupportedConfigurationError, match="covers no more"):
        trainer.train()
    # evaluation (no gradients: nothing captured) reports the per-example loss of the held-out set
    ev = Padded(6, seed=1)
    with torch.no_grad():
        out = model(input_ids=ev.ids, attention_mask=ev.mask)
    want = float(per_example_causal_lm_loss(out.logits, ev.labels))
    assert trainer.evaluate()["eval_loss"] == pytest.approx(want, rel=1e-5)
    assert trainer.privacy.steps_done == 8


def test_refusals(tmp_path):
    ds = Padded(12)
    with pytest.raises(UnsupportedConfigurationError, match="gradient_accumulation_steps=2.*chunk_size"):
        DPTrainer(tiny_llama(), targs(tmp_path, gradient_accumulation_steps=2), train_dataset=ds, **DP)
    with pytest.raises(UnsupportedConfigurationError, match="label_smoothing_factor"):
        DPTrainer(tiny_llama(), targs(tmp_path, label_smoothing_factor=0.1), train_dataset=ds, **DP)
    with pytest.raises(InvalidParameterError, match="max_steps=5 but the privacy plan covers 6 steps"):
        DPTrainer(tiny_llama(), targs(tmp_path, max_steps=5), train_dataset=ds, **DP)
    with pytest.raises(InvalidParameterError, match="train_dataset"):
        DPTrainer(tiny_llama(), targs(tmp_path), **DP)
    trainer = DPTrainer(tiny_llama(), targs(tmp_path), train_dataset=ds, **DP)
    with pytest.raises(UnsupportedConfigurationError, match="save_checkpoint"):
        trainer.train(resume_from_checkpoint=True)


def tiny_gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=16, n_embd=16, n_layer=2, n_head=2)  # dropout 0.1
    return transformers.GPT2LMHeadModel(cfg).double()


def _train_counting_block_calls(model, tmp_path, **kw):
    """Train ``model`` (float64 noise); returns how many times the first layer of its first block ran per
    step (transformers checkpoints the block's ``forward``, not its hooks; a pre-hook: a recomputation stops
    once it has what it saves)."""
    calls = []
    handle = model.transformer.h[0].ln_1.register_forward_pre_hook(lambda *a: calls.append(1))
    trainer = DPTrainer(model, targs(tmp_path, **kw), train_dataset=Padded(30), **DP, noise_dtype=torch.float64)
    torch.manual_seed(11)  # the same dropout draws in both runs
    trainer.train()
    handle.remove()
    assert trainer.privacy.steps_done == 6
    assert all(p.requires_grad for p in model.parameters())  # no detached copy left in the model
    return len(calls) / 6


@pytest.mark.parametrize("how", ["arguments", "model"])
def test_gradient_checkpointing_trains_the_same_run(tmp_path, how):
    """Blocks recomputed in the backward (each block runs twice per step) give the parameters of the same
    run without checkpointing (float64, dropout on: the recomputation replays its draws)."""
    plain, ckpt = tiny_gpt2(), tiny_gpt2()
    assert _train_counting_block_calls(plain, tmp_path / "plain") == 1
    if how == "model":
        ckpt.gradient_checkpointing_enable()
        runs = _train_counting_block_calls(ckpt, tmp_path / "ckpt")
    else:
        runs = _train_counting_block_calls(ckpt, tmp_path / "ckpt", gradient_checkpointing=True)
    assert runs == 2  # the forward and its recomputation
    worst = max(float((p - q).abs().max()) for p, q in zip(plain.parameters(), ckpt.parameters()))
    moved = max(float((p - q).abs().max()) for p, q in zip(plain.parameters(), tiny_gpt2().parameters()))
    assert worst < 1e-6 and moved > 1e-2, (worst, moved)


def test_reentrant_checkpointing_is_refused(tmp_path):
    with pytest.raises(UnsupportedConfigurationError, match=r"use_reentrant': True}: reentrant checkpointing"):
        DPTrainer(tiny_llama(), targs(tmp_path, gradient_checkpointing=True,
                                      gradient_checkpointing_kwargs={"use_reentrant": True}),
                  train_dataset=Padded(12), **DP)
    model = tiny_llama()
    model.gradient_checkpointing_enable({"use_reentrant": True})
    with pytest.raises(UnsupportedConfigurationError, match=r"use_reentrant=True.*\{'use_reentrant': False\}"):
        DPTrainer(model, targs(tmp_path), train_dataset=Padded(12), **DP)


def test_fp16_is_refused_and_bf16_is_applied_on_cpu(tmp_path):
    """fp16 (ignored on a CPU; a loss scaler on a GPU) is refused; bf16 autocast runs the layers in
    bfloat16 while the norms stay float64, close to the float32 run's (bfloat16 keeps 8 bits)."""
    with pytest.raises(UnsupportedConfigurationError, match=r"fp16=True is not supported by DPTrainer.*bf16=True"):
        DPTrainer(tiny_llama(), targs(tmp_path, fp16=True), train_dataset=Padded(12), **DP)
    norms, dtypes = {}, {}
    for bf16 in (False, True):
        model, seen = tiny_llama(), []
        model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        trainer = DPTrainer(model, targs(tmp_path, bf16=bf16), train_dataset=Padded(), **DP)
        clipper, got = trainer.optimizer.clipper, []
        collect = clipper.collect
        clipper.collect = lambda: (lambda r: (got.append(r[1]), r)[1])(collect())
        trainer.train()
        norms[bf16], dtypes[bf16] = torch.cat(got), set(seen)
    assert dtypes == {False: {torch.float32}, True: {torch.bfloat16}}
    assert norms[True].dtype == torch.float64 and norms[True].shape == norms[False].shape == (60,)  # 2 epochs
    rel = ((norms[True] - norms[False]).abs() / norms[False]).max()
    assert 0 < rel < 0.02, rel  # measured 0.003 (bfloat16 keeps 8 bits: 2^-8 = 0.004 per rounding)
