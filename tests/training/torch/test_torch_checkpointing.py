"""Ghost mode under activation checkpointing (``torch.utils.checkpoint``, non-reentrant): the blocks are
recomputed inside the backward, and the clipped sums and norms are those of the same model without
checkpointing and of the definition (each example alone through ``torch.autograd.grad``, float64).
Reentrant checkpointing is refused with the fix. (``DPTrainer`` with ``gradient_checkpointing=True``:
test_torch_huggingface_trainer.py.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpmf.errors import UnsupportedConfigurationError  # noqa: E402
from dpmf.training.torch.clipping import clip_factors  # noqa: E402
from dpmf.training.torch.ghost import GhostClipper  # noqa: E402

F = torch.nn.functional
B, T, D, V = 5, 6, 8, 11


class Scale(torch.nn.Module):
    """A layer without a ghost rule (the fallback's per-example gradients)."""

    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x):
        return x * self.weight


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.up, self.scale, self.down = torch.nn.LayerNorm(D), torch.nn.Linear(D, 2 * D), Scale(2 * D), \
            torch.nn.Linear(2 * D, D)

    def forward(self, x):
        return x + self.down(self.scale(F.gelu(self.up(self.norm(x)))))


class Net(torch.nn.Module):
    """Embedding (tied to the output layer) -> checkpointed blocks -> logits, one example per row."""

    def __init__(self, checkpoint=None):
        super().__init__()
        self.embed, self.blocks = torch.nn.Embedding(V, D), torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(D, V, bias=False)
        self.head.weight = self.embed.weight
        self.checkpoint = checkpoint  # None, or use_reentrant's value

    def forward(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            if self.checkpoint is None:
                h = block(h)
            else:
                h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=self.checkpoint)
        return self.head(h)


def loss_fn(logits, y):  # per example: the sum over positions; the batch mean
    return F.cross_entropy(logits.transpose(1, 2), y, reduction="none").sum(1).mean()


@pytest.fixture
def case():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    net = Net()
    ids, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    yield net, ids, y
    torch.set_default_dtype(old)


def definition(net, ids, y, clip, margin):
    params = [p for p in net.parameters() if p.requires_grad]
    per = [torch.autograd.grad(loss_fn(net(ids[i : i + 1]), y[i : i + 1]), params) for i in range(B)]
    norms = torch.stack([torch.sqrt(sum((g ** 2).sum() for g in gs)) for gs in per])
    f = clip_factors(norms, clip, margin)
    return [sum(f[i] * per[i][k] for i in range(B)) for k in range(len(params))], norms


def loop_form(clipper, net, ids, y):
    loss_fn(net(ids), y).backward()
    sums, norms, backwards = clipper.collect()
    assert backwards == 1
    return sums, norms


@pytest.mark.parametrize("form", ["clipped_sum", "loop"])
def test_recomputed_blocks_give_the_sums_of_the_definition(case, form):
    net, ids, y = case
    results = {}
    for checkpoint in (None, False):
        net.checkpoint = checkpoint
        clipper = GhostClipper(net, loss_fn, 0.5)
        recomputed = []
        hook = net.blocks[0].up.register_forward_pre_hook(lambda *a: recomputed.append(torch.is_grad_enabled()))
        try:
            if form == "loop":
                results[checkpoint] = loop_form(clipper, net, ids, y)
            else:
                got = clipper.clipped_sum(ids, y)
                results[checkpoint] = got.grads, got.norms
            # nothing left detached (a recomputation stops inside the block's last layer, whose hook never runs)
            assert all(isinstance(p, torch.nn.Parameter) for p in net.parameters())
        finally:
            hook.remove()
            clipper.close()
        assert len(recomputed) == (1 if checkpoint is None else 2)  # the forward, and its recomputation
    want_sums, want_norms = definition(net, ids, y, 0.5, clipper.margin)
    assert (want_norms > 0.5).all()  # every example clipped
    for sums, norms in results.values():
        assert torch.allclose(norms, want_norms, rtol=1e-10, atol=0)
        for name, a, b in zip(clipper.param_names, sums, want_sums):
            assert torch.allclose(a, b, rtol=1e-9, atol=1e-12), name
    (plain_sums, plain_norms), (ckpt_sums, ckpt_norms) = results[None], results[False]
    assert torch.equal(plain_norms, ckpt_norms)
    assert all(torch.equal(a, b) for a, b in zip(plain_sums, ckpt_sums))


def test_reentrant_checkpointing_is_refused_with_the_fix(case):
    net, ids, y = case
    net.checkpoint = True
    clipper = GhostClipper(net, loss_fn, 0.5)
    with pytest.raises(UnsupportedConfigurationError, match=r"reentrant activation checkpointing.*use_reentrant=False"):
        loss_fn(net(ids), y).backward()
    clipper.close()
