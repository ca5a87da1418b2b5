"""The planner behind ``dpmf plan``: which (strategy, sampler, accountant) should a run use?

Given a training run (dataset size, batch size, epochs, target (epsilon, delta)), every
configuration dpmf can account for is calibrated to the target and ranked by the error the noise
causes in the model updates: the RMSE of the prefix sums of the noisy gradient sums, in units of
the clip norm (the utility measure of the matrix-factorization papers). Lower is better.
Amplified rows: generalized MMCC for banded Toeplitz under cyclic Poisson sampling and random
allocation (balls-in-bins) for DP-SGD and BSR by default; MMCC for the tree and banded Toeplitz
under Poisson sampling when asked for (``mmcc=True``: each evaluation builds hundreds of
mixture-of-Gaussians PLDs, minutes at small noise); Monte Carlo rows (b-min-sep) are estimates and
appear only when asked for (``montecarlo_samples``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

from dpmf import validation as _v
from dpmf.accounting.dispatch import calibrate
from dpmf.errors import InvalidParameterError
from dpmf.sampling.schemes import (
    BallsInBinsSampling,
    CyclicPoissonSampling,
    FixedOrderSampling,
    MinSepSampling,
    PoissonSampling,
)
from dpmf.strategies.identity import Identity
from dpmf.strategies.banded import bsr, optimize_banded_toeplitz
from dpmf.strategies.blt import optimize_blt
from dpmf.strategies.toeplitz import ToeplitzStrategy
from dpmf.strategies.tree import BinaryTree

#: The tree's sensitivity and optimal decoder use dense (2n-1) x n matrices: skip it above this.
MAX_TREE_STEPS = 4096
#: The dense optimal factorization takes ~2 s at n = 512 and grows like n^3: skip it above this.
MAX_OPTIMAL_STEPS = 1024


@dataclass(frozen=True)
class TrainingRun:
    """A training run to plan for. Defaults: a CIFAR-10-sized run (50k examples, 5 epochs)."""

    dataset_size: int = 50_000
    batch_size: int = 500
    epochs: int = 5
    epsilon: float = 2.0
    delta: float = 1e-6
    montecarlo_samples: int | None = None  # add Monte Carlo (estimate) rows with this many samples
    mmcc: bool = False  # add MMCC rows under Poisson sampling (minutes for hundreds of steps)

    def __post_init__(self) -> None:
        n = _v.positive_int("dataset_size", self.dataset_size)
        b = _v.positive_int("batch_size", self.batch_size)
        if b > n:
            raise InvalidParameterError(f"batch_size must be <= dataset_size, got {b} > {n}")
        object.__setattr__(self, "dataset_size", n)
        object.__setattr__(self, "batch_size", b)
        object.__setattr__(self, "epochs", _v.positive_int("epochs", self.epochs))
        object.__setattr__(self, "epsilon", _v.positive("epsilon", self.epsilon))
        object.__setattr__(self, "delta", _v.open_unit("delta", self.delta))
        if self.montecarlo_samples is not None:
            from dpmf.accounting.montecarlo.accountant import samples_to_estimate

            s = _v.positive_int("montecarlo_samples", self.montecarlo_samples)
            need = samples_to_estimate(self.delta)
            if s < need:
                raise InvalidParameterError(
                    f"montecarlo_samples={s} cannot estimate delta={self.delta:g}: with so few samples the 99% "
                    f"upper confidence bound on delta stays above it at every noise level; use at least "
                    f"{need:,} samples (or a larger delta)"
                )
            object.__setattr__(self, "montecarlo_samples", s)

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset_size // self.batch_size

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @property
    def sampling_prob(self) -> float:
        return self.batch_size / self.dataset_size


@dataclass(frozen=True)
class Candidate:
    label: str
    strategy: object
    scheme: object
    method: str
    rmse_per_sigma: Callable[[], float] | None = None  # default: strategy.prefix_sum_rmse()
    strategy_name: str | None = None  # default: strategy.name
    options: dict | None = None  # keyword options for the accountant (e.g. Monte Carlo samples)


@dataclass(frozen=True)
class PlanRow:
    """One calibrated configuration."""

    strategy: str
    sampling: str
    method: str
    noise_multiplier: float
    epsilon: float
    certified: bool
    prefix_sum_rmse: float
    rmse_per_example_in_batch: float
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def candidates(run: TrainingRun) -> list[Candidate]:
    """Every configuration dpmf can account for, for this run."""
    steps = run.steps
    out = [
        Candidate("DP-SGD, Poisson sampling", Identity(steps), PoissonSampling(run.sampling_prob, steps), "pld"),
        Candidate(
            "DP-SGD, shuffled fixed order",
            Identity(steps),
            FixedOrderSampling(run.epochs, steps),
            "unamplified",
        ),
    ]
    fixed = FixedOrderSampling(run.epochs, steps)
    sqrt_toeplitz = ToeplitzStrategy.sqrt_prefix_sum(steps)
    out.append(
        Candidate(
            "sqrt-Toeplitz MF, shuffled fixed order", sqrt_toeplitz, fixed, "unamplified", strategy_name="sqrt-toeplitz"
        )
    )
    bands = min(64, run.steps_per_epoch)
    banded_t = optimize_banded_toeplitz(steps, bands, run.epochs)
    out.append(
        Candidate(
            f"banded Toeplitz ({bands} bands), shuffled fixed order",
            banded_t,
            fixed,
            "unamplified",
            strategy_name=f"banded-toeplitz-{bands}",
        )
    )
    blt, _ = optimize_blt(steps, 2, run.epochs)
    out.append(Candidate("BLT (2 buffers), shuffled fixed order", blt.to_toeplitz(steps), fixed, "unamplified",
                         strategy_name="blt-2"))
    poisson = PoissonSampling(run.sampling_prob, steps)
    if run.mmcc:
        out.append(
            Candidate(
                f"banded Toeplitz ({bands} bands), Poisson sampling (MMCC)",
                banded_t,
                poisson,
                "mmcc",
                strategy_name=f"banded-toeplitz-{bands}",
            )
        )
    if bands * run.sampling_prob <= 1:  # same expected batch size: rate b*q in the active group
        out.append(
            Candidate(
                f"banded Toeplitz ({bands} bands), cyclic Poisson",
                banded_t,
                CyclicPoissonSampling(bands * run.sampling_prob, steps, bands),
                "auto",  # generalized MMCC or, if tighter, the unamplified Gaussian
                strategy_name=f"banded-toeplitz-{bands}",
            )
        )
    if run.montecarlo_samples:
        out.append(
            Candidate(
                f"banded Toeplitz ({bands} bands), b-min-sep (Monte Carlo ESTIMATE)",
                banded_t,
                MinSepSampling.from_participation_rate(run.sampling_prob, steps, bands, warm_start=True),
                "montecarlo",
                strategy_name=f"banded-toeplitz-{bands}",
                options={"num_samples": run.montecarlo_samples, "seed": 0},
            )
        )
    balls = BallsInBinsSampling(run.epochs, steps)
    out.append(Candidate("DP-SGD, balls-in-bins", Identity(steps), balls, "auto"))  # allocation or unamplified
    p = min(4, run.steps_per_epoch)
    out.append(Candidate(f"BSR ({p} bands), balls-in-bins", bsr(steps, p), balls, "auto",
                         strategy_name=f"bsr-{p}"))
    if steps <= MAX_TREE_STEPS:
        tree = BinaryTree(steps)
        configs = [("binary tree (optimal decoder), shuffled fixed order", fixed, "unamplified")]
        if run.mmcc:
            configs.append(("binary tree (optimal decoder), Poisson sampling (MMCC)", poisson, "mmcc"))
        for label, scheme, method in configs:
            out.append(
                Candidate(
                    label, tree, scheme, method, lambda tree=tree: tree.prefix_sum_rmse("optimal"), strategy_name="tree"
                )
            )
    if steps <= MAX_OPTIMAL_STEPS:
        out.append(
            Candidate(
                "optimal multi-epoch MF, shuffled fixed order",
                _LazyOptimal(steps, run.epochs),
                fixed,
                "unamplified",
                strategy_name="optimal-mf",
            )
        )
    return out


def _estimate_montecarlo(cand: Candidate, run: TrainingRun):
    """Monte Carlo row: smallest noise whose *estimated* epsilon (fixed seed, upper confidence
    bound) meets the target. An ESTIMATE (``certified=False``); certify a chosen configuration with
    ``dpmf calibrate --method montecarlo`` (Estimate-Verify-Release)."""
    from dpmf.accounting.dispatch import METHODS, Calibration
    from dpmf.privacy.calibration import smallest_noise

    m = METHODS["montecarlo"]

    def report(sigma: float):
        return m.run(cand.strategy, cand.scheme, sigma, run.delta, **(cand.options or {}))

    res = smallest_noise(lambda s: report(s).epsilon, run.epsilon, rel_tol=1e-3)
    return Calibration(res.value, report(res.value), res.evaluations)


class _LazyOptimal:
    """The optimal (k, b) factorization for prefix sums, optimized on first use (a few seconds)."""

    name = "optimal-mf"

    def __init__(self, n: int, epochs: int) -> None:
        self.n, self.epochs, self._dense = n, epochs, None

    def _strategy(self):
        if self._dense is None:
            from dpmf.strategies.dense import DenseStrategy
            from dpmf.strategies.optimal import optimal_multi_epoch_gram

            self._dense = DenseStrategy(optimal_multi_epoch_gram(self.n, self.epochs).C, name="optimal-mf")
        return self._dense

    def describe(self) -> dict:
        return {"name": self.name, "n": self.n, "epochs": self.epochs}

    def sensitivity(self, participation) -> float:
        return self._strategy().sensitivity(participation)

    def prefix_sum_rmse(self) -> float:
        return self._strategy().prefix_sum_rmse()


def plan(run: TrainingRun, *, on_row: Callable[[PlanRow], None] | None = None) -> list[PlanRow]:
    """Calibrate every candidate to ``(run.epsilon, run.delta)``; rows sorted best first."""
    rows = []
    for cand in candidates(run):
        start = time.perf_counter()
        if cand.method == "montecarlo":
            cal = _estimate_montecarlo(cand, run)
        else:
            cal = calibrate(cand.strategy, cand.scheme, run.epsilon, run.delta, method=cand.method)
        per_sigma = cand.rmse_per_sigma() if cand.rmse_per_sigma else cand.strategy.prefix_sum_rmse()
        rmse = cal.noise_multiplier * per_sigma
        row = PlanRow(
            strategy=cand.strategy_name or cand.strategy.name,
            sampling=cand.scheme.name,
            method=cal.report.method,
            noise_multiplier=cal.noise_multiplier,
            epsilon=cal.report.epsilon,
            certified=cal.report.certified,
            prefix_sum_rmse=rmse,
            rmse_per_example_in_batch=rmse / run.batch_size,
            seconds=time.perf_counter() - start,
        )
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return sorted(rows, key=lambda r: r.prefix_sum_rmse)


def plan_figure(run: TrainingRun, rows: list[PlanRow]):
    """The matplotlib figure of :func:`plot_plan`, laid out so every label is inside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.strategy} / {r.sampling}\n({r.method}, sigma={r.noise_multiplier:.3g})" for r in rows]
    fig, ax = plt.subplots(figsize=(7.5, 1.3 + 0.7 * len(rows)))
    ax.barh(range(len(rows)), [r.prefix_sum_rmse for r in rows], color="tab:blue")
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("RMSE of prefix sums of noisy gradient sums\n(clip-norm units; lower is better)")
    ax.set_title(
        f"dpmf plan: N={run.dataset_size}, batch={run.batch_size}, epochs={run.epochs},\n"
        f"target (eps={run.epsilon:g}, delta={run.delta:g})",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def plot_plan(run: TrainingRun, rows: list[PlanRow], path: str) -> None:
    """Save a PNG: each configuration's noise-induced RMSE, best first, at the target epsilon
    (``path``'s folder must exist; checked before drawing)."""
    import matplotlib.pyplot as plt

    from dpmf.files import check_output_file, writing

    check_output_file(path, "path")
    fig = plan_figure(run, rows)
    try:
        with writing(path, "plot"):
            fig.savefig(path, dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
