"""Right-padded token batches for the Hugging Face tests (imported by the test modules beside it)."""

from __future__ import annotations

import torch


class PaddedTokens(torch.utils.data.Dataset):
    """``n`` right-padded sequences of random lengths ``min_length..length`` over ids ``1..vocab-1``:
    pad id 0, attention 0 and label -100 on the padding."""

    def __init__(self, n: int, *, vocab: int, length: int, min_length: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, vocab, (n, length), generator=g)
        lengths = torch.randint(min_length, length + 1, (n,), generator=g)
        self.mask = (torch.arange(length)[None] < lengths[:, None]).long()
        self.ids[self.mask == 0] = 0
        self.labels = self.ids.masked_fill(self.mask == 0, -100)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}
