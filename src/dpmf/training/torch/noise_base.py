"""The base class of the torch correlated-noise generators: parameter layout, scale, the
``torch.Generator``, the step counter and its refusal past ``n``, and checkpoint state.

One generator produces, at step ``t = 0 .. n-1``, the noise that training adds to the clipped
gradient *sum* of that step:

    ``noise_t = noise_multiplier * max_grad_norm * (L u)_t``,  ``u_t ~ N(0, I_numel)`` i.i.d.,

where ``L`` is the strategy's left inverse (``L C = I``; ``C^{-1}`` for a square lower-triangular
encoder; :mod:`dpmf.strategies.streaming`). The generator applies the scale ``std =
noise_multiplier * max_grad_norm`` itself, at the draw (``z_t = std * u_t``, as the numpy
generators scale by ``noise_multiplier``): the caller adds the output as is (Opacus' ``add_noise``
uses the same ``std``). :meth:`TorchCorrelatedNoise.step` takes the caller's ``z_t`` *as is* (no
scaling) and returns ``(L z)_t``, exactly what the numpy generator's ``step(z_t)`` returns.

The noise of all parameters is **one flat vector** of ``numel`` floats (the parameters
concatenated in the order given, each flattened in row-major order): one draw and one recurrence
per step over all parameters. :meth:`TorchCorrelatedNoise.unflatten` returns views shaped like the
parameters (no copy), e.g. for ``torch._foreach_add_(grads, noise.unflatten(w))``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.seeding import make_generator

torch = require_torch()

__all__ = ["NoiseExhaustedError", "TorchCorrelatedNoise", "STATE_FORMAT"]

#: Version of the layout of :meth:`TorchCorrelatedNoise.state_dict` (2: with ``digest``).
STATE_FORMAT = 2

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}


class NoiseExhaustedError(InvalidParameterError):
    """A noise step past the ``n`` steps of the strategy was requested. The strategy (and the
    privacy analysis built on it) covers ``n`` steps only; build a longer strategy instead."""


# ---- parameter layout ----------------------------------------------------------------------


def _shape_of(item: object, index: int) -> tuple[int, ...]:
    if isinstance(item, torch.Tensor):
        return tuple(item.shape)
    if isinstance(item, (bool, np.bool_)):
        raise InvalidParameterError(f"params[{index}] must be a tensor, a shape or a size, got {item!r}")
    if isinstance(item, (int, np.integer)):
        if item < 0:
            raise InvalidParameterError(f"params[{index}] must be a size >= 0, got {item!r}")
        return (int(item),)
    if isinstance(item, (tuple, list, torch.Size)):
        if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in item):
            raise InvalidParameterError(
                f"params[{index}] must be a shape of integers >= 0, got {item!r}"
            )
        return tuple(int(s) for s in item)
    raise InvalidParameterError(
        f"params[{index}] must be a tensor, a shape or a size, got {type(item).__name__}"
    )


def resolve_layout(
    params: object, device: object, dtype: object
) -> tuple[list[tuple[int, ...]], int, "torch.device", "torch.dtype"]:
    """``(shapes, numel, device, dtype)`` of the flat noise vector (see :func:`correlated_noise`
    for what ``params`` may be; ``device``/``dtype`` default from tensor parameters)."""
    tensors: list = []
    if isinstance(params, (int, np.integer)) and not isinstance(params, (bool, np.bool_)):
        shapes = [(_v.positive_int("params", params),)]
    elif isinstance(params, torch.Size):
        shapes = [tuple(int(s) for s in params)]
    elif isinstance(params, torch.Tensor):
        raise InvalidParameterError(
            "params must be a list of tensors (e.g. list(model.parameters())), not a single tensor; "
            "wrap it: [tensor]"
        )
    elif isinstance(params, tuple) and params and all(
        isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in params
    ):
        raise InvalidParameterError(
            f"params={params!r} is ambiguous (one shape or several sizes?): pass the number of "
            f"floats as an int, one shape as [{params!r}] or torch.Size({list(params)!r}), or "
            f"several flat sizes as a list {list(params)!r}"
        )
    elif isinstance(params, Iterable) and not isinstance(params, (str, bytes, Mapping)):
        items = list(params)
        if not items:
            raise InvalidParameterError("params must not be empty")
        shapes = [_shape_of(item, i) for i, item in enumerate(items)]
        tensors = [item for item in items if isinstance(item, torch.Tensor)]
    else:
        raise InvalidParameterError(
            "params must be the number of floats (int), a torch.Size, or a list of tensors / shapes / "
            f"sizes, got {type(params).__name__}"
        )
    numel = sum(math.prod(s) for s in shapes)
    if numel < 1:
        raise InvalidParameterError(f"params must hold at least one float, got shapes {shapes}")

    if device is None:
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise InvalidParameterError(
                f"params live on several devices {sorted(map(str, devices))}: pass device="
            )
        device = devices.pop() if devices else torch.device("cpu")
    else:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise InvalidParameterError(f"device must be a torch device, got {device!r}: {exc}") from None
    if dtype is None:  # float64 only if every parameter is a float64 tensor
        all_f64 = len(tensors) == len(shapes) and all(t.dtype == torch.float64 for t in tensors)
        dtype = torch.float64 if all_f64 else torch.float32
    if dtype not in _DTYPE_NAMES:
        raise InvalidParameterError(
            f"dtype must be torch.float32 (default) or torch.float64, got {dtype!r}"
        )
    return shapes, numel, device, dtype


# ---- coefficients --------------------------------------------------------------------------


def recurrence_digest(*arrays: object) -> str:
    """A short hex digest of what defines a recurrence: arrays (float64 bytes and shapes) and
    strings (e.g. a mode)."""
    h = hashlib.sha256()
    for a in arrays:
        if isinstance(a, str):
            h.update(b"str:" + a.encode())
            continue
        arr = np.ascontiguousarray(np.asarray(a, dtype=np.float64))
        h.update(repr(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()[:16]


def ring_weights(lagged: np.ndarray, t: int, h: int) -> tuple[np.ndarray, int]:
    """``(coef, k)``: ``coef @ ring[:k]`` is ``sum_{j < min(t, h)} lagged[j] row_{t-1-j}`` for a
    ring of ``h`` rows holding row ``r`` at position ``r % h`` (as
    :class:`dpmf.strategies.streaming.Ring`)."""
    k = min(t, h)
    if t <= h:  # rows 0 .. t-1 hold steps 0 .. t-1, in place
        return np.ascontiguousarray(lagged[:k][::-1]), k
    coef = np.empty(h, dtype=np.float64)
    coef[(t - 1 - np.arange(h)) % h] = lagged[:h]
    return coef, h


#: Up to this many history rows the recursion is one ``add_`` per row (as the numpy generators);
#: beyond it, one matrix-vector product.
FUSED_MAX_ROWS = 32


def subtract_history(w: "torch.Tensor", coef: np.ndarray, past: "torch.Tensor") -> None:
    """In place: ``w -= coef @ past`` (``past`` of shape ``(len(coef), numel)``)."""
    k = past.shape[0]
    if k == 0:
        return
    if k <= FUSED_MAX_ROWS:
        for j in range(k):
            c = float(coef[j])
            if c != 0.0:
                w.add_(past[j], alpha=-c)
        return
    w.addmv_(past.t(), torch.as_tensor(coef, dtype=w.dtype, device=w.device), alpha=-1)


# ---- the base class ------------------------------------------------------------------------


def _jsonable(obj: object) -> object:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


def state_digest(fingerprint: Mapping, steps_done: int, seed: object, generator_state: object,
                 recurrence: Mapping) -> str:
    """The digest a saved state carries: SHA-256 (32 hex digits) of the fingerprint, the step
    counter, the seed, the generator state's bytes and every recurrence tensor's dtype, shape and
    bytes. It binds ``steps_done`` to the generator and recurrence state it was saved with: a
    counter lowered (or raised) afterwards no longer matches, although telling how far a generator
    has advanced would otherwise take replaying the whole stream. A cheap check against accidents,
    not a signature: whoever edits the state can recompute it."""
    h = hashlib.sha256()
    head = {"fingerprint": dict(fingerprint), "steps_done": steps_done, "seed": seed}
    h.update(json.dumps(head, sort_keys=True, default=str).encode())

    def tensor_bytes(name: str, t: object) -> None:
        if not isinstance(t, torch.Tensor):
            h.update(f"|{name}:{t!r}|".encode())
            return
        t = t.detach().cpu().contiguous()
        h.update(f"|{name}:{t.dtype}:{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())

    if generator_state is None:
        h.update(b"|generator:none|")
    else:
        tensor_bytes("generator", generator_state)
    for key in sorted(recurrence):
        tensor_bytes(f"recurrence.{key}", recurrence[key])
    return h.hexdigest()[:32]


class TorchCorrelatedNoise:
    """Base class: ``n`` per-step noise vectors ``(L z)_t`` of ``numel`` floats, with torch.

    Subclasses mirror one generator of :mod:`dpmf.strategies.streaming` each and implement
    ``_step(z)`` (``z`` a fresh tensor owned by the generator, of shape :meth:`input_shape`),
    ``memory_floats``, ``_recurrence_state()`` and ``_prepare_recurrence_state(state, t)``.

    Interface (the same for every strategy kind):

    * :meth:`draw` / ``next(noise)`` / iteration: draw ``z_t = std * N(0, I)`` from the
      generator's own ``torch.Generator`` and return the step's noise (flat, ``(numel,)``,
      :attr:`device`, :attr:`dtype`; a new tensor each step). Past ``n`` steps :meth:`draw` raises
      :class:`NoiseExhaustedError`; ``next()`` raises ``StopIteration`` (so ``for w in noise``
      stops after ``n`` steps).
    * :meth:`step` (``z``): the same recurrence on the caller's ``z_t`` (not scaled): how the torch
      generators are tested equal to the numpy ones.
    * :attr:`memory_floats`, :attr:`steps_done`, :attr:`n`, :attr:`numel`, :attr:`std`.
    * :meth:`state_dict` / :meth:`load_state_dict`: the step counter, the recurrence state and the
      ``torch.Generator`` state; a resumed generator continues bit for bit. Loading refuses a state
      whose :meth:`fingerprint` differs (another strategy, shape, dtype, device type, noise
      multiplier, clip norm, or secure flag).
    """

    kind = "base"
    #: False for the generators whose noise was all generated up front (nothing to draw per step).
    _draws_per_step = True

    def __init__(
        self,
        n: int,
        params: object,
        *,
        noise_multiplier: float,
        max_grad_norm: float,
        seed: int | None = None,
        generator: "torch.Generator | None" = None,
        secure: bool = False,
        device: object = None,
        dtype: "torch.dtype | None" = None,
        description: Mapping | None = None,
    ) -> None:
        self.n = _v.positive_int("n", n)
        self.shapes, self.numel, self.device, self.dtype = resolve_layout(params, device, dtype)
        self.noise_multiplier = _v.non_negative("noise_multiplier", noise_multiplier)
        self.max_grad_norm = _v.positive("max_grad_norm", max_grad_norm)
        self._generator, self.seed = make_generator(
            seed=seed, generator=generator, secure=secure, device=self.device
        )
        self.secure = bool(secure)
        # the strategy as "name:digest of describe()": describe() may hold a whole matrix
        desc = dict(description or {})
        text = json.dumps(desc, sort_keys=True, default=_jsonable)
        self._description = f"{desc.get('name', '?')}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        self._t = 0

    # ---- interface ---------------------------------------------------------------------------
    @property
    def std(self) -> float:
        """``noise_multiplier * max_grad_norm``: the standard deviation of each ``z_t`` entry."""
        return self.noise_multiplier * self.max_grad_norm

    @property
    def memory_floats(self) -> int:
        """Floats of recurrence state kept between steps (besides the returned output and the
        per-step temporaries); the per-kind formula is in each class's docstring."""
        raise NotImplementedError

    @property
    def steps_done(self) -> int:
        """How many outputs have been produced (the next one is for step ``steps_done``)."""
        return self._t

    @property
    def generator(self) -> "torch.Generator | None":
        """The ``torch.Generator`` the draws come from (``None``: feed ``z`` with :meth:`step`)."""
        return self._generator

    def input_shape(self) -> tuple[int, ...]:
        """Shape of the ``z_t`` that :meth:`step` expects next: ``(numel,)`` (the tree takes
        ``(nodes released at t, numel)``)."""
        return (self.numel,)

    def step(self, z: object) -> "torch.Tensor":
        """Return ``(L z)_t`` for the caller's ``z_t`` (used as is, no scaling; shape
        :meth:`input_shape`; a tensor or array, copied) and advance the step counter."""
        self._check_not_done()
        z = self._as_input(z)
        w = self._step(z)
        self._t += 1
        return w

    def draw(self) -> "torch.Tensor":
        """The next step's noise, from ``z_t = std * N(0, I)`` drawn with :attr:`generator`."""
        self._check_not_done()
        if self._generator is None and self._draws_per_step:
            raise InvalidParameterError(
                "this noise generator has no torch.Generator: build it with seed=, generator= or "
                "secure=True to draw noise (dpmf never draws hidden seeds), or feed z with step(z)"
            )
        w = self._draw_step()
        self._t += 1
        return w

    def __iter__(self) -> "TorchCorrelatedNoise":
        return self

    def __next__(self) -> "torch.Tensor":
        if self._t >= self.n:
            raise StopIteration
        return self.draw()

    def unflatten(self, flat: "torch.Tensor") -> list["torch.Tensor"]:
        """Views of the flat noise shaped like the parameters (no copy), in the order given."""
        if not isinstance(flat, torch.Tensor) or tuple(flat.shape) != (self.numel,):
            shape = tuple(flat.shape) if isinstance(flat, torch.Tensor) else type(flat).__name__
            raise InvalidParameterError(f"flat must be a tensor of shape ({self.numel},), got {shape}")
        sizes = [math.prod(s) for s in self.shapes]
        return [part.view(s) for part, s in zip(torch.split(flat, sizes), self.shapes)]

    def fingerprint(self) -> dict:
        """What a saved state must match to be loaded: the kind, the strategy (its name and a
        digest of its ``describe()``), a digest of the recurrence coefficients, ``n``, the
        parameter shapes, dtype, device type, noise multiplier, clip norm and secure flag (plain
        strings, numbers and booleans)."""
        return {
            "kind": self.kind,
            "strategy": self._description,
            "recurrence": self._digest(),
            "n": self.n,
            "numel": self.numel,
            "shapes": json.dumps([list(s) for s in self.shapes]),
            "dtype": _DTYPE_NAMES[self.dtype],
            "device": self.device.type,
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "secure": self.secure,
        }

    def state_dict(self) -> dict:
        """The resumable state: ``{"format", "fingerprint", "steps_done", "seed",
        "generator_state", "recurrence", "digest"}`` (tensors, dicts, ints, floats, strings and
        ``None``, so ``torch.load(..., weights_only=True)`` reads it back). Tensors are copies: later
        steps do not change a saved state. ``digest`` (:func:`state_digest`) binds the step counter
        to the generator and recurrence state, so a counter edited after saving is refused on load.
        For a secure generator the state holds the secret generator state (needed to resume bit for
        bit): keep such a checkpoint as private as the noise."""
        state = {
            "format": STATE_FORMAT,
            "fingerprint": self.fingerprint(),
            "steps_done": self._t,
            "seed": self.seed,
            "generator_state": None if self._generator is None else self._generator.get_state(),
            "recurrence": {k: v.detach().clone() for k, v in self._recurrence_state().items()},
        }
        state["digest"] = state_digest(state["fingerprint"], state["steps_done"], state["seed"],
                                       state["generator_state"], state["recurrence"])
        return state

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a :meth:`state_dict` of a generator with the same :meth:`fingerprint`: the step
        counter, the recurrence state and the ``torch.Generator`` state (the next draws are those
        the saved generator would have made). The saved generator state replaces this one's
        (also a caller's ``generator``, whose state is set in place). A state whose ``digest`` no
        longer matches its step counter, generator and recurrence state (edited or damaged after
        saving, e.g. ``steps_done`` rewound while the generator had already produced later noise:
        resuming would repeat steps the accounting counts once) is refused. Nothing changes on
        error."""
        if not isinstance(state, Mapping):
            raise InvalidParameterError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        required = ("format", "fingerprint", "steps_done", "seed", "generator_state", "recurrence", "digest")
        missing = [k for k in required if k not in state]
        if missing:
            raise InvalidParameterError(f"state is missing {missing}; pass the dict state_dict() returned")
        if state["format"] != STATE_FORMAT:
            raise InvalidParameterError(
                f"state has format {state['format']!r}; this dpmf reads format {STATE_FORMAT}"
            )
        saved, mine = state["fingerprint"], self.fingerprint()
        if not isinstance(saved, Mapping):
            raise InvalidParameterError("state['fingerprint'] must be a dict")
        diffs = [k for k in sorted(set(mine) | set(saved)) if saved.get(k) != mine.get(k)]
        if diffs:
            detail = "; ".join(f"{k}: saved {saved.get(k)!r}, this generator {mine.get(k)!r}" for k in diffs)
            raise InvalidParameterError(f"state belongs to another noise generator ({detail})")
        t = state["steps_done"]
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= self.n:
            raise InvalidParameterError(f"state['steps_done'] must be an integer in [0, {self.n}], got {t!r}")
        seed = state["seed"]
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InvalidParameterError(f"state['seed'] must be an integer or None, got {seed!r}")
        gen_state = state["generator_state"]
        gen = None
        if gen_state is not None:
            if not isinstance(gen_state, torch.Tensor) or gen_state.dtype != torch.uint8:
                raise InvalidParameterError("state['generator_state'] must be a uint8 tensor (Generator.get_state())")
            gen = self._generator if self._generator is not None else torch.Generator(device=self.device)
            probe = torch.Generator(device=gen.device)
            try:
                probe.set_state(gen_state.cpu())
            except RuntimeError as exc:
                raise InvalidParameterError(f"state['generator_state'] is not a valid generator state: {exc}") from None
        rec = state["recurrence"]
        if not isinstance(rec, Mapping):
            raise InvalidParameterError("state['recurrence'] must be a dict of tensors")
        apply = self._prepare_recurrence_state(rec, t)
        if state["digest"] != state_digest(saved, t, seed, gen_state, rec):
            raise InvalidParameterError(
                f"the noise state (steps_done={t}) does not match the digest recorded when it was saved: its step "
                "counter, generator state or recurrence state was changed afterwards (e.g. steps_done rewound while "
                "the generator had already produced later noise). Resuming from it would repeat or skip noise steps "
                "the privacy accounting counts once; resume from the state exactly as it was saved"
            )
        # all checks passed: mutate
        if gen is not None:
            gen.set_state(gen_state.cpu())
            self._generator = gen
        apply()
        self._t = t
        self.seed = seed

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n={self.n}, numel={self.numel}, steps_done={self._t}, "
            f"memory_floats={self.memory_floats}, std={self.std:g}, dtype={self.dtype}, device={self.device})"
        )

    # ---- internals ---------------------------------------------------------------------------
    def _check_not_done(self) -> None:
        if self._t >= self.n:
            raise NoiseExhaustedError(
                f"all n={self.n} noise steps have been generated; step {self._t} is not covered by "
                "the strategy (or by its privacy analysis)"
            )

    def _as_input(self, z: object) -> "torch.Tensor":
        shape = self.input_shape()
        try:
            z = torch.as_tensor(z).detach().to(device=self.device, dtype=self.dtype, copy=True)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InvalidParameterError(f"z must be a tensor or array of numbers: {exc}") from None
        if tuple(z.shape) != shape:
            raise InvalidParameterError(f"z must have shape {shape} at step {self._t}, got {tuple(z.shape)}")
        if not bool(torch.isfinite(z).all()):
            raise InvalidParameterError("z must contain only finite numbers (no NaN/inf)")
        return z

    def _normal(self, shape: tuple[int, ...]) -> "torch.Tensor":
        """``std * N(0, I)`` of ``shape`` from the generator (``normal_`` then an in-place scale)."""
        z = torch.empty(shape, device=self.device, dtype=self.dtype)
        z.normal_(generator=self._generator)
        if self.std != 1.0:
            z.mul_(self.std)
        return z

    def _draw_step(self) -> "torch.Tensor":
        return self._step(self._normal(self.input_shape()))

    def _step(self, z: "torch.Tensor") -> "torch.Tensor":  # pragma: no cover - abstract
        raise NotImplementedError

    def _digest(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def _recurrence_state(self) -> dict:
        return {}

    def _prepare_recurrence_state(self, rec: Mapping, t: int):
        """Check ``rec`` (from :meth:`_recurrence_state` of a generator after ``t`` steps) and
        return a function that installs it."""
        self._check_keys(rec, ())
        return lambda: None

    def _check_keys(self, rec: Mapping, keys: tuple[str, ...]) -> None:
        if set(rec) != set(keys):
            raise InvalidParameterError(
                f"state['recurrence'] must have the keys {sorted(keys)}, got {sorted(rec)}"
            )

    def _tensor(self, rec: Mapping, key: str, shape: tuple[int, ...]) -> "torch.Tensor":
        """``rec[key]`` checked to be a float tensor of ``shape``, on this device and dtype."""
        value = rec[key]
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise InvalidParameterError(f"state['recurrence'][{key!r}] must be a float tensor")
        if tuple(value.shape) != tuple(shape):
            raise InvalidParameterError(
                f"state['recurrence'][{key!r}] must have shape {tuple(shape)}, got {tuple(value.shape)}"
            )
        if value.dtype != self.dtype:
            raise InvalidParameterError(
                f"state['recurrence'][{key!r}] has dtype {value.dtype}, this generator {self.dtype}"
            )
        return value.to(self.device)


def unsupported_step(reason: str) -> UnsupportedConfigurationError:
    return UnsupportedConfigurationError(f"step(z) is not available: {reason}")
