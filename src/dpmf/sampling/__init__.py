"""Sampling schemes: batch generators that are also what the accountants read."""

from dpmf.sampling.schemes import FixedOrderSampling, PoissonSampling, SamplingScheme

__all__ = ["PoissonSampling", "FixedOrderSampling", "SamplingScheme"]
