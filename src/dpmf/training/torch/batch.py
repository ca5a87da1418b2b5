"""Batches as the clippers see them: the tensors of a nested batch, its number of examples, a slice
of it, and the positional arguments of a call.

A batch is a tensor, a tuple or list of tensors (``module(*inputs)``), a dict of tensors
(``module(**inputs)``), or any nesting of these (and of dataclasses, for model outputs), with the
examples along dim 0 of its tensors. Both clippers (:mod:`~dpmf.training.torch.grad_sample`,
:mod:`~dpmf.training.torch.ghost.clipper`) and the ghost fallback use these helpers.
"""

from __future__ import annotations

from dpmf.errors import InvalidParameterError
from dpmf.training.torch._deps import require_torch

torch = require_torch()

__all__ = ["flat_tensors", "batch_size_of", "split_batch", "as_args"]


def flat_tensors(out) -> list:
    """The tensors of a (nested) output: tensors, dicts, tuples, lists and dataclasses, in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in flat_tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in flat_tensors(v)]
    if hasattr(out, "__dataclass_fields__"):
        return [t for k in out.__dataclass_fields__ for t in flat_tensors(getattr(out, k))]
    return []


def batch_size_of(inputs) -> int:
    """The number of examples of a batch: dim 0 of its first tensor (tensor, tuple, list or dict)."""
    tensors = flat_tensors(inputs)
    if not tensors or tensors[0].ndim < 1:
        raise InvalidParameterError(
            "inputs must be a tensor, a tuple of tensors or a dict of tensors with the examples along dim 0"
        )
    return tensors[0].shape[0]


def split_batch(inputs, lo: int, hi: int, batch: int):
    """``inputs`` with every tensor whose dim 0 is ``batch`` cut to ``[lo:hi]`` (same nesting)."""
    if isinstance(inputs, torch.Tensor):
        return inputs[lo:hi] if inputs.ndim >= 1 and inputs.shape[0] == batch else inputs
    if isinstance(inputs, dict):
        return type(inputs)({k: split_batch(v, lo, hi, batch) for k, v in inputs.items()})
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(split_batch(v, lo, hi, batch) for v in inputs)
    return inputs


def as_args(inputs) -> tuple:
    """The positional arguments of ``module(*args)`` for a batch: a tuple or list as it is, else one."""
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
