"""Ghost mode on Hugging Face models built from configurations (no download): a private step against a
plain step, and against Opacus 1.6 ghost clipping where it runs; peak training memory.

Models (float32, dropout 0, ``B = 16`` examples; sequences of ``T`` tokens (default 128), vocabulary 4096;
issue 52's sizes):

* ``gpt2-6``: ``GPT2LMHeadModel``, 6 layers, width 256, 4 heads, tied input/output embeddings;
* ``llama-6``: ``LlamaForCausalLM``, 6 layers, width 256, MLP 688, 4 heads, 2 key/value heads (GQA), untied;
* ``gpt2``, ``llama``: the same families at 2 layers, width 128 (Llama MLP 344);
* ``lora``: ``peft.get_peft_model(gpt2-6, LoraConfig(r=8, target_modules=c_attn))``: adapters only;
* ``vit``: ``ViTForImageClassification``, image 32, patch 8 (17 tokens), 4 layers, width 128, MLP 512,
  4 heads, 10 classes, ``B = 32``.

A step: ``zero_grad``, ``out = model(**batch)``, the per-example loss (each sequence's mean next-token
loss over its own positions, from the logits; for ViT each image's cross-entropy; mean over the
batch), ``backward``, ``optimizer.step()`` (SGD). Sides: ``plain`` (torch), ``dpmf`` (``make_private``,
``Identity`` strategy, fixed batches from its loader, noise multiplier 1), ``opacus``
(``PrivacyEngine.make_private(..., grad_sample_mode="ghost")`` with its criterion wrapper and ``shape=``,
the same per-sequence loss).
Timing: one process, torch on one thread, CPU time of the process (``time.process_time``: wall time
on a shared machine measures the other users); after warm-up, ``rounds`` rounds in each of which every side
(rotated order) runs ``block`` timed steps; reported: the median step of each side and the ratio of
medians to plain, with the range of per-round ratios. Peak memory: each (model, side) in a fresh
subprocess with ``MALLOC_MMAP_THRESHOLD_=65536``: ``VmHWM`` over 3 steps minus ``VmRSS`` before the side
was built (the peak RSS reset through ``/proc/self/clear_refs``), and its ratio to plain's.

Run: ``python benchmarks/bench_torch_hf.py [--only gpt2-6,llama-6,gpt2,llama,lora,vit] [--seq T] [--rounds R]
[--sides plain,dpmf,opacus] [--no-memory]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
import warnings

B, T, VOCAB = 16, 128, 4096
SIDES = ["plain", "dpmf", "opacus"]
#: name -> (family, layers, width); every model's other sizes follow from these (module docstring)
MODELS = {"gpt2-6": ("gpt2", 6, 256), "llama-6": ("llama", 6, 256), "gpt2": ("gpt2", 2, 128),
          "llama": ("llama", 2, 128), "lora": ("lora", 6, 256), "vit": ("vit", 4, 128)}
VIT_B, VIT_IMAGE, VIT_PATCH, VIT_CLASSES = 32, 32, 8, 10


def set_sequence_length(t: int) -> None:
    global T
    T = t


def _torch():
    import torch

    torch.set_num_threads(1)
    return torch


def make_model(kind: str):
    torch = _torch()
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    family, layers, width = MODELS[kind]
    if family in ("gpt2", "lora"):
        cfg = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=VOCAB, n_positions=max(T, 128),
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                                      bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(cfg)
        if family == "lora":
            import peft

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                                   target_modules=["c_attn"], fan_in_fan_out=True))
        return model
    if family == "vit":
        cfg = transformers.ViTConfig(image_size=VIT_IMAGE, patch_size=VIT_PATCH, num_channels=3, hidden_size=width,
                                     num_hidden_layers=layers, num_attention_heads=4, intermediate_size=4 * width,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=VIT_CLASSES)
        return transformers.ViTForImageClassification(cfg)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=width * 43 // 16,
                                   num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=max(T, 128), tie_word_embeddings=False, bos_token_id=0,
                                   eos_token_id=0, pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg)


def batch_size(kind: str) -> int:
    return VIT_B if MODELS[kind][0] == "vit" else B


class Tokens:
    def __init__(self, n: int):
        torch = _torch()
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(1, VOCAB, (n, T), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        import torch

        return {"input_ids": self.ids[i], "attention_mask": torch.ones(T, dtype=torch.long)}


class Images:
    def __init__(self, n: int):
        torch = _torch()
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 3, VIT_IMAGE, VIT_IMAGE, generator=g)
        self.y = torch.randint(0, VIT_CLASSES, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i]}


def dataset(kind: str, n: int):
    return Images(n) if MODELS[kind][0] == "vit" else Tokens(n)


def model_inputs(batch) -> dict:
    """What the model is called on (the labels stay out: the loss is formed from the logits)."""
    return {k: v for k, v in batch.items() if k != "labels"}


def per_example_loss(logits, batch):
    F = _torch().nn.functional
    if "labels" in batch:  # an image classifier: one label per example
        return F.cross_entropy(logits, batch["labels"], reduction="none")
    tok = F.cross_entropy(logits[:, :-1].transpose(1, 2), batch["input_ids"][:, 1:], reduction="none")
    return tok.mean(1)


def build(kind: str, side: str, steps: int):
    """``(step(), model)``: one training step on the side's next batch."""
    torch = _torch()
    model = make_model(kind)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-3)
    n = batch_size(kind)
    data = dataset(kind, n * steps)
    if side == "plain":
        loader = iter(torch.utils.data.DataLoader(data, batch_size=n))

        def step():
            b = next(loader)
            opt.zero_grad()
            per_example_loss(model(**model_inputs(b)).logits, b).mean().backward()
            opt.step()

        return step, model
    if side == "dpmf":
        from dpmf.sampling import FixedOrderSampling
        from dpmf.strategies import Identity
        from dpmf.training.torch import make_private

        run = make_private(model, opt, data, strategy=Identity(steps), sampling=FixedOrderSampling(1, steps),
                           noise_multiplier=1.0, delta=1e-5, max_grad_norm=1.0, seed=0, accountant="unamplified")
        loader = iter(run.data_loader)

        def step():
            b = next(loader)
            run.optimizer.zero_grad()
            per_example_loss(run.module(**model_inputs(b)).logits, b).mean().backward()
            run.optimizer.step()

        step.run = run
        return step, model
    from opacus import PrivacyEngine

    loader = torch.utils.data.DataLoader(data, batch_size=n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pmodel, popt, crit, ploader = PrivacyEngine(accountant="prv").make_private(
            module=model, optimizer=opt, data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
            poisson_sampling=False, grad_sample_mode="ghost", criterion=torch.nn.CrossEntropyLoss())
    it = iter(ploader)

    def step():
        b = next(it)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            popt.zero_grad()
            out = pmodel(**model_inputs(b)).logits
            if "labels" in b:
                loss = crit(out, b["labels"])
            else:
                logits = out[:, :-1]
                loss = crit(logits.reshape(-1, logits.shape[-1]), b["input_ids"][:, 1:].reshape(-1),
                            shape=logits.shape)
            loss.backward()
            popt.step()

    return step, model


def time_kind(kind: str, rounds: int, block: int, warmup: int = 2) -> dict:
    steps = warmup + 2 + rounds * block + 4
    runners, failed = {}, {}
    for side in SIDES:
        try:
            step, _ = build(kind, side, steps)
            step()  # first step: fails here if the side cannot train this model
            runners[side] = step
        except Exception as exc:  # noqa: BLE001 -- recorded in the table
            failed[side] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    for _ in range(warmup):
        for step in runners.values():
            step()
    times = {s: [] for s in runners}
    per_round = {s: [] for s in runners}
    order = list(runners)
    for r in range(rounds):
        order = order[1:] + order[:1]
        for side in order:
            got = []
            for _ in range(block):
                t0 = time.process_time()  # CPU time: the machine is shared, torch runs on one thread
                runners[side]()
                got.append(time.process_time() - t0)
            times[side] += got
            per_round[side].append(statistics.median(got))
    out = {"failed": failed, "median_s": {s: statistics.median(v) for s, v in times.items()}}
    plain = out["median_s"].get("plain")
    out["ratio"] = {s: m / plain for s, m in out["median_s"].items()} if plain else {}
    out["range"] = {s: (min(a / b for a, b in zip(per_round[s], per_round["plain"])),
                        max(a / b for a, b in zip(per_round[s], per_round["plain"]))) for s in runners}
    return out


def memory_worker(kind: str, side: str) -> None:
    def status(key):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        return 0

    _torch()
    rss0 = status("VmRSS")
    step, _ = build(kind, side, 8)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    for _ in range(3):
        step()
    print(json.dumps({"peak": status("VmHWM") - rss0}))


def memory(kind: str) -> dict:
    out = {}
    for side in SIDES:
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        p = subprocess.run([sys.executable, __file__, "--memory-worker", kind, side, str(T)], capture_output=True, text=True,
                           env=env, timeout=600)
        try:
            out[side] = json.loads(p.stdout.strip().splitlines()[-1])["peak"]
        except (IndexError, ValueError, KeyError):
            out[side] = None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=",".join(MODELS))
    ap.add_argument("--sides", default=",".join(SIDES), help="plain is always run (the reference)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=2)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--memory-worker", nargs=3)
    ap.add_argument("--json")
    ap.add_argument("--seq", type=int, default=T, help="tokens per sequence T (default 128)")
    args = ap.parse_args()
    set_sequence_length(args.seq)
    SIDES[:] = ["plain"] + [s for s in args.sides.split(",") if s in SIDES and s != "plain"]
    if args.memory_worker:
        set_sequence_length(int(args.memory_worker[2]))
        memory_worker(*args.memory_worker[:2])
        return
    results = {}
    print(f"B = {B} (ViT {VIT_B}), T = {T}")
    print("| model | side | median step (s) | / plain | per-round range | peak memory (MiB) | / plain |")
    print("|---|---|---|---|---|---|---|")
    for kind in args.only.split(","):
        try:
            r = time_kind(kind, args.rounds, args.block)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            continue
        if not args.no_memory:
            r["memory"] = memory(kind)
        results[kind] = r
        mem = r.get("memory", {})
        for side in SIDES:
            if side in r["failed"]:
                print(f"| {kind} | {side} | fails: {r['failed'][side]} | | | | |")
                continue
            m = mem.get(side)
            mp = mem.get("plain")
            lo, hi = r["range"][side]
            print(f"| {kind} | {side} | {r['median_s'][side]:.4f} | {r['ratio'][side]:.2f}x | {lo:.2f}-{hi:.2f} | "
                  f"{'' if m is None else f'{m / 2**20:.0f}'} | {'' if not (m and mp) else f'{m / mp:.2f}x'} |",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
