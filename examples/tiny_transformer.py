"""A small decoder-only transformer language model and an offline text corpus, for dpmf's examples
and benchmarks (``examples/stdlib_transformer.py``, ``benchmarks/bench_torch_ghost.py``).

The model is written with ``torch.nn`` layers that ghost mode covers with a rule (Embedding,
Linear, LayerNorm); attention is built from Linear projections and
``torch.nn.functional.scaled_dot_product_attention`` (``nn.MultiheadAttention`` would go to the
per-layer fallback, which is correct but slower). It takes Hugging Face-style keyword inputs,
``model(input_ids=..., attention_mask=..., labels=...)``, and returns an object with ``.logits`` and,
when labels are given, ``.loss``: the mean over the batch of each sequence's mean token loss over
its non-padded positions (a per-example loss, as per-example clipping needs; never one mean over all
tokens of the batch, which would couple examples).

The corpus is the Python standard library's own ``.py`` sources (``sysconfig.get_paths()["stdlib"]``),
byte-level (vocabulary 256 + a padding id), cut into chunks of ``context`` bytes: one training
example per chunk. It exists offline on every machine with Python.
"""

from __future__ import annotations

import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

PAD = 256
VOCAB = 257


@dataclass
class LMOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
        self.up, self.down = torch.nn.Linear(d, ffn), torch.nn.Linear(ffn, d)

    def forward(self, h, key_padding):
        B, T, d = h.shape
        x = self.ln1(h)
        split = lambda t: t.view(B, T, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        causal = torch.ones(T, T, dtype=torch.bool, device=h.device).tril()
        mask = causal & key_padding[:, None, None, :]  # (B, 1, T, T): attend to earlier, non-padded
        mask = mask | torch.eye(T, dtype=torch.bool, device=h.device)  # a padded query sees itself
        att = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), attn_mask=mask)
        h = h + self.o(att.transpose(1, 2).reshape(B, T, d))
        return h + self.down(F.gelu(self.up(self.ln2(h))))


class TinyTransformerLM(torch.nn.Module):
    """Decoder-only LM: token + position embeddings, ``layers`` pre-norm blocks, a LayerNorm and a head."""

    def __init__(self, *, d: int = 192, layers: int = 3, heads: int = 4, ffn: int = 768, context: int = 64,
                 vocab: int = VOCAB) -> None:
        super().__init__()
        self.context = context
        self.tok = torch.nn.Embedding(vocab, d, padding_idx=PAD)
        self.pos = torch.nn.Embedding(context, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads, ffn) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, input_ids, attention_mask=None, labels=None) -> LMOutput:
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = input_ids != PAD
        keep = attention_mask.bool()
        positions = torch.arange(T, device=input_ids.device).expand(B, T)  # batch-first: one call per example
        h = self.tok(input_ids) + self.pos(positions)
        for block in self.blocks:
            h = block(h, keep)
        logits = self.head(self.ln(h))
        loss = None if labels is None else sequence_loss(logits, labels, keep)
        return LMOutput(logits, loss)


def sequence_loss(logits, labels, keep):
    """Next-token loss: per sequence the mean over its non-padded predicted positions, then the mean
    over the batch (a per-example loss)."""
    pred, target, mask = logits[:, :-1], labels[:, 1:], (keep[:, 1:] & keep[:, :-1]).to(logits.dtype)
    tok = F.cross_entropy(pred.reshape(-1, pred.shape[-1]).float(), target.reshape(-1), reduction="none")
    tok = tok.view(target.shape)
    return ((tok * mask).sum(1) / mask.sum(1).clamp_min(1)).mean()


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


class StdlibCorpus(torch.utils.data.Dataset):
    """Chunks of ``context`` bytes of the standard library's ``.py`` files, sorted by path (deterministic).

    Each item is ``{"input_ids", "attention_mask", "labels"}``; a file's last, short chunk is padded
    with ``PAD`` (``attention_mask`` 0 there). ``max_examples`` keeps the first chunks."""

    def __init__(self, context: int = 64, max_examples: int | None = None, root: str | None = None) -> None:
        root = Path(root or sysconfig.get_paths()["stdlib"])
        chunks = []
        for path in sorted(root.glob("*.py")):  # the top level: ~200 files, ~8 MB
            data = path.read_bytes()
            for lo in range(0, len(data), context):
                chunks.append(data[lo : lo + context])
                if max_examples is not None and len(chunks) >= max_examples:
                    break
            if max_examples is not None and len(chunks) >= max_examples:
                break
        ids = torch.full((len(chunks), context), PAD, dtype=torch.long)
        for i, c in enumerate(chunks):
            ids[i, : len(c)] = torch.frombuffer(bytearray(c), dtype=torch.uint8).long()
        self.ids = ids
        self.mask = (ids != PAD).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.ids[i]}

    def split(self, holdout: float = 0.05, seed: int = 0):
        """``(train, test)`` subsets, the test set a random ``holdout`` fraction."""
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(len(self), generator=g)
        n_test = max(1, int(holdout * len(self)))
        return torch.utils.data.Subset(self, perm[n_test:].tolist()), torch.utils.data.Subset(self, perm[:n_test].tolist())


def bits_per_byte(model, dataset, batch_size: int = 256) -> float:
    """Mean next-token cross entropy in bits over the non-padded positions of ``dataset``."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch in loader:
            out = model(batch["input_ids"], batch["attention_mask"])
            keep = batch["attention_mask"].bool()
            mask = keep[:, 1:] & keep[:, :-1]
            tok = F.cross_entropy(out.logits[:, :-1].transpose(1, 2), batch["input_ids"][:, 1:], reduction="none")
            total += float((tok * mask).sum())
            count += int(mask.sum())
    model.train()
    return total / max(count, 1) / math.log(2)
