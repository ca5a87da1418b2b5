"""Closed-form privacy-loss sampler for DP-SGD (C = I, Poisson sampling): the test oracle sampler.

P (with the example): per step x ~ Bern(q), y = x + sigma z; Q = N(0, sigma^2) per step.
ln P/Q(y) = sum_t ln(1 - q + q exp((2 y_t - 1) / (2 sigma^2))). Exact delta(eps) of this pair is
``dpmf.privacy.gaussian_plds.subsampled_gaussian(sigma, q).self_compose(T).delta(eps)``.
Written for these tests only (dependency injection into the run machinery).
"""

from __future__ import annotations

import numpy as np


def dpsgd_loss_samples(strategy, scheme, noise_multiplier, num_samples, rng, *, direction="remove"):
    q, steps, s = scheme.sampling_prob, scheme.steps, float(noise_multiplier)
    if direction == "remove":
        y = (rng.random((num_samples, steps)) < q) + s * rng.standard_normal((num_samples, steps))
    elif direction == "add":
        y = s * rng.standard_normal((num_samples, steps))
    else:
        raise ValueError(direction)
    a = (2.0 * y - 1.0) / (2.0 * s * s)
    per_step = np.logaddexp(np.log1p(-q), np.log(q) + a) if q < 1 else a
    loss = per_step.sum(axis=1)
    return loss if direction == "remove" else -loss


def gaussian_loss_samples(strategy, scheme, noise_multiplier, num_samples, rng, *, direction="remove"):
    """Plain Gaussian mechanism (sensitivity 1): L ~ N(+-1/(2 s^2), 1/s^2)."""
    s = float(noise_multiplier)
    y = rng.normal(1.0 if direction == "remove" else 0.0, s, num_samples)
    ll = (2.0 * y - 1.0) / (2.0 * s * s)
    return ll if direction == "remove" else -ll
