"""BandInvMF (banded-inverse Toeplitz strategies): dpmf's optimizer vs jax_privacy's.

* peer: ``jax_privacy.matrix_factorization.toeplitz.optimize_banded_inverse_toeplitz(n, min_sep=n // k,
  num_bands=bands, max_participations=k)`` (float64 via ``jax_enable_x64``; L-BFGS through optax,
  at most 1000 steps, JIT compilation included in the time). **Not in jax-privacy 2.0.0** (the
  ``bench`` extra): it was added on GitHub afterwards (commits c6a951f, 21be2c6). If the installed
  jax_privacy lacks it, the benchmark loads ``toeplitz.py`` from a GitHub checkout named by the
  environment variable ``JAX_PRIVACY_SRC`` (the repository root, or the file itself, e.g. extracted
  with ``git -C jax_privacy show 8967688:jax_privacy/matrix_factorization/toeplitz.py > toeplitz.py``)
  on top of the installed 2.0.0 package (its sibling modules); without it the peer raises.
* dpmf: ``dpmf.strategies.optimize_banded_inverse_toeplitz(n, bands, k, schema=...)`` (unconstrained
  signs, like the peer), for the fixed-epoch schema (its default, the schema the BLT optimizer uses
  and random allocation reuses) and for b-min-sep (``schema="min-sep"``: the peer's majorant
  objective, whose optimum dpmf then compares with the fixed-epoch optimum and a majorant run from it
  by the sensitivity the strategy reports -- the scoring below -- and returns the best).
* agreement: both results are turned into dpmf ``BandInvStrategy`` objects from their noising
  coefficients and scored the same way: RMSE of the ``n`` prefix sums per unit noise multiplier at
  sensitivity 1, with dpmf's sound sensitivity (:meth:`BandInvStrategy.sensitivity_result`) under
  ``FixedEpochParticipation(k, n // k)`` and under ``Participation(k, n // k)`` (b-min-sep), each
  against dpmf's optimum for that schema. Goal: dpmf's RMSE no worse than the peer's
  (ratio dpmf/peer <= 1 + 1e-4). The runner's cases use the fixed-epoch schema.

    python benchmarks/bench_bandinv.py             # every case once, a table with both ratios
    python benchmarks/run.py --only bandinv        # through the runner (medians)
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
from case import Case

from dpmf.strategies import FixedEpochParticipation, Participation
from dpmf.strategies.bandinv import BandInvStrategy, optimize_banded_inverse_toeplitz

_GITHUB_NAME = "jax_privacy.matrix_factorization._toeplitz_github"


def _peer_module():
    import jax

    jax.config.update("jax_enable_x64", True)
    from jax_privacy.matrix_factorization import toeplitz

    if hasattr(toeplitz, "optimize_banded_inverse_toeplitz"):
        return toeplitz
    if _GITHUB_NAME in sys.modules:
        return sys.modules[_GITHUB_NAME]
    src = os.environ.get("JAX_PRIVACY_SRC")
    if not src:
        raise RuntimeError(
            "the installed jax_privacy has no optimize_banded_inverse_toeplitz (it is on GitHub after 2.0.0); "
            "set JAX_PRIVACY_SRC to a jax_privacy checkout or to its matrix_factorization/toeplitz.py"
        )
    path = Path(src)
    if path.is_dir():
        path = path / "jax_privacy" / "matrix_factorization" / "toeplitz.py"
    spec = importlib.util.spec_from_file_location(_GITHUB_NAME, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_GITHUB_NAME] = module
    spec.loader.exec_module(module)
    return module


def _peer(n: int, bands: int, epochs: int):
    def run():
        toeplitz = _peer_module()
        g = toeplitz.optimize_banded_inverse_toeplitz(n, n // epochs, bands, max_participations=epochs)
        return np.asarray(g, dtype=np.float64)

    return run


def _dpmf(n: int, bands: int, epochs: int, schema: str = "fixed-epoch"):
    def run():
        return optimize_banded_inverse_toeplitz(n, bands, epochs, schema=schema)

    return run


def score(noising_coefs, n: int, epochs: int, schema: str = "fixed-epoch") -> tuple[float, bool, bool]:
    """(RMSE at sensitivity 1, sensitivity exact?, C >= 0?) of C = Toeplitz(noising_coefs)^-1."""
    s = BandInvStrategy.from_noising_coefficients(noising_coefs, n)
    part = (FixedEpochParticipation if schema == "fixed-epoch" else Participation)(epochs, n // epochs)
    sens = s.sensitivity_result(part)
    rmse = sens.sensitivity * math.sqrt(float(np.mean(s.per_query_error())))
    return rmse, bool(sens.exact), s.nonnegative


def _compare(n: int, epochs: int):
    def compare(peer_g, ours) -> tuple[bool, str]:
        peer_rmse, peer_exact, peer_nonneg = score(peer_g, n, epochs)
        our_rmse, our_exact, our_nonneg = score(ours.inverse_coefs, n, epochs)
        ratio = our_rmse / peer_rmse
        return ratio <= 1 + 1e-4, (
            f"RMSE dpmf {our_rmse:.6f} vs peer {peer_rmse:.6f}, dpmf/peer {ratio:.5f}; sensitivity exact "
            f"{our_exact}/{peer_exact}; C >= 0 {our_nonneg}/{peer_nonneg}"
        )

    return compare


SETTINGS = [  # (n, bands, epochs, slow)
    (100, 4, 1, False),  # paper 002, Fig. 3 f
    (1000, 4, 10, False),
    (1000, 16, 1, True),
    (1000, 64, 10, True),
    (2000, 32, 4, True),
]

CASES = [
    Case(
        name=f"bandinv_n{n}_b{bands}_k{k}",
        peer=_peer(n, bands, k),
        dpmf=_dpmf(n, bands, k),
        compare=_compare(n, k),
        tolerance="dpmf's RMSE at sensitivity 1 no worse than the peer's (dpmf/peer <= 1 + 1e-4), same sound scoring",
        peer_name="jax_privacy",
        slow=slow,
    )
    for n, bands, k, slow in SETTINGS
]


def main() -> None:
    rows = ["| n | bands | epochs | schema | RMSE dpmf | RMSE peer | dpmf/peer RMSE | sens. exact (dpmf/peer) | "
            "C >= 0 (dpmf/peer) | dpmf s | peer s | peer/dpmf time |",
            "|---:|---:|---:|---|---:|---:|---:|---|---|---:|---:|---:|"]
    for n, bands, k, _ in SETTINGS:
        t0 = time.perf_counter()
        peer_g = _peer(n, bands, k)()
        peer_s = time.perf_counter() - t0
        for schema in ("fixed-epoch", "min-sep"):
            t0 = time.perf_counter()
            ours = _dpmf(n, bands, k, schema)()
            our_s = time.perf_counter() - t0
            our_rmse, our_exact, our_nonneg = score(ours.inverse_coefs, n, k, schema)
            peer_rmse, peer_exact, peer_nonneg = score(peer_g, n, k, schema)
            rows.append(f"| {n} | {bands} | {k} | {schema} | {our_rmse:.5f} | {peer_rmse:.5f} | "
                        f"{our_rmse / peer_rmse:.5f} | {our_exact}/{peer_exact} | {our_nonneg}/{peer_nonneg} | "
                        f"{our_s:.2f} | {peer_s:.1f} | {peer_s / our_s:.0f}x |")
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
