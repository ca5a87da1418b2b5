"""Sampling schemes: batch generators that are also what the accountants read."""

from typing import TYPE_CHECKING

from dpmf._lazy import attach_stub

__getattr__, __dir__, __all__ = attach_stub(__name__, __file__, globals())

if TYPE_CHECKING:  # pragma: no cover - the public names (imported on first use: dpmf._lazy.attach_stub)
    from dpmf.sampling.schemes import (
        SCHEMES, Attribution, BallsInBinsSampling, CyclicPoissonSampling, FixedOrderSampling, MinSepSampling,
        MultiAttributionMinSepSampling, PoissonSampling, SamplingScheme, participation_rate,
        sampling_prob_for_rate,
    )
    from dpmf.sampling.serialization import scheme_from_dict
    from dpmf.sampling.padding import padded_batch
    from dpmf.sampling.allocation_shapes import (
        BatchOverflowError, fixed_shape_batches, overflow_probability, padded_batch_size,
    )
    from dpmf.sampling.bounding import (
        BoundedAttribution, BoundingReport, attribution_from_edges, bound_contributions,
        edge_bound_rule_of_thumb, neighbourhood_sizes,
    )
    from dpmf.sampling.batch_size import SamplingProbCalibration, calibrate_sampling_prob
