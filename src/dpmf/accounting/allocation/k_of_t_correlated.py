r"""Correlated ``C`` under ``k``-of-``t`` random allocation (``num_selected = k > 1``): an amplified bound.

dpmf's own argument (not from the papers). Each example joins ``k`` distinct uniformly random steps of
every epoch's ``t`` (reused: drawn once; fresh: anew each epoch). For an entrywise non-negative
lower-triangular ``C`` the remove pair is ``P = E_A N(sum_{u in A} m_u, sigma^2 I)``,
``Q = N(0, sigma^2 I)`` (add: swapped), ``A`` the random set of steps and ``m_u`` their means:
MMCC's dimension reduction (Choquette-Choo et al. 2023, Lemma B.4 and step 1 of Thm 4.3, digest
``notes/mmcc.md``) holds for any law of the participation pattern. With reused slots over ``E``
epochs the ``E`` copies of a slot are one *slot* with the folded mean ``m_i = sum_e C[:, e t + i]``
(:func:`~dpmf.accounting.allocation.dominating_pair.mixture_means`), ``t`` slots; with fresh slots
every step of every epoch is a slot, ``E t`` of them.

**Step 0 (random blocks).** As for the identity (:mod:`.pld_compose`, reduction 3): write
``t = k m + r``; cut each epoch's slots into a uniformly random ordered partition ``pi`` into ``k - r``
blocks of ``m`` and ``r`` of ``m + 1`` slots and take one uniform slot per block. The chosen set is
uniform over ``k``-subsets (its law is invariant under permutations of the slots), so
``P = E_pi P_pi`` with the *same* ``Q``; the hockey-stick divergence is jointly convex, so both
directions are at most the largest over partitions of ``H(P_pi, Q)``.

**Step 1 (independent blocks).** Given ``pi``, add ``G_uv (e_u - e_v)(e_u - e_v)^T`` for every pair
of slots in different blocks (positive semidefinite, ``G_uv >= 0``): by conditional Jensen (as in
step 1 of :mod:`.fresh_correlated`) the likelihood ratio grows in convex order, the blocks become
independent, and block ``B``'s Gram becomes ``G_B + diag(d_B)`` with ``d_u = sum_{v not in B} G_uv``.

**Step 2 (one bound for every partition).** ``G_B + diag(d_B)`` is non-negative and symmetric, so
its largest eigenvalue is at most its largest row sum, ``sum_{v in B} G_uv + d_u = sum_v G_uv`` --
the row sum of the whole ``G``, whatever ``pi`` is. With ``Lambda = max_u sum_v G_uv`` Lemma 1 and
Lemma 2 of :mod:`.correlated` bound each block by the identity's 1-of-``|B|`` pair at noise
``sigma / sqrt(Lambda)``, and independent blocks compose (step 3 of :mod:`.fresh_correlated`). So
both epsilons are at most the *identity's* ``k``-of-``t`` allocation epsilon at
``sigma / sqrt(Lambda)`` -- one epoch for reused slots (folded), ``E`` fresh epochs otherwise --
which :func:`~dpmf.accounting.allocation.pld.allocation_pld_epsilon` bounds pessimistically
(:mod:`.pld_compose`). For ``C = I`` the folded Gram is ``E I`` (reused) or ``I`` (fresh): the
identity's own accountant exactly.

What it costs: ``Lambda`` is about ``lambda_max(G)`` for a banded Toeplitz ``C`` (the row sum of a
Toeplitz Gram is its symbol at 0), what the spectral member of period 1 pays for one slot; the
residue classes and Markov members of one slot have no analogue here (the blocks are random sets).

**Rounding.** ``G`` is a float product of non-negative numbers, rounded up by ``1 + 2 (N + 2) u``
entrywise; each row sum of ``n`` non-negative terms by ``1 + 2 (n + 2) u``.
"""

from __future__ import annotations

import numpy as np

from dpmf.accounting.allocation.correlated import Reductions, SpectralGroup, gram_problem
from dpmf.accounting.allocation.dominating_pair import mixture_means
from dpmf.errors import UnsupportedConfigurationError
from dpmf.numerics import UNIT_ROUNDOFF

__all__ = ["k_of_t_problem", "k_of_t_reductions", "row_sum_bound", "LABEL"]

#: The member's name in the diagnostics.
LABEL = "random blocks (row-sum bound)"


def k_of_t_problem(strategy, scheme) -> str | None:
    """Why the bound does not apply (``C`` not non-negative lower-triangular, or the Gram matrix of the
    slots -- folded when reused, every step when fresh -- too large), or ``None``."""
    fresh = bool(scheme.fresh_slots) and scheme.epochs > 1
    return gram_problem(strategy, scheme.steps, scheme.steps if fresh else scheme.steps_per_epoch,
                        "num_selected > 1 with a correlated C", "montecarlo or unamplified")


def row_sum_bound(means: np.ndarray) -> float:
    """``Lambda >= max_u sum_v G_uv`` for ``G = M M^T`` (``M`` the non-negative ``b x N`` means),
    rounded up (module docstring).

    >>> import numpy as np
    >>> row_sum_bound(np.array([[1.0, 0.0], [1.0, 1.0]])) >= 3.0   # G = [[1, 1], [1, 2]]
    True
    """
    m = np.asarray(means, dtype=np.float64)
    b, n = m.shape
    gram = np.maximum(m @ m.T, 0.0) * (1 + 2 * (n + 2) * UNIT_ROUNDOFF)
    gram = np.maximum(gram, gram.T)
    return float(gram.sum(axis=1).max()) * (1 + 2 * (b + 2) * UNIT_ROUNDOFF)


def k_of_t_reductions(strategy, scheme) -> Reductions:
    """:class:`~dpmf.accounting.allocation.correlated.Reductions` with the one member of the module
    docstring: ``t`` slots per epoch at noise scale ``Lambda`` (the caller composes the identity's
    ``k``-of-``t`` pair: one epoch for reused slots, ``E`` fresh ones)."""
    why = k_of_t_problem(strategy, scheme)
    if why:
        raise UnsupportedConfigurationError(why)
    fresh = bool(scheme.fresh_slots) and scheme.epochs > 1
    means = mixture_means(strategy, 1 if fresh else scheme.epochs, scheme.steps)
    return Reductions(None, (SpectralGroup(1, scheme.steps_per_epoch, row_sum_bound(means)),), label=LABEL)
