"""Stdlib GPT-2: fine-tune a GPT-2-architecture model on padded, variable-length code with DP-SGD, BandMF and BLT at equal epsilon.

The model is ``transformers.GPT2LMHeadModel`` built from a ``GPT2Config`` (no download): byte-level
vocabulary (256 bytes + a padding id), **tied input/output embeddings** (``lm_head`` is ``wte``),
learned position embeddings called on position ids shared by the batch, ``Conv1D`` projections --
the GPT-2 of most DP fine-tuning tutorials, small. The data are the Python standard library's own
top-level ``.py`` sources (``StdlibLines``): each example is a run of whole lines of at most
``context`` bytes, so lengths vary (a blank-line-separated block can be 10 bytes or 64), right-padded
with ``attention_mask`` 0 and label ``-100`` on the padding, exactly as a Hugging Face collator
produces them. The loop is the Hugging Face one, in dpmf's ghost mode::

    for batch in loader:                 # the scheme's batches: one pass = every epoch
        optimizer.zero_grad()
        model(**batch).loss.backward()   # made per-example by make_private (each sequence's own mean)
        optimizer.step()                 # clipped sum + sigma * C^{-1} z, / expected batch size

``model(**batch).loss`` would be a token mean over the whole padded batch (coupling examples);
``make_private`` recomputes it per example (``dpmf.training.torch.per_example_causal_lm_loss``).

Rows, each calibrated by ``make_private(..., target_epsilon=eps)`` and checked (certified,
``epsilon <= eps``, the expected accountant):

==========  ================================  ===========================  ==========================
row         strategy C                        sampling                     accountant
==========  ================================  ===========================  ==========================
dpsgd       ``Identity(T)``                   ``PoissonSampling(1/b, T)``  pld (tight)
bandmf      ``bsr(T, 4)``                     ``BallsInBinsSampling(k, T)``  allocation (Renyi bound)
blt         ``optimize_blt(T, 2, k)``         ``BallsInBinsSampling(k, T)``  allocation (Renyi bound)
==========  ================================  ===========================  ==========================

``T = k * b`` (``--epochs`` k of ``--steps-per-epoch`` b); every row divides by the same public
normalizer, the expected batch size ``n_train / b``. A non-private row trains the same model with
the same loop and optimizer on shuffled batches of that size. Every row uses the same learning rate
(``--lr``, fixed in advance, not tuned on the held-out data) and the seeds ``--seeds`` (the seed of a
run seeds the model, the batches and the noise). The metric is the held-out bits/byte (next-byte
cross entropy in bits over the non-padded positions of a random 10% of the examples, from the same
files: in-distribution next-byte prediction).

Run::

    python examples/stdlib_gpt2.py --out examples/results/stdlib_gpt2     # full run (examples/README.md)
    python examples/stdlib_gpt2.py --fast --out /tmp/gpt2_fast             # 10-13 CPU-s

``--out DIR`` writes ``results.json`` (configuration, every run with sigma, certified epsilon,
method, the curve) and ``results.md`` (the table). Needs ``torch`` and ``transformers``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sysconfig
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

PAD = 256
VOCAB = 257
MECHANISMS = ("dpsgd", "bandmf", "blt")
METHODS = {"dpsgd": "pld", "bandmf": "allocation", "blt": "allocation"}
LABELS = {
    "non-private": "non-private Adam (same loop, no clipping)",
    "dpsgd": "DP-SGD (Identity + Poisson, PLD)",
    "bandmf": "BandMF bsr(4) + balls-in-bins (allocation)",
    "blt": "BLT (2 buffers) + balls-in-bins (allocation)",
}


@dataclass(frozen=True)
class Config:
    epsilon: float = 8.0
    delta: float = 1e-5
    clip: float = 1.0
    seeds: tuple = (0, 1)
    lr: float = 3e-3
    epochs: int = 2
    steps_per_epoch: int = 40
    examples: int = 2400
    holdout: float = 0.1
    context: int = 64
    d: int = 64
    layers: int = 2
    heads: int = 4
    bands: int = 4
    blt_buffers: int = 2
    eval_every: int = 20
    threads: int = 1
    fast: bool = False

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch


FAST = dict(seeds=(0,), epochs=2, steps_per_epoch=3, examples=240, context=32, d=32, layers=1, heads=2, eval_every=3,
            fast=True)


# ----------------------------------------------------------------------------------------- data
def _torch():
    import torch

    return torch


class StdlibLines:
    """Runs of whole lines (at most ``context`` bytes; a longer line is cut) of the sorted top-level stdlib
    ``.py`` files, ``max_examples`` of them; right-padded: ``input_ids`` PAD, ``attention_mask`` 0,
    ``labels`` -100 on the padding. A ``torch`` map-style dataset of dict items."""

    def __init__(self, context: int, max_examples: int, root: str | None = None) -> None:
        torch = _torch()
        root = Path(root or sysconfig.get_paths()["stdlib"])
        chunks: list[bytes] = []
        for path in sorted(root.glob("*.py")):
            cur = b""
            for line in path.read_bytes().splitlines(keepends=True):
                line = line[:context]
                if cur and (len(cur) + len(line) > context or not line.strip()):
                    chunks.append(cur)  # a full chunk, or a blank line ends a block
                    cur = b""
                if line.strip():
                    cur += line
                if len(chunks) >= max_examples:
                    break
            if cur and len(chunks) < max_examples:
                chunks.append(cur)
            if len(chunks) >= max_examples:
                break
        chunks = [c for c in chunks if len(c) >= 2]  # at least one next-byte target
        ids = torch.full((len(chunks), context), PAD, dtype=torch.long)
        for i, c in enumerate(chunks):
            ids[i, : len(c)] = torch.frombuffer(bytearray(c), dtype=torch.uint8).long()
        self.ids, self.mask = ids, (ids != PAD).long()
        self.labels = ids.masked_fill(self.mask == 0, -100)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}

    def split(self, holdout: float, seed: int = 0):
        torch = _torch()
        perm = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed)).tolist()
        n_test = max(1, int(holdout * len(self)))
        return torch.utils.data.Subset(self, perm[n_test:]), torch.utils.data.Subset(self, perm[:n_test])


def make_model(cfg: Config, seed: int):
    torch = _torch()
    import transformers

    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=cfg.context, n_embd=cfg.d, n_layer=cfg.layers,
                                     n_head=cfg.heads, bos_token_id=PAD, eos_token_id=PAD, pad_token_id=PAD,
                                     tie_word_embeddings=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    # the causal-LM loss by its name: transformers derives it from the class name, which "GPT2LMHeadModel"
    # does not contain, and then warns "loss_type=None ... Using the default loss: ForCausalLMLoss" (the same loss)
    model.loss_type = "ForCausalLM"
    assert model.lm_head.weight is model.transformer.wte.weight  # tied
    return model


def bits_per_byte(model, dataset, batch_size: int = 256) -> float:
    """Next-byte cross entropy in bits over the non-padded targets of ``dataset`` (a token mean over the set)."""
    torch = _torch()
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch in torch.utils.data.DataLoader(dataset, batch_size=batch_size):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            labels = batch["labels"][:, 1:]
            tok = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels, ignore_index=-100,
                                                    reduction="sum")
            total += float(tok)
            count += int((labels != -100).sum())
    model.train()
    return total / max(count, 1) / math.log(2)


# ----------------------------------------------------------------------------------- mechanisms
def mechanism(name: str, cfg: Config):
    """``(strategy, sampling, accountant)`` of a private row."""
    from dpmf.sampling import BallsInBinsSampling, PoissonSampling
    from dpmf.strategies import BLTStrategy, Identity, bsr, optimize_blt

    T, k, b = cfg.steps, cfg.epochs, cfg.steps_per_epoch
    if name == "dpsgd":
        return Identity(T), PoissonSampling(1.0 / b, T), "pld"
    if name == "bandmf":
        return bsr(T, cfg.bands), BallsInBinsSampling(k, T), "allocation"
    if name == "blt":
        blt, _ = optimize_blt(T, cfg.blt_buffers, k)
        return BLTStrategy.from_blt(blt, T), BallsInBinsSampling(k, T), "allocation"
    raise ValueError(f"unknown mechanism {name!r}; choose from {', '.join(MECHANISMS)}")


def train_one(name: str, seed: int, sigma: float | None, cfg: Config, data) -> dict:
    """One run; ``sigma`` None calibrates to ``cfg.epsilon``, else that sigma is certified."""
    torch = _torch()
    from dpmf.training.torch import make_private

    train, test = data
    model = make_model(cfg, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    start = time.perf_counter()
    result = {"mechanism": name, "seed": seed}
    privacy = None
    if name == "non-private":
        gen = torch.Generator().manual_seed(seed)
        size = max(1, round(len(train) / cfg.steps_per_epoch))
        batches = []
        for _ in range(cfg.epochs):
            perm = torch.randperm(len(train), generator=gen).tolist()
            batches += [perm[i * size : (i + 1) * size] for i in range(cfg.steps_per_epoch)]
        loader = torch.utils.data.DataLoader(train, batch_sampler=batches)
    else:
        strategy, sampling, accountant = mechanism(name, cfg)
        noise = dict(target_epsilon=cfg.epsilon) if sigma is None else dict(noise_multiplier=sigma)
        model, optimizer, loader, privacy = make_private(
            model, optimizer, train, strategy=strategy, sampling=sampling, delta=cfg.delta, max_grad_norm=cfg.clip,
            accountant=accountant, seed=seed, **noise)
    result["plan_seconds"] = time.perf_counter() - start
    curve = [[0, bits_per_byte(model, test)]]
    model.train()
    steps = 0
    for batch in loader:
        optimizer.zero_grad()
        out = model(**batch)
        loss = out.loss
        if name == "non-private":  # the same per-example objective, without dpmf's guard
            from dpmf.training.torch import per_example_causal_lm_loss

            loss = per_example_causal_lm_loss(out.logits, batch["labels"])
        loss.backward()
        optimizer.step()
        steps += 1
        if steps % cfg.eval_every == 0 or steps == cfg.steps:
            curve.append([steps, bits_per_byte(model, test)])
    if steps != cfg.steps:
        raise RuntimeError(f"{name}: {steps} steps, expected {cfg.steps}")
    if privacy is not None:
        report = privacy.report()
        if not (report.certified and report.epsilon <= cfg.epsilon * (1 + 1e-9) and report.method == METHODS[name]):
            raise RuntimeError(f"{name}: report not as required: certified={report.certified}, "
                               f"epsilon={report.epsilon}, method={report.method}")
        result.update(noise_multiplier=report.noise_multiplier, certified_epsilon=report.epsilon,
                      method=report.method, normalizer=privacy.run_spec.normalizer)
    result.update(bits_per_byte=curve[-1][1], initial_bits_per_byte=curve[0][1], curve=curve,
                  seconds=time.perf_counter() - start)
    return result


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for name in ("non-private", *MECHANISMS):
        mine = [r for r in runs if r["mechanism"] == name]
        if not mine:
            continue
        vals = [r["bits_per_byte"] for r in mine]
        rows.append({"mechanism": name, "label": LABELS[name], "sigma": mine[0].get("noise_multiplier"),
                     "epsilon": mine[0].get("certified_epsilon"), "method": mine[0].get("method"),
                     "bits_per_byte": statistics.fmean(vals),
                     "std": statistics.stdev(vals) if len(vals) > 1 else 0.0, "seeds": len(vals),
                     "initial": statistics.fmean(r["initial_bits_per_byte"] for r in mine)})
    return rows


def markdown(rows: list[dict], cfg: Config, info: dict) -> str:
    lines = [
        f"GPT-2 architecture (tied embeddings), {info['parameters']:,} parameters; {info['n_train']:,} training / "
        f"{info['n_test']:,} held-out examples of {cfg.context} bytes at most (mean length {info['mean_length']:.1f}); "
        f"T = {cfg.steps} ({cfg.epochs} epochs x {cfg.steps_per_epoch}), Adam lr {cfg.lr}, clip {cfg.clip}, "
        f"delta {cfg.delta}; seeds {list(cfg.seeds)}.",
        "",
        "| mechanism | sigma | certified epsilon | accountant | bits/byte (held out) |",
        "|---|---:|---:|---|---:|",
    ]
    for r in rows:
        sigma = "-" if r["sigma"] is None else f"{r['sigma']:.3f}"
        eps = "-" if r["epsilon"] is None else f"{r['epsilon']:.3f}"
        lines.append(f"| {r['label']} | {sigma} | {eps} | {r['method'] or '-'} | "
                     f"{r['bits_per_byte']:.3f} ± {r['std']:.3f} |")
    lines.append(f"\nUntrained model: {rows[0]['initial']:.3f} bits/byte.")
    return "\n".join(lines) + "\n"


def run(cfg: Config, out: Path | None = None, log=print) -> dict:
    torch = _torch()

    torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    corpus = StdlibLines(cfg.context, cfg.examples)
    train, test = corpus.split(cfg.holdout)
    info = {"n_train": len(train), "n_test": len(test), "mean_length": float(corpus.mask.sum(1).float().mean()),
            "parameters": sum(p.numel() for p in make_model(cfg, 0).parameters())}
    log(f"{info['n_train']} training / {info['n_test']} held-out examples, mean length {info['mean_length']:.1f}, "
        f"{info['parameters']:,} parameters, T = {cfg.steps}")
    runs, sigmas = [], {}
    for name in ("non-private", *MECHANISMS):
        for seed in cfg.seeds:
            r = train_one(name, seed, sigmas.get(name), cfg, (train, test))
            if name != "non-private":
                sigmas.setdefault(name, r["noise_multiplier"])
            runs.append(r)
            log(f"{name:12s} seed {seed}: bits/byte {r['initial_bits_per_byte']:.3f} -> {r['bits_per_byte']:.3f} "
                f"({r['seconds']:.1f} s)")
    rows = summarize(runs)
    md = markdown(rows, cfg, info)
    log(md)
    result = {"config": {**asdict(cfg), "steps": cfg.steps}, "info": info, "runs": runs, "summary": rows,
              "seconds": time.perf_counter() - start}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / "results.md").write_text(md)
    return result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fast", action="store_true", help="a few seconds: tiny model, 6 steps, one seed")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--seeds", type=str, default=None, help="comma-separated, e.g. 0,1,2")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    cfg = replace(Config(), **FAST) if a.fast else Config()
    if a.seeds:
        cfg = replace(cfg, seeds=tuple(int(s) for s in a.seeds.split(",")))
    if a.lr:
        cfg = replace(cfg, lr=a.lr)
    if a.threads:
        cfg = replace(cfg, threads=a.threads)
    return run(cfg, a.out)


if __name__ == "__main__":
    main()
