"""The dp_accounting adapter: the one module that reads dp_accounting's PMF fields.

``dp_accounting.pld.pld_pmf`` keeps a PMF's grid spacing, lowest loss index, masses and mass at
``+inf`` in attributes with a leading underscore (``_discretization``, ``_lower_loss``, ``_probs``,
``_loss_probs``, ``_infinity_mass``, ``_pessimistic_estimate``) and a PLD's two directions in
``_pmf_remove`` / ``_pmf_add``. dpmf reads them here and nowhere else, so a change of those names
in a later dp_accounting release is one edit in this file. Everything else in dpmf goes through
these functions or through dp_accounting's public methods (``compose``, ``self_compose``,
``get_epsilon_for_delta``, ``to_dense_pmf``, ...).

A *dense* PMF puts mass ``probs[i]`` on the privacy loss ``(lower_index + i) * discretization``; a
*sparse* one mass ``loss_probs[k]`` on ``k * discretization``. dp_accounting (and dpmf) load
dp_accounting on first use (:class:`dpmf._lazy.LazyModule`).
"""

from __future__ import annotations

import numpy as np

from dpmf._lazy import LazyModule

pld_pmf = LazyModule("dp_accounting.pld.pld_pmf")  # dp_accounting (and SciPy's signal/stats) load on first use

__all__ = [
    "dense_arrays",
    "dense_pmf",
    "directions",
    "discretization",
    "infinity_mass",
    "is_dense",
    "is_pessimistic",
    "loss_probs",
    "make_dense",
    "make_sparse",
]

# The reads of dp_accounting's fields (SLF001: private by name, documented in its source).


def discretization(pmf) -> float:
    """The grid spacing of a dp_accounting PMF."""
    return float(pmf._discretization)  # noqa: SLF001


def infinity_mass(pmf) -> float:
    """The mass a dp_accounting PMF puts on the loss ``+inf``."""
    return float(pmf._infinity_mass)  # noqa: SLF001


def is_pessimistic(pmf) -> bool:
    """Whether a dp_accounting PMF is a pessimistic estimate (rounds losses up)."""
    return bool(pmf._pessimistic_estimate)  # noqa: SLF001


def is_dense(pmf) -> bool:
    """Whether ``pmf`` is a ``DensePLDPmf`` (else a ``SparsePLDPmf``)."""
    return isinstance(pmf, pld_pmf.DensePLDPmf)


def dense_arrays(pmf) -> tuple[int, np.ndarray, float, float]:
    """``(lower_index, probs, infinity_mass, discretization)`` of a dense dp_accounting PMF: mass
    ``probs[i]`` at the loss ``(lower_index + i) * discretization``. ``probs`` is the PMF's own
    array (not a copy): do not write to it."""
    return int(pmf._lower_loss), pmf._probs, infinity_mass(pmf), discretization(pmf)  # noqa: SLF001


def loss_probs(pmf) -> dict[int, float]:
    """``{k: mass}`` of a sparse dp_accounting PMF (mass at the loss ``k * discretization``), in
    its own order; a copy."""
    return dict(pmf._loss_probs or {})  # noqa: SLF001


def directions(pld) -> tuple[object, object]:
    """``(remove, add)`` PMFs of a ``dp_accounting.pld.PrivacyLossDistribution``."""
    return pld._pmf_remove, pld._pmf_add  # noqa: SLF001


# Constructors (dp_accounting's public classes; every PMF dpmf builds is pessimistic).


def make_dense(lower_index: int, probs: np.ndarray, infinity_mass: float, discretization: float):
    """A pessimistic ``DensePLDPmf`` holding ``probs`` as given (no trimming)."""
    return pld_pmf.DensePLDPmf(discretization, int(lower_index), probs, infinity_mass, True)


def make_sparse(loss_probs: dict[int, float], infinity_mass: float, discretization: float):
    """A pessimistic ``SparsePLDPmf`` with mass ``loss_probs[k]`` at the loss ``k * discretization``."""
    return pld_pmf.SparsePLDPmf(loss_probs, discretization, infinity_mass, True)


def dense_pmf(lower_index: int, probs: np.ndarray, infinity_mass: float, discretization: float):
    """A pessimistic dp_accounting PMF with masses ``probs`` at losses ``(lower_index + i) * disc``.

    Leading and trailing zeros are trimmed.
    """
    probs = np.asarray(probs, dtype=np.float64)
    nz = np.flatnonzero(probs > 0)
    if nz.size == 0:
        return make_dense(0, np.zeros(1), float(infinity_mass), discretization)
    probs = probs[nz[0] : nz[-1] + 1].copy()
    return make_dense(int(lower_index + nz[0]), probs, float(infinity_mass), discretization)
