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
    "padded_batch": ".padding",
    "BatchOverflowError": ".allocation_shapes",
    "fixed_shape_batches": ".allocation_shapes",
    "overflow_probability": ".allocation_shapes",
    "padded_batch_size": ".allocation_shapes",
    "BoundedAttribution": ".bounding",
    "BoundingReport": ".bounding",
    "attribution_from_edges": ".bounding",
    "bound_contributions": ".bounding",
    "edge_bound_rule_of_thumb": ".bounding",
    "neighbourhood_sizes": ".bounding",
    "SamplingProbCalibration": ".batch_size",
    "calibrate_sampling_prob": ".batch_size",
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
    from dpmf.sampling.padding import padded_batch
    from dpmf.sampling.allocation_shapes import (
        BatchOverflowError,
        fixed_shape_batches,
        overflow_probability,
        padded_batch_size,
    )
    from dpmf.sampling.bounding import (
        BoundedAttribution,
        BoundingReport,
        attribution_from_edges,
        bound_contributions,
        edge_bound_rule_of_thumb,
        neighbourhood_sizes,
    )
    from dpmf.sampling.batch_size import SamplingProbCalibration, calibrate_sampling_prob

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
    "padded_batch",
    "fixed_shape_batches",
    "padded_batch_size",
    "overflow_probability",
    "BatchOverflowError",
    "bound_contributions",
    "BoundedAttribution",
    "BoundingReport",
    "attribution_from_edges",
    "edge_bound_rule_of_thumb",
    "neighbourhood_sizes",
    "calibrate_sampling_prob",
    "SamplingProbCalibration",
]
