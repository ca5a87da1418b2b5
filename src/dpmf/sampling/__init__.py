"""Sampling schemes: batch generators that are also what the accountants read."""

from dpmf.sampling.schemes import (
    SCHEMES,
    Attribution,
    BallsInBinsSampling,
    CyclicPoissonSampling,
    FixedOrderSampling,
    MinSepSampling,
    MultiAttributionMinSepSampling,
    PoissonSampling,
    SamplingScheme,
    participation_rate,
    sampling_prob_for_rate,
)
from dpmf.sampling.serialization import scheme_from_dict

__all__ = [
    "PoissonSampling",
    "FixedOrderSampling",
    "CyclicPoissonSampling",
    "MinSepSampling",
    "BallsInBinsSampling",
    "MultiAttributionMinSepSampling",
    "Attribution",
    "SamplingScheme",
    "SCHEMES",
    "participation_rate",
    "sampling_prob_for_rate",
    "scheme_from_dict",
]
