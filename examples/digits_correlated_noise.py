"""Digits: the mechanisms ``dpmf plan`` ranks first for this run, trained at equal epsilon.

scikit-learn's bundled digits (1,797 8x8 images, no download), standardized with the training
split's mean and scale, 80/20 split (seed 0, stratified): 1,437 training and 360 test examples.
An MLP 64-32-10 is trained with SGD (momentum 0.9), per-example clip norm 1.0, delta 1e-5, for
``EPOCHS`` epochs with batches of ``1437 // STEPS_PER_EPOCH`` examples (62: 23 steps per epoch,
T = 230).

No mechanism is written by hand. For each epsilon, :func:`dpmf.planner.plan` calibrates every
configuration dpmf can account for -- DP-SGD, banded Toeplitz / BandMF, BSR, BLT, the binary tree
and the optimal multi-epoch factorization, under the shuffled fixed order, Poisson, cyclic Poisson
and balls-in-bins sampling, each certified by the tightest valid accountant -- to ``(epsilon,
1e-5)`` for *this* run (:class:`dpmf.planner.TrainingRun`: 1,437 examples, batch 62, ``EPOCHS``
epochs) and ranks them by the noise they leave in the prefix sums of the gradients. The example
trains the ``TOP`` best rows, and DP-SGD with Poisson sampling as the baseline (from the same
plan; calibrated on its own when the plan ranked it lower or pruned it), each with
``make_private(..., plan=row)``: the row's strategy, sampler and noise, re-checked by one
evaluation of its accountant and never calibrated again. The later runs of a row (other learning
rates and seeds) reuse that :class:`~dpmf.training.run_spec.RunSpec` (``plan=privacy.run_spec``: no
accounting at all). Every run's report is checked: certified, ``epsilon <= eps``, equal to the
row's epsilon; the first run's report of each row is saved (``reports/``) and re-checked with
:func:`dpmf.accounting.verify_report` (what ``dpmf verify`` does). A non-private run with the same
model, data and lr grid is the reference row.

Protocol (the same for every row, the non-private one included): for each (row, epsilon) every
learning rate of ``LRS`` is trained with the first seed; the lr with the best test accuracy is then
trained with the other seeds, and the table reports the mean (and sample std) over all seeds at
that lr. Choosing the lr on the test set flatters every row alike, and neither the lr search nor
the choice of rows by the planner (which reads no data: only the run's sizes and the target) is
privacy-accounted (as usual in DP benchmarks).

Run::

    python examples/digits_correlated_noise.py --out examples/results          # full run
    python examples/digits_correlated_noise.py --fast --out /tmp/digits_fast  # 1 epsilon, T = 10

``--out DIR`` writes ``results.json`` (config, the plans, every run, the summary), ``results.md``
(the tables), ``accuracy_vs_epsilon.png`` and ``reports/`` (one training report per row).
``--cache-dir`` keeps the plans' rows (default: a temporary folder), so a rerun skips the planning.
Needs ``torch`` and ``scikit-learn``. See ``examples/README.md`` for the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

NUM_TRAIN = 1437  # the training split of digits (80% of 1,797, stratified)
DELTA = 1e-5
CLIP = 1.0
MOMENTUM = 0.9
EPOCHS = 10
STEPS_PER_EPOCH = 23
EPSILONS = (1.0, 2.0, 4.0, 8.0)
SEEDS = (0, 1, 2)
LRS = (0.03, 0.1, 0.3)
TOP = 4  # train the TOP best rows of each plan (plus the DP-SGD baseline)
BASELINE = "DP-SGD, Poisson sampling"  # the planner's label of DP-SGD with Poisson sampling (PLD)


@dataclass(frozen=True)
class Config:
    epsilons: tuple = EPSILONS
    seeds: tuple = SEEDS
    lrs: tuple = LRS
    epochs: int = EPOCHS
    steps_per_epoch: int = STEPS_PER_EPOCH
    top: int = TOP
    mmcc: bool = True  # rank MMCC rows (tree, banded Toeplitz under Poisson sampling)
    delta: float = DELTA
    clip: float = CLIP
    momentum: float = MOMENTUM
    workers: int = 2
    fast: bool = False

    @property
    def batch_size(self) -> int:
        return NUM_TRAIN // self.steps_per_epoch

    @property
    def steps(self) -> int:
        return self.epochs * (NUM_TRAIN // self.batch_size)

    def run(self, epsilon: float):
        from dpmf.planner import TrainingRun

        return TrainingRun(NUM_TRAIN, self.batch_size, self.epochs, epsilon, self.delta, mmcc=self.mmcc)


# --fast: 2 epochs of 5 steps (T = 10, batch 287), one epsilon, seed and lr, the best 2 rows and no
# MMCC rows (the plan takes 10-30 s on 2 busy cores, most of it BSR's random-allocation calibration).
FAST = dict(epochs=2, steps_per_epoch=5, epsilons=(4.0,), seeds=(0,), lrs=(0.3,), top=2, mmcc=False)


# ----------------------------------------------------------------------------------------- data
def load_data():
    """Standardized digits, 80/20 stratified split with seed 0, as float32 tensors."""
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
    scaler = StandardScaler().fit(Xtr)
    as_x = lambda a: torch.tensor(scaler.transform(a), dtype=torch.float32)  # noqa: E731
    return as_x(Xtr), torch.tensor(ytr), as_x(Xte), torch.tensor(yte)


def make_model(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def accuracy(model, X, y) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        return float((model(X).argmax(1) == y).float().mean())


# ----------------------------------------------------------------------------------------- plans
def choose_rows(cfg: Config, epsilon: float, cache_dir: str, log=print):
    """``(rows to train, every row of the plan)`` at ``epsilon``: the ``cfg.top`` best ranked rows
    and the DP-SGD baseline (:data:`BASELINE`), calibrated alone if the plan did not rank it."""
    from dataclasses import replace

    from dpmf.planner import candidates, plan

    run = cfg.run(epsilon)
    start = time.perf_counter()
    rows = plan(run, cache=cache_dir, workers=cfg.workers if cfg.workers > 1 else None)
    ranked = [r for r in rows if not r.pruned]
    chosen = ranked[: cfg.top]
    if not any(r.label == BASELINE for r in chosen):
        base = next((r for r in ranked if r.label == BASELINE), None)
        if base is None:  # pruned (a fixed-order row beat it): calibrate it on its own
            only = [c for c in candidates(run) if c.label == BASELINE]
            base = replace(plan(run, only=only, cache=cache_dir)[0], rank=None)  # (ranked alone: no rank)
        chosen.append(base)
    log(f"plan eps={epsilon:g}: {len(ranked)} ranked, {len(rows) - len(ranked)} pruned rows in "
        f"{time.perf_counter() - start:.1f} s; training "
        + ", ".join(f"#{r.rank or '-'} {r.strategy}/{r.sampling}" for r in chosen))
    return chosen, rows


def _row_summary(r) -> dict:
    return {"rank": r.rank, "label": r.label, "strategy": r.strategy, "sampling": r.sampling, "method": r.method,
            "noise_multiplier": r.noise_multiplier, "epsilon": r.epsilon, "certified": r.certified,
            "prefix_sum_rmse": r.prefix_sum_rmse, "pruned": r.pruned, "cached": r.cached, "seconds": r.seconds}


# ------------------------------------------------------------------------------------- training
def train_one(data, cfg: Config, lr: float, seed: int, *, plan=None):
    """One run. Private (``plan``: a plan row or a RunSpec): ``(accuracy, privacy, seconds,
    seconds in make_private)``; ``plan=None``: plain SGD on shuffled batches of the same size,
    ``(accuracy, None, seconds, 0)``."""
    import torch

    from dpmf.training.torch import make_private

    Xtr, ytr, Xte, yte = data
    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=cfg.momentum)
    start = time.perf_counter()
    if plan is None:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(cfg.epochs):
            perm = torch.randperm(len(Xtr), generator=gen)
            for i in range(0, len(Xtr), cfg.batch_size):
                idx = perm[i : i + cfg.batch_size]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(Xtr[idx]), ytr[idx]).backward()
                opt.step()
        return accuracy(model, Xte, yte), None, time.perf_counter() - start, 0.0
    ds = torch.utils.data.TensorDataset(Xtr, ytr)
    model, opt, loader, privacy = make_private(model, opt, ds, plan=plan, max_grad_norm=cfg.clip,
                                               loss_fn=torch.nn.functional.cross_entropy, seed=seed)
    plan_seconds = time.perf_counter() - start
    model.train()
    for xb, yb in loader:
        opt.zero_grad()
        opt.step(xb, yb)
    assert privacy.steps_done == cfg.steps
    return accuracy(model, Xte, yte), privacy, time.perf_counter() - start, plan_seconds


def run_job(job) -> dict:
    """All runs of one (row, epsilon): the lr grid on the first seed, then the other seeds at the
    best lr (module docstring, "Protocol"). The first run builds the RunSpec from the row
    (one accountant evaluation); the others reuse it."""
    import torch

    from dpmf.accounting import verify_report

    torch.set_num_threads(1)
    row, eps, cfg, report_dir = job
    data = load_data()
    t0 = time.perf_counter()
    runs, name = [], "non-private" if row is None else row.label

    def one(lr: float, seed: int, run_spec=None):
        acc, privacy, sec, plan_sec = train_one(data, cfg, lr, seed, plan=run_spec or row)
        out = {"mechanism": name, "epsilon": eps, "lr": lr, "seed": seed, "accuracy": acc, "seconds": sec}
        if privacy is not None:
            report = privacy.report()
            if not (report.certified and report.epsilon <= eps * (1 + 1e-9) and report.epsilon == row.epsilon):
                raise RuntimeError(f"{name}: report epsilon {report.epsilon} (certified={report.certified}) "
                                   f"is not the row's {row.epsilon} <= {eps}")
            out.update(noise_multiplier=report.noise_multiplier, certified_epsilon=report.epsilon,
                       method=report.method, plan_seconds=plan_sec, rank=row.rank,
                       steps_done=report.diagnostics["training"]["steps_done"])
        return out, privacy

    run_spec, verified = None, None
    for lr in cfg.lrs:  # the lr grid on the first seed ...
        out, privacy = one(lr, cfg.seeds[0], run_spec)
        if privacy is not None and run_spec is None:
            run_spec = privacy.run_spec  # certified from the row once; reused as it is
            path = Path(report_dir) / f"eps{eps:g}-{row.strategy}-{row.sampling}.json"
            privacy.save_report(path)  # (and a large dense C next to it, as <sha256>.npz)
            v = verify_report(path, search_dir=report_dir)  # what `dpmf verify FILE --matrices DIR` does
            if not (v.holds and v.edited is False):
                raise RuntimeError(f"{name}: the saved report does not verify: {v.summary()}")
            verified = {"report": path.name, "holds": v.holds, "edited": v.edited,
                        "recomputed_epsilon": v.recomputed_epsilon}
        runs.append(out)
    best = max(runs, key=lambda r: r["accuracy"])["lr"]
    for seed in cfg.seeds[1:]:  # ... then the other seeds at its best lr
        runs.append(one(best, seed, run_spec)[0])
    out = {"mechanism": name, "epsilon": eps, "runs": runs, "seconds": time.perf_counter() - t0}
    if row is not None:
        out.update(row=_row_summary(row), verified=verified)
    return out


# ------------------------------------------------------------------------------------- summary
def summarize(jobs: list[dict], cfg: Config) -> list[dict]:
    rows = []
    for job in jobs:
        first_seed = [r for r in job["runs"] if r["seed"] == cfg.seeds[0]]
        best = max(first_seed, key=lambda r: r["accuracy"])["lr"]
        accs = [r["accuracy"] for r in job["runs"] if r["lr"] == best]
        row = job.get("row") or {}
        rows.append({
            "mechanism": job["mechanism"], "epsilon": job["epsilon"], "rank": row.get("rank"),
            "strategy": row.get("strategy"), "sampling": row.get("sampling"), "method": row.get("method"),
            "noise_multiplier": row.get("noise_multiplier"), "certified_epsilon": row.get("epsilon"),
            "prefix_noise_rmse": row.get("prefix_sum_rmse"),
            "best_lr": best, "mean_accuracy": statistics.fmean(accs),
            "std_accuracy": statistics.stdev(accs) if len(accs) > 1 else 0.0, "accuracies": accs,
            "first_seed_accuracy_by_lr": {str(r["lr"]): r["accuracy"] for r in first_seed},
            "seconds": job["seconds"],
        })
    rows.sort(key=lambda r: (r["epsilon"] or 0, r["rank"] if r["rank"] is not None else 10**6))
    return rows


def _accuracy(r: dict, cfg: Config) -> str:
    """``"91.2 ± 0.8"`` (percent, sample std over the seeds); one seed: ``"91.2"`` (no spread to show)."""
    mean = f"{100 * r['mean_accuracy']:.1f}"
    return f"{mean} ± {100 * r['std_accuracy']:.1f}" if len(cfg.seeds) > 1 else mean


def markdown(rows: list[dict], plans: dict, cfg: Config) -> str:
    seeds = (f"mean over seeds {', '.join(map(str, cfg.seeds))}" if len(cfg.seeds) > 1 else f"seed {cfg.seeds[0]}")
    spread = "; ± sample std" if len(cfg.seeds) > 1 else ""  # (one seed has no spread to show)
    out = [
        f"Test accuracy ({seeds} at the best lr of "
        f"{{{', '.join(map(str, cfg.lrs))}}}{spread}), digits MLP 64-32-10, {cfg.epochs} epochs x "
        f"{NUM_TRAIN // cfg.batch_size} steps of batch {cfg.batch_size} (T = {cfg.steps}), clip {cfg.clip}, "
        f"delta {cfg.delta:g}. The rows are the {cfg.top} best of `dpmf.planner.plan` at each epsilon, and "
        "DP-SGD with Poisson sampling; rank is the plan's (- : ranked below the top or pruned).",
        "",
        "| epsilon | rank | mechanism | accountant | sigma | prefix-sum noise | best lr | accuracy (%) |",
        "|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["epsilon"] is None:
            out.append(f"| - | - | non-private SGD | - | - | - | {r['best_lr']:g} | {_accuracy(r, cfg)} |")
            continue
        rank = r["rank"] if r["rank"] is not None and r["rank"] <= cfg.top else "-"
        out.append(f"| {r['epsilon']:g} | {rank} | {r['mechanism']} | {r['method']} | {r['noise_multiplier']:.3f} | "
                   f"{r['prefix_noise_rmse']:.2f} | {r['best_lr']:g} | {_accuracy(r, cfg)} |")
    out += ["", "sigma is the noise multiplier for the row's C as given (not comparable across rows); prefix-sum "
            "noise is sigma x the RMSE of the T prefix sums per unit sigma, in clip norms: the quantity the plan "
            "ranks by (lower is better; what plain SGD's trajectory sees).", ""]
    for eps, plan_rows in sorted(plans.items()):
        ranked = [p for p in plan_rows if not p["pruned"]]
        pruned = len(plan_rows) - len(ranked)
        out.append(f"Plan at epsilon {eps:g} ({len(ranked)} ranked rows, {pruned} pruned): "
                   + "; ".join(f"{p['rank']}. {p['strategy']} / {p['sampling']} ({p['method']}) "
                               f"{p['prefix_sum_rmse']:.2f}" for p in ranked[: max(cfg.top + 2, 6)]))
        out.append("")
    return "\n".join(out)


def plot(rows: list[dict], cfg: Config, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name in dict.fromkeys(r["mechanism"] for r in rows if r["epsilon"] is not None):
        pts = sorted((r for r in rows if r["mechanism"] == name), key=lambda r: r["epsilon"])
        ax.errorbar([r["epsilon"] for r in pts], [100 * r["mean_accuracy"] for r in pts],
                    yerr=[100 * r["std_accuracy"] for r in pts], marker="o", capsize=3, label=name)
    ref = next((r for r in rows if r["epsilon"] is None), None)
    if ref is not None:
        ax.axhline(100 * ref["mean_accuracy"], color="k", ls="--", lw=1, label="non-private SGD")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(cfg.epsilons), [f"{e:g}" for e in cfg.epsilons])
    ax.set_xlabel(f"epsilon (delta = {cfg.delta:g})")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"digits, MLP 64-32-10, T = {cfg.steps}: the top {cfg.top} rows of dpmf plan and DP-SGD",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6.5, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------- main
def run(cfg: Config, out: Path | None = None, cache_dir: str | None = None, log=print) -> dict:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dpmf-digits-") as tmp:
        cache = cache_dir or os.path.join(tmp, "cache")
        report_dir = Path(out / "reports" if out is not None else Path(tmp) / "reports")
        report_dir.mkdir(parents=True, exist_ok=True)
        plans, jobs = {}, [(None, None, cfg, str(report_dir))]
        plan_start = time.perf_counter()
        for eps in sorted(cfg.epsilons, reverse=True):
            chosen, every = choose_rows(cfg, eps, cache, log)
            plans[eps] = [_row_summary(r) for r in every]
            jobs += [(row, eps, cfg, str(report_dir)) for row in chosen]
        plan_seconds = time.perf_counter() - plan_start
        results = []

        def done(res):
            results.append(res)
            best = max(r["accuracy"] for r in res["runs"])
            log(f"[{time.perf_counter() - start:6.1f}s] {res['mechanism']} eps={res['epsilon']}: "
                f"{len(res['runs'])} runs in {res['seconds']:.1f}s, best accuracy {best:.3f}")

        if cfg.workers <= 1:
            for job in jobs:
                done(run_job(job))
        else:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(cfg.workers, mp_context=mp.get_context("spawn")) as pool:
                for fut in as_completed([pool.submit(run_job, j) for j in jobs]):
                    done(fut.result())
    rows = summarize(results, cfg)
    elapsed = time.perf_counter() - start
    cfg_dict = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
    payload = {
        "config": {**cfg_dict, "steps": cfg.steps, "batch_size": cfg.batch_size, "num_train": NUM_TRAIN,
                   "num_test": 360, "model": "MLP 64-32-10", "optimizer": f"SGD(momentum={cfg.momentum})"},
        "plans": {f"{eps:g}": p for eps, p in plans.items()},
        "summary": rows,
        "jobs": [{k: v for k, v in j.items() if k != "runs"} for j in results],
        "runs": [r for j in results for r in j["runs"]],
        "plan_seconds": plan_seconds,
        "elapsed_seconds": elapsed,
    }
    md = markdown(rows, plans, cfg)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(payload, indent=1, default=str))
        (out / "results.md").write_text(md + f"\nPlanning {plan_seconds:.0f} s, wall time {elapsed:.0f} s.\n")
        plot(rows, cfg, out / "accuracy_vs_epsilon.png")
    log(md)
    log(f"total {elapsed:.1f} s (planning {plan_seconds:.1f} s)")
    return payload


def main(argv=None) -> dict:
    # One BLAS thread per process (set before numpy loads; the workers inherit it): with 2 workers on
    # 2 cores, OpenBLAS' own threads only contend.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fast", action="store_true", help="tiny run (1 epsilon, 1 seed, 1 lr, 2 epochs of 5 steps, top 2)")
    p.add_argument("--out", type=Path, default=None, help="write results.json, results.md, accuracy_vs_epsilon.png, reports/")
    p.add_argument("--cache-dir", type=str, default=None, help="keep the plans' rows here (default: a temporary folder)")
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    p.add_argument("--epsilons", type=str, default=None, help="comma-separated, e.g. 1,2,4,8")
    p.add_argument("--top", type=int, default=None, help=f"train this many best rows of each plan (default {TOP})")
    p.add_argument("--no-mmcc", action="store_true", help="leave MMCC rows out of the plans")
    p.add_argument("--epochs", type=int, default=None, help=f"epochs (default {EPOCHS})")
    p.add_argument("--steps-per-epoch", type=int, default=None,
                   help=f"steps per epoch, batch 1437 // this (default {STEPS_PER_EPOCH})")
    p.add_argument("--lrs", type=str, default=None, help=f"comma-separated learning rates (default {LRS})")
    p.add_argument("--seeds", type=str, default=None, help=f"comma-separated seeds (default {SEEDS})")
    args = p.parse_args(argv)
    kw = dict(FAST) if args.fast else {}
    kw["fast"] = args.fast
    kw["workers"] = args.workers
    if args.epsilons:
        kw["epsilons"] = tuple(float(e) for e in args.epsilons.split(","))
    if args.top:
        kw["top"] = args.top
    if args.no_mmcc:
        kw["mmcc"] = False
    if args.epochs:
        kw["epochs"] = args.epochs
    if args.steps_per_epoch:
        kw["steps_per_epoch"] = args.steps_per_epoch
    if args.lrs:
        kw["lrs"] = tuple(float(v) for v in args.lrs.split(","))
    if args.seeds:
        kw["seeds"] = tuple(int(v) for v in args.seeds.split(","))
    return run(Config(**kw), args.out, args.cache_dir)


if __name__ == "__main__":
    main()
