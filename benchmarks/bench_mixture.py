"""Building one mixture-of-Gaussians PLD (both adjacency directions, discretization 1e-4).

peer:  dp_accounting.pld.privacy_loss_distribution.from_mixture_gaussian_mechanism
dpmf:  dpmf.privacy.mixture_of_gaussians

Only the construction is timed. Agreement: epsilon at delta = 1e-6 in each direction (remove,
add) within 1e-3; both are pessimistic connect-the-dots PLDs on the same grid, so dpmf must
also not be below dp_accounting by more than 1e-6.
"""

from __future__ import annotations

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as dpa_pld
from scipy import stats

import dpmf
from case import Case

DELTA = 1e-6
ABS_TOL = 1e-3
BELOW_TOL = 1e-6

SUPPORTS = {
    "3pt": (np.arange(3.0), stats.binom.pmf(np.arange(3), 2, 0.1)),
    "500pt": (np.arange(500) * 0.004, stats.binom.pmf(np.arange(500), 499, 0.25)),
}
SIGMAS = (0.5, 1.0, 4.0)
#: Cases kept by --quick (the others take dp_accounting ~1-2 minutes each).
QUICK = {("3pt", 4.0), ("3pt", 1.0), ("500pt", 4.0)}


def _compare(peer_pld, dpmf_pld) -> tuple[bool, str]:
    peer = {
        "remove": float(peer_pld._pmf_remove.get_epsilon_for_delta(DELTA)),  # noqa: SLF001
        "add": float(peer_pld._pmf_add.get_epsilon_for_delta(DELTA)),  # noqa: SLF001
    }
    ours = dpmf_pld.epsilon_by_direction(DELTA)
    diff = {d: ours[d] - peer[d] for d in peer}
    ok = all(abs(v) <= ABS_TOL and v >= -BELOW_TOL for v in diff.values())
    detail = ", ".join(f"{d}: eps={ours[d]:.6f} diff={diff[d]:+.1e}" for d in peer)
    return ok, detail


def _case(label: str, sigma: float) -> Case:
    c, p = SUPPORTS[label]
    return Case(
        name=f"mog_{label}_sigma{sigma:g}",
        peer=lambda: dpa_pld.from_mixture_gaussian_mechanism(sigma, list(c), list(p)),
        dpmf=lambda: dpmf.privacy.mixture_of_gaussians(c, p, sigma),
        compare=_compare,
        tolerance="eps(1e-6) per direction: |diff| <= 1e-3 and dpmf >= peer - 1e-6",
        slow=(label, sigma) not in QUICK,
    )


CASES = [_case(label, sigma) for label in SUPPORTS for sigma in SIGMAS]
