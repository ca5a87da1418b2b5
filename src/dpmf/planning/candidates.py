"""What ``dpmf plan`` compares: the training run and the candidate configurations (the rows they
become: :mod:`dpmf.planning.rows`).

A candidate is a small picklable *recipe* -- a :class:`StrategySpec` (kind and size, built on
first use), a sampling scheme, an accountant and its options -- so it can be looked up in the
cache without building anything, and sent to a Dask worker that builds it there.

Candidates come in three *waves*, cheapest first. Every candidate of a wave is checked against
the best prefix RMSE of the waves before it (see :mod:`dpmf.planning.evaluate`), so the waves are
independent of each other's order and run the same locally and on a Dask cluster:

0. closed forms under the shuffled fixed order (DP-SGD, sqrt-Toeplitz, banded Toeplitz for every
   band count of the sweep, BLT, binary tree, and the multi-epoch optimal factorization up to
   :data:`EXACT_OPTIMAL_STEPS` steps): sensitivities only;
1. cheap amplified accountants: DP-SGD with Poisson sampling (PLD) and with balls-in-bins (random
   allocation: one slot reused every epoch, fresh slots every epoch, and 2 slots in each pair of
   epochs), and banded Toeplitz under cyclic Poisson sampling with ``cycle = bands`` (the
   min-sep sweep: the cycle length is the separation between two participations of an example);
2. expensive ones: MMCC for banded Toeplitz (band sweep, at most ``steps // 8`` bands) and the
   binary tree under Poisson sampling, random allocation for BSR, the multi-epoch optimal
   factorization above :data:`EXACT_OPTIMAL_STEPS` steps (its dual bound can prune it), and Monte
   Carlo rows (estimates, only when asked for).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import cached_property

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError
from dpmf.sampling.schemes import (
    BallsInBinsSampling,
    CyclicPoissonSampling,
    FixedOrderSampling,
    MinSepSampling,
    PoissonSampling,
)

#: The tree's sensitivity and optimal decoder use dense (2n-1) x n matrices: skip it above this.
MAX_TREE_STEPS = 4096
#: The dense optimal factorization costs ~n^3 (about 10 s at n = 1000 with the plan's gap): skip
#: it above this.
MAX_OPTIMAL_STEPS = 1024
#: MMCC rows under Poisson sampling (dense encoder, one mixture PLD per row): up to this many steps.
MAX_MMCC_STEPS = 2048
#: Band counts of the banded-Toeplitz sweep (capped at the steps per epoch; the steps per epoch
#: themselves are added for the fixed order, where bands = min-sep is the family's best).
BAND_SWEEP = (4, 16, 64)
#: MMCC rows under Poisson sampling for banded Toeplitz with at most ``steps // MMCC_DENSITY`` bands
#: (at least 4): MMCC's cost grows fast with the density of the encoder.
MMCC_DENSITY = 8
#: Relative duality gap at which the plan stops the optimal factorization's Newton iterations
#: (above :data:`EXACT_OPTIMAL_STEPS` steps). Any C is sound -- its sensitivity and epsilon are
#: computed for the C used -- and a gap g certifies a prefix RMSE within about g/2 of the optimum.
OPTIMAL_GAP = 1e-2
#: Up to this many steps the optimal factorization is solved to a 1e-6 gap (a second or two).
EXACT_OPTIMAL_STEPS = 256
#: Relative tolerance of every calibration in the plan.
REL_TOL = 1e-4


@dataclass(frozen=True)
class TrainingRun:
    """A training run to plan for. Defaults: a CIFAR-10-sized run (50k examples, 5 epochs)."""

    dataset_size: int = 50_000
    batch_size: int = 500
    epochs: int = 5
    epsilon: float = 2.0
    delta: float = 1e-6
    montecarlo_samples: int | None = None  # add Monte Carlo (estimate) rows with this many samples
    mmcc: bool = True  # MMCC rows under Poisson sampling (tree, banded Toeplitz), up to MAX_MMCC_STEPS

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
        object.__setattr__(self, "mmcc", bool(self.mmcc))
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

    def describe(self) -> dict:
        """The run a plan row was planned for (:attr:`dpmf.planning.rows.PlanRow.run`): dataset size,
        batch size, epochs, target epsilon and delta, and the steps and sampling probability they give."""
        return {
            "dataset_size": self.dataset_size,
            "batch_size": self.batch_size,
            "epochs": self.epochs,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "steps": self.steps,
            "sampling_prob": self.sampling_prob,
        }


@dataclass(frozen=True)
class StrategySpec:
    """How to build a strategy: ``kind`` and its size parameters (everything its value depends on).

    Kinds: ``identity``, ``sqrt-toeplitz``, ``banded-toeplitz`` (``bands``), ``blt`` (``buffers``),
    ``bsr`` (``bands``), ``tree`` (rows use the optimal decoder), ``optimal`` (the multi-epoch
    optimal factorization, Newton stopped at relative duality gap ``gap``)."""

    kind: str
    n: int
    epochs: int = 1
    bands: int | None = None
    buffers: int | None = None
    gap: float | None = None

    @property
    def name(self) -> str:
        """The strategy's name in the plan's rows."""
        if self.kind in ("banded-toeplitz", "bsr"):
            return f"{self.kind}-{self.bands}"
        if self.kind == "blt":
            return f"blt-{self.buffers}"
        return {"optimal": "optimal-mf"}.get(self.kind, self.kind)

    def key(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def build(self):
        """The strategy (for ``optimal``: see :func:`optimal_strategy`)."""
        from dpmf.strategies.banded import bsr, optimize_banded_toeplitz
        from dpmf.strategies.identity import Identity
        from dpmf.strategies.toeplitz import ToeplitzStrategy
        from dpmf.strategies.tree import BinaryTree

        if self.kind == "identity":
            return Identity(self.n)
        if self.kind == "sqrt-toeplitz":
            return ToeplitzStrategy.sqrt_prefix_sum(self.n)
        if self.kind == "banded-toeplitz":
            import numpy as np

            with np.errstate(over="ignore", invalid="ignore"):  # (line searches probe unstable points)
                return optimize_banded_toeplitz(self.n, self.bands, self.epochs)
        if self.kind == "blt":
            from dpmf.strategies.blt import optimize_blt

            return optimize_blt(self.n, self.buffers, self.epochs)[0].to_toeplitz(self.n)
        if self.kind == "bsr":
            return bsr(self.n, self.bands)
        if self.kind == "tree":
            return BinaryTree(self.n)
        if self.kind == "optimal":
            return optimal_strategy(self)[0]
        raise InvalidParameterError(f"unknown strategy kind {self.kind!r}")

    def rmse_per_sigma(self, strategy) -> float:
        """Prefix-sum RMSE per unit noise of ``strategy`` as built (the tree: optimal decoder)."""
        if self.kind == "tree":
            return float(strategy.prefix_sum_rmse("optimal"))
        return float(strategy.prefix_sum_rmse())


@dataclass(frozen=True)
class Candidate:
    """One configuration to calibrate: a strategy recipe, a scheme, an accountant (``method`` of
    :func:`dpmf.calibrate`) and its options, and the wave it runs in. ``strategy`` is built on
    first use."""

    label: str
    spec: StrategySpec
    scheme: object
    method: str
    options: dict | None = None  # keyword options for the accountant (e.g. Monte Carlo samples)
    wave: int = 0

    @cached_property
    def strategy(self):
        return self.spec.build()

    @property
    def strategy_name(self) -> str:
        return self.spec.name

    @property
    def sampling_name(self) -> str:
        """The row's sampler: the scheme's name, with the balls-in-bins variant spelled out
        (``balls-in-bins-fresh``, ``balls-in-bins-2-of-46-fresh``) so that rows stay distinct."""
        s = self.scheme
        if isinstance(s, MinSepSampling):  # (min-sep in the name: two rows may differ only there)
            return f"{s.name}-{s.min_sep}"
        if not isinstance(s, BallsInBinsSampling) or s.reused_single_slot:
            return s.name
        name = s.name + (f"-{s.num_selected}-of-{s.steps_per_epoch}" if s.num_selected > 1 else "")
        return name + ("-fresh" if s.fresh_slots else "")

    def rmse_per_sigma(self) -> float:
        return self.spec.rmse_per_sigma(self.strategy)

    def memory_bytes(self) -> float:
        """A rough estimate of the peak memory of this candidate's row, from its sizes alone (nothing
        is built): the dense matrices its strategy and accountant hold. The optimal factorization's
        dual problem holds a ``k(k+1)/2 x (1 + k(k-1)/2)`` matrix for ``k`` epochs (measured: 15.1 GiB
        at 900 steps, 300 epochs) beside ~12 dense ``n x n`` ones; the tree a ``(2n-1) x n``
        encoder and its decoder; MMCC a dense encoder and its row PLDs (``accounting/cost.py``)."""
        n, k = self.spec.n, self.spec.epochs
        est = 8.0 * 4 * n  # (vectors)
        if self.spec.kind == "optimal":
            est = 8.0 * (k * (k + 1) / 2) * (1 + k * (k - 1) / 2) + 12 * 8.0 * n * n
        elif self.spec.kind == "tree":
            est = 3 * 8.0 * (2 * n) * n
        elif self.spec.kind != "identity" and self.method != "unamplified":
            est = 3 * 8.0 * n * n  # (a dense encoder or Gram matrix, and a copy or two)
        if self.method == "mmcc":
            est += 0.35 * 2**30 + 0.8 * 2**30 * (n / 1000) ** 2
        return est

    def key(self, run: TrainingRun) -> dict:
        """Everything the candidate's row depends on, except the code (added by the cache)."""
        return {
            "strategy": self.spec.key(),
            "scheme": self.scheme.describe(),
            "method": self.method,
            "options": dict(sorted((self.options or {}).items())),
            "epsilon": run.epsilon,
            "delta": run.delta,
            "batch_size": run.batch_size,
            "dataset_size": run.dataset_size,  # (the row records its run)
            "epochs": run.epochs,
            "rel_tol": REL_TOL,
        }

    def __getstate__(self):  # never ship a built strategy to a Dask worker
        state = dict(self.__dict__)
        state.pop("strategy", None)
        return state


def band_sweep(run: TrainingRun) -> list[int]:
    """Band counts to try: :data:`BAND_SWEEP` capped at the steps per epoch (at least one)."""
    spe = run.steps_per_epoch
    out = sorted({min(b, spe) for b in BAND_SWEEP})
    return out


def candidates(run: TrainingRun) -> list[Candidate]:
    """Every configuration dpmf can account for, for this run (recipes: nothing is built yet)."""
    steps, k, q, spe = run.steps, run.epochs, run.sampling_prob, run.steps_per_epoch
    fixed = FixedOrderSampling(k, steps)
    poisson = PoissonSampling(q, steps)
    balls = BallsInBinsSampling(k, steps)
    sweep = band_sweep(run)
    identity = StrategySpec("identity", steps)

    def banded(b: int) -> StrategySpec:
        return StrategySpec("banded-toeplitz", steps, k, bands=b)

    out = [
        Candidate("DP-SGD, shuffled fixed order", identity, fixed, "unamplified"),
        Candidate("sqrt-Toeplitz MF, shuffled fixed order", StrategySpec("sqrt-toeplitz", steps), fixed, "unamplified"),
    ]
    fixed_bands = sorted(set(sweep) | ({spe} if spe <= 256 else set()))
    for b in fixed_bands:
        out.append(Candidate(f"banded Toeplitz ({b} bands), shuffled fixed order", banded(b), fixed, "unamplified"))
    out.append(
        Candidate("BLT (2 buffers), shuffled fixed order", StrategySpec("blt", steps, k, buffers=2), fixed, "unamplified")
    )
    if steps <= MAX_TREE_STEPS:
        out.append(
            Candidate("binary tree (optimal decoder), shuffled fixed order", StrategySpec("tree", steps), fixed,
                      "unamplified")
        )
    if steps <= MAX_OPTIMAL_STEPS:  # cheap when small (wave 0); else last, where its dual bound can prune it
        exact = steps <= EXACT_OPTIMAL_STEPS
        out.append(
            Candidate("optimal multi-epoch MF, shuffled fixed order",
                      StrategySpec("optimal", steps, k, gap=1e-6 if exact else OPTIMAL_GAP), fixed, "unamplified",
                      wave=0 if exact else 2)
        )
    # wave 1: cheap amplification
    out.append(Candidate("DP-SGD, Poisson sampling", identity, poisson, "pld", wave=1))
    for b in sweep:
        if b > 1 and b * q < 1:  # same expected batch size: rate b*q in the active group (< 1: amplified)
            out.append(
                Candidate(
                    f"banded Toeplitz ({b} bands), cyclic Poisson (cycle {b})",
                    banded(b),
                    CyclicPoissonSampling(b * q, steps, b),
                    "auto",  # generalized MMCC or, if tighter, the unamplified Gaussian
                    wave=1,
                )
            )
    out += _min_sep_candidates(run, banded)
    out.append(Candidate("DP-SGD, balls-in-bins", identity, balls, _dpsgd_allocation_method(), wave=1))
    if k > 1:  # fresh slots: the epochs compose (reused slots cost like one epoch at sigma / sqrt(k))
        out.append(Candidate("DP-SGD, balls-in-bins, fresh slots each epoch", identity,
                             BallsInBinsSampling(k, steps, fresh_slots=True), "allocation_pld", wave=1))
    if k % 2 == 0:  # k of t: 2 slots in each pair of epochs (2 spe steps), fresh: the same batch size
        out.append(Candidate(f"DP-SGD, balls-in-bins, 2 of {2 * spe} steps, fresh slots", identity,
                             BallsInBinsSampling(k // 2, steps, num_selected=2, fresh_slots=True),
                             "allocation_pld", wave=1))
    # wave 2: expensive accountants and strategies
    if run.mmcc and steps <= MAX_MMCC_STEPS:
        for b in sweep:
            if b <= max(4, steps // MMCC_DENSITY):
                out.append(
                    Candidate(f"banded Toeplitz ({b} bands), Poisson sampling (MMCC)", banded(b), poisson, "mmcc",
                              wave=2)
                )
        if steps <= MAX_TREE_STEPS:
            out.append(
                Candidate("binary tree (optimal decoder), Poisson sampling (MMCC)", StrategySpec("tree", steps),
                          poisson, "mmcc", wave=2)
            )
    p = min(4, spe)
    out.append(Candidate(f"BSR ({p} bands), balls-in-bins", StrategySpec("bsr", steps, bands=p), balls, "auto", wave=2))
    if k > 1:  # shuffled batches every epoch: the epochs compose (allocation/fresh_correlated.py)
        out.append(Candidate(f"BSR ({p} bands), balls-in-bins, fresh slots each epoch", StrategySpec("bsr", steps, bands=p),
                             BallsInBinsSampling(k, steps, fresh_slots=True), "auto", wave=2))
    if run.montecarlo_samples:
        b = min(64, spe)
        out.append(
            Candidate(
                f"banded Toeplitz ({b} bands), b-min-sep (Monte Carlo ESTIMATE)",
                banded(b),
                MinSepSampling.from_participation_rate(q, steps, b, warm_start=True),
                "montecarlo",
                options={"num_samples": run.montecarlo_samples, "seed": 0},
                wave=2,
            )
        )
    return out


def min_sep_values(run: TrainingRun, bands: int) -> list[int]:
    """The min-sep values the plan tries for BandMF with ``bands`` bands under b-min-sep sampling:
    ``bands`` itself (the paper's choice, min-sep = bands) and ``2 * bands`` where it fits (a larger
    separation, fewer participations), each only while ``min_sep * q < 1`` (else no example is ever
    available) and below the steps per epoch."""
    q, spe = run.sampling_prob, run.steps_per_epoch
    return [m for m in (bands, 2 * bands) if 1 < m < spe and m * q < 1]


def _min_sep_candidates(run: TrainingRun, banded) -> list[Candidate]:
    """BandMF under b-min-sep sampling (seed 001's scheme), one candidate per band count of the sweep
    and min-sep of :func:`min_sep_values`, with the same expected batch size (participation rate
    ``q``, warm start). Their only proved accountant that finishes in seconds is the unamplified
    min-sep sensitivity bound (``ceil(n / min_sep)`` participations, no credit for the sampling);
    Algorithm 5 (certified Monte Carlo) is the tighter one and its cost is in the row's note
    (:func:`dpmf.planning.evaluate.min_sep_note`). Closed forms: wave 0."""
    out = []
    for b in band_sweep(run):
        for m in min_sep_values(run, b):
            scheme = MinSepSampling.from_participation_rate(run.sampling_prob, run.steps, m, warm_start=True)
            out.append(Candidate(f"banded Toeplitz ({b} bands), b-min-sep (min-sep {m}), unamplified bound",
                                 banded(b), scheme, "unamplified"))
    return out


def _dpsgd_allocation_method() -> str:
    """DP-SGD under balls-in-bins: the random-allocation PLD (``allocation_pld``, the exact dominating
    pair, pessimistically discretized) when dpmf has it -- ``auto`` would also run the Renyi and
    conditional-composition bounds, which cannot be tighter and are far slower -- else ``auto``."""
    from dpmf.accounting.dispatch import METHODS

    return "allocation_pld" if "allocation_pld" in METHODS else "auto"


def sort_rows(rows: list[PlanRow]) -> list[PlanRow]:
    """Calibrated rows best first, then pruned rows by their lower bound. The RMSEs are compared to 12
    digits: pruned rows' bounds are the best row's RMSE rescaled, equal up to the last bits (whose
    rounding ordered them differently between machines), and such ties go by the pruned rows' noise
    bound, then the input order."""

    def key(r):
        rmse = float(f"{r.prefix_sum_rmse:.12g}") if math.isfinite(r.prefix_sum_rmse) else math.inf
        return r.pruned, rmse, r.noise_multiplier if r.pruned else 0.0

    return sorted(rows, key=key)


def optimal_strategy(spec: StrategySpec, stop=None):
    """``(DenseStrategy, result)``: the multi-epoch optimal factorization, Newton stopped at the
    relative gap ``spec.gap`` (or when ``stop(dual_lower_bound_on_loss)`` returns True: then the
    strategy is ``None``)."""
    from dpmf.strategies.dense import DenseStrategy
    from dpmf.strategies.optimal import optimal_multi_epoch_gram

    stopped = []

    def callback(iteration: int, loss: float, gap: float):
        if stop is not None and stop(loss - gap):
            stopped.append(loss - gap)
            return True
        return False

    res = optimal_multi_epoch_gram(spec.n, spec.epochs, tol=spec.gap or 1e-6, callback=callback)
    if stopped:
        return None, res
    return DenseStrategy(res.C, name="optimal-mf"), res
