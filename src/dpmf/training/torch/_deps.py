"""The one place that imports PyTorch for :mod:`dpmf.training.torch` and says how to install it."""

from __future__ import annotations

INSTALL_HINT = "pip install 'dpmf[torch]'  (the CPU build, torch==2.13.0)"


def require_torch():
    """Return the ``torch`` module, or raise one clear :class:`ImportError` saying how to get it."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised by the hidden-torch test in a subprocess
        raise ImportError(f"dpmf.training.torch needs PyTorch, which is not installed: {INSTALL_HINT}") from exc
    return torch
