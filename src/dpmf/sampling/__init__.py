"""Sampling schemes: batch generators that are also what the accountants read."""

from typing import TYPE_CHECKING

from dpmf._lazy import attach

#: public name -> the submodule that defines it (imported on first use, :mod:`dpmf._lazy`)
_EXPORTS = {
    "SCHEMES": ".schemes",
    "Attribution": ".schemes",
    "BallsInBinsSampling": ".schemes",
    "CyclicPoissonSampling": ".schemes",
    "FixedOrderSampling": ".schemes",
    "MinSepSampling": ".schemes",
    "MultiAttributionMinSepSampling": ".schemes",
    "PoissonSampling": ".schemes",
    "SamplingScheme": ".schemes",
    "participation_rate": ".schemes",
    "sampling_prob_for_rate": ".schemes",
    "scheme_from_dict": ".serialization",
}

__getattr__, __dir__ = attach(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
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
