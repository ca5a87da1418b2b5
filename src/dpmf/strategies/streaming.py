"""Streaming correlated noise: what training adds at each step, one step at a time, and its memory.

Convention (DESIGN.md, multi-epoch MF paper Choquette-Choo et al. 2023 Eq. 1): the mechanism
releases ``C x + z`` with ``z ~ N(0, sigma^2 I)``; training adds ``sigma * L z`` to the clipped
gradient sums, where ``L`` is a *left inverse* of the encoder, ``L C = I``:

* square lower-triangular ``C`` (identity, Toeplitz, BLT, banded, optimal, user matrices):
  ``L = C^{-1}``; ``w = C^{-1} z`` is obtained by forward substitution in ``C w = z`` (no inverse is
  formed) and the noise of step ``t`` only depends on ``z_0 .. z_t``;
* binary tree (``m x n``, ``m > n``, DP-FTRL): ``L = A^{-1} B`` with ``B`` the online Honaker decoder
  and ``A`` the prefix sum, i.e. the first difference of the noise ``B z`` on the released prefix
  sums (:class:`TreeNoise`, ``O(log n)`` stored estimates);
* FFT mechanism: ``L = A^{-1} B_F`` (or ``C_F^+`` for the optimal decoder); every step's noise
  depends on all ``2n`` Gaussian vectors, so the mechanism is not streaming and the noise is
  generated up front (:class:`PregeneratedNoise`, ``n * dim`` floats, as the paper notes, §4.6).

Every generator has the same small interface:

* ``next(noise)`` / iteration draws the step's ``z_t`` (``noise_multiplier * N(0, I)``) from the
  explicit ``rng`` and returns ``w_t``; iteration stops after ``n`` steps. ``dim`` is the number
  of parameters or a parameter shape (e.g. ``(256, 128)``): outputs have that shape;
* ``noise.step(z_t)`` takes the caller's ``z_t`` (no scaling; shape ``noise.input_shape()``,
  ``(dim,)`` except for the tree, which consumes the node noises released at that step) and
  returns ``w_t``: feeding known ``z`` reproduces ``L z`` exactly (this is how it is tested);
* ``memory_floats``: the number of floats of state kept between steps (besides the returned
  output), e.g. ``(bands - 1) * dim`` for a banded encoder, ``num_buffers * dim`` for a BLT.

This is the role of ``jax_privacy``'s ``inverse_as_streaming_matrix()`` plus
``noise_addition.matrix_factorization_privatizer``; obtain a generator with
``strategy.streaming_noise(dim, rng, noise_multiplier=...)`` on any strategy class.

Example (a 2-buffer BLT over 100 steps for 1000 parameters: two buffers of state):

    >>> import numpy as np
    >>> from dpmf.strategies import BLT
    >>> strategy = BLT([0.9, 0.4], [0.3, 0.2]).to_toeplitz(100)
    >>> noise = strategy.streaming_noise(1000, rng=0, noise_multiplier=1.5)
    >>> noise.memory_floats
    2000
    >>> next(noise).shape
    (1000,)
    >>> bool(np.allclose(strategy.noising_matrix() @ strategy.encoder(), np.eye(100)))
    True
"""

from __future__ import annotations

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.resources import check_allocation

__all__ = [
    "StreamingNoise",
    "IdentityNoise",
    "DenseNoise",
    "TreeNoise",
    "PregeneratedNoise",
    "resolve_rng",
    "tree_nodes_released",
]

#: Elements per chunk when drawing and updating large vectors: keeps the working set of one chunk
#: (output, buffers, temporary) in the L2 cache while numpy's ziggurat fills it.
CHUNK = 1 << 15


def resolve_rng(rng: np.random.Generator | int | None, *, required: bool = False) -> np.random.Generator | None:
    """``None`` (the caller feeds ``z`` with ``step``; refused when ``required``), a ``Generator``
    as is, or an int seed."""
    if (rng is None and not required) or isinstance(rng, np.random.Generator):
        return rng
    if rng is None or isinstance(rng, bool) or not isinstance(rng, (int, np.integer)):
        raise InvalidParameterError(
            f"rng must be a numpy.random.Generator or an integer seed (dpmf never draws hidden "
            f"seeds), got {rng!r}"
        )
    return np.random.default_rng(int(rng))


def _shape(dim: object) -> tuple[int, ...]:
    """``dim`` as a shape: an int ``d`` (a flat vector) or a tuple of positive ints (a tensor)."""
    if isinstance(dim, (tuple, list)):
        if not dim:
            raise InvalidParameterError("dim must be a positive integer or a non-empty shape tuple, got ()")
        return tuple(_v.positive_int("dim", d) for d in dim)
    return (_v.positive_int("dim", dim),)


def _dtype(dtype: object) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise InvalidParameterError(f"dtype must be float64 (default) or float32, got {dtype!r}")
    return dt


#: How to go smaller when a noise buffer cannot fit (:func:`dpmf.resources.check_allocation`).
SMALLER_NOISE = (
    "use a smaller dim (fewer parameters, or one parameter group at a time), dtype=float32, or a strategy "
    "whose noise keeps fewer past steps (banded, BLT, tree)"
)


def check_noise_buffer(rows: int, dim: int, dtype: object, what: str, hint: str = SMALLER_NOISE) -> None:
    """The memory guard of :mod:`dpmf.resources` for ``rows`` noise vectors of ``dim`` entries."""
    check_allocation(rows, dim, what, itemsize=np.dtype(dtype).itemsize, hint=hint)


#: Up to this many history rows the recursion is applied chunk by chunk with element-wise numpy
#: operations (cache-friendly, no BLAS threading); beyond it one matrix-vector product is used.
FUSED_MAX_ROWS = 32


class Ring:
    """The last ``h`` rows of a stream in ``h * dim`` floats (row ``r`` at position ``r % h``).

    :meth:`weights` turns coefficients by lag (``lagged[j]`` multiplies the row of step
    ``t - 1 - j``) into coefficients by buffer position, so no row is ever moved or duplicated.
    """

    def __init__(self, h: int, dim: int, dtype: np.dtype) -> None:
        self.h = h
        check_noise_buffer(h, dim, dtype, f"the streaming noise's history of {h:,} past steps")
        self.buf = np.zeros((h, dim), dtype=dtype)

    def weights(self, lagged: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
        """``(coef, rows)`` with ``coef @ rows = sum_{j < min(t, h)} lagged[j] row_{t-1-j}``."""
        h = self.h
        k = min(t, h)
        if t <= h:  # rows 0 .. t-1 hold steps 0 .. t-1, in place
            return np.ascontiguousarray(lagged[:k][::-1]), self.buf[:k]
        coef = np.empty(h, dtype=lagged.dtype)
        coef[(t - 1 - np.arange(h)) % h] = lagged[:h]
        return coef, self.buf

    def store(self, row: np.ndarray, t: int) -> None:
        if self.h:
            self.buf[t % self.h] = row


def subtract_history(
    w: np.ndarray,
    coef: np.ndarray,
    past: np.ndarray,
    tmp: np.ndarray,
    *,
    draw=None,
    sigma: float = 1.0,
    divisor: float = 1.0,
) -> None:
    """In place: ``w <- (w - coef @ past) / divisor`` (``coef`` of length ``k = past.shape[0]``).

    With ``draw`` (a ``Generator``), ``w`` is first filled with ``sigma * N(0, I)`` chunk by chunk,
    so drawing and the recursion touch each chunk once while it is in cache; the numbers are
    those of drawing the whole vector at once. Used by the banded generators (Toeplitz, dense).
    """
    k, dim = past.shape[0], w.shape[0]
    if k > FUSED_MAX_ROWS:
        if draw is not None:
            draw.standard_normal(dtype=w.dtype, out=w)
            if sigma != 1.0:
                w *= sigma
        w -= coef @ past
        if divisor != 1.0:
            w /= divisor
        return
    rows = [(past[j], float(coef[j])) for j in range(k) if coef[j] != 0]
    for lo in range(0, dim, CHUNK):
        hi = min(lo + CHUNK, dim)
        ww = w[lo:hi]
        tt = tmp[: hi - lo]
        if draw is not None:
            draw.standard_normal(dtype=w.dtype, out=ww)
            if sigma != 1.0:
                ww *= sigma
        for row, c in rows:
            np.multiply(row[lo:hi], c, out=tt)
            ww -= tt
        if divisor != 1.0:
            ww /= divisor


class StreamingNoise:
    """Base class: a stream of ``n`` per-step noise vectors ``w_t = (L z)_t`` (module docstring).

    Subclasses implement ``_step(z)`` (``z`` a fresh array owned by the generator, of shape
    :meth:`input_shape`, dtype :attr:`dtype`) and ``memory_floats``.
    """

    def __init__(
        self,
        n: int | None,
        dim: int,
        *,
        noise_multiplier: float = 1.0,
        rng: np.random.Generator | int | None = None,
        dtype: object = np.float64,
    ) -> None:
        self.n = None if n is None else _v.positive_int("n", n)
        self.shape = _shape(dim)
        self.dim = int(np.prod(self.shape))
        self.noise_multiplier = _v.non_negative("noise_multiplier", noise_multiplier)
        self._rng = resolve_rng(rng)
        self.dtype = _dtype(dtype)
        self._t = 0
        check_noise_buffer(2, self.dim, self.dtype, "one step of streaming noise (its Gaussian draw and output)",
                           hint="use a smaller dim (fewer parameters, or one parameter group at a time) or dtype=float32")

    # ---- interface ---------------------------------------------------------------------------
    @property
    def memory_floats(self) -> int:
        """Floats of state kept between steps (besides the returned output)."""
        raise NotImplementedError

    @property
    def steps_done(self) -> int:
        """How many outputs have been produced (the next one is for step ``steps_done``)."""
        return self._t

    def input_shape(self) -> tuple[int, ...]:
        """Shape of the (flattened) ``z_t`` that :meth:`step` expects next: ``(dim,)`` by default
        (``dim`` = number of parameters); the tree takes ``(nodes released at t, dim)``."""
        return (self.dim,)

    def step(self, z: object) -> np.ndarray:
        """Return ``w_t = (L z)_t`` (shape :attr:`shape`) for the caller's ``z_t`` (not scaled;
        flat as :meth:`input_shape` or with the parameter shape in the last axes); advance ``t``."""
        self._check_not_done()
        flat = self.input_shape()
        z = np.array(z, dtype=self.dtype)  # a copy: the generator may work in place
        if z.shape != flat:
            if z.shape != flat[:-1] + self.shape:
                raise InvalidParameterError(f"z must have shape {flat} or {flat[:-1] + self.shape}, got {z.shape}")
            z = z.reshape(flat)
        if not np.all(np.isfinite(z)):
            raise InvalidParameterError("z must contain only finite numbers (no NaN/inf)")
        return self._advance(z).reshape(self.shape)

    def __iter__(self) -> "StreamingNoise":
        return self

    def __next__(self) -> np.ndarray:
        if self.n is not None and self._t >= self.n:
            raise StopIteration
        if self._rng is None:
            raise InvalidParameterError(
                "rng must be a numpy.random.Generator or an integer seed to draw noise "
                "(dpmf never draws hidden seeds); or feed z yourself with step(z)"
            )
        return self._next().reshape(self.shape)

    # ---- internals ---------------------------------------------------------------------------
    def _check_not_done(self) -> None:
        if self.n is not None and self._t >= self.n:
            raise InvalidParameterError(f"z: all n={self.n} steps have already been generated")

    def _draw(self, shape: tuple[int, ...]) -> np.ndarray:
        z = self._rng.standard_normal(shape, dtype=self.dtype)
        if self.noise_multiplier != 1.0:
            z *= self.noise_multiplier
        return z

    def _next(self) -> np.ndarray:
        return self._advance(self._draw(self.input_shape()))

    def _advance(self, z: np.ndarray) -> np.ndarray:
        w = self._step(z)
        self._t += 1
        return w

    def _step(self, z: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError


class IdentityNoise(StreamingNoise):
    """``C = I`` (DP-SGD): ``w_t = z_t``, fresh independent noise; no state (``memory_floats = 0``)."""

    def __init__(self, n: int, dim: int, *, noise_multiplier: float = 1.0, rng=None, dtype=np.float64, scale: float = 1.0):
        super().__init__(n, dim, noise_multiplier=noise_multiplier, rng=rng, dtype=dtype)
        self.scale = _v.positive("scale", scale)  # C = scale * I

    @property
    def memory_floats(self) -> int:
        return 0

    def _step(self, z: np.ndarray) -> np.ndarray:
        if self.scale != 1.0:
            z /= self.scale
        return z


def bandwidth(C: np.ndarray) -> int:
    """``b`` with ``C[i, j] = 0`` whenever ``i - j >= b`` (``C`` lower triangular)."""
    i, j = np.nonzero(C)
    return int(np.max(i - j)) + 1 if i.size else 1


class DenseNoise(StreamingNoise):
    """``w = C^{-1} z`` for an explicit lower-triangular invertible ``C`` by forward substitution:
    ``w_t = (z_t - sum_{j<t} C[t, j] w_j) / C[t, t]``.

    Keeps the past *outputs* ``w_j`` that row ``t`` of ``C`` still reads: the last ``band - 1``
    for a ``band``-banded ``C`` (BandMF: ``C[i, j] = 0`` for ``i - j >= band``), all ``n - 1`` for
    a dense ``C`` (e.g. the optimal multi-epoch strategy): ``memory_floats = (band - 1) * dim``,
    ``O(n * dim)`` in the dense case, with ``O(band * dim)`` work per step. (Keeping past ``z``
    instead would need the same memory for a dense ``C``; past outputs are what makes the banded
    case cheap.)
    """

    def __init__(self, C: object, dim: int, *, noise_multiplier: float = 1.0, rng=None, dtype=np.float64):
        from dpmf.strategies.workloads import lower_triangular

        C = lower_triangular(C, "C", invertible=True)
        super().__init__(C.shape[0], dim, noise_multiplier=noise_multiplier, rng=rng, dtype=dtype)
        self.band = bandwidth(C)
        self.history_rows = min(self.band - 1, self.n - 1)
        h = self.history_rows
        # lagged coefficients: lag[t, j] multiplies w_{t-1-j} (j = 0 .. h-1; zero before step 0)
        lag = np.zeros((self.n, max(h, 1)))
        for t in range(1, self.n):
            j = np.arange(min(t, h))
            lag[t, j] = C[t, t - 1 - j]
        self._lag = lag.astype(self.dtype)
        self._diag = np.diag(C).astype(self.dtype)
        self._ring = Ring(h, self.dim, self.dtype)
        self._tmp = np.empty(min(self.dim, CHUNK), dtype=self.dtype)

    @property
    def memory_floats(self) -> int:
        return int(self._ring.buf.size)

    def _solve(self, w: np.ndarray, draw) -> np.ndarray:
        t = self._t
        coef, past = self._ring.weights(self._lag[t], t)
        subtract_history(
            w, coef, past, self._tmp, draw=draw, sigma=self.noise_multiplier, divisor=float(self._diag[t])
        )
        self._ring.store(w, t)
        return w

    def _step(self, z: np.ndarray) -> np.ndarray:
        return self._solve(z, None)

    def _next(self) -> np.ndarray:
        w = self._solve(np.empty(self.dim, dtype=self.dtype), self._rng)
        self._t += 1
        return w


def tree_nodes_released(t: int, n: int, levels: int) -> int:
    """Number of tree nodes whose noise is released at step ``t`` (0-based) of an ``n``-step tree
    with ``levels = ceil(log2 n)``: one per trailing zero of ``t + 1``, plus the leaf; at the last
    step every level closes. Shared by the numpy and torch tree generators."""
    if t >= n - 1:
        return levels + 1
    return ((t + 1) & -(t + 1)).bit_length()  # trailing zeros of t + 1, plus one


class TreeNoise(StreamingNoise):
    """Per-step noise of the binary tree with the online Honaker decoder (DP-FTRL).

    Training adds ``w_t = (B z)_t - (B z)_{t-1}`` (``B`` the online Honaker decoder of
    :mod:`dpmf.strategies.tree`, ``(B z)_{-1} = 0``), the step-``t`` increment of the noise on the
    released prefix sums; ``L = A^{-1} B`` satisfies ``L C = I``. ``step(z_t)`` takes the noises of
    the tree nodes released at step ``t`` (shape ``(r_t, dim)``, in the row order of
    :func:`~dpmf.strategies.tree.tree_nodes`: lowest level first).

    Streaming by Honaker's recursion (inverse-variance weighting, equal to the closed form of the
    tree module): a complete subtree's estimate is
    ``est(parent) = V_{h+1} z_parent + V_{h+1} / (2 V_h) (est(left) + est(right))`` with
    ``V_h = 1 / (2 - 2^{-h})``. Only one estimate per pending dyadic block is stored:
    ``memory_floats = levels * dim`` (``levels = ceil(log2 n)``). Tree completion at the last step
    (virtual steps contribute 0) matches :func:`~dpmf.strategies.tree.online_honaker_decoder`.
    The optimal decoder ``A C^+`` is not online and has no streaming form.
    """

    def __init__(self, n: int, dim: int, *, noise_multiplier: float = 1.0, rng=None, dtype=np.float64, scale: float = 1.0):
        super().__init__(n, dim, noise_multiplier=noise_multiplier, rng=rng, dtype=dtype)
        self.scale = _v.positive("scale", scale)  # C = scale * C_tree
        self.levels = (self.n - 1).bit_length()
        check_noise_buffer(self.levels + 2, self.dim, self.dtype, "the tree's streaming noise (one estimate per level)")
        h = np.arange(self.levels + 2, dtype=np.float64)
        self._V = 1.0 / (2.0 - 2.0**-h)
        self._pending: list[tuple[int, np.ndarray]] = []

    @property
    def memory_floats(self) -> int:
        return self.levels * self.dim

    def input_shape(self) -> tuple[int, ...]:
        return (tree_nodes_released(self._t, self.n, self.levels), self.dim)

    def _step(self, z: np.ndarray) -> np.ndarray:
        t, V = self._t, self._V
        last = t == self.n - 1
        est = z[0]
        popped = None
        r, h = 1, 0
        while h < self.levels:
            if (t >> h) & 1:  # left sibling: a complete real block waiting on the stack
                hh, left = self._pending.pop()
                assert hh == h
                popped = left if popped is None else popped + left
                children = left + est
            elif last:  # right sibling is all-virtual (dropped): contributes 0
                children = est
            else:
                break
            est = V[h + 1] * z[r] + (V[h + 1] / (2.0 * V[h])) * children
            r += 1
            h += 1
        self._pending.append((h, est))
        w = est - popped if popped is not None else est.copy()
        if self.scale != 1.0:
            w /= self.scale
        return w


class PregeneratedNoise(StreamingNoise):
    """Noise for a non-streaming mechanism, generated up front and handed out step by step.

    ``rows`` is the ``(n, dim)`` array of per-step noises ``L z`` (computed by the strategy from the
    whole ``z``); ``memory_floats = n * dim``. :meth:`step` is not available: no step's noise can be
    computed from the past alone.
    """

    def __init__(self, rows: np.ndarray, *, reason: str, shape: tuple[int, ...] | None = None) -> None:
        rows = np.asarray(rows)
        super().__init__(rows.shape[0], shape or rows.shape[1], dtype=rows.dtype)
        if self.dim != rows.shape[1]:
            raise InvalidParameterError(f"shape {shape} does not hold the {rows.shape[1]} columns of rows")
        self._rows = rows
        self._reason = reason

    @property
    def memory_floats(self) -> int:
        return int(self._rows.size)

    def step(self, z: object) -> np.ndarray:
        raise UnsupportedConfigurationError(f"step(z) is not available: {self._reason}")

    def __next__(self) -> np.ndarray:
        if self._t >= self.n:
            raise StopIteration
        w = self._rows[self._t].copy()
        self._t += 1
        return w.reshape(self.shape)
