"""A framework-agnostic step of individually filtered DP-GD / DP-SGD (Koskela et al. Alg. 1 with
App. C.2; ``notes/individual-accounting.md`` §4.3).

Given per-example gradient norms, :func:`filtered_step` clips, asks the ledger which examples
still fit their budget, and returns what the training loop needs: per-example weights to multiply
the raw gradients by, the noise standard deviation, and the normalizer. The normalizer is a
**public constant** (e.g. the dataset size or the expected batch size): dividing by the number of
active examples would leak, because that number changes when one example is removed.

The update is ``(sum_i weights[i] * g_i + N(0, noise_std^2 I)) / normalizer``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpmf import validation as _v
from dpmf.accounting.individual.gdp_filter import IndividualGDPLedger, mu_array
from dpmf.errors import InvalidParameterError


@dataclass(frozen=True)
class FilteredStep:
    """What one filtered step needs: see the module docstring."""

    active: np.ndarray
    weights: np.ndarray
    mu: np.ndarray
    noise_std: float
    normalizer: float


def filtered_step(
    ledger: IndividualGDPLedger,
    grad_norms,
    *,
    clip_norm: float,
    noise_multiplier: float,
    normalizer: float,
    exhaust_budget: bool = False,
) -> FilteredStep:
    """One filtered private-GD step (full batch); updates ``ledger`` in place.

    Example ``i`` costs ``mu_i = min(||g_i||, C) / (sigma C)``; its weight is the clipping factor
    ``min(1, C/||g_i||)`` when admitted, 0 when filtered out, and (with ``exhaust_budget``) the
    factor that scales its contribution down to exactly its remaining budget.
    """
    c = _v.positive("clip_norm", clip_norm)
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    norm_const = _v.positive("normalizer", normalizer)
    norms = np.asarray(grad_norms, dtype=np.float64)
    if norms.shape != (ledger.num_examples,):
        raise InvalidParameterError(
            f"grad_norms must have one entry per example ({ledger.num_examples}), got shape {norms.shape}"
        )
    norms = mu_array("grad_norms", norms)  # finite and >= 0
    mu = np.minimum(norms, c)
    mu *= 1.0 / (sigma * c)
    eff = ledger._step(mu, exhaust_budget)  # noqa: SLF001 - validated above
    # contribution norm is eff * sigma * C; as eff <= min(||g||, C)/(sigma C) this weight is at
    # most the clipping factor min(1, C/||g||)
    weights = np.zeros_like(norms)
    np.divide(eff * (sigma * c), norms, out=weights, where=norms > 0)
    return FilteredStep(active=eff > 0, weights=weights, mu=eff, noise_std=sigma * c, normalizer=norm_const)
