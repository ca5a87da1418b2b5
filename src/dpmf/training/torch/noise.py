"""Correlated noise for PyTorch training: :func:`correlated_noise` turns any dpmf strategy into a
torch generator of the per-step noise ``noise_multiplier * max_grad_norm * (C^{-1} z)_t``.

This is the torch twin of :mod:`dpmf.strategies.streaming` (DESIGN.md, ``training/``): one class
per strategy kind, the same recurrence and the same state, tested equal to the numpy generators
through ``step(z)`` and equal in law through the covariance ``std^2 L L^T`` of the streamed noise.

Conventions (written once in :mod:`dpmf.training.torch.noise_base`):

* **What is added.** At step ``t`` training adds the output to the clipped gradient **sum** (before
  dividing by the batch size): ``noise_t = std * (L u)_t`` with ``std = noise_multiplier *
  max_grad_norm`` and ``u_t ~ N(0, I)``; ``L = C^{-1}`` for a square encoder (the left inverse
  training uses for the tree and the FFT mechanism). The generator applies ``std``; the caller
  does not scale. ``noise_multiplier`` is the sigma of the strategy *as given* (normalize it to
  sensitivity 1 first, e.g. ``strategy.normalized(participation)``, as the accountants expect).
* **Layout.** One flat vector of ``numel`` floats per step: all parameters concatenated in the
  order given, each flattened; ``noise.unflatten(w)`` gives views shaped like the parameters.
  Generated with torch on ``device`` in ``dtype`` (float32 by default, float64 on request; the
  recurrence state is kept in the same dtype).
* **Randomness.** Exactly one of ``seed`` (reproducible), ``generator`` (your ``torch.Generator``)
  or ``secure=True`` (the whole generator state from the OS: unpredictable, but torch's CPU
  generator is a Mersenne Twister, not a cryptographically secure generator; see
  :mod:`dpmf.training.torch.seeding`). With none of them only ``step(z)`` works.
* **Checkpoints.** ``state_dict()`` holds the step counter, the recurrence state (ring, buffers,
  pending tree estimates, or pre-generated rows) and the ``torch.Generator`` state;
  ``load_state_dict`` refuses a state from another strategy, shape, dtype, device type, noise
  multiplier, clip norm or secure flag, and a resumed generator continues bit for bit.
* **Steps.** After ``n`` steps ``draw()`` and ``step(z)`` raise :class:`NoiseExhaustedError`
  (``next()`` raises ``StopIteration``).

Memory per kind (``d = numel``; :mod:`dpmf.training.torch.noise_recurrences` has the table):
identity ``0``; banded Toeplitz / BandMF ``(bands - 1) d``; BLT ``num_buffers d``; dense or
square-root Toeplitz ``(n - 1) d``; tree ``ceil(log2 n) d``; FFT and non-adaptive ``n d``.

Example (a 2-buffer BLT over 100 steps for a model of 1000 floats):

    >>> import torch
    >>> from dpmf.strategies import BLT
    >>> from dpmf.training.torch.noise import correlated_noise
    >>> strategy = BLT([0.9, 0.4], [0.3, 0.2]).to_toeplitz(100)
    >>> params = [torch.zeros(10, 90), torch.zeros(100)]
    >>> noise = correlated_noise(strategy, params, noise_multiplier=1.5, max_grad_norm=1.0, seed=0)
    >>> noise.memory_floats, noise.numel
    (2000, 1000)
    >>> w = noise.draw()
    >>> w.shape, w.dtype, noise.steps_done
    (torch.Size([1000]), torch.float32, 1)
    >>> [v.shape for v in noise.unflatten(w)]
    [torch.Size([10, 90]), torch.Size([100])]
"""

from __future__ import annotations

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.strategies.blt import BLT, BLTStrategy
from dpmf.strategies.dense import DenseStrategy
from dpmf.strategies.fft import FFTMechanism
from dpmf.strategies.identity import Identity
from dpmf.strategies.stamping import StampedEncoder
from dpmf.strategies.toeplitz import ToeplitzStrategy
from dpmf.strategies.tree import BinaryTree
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch import noise_recurrences
from dpmf.training.torch.noise_base import NoiseExhaustedError, TorchCorrelatedNoise
from dpmf.training.torch.noise_recurrences import (
    TorchBLTNoise,
    TorchDenseNoise,
    TorchFFTNoise,
    TorchIdentityNoise,
    TorchPseudoInverseNoise,
    TorchStampedNoise,
    TorchToeplitzNoise,
    TorchTreeNoise,
)

torch = require_torch()

__all__ = ["correlated_noise", "noise_class", "NoiseExhaustedError", "TorchCorrelatedNoise",
           *noise_recurrences.__all__]

SUPPORTED = (
    "Identity, ToeplitzStrategy (BSR, BISR, banded, square root), BLTStrategy, DenseStrategy "
    "(optimal, BandMF, matrix; non-adaptive), BinaryTree, FFTMechanism, StampedEncoder"
)


def noise_class(strategy: object) -> type[TorchCorrelatedNoise]:
    """The torch generator class for ``strategy`` (a closed choice: the dpmf strategy classes)."""
    if isinstance(strategy, Identity):
        return TorchIdentityNoise
    if isinstance(strategy, BLTStrategy):  # before ToeplitzStrategy, its base class
        return TorchBLTNoise
    if isinstance(strategy, ToeplitzStrategy):
        return TorchToeplitzNoise
    if isinstance(strategy, DenseStrategy):
        return TorchDenseNoise if strategy.adaptive else TorchPseudoInverseNoise
    if isinstance(strategy, BinaryTree):
        return TorchTreeNoise
    if isinstance(strategy, FFTMechanism):
        return TorchFFTNoise
    if isinstance(strategy, StampedEncoder):
        return TorchStampedNoise
    if isinstance(strategy, BLT):
        raise InvalidParameterError(
            "a BLT has no number of steps: pass blt.to_toeplitz(n) (a BLTStrategy over n steps)"
        )
    raise UnsupportedConfigurationError(
        f"no torch noise generator for a {type(strategy).__name__}; supported: {SUPPORTED}"
    )


def correlated_noise(
    strategy: object,
    params: object,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    seed: int | None = None,
    generator: "torch.Generator | None" = None,
    secure: bool = False,
    device: object = None,
    dtype: "torch.dtype | None" = None,
) -> TorchCorrelatedNoise:
    """A torch generator of the noise to add to the clipped gradient sums, step by step.

    Args:
        strategy: a dpmf strategy (the encoder ``C`` as given): ``Identity``, ``ToeplitzStrategy``,
            ``BLTStrategy``, ``DenseStrategy``, ``BinaryTree``, ``FFTMechanism`` or
            ``StampedEncoder``; ``n = strategy.n`` steps.
        params: the parameters to noise: a list of tensors (e.g. ``list(model.parameters())``),
            of shapes (``torch.Size`` / tuples) or of sizes; a single ``int`` (number of floats) or
            ``torch.Size``. A bare tuple of ints is refused as ambiguous.
        noise_multiplier: sigma ``>= 0`` for ``strategy`` as given (Opacus' name).
        max_grad_norm: the per-example clip norm ``> 0`` (Opacus' name). The generator scales by
            ``std = noise_multiplier * max_grad_norm``; add its output unscaled.
        seed: an integer seed (reproducible; torch's CPU generator uses its low 32 bits).
        generator: your ``torch.Generator`` on ``device`` (advanced in place; saved in the state).
        secure: draw the whole generator state from the OS (unpredictable; not a CSPRNG stream).
        device: where the noise lives; default: the parameters' device, else CPU.
        dtype: ``torch.float32`` or ``torch.float64``; default: float64 if every parameter is a
            float64 tensor, else float32.

    Returns:
        a :class:`TorchCorrelatedNoise` (the class for the strategy's kind): ``draw()`` /
        ``next()`` give the step's flat noise, ``step(z)`` applies the recurrence to your ``z``,
        ``memory_floats``, ``steps_done``, ``n``, ``state_dict()`` / ``load_state_dict()``.
        The non-streaming kinds (FFT, non-adaptive dense) draw all their noise here.
    """
    cls = noise_class(strategy)
    return cls(
        strategy,
        params,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        seed=seed,
        generator=generator,
        secure=secure,
        device=device,
        dtype=dtype,
    )
