"""Strategy and sampler specs from command-line options, shared by ``dpmf account|calibrate`` and
``dpmf montecarlo``. Parsing only: a missing option raises :class:`InvalidParameterError` naming it
(the commands print it as one line and exit 2)."""

from __future__ import annotations

from enum import Enum

from dpmf.errors import InvalidParameterError


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
        return BallsInBinsSampling(_need(epochs, "--epochs", sampling), steps)
    if sampling is SamplingName.min_sep:
        b = _need(min_sep, "--min-sep", sampling)
        kw = {"warm_start": warm_start, "max_batch_size": max_batch_size, "dataset_size": dataset_size}
        if participation_rate is not None:
            if sampling_prob is not None:
                raise InvalidParameterError("give exactly one of --sampling-prob (p) and --participation-rate (p0)")
            return MinSepSampling.from_participation_rate(participation_rate, steps, b, **kw)
        return MinSepSampling(_need(sampling_prob, "--sampling-prob", sampling), steps, b, **kw)
    q = _need(sampling_prob, "--sampling-prob", sampling)
    if sampling is SamplingName.cyclic_poisson:
        return CyclicPoissonSampling(q, steps, _need(min_sep, "--min-sep", sampling), partition=partition)
    return PoissonSampling(q, steps)


def build_strategy(strategy: str, steps: int, *, epochs: int | None = None, bands: int | None = None):
    """A strategy of a catalog kind, or one loaded from a ``dpmf strategy build`` file (``.npz``)."""
    from dpmf.strategies import catalog

    if strategy.endswith(".npz"):
        return catalog.load(strategy)
    return catalog.build(strategy, steps, epochs=epochs or 1, bands=bands)
