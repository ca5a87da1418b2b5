"""The torch correlated-noise generators, one per strategy kind, each mirroring its numpy twin in
:mod:`dpmf.strategies.streaming` (and :mod:`~dpmf.strategies.toeplitz`, :mod:`~dpmf.strategies.blt`)
recurrence by recurrence. ``d`` below is ``numel``, the number of floats of the flat noise vector;
``memory_floats`` is the state kept between steps (besides the output and per-step temporaries):

* ``TorchIdentityNoise`` (``Identity``, DP-SGD): ``0``;
* ``TorchToeplitzNoise`` (``ToeplitzStrategy``: banded, BSR, BISR, square root, ...):
  ``history_rows * d``, ``history_rows = min(band - 1, n - 1)`` for the smaller band of ``C`` and
  ``C^{-1}`` (``n - 1`` when neither is banded);
* ``TorchBLTNoise`` (``BLTStrategy``): ``num_buffers * d``;
* ``TorchDenseNoise`` (adaptive ``DenseStrategy``: optimal, BandMF, a user matrix):
  ``min(band - 1, n - 1) * d`` (BandMF with ``b`` bands: ``(b - 1) * d``; dense: ``(n - 1) * d``);
* ``TorchTreeNoise`` (``BinaryTree``): ``ceil(log2 n) * d``;
* ``TorchStampedNoise`` (``StampedEncoder``, blocks of ``n'`` steps): ``min(band' - 1, n' - 1) * d``
  for a lower-triangular block, else ``n' * d`` (one block generated at a time);
* ``TorchFFTNoise`` (``FFTMechanism``) and ``TorchPseudoInverseNoise`` (non-adaptive
  ``DenseStrategy``): ``n * d`` (not streaming: generated up front).

Every step costs one normal draw of ``d`` floats plus ``O(memory_floats)`` in-place multiply-adds
(no Python loop over coordinates); the tree draws ``1 + (trailing ones of t)`` vectors at step
``t``. The non-streaming generators draw ``z`` (``m x d``, ``m`` the encoder's rows) block of
columns by block of columns (:data:`COLUMN_BLOCK`) and hold the ``n x d`` result.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dpmf.errors import InvalidParameterError
from dpmf.strategies.blt import BLTStrategy
from dpmf.strategies.dense import DenseStrategy
from dpmf.strategies.fft import FFTMechanism, fft_sqrt_eigenvalues
from dpmf.strategies.identity import Identity
from dpmf.strategies.stamping import StampedEncoder, pseudo_inverse
from dpmf.strategies.streaming import bandwidth, tree_nodes_released
from dpmf.strategies.toeplitz import ToeplitzStrategy
from dpmf.strategies.tree import BinaryTree
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.noise_base import (
    TorchCorrelatedNoise,
    recurrence_digest,
    ring_weights,
    subtract_history,
    unsupported_step,
)

torch = require_torch()

__all__ = [
    "TorchIdentityNoise",
    "TorchToeplitzNoise",
    "TorchBLTNoise",
    "TorchDenseNoise",
    "TorchTreeNoise",
    "TorchStampedNoise",
    "TorchFFTNoise",
    "TorchPseudoInverseNoise",
]

#: Columns (coordinates) per block when the non-streaming generators draw ``z`` and apply ``L``:
#: bounds the temporaries to ``O(m * COLUMN_BLOCK)`` floats besides the ``n x d`` result.
COLUMN_BLOCK = 1 << 16


def _require(strategy: object, cls: type, kind: str) -> None:
    if not isinstance(strategy, cls):
        raise InvalidParameterError(f"strategy must be a {cls.__name__} for {kind}, got {type(strategy).__name__}")


class TorchIdentityNoise(TorchCorrelatedNoise):
    """``C = I`` (DP-SGD): ``w_t = z_t``, fresh independent noise each step, as Opacus adds.
    Mirrors :class:`~dpmf.strategies.streaming.IdentityNoise`. ``memory_floats = 0``."""

    kind = "identity"

    def __init__(self, strategy: Identity, params: object, **kwargs) -> None:
        _require(strategy, Identity, "TorchIdentityNoise")
        super().__init__(strategy.n, params, description=strategy.describe(), **kwargs)

    @property
    def memory_floats(self) -> int:
        return 0

    def _digest(self) -> str:
        return recurrence_digest([1.0])

    def _step(self, z):
        return z


def _check_buffer(rows: int, numel: int, device, dtype, what: str) -> None:
    """The memory guard of :mod:`dpmf.resources` for a noise buffer in host memory (a GPU's own
    memory is torch's to report): the same one-line refusal as the numpy generators."""
    if torch.device(device).type != "cpu":
        return
    from dpmf.resources import check_allocation
    from dpmf.strategies.streaming import SMALLER_NOISE

    itemsize = torch.empty((), dtype=dtype).element_size()
    check_allocation(rows, numel, what, itemsize=itemsize, hint=SMALLER_NOISE)


class _Ring:
    """The last ``h`` rows of a stream, row ``r`` at position ``r % h`` (``h x d`` floats)."""

    def __init__(self, h: int, numel: int, device, dtype) -> None:
        self.h = h
        _check_buffer(h, numel, device, dtype, f"the correlated noise's history of {h:,} past steps")
        self.buf = torch.zeros((h, numel), device=device, dtype=dtype)

    def subtract(self, w, lagged: np.ndarray, t: int) -> None:
        """``w -= sum_{j < min(t, h)} lagged[j] row_{t-1-j}`` in place."""
        if self.h:
            coef, k = ring_weights(lagged, t, self.h)
            subtract_history(w, coef, self.buf[:k])

    def store(self, row, t: int) -> None:
        if self.h:
            self.buf[t % self.h].copy_(row)


class TorchToeplitzNoise(TorchCorrelatedNoise):
    """``w_t = (C^{-1} z)_t`` for a lower-triangular Toeplitz ``C`` (mirrors
    :class:`~dpmf.strategies.toeplitz.ToeplitzNoise`, with the same three modes, chosen from the
    exact zero pattern of the coefficients ``c`` of ``C`` and ``g`` of ``C^{-1}``):

    * ``"banded-encoder"`` (``C`` has fewer nonzero diagonals, ``band``): forward substitution
      ``w_t = (z_t - sum_{j=1}^{band-1} c_j w_{t-j}) / c_0``, keeping the last ``band - 1`` outputs;
    * ``"banded-inverse"`` (``C^{-1}`` has fewer, e.g. BISR): ``w_t = sum_j g_j z_{t-j}``, keeping
      the last ``band - 1`` inputs ``z``;
    * ``"full-history"`` (neither banded, e.g. the square root of the prefix sum): the same
      convolution over all past ``z``.

    ``memory_floats = history_rows * d`` with ``history_rows = min(band - 1, n - 1)`` (``n - 1``
    in the full-history mode); ``O(history_rows * d)`` work per step.
    """

    kind = "toeplitz"

    def __init__(self, strategy: ToeplitzStrategy, params: object, **kwargs) -> None:
        _require(strategy, ToeplitzStrategy, "TorchToeplitzNoise")
        super().__init__(strategy.n, params, description=strategy.describe(), **kwargs)
        g = strategy.noising_coefficients()
        c = np.asarray(strategy.coefs, dtype=np.float64)
        band_c = max(_band(c), 1)
        band_g = max(_band(g), 1)
        if band_c < band_g:
            self.mode = "banded-encoder"
            self._coefs = c[:band_c].copy()
        else:
            self.mode = "banded-inverse" if band_g < self.n else "full-history"
            self._coefs = g[:band_g].copy()
        self.history_rows = min(self._coefs.size - 1, self.n - 1)
        h = self.history_rows
        self._lagged = np.zeros(max(h, 1))
        self._lagged[:h] = self._coefs[1 : 1 + h]
        self._ring = _Ring(h, self.numel, self.device, self.dtype)

    @property
    def memory_floats(self) -> int:
        """``history_rows * d``."""
        return self.history_rows * self.numel

    def _digest(self) -> str:
        return recurrence_digest(self.mode, self._coefs)

    def _step(self, z):
        t = self._t
        if self.mode == "banded-encoder":
            # w_t = (z_t - sum_j c_{j+1} w_{t-1-j}) / c_0; the ring holds past outputs
            self._ring.subtract(z, self._lagged, t)
            c0 = float(self._coefs[0])
            if c0 != 1.0:
                z.div_(c0)
            self._ring.store(z, t)
            return z
        # w_t = g_0 z_t + sum_j g_{j+1} z_{t-1-j}; the ring holds past inputs
        w = torch.mul(z, float(self._coefs[0]))
        self._ring.subtract(w, -self._lagged, t)
        self._ring.store(z, t)
        return w

    def _recurrence_state(self) -> dict:
        return {"ring": self._ring.buf}

    def _prepare_recurrence_state(self, rec: Mapping, t: int):
        self._check_keys(rec, ("ring",))
        ring = self._tensor(rec, "ring", tuple(self._ring.buf.shape))
        return lambda: self._ring.buf.copy_(ring)


def _band(coefs: np.ndarray) -> int:
    nz = np.flatnonzero(coefs)
    return int(nz[-1]) + 1 if nz.size else 0


class TorchBLTNoise(TorchCorrelatedNoise):
    """``w_t = (C^{-1} z)_t`` for a BLT encoder ``scale * C_blt`` by its buffers (mirrors
    :class:`~dpmf.strategies.blt.BLTNoise`): ``w_t = z_t - sum_i omega_i s_i``, then
    ``s_i <- theta_i s_i + w_t``, output ``w_t / scale``. ``memory_floats = num_buffers * d``;
    ``2 * num_buffers`` in-place passes over ``d`` floats per step.
    """

    kind = "blt"

    def __init__(self, strategy: BLTStrategy, params: object, **kwargs) -> None:
        _require(strategy, BLTStrategy, "TorchBLTNoise")
        super().__init__(strategy.n, params, description=strategy.describe(), **kwargs)
        self.scale = float(strategy.scale)
        self._theta = [float(x) for x in strategy.blt.buf_decay]
        self._omega = [float(x) for x in strategy.blt.output_scale]
        _check_buffer(len(self._theta), self.numel, self.device, self.dtype, "the BLT's noise buffers")
        self.buffers = torch.zeros((len(self._theta), self.numel), device=self.device, dtype=self.dtype)

    @property
    def memory_floats(self) -> int:
        """``num_buffers * d``."""
        return int(self.buffers.numel())

    def _digest(self) -> str:
        return recurrence_digest(self._theta, self._omega, [self.scale])

    def _step(self, w):
        buf = self.buffers
        if self._t:
            for i, om in enumerate(self._omega):
                if om != 0.0:
                    w.add_(buf[i], alpha=-om)
        for i, th in enumerate(self._theta):
            torch.add(w, buf[i], alpha=th, out=buf[i])  # s_i <- theta_i s_i + w_t, one pass
        if self.scale != 1.0:
            w.div_(self.scale)
        return w

    def _recurrence_state(self) -> dict:
        return {"buffers": self.buffers}

    def _prepare_recurrence_state(self, rec: Mapping, t: int):
        self._check_keys(rec, ("buffers",))
        buffers = self._tensor(rec, "buffers", tuple(self.buffers.shape))
        return lambda: self.buffers.copy_(buffers)


class _ForwardSubstitution:
    """``w_t = (z_t - sum_{j<t} C[t, j] w_j) / C[t, t]`` for a lower-triangular invertible ``C``
    (``m x m``), keeping the last ``min(band - 1, m - 1)`` outputs (mirrors
    :class:`~dpmf.strategies.streaming.DenseNoise`)."""

    def __init__(self, C: np.ndarray, numel: int, device, dtype) -> None:
        m = C.shape[0]
        self.band = bandwidth(C)
        h = self.history_rows = min(self.band - 1, m - 1)
        lag = np.zeros((m, max(h, 1)))  # lag[t, j] multiplies w_{t-1-j}
        for t in range(1, m):
            j = np.arange(min(t, h))
            lag[t, j] = C[t, t - 1 - j]
        self.lag = lag
        self.diag = np.diag(C).copy()
        self.ring = _Ring(h, numel, device, dtype)

    def solve_(self, w, t: int):
        self.ring.subtract(w, self.lag[t], t)
        d = float(self.diag[t])
        if d != 1.0:
            w.div_(d)
        self.ring.store(w, t)
        return w


def _lower_triangular_invertible(C: np.ndarray) -> bool:
    return C.shape[0] == C.shape[1] and not np.any(np.triu(C, 1)) and bool(np.all(np.diag(C) != 0))


class TorchDenseNoise(TorchCorrelatedNoise):
    """``w = C^{-1} z`` for an explicit lower-triangular ``C`` (an adaptive
    :class:`~dpmf.strategies.dense.DenseStrategy`: optimal multi-epoch, BandMF, a user matrix) by
    forward substitution (mirrors :class:`~dpmf.strategies.streaming.DenseNoise`), keeping the
    last ``band - 1`` outputs: ``memory_floats = min(band - 1, n - 1) * d`` (BandMF with ``b``
    bands: ``(b - 1) * d``; a dense ``C``, e.g. the optimal strategy: ``(n - 1) * d``).
    """

    kind = "dense"

    def __init__(self, strategy: DenseStrategy, params: object, **kwargs) -> None:
        _require(strategy, DenseStrategy, "TorchDenseNoise")
        if not strategy.adaptive:
            raise InvalidParameterError(
                "TorchDenseNoise needs an adaptive (lower-triangular) DenseStrategy; a non-adaptive one "
                "is not streaming: use TorchPseudoInverseNoise (correlated_noise picks it)"
            )
        super().__init__(strategy.n, params, description=strategy.describe(), **kwargs)
        self._C = np.asarray(strategy.C, dtype=np.float64)
        self._fs = _ForwardSubstitution(self._C, self.numel, self.device, self.dtype)
        self.band = self._fs.band
        self.history_rows = self._fs.history_rows

    @property
    def memory_floats(self) -> int:
        """``min(band - 1, n - 1) * d``."""
        return self.history_rows * self.numel

    def _digest(self) -> str:
        return recurrence_digest(self._C)

    def _step(self, z):
        return self._fs.solve_(z, self._t)

    def _recurrence_state(self) -> dict:
        return {"ring": self._fs.ring.buf}

    def _prepare_recurrence_state(self, rec: Mapping, t: int):
        self._check_keys(rec, ("ring",))
        ring = self._tensor(rec, "ring", tuple(self._fs.ring.buf.shape))
        return lambda: self._fs.ring.buf.copy_(ring)


def _tree_pending_levels(n: int, t: int) -> list[int]:
    """Levels of the estimates :class:`TorchTreeNoise` holds after ``t`` steps (integers only)."""
    levels = (n - 1).bit_length()
    stack: list[int] = []
    for s in range(t):
        last = s == n - 1
        h = 0
        while h < levels:
            if (s >> h) & 1:
                stack.pop()
            elif not last:
                break
            h += 1
        stack.append(h)
    return stack


class TorchTreeNoise(TorchCorrelatedNoise):
    """Per-step noise of the binary tree with the online Honaker decoder (DP-FTRL), mirroring
    :class:`~dpmf.strategies.streaming.TreeNoise`: ``w_t = (B z)_t - (B z)_{t-1}`` divided by the
    tree's ``scale``. :meth:`step` takes the noises of the nodes released at step ``t``
    (``(r_t, d)``, lowest level first; :meth:`input_shape`), :meth:`draw` draws them.

    One estimate per pending dyadic block: ``memory_floats = levels * d`` with
    ``levels = ceil(log2 n)``, as the numpy twin states it. It bounds what is held between steps
    (``popcount(t + 1)`` estimates after step ``t < n - 1``) and is reached when ``n`` is a power
    of two (after step ``n - 2``); the node noises of one step (up to ``levels + 1`` vectors) are
    per-step temporaries.
    """

    kind = "tree"

    def __init__(self, strategy: BinaryTree, params: object, **kwargs) -> None:
        _require(strategy, BinaryTree, "TorchTreeNoise")
        super().__init__(strategy.n, params, description=strategy.describe(), **kwargs)
        self.scale = float(strategy.scale)
        self.levels = (self.n - 1).bit_length()
        h = np.arange(self.levels + 2, dtype=np.float64)
        self._V = [float(v) for v in 1.0 / (2.0 - 2.0**-h)]
        self._pending: list[tuple[int, object]] = []

    @property
    def memory_floats(self) -> int:
        """``levels * d``, ``levels = ceil(log2 n)``."""
        return self.levels * self.numel

    def input_shape(self) -> tuple[int, ...]:
        return (tree_nodes_released(self._t, self.n, self.levels), self.numel)

    def _digest(self) -> str:
        return recurrence_digest([self.scale])

    def _step(self, z):
        t, V = self._t, self._V
        last = t == self.n - 1
        est = z[0]
        popped = None
        r, h = 1, 0
        while h < self.levels:
            if (t >> h) & 1:  # left sibling: a complete block waiting on the stack
                hh, left = self._pending.pop()
                assert hh == h
                popped = left if popped is None else popped + left
                children = left + est
            elif last:  # right sibling all-virtual: contributes 0
                children = est  # est is z[0] or a fresh tensor: safe to overwrite
            else:
                break
            # est(parent) = V_{h+1} z_parent + V_{h+1} / (2 V_h) (est(left) + est(right))
            est = children.mul_(V[h + 1] / (2.0 * V[h])).add_(z[r], alpha=V[h + 1])
            r += 1
            h += 1
        self._pending.append((h, est))
        w = est - popped if popped is not None else est.clone()
        if self.scale != 1.0:
            w.div_(self.scale)
        return w

    def _recurrence_state(self) -> dict:
        if self._pending:
            stack = torch.stack([e.reshape(self.numel) for _, e in self._pending])
        else:
            stack = torch.zeros((0, self.numel), device=self.device, dtype=self.dtype)
        levels = torch.tensor([h for h, _ in self._pending], dtype=torch.int64)
        return {"pending": stack, "pending_levels": levels}

    def _prepare_recurrence_state(self, rec: Mapping, t: int):
        self._check_keys(rec, ("pending", "pending_levels"))
        expected = _tree_pending_levels(self.n, t)
        levels = rec["pending_levels"]
        if not isinstance(levels, torch.Tensor) or levels.tolist() != expected:
            raise InvalidParameterError(
                f"state['recurrence']['pending_levels'] must be {expected} after {t} steps, got "
                f"{levels.tolist() if isinstance(levels, torch.Tensor) else levels!r}"
            )
        stack = self._tensor(rec, "pending", (len(expected), self.numel))

        def apply() -> None:
            self._pending = [(h, stack[i].clone()) for i, h in enumerate(expected)]

        return apply


class TorchStampedNoise(TorchCorrelatedNoise):
    """Noise for a stamped encoder ``I_s (x) C'`` (:class:`~dpmf.strategies.stamping.StampedEncoder`,
    ``s = copies`` blocks of ``n'`` steps, e.g. a mechanism restarted every epoch). The left
    inverse is ``I_s (x) L'``: each block's noise only depends on that block's ``z``.

    * lower-triangular invertible block: forward substitution restarted at every block (the same
      numbers as :class:`~dpmf.strategies.streaming.DenseNoise` on the whole block-diagonal
      ``C``), ``memory_floats = min(band' - 1, n' - 1) * d``;
    * any other block (a tall tree or FFT block, ``m' x n'``): the block's noise ``C'^+ z`` (the
      optimal decoder's, :func:`~dpmf.strategies.stamping.pseudo_inverse`) is generated when the
      block starts, ``m' x d`` normals drawn in column blocks; ``memory_floats = n' * d``;
      :meth:`step` is unavailable.
    """

    kind = "stamped"

    def __init__(self, strategy: StampedEncoder, params: object, **kwargs) -> None:
        _require(strategy, StampedEncoder, "TorchStampedNoise")
        super().__init__(strategy.n, params, description=strategy.describe(), **kwargs)
        self._block = np.asarray(strategy.block, dtype=np.float64)
        self.block_steps = self._block.shape[1]
        self.copies = strategy.copies
        if _lower_triangular_invertible(self._block):
            self.mode = "streaming"
            self._fs = _ForwardSubstitution(self._block, self.numel, self.device, self.dtype)
        else:
            self.mode = "per-block"
            self._pinv = pseudo_inverse(self._block)  # raises for a rank-deficient block
            self._rows = torch.zeros((self.block_steps, self.numel), device=self.device, dtype=self.dtype)

    @property
    def memory_floats(self) -> int:
        """``min(band' - 1, n' - 1) * d`` (streaming blocks) or ``n' * d`` (per-block)."""
        if self.mode == "streaming":
            return self._fs.history_rows * self.numel
        return int(self._rows.numel())

    def _digest(self) -> str:
        return recurrence_digest(self._block, [self.copies])

    def _step(self, z):
        return self._fs.solve_(z, self._t % self.block_steps)

    def _draw_step(self):
        if self.mode == "streaming":
            return super()._draw_step()
        j = self._t % self.block_steps
        if j == 0:
            _fill_rows(self, self._rows, self._block.shape[0], lambda zc: _matmul(self._pinv, zc), None)
        return self._rows[j].clone()

    def step(self, z):
        if self.mode != "streaming":
            raise unsupported_step("the stamped block is not lower triangular (not streaming)")
        return super().step(z)

    def _recurrence_state(self) -> dict:
        return {"ring": self._fs.ring.buf} if self.mode == "streaming" else {"rows": self._rows}

    def _prepare_recurrence_state(self, rec: Mapping, t: int):
        key, target = ("ring", self._fs.ring.buf) if self.mode == "streaming" else ("rows", self._rows)
        self._check_keys(rec, (key,))
        value = self._tensor(rec, key, tuple(target.shape))
        return lambda: target.copy_(value)


# ---- non-streaming: generated up front ------------------------------------------------------


def _matmul(P: np.ndarray, zc):
    return torch.as_tensor(P, dtype=zc.dtype, device=zc.device) @ zc


def _fill_rows(noise: TorchCorrelatedNoise, rows, m: int, apply, z) -> None:
    """``rows[:, block] = apply(z[:, block])`` over column blocks; ``z`` (``m x d``) is the
    caller's or drawn block by block (``std * N(0, I)`` of shape ``(m, block width)``)."""
    d = noise.numel
    for lo in range(0, d, COLUMN_BLOCK):
        hi = min(lo + COLUMN_BLOCK, d)
        zc = z[:, lo:hi] if z is not None else noise._normal((m, hi - lo))
        rows[:, lo:hi] = apply(zc)


class _TorchPregeneratedNoise(TorchCorrelatedNoise):
    """Noise of a non-streaming mechanism, generated up front (``rows``, ``n x d`` floats) from
    ``z`` (``m x d``): the caller's ``z`` (used as is, like the numpy generators' ``z=``) or
    ``std * N(0, I)`` drawn at construction, in column blocks of :data:`COLUMN_BLOCK`. Mirrors
    :class:`~dpmf.strategies.streaming.PregeneratedNoise`: ``memory_floats = n * d``, the state
    holds all ``n x d`` rows, and :meth:`step` is unavailable."""

    reason = "the mechanism is not streaming"
    _draws_per_step = False

    def _generate(self, m: int, apply, z: object) -> None:
        _check_buffer(self.n, self.numel, self.device, self.dtype, "the noise of every step, generated up front")
        self._rows = torch.empty((self.n, self.numel), device=self.device, dtype=self.dtype)
        if z is None:
            if self._generator is None:
                raise InvalidParameterError(
                    f"seed=, generator= or secure=True is required: {self.reason}, so all of its "
                    "noise is drawn up front (or pass z)"
                )
        else:
            try:
                z = torch.as_tensor(z).to(device=self.device, dtype=self.dtype)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise InvalidParameterError(f"z must be a tensor or array of numbers: {exc}") from None
            if tuple(z.shape) != (m, self.numel):
                raise InvalidParameterError(f"z must have shape {(m, self.numel)}, got {tuple(z.shape)}")
            if not bool(torch.isfinite(z).all()):
                raise InvalidParameterError("z must contain only finite numbers (no NaN/inf)")
        _fill_rows(self, self._rows, m, apply, z)

    @property
    def memory_floats(self) -> int:
        """``n * d``: every step's noise is held from the start."""
        return int(self._rows.numel())

    def step(self, z):
        raise unsupported_step(self.reason)

    def _draw_step(self):
        return self._rows[self._t].clone()

    def _recurrence_state(self) -> dict:
        return {"rows": self._rows}

    def _prepare_recurrence_state(self, rec: Mapping, t: int):
        self._check_keys(rec, ("rows",))
        rows = self._tensor(rec, "rows", tuple(self._rows.shape))
        return lambda: self._rows.copy_(rows)


class TorchFFTNoise(_TorchPregeneratedNoise):
    """The FFT mechanism's per-step noise ``diff(B_F z)`` (App. K of the multi-epoch MF paper;
    mirrors :meth:`~dpmf.strategies.fft.FFTMechanism.streaming_noise` with ``decoder="fft"``):
    every step needs all ``2n`` vectors ``z``, so the noise is generated up front with
    ``torch.fft`` (``O(n log n)`` per coordinate): ``memory_floats = n * d``. For the optimal
    decoder's noise use the normalized mechanism (a non-adaptive ``DenseStrategy``:
    :class:`TorchPseudoInverseNoise`)."""

    kind = "fft"
    reason = "the FFT mechanism is not streaming (each step needs all 2n z's)"

    def __init__(self, strategy: FFTMechanism, params: object, *, z: object = None, **kwargs) -> None:
        _require(strategy, FFTMechanism, "TorchFFTNoise")
        super().__init__(strategy.n, params, description=strategy.describe(), **kwargs)
        n = self.n
        complex_dtype = torch.complex64 if self.dtype == torch.float32 else torch.complex128
        lam = torch.as_tensor(fft_sqrt_eigenvalues(n)[: n + 1], dtype=complex_dtype, device=self.device)

        def apply(zc):
            prefix = torch.fft.irfft(lam[:, None] * torch.fft.rfft(zc, n=2 * n, dim=0), n=2 * n, dim=0)[:n]
            return torch.diff(prefix, dim=0, prepend=torch.zeros_like(prefix[:1]))

        self._generate(2 * n, apply, z)

    def _digest(self) -> str:
        return recurrence_digest([self.n])


class TorchPseudoInverseNoise(_TorchPregeneratedNoise):
    """``C^+ z`` for a non-adaptive (tall, not streaming) :class:`~dpmf.strategies.dense.DenseStrategy`
    (e.g. a normalized FFT mechanism: the optimal decoder's noise), generated up front (mirrors
    :meth:`DenseStrategy.streaming_noise`): ``memory_floats = n * d``, ``O(n m d)`` work once."""

    kind = "pseudo-inverse"
    reason = "the encoder is not lower triangular (not streaming)"

    def __init__(self, strategy: DenseStrategy, params: object, *, z: object = None, **kwargs) -> None:
        _require(strategy, DenseStrategy, "TorchPseudoInverseNoise")
        super().__init__(strategy.n, params, description=strategy.describe(), **kwargs)
        self._C = np.asarray(strategy.C, dtype=np.float64)
        P = strategy.noising_matrix()
        self._generate(self._C.shape[0], lambda zc: _matmul(P, zc), z)

    def _digest(self) -> str:
        return recurrence_digest(self._C)
