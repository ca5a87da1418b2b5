"""Structured (banded Toeplitz, BLT) strategies and streaming correlated noise vs jax_privacy.

* ``banded_toeplitz_n4096_b64``: peer ``toeplitz.optimize_banded_toeplitz(4096, bands=64)``,
  dpmf ``dpmf.strategies.banded.optimize_banded_toeplitz(4096, 64)``; agreement: prefix-sum RMSE
  per unit sigma of the unit-L2-norm coefficients, dpmf <= peer * 1.005.
* ``blt_n128_minsep64`` (slow: the peer takes ~45 s): peer
  ``buffered_toeplitz.optimize(n=128, min_sep=64, max_participations=2, error='mean')``, dpmf
  ``dpmf.strategies.blt.optimize_blt(128, 2, 2)``; agreement: sensitivity under
  ``FixedEpochParticipation(2, 64)`` times prefix-sum RMSE, dpmf <= peer * 1.005.
* ``streaming_noise_1e6_blt`` / ``streaming_noise_1e6_toeplitz16``: 32 steps of correlated noise
  for d = 10^6 parameters. Peer: ``noise_addition.matrix_factorization_privatizer`` on the
  streaming C^{-1} (``BufferedToeplitz.inverse_as_streaming_matrix()`` /
  ``toeplitz.inverse_as_streaming_matrix(coef)``), ``jax.jit(priv.update)`` applied 32 times to
  float32 zero gradients (x64 enabled, so the noise state is float64; as in the notes' B.3
  measurement). The jitted update is built and compiled once per process and cached, so only the
  first repeat's peer time includes JIT compilation; the reported median of >= 3 repeats excludes
  it. dpmf: ``BLT(...).streaming_noise(10**6, rng)`` / ``ToeplitzNoise(strategy, 10**6, rng=...)``
  calling ``next()`` 32 times (float64). Agreement: both outputs have shape (10^6,) and the
  empirical per-coordinate variance of step 32 is within 2% of the exact ``(C^{-1} C^{-T})[31, 31]``
  (dense inverse of the leading 32 x 32 block of each side's own encoder).
  dpmf draws with numpy's default generator (PCG64, ``np.random.default_rng(0)``); the draw and
  the buffer updates are fused chunk by chunk. ``..._sfc64`` runs the same dpmf code with
  ``np.random.Generator(np.random.SFC64(0))``, a faster bit generator a user may pass.
* ``streaming_noise_1e6_bandmf16``: 32 steps for d = 10^6 with the column-normalized 16-band
  BandMF encoder ``banded.ColumnNormalizedBanded.default(128, 16)``: peer its
  ``inverse_as_streaming_matrix()`` privatizer as above, dpmf
  ``DenseStrategy(C).streaming_noise(10**6, rng)`` on the same (materialized) ``C`` (forward
  substitution keeping 15 past outputs).
"""

from __future__ import annotations

import numpy as np
from case import Case

from dpmf.strategies import DenseStrategy, FixedEpochParticipation, ToeplitzNoise, ToeplitzStrategy
from dpmf.strategies.banded import optimize_banded_toeplitz
from dpmf.strategies.blt import BLT, optimize_blt
from dpmf.strategies.toeplitz import materialize_lower_toeplitz

DIM = 10**6
STEPS = 32
BUF_DECAY = [0.9595671206493162, 0.5045255271836953]
OUTPUT_SCALE = [0.28538257759252805, 0.22240689948791612]


def _x64():
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


# ----------------------------------------------------------------------------- optimizers


def _unit_rmse(coefs, n: int) -> float:
    c = np.asarray(coefs, dtype=np.float64)
    return ToeplitzStrategy(c / np.linalg.norm(c), n).prefix_sum_rmse()


def _peer_banded(n: int, bands: int):
    def run():
        _x64()
        from jax_privacy.matrix_factorization import toeplitz

        return np.asarray(toeplitz.optimize_banded_toeplitz(n, bands=bands))

    return run


def _compare_banded(n: int):
    def compare(peer_coefs, strategy) -> tuple[bool, str]:
        peer = _unit_rmse(peer_coefs, n)
        ours = _unit_rmse(strategy.coefs, n)
        rel = ours / peer - 1
        return ours <= peer * 1.005, f"RMSE dpmf={ours:.6f} peer={peer:.6f}; rel. diff {rel:+.1e}"

    return compare


def _peer_blt(n: int, min_sep: int, k: int):
    def run():
        _x64()
        from jax_privacy.matrix_factorization import buffered_toeplitz

        blt = buffered_toeplitz.optimize(n=n, min_sep=min_sep, max_participations=k, error="mean")
        return np.asarray(blt.toeplitz_coefs(n)), int(np.asarray(blt.buf_decay).size)

    return run


def _compare_blt(n: int, epochs: int):
    part = FixedEpochParticipation(epochs, n // epochs)

    def rmse(coefs) -> tuple[float, float]:
        s = ToeplitzStrategy(np.asarray(coefs, dtype=np.float64), n)
        sens = s.sensitivity(part)
        return sens * s.prefix_sum_rmse(), sens

    def compare(peer_result, result) -> tuple[bool, str]:
        peer_coefs, peer_buffers = peer_result
        blt, _ = result
        peer, peer_sens = rmse(peer_coefs)
        ours, sens = rmse(blt.toeplitz_coefs(n))
        rel = ours / peer - 1
        return ours <= peer * 1.005, (
            f"RMSE* dpmf={ours:.5f} (sens {sens:.4f}, {blt.num_buffers} buffers) "
            f"peer={peer:.5f} (sens {peer_sens:.4f}, {peer_buffers} buffers); rel. diff {rel:+.1e}"
        )

    return compare


# ----------------------------------------------------------------------------- streaming noise

_PEER_CACHE: dict = {}


def _peer_noise(kind: str):
    def build():
        jax = _x64()
        import jax.numpy as jnp
        from jax_privacy import noise_addition as na
        from jax_privacy.matrix_factorization import banded, buffered_toeplitz, toeplitz

        if kind == "blt":
            blt = buffered_toeplitz.BufferedToeplitz.build(buf_decay=BUF_DECAY, output_scale=OUTPUT_SCALE)
            M = blt.inverse_as_streaming_matrix()
            coefs = materialize_lower_toeplitz(np.asarray(blt.toeplitz_coefs(STEPS)), STEPS)
        elif kind == "bandmf16":
            cnb = banded.ColumnNormalizedBanded.default(128, 16)
            M = cnb.inverse_as_streaming_matrix()
            coefs = np.asarray(cnb.materialize())[:STEPS, :STEPS]
        else:
            coef = toeplitz.optimize_banded_toeplitz(128, bands=16)
            M = toeplitz.inverse_as_streaming_matrix(coef)
            coefs = materialize_lower_toeplitz(np.asarray(coef)[:STEPS], STEPS)
        priv = na.matrix_factorization_privatizer(M, stddev=1.0, prng_key=0)
        params = jnp.zeros((DIM,), jnp.float32)
        upd = jax.jit(priv.update)
        # warm-up: compile once (this happens inside the first timed peer call only)
        u, _ = upd(params, priv.init(params), params)
        jax.block_until_ready(u)
        return jax, priv, upd, params, coefs

    def run():
        if kind not in _PEER_CACHE:
            _PEER_CACHE[kind] = build()
        jax, priv, upd, params, coefs = _PEER_CACHE[kind]
        state = priv.init(params)
        for _ in range(STEPS):
            u, state = upd(params, state, params)
        jax.block_until_ready(u)
        return np.asarray(u), coefs

    return run


def _generator(bitgen: str) -> np.random.Generator:
    return np.random.default_rng(0) if bitgen == "pcg64" else np.random.Generator(np.random.SFC64(0))


def _dpmf_blt_noise(bitgen: str = "pcg64"):
    blt = BLT(BUF_DECAY, OUTPUT_SCALE)
    C = materialize_lower_toeplitz(blt.toeplitz_coefs(STEPS), STEPS)

    def run():
        noise = blt.streaming_noise(DIM, rng=_generator(bitgen))
        for _ in range(STEPS):
            w = next(noise)
        return w, C

    return run


def _dpmf_toeplitz_noise(bitgen: str = "pcg64"):
    strategy = ToeplitzStrategy(optimize_banded_toeplitz(128, 16).coefs, 128)
    C = materialize_lower_toeplitz(strategy.coefs[:STEPS], STEPS)

    def run():
        noise = ToeplitzNoise(strategy, DIM, rng=_generator(bitgen))
        for _ in range(STEPS):
            w = next(noise)
        return w, C

    return run


def _dpmf_bandmf_noise(bitgen: str = "pcg64"):
    cache: dict = {}

    def run():
        if "s" not in cache:  # the same C as the peer (its default 16-band column-normalized start)
            _x64()
            from jax_privacy.matrix_factorization import banded

            cache["s"] = DenseStrategy(np.asarray(banded.ColumnNormalizedBanded.default(128, 16).materialize()))
        strategy = cache["s"]
        noise = strategy.streaming_noise(DIM, rng=_generator(bitgen))
        for _ in range(STEPS):
            w = next(noise)
        return w, strategy.C[:STEPS, :STEPS]

    return run


def _exact_var(C) -> float:
    Cinv = np.linalg.inv(np.asarray(C, dtype=np.float64))
    return float((Cinv @ Cinv.T)[STEPS - 1, STEPS - 1])


def _compare_noise(peer_result, result) -> tuple[bool, str]:
    ok = True
    parts = []
    for who, (w, coefs) in (("dpmf", result), ("peer", peer_result)):
        w = np.asarray(w, dtype=np.float64)
        exact = _exact_var(coefs)
        emp = float(np.var(w))
        rel = emp / exact - 1
        ok &= w.shape == (DIM,) and abs(rel) <= 0.02
        parts.append(f"{who} var {emp:.4f} vs exact {exact:.4f} ({rel:+.1e}, shape {w.shape})")
    return ok, "; ".join(parts)


_NOISE_TOL = "shapes (10^6,); step-32 empirical variance within 2% of exact (C^-1 C^-T)[31,31], both"

CASES = [
    Case(
        name="banded_toeplitz_n4096_b64",
        peer=_peer_banded(4096, 64),
        dpmf=lambda: optimize_banded_toeplitz(4096, 64),
        compare=_compare_banded(4096),
        tolerance="unit-norm prefix-sum RMSE: dpmf <= peer * 1.005",
        peer_name="jax_privacy",
    ),
    Case(
        name="blt_n128_minsep64",
        peer=_peer_blt(128, 64, 2),
        dpmf=lambda: optimize_blt(128, 2, 2),
        compare=_compare_blt(128, 2),
        tolerance="sens(FixedEpoch(2, 64)) * prefix-sum RMSE: dpmf <= peer * 1.005",
        peer_name="jax_privacy",
        slow=True,
    ),
    Case(
        name="streaming_noise_1e6_blt",
        peer=_peer_noise("blt"),
        dpmf=_dpmf_blt_noise(),
        compare=_compare_noise,
        tolerance=_NOISE_TOL,
        peer_name="jax_privacy",
    ),
    Case(
        name="streaming_noise_1e6_blt_sfc64",
        peer=_peer_noise("blt"),
        dpmf=_dpmf_blt_noise("sfc64"),
        compare=_compare_noise,
        tolerance=_NOISE_TOL,
        peer_name="jax_privacy",
    ),
    Case(
        name="streaming_noise_1e6_toeplitz16",
        peer=_peer_noise("toeplitz16"),
        dpmf=_dpmf_toeplitz_noise(),
        compare=_compare_noise,
        tolerance=_NOISE_TOL,
        peer_name="jax_privacy",
    ),
    Case(
        name="streaming_noise_1e6_bandmf16",
        peer=_peer_noise("bandmf16"),
        dpmf=_dpmf_bandmf_noise(),
        compare=_compare_noise,
        tolerance=_NOISE_TOL,
        peer_name="jax_privacy",
    ),
]
