"""Strategy and sampler specs from command-line options, shared by ``dpmf account|calibrate`` and
``dpmf montecarlo``. Parsing only: a missing option raises :class:`InvalidParameterError` naming it
(the commands print it as one line and exit 2)."""

from __future__ import annotations

from enum import Enum

import typer

from dpmf.errors import InvalidParameterError

#: ``--warm-start/--cold-start``, shared by every command that builds a b-min-sep sampler, with the
#: library's default (``MinSepSampling(warm_start=False)``): the same configuration gives the same
#: answer whichever command accounts for it.
WARM_START = typer.Option(
    False,
    "--warm-start/--cold-start",
    help="b-min-sep: cold start (default, Alg. 1: every example available at step 0, as in training) or warm "
    "start (Alg. 2: every example from its stationary state); the same default in every command.",
)


#: ``--num-selected`` / ``--fresh-slots``: the balls-in-bins variants (issue 23), shared by every command
#: that builds a balls-in-bins sampler, with the library's defaults (one slot, reused every epoch).
NUM_SELECTED = typer.Option(
    None,
    "--num-selected",
    help="balls-in-bins: k, the number of distinct random steps each example joins per epoch (default 1; "
    "at most steps per epoch). k slots per epoch give k times the batch size at the same number of steps.",
)
FRESH_SLOTS = typer.Option(
    False,
    "--fresh-slots/--reused-slots",
    help="balls-in-bins: draw a new random allocation every epoch (--fresh-slots: the epochs compose; for "
    "DP-SGD privacy is close to Poisson sampling's, and for banded MF such as bsr with tens of steps per epoch "
    "it is the tighter choice from two epochs on) or reuse the first epoch's slots every epoch (default: participations exactly one "
    "epoch apart; for DP-SGD k epochs cost like one epoch at sigma / sqrt(k)).",
)


class SamplingName(str, Enum):
    poisson = "poisson"
    fixed_order = "fixed-order"
    cyclic_poisson = "cyclic-poisson"
    min_sep = "b-min-sep"
    balls_in_bins = "balls-in-bins"


def _need(value, flag: str, sampling: SamplingName):
    if value is None:
        raise InvalidParameterError(f"{flag} is required with --sampling {sampling.value}")
    return value


def build_scheme(
    sampling: SamplingName,
    steps: int,
    *,
    sampling_prob: float | None = None,
    epochs: int | None = None,
    min_sep: int | None = None,
    warm_start: bool = False,
    max_batch_size: int | None = None,
    dataset_size: int | None = None,
    participation_rate: float | None = None,
    partition: str = "equal",
    num_selected: int | None = None,
    fresh_slots: bool = False,
):
    """The :mod:`dpmf.sampling` scheme the options describe. For b-min-sep give ``sampling_prob``
    (p) or ``participation_rate`` (p0), not both."""
    from dpmf.sampling import (
        BallsInBinsSampling,
        CyclicPoissonSampling,
        FixedOrderSampling,
        MinSepSampling,
        PoissonSampling,
    )

    if sampling is SamplingName.fixed_order:
        return FixedOrderSampling(_need(epochs, "--epochs", sampling), steps)
    if sampling is SamplingName.balls_in_bins:
        return BallsInBinsSampling(
            _need(epochs, "--epochs", sampling), steps, num_selected=1 if num_selected is None else num_selected,
            fresh_slots=fresh_slots,
        )
    if min_sep is not None and sampling in (SamplingName.min_sep, SamplingName.cyclic_poisson) and min_sep > steps > 0:
        raise InvalidParameterError(  # the library warns; on the command line it is a mix-up
            f"--min-sep {min_sep} is longer than the run (--steps {steps}): every example would join at most once; "
            "did you swap them?"
        )
    if sampling is SamplingName.min_sep:
        b = _need(min_sep, "--min-sep", sampling)
        kw = {"warm_start": warm_start, "max_batch_size": max_batch_size, "dataset_size": dataset_size}
        if participation_rate is not None:
            if sampling_prob is not None:
                raise InvalidParameterError("give exactly one of --sampling-prob (p) and --participation-rate (p0)")
            return MinSepSampling.from_participation_rate(participation_rate, steps, b, **kw)
        return MinSepSampling(_need(sampling_prob, "--sampling-prob", sampling), steps, b, **kw)
    q = _need(sampling_prob, "--sampling-prob", sampling)
    trunc = {"max_batch_size": max_batch_size, "dataset_size": dataset_size}  # truncated (padded) batches
    if max_batch_size is not None and dataset_size is None:  # else only the unamplified bound would apply, silently
        raise InvalidParameterError(
            f"--max-batch-size with --sampling {sampling.value} needs --dataset-size (the number of examples: "
            "the truncation analysis depends on it)")
    if sampling is SamplingName.cyclic_poisson:
        return CyclicPoissonSampling(q, steps, _need(min_sep, "--min-sep", sampling), partition=partition, **trunc)
    return PoissonSampling(q, steps, **trunc)


def is_strategy_file(strategy: str) -> bool:
    """``--strategy`` names a file written by ``dpmf strategy build`` (not a catalog kind)."""
    return strategy.endswith(".npz")


def build_strategy(strategy: str, steps: int | None, *, epochs: int | None = None, bands: int | None = None):
    """A strategy of a catalog kind, or one loaded from a ``dpmf strategy build`` file (``.npz``,
    read by :mod:`dpmf.files`: a malformed file is one error naming it)."""
    from dpmf.strategies import catalog

    if is_strategy_file(strategy):
        strat = catalog.load(strategy)
        if steps is not None and strat.n != steps:
            raise InvalidParameterError(f"--steps {steps} does not match the {strat.n} steps of the strategy in {strategy}")
        return strat
    if steps is None:
        raise InvalidParameterError("--steps is required")
    return catalog.build(strategy, steps, epochs=epochs or 1, bands=bands)


#: Catalog strategies that read ``--epochs`` / ``--bands`` (see :func:`dpmf.strategies.catalog.build`).
EPOCH_STRATEGIES = ("optimal", "blt", "banded-toeplitz", "band-inv")
BAND_STRATEGIES = ("banded-toeplitz", "banded", "bsr", "bisr", "band-inv")


_TRUNCATABLE = (SamplingName.poisson, SamplingName.cyclic_poisson, SamplingName.min_sep)


def check_options_used(strategy: str, sampling: SamplingName, **given) -> None:
    """Refuse an option the configuration would silently ignore (e.g. ``--epochs`` with Poisson
    sampling and a strategy that has no epochs): the user meant something else. ``given`` maps
    CLI option names (``"--epochs"``) to their values; ``None`` / ``False`` count as not given."""
    given = {k: v for k, v in given.items() if v is not None and v is not False}
    kind = "a strategy file" if is_strategy_file(strategy) else f"--strategy {strategy}"
    uses = {
        "--epochs": sampling in (SamplingName.fixed_order, SamplingName.balls_in_bins)
        or (not is_strategy_file(strategy) and strategy in EPOCH_STRATEGIES),
        "--bands": not is_strategy_file(strategy) and strategy in BAND_STRATEGIES,
        "--sampling-prob": sampling not in (SamplingName.fixed_order, SamplingName.balls_in_bins),
        "--participation-rate": sampling is SamplingName.min_sep,
        "--min-sep": sampling in (SamplingName.cyclic_poisson, SamplingName.min_sep),
        "--warm-start": sampling is SamplingName.min_sep,
        "--max-batch-size": sampling in _TRUNCATABLE,
        "--dataset-size": sampling in _TRUNCATABLE,
        "--num-selected": sampling is SamplingName.balls_in_bins,
        "--fresh-slots": sampling is SamplingName.balls_in_bins,
    }
    where = {
        "--epochs": "fixed-order and balls-in-bins sampling and the " + ", ".join(EPOCH_STRATEGIES) + " strategies",
        "--bands": "the " + ", ".join(BAND_STRATEGIES) + " strategies",
        "--sampling-prob": "poisson, cyclic-poisson and b-min-sep sampling",
        "--participation-rate": "b-min-sep sampling",
        "--min-sep": "cyclic-poisson and b-min-sep sampling",
        "--warm-start": "b-min-sep sampling",
        "--max-batch-size": "poisson, cyclic-poisson and b-min-sep sampling",
        "--dataset-size": "poisson, cyclic-poisson and b-min-sep sampling (with --max-batch-size)",
        "--num-selected": "balls-in-bins sampling",
        "--fresh-slots": "balls-in-bins sampling",
    }
    for flag, value in given.items():
        if flag in uses and not uses[flag]:
            hint = " (the run length is --steps)" if flag == "--epochs" else ""
            raise InvalidParameterError(
                f"{flag} is not used with --sampling {sampling.value} and {kind}: it applies to {where[flag]}{hint}"
            )
