"""Ghost mode on Hugging Face models built from configurations (no download): a private step against a
plain step, and against Opacus 1.6 ghost clipping where it runs; peak training memory.

Models (float32, dropout 0, ``B = 16`` sequences of ``T = 64`` tokens, vocabulary 4096):

* ``gpt2``: ``GPT2LMHeadModel``, 3 layers, width 128, 4 heads, tied input/output embeddings;
* ``llama``: ``LlamaForCausalLM``, 3 layers, width 128, MLP 344, 4 heads, 2 key/value heads (GQA), untied;
* ``lora``: ``peft.get_peft_model(llama, LoraConfig(r=8, target_modules=q/k/v/o))``: adapters only.

A step: ``zero_grad``, ``out = model(**batch)``, the per-example loss (each sequence's mean next-token
loss over its own positions, from the logits; mean over the batch), ``backward``, ``optimizer.step()``
(SGD). Sides: ``plain`` (torch), ``dpmf`` (``make_private``, ``Identity`` strategy, fixed batches of
16 from its loader, noise multiplier 1), ``opacus`` (``PrivacyEngine.make_private(...,
grad_sample_mode="ghost")`` with its criterion wrapper and ``shape=``, the same per-sequence loss).
Timing: one process, torch on one thread, CPU time of the process (``time.process_time``: wall time
on a shared machine measures the other users); after warm-up, ``rounds`` rounds in each of which every side
(rotated order) runs ``block`` timed steps; reported: the median step of each side and the ratio of
medians to plain, with the range of per-round ratios. Peak memory: each (model, side) in a fresh
subprocess with ``MALLOC_MMAP_THRESHOLD_=65536``: ``VmHWM`` over 3 steps minus ``VmRSS`` before the side
was built (the peak RSS reset through ``/proc/self/clear_refs``), and its ratio to plain's.

Run: ``python benchmarks/bench_torch_hf.py [--only gpt2,llama,lora] [--seq T] [--rounds R] [--no-memory]``.
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

B, T, VOCAB = 16, 64, 4096
SIDES = ["plain", "dpmf", "opacus"]


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
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=3, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=128,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                                      bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(cfg)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=344, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = transformers.LlamaForCausalLM(cfg)
    if kind == "lora":
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    return model


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


def per_example_loss(logits, batch):
    F = _torch().nn.functional
    tok = F.cross_entropy(logits[:, :-1].transpose(1, 2), batch["input_ids"][:, 1:], reduction="none")
    return tok.mean(1)


def build(kind: str, side: str, steps: int):
    """``(step(), model)``: one training step on the side's next batch."""
    torch = _torch()
    model = make_model(kind)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-3)
    data = Tokens(B * steps)
    if side == "plain":
        loader = iter(torch.utils.data.DataLoader(data, batch_size=B))

        def step():
            b = next(loader)
            opt.zero_grad()
            per_example_loss(model(**b).logits, b).mean().backward()
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
            per_example_loss(run.module(**b).logits, b).mean().backward()
            run.optimizer.step()

        step.run = run
        return step, model
    from opacus import PrivacyEngine

    loader = torch.utils.data.DataLoader(data, batch_size=B)
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
            logits = pmodel(**b).logits[:, :-1]
            loss = crit(logits.reshape(-1, logits.shape[-1]), b["input_ids"][:, 1:].reshape(-1), shape=logits.shape)
            loss.backward()
            popt.step()

    return step, model


def time_kind(kind: str, rounds: int, block: int, warmup: int = 2) -> dict:
    steps = warmup + rounds * block + 4
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
    ap.add_argument("--only", default="gpt2,llama,lora")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=2)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--memory-worker", nargs=3)
    ap.add_argument("--json")
    ap.add_argument("--seq", type=int, default=T, help="tokens per sequence T (default 64; at most 128)")
    args = ap.parse_args()
    set_sequence_length(args.seq)
    if args.memory_worker:
        set_sequence_length(int(args.memory_worker[2]))
        memory_worker(*args.memory_worker[:2])
        return
    results = {}
    print(f"B = {B}, T = {T}")
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
