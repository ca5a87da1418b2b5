"""Monte Carlo privacy-loss samplers vs jax_privacy (``experimental.monte_carlo.sample_generation``).

Both sides draw the same number of privacy-loss samples of the same dominating pair (same banded
Toeplitz ``C``, same sigma, same scheme) and the timed call returns ``(losses, cpu_seconds)``:
``cpu_seconds`` is the process CPU time of the call (all threads), so ``samples / cpu_seconds`` is
the throughput *per core*; BLAS is also pinned to one thread for the calls. The runner's wall
ratio and the CPU ratio printed in the detail should agree on an idle machine.

Peer: ``sample_generation.get_privacy_loss_sample(strategy, 1.0, c_col, seed, positive_sample,
num_samples)`` with ``batch_selection.BMinSepSampling(p, n, b, warm_start=True)`` or
``BallsInBinsSampling(n, T)``. dpmf: ``dpmf.accounting.montecarlo.losses.privacy_loss_samples``
with ``MinSepSampling(p, n, b, warm_start=True)`` / ``BallsInBinsSampling`` (default compiled
backend; a 2-sample call first loads the cached numba kernels, which are compiled once per
install, ~3 s, and not timed).

Cases (unit-norm coefficients, sigma = 1, warm start, remove direction unless noted):

* ``mc_bminsep_n128_b64_p1``: the setting of notes/peer-libraries.md Sec. B.6 (64-band Toeplitz
  from ``optimize_banded_toeplitz(128, 64)``, ``p = 1``, which is balls-in-bins with ``T = 64``),
  20,000 samples; the notes measured 24 us/sample for the peer and delta = 9.4e-2 / 1.14e-2 /
  6.0e-4 at eps = 1 / 2 / 3 (20,000 samples, their run of the same optimizer).
* ``mc_balls_in_bins_n128_t64``: the same pair through the peer's balls-in-bins sampler (341
  us/sample in the notes), 2,000 samples.
* ``mc_bminsep_n128_b64_p0.3``: as above with ``p = 0.3`` (the dynamic program runs), 20,000.
* ``mc_bminsep_n1024_b32``: 32 bands of the banded square root ``bsr(1024, 32)``, ``p = 1/33``
  (``p0 = 1/64``), 5,000 samples; ``..._add``: the add direction.
* ``mc_bminsep_n7200_b256`` (slow): 256 bands of ``bsr(7200, 256)``, the production rate
  ``p0 = 1793 / 14,745,600`` (``p = 1.2549e-4``) and a production-like ``sigma = 0.5`` (at
  sigma = 1 no loss exceeds 1 and the delta check would be vacuous), 1,000 samples.

Agreement (the samplers are independent): for eps in {1, 2, 3} (and the mean loss) the two
estimates differ by at most 4.5 combined standard errors, ``|a - b| <= 4.5 sqrt(se_a^2 + se_b^2)``.
"""

from __future__ import annotations

import ctypes
import math
import time
import warnings

import numpy as np
from case import Case

from dpmf.accounting.montecarlo.losses import privacy_loss_samples
from dpmf.sampling import BallsInBinsSampling, MinSepSampling
from dpmf.strategies import ToeplitzStrategy, bsr, optimize_banded_toeplitz

try:  # imported here so that the (multi-second) import is not timed as part of the peer's call
    from jax_privacy import batch_selection as _bs
    from jax_privacy.experimental.monte_carlo import sample_generation as _sg
except ImportError:  # the `bench` extra is missing: the peer calls raise
    _bs = _sg = None

EPSILONS = (1.0, 2.0, 3.0)
SIGMA = 1.0
_COEFS: dict = {}


def _blas_one_thread() -> None:
    """Pin the OpenBLAS libraries of numpy and scipy to one thread (per-core throughput)."""
    try:
        maps = open("/proc/self/maps").read().splitlines()
    except OSError:
        return
    for path in {line.split()[-1] for line in maps if "openblas" in line.lower()}:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(1)
                break


def _coefs(kind: str, n: int, bands: int) -> np.ndarray:
    key = (kind, n, bands)
    if key not in _COEFS:
        c = np.asarray((optimize_banded_toeplitz(n, bands) if kind == "opt" else bsr(n, bands)).coefs, dtype=np.float64)
        c = np.abs(c[:bands])  # both constructions are non-negative; abs guards -0.0
        _COEFS[key] = c / np.linalg.norm(c)
    return _COEFS[key]


def _timed(fn):
    _blas_one_thread()
    start = time.process_time()
    out = fn()
    return np.asarray(out, dtype=np.float64), time.process_time() - start


def _peer(kind, n, bands, p, samples, direction="remove", bib=False, sigma=SIGMA):
    def run():
        if _sg is None:
            raise RuntimeError("jax_privacy is not installed (pip install -e '.[bench]')")
        bs, sg = _bs, _sg
        c = _coefs(kind, n, bands)
        if bib:
            strategy = bs.BallsInBinsSampling(iterations=n, cycle_length=bands)
        else:
            strategy = bs.BMinSepSampling(sampling_prob=p, iterations=n, min_sep=bands, warm_start=True)

        def draw():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # log(1 - p) = -inf at p = 1
                losses, _ = sg.get_privacy_loss_sample(
                    strategy, sigma, c, seed=12345, positive_sample=direction == "remove", num_samples=samples
                )
            return losses

        return _timed(draw)

    return run


def _dpmf(kind, n, bands, p, samples, direction="remove", bib=False, sigma=SIGMA):
    def run():
        c = _coefs(kind, n, bands)
        strategy = ToeplitzStrategy(c, n)
        scheme = BallsInBinsSampling(n // bands, n) if bib else MinSepSampling(p, n, bands, warm_start=True)
        # load (or, on a fresh install, compile once) the numba kernels outside the timed call
        privacy_loss_samples(strategy, scheme, sigma, 2, np.random.default_rng(0), direction=direction)
        return _timed(
            lambda: privacy_loss_samples(strategy, scheme, sigma, samples, np.random.default_rng(2026), direction=direction)
        )

    return run


def _stats(L: np.ndarray, eps: float) -> tuple[float, float]:
    v = -np.expm1(np.minimum(eps - L, 0.0))
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.size))


def _compare(peer_result, dpmf_result) -> tuple[bool, str]:
    (Lp, tp), (Ld, td) = peer_result, dpmf_result
    if min(_stats(Lp, EPSILONS[0])[0], _stats(Ld, EPSILONS[0])[0]) == 0:
        raise AssertionError("no sample above eps = 1: the delta comparison would be vacuous")
    ok = Lp.shape == Ld.shape and np.all(~np.isnan(Ld))
    parts = []
    for eps in EPSILONS:
        (a, sa), (b, sb) = _stats(Lp, eps), _stats(Ld, eps)
        se = math.hypot(sa, sb)
        z = 0.0 if se == 0 else (b - a) / se
        ok &= abs(z) <= 4.5
        parts.append(f"eps={eps:g}: {b:.3g} vs {a:.3g} (z={z:+.1f})")
    fin_p, fin_d = Lp[np.isfinite(Lp)], Ld[np.isfinite(Ld)]
    se = math.hypot(fin_p.std() / math.sqrt(fin_p.size), fin_d.std() / math.sqrt(fin_d.size))
    zm = (fin_d.mean() - fin_p.mean()) / se
    ok &= abs(zm) <= 4.5
    us_p, us_d = tp / Lp.size * 1e6, td / Ld.size * 1e6
    return bool(ok), (
        f"delta dpmf vs peer: {'; '.join(parts)}; mean loss z={zm:+.1f}; "
        f"CPU us/sample peer={us_p:.1f} dpmf={us_d:.2f} ({us_p / us_d:.1f}x per core)"
    )


def _case(name, kind, n, bands, p, samples, *, direction="remove", bib=False, slow=False, sigma=SIGMA) -> Case:
    return Case(
        name=name,
        peer=_peer(kind, n, bands, p, samples, direction, bib, sigma),
        dpmf=_dpmf(kind, n, bands, p, samples, direction, bib, sigma),
        compare=_compare,
        tolerance="delta(eps=1,2,3) and mean loss within 4.5 combined MC standard errors",
        peer_name="jax_privacy",
        slow=slow,
    )


CASES = [
    _case("mc_bminsep_n128_b64_p1", "opt", 128, 64, 1.0, 20_000),
    _case("mc_balls_in_bins_n128_t64", "opt", 128, 64, 1.0, 2_000, bib=True),
    _case("mc_bminsep_n128_b64_p0.3", "opt", 128, 64, 0.3, 20_000),
    _case("mc_bminsep_n1024_b32", "bsr", 1024, 32, 1.0 / 33.0, 5_000),
    _case("mc_bminsep_n1024_b32_add", "bsr", 1024, 32, 1.0 / 33.0, 5_000, direction="add"),
    _case("mc_bminsep_n7200_b256", "bsr", 7200, 256, 1.2549e-4, 1_000, slow=True, sigma=0.5),
]
