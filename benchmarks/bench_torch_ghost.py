"""PyTorch ghost mode: dpmf's ``grad_sample_mode="ghost"`` against plain torch, dpmf functorch, and
Opacus 1.6.0 hooks and ghost clipping; its peak memory; and what correlated noise costs in ghost mode.

Needs ``torch``, ``opacus==1.6.0`` and scikit-learn (digits). Every timed function pins torch to one
thread (``torch.set_num_threads(1)``). A step is ``zero_grad``, forward, loss, backward and
``optimizer.step()`` including fetching the batch from the side's data loader (Poisson sampling for
every private side, a shuffled fixed-size loader for plain torch). Same data, Poisson rate ``q``,
sigma, clip norm ``C = 1`` and initial weights on every side; SGD lr 0.01.

Setups (``B`` the expected batch ``q m``):

* ``mlp``: MLP 784-1024-256-10 (1,068,810 parameters), ``m = 8192`` random examples, ``B = 256``.
* ``cnn``: Conv2d 3-32-64-128 (3x3, GroupNorm(8), ReLU, 2x2 max-pool after each), Linear 2048-256-10
  (620,810 parameters), ``m = 4096`` random 3x32x32 images, ``B = 128``.
* ``transformer``: ``TinyTransformerLM`` of ``examples/tiny_transformer.py`` (d 192, 3 blocks, context
  64, 1,446,209 parameters) on ``StdlibCorpus(max_examples=4096)``, ``B = 64``; dict batches,
  ``model(**batch).loss`` (the mean over sequences of each sequence's token mean). Opacus ghost needs
  its own criterion wrapper, so there the model returns logits and the same loss is formed by
  ``CrossEntropyLoss(ignore_index=-100)(logits, shifted labels, shape=...)`` (per sequence the mean over
  its non-padded predicted positions, as ``sequence_loss``). Opacus 1.6.0's embedding norm sampler
  (``input_ids.view(-1, 1)``) fails on the model's expanded position ids, so for Opacus ghost only a
  forward pre-hook hands both embeddings contiguous ids (same values).
* ``digits``: MLP 64-32-10 on scikit-learn's digits, exactly as ``bench_torch_training.py`` (1,437
  standardized examples, ``q = 1/23``, ``B = 62.48``; Opacus ``int(q m) = 62``).

Sides: ``plain`` (no DP), ``dpmf_ghost`` (``make_private(..., Identity(T), PoissonSampling(q, T))``
without ``loss_fn``: the ``loss.backward(); optimizer.step()`` loop), ``dpmf_functorch`` (``loss_fn``,
``optimizer.step(x, y)``; mlp and digits only), ``opacus_hooks`` and ``opacus_ghost``
(``PrivacyEngine(accountant="prv").make_private(..., poisson_sampling=True, grad_sample_mode=...)``,
ghost with the returned criterion), and on the mlp ``dpmf_ghost_bsr4`` (``bsr(T, 4)``) and
``dpmf_ghost_blt2`` (``optimize_blt(T, 2)``), both with ``accountant="unamplified"``.

Timing: one process per setup builds every side, runs ``warmup`` steps of each, then ``rounds``
rounds; in each round every side (in a rotated order) runs one untimed step then ``block`` timed
steps, so drift hits all sides alike. Reported: the median over all timed steps of each side and
ratios of those medians; ``[lo-hi]`` is the range of the same ratio computed per round.

Peak memory: each (setup, side) in a fresh subprocess (``--memory-worker``) with
``MALLOC_MMAP_THRESHOLD_=65536`` (freed tensors return to the OS, so RSS follows live memory): after
imports, data and model, ``RSS0`` = ``VmRSS``; then the side is built (``make_private`` with
``accountant="unamplified"``, which does not change a step), the peak RSS is reset
(``/proc/self/clear_refs`` = 5), ``memory_steps`` steps run (3-10) and the training memory is
``VmHWM - RSS0`` (it includes what the private wrapper keeps, e.g. the noise state, but not accounting
transients). Reported with its ratio to plain torch's, and the RSS kept per step (``VmRSS`` after the
last step minus after the first, per step): > 0 means memory grows with the number of steps.

(An earlier version of ghost mode leaked each step's activations through a reference cycle; this
benchmark's RSS-per-step column found it, and it now reads 0 where it read +114 to +286 MiB.)

Agreement (mlp, and the same checks on cnn/transformer/digits):

* noise: with sigma = 100, steps per side until ``k d >= 2e5`` coordinates (one step at ~1M
  parameters, 83 on digits); the per-coordinate std of ``.grad`` pooled over them must be
  ``sigma C / B`` within 1% (Opacus ``B = int(q m)``, dpmf ``q m``; the clipped mean is negligible).
* clipping, on one fixed batch (dpmf's first Poisson batch): dpmf ghost's clipped sum
  (``optimizer.clipper.collect()`` after ``loss.backward()``: the sums ``step()`` adds the noise to)
  and dpmf functorch's (``clipper.clipped_sum``) against Opacus hooks' with sigma = 0 (``.grad``
  after ``step()`` is ``sum_i clip(g_i) / expected_batch_size``; times ``int(q m)`` gives the sum;
  dpmf divides by ``q m``, which differs on digits only) and Opacus ghost's; relative L2 difference <= 1e-4
  (both clip ``min(1, C/n_i)``; Opacus adds 1e-6 to ``n_i``, dpmf a relative margin of 9.5e-7 and
  returns upper bounds; the sums are float32).

Standalone: ``python benchmarks/bench_torch_ghost.py [--only mlp,cnn] [--sides plain,dpmf_ghost]
[--rounds R] [--no-memory] [--no-checks] [--json FILE]``
prints markdown tables; ``benchmarks/run.py --only ghost_step`` runs ``CASES`` (dpmf ghost vs Opacus
ghost per step, not interleaved, with the noise check; whole-call times there include ``make_private``).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from case import Case

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
DELTA = 1e-5
CLIP = 1.0
SIDES = ["plain", "dpmf_ghost", "dpmf_functorch", "opacus_hooks", "opacus_ghost", "dpmf_ghost_bsr4",
         "dpmf_ghost_blt2"]


def _torch():
    import torch

    torch.set_num_threads(1)
    return torch


# --------------------------------------------------------------------------------------- setups
@dataclass
class Setup:
    name: str
    data: Any
    make_model: Callable
    batch: int  # DataLoader batch size: q = 1 / ceil(m / batch) on every side (what Opacus derives)
    kind: str  # "xy": (x, y) and cross_entropy; "lm": dict batches, model(**batch).loss
    sides: list
    schedule: tuple  # warm-up steps, rounds, timed steps per block
    memory_steps: int

    @property
    def q(self) -> float:
        return 1 / math.ceil(len(self.data) / self.batch)


def _mlp():
    torch = _torch()
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(8192, 784, generator=g), torch.randint(0, 10, (8192,), generator=g))

    def model():
        return torch.nn.Sequential(
            torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256), torch.nn.ReLU(),
            torch.nn.Linear(256, 10),
        )

    return Setup("mlp", data, model, 256, "xy", SIDES, (2, 5, 4), 4)


def _cnn():
    torch = _torch()
    nn = torch.nn
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 3, 32, 32, generator=g),
                                          torch.randint(0, 10, (4096,), generator=g))

    def model():
        def block(c_in, c_out):
            return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.GroupNorm(8, c_out), nn.ReLU(), nn.MaxPool2d(2)]

        return nn.Sequential(*block(3, 32), *block(32, 64), *block(64, 128), nn.Flatten(),
                             nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, 10))

    return Setup("cnn", data, model, 128, "xy", SIDES[:2] + SIDES[3:5], (2, 5, 3), 3)


def _transformer():
    _torch()
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    from tiny_transformer import StdlibCorpus, TinyTransformerLM

    data = StdlibCorpus(context=64, max_examples=4096)
    return Setup("transformer", data, lambda: TinyTransformerLM(context=64), 64, "lm", SIDES[:2] + SIDES[3:5],
                 (2, 5, 3), 3)


def _digits():
    torch = _torch()
    from sklearn.datasets import load_digits
    from sklearn.preprocessing import StandardScaler

    X, y = load_digits(return_X_y=True)
    X, y = X[:1437], y[:1437]  # the size of the example's 80% training split
    X = StandardScaler().fit_transform(X)
    data = torch.utils.data.TensorDataset(torch.tensor(X, dtype=torch.float32), torch.tensor(y))

    def model():
        return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))

    return Setup("digits", data, model, 64, "xy", SIDES[:5], (10, 5, 20), 10)


SETUPS = {"mlp": _mlp, "cnn": _cnn, "transformer": _transformer, "digits": _digits}


# --------------------------------------------------------------------------------------- sides
@dataclass
class Runner:
    """One side of a setup: ``run()`` fetches the next batch and does one training step."""

    side: str
    model: Any
    optimizer: Any
    batches: Any
    step: Callable
    params: list
    expected_batch: float
    extra: dict = field(default_factory=dict)

    def run(self) -> float:
        t0 = time.perf_counter()
        self.step(next(self.batches))
        return time.perf_counter() - t0

    def grad(self):
        torch = _torch()
        return torch.cat([p.grad.detach().flatten().double() for p in self.params])


def _lm_targets(batch):
    """Opacus ghost's criterion input for the LM: next-token labels, -100 where ``sequence_loss`` masks."""
    keep = batch["attention_mask"].bool()
    target = batch["labels"][:, 1:].clone()
    target[~(keep[:, 1:] & keep[:, :-1])] = -100
    return target


def _strategy(side: str, T: int):
    from dpmf.strategies import BLTStrategy, Identity, bsr, optimize_blt

    if side.endswith("bsr4"):
        return bsr(T, 4), "unamplified"
    if side.endswith("blt2"):
        blt, _ = optimize_blt(T, 2, 1)
        return BLTStrategy.from_blt(blt, T), "unamplified"
    return Identity(T), "pld"


def _forever(loader):
    while True:
        yield from loader


def build(setup: Setup, side: str, *, sigma: float, steps: int, model=None, accountant: str | None = None,
          seed: int = 0) -> Runner:
    """The side's model (initial weights from ``manual_seed(0)``), optimizer, loader and step."""
    torch = _torch()
    F = torch.nn.functional
    if model is None:
        torch.manual_seed(0)
        model = setup.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    q = setup.q
    lm = setup.kind == "lm"

    def loss_of(model, batch):
        if lm:
            return model(**batch).loss
        x, y = batch
        return F.cross_entropy(model(x), y)

    if side == "plain":
        loader = torch.utils.data.DataLoader(setup.data, batch_size=setup.batch, shuffle=True, drop_last=True,
                                             generator=torch.Generator().manual_seed(seed))

        def step(batch):
            opt.zero_grad()
            loss_of(model, batch).backward()
            opt.step()

        return Runner(side, model, opt, _forever(loader), step, list(model.parameters()), setup.batch)

    if side.startswith("dpmf"):
        from dpmf.sampling import PoissonSampling
        from dpmf.training.torch import make_private

        strategy, default_accountant = _strategy(side, steps)
        functorch = side == "dpmf_functorch"
        run = make_private(
            model, opt, setup.data, strategy=strategy, sampling=PoissonSampling(q, steps), noise_multiplier=sigma,
            delta=DELTA, max_grad_norm=CLIP, seed=seed, accountant=accountant or default_accountant,
            **({"loss_fn": F.cross_entropy, "grad_sample_mode": "functorch"} if functorch else {}),
        )
        dp_opt = run.optimizer
        if functorch:
            def step(batch):
                dp_opt.zero_grad()
                dp_opt.step(*batch)
        else:
            def step(batch):
                dp_opt.zero_grad()
                loss_of(run.module, batch).backward()
                dp_opt.step()

        return Runner(side, run.module, dp_opt, iter(run.data_loader), step, dp_opt.params,
                      run.privacy.run_spec.normalizer, {"run": run})

    if side.startswith("opacus"):
        from opacus import PrivacyEngine

        mode = side.removeprefix("opacus_")
        loader = torch.utils.data.DataLoader(setup.data, batch_size=setup.batch)
        crit = torch.nn.CrossEntropyLoss(ignore_index=-100)
        if lm and mode == "ghost":
            # Opacus 1.6.0's embedding norm sampler does input_ids.view(-1, 1), which fails on the model's
            # expanded (non-contiguous) position ids: hand the embeddings contiguous ids (same values)
            for emb in (m for m in model.modules() if isinstance(m, torch.nn.Embedding)):
                emb.register_forward_pre_hook(lambda mod, args: tuple(a.contiguous() for a in args))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine = PrivacyEngine(accountant="prv")
            out = engine.make_private(
                module=model, optimizer=opt, data_loader=loader, noise_multiplier=sigma, max_grad_norm=CLIP,
                poisson_sampling=True, grad_sample_mode=mode, **({"criterion": crit} if mode == "ghost" else {}),
            )
        if mode == "ghost":
            pmodel, popt, pcrit, ploader = out

            def loss_ghost(batch):
                if lm:
                    logits = pmodel(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                    pred = logits[:, :-1]
                    return pcrit(pred.reshape(-1, pred.shape[-1]), _lm_targets(batch).reshape(-1), shape=pred.shape)
                x, y = batch
                return pcrit(pmodel(x), y)

            def step(batch):
                popt.zero_grad()
                loss_ghost(batch).backward()
                popt.step()

            loss_fn = loss_ghost
        else:
            pmodel, popt, ploader = out

            def step(batch):
                popt.zero_grad()
                loss_of(pmodel, batch).backward()
                popt.step()

            loss_fn = lambda batch: loss_of(pmodel, batch)  # noqa: E731

        def quiet(batch, step=step):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                step(batch)

        return Runner(side, pmodel, popt, _forever(ploader), quiet, list(model.parameters()),
                      popt.expected_batch_size, {"loss": loss_fn})
    raise ValueError(side)


# --------------------------------------------------------------------------------------- timing
def _steps_per_side(setup: Setup) -> int:
    warmup, rounds, block = setup.schedule
    return warmup + rounds * (block + 1) + 2


def time_setup(setup: Setup, sides: list | None = None, *, rounds: int | None = None, sigma: float = 1.0) -> dict:
    """``{side: [per-round lists of timed step seconds]}`` plus ``noise draw`` times (mlp)."""
    warmup, default_rounds, block = setup.schedule
    rounds = rounds or default_rounds
    setup.schedule = (warmup, rounds, block)
    sides = sides or setup.sides
    runners = [build(setup, s, sigma=sigma, steps=_steps_per_side(setup)) for s in sides]
    for r in runners:
        for _ in range(warmup):
            r.run()
    times = {r.side: [] for r in runners}
    for k in range(rounds):
        order = runners[k % len(runners):] + runners[: k % len(runners)]
        for r in order:
            r.run()  # untimed: warms this side's caches
            times[r.side].append([r.run() for _ in range(block)])
    out = {"times": times}
    if "dpmf_ghost_bsr4" in sides:
        out["draw"] = _draw_times(runners[0].params, ("dpmf_ghost", "dpmf_ghost_bsr4", "dpmf_ghost_blt2"), sigma)
    return out


def _draw_times(params, sides, sigma: float, T: int = 40) -> dict:
    """Median seconds of one ``noise.draw()`` per strategy (fresh generators, interleaved, first 3 dropped)."""
    from dpmf.training.torch import correlated_noise

    gens = {s: correlated_noise(_strategy(s, T)[0], list(params), noise_multiplier=sigma, max_grad_norm=CLIP, seed=1)
            for s in sides}
    times = {s: [] for s in sides}
    for t in range(T):
        for s in sides:
            t0 = time.perf_counter()
            gens[s].draw()
            times[s].append(time.perf_counter() - t0)
    return {s: statistics.median(v[3:]) for s, v in times.items()} | {
        f"{s}_memory_floats": gens[s].memory_floats for s in sides}


# --------------------------------------------------------------------------------------- memory
def _proc_status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(key)


def memory_worker(setup_name: str, side: str) -> dict:
    """In a fresh process: peak RSS of a few steps above the RSS after imports, data and model."""
    torch = _torch()
    import opacus  # noqa: F401  (imports before RSS0)
    from opacus import PrivacyEngine  # noqa: F401

    import dpmf.training.torch  # noqa: F401
    from dpmf.sampling import PoissonSampling  # noqa: F401
    from dpmf.strategies import Identity  # noqa: F401

    setup = SETUPS[setup_name]()
    torch.manual_seed(0)
    model = setup.make_model()
    rss0 = _proc_status("VmRSS")
    runner = build(setup, side, sigma=1.0, steps=setup.memory_steps + 2, model=model,
                   accountant="unamplified" if side.startswith("dpmf") else None)
    rss_setup = _proc_status("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current RSS
    after = []
    for _ in range(setup.memory_steps):
        runner.run()
        after.append(_proc_status("VmRSS"))
    peak = _proc_status("VmHWM")
    growth = (after[-1] - after[0]) / (len(after) - 1)  # RSS kept per step (a leak if > 0 for long)
    return {"rss0": rss0, "rss_setup": rss_setup, "peak": peak, "train": peak - rss0, "growth": growth}


def measure_memory(setup_name: str, side: str) -> dict:
    # a fixed mmap threshold: freed tensors go back to the OS at once, so VmHWM is the peak of live
    # memory rather than of glibc's retained heap (which depends on the allocation history)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--memory-worker", setup_name, side],
                          capture_output=True, text=True, env=env, cwd=str(HERE))
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------- agreement
def check_noise(setup: Setup, sides: list, sigma: float = 100.0) -> dict:
    """Steps with a huge sigma: ``std(.grad) / (sigma C / B) - 1`` per side, pooled over the last
    ``k`` steps with ``k d >= 2e5`` coordinates (one step at ~1M parameters; the standard error of
    the pooled std is then <= 0.16%)."""
    out = {}
    torch = _torch()
    for s in sides:
        if s == "plain" or s.endswith(("bsr4", "blt2")):
            continue
        d = sum(p.numel() for p in setup.make_model().parameters())
        k = math.ceil(2e5 / d)
        r = build(setup, s, sigma=sigma, steps=k + 2)
        grads = []
        for _ in range(k):
            r.run()
            grads.append(r.grad())
        out[s] = float(torch.cat(grads).std()) / (sigma * CLIP / r.expected_batch) - 1
    return out


def check_clipping(setup: Setup, sides: list) -> dict:
    """One fixed batch (dpmf's first Poisson batch), clipped sums compared as sums (Opacus' ``.grad``
    times its divisor ``int(q m)``; dpmf divides by ``q m``, which differs on digits only):

    * ``bound``: dpmf ghost's norms against the exact ones (float64 norms of Opacus hooks' per-sample
      gradients): each must be an upper bound (ratio >= 1 - 1e-6); reported: median and max inflation;
    * ``bookkeeping``: dpmf ghost's clipped sum (``clipper.collect()`` after ``loss.backward()``: what
      ``step()`` adds the noise to) against ``sum_i f_i g_i`` formed in float64 from Opacus' per-sample
      gradients with dpmf's own factors ``f_i = min(1, C (1 - margin) / n_i)``: relative L2 <= 1e-5;
    * ``rel``: relative L2 difference of each side's sum to Opacus hooks' (sigma 0, its own factors
      ``min(1, C / (n_i + 1e-6))``): <= 1e-4 for Opacus ghost and dpmf functorch, and for dpmf ghost
      <= its max bound inflation + 1e-5 (a looser upper bound clips harder: every example here is clipped,
      so the sum shrinks by about the inflation)."""
    torch = _torch()
    probe = build(setup, "dpmf_ghost", sigma=1.0, steps=4)
    batch = next(probe.batches)  # the first Poisson batch of dpmf's loader
    run = probe.extra["run"]
    clipper = run.optimizer.clipper
    grads, info = {}, {}
    probe.optimizer.zero_grad()
    if setup.kind == "lm":
        loss = run.module(**batch).loss
    else:
        loss = torch.nn.functional.cross_entropy(run.module(batch[0]), batch[1])
    loss.backward()
    sums, norms, _ = clipper.collect()
    grads["dpmf_ghost"] = torch.cat([s.flatten().double() for s in sums])
    B = int(norms.shape[0])
    info["clipped"] = float((norms > CLIP).double().mean())
    info["batch"] = B
    if "dpmf_functorch" in sides:
        fr = build(setup, "dpmf_functorch", sigma=1.0, steps=4)
        cg = fr.optimizer.clipper.clipped_sum(*batch)
        grads["dpmf_functorch"] = torch.cat([s.flatten().double() for s in cg.grads])
    for s in ("opacus_hooks", "opacus_ghost"):
        r = build(setup, s, sigma=0.0, steps=4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r.optimizer.zero_grad()
            r.extra["loss"](batch).backward()
            if s == "opacus_hooks":  # exact norms and dpmf's factors applied to Opacus' per-sample gradients
                samples = [p.grad_sample for p in r.params]
                exact_sq = torch.zeros(B, dtype=torch.float64)
                for g in samples:
                    for lo in range(0, B, 16):
                        exact_sq[lo:lo + 16] += g[lo:lo + 16].reshape(min(16, B - lo), -1).double().pow(2).sum(1)
                exact = exact_sq.sqrt()
                f = torch.clamp(CLIP * (1.0 - clipper.margin) / norms.double(), max=1.0)
                expected = torch.cat([
                    sum(torch.tensordot(f[lo:lo + 16], g[lo:lo + 16].double(), dims=1) for lo in range(0, B, 16)).flatten()
                    for g in samples])
                ratio = norms.double() / exact
                info["bound_min"], info["bound_median"], info["bound_max"] = (
                    float(ratio.min()), float(ratio.median()), float(ratio.max()))
                info["bookkeeping"] = float((grads["dpmf_ghost"] - expected).norm() / expected.norm())
            r.optimizer.step()
        grads[s] = r.grad() * r.expected_batch  # Opacus' .grad is the clipped sum / int(q m)
        info[f"{s}_B"] = r.expected_batch
    ref = grads["opacus_hooks"]
    info["rel"] = {s: float((g - ref).norm() / ref.norm()) for s, g in grads.items() if s != "opacus_hooks"}
    info["normalizer"] = run.privacy.run_spec.normalizer
    tol = {s: 1e-4 for s in info["rel"]}
    tol["dpmf_ghost"] = info["bound_max"] - 1 + 1e-5
    info["ok"] = (info["bound_min"] >= 1 - 1e-6 and info["bookkeeping"] <= 1e-5
                  and all(v <= tol[s] for s, v in info["rel"].items()))
    return info


# --------------------------------------------------------------------------------------- report
def _median(rounds: list) -> float:
    return statistics.median(t for r in rounds for t in r)


def _ratio_range(a: list, b: list) -> tuple[float, float]:
    rs = [statistics.median(x) / statistics.median(y) for x, y in zip(a, b)]
    return min(rs), max(rs)


def report(setup: Setup, timing: dict, memory: dict) -> list[str]:
    t = timing["times"]
    plain = _median(t["plain"])
    lines = []
    for s in setup.sides:
        if s not in t:
            continue
        m = _median(t[s])
        lo, hi = _ratio_range(t[s], t["plain"])
        row = f"| {setup.name} | `{s}` | {1e3 * m:.2f} | {m / plain:.2f}x [{lo:.2f}-{hi:.2f}] |"
        if s == "dpmf_ghost":
            for peer in ("opacus_ghost", "opacus_hooks"):
                if peer in t:
                    lo2, hi2 = _ratio_range(t[peer], t[s])
                    row += f" {_median(t[peer]) / m:.2f}x [{lo2:.2f}-{hi2:.2f}] |"
                else:
                    row += " |"
        else:
            row += " | |"
        mem = memory.get(s)
        if mem is None:
            row += " | | |"
        elif "error" in mem:
            row += f" n/a ({mem['error'][:80]}) | | |"
        else:
            base = memory.get("plain", {}).get("train")
            ratio = f"{mem['train'] / base:.2f}x" if base else ""
            row += f" {mem['train'] / 2**20:.1f} | {ratio} | {mem.get('growth', 0) / 2**20:+.1f} |"
        lines.append(row)
    return lines


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="dpmf ghost mode vs plain torch and Opacus hooks/ghost")
    p.add_argument("--only", default=None, help="comma-separated setups (mlp,cnn,transformer,digits)")
    p.add_argument("--rounds", type=int, default=None, help="timing rounds (default per setup)")
    p.add_argument("--sides", default=None, help="comma-separated sides to time (default: the setup's)")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--no-timing", action="store_true", help="only the memory and agreement checks")
    p.add_argument("--no-checks", action="store_true")
    p.add_argument("--json", default=None, help="write the raw results here")
    p.add_argument("--memory-worker", nargs=2, metavar=("SETUP", "SIDE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_worker:
        print(json.dumps(memory_worker(*args.memory_worker)))
        return 0
    import dpmf
    import torch

    print(f"dpmf {dpmf.__file__}, torch {torch.__version__}",
          file=sys.stderr, flush=True)
    names = args.only.split(",") if args.only else list(SETUPS)
    raw, failed = {}, 0
    lines = ["| setup | side | ms/step (median) | / plain [per-round range] | dpmf ghost vs Opacus ghost (opacus/dpmf) "
             "| vs Opacus hooks (opacus/dpmf) | train peak MiB | / plain | RSS kept per step MiB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    checks = []
    for name in names:
        setup = SETUPS[name]()
        if args.sides:
            setup.sides = [s for s in setup.sides if s in args.sides.split(",")]
        print(f"[{time.strftime('%H:%M:%S')}] {name}: timing {setup.sides}", file=sys.stderr, flush=True)
        timing = {"times": {}} if args.no_timing else time_setup(setup, rounds=args.rounds)
        memory = {}
        if not args.no_memory:
            for s in setup.sides:
                print(f"[{time.strftime('%H:%M:%S')}] {name}: memory {s}", file=sys.stderr, flush=True)
                memory[s] = measure_memory(name, s)
        if not args.no_checks:
            print(f"[{time.strftime('%H:%M:%S')}] {name}: agreement checks", file=sys.stderr, flush=True)
            noise = check_noise(setup, setup.sides)
            clip = check_clipping(setup, setup.sides)
            ok_noise = all(abs(v) <= 0.01 for v in noise.values())
            ok_clip = clip["ok"]
            failed += not (ok_noise and ok_clip)
            checks.append(
                f"| {name} | {'ok' if ok_noise else '**FAIL**'}: "
                + ", ".join(f"{s} {v:+.2%}" for s, v in noise.items())
                + f" | {'ok' if ok_clip else '**FAIL**'}: dpmf ghost norm / exact norm min "
                f"{clip['bound_min'] - 1:+.1e}, median {clip['bound_median'] - 1:+.1e}, max {clip['bound_max'] - 1:+.1e}; "
                f"book-keeping vs sum f_i g_i {clip['bookkeeping']:.1e}; sum vs Opacus hooks: "
                + ", ".join(f"{s} {v:.1e}" for s, v in clip["rel"].items())
                + f" (batch {clip['batch']}, {clip['clipped']:.0%} clipped; dpmf / {clip['normalizer']:.2f}, "
                f"Opacus / {clip['opacus_hooks_B']}) |")
            raw[name] = {"noise": noise, "clip": clip}
        raw.setdefault(name, {}).update({"timing": timing, "memory": memory})
        if not args.no_timing:
            lines += report(setup, timing, memory)
        print("\n".join(lines[-len(setup.sides):]), file=sys.stderr, flush=True)
        if "draw" in timing:
            t = timing["times"]
            ident = _median(t["dpmf_ghost"])
            for s in ("dpmf_ghost_bsr4", "dpmf_ghost_blt2"):
                extra = _median(t[s]) - ident
                lo, hi = _ratio_range(t[s], t["dpmf_ghost"])
                d = timing["draw"]
                dx = d[s] - d["dpmf_ghost"]
                checks.append(
                    f"| {name} noise `{s.removeprefix('dpmf_ghost_')}` | step {1e3 * _median(t[s]):.2f} vs identity "
                    f"{1e3 * ident:.2f} ms: {extra / ident:+.1%} (per-round ratio {lo:.3f}-{hi:.3f}) | noise.draw() "
                    f"{1e3 * d[s]:.2f} vs {1e3 * d['dpmf_ghost']:.2f} ms: +{1e3 * dx:.2f} ms = {dx / ident:.1%} of a "
                    f"step; state {d[s + '_memory_floats'] * 4 / 2**20:.1f} MiB |")
    print("\n".join(lines))
    print()
    print("| setup | noise std vs sigma C / B (sigma 100, tol 1%) | clipping on one batch (bound >= exact; "
          "book-keeping tol 1e-5; sums vs Opacus hooks tol 1e-4, dpmf ghost: its max inflation + 1e-5) |")
    print("|---|---|---|")
    print("\n".join(checks))
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1, default=str))
    return 1 if failed else 0


# --------------------------------------------------------------------------------------- run.py cases
def _case_steps(setup_name: str, side: str, sigma: float = 100.0):
    def run():
        torch = _torch()
        setup = SETUPS[setup_name]()
        warmup, _, block = setup.schedule
        d = sum(p.numel() for p in setup.make_model().parameters())
        pool = math.ceil(2e5 / d)  # steps pooled for the .grad std (k d >= 2e5 coordinates)
        timed = max(2 * block, pool)
        r = build(setup, side, sigma=sigma, steps=warmup + timed + 2)
        for _ in range(warmup):
            r.run()
        times, grads = [], []
        for i in range(timed):
            times.append(r.run())
            if i >= timed - pool:
                grads.append(r.grad())
        std = float(torch.cat(grads).std())
        return {"times": times, "rel_std": std / (sigma * CLIP / r.expected_batch) - 1, "B": r.expected_batch}

    return run


def _compare_ghost(peer, ours) -> tuple[bool, str]:
    mp, mo = statistics.median(peer["times"]), statistics.median(ours["times"])
    ok = abs(peer["rel_std"]) <= 0.01 and abs(ours["rel_std"]) <= 0.01
    return ok, (f"step median opacus ghost {1e3 * mp:.2f} ms, dpmf ghost {1e3 * mo:.2f} ms, opacus/dpmf {mp / mo:.2f}x "
                f"(not interleaved: the standalone script is the speed reference); .grad std vs sigma*C/B: "
                f"opacus {peer['rel_std']:+.2%} (B={peer['B']}), dpmf {ours['rel_std']:+.2%} (B={ours['B']:.2f})")


CASES = [
    Case(f"ghost_step_{s}", _case_steps(s, "opacus_ghost"), _case_steps(s, "dpmf_ghost"), _compare_ghost,
         "per-step medians; .grad std within 1% of sigma*C/B on both sides (sigma 100)", peer_name="opacus",
         slow=s == "transformer")
    for s in ("mlp", "cnn", "transformer", "digits")
]


if __name__ == "__main__":
    sys.exit(main())
