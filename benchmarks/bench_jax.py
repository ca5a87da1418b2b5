"""The JAX bridge: dpmf's calibrated sigma beside jax_privacy's own accounting on one configuration.

Both sides read the same jax_privacy objects (``dpmf.training.jax.config``): a batch selection and a
strategy. The peer is ``jax_privacy.accounting.calibrate.calibrate_noise_multiplier`` with a
``DpsgdTrainingAccountant`` (PLD; tolerance 1e-5 in sigma), the reduction jax_privacy applies to
DP-SGD and to BandMF under cyclic Poisson sampling with ``bands <= cycle_length`` (Choquette-Choo et
al. 2023); dpmf is ``dpmf.calibrate`` on the converted strategy and scheme (``auto``: PLD for DP-SGD,
MMCC for BandMF; 1e-4 relative), a certified sigma. The ratio dpmf / jax_privacy is the noise dpmf
needs for the same (epsilon, delta) relative to jax_privacy: 1 where both are the same analysis.

* ``dpsgd``: 60,000 examples, Poisson q = 0.01 (batch 600), T = 1000, epsilon 2, delta 1e-5.
* ``bandmf``: ``ColumnNormalizedBanded.default(500, 4)`` (4 bands, unit columns), cyclic Poisson with
  cycle 4 and q = 0.04 (batch 600 of each group of 15,000), T = 500, epsilon 2, delta 1e-5.

agreement: the two sigmas within 0.1% (same analysis).

    python benchmarks/bench_jax.py                  # both configurations once, a table with the ratio
    python benchmarks/run.py --only jax             # through the runner (medians of the times)
"""

from __future__ import annotations

import time

from case import Case
from jax_privacy import batch_selection as bs
from jax_privacy.matrix_factorization import banded

from dpmf.training.jax.config import calibrate_jax_privacy, jax_privacy_noise_multiplier

M, EPS, DELTA = 60_000, 2.0, 1e-5

CONFIGS = {
    "dpsgd": (None, bs.CyclicPoissonSampling(sampling_prob=0.01, iterations=1000)),
    "bandmf": (banded.ColumnNormalizedBanded.default(500, 4),
               bs.CyclicPoissonSampling(sampling_prob=0.04, iterations=500, cycle_length=4)),
}


def _peer(name):
    strategy, selection = CONFIGS[name]
    return lambda: jax_privacy_noise_multiplier(strategy, selection, EPS, DELTA, num_examples=M)


def _dpmf(name):
    strategy, selection = CONFIGS[name]
    return lambda: calibrate_jax_privacy(strategy, selection, EPS, DELTA, num_examples=M)


def _compare(peer: float, ours) -> tuple[bool, str]:
    ratio = ours.noise_multiplier / peer
    return abs(ratio - 1) <= 1e-3, (f"sigma dpmf={ours.noise_multiplier:.6f} ({ours.report.method}) "
                                    f"jax_privacy={peer:.6f} ratio={ratio:.6f}")


CASES = [
    Case(f"jax_bridge_{name}_sigma", _peer(name), _dpmf(name), _compare,
         "calibrated sigmas within 0.1% (the same analysis)", peer_name="jax_privacy", slow=name == "bandmf")
    for name in CONFIGS
]


def main() -> None:
    print("| configuration | dpmf sigma (method) | jax_privacy sigma | ratio dpmf/jax_privacy | dpmf s | jax_privacy s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in CONFIGS:
        t = time.perf_counter()
        ours = _dpmf(name)()
        t_ours = time.perf_counter() - t
        t = time.perf_counter()
        peer = _peer(name)()
        t_peer = time.perf_counter() - t
        print(f"| {name} | {ours.noise_multiplier:.6f} ({ours.report.method}) | {peer:.6f} | "
              f"{ours.noise_multiplier / peer:.6f} | {t_ours:.0f} | {t_peer:.0f} |", flush=True)


if __name__ == "__main__":
    main()
