"""Joint L2 clipping factors and their rounding: shared by every per-example gradient mode.

``f_i = min(1, C (1 - margin) / n_i)`` (1 for ``n_i = 0``, 0 for a non-finite ``n_i``), computed in
float64 and cast to the parameter dtype rounding toward zero. ``margin = max(8 eps(dtype), 2**-40)``
absorbs the float64 norm error and the rounding of the products ``f_i g_{i,j}``, so every clipped
per-example gradient has norm ``<= C`` for the computed numbers (the argument is in
:mod:`dpmf.training.torch.grad_sample`; ghost mode adds its own explicit error terms to ``n_i``,
:mod:`dpmf.training.torch.ghost.sequence`).
"""

from __future__ import annotations

from typing import Sequence

from dpmf.errors import InvalidParameterError
from dpmf.training.torch._deps import require_torch

torch = require_torch()

__all__ = ["clip_factors", "clip_margin", "toward_zero", "check_weights"]


def clip_margin(dtypes: Sequence) -> float:
    """Relative margin ``max(8 eps, 2**-40)`` over the given parameter dtypes (the largest eps)."""
    eps = max((torch.finfo(d).eps for d in dtypes), default=torch.finfo(torch.float32).eps)
    return max(8.0 * eps, 2.0**-40)


def clip_factors(norms, max_grad_norm: float, margin: float):
    """``f_i = min(1, C (1 - margin) / n_i)`` in float64; 1 for ``n_i = 0``; 0 for inf/NaN ``n_i``.

    >>> clip_factors(torch.tensor([0.0, 0.5, 4.0, float("inf")]), 2.0, 0.0).tolist()
    [1.0, 1.0, 0.5, 0.0]
    """
    norms = norms.to(torch.float64)
    f = torch.clamp(max_grad_norm * (1.0 - margin) / norms, max=1.0)  # n = 0 -> inf -> 1
    return torch.where(torch.isfinite(norms), f, torch.zeros_like(f))


def toward_zero(f64, dtype):
    """``f64`` cast to ``dtype`` rounding toward zero (never up), so scaling never exceeds the bound."""
    f = f64.to(dtype)
    if dtype == torch.float64:
        return f
    too_big = f.to(torch.float64) > f64
    return torch.where(too_big, torch.nextafter(f, torch.zeros_like(f)), f)


def check_weights(weights, batch: int):
    """``weights`` as a float64 tensor of shape ``(batch,)`` with entries in ``[0, 1]``."""
    try:
        w = torch.as_tensor(weights, dtype=torch.float64).detach().cpu()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InvalidParameterError(f"weights must be a 1-d tensor of {batch} numbers in [0, 1]") from exc
    if w.shape != (batch,):
        raise InvalidParameterError(f"weights must have one entry per example, shape ({batch},), got {tuple(w.shape)}")
    if batch and not (bool(torch.isfinite(w).all()) and float(w.min()) >= 0.0 and float(w.max()) <= 1.0):
        raise InvalidParameterError(f"weights must be finite numbers in [0, 1], got min {float(w.min())!r}, "
                                    f"max {float(w.max())!r}")
    return w
