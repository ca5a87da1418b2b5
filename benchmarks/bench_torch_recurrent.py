"""Recurrent layers under per-example clipping: a private step against a plain step, dpmf ghost and
functorch modes on an unchanged ``nn.LSTM``/``nn.GRU`` model, and Opacus 1.6.0's ``DPLSTM``/``DPGRU``
(its drop-in modules built from Linear cells, hooks mode) on the same weights and batch.

Model: ``Linear`` head on the last output of a recurrent layer (``nn.LSTM`` or ``nn.GRU``, input 32,
hidden 64, batch_first), float32, inputs ``(B, T, 32)`` random, 10 classes, cross-entropy (mean).
Setups: ``lstm`` (1 layer, ``B = 64``, ``T = 32``), ``lstm2bi`` (2 layers, bidirectional, ``B = 32``,
``T = 32``), ``gru`` (1 layer, ``B = 64``, ``T = 32``), ``lstm_text`` (issue 52's text classifier: token ids
of a vocabulary of 1000 through ``Embedding(1000, 32)`` into the 1-layer LSTM, ``B = 32``, ``T = 64``).

A step is ``zero_grad``, forward, loss, backward, and ``SGD.step``; the private sides also form the
clipped sum and add Gaussian noise ``sigma C N(0, I)`` before dividing by ``B``:

* ``plain``: no clipping;
* ``dpmf_ghost``: :class:`~dpmf.training.torch.ghost.GhostClipper` on the model (the loop form:
  ``loss.backward()``, then ``collect()``);
* ``dpmf_functorch``: :class:`~dpmf.training.torch.grad_sample.PerExampleClipper` (``clipped_sum``: its own
  forward and backward per example under ``vmap``);
* ``opacus_hooks``: the model rebuilt with ``opacus.layers.DPLSTM``/``DPGRU`` (``load_state_dict`` of the
  same weights), ``PrivacyEngine().make_private(..., grad_sample_mode="hooks")`` on a fixed-size loader
  (``poisson_sampling=False``), its ``DPOptimizer`` loop.

Agreement: on one batch, the clipped sums of dpmf ghost, dpmf functorch and Opacus (per-example
gradients from its ``GradSampleModule``, clipped ``min(1, C / (n_i + 1e-6))``) are compared per
parameter name; relative L2 difference must be <= 1e-4 (float32).

Timing: every side pinned to one thread, ``warmup`` steps each, then ``rounds`` rounds; each round runs
every side (rotated order) for one untimed and ``block`` timed steps. Times are the process's CPU time
(``time.process_time``; one torch thread, so it is the step's compute, robust to other processes on a
shared machine). Reported: medians over all timed steps and the ratio to plain; ``[lo-hi]`` the
per-round range of that ratio.

``python benchmarks/bench_torch_recurrent.py [--only lstm,gru] [--rounds R]``
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings


def _setups():
    return {
        "lstm": dict(cell="LSTM", layers=1, bidirectional=False, B=64, T=32),
        "lstm2bi": dict(cell="LSTM", layers=2, bidirectional=True, B=32, T=32),
        "gru": dict(cell="GRU", layers=1, bidirectional=False, B=64, T=32),
        # issue 52's text classifier: token ids -> Embedding(1000, 32) -> LSTM(32, 64) -> head
        "lstm_text": dict(cell="LSTM", layers=1, bidirectional=False, B=32, T=64, vocab=1000),
    }


def _model(torch, cell, layers, bidirectional, opacus=False, vocab=None):
    if opacus:
        from opacus.layers import DPGRU, DPLSTM

        cls = {"LSTM": DPLSTM, "GRU": DPGRU}[cell]
    else:
        cls = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}[cell]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, 32) if vocab else None
            self.rnn = cls(32, 64, num_layers=layers, bidirectional=bidirectional, batch_first=True)
            self.head = torch.nn.Linear(64 * (2 if bidirectional else 1), 10)

        def forward(self, x):
            return self.head(self.rnn(x if self.emb is None else self.emb(x))[0][:, -1])

    return Net()


def _load(model, state):
    """Load an ``nn.LSTM`` model's weights into its Opacus twin (DPLSTM maps names only at its own level)."""
    model.rnn.load_state_dict({k.removeprefix("rnn."): v for k, v in state.items() if k.startswith("rnn.")})
    model.head.load_state_dict({k.removeprefix("head."): v for k, v in state.items() if k.startswith("head.")})
    if model.emb is not None:
        model.emb.load_state_dict({k.removeprefix("emb."): v for k, v in state.items() if k.startswith("emb.")})


def build(setup: dict, sigma: float = 1.0, clip: float = 1.0):
    import torch

    from dpmf.training.torch.ghost import GhostClipper
    from dpmf.training.torch.grad_sample import PerExampleClipper

    F = torch.nn.functional
    torch.manual_seed(0)
    B, T = setup["B"], setup["T"]
    vocab = setup.get("vocab")
    x = torch.randint(0, vocab, (B, T)) if vocab else torch.randn(B, T, 32)
    y = torch.randint(0, 10, (B,))
    base = _model(torch, setup["cell"], setup["layers"], setup["bidirectional"], vocab=vocab)
    state = base.state_dict()
    sides, probes = {}, {}

    def fresh():
        m = _model(torch, setup["cell"], setup["layers"], setup["bidirectional"], vocab=vocab)
        m.load_state_dict(state)
        return m, torch.optim.SGD(m.parameters(), lr=0.01)

    def noisy_step(model, opt, sums):
        for p, s in zip([p for p in model.parameters() if p.requires_grad], sums):
            p.grad = (s + sigma * clip * torch.randn_like(s)) / B
        opt.step()

    m0, o0 = fresh()

    def plain():
        o0.zero_grad()
        F.cross_entropy(m0(x), y).backward()
        o0.step()

    sides["plain"] = plain

    m1, o1 = fresh()
    ghost = GhostClipper(m1, None, clip)

    def dpmf_ghost():
        o1.zero_grad()
        F.cross_entropy(m1(x), y).backward()
        sums, _, _ = ghost.collect()
        noisy_step(m1, o1, sums)

    sides["dpmf_ghost"] = dpmf_ghost

    def ghost_sums():
        F.cross_entropy(m1(x), y).backward()
        sums, _, _ = ghost.collect()
        m1.zero_grad()
        return dict(zip(ghost.param_names, sums))

    probes["dpmf_ghost"] = ghost_sums

    m2, o2 = fresh()
    fclip = PerExampleClipper(m2, F.cross_entropy, clip)

    def dpmf_functorch():
        o2.zero_grad()
        noisy_step(m2, o2, fclip.clipped_sum(x, y).grads)

    sides["dpmf_functorch"] = dpmf_functorch
    probes["dpmf_functorch"] = lambda: dict(zip(fclip.param_names, fclip.clipped_sum(x, y).grads))

    try:
        from opacus import GradSampleModule, PrivacyEngine

        m3 = _model(torch, setup["cell"], setup["layers"], setup["bidirectional"], opacus=True, vocab=vocab)
        _load(m3, state)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=B)
            pm, po, _ = PrivacyEngine().make_private(
                module=m3, optimizer=torch.optim.SGD(m3.parameters(), lr=0.01), data_loader=loader,
                noise_multiplier=sigma, max_grad_norm=clip, poisson_sampling=False, grad_sample_mode="hooks")

        def opacus_hooks():
            po.zero_grad()
            F.cross_entropy(pm(x), y).backward()
            po.step()

        sides["opacus_hooks"] = opacus_hooks

        m4 = _model(torch, setup["cell"], setup["layers"], setup["bidirectional"], opacus=True, vocab=vocab)
        _load(m4, state)
        gsm = GradSampleModule(m4)

        def opacus_sums():
            gsm.zero_grad()
            F.cross_entropy(gsm(x), y).backward()
            named = {n.removeprefix("_module."): p.grad_sample for n, p in gsm.named_parameters()}
            norms = torch.sqrt(sum((g.double() ** 2).flatten(1).sum(1) for g in named.values()))
            f = (clip / (norms + 1e-6)).clamp(max=1.0)
            return {n: torch.tensordot(f, g.double(), dims=1) for n, g in named.items()}

        probes["opacus_hooks"] = opacus_sums
    except ImportError:
        pass
    return sides, probes


def agreement(probes) -> dict:
    sums = {k: fn() for k, fn in probes.items()}
    ref = sums["dpmf_functorch"]
    out = {}
    for side, s in sums.items():
        if side == "dpmf_functorch":
            continue
        num = sum(float(((s[n].double() - ref[n].double()) ** 2).sum()) for n in ref)
        den = sum(float((ref[n].double() ** 2).sum()) for n in ref)
        out[side] = (num / den) ** 0.5
    return out


def time_sides(sides: dict, rounds: int, block: int = 3, warmup: int = 2) -> dict:
    import torch

    torch.set_num_threads(1)
    names = list(sides)
    for n in names:
        for _ in range(warmup):
            sides[n]()
    times = {n: [] for n in names}
    per_round = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            sides[n]()
            ts = []
            for _ in range(block):
                t0 = time.process_time()
                sides[n]()
                ts.append(time.process_time() - t0)
            times[n] += ts
            per_round[n].append(statistics.median(ts))
    return {n: (statistics.median(times[n]), per_round[n]) for n in names}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="lstm,lstm2bi,gru,lstm_text")
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args(argv)
    setups = _setups()
    print("| setup | side | step (ms) | / plain [lo-hi] | clipped sum vs dpmf functorch (rel. L2) |")
    print("|---|---|---|---|---|")
    for name in args.only.split(","):
        sides, probes = build(setups[name])
        agree = agreement(probes)
        assert all(v <= 1e-4 for v in agree.values()), agree
        res = time_sides(sides, args.rounds)
        plain, plain_rounds = res["plain"]
        for side, (med, rounds) in res.items():
            ratios = [a / b for a, b in zip(rounds, plain_rounds)]
            rng = f"{med / plain:.2f} [{min(ratios):.2f}-{max(ratios):.2f}]" if side != "plain" else "1"
            a = f"{agree[side]:.1e}" if side in agree else ("(reference)" if side == "dpmf_functorch" else "")
            print(f"| {name} | {side} | {med * 1e3:.1f} | {rng} | {a} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
