"""Stdlib transformer: DP-SGD against correlated noise (BandMF, BLT) on a small language model, at equal epsilon.

A byte-level decoder-only transformer (``examples/tiny_transformer.py``: ``TinyTransformerLM``) is
trained on the Python standard library's own ``.py`` sources (``StdlibCorpus``: chunks of
``context`` bytes, dict items ``input_ids`` / ``attention_mask`` / ``labels``) with dpmf's
Opacus-style loop in ghost mode (``make_private`` without ``loss_fn``)::

    for batch in loader:                 # dict batches, one per step, as the accountant assumed
        optimizer.zero_grad()
        model(**batch).loss.backward()   # per-sequence mean token loss, then the batch mean
        optimizer.step()                 # clipped sum + sigma * C^{-1} z, / the expected batch size

Every private row is calibrated by ``make_private(..., target_epsilon=eps)`` with the accountant
its (strategy, sampler) pair calls for, and every training run's report is checked (certified,
``epsilon <= eps``, the expected method):

==========  ==================================  ===============================  ==========================
row         strategy C                          sampling                         accountant
==========  ==================================  ===============================  ==========================
dpsgd       ``Identity(T)``                     ``PoissonSampling(1/b, T)``      pld (tight)
bandmf      ``bsr(T, 4)`` (banded square root)  ``BallsInBinsSampling(k, T)``    allocation (Renyi bound)
blt         ``optimize_blt(T, 2, k)`` as        ``BallsInBinsSampling(k, T)``    allocation (Renyi bound)
            ``BLTStrategy``
==========  ==================================  ===============================  ==========================

``T = k * b`` (``EPOCHS`` epochs of ``STEPS_PER_EPOCH`` steps); every row divides the noisy clipped
sum by the same public normalizer, the expected batch size ``n_train / b`` (make_private's
default). A non-private row trains the same model with the same loop, optimizer and lr grid on
shuffled batches of that size (``round(n_train / b)``), without dpmf and without clipping.

Setup (full run): the first ``EXAMPLES`` = 3,600 chunks of 64 bytes of the sorted top-level
stdlib files (230 KB: ``__future__.py`` to ``_py_abc.py`` whole, then the first 2,054 chunks,
57%, of ``_pydecimal.py``), split
90/10 at random with seed 0 by ``StdlibCorpus.split`` (3,240 training and 360 held-out chunks; the
held-out chunks come from the same files, so this measures in-distribution next-byte
prediction); 2 epochs of 50 steps (T = 100, expected batch 64.8); model
``TinyTransformerLM(d=128, layers=2, heads=4, ffn=512, context=64)``, 471,041 parameters (the
module's default d=192, 3 layers, 1.45M parameters is ``--d 192 --layers 3 --ffn 768``; it
measured 1.6 s per private step against 0.7 s for this one, single-threaded on the shared machine,
which would not fit 20 runs in ~25 minutes); Adam (betas 0.9, 0.999, no weight decay);
per-example clip norm 1.0; delta 1e-5 (below 1 / n_train); epsilon 8.

Protocol (the same for every row, the non-private one included): every learning rate of ``LRS``
= {3e-3, 1e-2, 3e-2} is trained with seed 0; the lr with the lowest final validation bits/byte is
then trained with seeds 1 and 2, and the table reports the mean and sample std over the three
seeds at that lr. The validation bits/byte (``bits_per_byte``: next-byte cross entropy in bits over
the non-padded positions of the held-out split) is evaluated every ``EVAL_EVERY`` steps. Choosing
the lr on the held-out split flatters every row alike; the lr search is not privacy-accounted (as
usual in DP benchmarks). A row's first run (first lr, seed 0) calibrates
(``make_private(target_epsilon=eps)``); its other runs pass the calibrated ``noise_multiplier`` and
``make_private`` re-certifies it with the same accountant. The seed of a run seeds the model
initialization, the batches and the noise.

Memory: each run records its resident memory before and after training (``rss_mb_before`` /
``rss_mb_after`` in ``results.json``). This example found a leak in dpmf's ghost mode (a reference
cycle through autograd's tensor-hook storage kept every step's activations alive, ~130 MB per step);
it is fixed in dpmf (``ghost/clipper.py``, ``_release``) and the fast-mode test checks that memory
stays flat. The full run in ``examples/results/stdlib_transformer/`` was made before the fix, with a
workaround in this script that emptied each finished call's tensors (the same thing dpmf now does).

Run::

    python examples/stdlib_transformer.py --out examples/results/stdlib_transformer   # full (~20 min)
    python examples/stdlib_transformer.py --fast --out /tmp/stdlib_fast               # ~35-55 s

``--out DIR`` writes ``results.json`` (config, the calibrations, every run with its sigma,
certified epsilon, method and validation curve, the summary), ``results.md`` (the tables) and
``bits_per_byte.png`` (validation bits/byte against the step, best lr, mean over seeds). Two worker
processes (``--workers``) with one torch thread each (``--threads``): on the shared 2-core machine,
two torch threads in one process made a ghost-mode step ~6x slower (4.4 s instead of 0.7 s) while
another job kept a core busy. Needs ``torch`` and ``matplotlib``.

Measured on 2 cores (x86_64, torch 2.13.0 CPU), 2026-11-25, with another job keeping one core busy
(load average ~2.5-3): full run 1,195 s wall (private runs of 100 steps 86-175 s each, i.e. 1.0-1.5
s per step with two workers sharing the free core; calibration 8 s for DP-SGD's PLD, 16 s and 26 s
for BandMF's and BLT's allocation bound); ``--fast`` 35 s alone, 51-56 s next to the full run.
Results and discussion: ``examples/README.md``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiny_transformer.py sits next to this file

DELTA = 1e-5
CLIP = 1.0
EPOCHS = 2
STEPS_PER_EPOCH = 50
EXAMPLES = 3600
HOLDOUT = 0.1
CONTEXT = 64
D, LAYERS, HEADS, FFN = 128, 2, 4, 512
BANDS = 4
BLT_BUFFERS = 2
EPSILONS = (8.0,)
SEEDS = (0, 1, 2)
LRS = (3e-3, 1e-2, 3e-2)
EVAL_EVERY = 20
MECHANISMS = ("dpsgd", "bandmf", "blt")

LABELS = {
    "non-private": "non-private Adam (same loop, no clipping)",
    "dpsgd": "DP-SGD (Identity + Poisson, PLD)",
    "bandmf": f"BandMF bsr({BANDS}) + balls-in-bins (allocation)",
    "blt": f"BLT ({BLT_BUFFERS} buffers) + balls-in-bins (allocation)",
}
#: the accountant each private row must be certified by
METHODS = {"dpsgd": "pld", "bandmf": "allocation", "blt": "allocation"}


@dataclass(frozen=True)
class Config:
    epsilons: tuple = EPSILONS
    seeds: tuple = SEEDS
    lrs: tuple = LRS
    mechanisms: tuple = MECHANISMS
    epochs: int = EPOCHS
    steps_per_epoch: int = STEPS_PER_EPOCH
    examples: int = EXAMPLES
    holdout: float = HOLDOUT
    context: int = CONTEXT
    d: int = D
    layers: int = LAYERS
    heads: int = HEADS
    ffn: int = FFN
    delta: float = DELTA
    clip: float = CLIP
    bands: int = BANDS
    blt_buffers: int = BLT_BUFFERS
    eval_every: int = EVAL_EVERY
    workers: int = 2
    threads: int = 1
    fast: bool = False
    # random allocation: the Renyi bound ("combined" also runs conditional composition, which at
    # 2 epochs of 100 steps gave epsilon 144 against Renyi's 6.5 for bsr(200, 4), sigma 0.85)
    allocation_which: str = "renyi"
    calibration_rel_tol: float = 1e-3  # the calibrated sigma is at most this much above the smallest

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch


# --fast: d=64, 1 layer, context 32, 600 chunks (570 training), 2 epochs of 6 steps (T = 12,
# expected batch 95), one epsilon, seed and lr, a coarser calibration, one process (the
# allocation accountant's compiled kernels load once per process, ~7 s: two workers were slower).
FAST = dict(d=64, layers=1, heads=2, ffn=128, context=32, examples=600, holdout=0.05, epochs=2, steps_per_epoch=6,
            epsilons=(8.0,), seeds=(0,), lrs=(1e-2,), eval_every=3, calibration_rel_tol=1e-2, workers=1)


# ----------------------------------------------------------------------------------------- data
@functools.lru_cache(maxsize=None)
def load_data(context: int, examples: int, holdout: float):
    """``(train, test)``: the first ``examples`` chunks of the corpus, split by ``StdlibCorpus.split``."""
    from tiny_transformer import StdlibCorpus

    return StdlibCorpus(context=context, max_examples=examples).split(holdout=holdout, seed=0)


def make_model(cfg: Config, seed: int):
    import torch

    from tiny_transformer import TinyTransformerLM

    torch.manual_seed(seed)
    return TinyTransformerLM(d=cfg.d, layers=cfg.layers, heads=cfg.heads, ffn=cfg.ffn, context=cfg.context)


def rss_mb() -> float:
    """Resident memory of this process (MB), from /proc (nan elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


# ----------------------------------------------------------------------------------- mechanisms
def mechanism(name: str, cfg: Config):
    """``(strategy, sampling, accountant, accountant_options)`` of a private row."""
    from dpmf.sampling import BallsInBinsSampling, PoissonSampling
    from dpmf.strategies import BLTStrategy, Identity, bsr, optimize_blt

    T, k, b = cfg.steps, cfg.epochs, cfg.steps_per_epoch
    if name == "dpsgd":
        return Identity(T), PoissonSampling(1.0 / b, T), "pld", {}
    if name == "bandmf":
        return bsr(T, cfg.bands), BallsInBinsSampling(k, T), "allocation", {"which": cfg.allocation_which}
    if name == "blt":
        blt, _ = optimize_blt(T, cfg.blt_buffers, k)
        return (BLTStrategy.from_blt(blt, T), BallsInBinsSampling(k, T), "allocation",
                {"which": cfg.allocation_which})
    raise ValueError(f"unknown mechanism {name!r}; choose from {', '.join(MECHANISMS)}")


def _setup_worker(cfg: Config) -> None:
    import torch

    torch.set_num_threads(cfg.threads)


def check_report(name: str, eps: float, report) -> None:
    if not (report.certified and report.epsilon <= eps * (1 + 1e-9) and report.method == METHODS[name]):
        raise RuntimeError(f"{name}: report not as required (target epsilon {eps}, accountant {METHODS[name]}): "
                           f"certified={report.certified}, epsilon={report.epsilon}, method={report.method}")


# ------------------------------------------------------------------------------------- training
def train_job(job) -> dict:
    """One training run: ``(name, eps, lr, seed, sigma, cfg)``; ``name == "non-private"`` without dpmf."""
    import torch

    from dpmf.training.torch import make_private
    from tiny_transformer import bits_per_byte

    name, eps, lr, seed, sigma, cfg = job
    _setup_worker(cfg)
    train, test = load_data(cfg.context, cfg.examples, cfg.holdout)
    model = make_model(cfg, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    start = time.perf_counter()
    result = {"mechanism": name, "epsilon": eps, "lr": lr, "seed": seed}
    if name == "non-private":  # the same loop, plain batches of the expected size, no clipping
        gen = torch.Generator().manual_seed(seed)
        size = max(1, round(len(train) / cfg.steps_per_epoch))
        batches = []
        for _ in range(cfg.epochs):
            perm = torch.randperm(len(train), generator=gen).tolist()
            batches += [perm[i * size : (i + 1) * size] for i in range(cfg.steps_per_epoch)]
        loader = torch.utils.data.DataLoader(train, batch_sampler=batches)
        privacy = None
    else:
        strategy, sampling, accountant, options = mechanism(name, cfg)
        if sigma is None:  # the row's first run calibrates (sigma at most rel_tol above the smallest)
            noise = dict(target_epsilon=eps, accountant_options={**options, "rel_tol": cfg.calibration_rel_tol})
        else:  # the calibrated sigma, re-certified with the same accountant
            noise = dict(noise_multiplier=sigma, accountant_options=options or None)
        model, optimizer, loader, privacy = make_private(
            model, optimizer, train, strategy=strategy, sampling=sampling, delta=cfg.delta, max_grad_norm=cfg.clip,
            accountant=accountant, seed=seed, **noise)  # no loss_fn: ghost mode, the loop below
        result.update(calibrated=sigma is None, normalizer=privacy.run_spec.normalizer, accountant_options=options)
        if sigma is None:
            result.update(sampling=sampling.describe(), prefix_rmse_per_sigma=float(strategy.prefix_sum_rmse()),
                          strategy={k: v for k, v in strategy.describe().items() if k not in ("matrix", "coefs")})
    result["plan_seconds"] = time.perf_counter() - start
    curve = [[0, bits_per_byte(model, test)]]
    result["rss_mb_before"] = rss_mb()
    model.train()
    steps = 0
    for batch in loader:
        optimizer.zero_grad()
        out = model(**batch)
        out.loss.backward()
        optimizer.step()
        steps += 1
        if steps % cfg.eval_every == 0 or steps == cfg.steps:
            curve.append([steps, bits_per_byte(model, test)])
    result["rss_mb_after"] = rss_mb()
    if steps != cfg.steps:
        raise RuntimeError(f"{name}: {steps} steps, expected {cfg.steps}")
    if privacy is not None:
        assert privacy.steps_done == cfg.steps
        report = privacy.report()
        check_report(name, eps, report)
        result.update(noise_multiplier=report.noise_multiplier, certified_epsilon=report.epsilon,
                      method=report.method, grad_sample_mode=report.diagnostics["training"]["grad_sample_mode"])
    result.update(bits_per_byte=curve[-1][1], initial_bits_per_byte=curve[0][1], curve=curve,
                  seconds=time.perf_counter() - start)
    return result


# ----------------------------------------------------------------------------------------- main
class _Inline:
    """A synchronous stand-in for a process pool (``--workers 1``)."""

    def submit(self, fn, *args):
        from concurrent.futures import Future

        fut = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by fut.result()
            fut.set_exception(exc)
        return fut

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def execute(cfg: Config, log=print) -> tuple[list[dict], list[dict], float]:
    """``(calibrations, runs, seconds)``. Per row: the first lr on the first seed calibrates
    (``make_private(target_epsilon=...)``), then the other lrs on the first seed, then the other seeds
    at the row's best lr; every job goes to the pool as soon as the results it depends on are in."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    start = time.perf_counter()
    first = cfg.seeds[0]
    calibrations, runs = {}, []
    if cfg.workers <= 1:
        pool = _Inline()
    else:
        import multiprocessing as mp

        pool = ProcessPoolExecutor(cfg.workers, mp_context=mp.get_context("spawn"))
    with pool:
        pending = set()

        def submit(name, eps, lr, seed, sigma):
            pending.add(pool.submit(train_job, (name, eps, lr, seed, sigma, cfg)))

        # slowest first: the allocation calibrations, then DP-SGD's, then the non-private grid
        private = sorted(((m, e) for m in cfg.mechanisms for e in cfg.epsilons),
                         key=lambda r: (METHODS[r[0]] != "allocation", -r[1]))
        for m, e in private:
            submit(m, e, cfg.lrs[0], first, None)
        for lr in cfg.lrs:
            submit("non-private", None, lr, first, None)
        while pending:
            done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for fut in done:
                pending.discard(fut)
                res = fut.result()
                runs.append(res)
                row = (res["mechanism"], res["epsilon"])
                t = time.perf_counter() - start
                if res.get("calibrated"):
                    calibrations[row] = {k: res[k] for k in (
                        "mechanism", "epsilon", "noise_multiplier", "certified_epsilon", "method", "plan_seconds",
                        "accountant_options", "sampling", "prefix_rmse_per_sigma", "strategy", "normalizer")}
                    log(f"[{t:7.1f}s] calibrated {row[0]} eps={row[1]:g}: sigma {res['noise_multiplier']:.4f}, "
                        f"certified epsilon {res['certified_epsilon']:.4f} ({res['method']}) in "
                        f"{res['plan_seconds']:.1f}s")
                    for lr in cfg.lrs[1:]:
                        submit(row[0], row[1], lr, first, res["noise_multiplier"])
                log(f"[{t:7.1f}s] {row[0]:>11} eps={row[1]} lr={res['lr']:g} seed={res['seed']}: bits/byte "
                    f"{res['initial_bits_per_byte']:.3f} -> {res['bits_per_byte']:.3f} in {res['seconds']:.1f}s "
                    f"(rss {res['rss_mb_before']:.0f} -> {res['rss_mb_after']:.0f} MB)")
                grid = [r for r in runs if (r["mechanism"], r["epsilon"]) == row and r["seed"] == first]
                if res["seed"] == first and len(grid) == len(cfg.lrs):
                    best = min(grid, key=lambda r: r["bits_per_byte"])["lr"]
                    sigma = None if row[0] == "non-private" else calibrations[row]["noise_multiplier"]
                    for seed in cfg.seeds[1:]:
                        submit(row[0], row[1], best, seed, sigma)
    return list(calibrations.values()), runs, time.perf_counter() - start


def summarize(calibrations: list[dict], runs: list[dict], cfg: Config) -> list[dict]:
    cal = {(c["mechanism"], c["epsilon"]): c for c in calibrations}
    rows = []
    keys = sorted({(r["mechanism"], r["epsilon"]) for r in runs},
                  key=lambda k: ((("non-private",) + MECHANISMS).index(k[0]), k[1] or 0))
    for key in keys:
        mine = [r for r in runs if (r["mechanism"], r["epsilon"]) == key]
        grid = [r for r in mine if r["seed"] == cfg.seeds[0]]
        best = min(grid, key=lambda r: r["bits_per_byte"])["lr"]
        at_best = sorted((r for r in mine if r["lr"] == best), key=lambda r: r["seed"])
        vals = [r["bits_per_byte"] for r in at_best]
        curves = [r["curve"] for r in at_best]
        mean_curve = [[c[0], statistics.fmean(cv[i][1] for cv in curves)] for i, c in enumerate(curves[0])]
        c = cal.get(key, {})
        rows.append({
            "mechanism": key[0], "label": LABELS[key[0]], "epsilon": key[1], "best_lr": best,
            "mean_bits_per_byte": statistics.fmean(vals),
            "std_bits_per_byte": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "bits_per_byte": vals, "seeds": [r["seed"] for r in at_best],
            "first_seed_bits_per_byte_by_lr": {f"{r['lr']:g}": r["bits_per_byte"]
                                               for r in sorted(grid, key=lambda r: r["lr"])},
            "initial_bits_per_byte": statistics.fmean(r["initial_bits_per_byte"] for r in at_best),
            "mean_curve": mean_curve,
            "noise_multiplier": c.get("noise_multiplier"), "calibrated_epsilon": c.get("certified_epsilon"),
            "calibration_seconds": c.get("plan_seconds"),
            # every run re-certified; the largest certified epsilon of the row's runs
            "certified_epsilon": max((r["certified_epsilon"] for r in mine), default=None) if key[1] else None,
            "method": c.get("method"),
            "prefix_noise_rmse": (c["noise_multiplier"] * c["prefix_rmse_per_sigma"]) if c else None,
            "seconds": sum(r["seconds"] for r in mine),
        })
    return rows


def markdown(rows: list[dict], cfg: Config, info: dict) -> str:
    out = [
        f"Validation bits/byte (lower is better; mean ± sample std over seeds {', '.join(map(str, cfg.seeds))} at "
        f"the best lr of {{{', '.join(f'{v:g}' for v in cfg.lrs)}}}), {info['model']}, "
        f"{info['num_train']:,} training / {info['num_test']:,} held-out chunks of {cfg.context} bytes, "
        f"{cfg.epochs} epochs x {cfg.steps_per_epoch} steps (T = {cfg.steps}, expected batch "
        f"{info['expected_batch']:.1f}), Adam, clip {cfg.clip:g}, delta {cfg.delta:g}; untrained model "
        f"{info['untrained_bits_per_byte']:.3f} bits/byte.",
        "",
        "| mechanism | epsilon | sigma | certified epsilon | accountant | best lr | bits/byte | "
        "prefix-sum noise |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        private = r["epsilon"] is not None
        out.append(
            f"| {r['label']} | {r['epsilon']:g} | {r['noise_multiplier']:.4f} | {r['certified_epsilon']:.4f} | "
            f"{r['method']} | {r['best_lr']:g} | {r['mean_bits_per_byte']:.3f} ± {r['std_bits_per_byte']:.3f} | "
            f"{r['prefix_noise_rmse']:.2f} |" if private else
            f"| {r['label']} | - | - | - | - | {r['best_lr']:g} | "
            f"{r['mean_bits_per_byte']:.3f} ± {r['std_bits_per_byte']:.3f} | - |")
    out += ["", f"Seed {cfg.seeds[0]}, final validation bits/byte by learning rate:", "",
            "| mechanism | epsilon | " + " | ".join(f"lr {v:g}" for v in cfg.lrs) + " |",
            "|---|---:|" + "---:|" * len(cfg.lrs)]
    for r in rows:
        cells = [r["first_seed_bits_per_byte_by_lr"].get(f"{v:g}") for v in cfg.lrs]
        out.append(f"| {r['label']} | {'-' if r['epsilon'] is None else format(r['epsilon'], 'g')} | "
                   + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
    out += ["", "sigma: the calibrated noise multiplier for C as given (not comparable across rows); certified "
            "epsilon: the largest of the row's runs, each re-certified by make_private; prefix-sum noise: sigma x "
            "the RMSE per unit sigma of the strategy's T prefix sums (`strategy.prefix_sum_rmse()`), in clip "
            "norms, comparable across rows (lower is better)."]
    return "\n".join(out) + "\n"


def plot(rows: list[dict], cfg: Config, info: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        steps, vals = zip(*r["mean_curve"])
        label = r["label"] if r["epsilon"] is None else f"{r['label']}, eps {r['epsilon']:g}"
        ax.plot(steps, vals, marker="o", ms=3, ls="--" if r["epsilon"] is None else "-",
                color="k" if r["epsilon"] is None else None, label=f"{label} (lr {r['best_lr']:g})")
    ax.set_xlabel("step")
    ax.set_ylabel("validation bits/byte")
    finals = [v for r in rows for _, v in r["mean_curve"][1:]]
    if finals:  # the untrained model's ~8 bits would squash the curves
        lo, hi = min(finals), max(finals)
        ax.set_ylim(lo - 0.1 * (hi - lo + 0.1), hi + 0.15 * (hi - lo + 0.1))
    ax.set_title(f"Python stdlib bytes, {info['model']}\nT = {cfg.steps}, best lr per row, mean of "
                 f"{len(cfg.seeds)} seed(s); step 0 (untrained): {info['untrained_bits_per_byte']:.2f} bits/byte",
                 fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(cfg: Config, out: Path | None = None, log=print) -> dict:
    from tiny_transformer import parameter_count

    start = time.perf_counter()
    calibrations, runs, _ = execute(cfg, log)
    rows = summarize(calibrations, runs, cfg)
    elapsed = time.perf_counter() - start
    train, test = load_data(cfg.context, cfg.examples, cfg.holdout)
    params = parameter_count(make_model(cfg, 0))
    info = {
        "model": f"TinyTransformerLM(d={cfg.d}, layers={cfg.layers}, heads={cfg.heads}, ffn={cfg.ffn}, "
                 f"context={cfg.context}), {params:,} parameters",
        "parameters": params, "num_train": len(train), "num_test": len(test),
        "expected_batch": len(train) / cfg.steps_per_epoch,
        "untrained_bits_per_byte": statistics.fmean(r["initial_bits_per_byte"] for r in runs
                                                    if r["seed"] == cfg.seeds[0]),
    }
    cfg_dict = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
    payload = {
        "config": {**cfg_dict, "steps": cfg.steps, **info, "optimizer": "Adam(betas=(0.9, 0.999))",
                   "normalizer": "expected batch size (make_private default), the same for every row"},
        "summary": rows,
        "calibrations": calibrations,
        "runs": sorted(runs, key=lambda r: (r["mechanism"], r["epsilon"] or 0, r["seed"], r["lr"])),
        "elapsed_seconds": elapsed,
    }
    md = markdown(rows, cfg, info)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(payload, indent=1, default=str))
        (out / "results.md").write_text(md + f"\nWall time {elapsed:.0f} s ({cfg.workers} worker(s)).\n")
        plot(rows, cfg, info, out / "bits_per_byte.png")
    log(md)
    log(f"total {elapsed:.1f} s")
    return payload


def main(argv=None) -> dict:
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")  # before numpy/torch load; the spawned workers inherit it
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fast", action="store_true", help="tiny run (d=64, 1 layer, T = 12, 1 epsilon/seed/lr): < 60 s")
    p.add_argument("--out", type=Path, default=None, help="write results.json, results.md, bits_per_byte.png")
    p.add_argument("--workers", type=int, default=None, help="processes (default 2; --fast: 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    p.add_argument("--epsilons", type=str, default=None, help="comma-separated, e.g. 2,8")
    p.add_argument("--mechanisms", type=str, default=None, help=f"comma-separated subset of {','.join(MECHANISMS)}")
    p.add_argument("--lrs", type=str, default=None, help=f"comma-separated Adam learning rates (default {LRS})")
    p.add_argument("--seeds", type=str, default=None, help=f"comma-separated seeds (default {SEEDS})")
    p.add_argument("--epochs", type=int, default=None, help=f"epochs (default {EPOCHS})")
    p.add_argument("--steps-per-epoch", type=int, default=None, help=f"steps per epoch (default {STEPS_PER_EPOCH})")
    p.add_argument("--examples", type=int, default=None, help=f"corpus chunks before the split (default {EXAMPLES})")
    p.add_argument("--context", type=int, default=None, help=f"bytes per chunk (default {CONTEXT})")
    p.add_argument("--d", type=int, default=None, help=f"model width (default {D})")
    p.add_argument("--layers", type=int, default=None, help=f"transformer blocks (default {LAYERS})")
    p.add_argument("--heads", type=int, default=None, help=f"attention heads (default {HEADS})")
    p.add_argument("--ffn", type=int, default=None, help=f"feed-forward width (default {FFN})")
    p.add_argument("--eval-every", type=int, default=None, help=f"steps between evaluations (default {EVAL_EVERY})")
    args = p.parse_args(argv)
    kw = dict(FAST) if args.fast else {}
    kw.update(fast=args.fast, threads=args.threads)
    kw["workers"] = args.workers or kw.get("workers", min(2, os.cpu_count() or 1))
    for name in ("epochs", "steps_per_epoch", "examples", "context", "d", "layers", "heads", "ffn", "eval_every"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    if args.epsilons:
        kw["epsilons"] = tuple(float(v) for v in args.epsilons.split(","))
    if args.lrs:
        kw["lrs"] = tuple(float(v) for v in args.lrs.split(","))
    if args.seeds:
        kw["seeds"] = tuple(int(v) for v in args.seeds.split(","))
    if args.mechanisms:
        kw["mechanisms"] = tuple(m.strip() for m in args.mechanisms.split(","))
        for m in kw["mechanisms"]:
            if m not in MECHANISMS:
                p.error(f"unknown mechanism {m!r}; choose from {', '.join(MECHANISMS)}")
    return run(Config(**kw), args.out)


if __name__ == "__main__":
    main()
