"""The ``torch.Generator`` behind the torch noise generators: an explicit seed, the caller's own
generator, or a secure (OS-entropy) initial state. DESIGN.md: randomness is always explicit; a
secure mode draws its seeds from the OS and never reuses them.

What "secure" means here, honestly:

* torch's CPU generator is a Mersenne Twister (mt19937). It is **not** a cryptographically secure
  generator: its state can be recovered from 624 consecutive outputs. ``secure=True`` makes the
  *initial state* unpredictable, not the stream cryptographically strong. (Opacus' secure mode
  draws from ``torchcsprng`` for that; dpmf does not depend on it.)
* ``torch.Generator.manual_seed`` on the CPU keeps only the low 32 bits of the seed (seeds ``s``
  and ``s + 2**32`` give the same stream; checked with torch 2.13.0), so a seed drawn from the OS
  would carry 32 bits of entropy and two secure runs would share a stream after about ``2**16``
  runs (birthday bound). Secure mode therefore fills the whole mt19937 state (624 words, 19,937
  bits) from :func:`os.urandom` after checking that torch's state layout is the one we expect;
  it refuses (``UnsupportedConfigurationError``) rather than fall back to a 32-bit seed.
* On CUDA (Philox) the state is a 64-bit seed and an offset; secure mode seeds it with 64 bits
  from :mod:`secrets`.
* A fresh secure state is drawn for every generator and never reused. A checkpoint of a secure
  run must still carry the generator state (that is the only way to resume bit for bit), so such
  a checkpoint is as secret as the noise itself.
"""

from __future__ import annotations

import os
import secrets
import struct

import numpy as np

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.training.torch._deps import require_torch

torch = require_torch()

__all__ = ["make_generator", "secure_generator"]

# torch's CPU generator state (CPUGeneratorImplState, aten/src/ATen/CPUGeneratorImpl.cpp):
# uint64 the_initial_seed, int32 left, int32 seeded, uint64 next, uint64 state[624], then the
# cached normal samples. mt19937 draws a fresh block (a "twist") when ``left`` reaches 0 after a
# decrement, so ``left = 1, next = 0`` makes the first draw twist the state we wrote.
_CPU_STATE_BYTES = 5056
_MT_WORDS = 624
_OFF_SEED, _OFF_LEFT, _OFF_SEEDED, _OFF_NEXT, _OFF_STATE = 0, 8, 12, 16, 24


def _check_seed(seed: object) -> int:
    if isinstance(seed, np.integer):
        seed = int(seed)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise InvalidParameterError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return seed


def _secure_cpu_generator() -> "torch.Generator":
    gen = torch.Generator(device="cpu")
    seed = secrets.randbits(64)
    gen.manual_seed(seed)
    raw = bytearray(gen.get_state().numpy().tobytes())
    # check the layout before writing into it: the fields must be those manual_seed just wrote
    layout_ok = (
        len(raw) == _CPU_STATE_BYTES
        and struct.unpack_from("<Q", raw, _OFF_SEED)[0] == seed
        and struct.unpack_from("<i", raw, _OFF_LEFT)[0] == 1
        and struct.unpack_from("<i", raw, _OFF_SEEDED)[0] == 1
        and struct.unpack_from("<Q", raw, _OFF_NEXT)[0] == 0
        and struct.unpack_from("<Q", raw, _OFF_STATE)[0] == seed & 0xFFFFFFFF
    )
    if not layout_ok:
        raise UnsupportedConfigurationError(
            f"secure=True cannot seed the whole mt19937 state: torch {torch.__version__} changed the "
            "layout of its CPU generator state (a 64-bit seed would carry only 32 bits of entropy); "
            "pass an explicit seed instead, or use torch==2.13.0"
        )
    while True:
        words = struct.unpack(f"<{_MT_WORDS}I", os.urandom(4 * _MT_WORDS))
        if any(words[1:]) or words[0] & 0x80000000:  # the all-zero mt19937 state is degenerate
            break
    struct.pack_into(f"<{_MT_WORDS}Q", raw, _OFF_STATE, *words)
    struct.pack_into("<i", raw, _OFF_LEFT, 1)
    struct.pack_into("<Q", raw, _OFF_NEXT, 0)
    state = torch.frombuffer(raw, dtype=torch.uint8).clone()
    gen.set_state(state)
    if not torch.equal(gen.get_state(), state):
        raise UnsupportedConfigurationError(
            "secure=True: torch did not keep the OS-entropy generator state it was given; pass an "
            "explicit seed instead"
        )
    return gen


def secure_generator(device: object = "cpu") -> "torch.Generator":
    """A new ``torch.Generator`` on ``device`` whose whole initial state comes from the OS
    (module docstring: an unpredictable start, not a cryptographically secure stream)."""
    device = torch.device(device)
    if device.type == "cpu":
        return _secure_cpu_generator()
    gen = torch.Generator(device=device)
    gen.manual_seed(secrets.randbits(64))
    return gen


def make_generator(
    *, seed: object = None, generator: object = None, secure: bool = False, device: object = "cpu"
) -> tuple["torch.Generator | None", int | None]:
    """``(generator, seed)`` from at most one of ``seed`` (an int: reproducible),
    ``generator`` (the caller's ``torch.Generator``, used and advanced in place) and
    ``secure=True`` (:func:`secure_generator`). An integer seed lies in ``[0, 2**64)``; torch's CPU
    generator uses only its low 32 bits (module docstring). With none of them the result is ``(None, None)``:
    the caller feeds ``z`` itself (dpmf never draws hidden seeds). The recorded seed is ``None``
    unless an integer seed was given."""
    if not isinstance(secure, bool):
        raise InvalidParameterError(f"secure must be True or False, got {secure!r}")
    given = [name for name, v in (("seed", seed), ("generator", generator)) if v is not None]
    if secure:
        given.append("secure=True")
    if len(given) > 1:
        raise InvalidParameterError(
            f"pass at most one of seed, generator and secure=True, got {' and '.join(given)}"
        )
    device = torch.device(device)
    if secure:
        return secure_generator(device), None
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise InvalidParameterError(
                f"generator must be a torch.Generator, got {type(generator).__name__}"
            )
        if generator.device.type != device.type:
            raise InvalidParameterError(
                f"generator must live on the noise device {device}, got a generator on {generator.device}"
            )
        return generator, None
    if seed is not None:
        seed = _check_seed(seed)
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        return gen, seed
    return None, None
