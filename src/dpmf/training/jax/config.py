"""A jax_privacy configuration read into dpmf: its strategy, batch selection and noise multiplier as
dpmf objects, accounted and calibrated by dpmf, and compared with jax_privacy's own accounting.

jax_privacy describes a run with objects (``matrix_factorization.buffered_toeplitz.BufferedToeplitz``,
``banded.ColumnNormalizedBanded``, a Toeplitz coefficient vector or a dense matrix for ``C``; a
``batch_selection`` strategy; ``accounting.DpParams`` for the noise multiplier, delta and dataset
size). :func:`strategy_from_jax_privacy` and :func:`scheme_from_jax_privacy` convert them where a
dpmf object is the *same mechanism* (and refuse, naming why, where none is):

========================================================  ==============================================
jax_privacy                                               dpmf
========================================================  ==============================================
``None`` / ``"identity"`` (``gaussian_privatizer``)       ``Identity(n)`` (DP-SGD)
``BufferedToeplitz(buf_decay, output_scale)``             ``BLTStrategy`` (the same ``c_t``)
``ColumnNormalizedBanded(params)``                        ``DenseStrategy`` of its ``materialize()``
1-d Toeplitz coefficients / a dense lower-triangular C    ``ToeplitzStrategy`` / ``DenseStrategy``
``CyclicPoissonSampling(q, T, cycle_length=1)``           ``PoissonSampling(q, T)`` (truncation kept)
``CyclicPoissonSampling(q, T, cycle_length=b)``           ``CyclicPoissonSampling(q, T, b)`` (its partition)
``BallsInBinsSampling(T, cycle_length=b)``, ``b | T``     ``BallsInBinsSampling(epochs=T / b, steps=T)``
``BMinSepSampling(p, T, b, warm_start, truncated)``       ``MinSepSampling(p, T, b, warm_start, ...)``
========================================================  ==============================================

Not converted: ``FixedBatchSampling`` (fixed-size batches drawn independently every step: no dpmf
scheme; jax_privacy accounts it under replace-one adjacency with doubled sensitivity) and
``UserSelectionStrategy`` (user-level; dpmf's user-level training is the multi-attribution scheme),
truncated *cyclic* Poisson (the group sizes of the two partitions differ, which the truncation
analysis reads).

``make_private(strategy=...)`` and ``correlated_privatizer`` take jax_privacy's strategy objects
(``BufferedToeplitz``, ``ColumnNormalizedBanded``) as they are: :func:`as_dpmf_strategy` converts them
with :func:`strategy_from_jax_privacy` over the run's steps.

The noise multiplier is that of ``C`` *as given* (DESIGN.md): jax_privacy's privatizer adds
``stddev * C^{-1} z`` with ``stddev = noise_multiplier * clip``, so ``C x + noise_multiplier z`` is the
mechanism, whatever the normalization of ``C``. :func:`jax_privacy_noise_multiplier` is jax_privacy's
own calibration (``DpsgdTrainingAccountant``, PLD) where it has one: DP-SGD under (cyclic) Poisson
sampling, and BandMF with ``bands <= cycle_length`` under cyclic Poisson (the reduction of
Choquette-Choo et al. 2023, which treats each participation as one Gaussian of sensitivity the largest
column norm of ``C``); ``None`` elsewhere (b-min-sep, balls-in-bins, BLT, dense ``C``: jax_privacy's
accounting does not cover them).

>>> import numpy as np
>>> from jax_privacy import batch_selection
>>> scheme = scheme_from_jax_privacy(batch_selection.CyclicPoissonSampling(sampling_prob=0.1, iterations=8,
...                                                                        cycle_length=2))
>>> scheme.describe()["name"], scheme.cycle_length, scheme.partition
('cyclic-poisson', 2, 'equal')
"""

from __future__ import annotations

import math

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.training.jax._deps import require_jax

jax, optax, jax_privacy = require_jax()
from jax_privacy import batch_selection as _bs  # noqa: E402
from jax_privacy.matrix_factorization import banded as _jp_banded  # noqa: E402
from jax_privacy.matrix_factorization import buffered_toeplitz as _jp_blt  # noqa: E402

__all__ = [
    "strategy_from_jax_privacy",
    "as_dpmf_strategy",
    "JAX_PRIVACY_STRATEGIES",
    "scheme_from_jax_privacy",
    "account_jax_privacy",
    "calibrate_jax_privacy",
    "jax_privacy_noise_multiplier",
    "jax_privacy_epsilon",
    "compare_with_jax_privacy",
]


def _steps_of(batch_selection) -> int:
    steps = getattr(batch_selection, "iterations", None)
    if steps is None:
        raise InvalidParameterError(f"batch_selection must be a jax_privacy batch selection strategy, got "
                                    f"{type(batch_selection).__name__}")
    return _v.positive_int("batch_selection.iterations", steps)


def strategy_from_jax_privacy(strategy, n: int):
    """The dpmf strategy of a jax_privacy strategy object over ``n`` steps (module table)."""
    from dpmf.strategies.blt import BLT, BLTStrategy
    from dpmf.strategies.dense import DenseStrategy
    from dpmf.strategies.identity import Identity
    from dpmf.strategies.toeplitz import ToeplitzStrategy

    n = _v.positive_int("n", n)
    if strategy is None or (isinstance(strategy, str) and strategy == "identity"):
        return Identity(n)
    if isinstance(strategy, _jp_blt.BufferedToeplitz):
        theta = np.asarray(strategy.buf_decay, dtype=np.float64).reshape(-1)
        omega = np.asarray(strategy.output_scale, dtype=np.float64).reshape(-1)
        try:
            blt = BLT(theta, omega)
        except InvalidParameterError:  # a BLT outside (0, 1) x [0, inf): kept, the accountants check C >= 0
            blt = BLT(theta, omega, nonnegative=False)
        return BLTStrategy.from_blt(blt, n)
    if isinstance(strategy, _jp_banded.ColumnNormalizedBanded):
        if strategy.n != n:
            raise InvalidParameterError(f"the ColumnNormalizedBanded strategy has n={strategy.n} steps, the run {n}")
        return DenseStrategy(np.asarray(strategy.materialize(), dtype=np.float64), name="banded")
    if isinstance(strategy, (np.ndarray, jax.Array)):
        arr = np.asarray(strategy, dtype=np.float64)
        if arr.ndim == 1:
            return ToeplitzStrategy(arr, n)
        if arr.ndim == 2:
            if arr.shape[1] != n:
                raise InvalidParameterError(f"the matrix C has {arr.shape[1]} columns (steps), the run {n}")
            return DenseStrategy(arr)
    raise UnsupportedConfigurationError(
        f"no dpmf strategy for a {type(strategy).__name__}: pass None or 'identity' (DP-SGD), a BufferedToeplitz, a "
        "ColumnNormalizedBanded, Toeplitz coefficients (1-d) or the dense encoder C (2-d)"
    )


#: jax_privacy's strategy classes, accepted wherever a dpmf strategy is (``make_private``,
#: ``correlated_privatizer``) and converted by :func:`strategy_from_jax_privacy`
JAX_PRIVACY_STRATEGIES = (_jp_blt.BufferedToeplitz, _jp_banded.ColumnNormalizedBanded)


def as_dpmf_strategy(strategy, steps: int | None):
    """``strategy`` itself, or the dpmf strategy of a jax_privacy strategy object
    (:data:`JAX_PRIVACY_STRATEGIES`) over ``steps`` (a ``ColumnNormalizedBanded`` knows its own
    ``n``; a ``BufferedToeplitz`` needs ``steps``). The conversion is :func:`strategy_from_jax_privacy`,
    so the noise is the converted strategy's, bit for bit."""
    if not isinstance(strategy, JAX_PRIVACY_STRATEGIES):
        return strategy
    if steps is None:
        steps = getattr(strategy, "n", None)
        if steps is None:
            raise InvalidParameterError(
                f"a jax_privacy {type(strategy).__name__} has no number of steps: pass steps=<n> (the run's length), "
                "or convert it with dpmf.training.jax.strategy_from_jax_privacy(strategy, n)"
            )
    return strategy_from_jax_privacy(strategy, steps)


def scheme_from_jax_privacy(batch_selection, num_examples: int | None = None):
    """The dpmf sampling scheme of a jax_privacy ``batch_selection`` strategy (module table).
    ``num_examples`` (the dataset size) is needed for truncated schemes, whose accounting reads it."""
    from dpmf.sampling import schemes as S

    steps = _steps_of(batch_selection)

    def truncation(trunc):
        if trunc is None:
            return {}
        if num_examples is None:
            raise InvalidParameterError("num_examples is needed for a truncated batch selection (its accounting reads "
                                        "the dataset size)")
        return {"max_batch_size": int(trunc), "dataset_size": _v.positive_int("num_examples", num_examples)}

    if isinstance(batch_selection, _bs.CyclicPoissonSampling):
        b = int(batch_selection.cycle_length)
        if b == 1:
            return S.PoissonSampling(float(batch_selection.sampling_prob), steps,
                                     **truncation(batch_selection.truncated_batch_size))
        if batch_selection.truncated_batch_size is not None:
            raise UnsupportedConfigurationError(
                "truncated cyclic Poisson (cycle_length > 1 with truncated_batch_size) is not converted: jax_privacy "
                "discards num_examples % cycle_length examples and dpmf does not, and the truncation analysis reads "
                "the group size; use cycle_length=1 or no truncation"
            )
        partition = "independent" if batch_selection.partition_type == _bs.PartitionType.INDEPENDENT else "equal"
        return S.CyclicPoissonSampling(float(batch_selection.sampling_prob), steps, b, partition=partition)
    if isinstance(batch_selection, _bs.BallsInBinsSampling):
        b = int(batch_selection.cycle_length)
        if steps % b:
            raise UnsupportedConfigurationError(
                f"balls-in-bins with iterations={steps} not a multiple of cycle_length={b}: dpmf's scheme runs whole "
                f"epochs; use iterations={steps - steps % b or b} or {steps + b - steps % b}"
            )
        return S.BallsInBinsSampling(epochs=steps // b, steps=steps)
    if isinstance(batch_selection, _bs.BMinSepSampling):
        return S.MinSepSampling(float(batch_selection.sampling_prob), steps, int(batch_selection.min_sep),
                                warm_start=bool(batch_selection.warm_start),
                                **truncation(batch_selection.truncated_batch_size))
    if isinstance(batch_selection, _bs.FixedBatchSampling):
        raise UnsupportedConfigurationError(
            "FixedBatchSampling (a fixed-size batch drawn independently every step) has no dpmf scheme: jax_privacy "
            "accounts it under replace-one adjacency with doubled sensitivity; use CyclicPoissonSampling (Poisson) "
            "or BallsInBinsSampling"
        )
    raise UnsupportedConfigurationError(
        f"no dpmf scheme for a {type(batch_selection).__name__}: supported are CyclicPoissonSampling, "
        "BallsInBinsSampling and BMinSepSampling"
    )


def _noise_and_delta(noise_multiplier, delta, num_examples):
    """``(sigma, delta, num_examples)`` from floats or from a jax_privacy ``DpParams``."""
    from jax_privacy.accounting.analysis import DpParams

    if isinstance(noise_multiplier, DpParams):
        p = noise_multiplier
        nm = p.noise_multipliers
        if not isinstance(nm, (int, float, np.floating)):
            raise UnsupportedConfigurationError(f"DpParams with a noise schedule ({nm!r}) is not supported: dpmf accounts "
                                                "one noise multiplier per run")
        return float(nm), (p.delta if delta is None else delta), (p.num_samples if num_examples is None else num_examples)
    return noise_multiplier, delta, num_examples


def account_jax_privacy(strategy, batch_selection, noise_multiplier, delta: float | None = None, *,
                        num_examples: int | None = None, method: str = "auto", **options):
    """dpmf's report (``dpmf.account``) for a jax_privacy configuration: its strategy object, its
    batch selection and its noise multiplier (a float, or a ``DpParams`` whose ``noise_multipliers``,
    ``delta`` and ``num_samples`` are read)."""
    from dpmf.accounting import account

    sigma, delta, m = _noise_and_delta(noise_multiplier, delta, num_examples)
    if delta is None:
        raise InvalidParameterError("delta is needed (or pass a DpParams, whose delta is read)")
    steps = _steps_of(batch_selection)
    return account(strategy_from_jax_privacy(strategy, steps), scheme_from_jax_privacy(batch_selection, m), sigma,
                   delta, method, **options)


def calibrate_jax_privacy(strategy, batch_selection, target_epsilon: float, delta: float, *,
                          num_examples: int | None = None, method: str = "auto", **options):
    """dpmf's calibration (``dpmf.calibrate``: the smallest certified noise multiplier) for a jax_privacy
    strategy object and batch selection; a :class:`~dpmf.accounting.dispatch.Calibration`."""
    from dpmf.accounting import calibrate

    steps = _steps_of(batch_selection)
    return calibrate(strategy_from_jax_privacy(strategy, steps), scheme_from_jax_privacy(batch_selection, num_examples),
                     target_epsilon, delta, method, **options)


def _max_column_norm_and_bands(dpmf_strategy) -> tuple[float, int] | None:
    from dpmf.strategies.dense import DenseStrategy
    from dpmf.strategies.identity import Identity
    from dpmf.strategies.toeplitz import ToeplitzStrategy
    from dpmf.strategies.streaming import bandwidth

    if isinstance(dpmf_strategy, Identity):
        return 1.0, 1
    if isinstance(dpmf_strategy, (DenseStrategy, ToeplitzStrategy)) and getattr(dpmf_strategy, "adaptive", True):
        C = dpmf_strategy.encoder()
        if np.any(C < 0):
            return None
        return float(np.max(np.linalg.norm(C, axis=0))), bandwidth(C)
    return None


def _jax_privacy_setup(strategy, batch_selection, num_examples):
    """``(accountant, batch size, cycle length or None, largest column norm, steps)`` of jax_privacy's
    own accounting for the configuration, or ``None`` where it has none."""
    from jax_privacy.accounting import accountants, analysis

    if not isinstance(batch_selection, _bs.CyclicPoissonSampling):
        return None
    steps = _steps_of(batch_selection)
    shape = _max_column_norm_and_bands(strategy_from_jax_privacy(strategy, steps))
    b = int(batch_selection.cycle_length)
    if shape is None or shape[1] > b:
        return None
    m = _v.positive_int("num_examples", num_examples)
    batch = float(batch_selection.sampling_prob) * (m // b)
    if abs(batch - round(batch)) > 1e-9 * max(1.0, batch) or round(batch) < 1:
        raise InvalidParameterError(
            f"jax_privacy's accounting takes an integer batch size, and sampling_prob * (num_examples // cycle_length) "
            f"= {batch!r} is not one: choose num_examples or sampling_prob so that it is (its q is batch / group size)"
        )
    acc = analysis.DpsgdTrainingAccountant(dp_accountant_config=accountants.PldAccountantConfig())
    return acc, int(round(batch)), (None if b == 1 else b), shape[0], steps


def jax_privacy_epsilon(strategy, batch_selection, noise_multiplier: float, delta: float, *,
                        num_examples: int) -> float | None:
    """jax_privacy's own epsilon (``DpsgdTrainingAccountant``, PLD) for ``C`` *as given* at
    ``noise_multiplier``, or ``None`` where its accounting does not cover the configuration
    (:func:`jax_privacy_noise_multiplier` says how the two are matched)."""
    from jax_privacy.accounting import analysis

    setup = _jax_privacy_setup(strategy, batch_selection, num_examples)
    if setup is None:
        return None
    acc, batch, cycle, norm, steps = setup
    params = analysis.DpParams(noise_multipliers=float(noise_multiplier) / norm, num_samples=int(num_examples),
                               delta=float(delta), batch_size=batch, cycle_length=cycle,
                               truncated_batch_size=batch_selection.truncated_batch_size)
    return float(acc.compute_epsilon(steps, params))


def jax_privacy_noise_multiplier(strategy, batch_selection, target_epsilon: float, delta: float, *,
                                 num_examples: int, tol: float = 1e-5) -> float | None:
    """jax_privacy's own calibrated noise multiplier for ``C`` *as given* (module docstring), or
    ``None`` where its accounting does not cover the configuration.

    ``accounting.calibrate.calibrate_noise_multiplier`` with a ``DpsgdTrainingAccountant`` (PLD) at
    batch size ``q * (num_examples // cycle_length)`` (so its ``q`` is the scheme's), times the
    largest column norm of ``C`` (jax_privacy's noise multiplier is for the column-normalized
    matrix; 1 for its ``ColumnNormalizedBanded`` and for DP-SGD)."""
    from jax_privacy.accounting import calibrate as jp_calibrate

    setup = _jax_privacy_setup(strategy, batch_selection, num_examples)
    if setup is None:
        return None
    acc, batch, cycle, norm, steps = setup
    nm = jp_calibrate.calibrate_noise_multiplier(
        target_epsilon=float(target_epsilon), accountant=acc, batch_sizes=batch, num_updates=steps,
        num_samples=int(num_examples), target_delta=float(delta), cycle_length=cycle,
        truncated_batch_size=batch_selection.truncated_batch_size, tol=tol)
    return float(nm) * norm


def compare_with_jax_privacy(strategy, batch_selection, target_epsilon: float, delta: float, *, num_examples: int,
                             method: str = "auto", **options) -> dict:
    """dpmf's calibrated sigma beside jax_privacy's for the same configuration:
    ``{"dpmf": sigma, "jax_privacy": sigma or None, "ratio": dpmf / jax_privacy, "report": dpmf's report}``
    (a ratio below 1: dpmf certifies the target with less noise)."""
    cal = calibrate_jax_privacy(strategy, batch_selection, target_epsilon, delta, num_examples=num_examples,
                                method=method, **options)
    theirs = jax_privacy_noise_multiplier(strategy, batch_selection, target_epsilon, delta, num_examples=num_examples)
    ratio = cal.noise_multiplier / theirs if theirs else math.nan
    return {"dpmf": cal.noise_multiplier, "jax_privacy": theirs, "ratio": ratio, "report": cal.report}
