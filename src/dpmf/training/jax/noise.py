"""A dpmf strategy as the noise of jax_privacy's matrix-factorization privatizer.

jax_privacy's ``noise_addition.matrix_factorization_privatizer(noising_matrix, stddev=...)`` is an
``optax.GradientTransformation`` that adds ``stddev * (M u)_t`` to the gradient of step ``t``
(``u_t ~ N(0, I)`` i.i.d., drawn from a JAX key held in the optax state). dpmf supplies ``M``: the
strategy's left inverse ``L`` (``L C = I``; ``C^{-1}`` for a square lower-triangular encoder,
:mod:`dpmf.strategies.streaming`), so with ``stddev = noise_multiplier * max_grad_norm`` the noise
added to the clipped gradient sums of the ``n`` steps has covariance (over steps, per coordinate)

    ``noise_multiplier^2 * max_grad_norm^2 * L L^T``   (``= sigma^2 clip^2 C^{-1} C^{-T}``),

exactly the noise dpmf's accountants certify and the PyTorch trainer adds
(:func:`dpmf.training.torch.noise.correlated_noise`).

``M`` is streamed where the strategy streams, with jax_privacy's own streaming matrices:

* ``Identity`` (DP-SGD): ``streaming_matrix.identity()``, no state;
* ``BLTStrategy``: ``BufferedToeplitz.inverse_as_streaming_matrix()`` (Alg. 3 of arXiv 2408.08868;
  ``num_buffers`` arrays of state), times ``1 / scale``;
* a **banded** lower-triangular ``C`` (banded Toeplitz / BSR ``ToeplitzStrategy``, BandMF
  ``DenseStrategy``): ``ColumnNormalizedBanded(params).inverse_as_streaming_matrix()`` (forward
  substitution over ``bands`` buffered outputs, Alg. 9 of arXiv 2306.08153) times the diagonal of
  ``C``'s column norms, which that class divides out;
* everything else (a full-history Toeplitz or dense ``C``, banded-inverse Toeplitz, the binary
  tree, the FFT mechanism, non-adaptive dense): the dense ``n x m`` matrix ``L``, which jax_privacy's
  dense privatizer applies row by row (regenerating ``u_j`` from the key: no state besides the
  step, ``O(nonzeros of row t)`` draws per step).

:func:`streaming_matrix` gives the streaming form (``None`` for the dense kinds),
:func:`noising_matrix` whatever is handed to jax_privacy, and :func:`correlated_privatizer` the
``optax`` transformation, guarded so that a step past ``n`` (which no report covers) yields NaN
updates instead of noise the strategy does not define (inside ``jit`` nothing can raise).

Example (BandMF with 4 bands over 16 steps; 4 arrays of state per parameter):

>>> import jax, jax.numpy as jnp
>>> from dpmf.strategies import bsr
>>> from dpmf.training.jax.noise import correlated_privatizer
>>> tx = correlated_privatizer(bsr(16, 4), noise_multiplier=1.2, max_grad_norm=1.0, seed=0)
>>> params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
>>> state = tx.init(params)
>>> noisy, state = tx.update(params, state)
>>> noisy["w"].shape, int(state.count)
((3, 2), 1)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.strategies.streaming import bandwidth
from dpmf.training.jax._deps import require_jax
from dpmf.training.jax.checks import check_prng_key, check_seed
from dpmf.training.jax.config import as_dpmf_strategy

jax, optax, jax_privacy = require_jax()
import jax.numpy as jnp  # noqa: E402
from jax_privacy import noise_addition  # noqa: E402
from jax_privacy.matrix_factorization import banded as _jp_banded  # noqa: E402
from jax_privacy.matrix_factorization import buffered_toeplitz as _jp_blt  # noqa: E402
from jax_privacy.matrix_factorization import streaming_matrix as _jp_sm  # noqa: E402

__all__ = ["streaming_matrix", "noising_matrix", "correlated_privatizer", "GuardedNoiseState", "bandwidth"]


def _float_dtype():
    """float64 where JAX has x64 enabled, else float32 (JAX's default)."""
    return jnp.float64 if jax.config.read("jax_enable_x64") else jnp.float32


def _banded_encoder(strategy) -> np.ndarray | None:
    """The dense lower-triangular ``C`` of a strategy whose encoder is banded with fewer bands than
    steps (banded Toeplitz, BandMF), else ``None``."""
    from dpmf.strategies.blt import BLTStrategy
    from dpmf.strategies.dense import DenseStrategy
    from dpmf.strategies.toeplitz import ToeplitzStrategy

    if isinstance(strategy, BLTStrategy):
        return None
    if isinstance(strategy, ToeplitzStrategy):
        coefs = np.asarray(strategy.coefs, dtype=np.float64)
        nz = np.flatnonzero(coefs)
        bands = int(nz[-1]) + 1 if nz.size else 1
        if bands >= strategy.n:
            return None
        return strategy.encoder()
    if isinstance(strategy, DenseStrategy) and strategy.adaptive:
        C = strategy.encoder()
        return C if bandwidth(C) < strategy.n else None
    return None


def _banded_streaming(C: np.ndarray):
    """``C^{-1}`` of a banded lower-triangular ``C`` through jax_privacy's ``ColumnNormalizedBanded``
    (whose matrix is ``C`` with unit columns) times ``diag(1 / column norms)``."""
    n = C.shape[0]
    b = bandwidth(C)
    dtype = _float_dtype()
    if np.any(np.diag(C) <= 0):
        raise UnsupportedConfigurationError(
            "a banded encoder C needs a positive diagonal for the streaming noise (jax_privacy's "
            f"ColumnNormalizedBanded); got diagonal entries down to {float(np.min(np.diag(C))):.3g}"
        )
    if b == 1:
        return _jp_sm.diagonal(jnp.asarray(1.0 / np.diag(C), dtype=dtype))
    params = np.zeros((n, b))
    for r in range(b):  # params[j, r] = C[j + r, j]: column j of C, from the diagonal down
        params[: n - r, r] = np.diag(C, -r)
    norms = np.linalg.norm(C, axis=0)
    inner = _jp_banded.ColumnNormalizedBanded(params=jnp.asarray(params, dtype=dtype)).inverse_as_streaming_matrix()
    return _jp_sm.multiply_streaming_matrices(_jp_sm.diagonal(jnp.asarray(1.0 / norms, dtype=dtype)), inner)


def streaming_matrix(strategy):
    """The jax_privacy ``StreamingMatrix`` of ``C^{-1}`` for a strategy that streams (module
    docstring: identity, BLT, banded encoders), else ``None``."""
    from dpmf.strategies.blt import BLT, BLTStrategy
    from dpmf.strategies.identity import Identity

    if isinstance(strategy, BLT):
        raise InvalidParameterError("a BLT has no number of steps: pass blt.to_toeplitz(n) (a BLTStrategy over n steps)")
    if isinstance(strategy, Identity):
        return _jp_sm.identity()
    if isinstance(strategy, BLTStrategy):
        dtype = _float_dtype()
        blt = _jp_blt.BufferedToeplitz(buf_decay=jnp.asarray(strategy.blt.buf_decay, dtype=dtype),
                                       output_scale=jnp.asarray(strategy.blt.output_scale, dtype=dtype))
        inv = blt.inverse_as_streaming_matrix()
        if strategy.scale != 1.0:
            inv = _jp_sm.multiply_streaming_matrices(_jp_sm.diagonal(jnp.asarray([1.0 / strategy.scale], dtype=dtype)), inv)
        return inv
    C = _banded_encoder(strategy)
    return None if C is None else _banded_streaming(C)


def _dense_noising_matrix(strategy) -> np.ndarray:
    fn = getattr(strategy, "noising_matrix", None)
    if not callable(fn) or getattr(strategy, "n", None) is None:
        raise UnsupportedConfigurationError(
            f"no JAX noise for a {type(strategy).__name__}: pass a dpmf strategy (Identity, ToeplitzStrategy, "
            "BLTStrategy, DenseStrategy, BinaryTree, FFTMechanism) or a jax_privacy BufferedToeplitz / "
            "ColumnNormalizedBanded (converted by dpmf.training.jax.strategy_from_jax_privacy)"
        )
    L = np.asarray(fn(), dtype=np.float64)
    if L.ndim != 2 or L.shape[0] != strategy.n:
        raise UnsupportedConfigurationError(f"the noising matrix of {type(strategy).__name__} has shape {L.shape}, "
                                            f"expected ({strategy.n}, m)")
    return L


def noising_matrix(strategy):
    """What jax_privacy's privatizer gets: :func:`streaming_matrix` where the strategy streams, else
    the dense left inverse ``L`` (``n x m``, ``L C = I``) as a JAX array."""
    sm = streaming_matrix(strategy)
    if sm is not None:
        return sm
    return jnp.asarray(_dense_noising_matrix(strategy), dtype=_float_dtype())


class GuardedNoiseState(NamedTuple):
    """The optax state of :func:`correlated_privatizer`: the step counter and jax_privacy's state
    (its key and the streaming matrix's buffers, or the step of the dense form)."""

    count: Any
    inner: Any


def correlated_privatizer(
    strategy,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    seed: int | None = None,
    prng_key=None,
    steps: int | None = None,
):
    """The ``optax.GradientTransformation`` that adds ``noise_multiplier * max_grad_norm * (L u)_t``
    to the gradient sums it is given, step ``t = 0 .. n-1`` (module docstring).

    ``strategy``: a dpmf strategy, or a jax_privacy ``BufferedToeplitz`` / ``ColumnNormalizedBanded``
    (converted by :func:`~dpmf.training.jax.config.strategy_from_jax_privacy` over ``steps``, which a
    ``BufferedToeplitz`` needs; for a dpmf strategy ``steps``, if given, must be its ``n``).
    Exactly one of ``seed`` (an integer) or ``prng_key`` (a JAX key). The transformation's state
    (:class:`GuardedNoiseState`) holds the key and the recurrence state, so checkpointing the optax
    state checkpoints the noise. After ``n`` updates every output is NaN: no report covers step ``n``
    (inside ``jit`` nothing can raise; :func:`~dpmf.training.jax.make_private`'s steps raise
    :class:`~dpmf.training.run_spec.StepOutOfPlanError` on the host before that).
    """
    if steps is not None:
        steps = _v.positive_int("steps", steps)
    strategy = as_dpmf_strategy(strategy, steps)
    n = getattr(strategy, "n", None)
    if n is None:
        streaming_matrix(strategy)  # raises the helpful error for a bare BLT
        raise InvalidParameterError(
            f"strategy must be a dpmf strategy with n steps or a jax_privacy BufferedToeplitz / ColumnNormalizedBanded, "
            f"got {type(strategy).__name__}; Toeplitz coefficients or a dense C: "
            "dpmf.training.jax.strategy_from_jax_privacy(array, n)"
        )
    if steps is not None and steps != n:
        raise InvalidParameterError(f"steps={steps} but the strategy has n={n} steps: pass steps={n} or a strategy "
                                    f"over {steps} steps")
    sigma = _v.non_negative("noise_multiplier", noise_multiplier)
    clip = _v.positive("max_grad_norm", max_grad_norm)
    if (seed is None) == (prng_key is None):
        raise InvalidParameterError("pass exactly one of seed=<int> and prng_key=<a jax.random key> (dpmf never "
                                    "draws hidden seeds)")
    if seed is not None:
        prng_key = jax.random.key(check_seed(seed))
    else:
        check_prng_key(prng_key)
    inner = noise_addition.matrix_factorization_privatizer(noising_matrix(strategy), stddev=sigma * clip,
                                                           prng_key=prng_key)
    steps = int(n)

    def init(params):
        return GuardedNoiseState(jnp.zeros((), jnp.int32), inner.init(params))

    def update(updates, state, params=None):
        del params
        noisy, new_inner = inner.update(updates, state.inner)
        ok = state.count < steps
        noisy = jax.tree.map(lambda u: jnp.where(ok, u, jnp.full_like(u, jnp.nan)), noisy)
        return noisy, GuardedNoiseState(state.count + 1, new_inner)

    return optax.GradientTransformation(init, update)
