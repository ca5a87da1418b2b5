"""Up-front cost estimates: roughly how long and how much memory a run will take, before it starts.

``dpmf account`` / ``calibrate`` / ``plan`` / ``strategy build`` call :func:`check_cost` with an
estimate from :func:`strategy_build_cost`, :func:`accounting_cost` or :func:`plan_cost` and refuse,
with the estimate, a run that would take longer than a few minutes or more memory than the machine
has (``--force`` proceeds anyway).

**These are rough estimates** (right within a factor of a few, not a promise): one small model per
method, a power law in the number of steps ``n`` (and the noise multiplier, sampling probability or
sample count where they drive the cost), fitted to timings of dpmf on the development machine
(2 cores; ``benchmarks/README.md``, "Up-front cost estimates"). They look only at the types and
sizes of the inputs -- never at a dense matrix -- so they are instant even at ``n = 10^9``. Where
a model is unsure it errs low (a refusal must be a clear case), except for memory, which counts the
dense ``m x n`` matrices a method materializes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpmf.errors import CostLimitError, DPMFError
from dpmf.resources import available_memory, check_allocation, format_bytes, format_seconds

__all__ = [
    "CostEstimate",
    "strategy_build_cost",
    "accounting_cost",
    "plan_cost",
    "check_cost",
    "available_memory",
    "DEFAULT_MAX_SECONDS",
]

#: Default limit of :func:`check_cost`: "more than a few minutes".
DEFAULT_MAX_SECONDS = 600.0
_GIB = 2.0**30


@dataclass(frozen=True)
class CostEstimate:
    """A rough estimate: total ``seconds`` and peak ``memory_bytes``, and the parts they come from
    (``(what, seconds, memory_bytes)``)."""

    seconds: float
    memory_bytes: float
    parts: tuple[tuple[str, float, float], ...] = ()

    def __add__(self, other: "CostEstimate") -> "CostEstimate":
        return CostEstimate(
            self.seconds + other.seconds, max(self.memory_bytes, other.memory_bytes), self.parts + other.parts
        )

    def describe(self) -> str:
        """``"about 3 h and 40 GiB (mmcc ~3 h, unamplified ~2 s)"``."""
        t, m = format_seconds(self.seconds), format_bytes(self.memory_bytes)
        main = ("" if t.startswith("under") else "about ") + f"{t} and " + (m if m.startswith("under") else f"{m} of memory")
        parts = [p for p in self.parts if p[1] >= 1 or p[2] >= 0.25 * _GIB]
        if parts:
            main += " (" + ", ".join(f"{w} ~{format_seconds(s)}, {format_bytes(m)}" for w, s, m in parts) + ")"
        return main


def _size(value) -> int:
    """A count for the models: a non-negative int, or 0 for anything else (bad values are the
    library's to refuse, with its own message; the estimate must not fail first)."""
    if isinstance(value, bool):
        return 0
    try:
        v = int(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    return v if v > 0 and v == value else 0


# ------------------------------------------------------------------------------------ strategies
def strategy_build_cost(kind: str, n: int, *, epochs: int = 1, bands: int | None = None) -> CostEstimate:
    """Building a catalog strategy (:func:`dpmf.strategies.catalog.build`) of ``kind`` for ``n`` steps.

    Measured: ``optimal`` 0.17 / 0.51 / 1.9 s at n = 128 / 256 / 512 (then ~n^3, dense Newton);
    ``banded`` (BandMF) 0.63 / 2.0 s at n = 128 / 256 with 8 bands; the Toeplitz kinds, the tree
    and the FFT mechanism are structured (milliseconds)."""
    n = _size(n)
    epochs, bands = _size(epochs) or 1, _size(bands) or None
    dense = 8.0 * n * n
    if kind == "optimal":  # measured 141 s for n = 1000 with 10 epochs (dpmf plan)
        secs = (1.9 * (n / 512) ** 3 if n > 512 else 1.9 * (n / 512) ** 1.9) * max(epochs, 1)
        return CostEstimate(secs, 12 * dense, (("optimal strategy", secs, 12 * dense),))
    if kind == "banded":
        b = bands or 8
        secs = 2.0 * (n / 256) ** 2 * max(b / 8, 0.5)
        return CostEstimate(secs, 6 * dense, (("BandMF optimization", secs, 6 * dense),))
    if kind == "matrix":
        return CostEstimate(0.0, 3 * dense, (("matrix strategy", 0.0, 3 * dense),))
    if kind in ("banded-toeplitz", "blt"):
        secs = 0.2 * (n / 1024) ** 1.5
        return CostEstimate(secs, 64.0 * n, ((f"{kind} optimization", secs, 64.0 * n),))
    return CostEstimate(0.0, 8.0 * n)  # structured (identity, tree, Toeplitz coefficients, FFT)


# ------------------------------------------------------------------------------------ accounting
def check_dense_fits(strategy, what: str) -> None:
    """Raise :class:`~dpmf.errors.InvalidParameterError` when ``strategy.encoder()`` (dense,
    ``rows x n`` float64) would not fit in the memory available, before numpy's ``MemoryError``
    (``what`` names who needs it, e.g. ``"MMCC"``)."""
    rows, n = strategy_shape(strategy)
    check_allocation(rows, n, what)


def strategy_shape(strategy) -> tuple[int, int]:
    """``(rows, n)`` of the encoder without building it."""
    n = int(getattr(strategy, "n", 0) or 0)
    rows = getattr(strategy, "rows", None)
    if rows is None:
        name = type(strategy).__name__
        rows = 2 * n - 1 if name == "BinaryTree" else 2 * n if name == "FFTMechanism" else n
    return int(rows), n


def _bandwidth(strategy) -> int:
    """Non-zero diagonals of a lower-triangular encoder (``n`` when dense or unknown)."""
    from dpmf.strategies.identity import Identity
    from dpmf.strategies.toeplitz import ToeplitzStrategy

    n = int(strategy.n)
    if isinstance(strategy, Identity):
        return 1
    if isinstance(strategy, ToeplitzStrategy):
        import numpy as np

        nz = np.flatnonzero(np.asarray(strategy.coefs) != 0)
        return int(nz[-1]) + 1 if nz.size else 1
    C = getattr(strategy, "C", None)
    if C is not None and getattr(C, "ndim", 0) == 2 and C.shape[0] == C.shape[1] and n <= 8192:
        import numpy as np

        i, j = np.nonzero(C)
        return int((i - j).max()) + 1 if i.size else 1
    return n


def _sigma_factor(sigma: float | None) -> float:
    """Cost of the mixture PLDs relative to sigma = 10 (their loss grids widen like 1/sigma^2)."""
    if sigma is None:
        sigma = 1.0
    return min(max((10.0 / sigma) ** 2, 0.01), 1e4)


def _pld_part(n, q, sigma, discretization=1e-4) -> tuple[float, float]:
    """DP-SGD PLD: the composed loss grid spans ~ n q^2 / (2 sigma^2) + 10 q sqrt(n) / sigma.
    Measured 0.4 s (n = 10^3..10^5, q = 0.01, sigma = 1), 1.1 s (n = 10^6), 21.8 s (n = 10^5,
    q = 0.5). q = 1 is a closed form.

    Plus one step's grid, ``u^2 / 2 + 8 u`` (``u = 1 / sigma``) over the discretization, which the
    adaptive discretization (:func:`dpmf.privacy.gaussian_plds.grid_discretization`) keeps at most
    :data:`~dpmf.privacy.gaussian_plds.MAX_STEP_GRID_POINTS`: above it, a grid step ``2^k`` times
    coarser with at most :data:`~dpmf.privacy.gaussian_plds.COARSE_STEP_GRID_POINTS` points, which
    also coarsens the composed grid. About 2.5e-6 s x (1 + log10(n) / 2) and 300 bytes x
    (1 + 0.3 log10(n)) per step point beyond 1e5. Re-measured 2026-11-28 (CPU time, after the
    adaptive discretization; ``benchmarks/README.md``, "MMCC and PLD cost model"): 1.8 s at
    sigma = 0.3, q = 0.01, n = 1000 (estimate 1.7 s; the old model said 12 s); 0.3 / 0.9 / 0.5 s at
    sigma = 0.1 (n = 100, q = 0.01; n = 1000, q = 0.05) and sigma = 0.03 (n = 100, q = 0.05),
    estimates 0.3 s (the old model said "refused": 0.01 s)."""
    from dpmf.privacy.gaussian_plds import COARSE_STEP_GRID_POINTS, MAX_STEP_GRID_POINTS

    u = 1.0 / sigma
    width = 0.5 * u * u + 8.3 * u if u < 1e100 else math.inf
    if not math.isfinite(width) or width / 700.0 > COARSE_STEP_GRID_POINTS:
        return 0.01, 0.0  # (no grid represents it: refused before any work, NoiseTooSmallError)
    disc = discretization
    if width / disc + 1 > MAX_STEP_GRID_POINTS:  # the coarser grid (power-of-two multiple)
        disc *= 2.0 ** max(0, math.ceil(math.log2(width / ((COARSE_STEP_GRID_POINTS - 1) * disc))))
    step_points = width / disc
    decades = math.log10(max(n, 1))
    step_secs = 2.5e-6 * max(step_points - 1e5, 0.0) * (1 + 0.5 * decades)  # (negligible at sigma >= 1)
    step_mem = 300.0 * step_points * (1 + 0.3 * decades)
    if q >= 1:
        return 0.01 + step_secs, step_mem
    scale = n * q * q / (2 * sigma * sigma) + 10 * q * math.sqrt(n) / sigma
    points = max(scale, 1.0) / disc
    return 0.3 + 1.5e-3 * scale * (1e-4 / disc) + step_secs, max(64.0 * points, step_mem)


def _pld_search_noise(n: int, q: float, target_epsilon: float | None, delta: float | None) -> float:
    """Roughly where a DP-SGD PLD calibration ends: the noise at which the central-limit
    approximation ``mu = q sqrt(n (exp(1 / sigma^2) - 1))`` (Bu et al. 2020) meets
    ``mu(target_epsilon, delta)``, never below the smallest noise the accountant evaluates
    (:data:`~dpmf.privacy.gaussian_plds.MAX_STEP_GRID_POINTS`), where a huge target or a delta near 1
    ends it. 1 when the target is not known (the searches start there)."""
    from dpmf.privacy.gaussian_plds import MAX_STEP_GRID_POINTS

    u_max = -8.3 + math.sqrt(8.3**2 + 2.0 * MAX_STEP_GRID_POINTS * 1e-4)
    floor = 1.0 / u_max
    if target_epsilon is None or delta is None or not 0 < q < 1:
        return 1.0
    try:
        from dpmf.privacy.gdp import gdp_mu

        mu = gdp_mu(float(target_epsilon), float(delta))
        sigma = 1.0 / math.sqrt(math.log1p(mu * mu / (q * q * max(n, 1))))
    except (ArithmeticError, ValueError, DPMFError):
        return floor  # (a target beyond what mu-GDP can express: the search goes all the way down)
    return max(sigma, floor) if math.isfinite(sigma) else floor


#: The fixed part of a structured (tree, banded) MMCC evaluation in a fresh process: loading the
#: compiled kernels, the tail-bound structure, the first transforms (re-measured 2026-12-02 night:
#: bsr(16, 4) at sigma 4 0.99 CPU-s, binary tree T = 256 at sigma 1 on a coarse grid 1.5-2.7).
_MMCC_STRUCTURED_BASE = 0.45
#: MMCC on a checked coarse loss grid (``mmcc.grid.checked_coarse_grid``): ``min(F, a F^b)`` CPU-s for a
#: run whose requested grid would take ``F``, as ``(a, b)``: banded Toeplitz (16 cells, measured 1.2-3.3
#: CPU-s, within 0.66-1.52x) and binary trees (refit 2026-12-03 afternoon after the heuristic's own
#: looser grid check, ``mmcc.accountant.HEURISTIC_GRID_REL``: 8 checked cells of two runs, 0.97-7.5
#: CPU-s, within 0.58-1.73x; before it the heuristic's fine grid decided a tree's time, 0.47-2.1x).
_MMCC_CHECKED_BANDED = (1.12, 0.26)
_MMCC_CHECKED_OTHER = (0.31, 0.56)
#: A first MMCC evaluation in a fresh process compiles and warms its kernels: ~1 s CPU (bsr(16, 4) at
#: sigma = 4: 1.5 s first, 0.46 s again).
_MMCC_WARMUP = 1.0


def _mmcc_noise_factor(sigma: float) -> float:
    """How MMCC's time grows as the noise shrinks, relative to sigma = 1 (re-measured 2026-11-28,
    CPU time, after the adaptive discretization: the binary tree of 16 steps at q = 1/16 took 58 /
    22.4 / 10.5 / 4.7 s at sigma = 0.5 / 1 / 2 / 4, i.e. ``sigma^-1.2``; the 2026-11-23 fits at
    sigma = 10 and above are ``(4 / sigma)^2.7`` lower again up to sigma = 10, then ``(10 / sigma)^2``).
    Below sigma = 0.05 it is held (the rows' grids are then coarsened to a fixed number of points).
    The earlier model's ``(10 / sigma)^0.1`` below sigma = 10 was ~100x low at sigma = 1."""
    s = max(float(sigma), 0.05)
    if s <= 4.0:
        return s**-1.2
    if s <= 10.0:
        return 4.0**-1.2 * (4.0 / s) ** 2.7
    return 4.0**-1.2 * 0.4**2.7 * min((10.0 / s) ** 2, 1.0)


def _mmcc_part(strategy, scheme, sigma) -> tuple[float, float]:
    """MMCC rows + composition (refitted 2026-12-02 after the compiled row kernels: Horner's rule,
    Gauss-Legendre masses, vectorized compositions; ~3-30x faster than the 2026-11-28 fit).

    Time (CPU seconds, second call in a process; ``benchmarks/README.md``, "MMCC cost model"):

    * banded Toeplitz under Poisson: ``0.45 + 2.4 (w / 4)^0.9 (n / 64)^0.12 g(sigma)`` with
      ``g = sigma^-1.3`` from sigma = 1 to 2 (``sigma^-1`` below: since the one-direction composition
      of 2026-12-02 night, bsr(64 / 256, 4) at sigma 0.5 measure 3.9-5.3 CPU-s), then ``(2 / sigma)^2.5``
      lower (the loss grids narrow):
      bsr(64, 4) 3.5 / 1.5 / 0.84 s at sigma 1 / 2 / 4 (q = 0.05), bsr(500, 16) 21 / 7.1 / 0.80 s
      (q = 0.01), bsr(500, 4) 6.0 / 1.4 s at sigma 1 / 2, bsr(256, 8) 15 / 2.5 s at sigma 0.5 / 2,
      bsr(1000, 16) 7.9 s at sigma 2 -- all within 0.6-1.6x of the model;
    * the binary tree: ``0.45 + 10 (n / 16)^1.7 h(sigma) sqrt(q / 0.0625)`` with ``h = sigma^-1.3``
      up to sigma = 1, then ``sigma^-1.8``: n = 16 9.4 / 3.8 / 0.89 s at sigma 1 / 2 / 4, n = 64
      90 / 37 / 9.7 s at sigma 1 / 2 / 4, n = 256 101 s at sigma 4 (q = 1/16);
    * dense (square-root) Toeplitz, structured: ``0.3 + 7.8 (n / 64)^1.5 (4 / sigma)^2.3`` (above
      sigma = 2; ``sigma^-1.3`` below): n = 48 5.0 s at sigma 4, n = 128 22.5 / 4.4 s at sigma 4 / 8;
    * banded under cyclic Poisson (bands <= cycle): 0.02-0.6 s; dense strategies without a
      structured path keep the dense ``O(m n^2)`` setup (``n^2.4``, not re-measured).

    Above sigma = 10 every family falls a further ``(10 / sigma)^2`` (narrow grids).

    Where the widest row's grid would not fit in memory the accountant coarsens it
    (:func:`~dpmf.accounting.mmcc.grid.row_grid`) and the time falls like
    ``0.9 (1e-4 / step)^0.75`` (binary tree T = 64 / 256 at sigma 0.5: 0.79 / 0.63 CPU-s on grids
    0.41 / 6.55; T = 256 at sigma 1 / 2: 1.55 / 0.90 CPU-s on grids 1.64 / 0.41).

    Where the widest row's grid has at least ``2^18`` points (``mmcc.grid.worth_checking``), one phase
    and no memory coarsening, the accountant reports a checked coarse grid (2026-12-03): the time is
    ``min(F, a F^b)`` for ``F`` the requested grid's time above: ``1.12 F^0.26`` banded, ``0.31 F^0.56``
    binary trees (:data:`_MMCC_CHECKED_BANDED`, :data:`_MMCC_CHECKED_OTHER`; two runs of
    ``bench_mmcc_cost.py``'s grid and MMCC BandMF-16 x 500 at sigma 1 / 2, measured 3.2-3.4 / 3.0-3.3).

    Memory: the tail-bound structure (``~64`` bytes per stored pair: ``n (L + 1)`` for the tree,
    ``~ n x bandwidth`` for Toeplitz; the dense encoder and its Gram matrix on the dense path) plus
    the widest row's loss range ``2 (u^2 / 2 + 10 u)`` (``u = S / sigma``, ``S`` the largest row
    sum: ``n`` for the tree) at 160 bytes per grid point (a whole run's measured peak: BinaryTree(16)
    at sigma 0.5, 2.5 GiB for 1.66e7 points; on a coarse grid the rest of the run dominates: the
    coarsened trees above peaked at 0.2-0.5 GiB)."""
    from dpmf.sampling.schemes import CyclicPoissonSampling, PoissonSampling
    from dpmf.strategies.identity import Identity
    from dpmf.strategies.toeplitz import ToeplitzStrategy
    from dpmf.strategies.tree import BinaryTree

    rows, n = strategy_shape(strategy)
    width = _bandwidth(strategy)
    cycle = getattr(scheme, "cycle_length", 1) if isinstance(scheme, CyclicPoissonSampling) else 1
    structured = isinstance(scheme, PoissonSampling) and isinstance(strategy, (Identity, ToeplitzStrategy, BinaryTree))
    sig = max(1.0 if sigma is None else float(sigma), 0.05)

    def falling(knee: float, below: float, above: float) -> float:
        """``sig^-below`` up to ``knee``, then ``(knee / sig)^above`` lower; ``(10 / sig)^2`` past 10."""
        s = min(sig, 10.0)
        out = s**-below if s <= knee else knee**-below * (knee / s) ** above
        return out * (min(1.0, (10.0 / sig) ** 2))

    old_factor = _mmcc_noise_factor(sig) / _mmcc_noise_factor(10.0)  # (the 2026-11-23 fits, at sigma = 10)
    base = 0.0  # (a fixed part the grid coarsening below does not scale)
    if width <= 1 or (cycle > 1 and width <= cycle):
        secs = _MMCC_WARMUP + 0.02 * (n / 64) ** 0.3 * old_factor
    elif isinstance(strategy, BinaryTree):
        q = float(getattr(scheme, "sampling_prob", 0.0625) or 0.0625)
        base = _MMCC_STRUCTURED_BASE
        secs = 10.0 * (n / 16) ** 1.7 * falling(1.0, 1.3, 1.8) * min(max(math.sqrt(q / 0.0625), 0.1), 10.0)
    elif width < n and structured:  # banded Toeplitz under Poisson
        base = _MMCC_STRUCTURED_BASE
        secs = 2.4 * (width / 4) ** 0.9 * (n / 64) ** 0.12 * falling(2.0, 1.3, 2.5) * min(1.0, sig) ** 0.3
    elif width < n:  # banded without a structured path (not re-measured)
        k = 0.3 + 2.0 * math.log(max(width, 1)) / math.log(max(n, 2))
        secs = _MMCC_WARMUP + 0.05 * (width / 4) ** 1.5 * (n / 64) ** k * old_factor
    elif structured:  # dense Toeplitz (the square root), structured: 1 at sigma = 4
        secs = 0.3 + 7.8 * (n / 64) ** 1.5 * falling(2.0, 1.3, 2.3) / (2.0**-1.3 * 0.5**2.3)
    else:  # dense matrices (not re-measured)
        secs = _MMCC_WARMUP + 7.9 * (n / 64) ** 2.4 * old_factor
    # largest row sum S (total sensitivity of the widest row)
    if isinstance(strategy, BinaryTree):
        row_sum = n * float(getattr(strategy, "scale", 1.0))
    elif isinstance(strategy, ToeplitzStrategy):
        row_sum = float(sum(abs(float(c)) for c in strategy.coefs[:n]))
    elif isinstance(strategy, Identity):
        row_sum = 1.0
    else:
        C = getattr(strategy, "C", None)
        row_sum = float(abs(C).sum(axis=1).max()) if C is not None and getattr(C, "ndim", 0) == 2 and n <= 8192 else float(n)
    from dpmf.accounting.mmcc.grid import GRID_BYTES, row_grid, worth_checking

    # the checked coarse grid's fit holds for the families it was measured on (binary trees, banded
    # Toeplitz under Poisson); the dense square-root Toeplitz at q = 1 x 1000 steps ran 11+ min on CI
    # (2026-12-03) where the trees' fit then said 5.4 min: its time stays F there
    measured_checked = isinstance(strategy, BinaryTree) or (width < n and structured)

    try:
        step, points = row_grid(row_sum, max(sig, 1e-12))
    except DPMFError:  # a noise no grid holds (the accountant refuses it): the requested grid's points
        u = row_sum / max(sig, 1e-12)
        step, points = 1e-4, (u * u + 20.0 * u) / 1e-4
    if step > 1e-4:  # a coarser grid (memory): time falls like 0.9 (1e-4 / step)^0.75 (+ the fixed part),
        # measured on the binary tree after the one-spectrum composition (2026-12-02 evening, load ~5):
        # n = 64 / 256 at sigma 0.5 0.79 / 0.63 CPU-s (grids 0.41 / 6.55), n = 256 at sigma 1 / 2 1.55 / 0.90
        # (1.64 / 0.41); after the one-direction composition (2026-12-03, load ~2): 1.01 / 0.67, 1.67 / 0.98
        secs *= 0.9 * (1e-4 / step) ** 0.75
    elif cycle == 1 and measured_checked and worth_checking(row_sum, max(sig, 1e-12), 1e-4):
        # the checked coarse grid (mmcc.grid.checked_coarse_grid; 2026-12-03): two coarse passes, and the
        # requested grid only where no coarse one agrees (small epsilon); the independent-rows heuristic
        # may still need the fine grid. ``min(F, a F^b)`` for F the requested grid's time above (continuous
        # where the check starts: there ``a F^b >= F``), a and b fitted minimax on two runs of the
        # bench_mmcc_cost grid (load 3-5) plus BandMF-16 x 500 at sigma 1 / 2 (benchmarks/README.md)
        a, b = _MMCC_CHECKED_BANDED if width < n else _MMCC_CHECKED_OTHER
        secs = min(secs, a * secs**b)
    secs += base
    grid = GRID_BYTES * points + 2.5e8  # (+ the process: numpy, SciPy, dp_accounting, the kernels, ~0.2 GiB)
    if structured:
        pairs = n * (math.log2(max(n, 2)) + 1) if isinstance(strategy, BinaryTree) else n * min(width, n)
        memory = 64.0 * pairs + grid
    else:
        memory = 4 * 8.0 * rows * n + 8.0 * n * n + grid  # the dense encoder and its Gram matrix (and copies)
    return secs, memory


def _unamplified_part(strategy, scheme) -> tuple[float, float]:
    """Worst-case sensitivity. Measured: binary tree under Poisson 0.34 / 7.5 / 290 s at n = 1000 /
    4000 / 16000; tree with 4 fixed epochs 0.04 / 2.5 s at n = 1000 / 4000; Toeplitz and identity
    milliseconds."""
    from dpmf.sampling.schemes import BallsInBinsSampling, FixedOrderSampling
    from dpmf.strategies.dense import DenseStrategy
    from dpmf.strategies.identity import Identity
    from dpmf.strategies.toeplitz import ToeplitzStrategy
    from dpmf.strategies.tree import BinaryTree

    rows, n = strategy_shape(strategy)
    if isinstance(strategy, Identity):
        return 0.0, 0.0
    if isinstance(strategy, ToeplitzStrategy):
        return 1e-8 * n * n, 64.0 * n
    epochs = isinstance(scheme, FixedOrderSampling) or (
        isinstance(scheme, BallsInBinsSampling) and scheme.reused_single_slot  # (else Participation(k, 1))
    )
    if isinstance(strategy, BinaryTree):
        secs = 2.5 * (n / 4000) ** 3 if epochs else 7.5 * (n / 4000) ** 2.6
        return secs, 3 * 8.0 * rows * n
    if isinstance(strategy, DenseStrategy):
        return 1e-9 * n**3, 4 * 8.0 * rows * n
    return 1e-9 * n**3, 3 * 8.0 * rows * n


def _allocation_part(strategy, scheme) -> tuple[float, float]:
    """Random allocation: Rényi 0.02-1.9 s for n = 100..10^4 (identity, 10 epochs: 5.8 s at
    n = 10^4), plus conditional composition, which "combined" mode runs when its own estimate is
    within ``DEFAULT_CONDITIONAL_BUDGET`` (30 s): counted here as the worst case (dense ``C``) of
    :func:`~dpmf.accounting.allocation.conditional.conditional_cost`, capped at that budget
    (banded ``C`` at n = 1000: ~5 s measured, ``benchmarks/bench_conditional.py``); its memory is
    a few ``b x b`` arrays plus work blocks of ~100 MB at most."""
    from dpmf.accounting.allocation.accountant import DEFAULT_CONDITIONAL_BUDGET
    from dpmf.accounting.allocation.conditional import conditional_cost
    from dpmf.accounting.allocation.identity import identity_conditional_cost
    from dpmf.strategies.identity import Identity

    n = int(strategy.n)
    epochs = int(getattr(scheme, "epochs", 1))
    per_epoch = max(n // max(epochs, 1), 1)
    if isinstance(strategy, Identity) and getattr(scheme, "reused_single_slot", False):
        # C = I: one epoch of b = per_epoch steps (the epochs reduction), O(b) arrays, nothing b x b
        return 0.05 + identity_conditional_cost(per_epoch), 64 * 8.0 * per_epoch + 5e7
    conditional = min(DEFAULT_CONDITIONAL_BUDGET, conditional_cost(per_epoch, n))
    return 0.5 + 6e-4 * n * epochs / 10 + conditional, 6 * 8.0 * per_epoch * per_epoch + 1e8


#: ``allocation_pld`` for the identity (0.01-1.2 s for t = 8..10^4) and the part of every call outside
#: the Markov members (groups, fits: 0.3-0.8 s on bsr(32/100, 4)), s.
_ALLOCATION_PLD_BASE = 1.0
#: Seconds per slot of an epoch of the Markov members of ``allocation_pld`` for a correlated C, per
#: evaluation (CPU seconds on 2 shared cores; the history in benchmarks/README.md). Refit 2026-12-03 on
#: the 19 BandMF pairs of ``bench_allocation_calibration_grid.py`` (one evaluation each at its answer, in a
#: process whose kernels were loaded; 12-56 slots, 1-3 epochs, 2-4 bands) and three fresh-slot cases:
#: - ``"reused"``, one epoch: the plain chains only (bsr(32 / 56, 4): 0.16 / 0.27 CPU-s besides the band's
#:   moving average);
#: - ``"ring"``, reused slots over several epochs, by the band's order ``w = bands - 1``: the rings and the
#:   ranked ring family (w = 3: 0.058-0.078 per slot over 2 epochs, bsr(24..100, 4); w = 2: 0.06; w = 1:
#:   0.021), half that from three epochs on (:data:`_RING_MANY_EPOCHS`: 3 epochs of 11 / 12 slots 0.011 /
#:   0.043 per slot);
#: - ``"fresh"``: the members modulo 1 and 2 (8 tables each) and their fits: 0.054-0.055 per slot at 32-64
#:   slots (5 fresh epochs of 64 at sigma 2: 4.2 CPU-s in a fresh process).
#: Was reused 0.02, ring 0.045 (2026-12-02 evening): 1.7-2.9x high on the small bands and three epochs.
_MARKOV_SECONDS_PER_SLOT = {"reused": 0.006, "ring": {1: 0.02, 2: 0.06, 3: 0.065}, "fresh": 0.055}
#: ... the ring rate's share from three epochs on
_RING_MANY_EPOCHS = 0.5
#: The part of an evaluation with Markov members outside them (the identity pair's members, the report), s.
_MARKOV_BASE = 0.05
#: Once per call with Markov members: numba's first kernel load (its import and its target's registries,
#: ~0.4-0.6 CPU-s in a new process) and the members' fits (0.05-0.3 s), s.
_MARKOV_FIRST = 0.5
#: ... plus, for reused slots and a band of order ``w = bands - 1 <= 3``, the band's own moving
#: average (:mod:`~dpmf.accounting.allocation.surrogates.moving_average`, ``m^w`` states; measured with
#: the identity pair's members, 2026-12-03: w = 3 0.019-0.03 per slot at 10-56 slots, w = 2 0.008-0.01,
#: w = 1 0.004; was 0.02 / 0.03 / 0.005).
_BAND_SECONDS_PER_SLOT = {1: 0.004, 2: 0.01, 3: 0.025}
#: ... and with fresh slots (at most 32 slots per epoch, 8 tables per member; one evaluation in a process
#: whose kernels were loaded, 2026-12-03: 2 / 5 fresh epochs of 32 8.9 / 8.4 CPU-s, of which the other
#: members' ~1.8; counted as 6: a steered calibration's later noises mostly leave it out).
_BAND_FRESH_SECONDS = 6.0
#: ... and with 3 or 4 fresh epochs of at most 32 slots, the outer / middle split's three more members
#: (``fresh_correlated._SPLIT_EPOCHS``: 3 / 4 epochs of 32 19.8 / 20.7 CPU-s an evaluation).
_SPLIT_FRESH_SECONDS = 12.0
#: A calibration with the Markov members, in evaluations' worth of one at its answer (besides
#: :data:`_MARKOV_FIRST`): reused slots 4.7 -- five noises, the first steered by the moving average
#: alone, the way down by the members before the ring family, the bracket by its contenders, then the
#: report's rest (``pld.noise_and_report``; fit on the grid above: every estimate 0.65-1.55x the
#: measured CPU time, where one count of 5 and a Renyi search counted three times gave 0.75-2.9x);
#: fresh slots 5: the first noise whole, then steered by the last evaluation's contenders, one composed
#: member each (``Reductions.contenders``); the 8 fresh pairs of ``bench_allocation_calibration_grid.py
#: --fresh`` (24-100 slots, 2-5 epochs, 17-125 CPU-s): every estimate 0.52-1.78x the measured CPU time (9
#: whole evaluations' worth before the steering).
_MARKOV_CALIBRATION_EVALS = {"reused": 4.7, "fresh": 5.0}
#: ... where the Renyi accountant is only probed at allocation_pld's noise, and that probe ends on a lower
#: bound (``dispatch._probe_bound``): everything outside allocation_pld's search measured 0.04-0.19 CPU-s
#: (32-100 steps), s and s per step.
_RENYI_PROBE_SECONDS = (0.1, 1e-3)


def _markov_kind(strategy, scheme) -> str | None:
    """``"reused"`` (one epoch), ``"ring"`` (several reused epochs) or ``"fresh"``: the Markov members
    ``allocation_pld`` runs for ``strategy`` under ``scheme``; ``None`` when it runs none (C = I, not
    balls-in-bins, k of t, or more than
    :data:`~dpmf.accounting.allocation.surrogates.markov_chain.MAX_SLOTS` slots per epoch)."""
    from dpmf.sampling.schemes import BallsInBinsSampling
    from dpmf.strategies.identity import Identity

    if isinstance(strategy, Identity) or not isinstance(scheme, BallsInBinsSampling) or scheme.num_selected > 1:
        return None  # (before importing the allocation package: an MMCC or DP-SGD run does not load it)
    from dpmf.accounting.allocation.surrogates.markov_chain import MAX_SLOTS

    if scheme.steps // scheme.epochs > MAX_SLOTS:
        return None
    return "fresh" if scheme.fresh_slots else ("ring" if scheme.epochs > 1 else "reused")


def _markov_seconds(kind: str, b: int, w: int, epochs: int) -> float:
    """One evaluation of ``allocation_pld`` with Markov members of ``kind`` (:func:`_markov_kind`), ``b``
    slots per epoch, a band of order ``w``, ``epochs`` epochs: :data:`_MARKOV_BASE` plus the members' and
    the band's rates per slot."""
    rate = _MARKOV_SECONDS_PER_SLOT[kind]
    if kind == "ring":
        rate = rate.get(min(max(w, 1), 3), rate[3]) * (_RING_MANY_EPOCHS if epochs >= 3 else 1.0)
    if kind == "fresh":  # (offered with <= 32 slots per epoch: 8-16 tables, 3-7 s at 8-16 slots)
        band = (_BAND_FRESH_SECONDS if 1 <= w <= 3 and b <= 32 else 0.0) + (
            _SPLIT_FRESH_SECONDS if epochs in (3, 4) and b <= 32 else 0.0)
    else:
        band = _BAND_SECONDS_PER_SLOT.get(w, 0.0) * b
    return _MARKOV_BASE + rate * b + band


def _allocation_pld_part(strategy, scheme) -> tuple[float, float]:
    """Random allocation PLD, one evaluation: for the identity 0.01-1.2 s for t = 8..10^4
    (benchmarks/README.md); for a correlated C under one slot per epoch, the Markov members instead
    (:func:`_markov_seconds`; skipped above
    :data:`~dpmf.accounting.allocation.surrogates.markov_chain.MAX_SLOTS` slots per epoch; k of t has none);
    memory ``O(max_points)`` (a few 10^5 grid points, a few arrays of them)."""
    mem = 16 * 8.0 * 400_000
    kind = _markov_kind(strategy, scheme)
    if kind is None:
        return _ALLOCATION_PLD_BASE, mem
    b = scheme.steps // scheme.epochs
    w = _bandwidth(strategy) - 1
    if 1 <= w <= 3 and (kind != "fresh" or b <= 32):  # (the band's: three tables of m^w states x 400 partial sums)
        mem = max(mem, 3 * 8.0 * 400 * {1: 96, 2: 40**2, 3: 20**3}[w])
    return _markov_seconds(kind, b, w, scheme.epochs), mem


#: Monte Carlo CPU time per sample and direction: ``n (a + b w) + c`` ns (``n`` steps, ``w`` bands),
#: measured 2026-12-02 on the compiled b-min-sep path (fused outputs + ``C^T y`` + DP): n = 64..1024,
#: w = 4..64 at 5.9-11.9 ns per step (benchmarks/README.md, "Certified Monte Carlo").
_MC_NS_PER_STEP, _MC_NS_PER_STEP_BAND, _MC_NS_PER_SAMPLE = 5.5, 0.1, 200.0
#: The numpy reference path (schemes without a compiled kernel: Poisson, cyclic Poisson, truncated,
#: multi-attribution) is ~3x slower per step.
_MC_NUMPY_FACTOR = 3.0
#: Algorithm 5's samples per direction, in units of ``s`` (the samples of one verification): the
#: pilot's halvings (~5 x s/16) and 8 bisections (s/4 each), then ~5 verifications (the ladder's
#: 4 candidates at or above the pilot and the first below it).
_MC_CALIBRATION_UNITS = 5 / 16 + 8 / 4 + 5


def _montecarlo_part(strategy, scheme, num_samples, *, calibrate: bool = False, delta: float | None = None
                     ) -> tuple[float, float]:
    """Monte Carlo: ``2 directions x samples x (n (a + b w) + c)`` ns (the compiled path; the
    numpy one ``_MC_NUMPY_FACTOR`` times more). With ``calibrate`` (Algorithm 5) the samples of one
    verification are the fewest that certify ``delta`` (:func:`~dpmf.accounting.montecarlo.certify.
    minimum_samples`, unless given) and the work is :data:`_MC_CALIBRATION_UNITS` of them."""
    n = int(strategy.n)
    width = max(_bandwidth(strategy), 1)
    if num_samples is not None:
        s = int(num_samples)
    elif calibrate and delta is not None and 0 < delta < 1:
        from dpmf.accounting.montecarlo.certify import minimum_samples

        s = minimum_samples(delta)
    else:
        s = 100_000
    per_sample = (n * (_MC_NS_PER_STEP + _MC_NS_PER_STEP_BAND * width) + _MC_NS_PER_SAMPLE) * 1e-9
    if not _montecarlo_compiled(scheme):
        per_sample *= _MC_NUMPY_FACTOR
    units = _MC_CALIBRATION_UNITS if calibrate else 1.0
    secs = 0.2 + 2 * s * units * per_sample
    return secs, 8.0 * n * width * 4 + 8.0 * 10_000 * n


def _montecarlo_compiled(scheme) -> bool:
    """Whether the sampler runs the compiled kernels (b-min-sep untruncated, single attribution;
    balls-in-bins), decided from the scheme's fields as the sampler's plan does."""
    name = getattr(scheme, "name", "")
    if name == "balls-in-bins":
        return True
    return (name == "b-min-sep" and getattr(scheme, "max_batch_size", None) is None
            and getattr(scheme, "max_user_examples", None) is None)


def _methods(strategy, scheme, method: str) -> list[str]:
    """What ``dpmf.account(..., method)`` would run, decided from types only (as the dispatcher
    does, without building matrices): for ``"auto"`` every method that may be valid."""
    from dpmf.sampling.schemes import BallsInBinsSampling, CyclicPoissonSampling, PoissonSampling
    from dpmf.strategies.identity import Identity

    if method != "auto":
        return [method]
    out = ["unamplified"]
    if isinstance(scheme, PoissonSampling) and isinstance(strategy, Identity):
        out.append("pld")  # (auto skips MMCC here: pld is exact)
    elif isinstance(scheme, (PoissonSampling, CyclicPoissonSampling)):
        out.append("mmcc")
    if isinstance(scheme, BallsInBinsSampling) and isinstance(strategy, Identity):
        out.append("allocation_pld")
        if scheme.reused_single_slot:  # (fast paths for C = I at any size: allocation/identity.py)
            out.append("allocation")
    elif isinstance(scheme, BallsInBinsSampling) and not scheme.reused_single_slot:
        out.append("allocation_pld")  # (k of t / fresh slots with a correlated C: its reductions)
    elif isinstance(scheme, BallsInBinsSampling):
        out += ["allocation_pld", "allocation"]  # (the orthogonal-groups bound, then Renyi/conditional)
    return out


def accounting_cost(
    strategy,
    scheme,
    noise_multiplier: float | None = None,
    *,
    method: str = "auto",
    calibrate: bool = False,
    num_samples: int | None = None,
    target_epsilon: float | None = None,
    delta: float | None = None,
) -> CostEstimate:
    """Rough cost of ``dpmf.account(strategy, scheme, noise_multiplier, method=...)`` (or, with
    ``calibrate``, of ``dpmf.calibrate``: searches start at noise multiplier 1, the estimate is a
    few evaluations there; a DP-SGD PLD search is also counted where it ends, from
    ``target_epsilon`` and ``delta`` when given -- a huge target or a delta near 1 takes it down to
    the smallest noise it evaluates, where one evaluation takes up to a minute)."""
    total = CostEstimate(0.0, 0.0)
    evals = 3.0 if calibrate else 1.0
    markov = _markov_kind(strategy, scheme)  # (allocation_pld's Markov members: searched first, the Renyi probed once)
    sigma = 1.0
    if not calibrate and isinstance(noise_multiplier, (int, float)) and 0 < noise_multiplier < math.inf:
        sigma = float(noise_multiplier)  # (a bad value is the accountant's to refuse, by name)
    for m in _methods(strategy, scheme, method):
        if m == "pld":
            n, q = int(strategy.n), float(getattr(scheme, "sampling_prob", 1.0))
            secs, mem = _pld_part(n, q, sigma)
            end = _pld_search_noise(n, q, target_epsilon, delta) if calibrate else 1.0
            if end < 1.0:  # one evaluation at 1, the others near where the search ends
                secs_end, mem_end = _pld_part(n, q, end)
                secs, mem = (secs + (evals - 1) * secs_end) / evals, max(mem, mem_end)
        elif m == "mmcc":
            secs, mem = _mmcc_part(strategy, scheme, sigma)
        elif m == "unamplified":
            secs, mem = _unamplified_part(strategy, scheme)
            secs /= evals  # calibrated in closed form from one sensitivity
        elif m == "allocation":
            secs, mem = _allocation_part(strategy, scheme)
            if calibrate and markov is not None:  # (one probe at allocation_pld's noise, ending on a lower bound)
                secs = (_RENYI_PROBE_SECONDS[0] + _RENYI_PROBE_SECONDS[1] * strategy.n) / evals
        elif m == "allocation_pld":
            secs, mem = _allocation_pld_part(strategy, scheme)
            if markov is not None:  # (the first kernel load and the fits once; a calibration's evaluations' worth)
                runs = _MARKOV_CALIBRATION_EVALS["fresh" if markov == "fresh" else "reused"] if calibrate else 1.0
                secs = (_MARKOV_FIRST + runs * secs) / evals
        elif m == "montecarlo":  # (calibrate: Algorithm 5's pilot and verifications, whole)
            secs, mem = _montecarlo_part(strategy, scheme, num_samples, calibrate=calibrate, delta=delta)
            secs /= evals
        else:
            continue
        total = total + CostEstimate(evals * secs, mem, ((m, evals * secs, mem),))
    return total


def plan_cost(steps: int, *, epochs: int = 1, mmcc: bool = True, montecarlo_samples: int | None = None) -> CostEstimate:
    """``dpmf plan`` for a run of ``steps`` steps with a cold cache (a warm cache is instant: 0.4 s
    CPU for the README's plan).

    Measured (``benchmarks/bench_plan.py``, README example: 1000 steps, 10 epochs, every default on,
    2 shared cores): 29.7 s wall (41 s CPU) and 1.1 GiB peak, of which the MMCC check of the binary
    tree under Poisson sampling was 24 s (one MMCC evaluation at n = 1000), the banded MMCC checks
    3.7 s, and the closed forms, PLD, cyclic Poisson and allocation rows 2.6 s (3.5 s for the whole
    command with ``--no-mmcc``). Since MMCC's compiled rows (issue 50: ~10x) its rows are counted at a
    tenth of that: ``--thorough`` with and without ``--no-mmcc``, cold cache, 2026-12-03, 40.7 / 41.2
    CPU-s (README example) and 49.0 / 47.3 (the default plan) -- the MMCC rows within the runs' noise.
    The optimal factorization is usually pruned by its closed-form bound (0 s); when it is the best row
    it is built to a 1% duality gap (~0.3 of a full optimization).
    With at most :data:`~dpmf.accounting.allocation.surrogates.markov_chain.MAX_SLOTS` steps per epoch the banded-MF
    balls-in-bins rows run ``allocation_pld``'s Markov members, counted as one calibration of the
    fresh-slot row (its best row: bsr-4, fresh slots) and one check of the reused one (bands of order 3).
    ``--thorough`` with a cold cache, 2026-12-03, after the fresh-slot calibration's steering: the default
    plan (500 steps, 5 epochs of 100) 34.3 s wall, 47.1 CPU-s, estimated 37.5 s (123 s before this refit);
    the README example 27.4 s wall, 36.8 CPU-s, estimated 45.1 s (149 s before). The default plan took
    3 min 51 s on 2026-11-26, before the members' speed-ups."""
    steps = _size(steps)
    base = 2.0 + 2.0 * (steps / 1000) ** 1.5
    optimal = 0.3 * strategy_build_cost("optimal", steps, epochs=1).seconds if steps <= 1024 else 0.0
    mem = 0.3 * _GIB + 3 * 8.0 * (2 * min(steps, 4096)) * min(steps, 4096)  # (the tree's dense encoder)
    parts = [("closed forms, PLD, cyclic Poisson, allocation", base, mem)]
    if optimal >= 1:
        parts.append(("optimal factorization (unless pruned)", optimal, 12 * 8.0 * min(steps, 1024) ** 2))
    if mmcc and steps <= 2048:  # one check each, mostly: the tree and the banded sweep under Poisson
        m = 2.4 * (steps / 1000) ** 1.9 + 0.4 * (steps / 1000) ** 1.5
        parts.append(("MMCC rows", m, 0.35 * _GIB + 0.8 * _GIB * (steps / 1000) ** 2))
    if montecarlo_samples:
        parts.append(("Monte Carlo rows", 12 * (0.5 + 4e-9 * montecarlo_samples * steps * 64), 8.0 * 10_000 * steps))
    from dpmf.accounting.allocation.surrogates.markov_chain import MAX_SLOTS

    per_epoch = steps // max(int(epochs), 1)
    if per_epoch <= MAX_SLOTS:  # banded MF under balls-in-bins: the fresh-slot row calibrated, the reused one checked
        fresh = _markov_seconds("fresh", per_epoch, 3, epochs)
        reused = _markov_seconds("ring" if epochs > 1 else "reused", per_epoch, 3, epochs)
        secs = _MARKOV_FIRST + _MARKOV_CALIBRATION_EVALS["fresh"] * fresh + reused
        parts.append(("banded MF under balls-in-bins (Markov members)", secs, 16 * 8.0 * 400_000))
    out = CostEstimate(0.0, 0.0)
    for p in parts:
        out = out + CostEstimate(p[1], p[2], (p,))
    return out


def check_cost(
    estimate: CostEstimate,
    *,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    max_memory: float | None = None,
    force: bool = False,
    hint: str = "",
) -> None:
    """Raise :class:`~dpmf.errors.CostLimitError` (with the estimate) when ``estimate`` exceeds
    ``max_seconds`` or ``max_memory`` (default: the memory available now), unless ``force``."""
    if force:
        return
    limit_mem = available_memory() if max_memory is None else max_memory
    over = []
    if estimate.seconds > max_seconds:
        over.append(f"more than the {format_seconds(max_seconds)} limit")
    if estimate.memory_bytes > limit_mem:
        over.append(f"more memory than the {format_bytes(limit_mem)} available")
    if over:
        raise CostLimitError(
            f"refusing to start: this would take {estimate.describe()} -- a rough estimate, "
            f"{' and '.join(over)}; pass --force to run it anyway" + (f", or {hint}" if hint else "")
        )
