"""Digits in pure JAX: DP-SGD vs BandMF vs BLT at equal epsilon, built through dpmf and jax_privacy.

The JAX twin of ``digits_correlated_noise.py`` (the PyTorch example), on the same run: scikit-learn's
bundled digits (no download), standardized with the training split's mean and scale, 80/20 split
(seed 0, stratified): 1,437 training and 360 test examples; an MLP 64-32-10 (PyTorch's default
initialization), SGD with momentum 0.9 (``optax.sgd``), per-example clip norm 1.0, delta 1e-5,
10 epochs of 23 steps (T = 230, batch 62). Three mechanisms, each calibrated by dpmf to the same
``(epsilon, 1e-5)`` -- the PyTorch example's rows of the same names, hence the same sigma:

* **DP-SGD, Poisson sampling** (``Identity``, PLD accountant);
* **BandMF**: banded Toeplitz with 23 bands optimized for 10 epochs, shuffled fixed order;
* **BLT** with 2 buffers optimized for 10 epochs, shuffled fixed order.

Each run is :func:`dpmf.training.jax.make_private`: the plan's batches (:class:`SchemeBatches`,
padded to 128 so ``jit`` compiles one shape), ``jax_privacy.clipped_grad`` (``vmap``), the
strategy's noise through jax_privacy's matrix-factorization privatizer (BandMF and BLT streamed, in
O(bands) and O(buffers) state), ``1 / normalizer`` and ``optax.sgd``, chained. The plan of a
(mechanism, epsilon) is certified once (:func:`~dpmf.training.run_spec.build_run_spec`) and reused by all
its runs (``plan=``); the first run's report is saved in ``reports/`` and re-checked with
:func:`dpmf.accounting.verify_report` (what ``dpmf verify`` does).

Protocol (the PyTorch example's): for each (mechanism, epsilon) every learning rate of ``LRS`` is
trained with the first seed; the best is trained with the other seeds, and the table reports the
mean (and sample std) over all seeds at that lr, beside the PyTorch example's accuracy for the same
row (read from ``examples/results/results.json`` when present). Choosing the lr on the test set
flatters every row alike and is not privacy-accounted (as usual in DP benchmarks).

Run::

    python examples/digits_jax.py --out examples/results/jax          # full run
    python examples/digits_jax.py --fast --out /tmp/digits_jax        # 1 epsilon, 1 seed, T = 10

Needs ``jax``, ``jax-privacy``, ``optax`` (``pip install 'dpmf[jax]'``) and ``scikit-learn``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

DELTA = 1e-5
CLIP = 1.0
MOMENTUM = 0.9
EPOCHS = 10
STEPS_PER_EPOCH = 23
EPSILONS = (1.0, 2.0, 4.0, 8.0)
SEEDS = (0, 1, 2)
LRS = (0.03, 0.1, 0.3)
PAD = 128  # every batch padded to 128 examples: one compiled shape per run


def mechanisms(cfg) -> tuple[str, ...]:
    """The rows' names (the PyTorch example's labels for the same mechanisms)."""
    return ("DP-SGD, Poisson sampling", f"banded Toeplitz ({cfg.bands} bands), shuffled fixed order",
            "BLT (2 buffers), shuffled fixed order")
TORCH_RESULTS = Path(__file__).resolve().parent / "results" / "results.json"


@dataclass(frozen=True)
class Config:
    epsilons: tuple = EPSILONS
    seeds: tuple = SEEDS
    lrs: tuple = LRS
    epochs: int = EPOCHS
    steps_per_epoch: int = STEPS_PER_EPOCH
    bands: int = 23
    delta: float = DELTA
    clip: float = CLIP
    momentum: float = MOMENTUM
    fast: bool = False

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch


FAST = Config(epsilons=(8.0,), seeds=(0,), lrs=(0.1,), epochs=2, steps_per_epoch=5, bands=5, fast=True)


def load_data():
    """Standardized digits, 80/20 stratified split with seed 0 (the PyTorch example's), numpy float32."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
    scaler = StandardScaler().fit(Xtr)
    f = lambda a: scaler.transform(a).astype(np.float32)  # noqa: E731
    return f(Xtr), ytr.astype(np.int32), f(Xte), yte.astype(np.int32)


def init_params(seed: int):
    """MLP 64-32-10 with PyTorch's default init: weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    import jax

    keys = jax.random.split(jax.random.key(seed), 4)
    params = {}
    for i, (k_w, k_b, fan_in, fan_out) in enumerate(((keys[0], keys[1], 64, 32), (keys[2], keys[3], 32, 10))):
        bound = 1.0 / fan_in**0.5
        params[f"w{i}"] = jax.random.uniform(k_w, (fan_in, fan_out), minval=-bound, maxval=bound)
        params[f"b{i}"] = jax.random.uniform(k_b, (fan_out,), minval=-bound, maxval=bound)
    return params


def logits(params, x):
    import jax

    h = jax.nn.relu(x @ params["w0"] + params["b0"])
    return h @ params["w1"] + params["b1"]


def loss(params, example):
    """Cross-entropy of one example (what jax_privacy's clipped_grad differentiates per example)."""
    import jax

    x, y = example
    return -jax.nn.log_softmax(logits(params, x))[y]


def accuracy(params, X, y) -> float:
    import numpy as np

    return float(np.mean(np.asarray(logits(params, X)).argmax(1) == y))


def mechanism(name: str, cfg: Config, num_train: int):
    """``(strategy, scheme)`` of a mechanism for this run."""
    from dpmf.sampling import FixedOrderSampling, PoissonSampling
    from dpmf.strategies import Identity, catalog

    T = cfg.steps
    if name.startswith("DP-SGD"):
        return Identity(T), PoissonSampling((num_train // cfg.steps_per_epoch) / num_train, T)
    if name.startswith("banded Toeplitz"):
        return catalog.build("banded-toeplitz", T, bands=cfg.bands, epochs=cfg.epochs), FixedOrderSampling(cfg.epochs, T)
    return catalog.build("blt", T, buffers=2, epochs=cfg.epochs), FixedOrderSampling(cfg.epochs, T)


def train_one(data, cfg: Config, plan, lr: float, seed: int):
    """One private run from a certified plan: ``(accuracy, privacy, opt_state, seconds)``."""
    import optax

    from dpmf.training.jax import make_private

    Xtr, ytr, Xte, yte = data
    start = time.perf_counter()
    params = init_params(seed)
    run = make_private(loss, params, len(Xtr), optimizer=optax.sgd(lr, momentum=cfg.momentum), plan=plan, seed=seed,
                       pad_multiple=PAD)
    opt_state = run.tx.init(params)
    for batch in run.batches:
        params, opt_state = run.step(params, opt_state, (Xtr[batch.indices], ytr[batch.indices]), batch.is_padding)
    assert run.privacy.steps_done == cfg.steps
    return accuracy(params, Xte, yte), run.privacy, opt_state, time.perf_counter() - start


def torch_accuracies() -> dict:
    """The PyTorch example's mean accuracy by (epsilon, mechanism), when its results are present."""
    if not TORCH_RESULTS.is_file():
        return {}
    rows = json.loads(TORCH_RESULTS.read_text()).get("summary", [])
    return {(r["epsilon"], r["mechanism"]): (r["mean_accuracy"], r["std_accuracy"], r["noise_multiplier"])
            for r in rows if r.get("epsilon") is not None}


def run_all(cfg: Config, out: Path | None) -> dict:
    import numpy as np

    from dpmf.accounting.verify import verify_report
    from dpmf.training.run_spec import build_run_spec

    data = load_data()
    num_train = len(data[0])
    if out is not None:
        (out / "reports").mkdir(parents=True, exist_ok=True)
    runs, summary = [], []
    start = time.perf_counter()
    for eps in cfg.epsilons:
        for name in mechanisms(cfg):
            strategy, scheme = mechanism(name, cfg, num_train)
            plan = build_run_spec(strategy, scheme, num_examples=num_train, delta=cfg.delta, max_grad_norm=cfg.clip,
                              target_epsilon=eps)
            assert plan.report.certified and plan.epsilon <= eps
            by_lr = {}
            for lr in cfg.lrs:
                acc, privacy, opt_state, secs = train_one(data, cfg, plan, lr, cfg.seeds[0])
                by_lr[lr] = acc
                runs.append({"mechanism": name, "epsilon": eps, "lr": lr, "seed": cfg.seeds[0], "accuracy": acc,
                             "seconds": secs})
                if out is not None and lr == cfg.lrs[0]:
                    tag = f"eps{eps:g}-{name.split(',')[0].split(' (')[0].lower().replace(' ', '-')}"
                    path = out / "reports" / f"{tag}.json"
                    privacy.save_report(path, opt_state)
                    check = verify_report(path)
                    assert check.holds and check.edited is False, check.message
            best = max(cfg.lrs, key=lambda lr: by_lr[lr])
            accs = [by_lr[best]]
            for seed in cfg.seeds[1:]:
                acc, _, _, secs = train_one(data, cfg, plan, best, seed)
                accs.append(acc)
                runs.append({"mechanism": name, "epsilon": eps, "lr": best, "seed": seed, "accuracy": acc,
                             "seconds": secs})
            row = {"mechanism": name, "epsilon": eps, "method": plan.report.method,
                   "noise_multiplier": plan.noise_multiplier, "certified_epsilon": plan.epsilon, "best_lr": best,
                   "mean_accuracy": float(np.mean(accs)),
                   "std_accuracy": float(statistics.stdev(accs)) if len(accs) > 1 else 0.0, "accuracies": accs}
            summary.append(row)
            print(_format_row(row, {} if cfg.fast else torch_accuracies()), flush=True)
    result = {"config": {**asdict(cfg), "steps": cfg.steps, "num_train": num_train, "pad": PAD},
              "summary": summary, "runs": runs, "elapsed_seconds": time.perf_counter() - start}
    if out is not None:
        (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / "results.md").write_text(table(summary, {} if cfg.fast else torch_accuracies()) + "\n")
    return result


HEADER = ("| epsilon | mechanism | accountant | sigma | best lr | JAX accuracy (%) | PyTorch accuracy (%) |\n"
          "|---:|---|---|---:|---:|---:|---:|")


def _format_row(row: dict, torch: dict) -> str:
    t = torch.get((row["epsilon"], row["mechanism"]))
    theirs = f"{100 * t[0]:.1f} ± {100 * t[1]:.1f}" if t else "-"
    return (f"| {row['epsilon']:g} | {row['mechanism']} | {row['method']} | {row['noise_multiplier']:.3f} | "
            f"{row['best_lr']:g} | {100 * row['mean_accuracy']:.1f} ± {100 * row['std_accuracy']:.1f} | {theirs} |")


def table(summary: list, torch: dict) -> str:
    return "\n".join([HEADER] + [_format_row(r, torch) for r in summary])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fast", action="store_true", help="1 epsilon, 1 seed, 1 lr, T = 10 (seconds)")
    parser.add_argument("--out", type=Path, default=None, help="write results.json, results.md and reports/ here")
    parser.add_argument("--epsilons", type=str, default=None, help="comma-separated epsilons (default 1,2,4,8)")
    args = parser.parse_args(argv)
    cfg = FAST if args.fast else Config()
    if args.epsilons:
        cfg = Config(**{**asdict(cfg), "epsilons": tuple(float(e) for e in args.epsilons.split(","))})
    print(HEADER, flush=True)
    result = run_all(cfg, args.out)
    print(f"elapsed {result['elapsed_seconds']:.0f} s")


if __name__ == "__main__":
    main()
