"""Optimal multi-epoch dense strategies: (k, b) fixed-epoch order, prefix-sum workload.

* ``dense_n128_k2``: n = 128 steps, 2 epochs (b = 64); ``dense_n512_k4``: n = 512, 4 epochs
  (b = 128; slow: the peer takes minutes on 2 cores).
* peer: ``jax_privacy.matrix_factorization.dense.optimize(n, epochs=k)`` (float64 via
  ``jax_enable_x64``; projected L-BFGS on X with the orthogonality mask, default stopping rule
  max |projected gradient| <= 1e-3, JIT compilation included in the time);
* dpmf: ``dpmf.strategies.optimal.optimal_multi_epoch_gram(n, k)`` (Newton on the Lagrange dual,
  default constraints "nonneg" = the paper's Eq. 35, stops at relative duality gap 1e-6).
* agreement: the RMSE of the n prefix sums per unit noise multiplier, computed the same way for both
  strategies from C alone (decoder ``A C^{-1}``; sensitivity = max over the b residue classes of the
  sum of ``|C^T C|`` over the class, jax_privacy's ``fixed_epoch_sensitivity``), agrees within
  0.5%; dpmf's strategy has sensitivity 1 within 1e-9.
"""

from __future__ import annotations

import math

import numpy as np
from case import Case

from dpmf.strategies.optimal import optimal_multi_epoch_gram


def _rmse(C: np.ndarray, epochs: int) -> tuple[float, float]:
    """(RMSE per unit sigma of the prefix sums, sensitivity) of the strategy C."""
    C = np.asarray(C, dtype=np.float64)
    n = C.shape[0]
    b = n // epochs
    B = np.linalg.solve(C.T, np.tri(n).T).T
    X = np.abs(C.T @ C).reshape(epochs, b, epochs, b)
    sens = math.sqrt(float(np.einsum("iajb->ab", X).diagonal().max()))
    return sens * math.sqrt(float(np.mean(np.sum(B * B, axis=1)))), sens


def _peer(n: int, epochs: int):
    def run():
        import jax

        jax.config.update("jax_enable_x64", True)
        from jax_privacy.matrix_factorization import dense

        return np.asarray(dense.optimize(n, epochs=epochs))

    return run


def _dpmf(n: int, epochs: int):
    def run():
        return optimal_multi_epoch_gram(n, epochs)

    return run


def _compare(epochs: int):
    def compare(peer_C, result) -> tuple[bool, str]:
        peer_rmse, peer_sens = _rmse(peer_C, epochs)
        ours, sens = _rmse(result.C, epochs)
        rel = ours / peer_rmse - 1
        ok = abs(rel) <= 5e-3 and abs(sens - 1) <= 1e-9 and result.converged
        return ok, (
            f"RMSE dpmf={ours:.5f} (sens {sens:.10f}, rel. gap {result.rel_gap:.1e}, "
            f"{result.iterations} Newton it.) peer={peer_rmse:.5f} (sens {peer_sens:.6f}); rel. diff {rel:+.1e}"
        )

    return compare


CASES = [
    Case(
        name="dense_n128_k2",
        peer=_peer(128, 2),
        dpmf=_dpmf(128, 2),
        compare=_compare(2),
        tolerance="RMSE within 0.5%, dpmf sensitivity 1 +- 1e-9, dpmf converged",
        peer_name="jax_privacy",
    ),
    Case(
        name="dense_n512_k4",
        peer=_peer(512, 4),
        dpmf=_dpmf(512, 4),
        compare=_compare(4),
        tolerance="RMSE within 0.5%, dpmf sensitivity 1 +- 1e-9, dpmf converged",
        peer_name="jax_privacy",
        slow=True,
    ),
]
