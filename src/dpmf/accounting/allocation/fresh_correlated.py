r"""Correlated ``C`` under random allocation with a **fresh slot each epoch**: an amplified bound.

dpmf's own argument (not from the papers). With ``k`` epochs of ``b`` steps and a fresh slot
``tau_e`` (uniform on the epoch's ``b`` steps, independent across epochs) the example contributes at
steps ``u_e = e b + tau_e``. For an entrywise non-negative lower-triangular ``C`` the remove pair is
dominated by ``P = E_tau N(sum_e m_{u_e}, sigma^2 I)``, ``Q = N(0, sigma^2 I)`` (add: swapped), with
``m_u = C[:, u]``: the dimension reduction of MMCC (Choquette-Choo et al. 2023, Lemma B.4 and step 1
of Thm 4.3, digest ``notes/mmcc.md``) holds for any law of the participation pattern, and the
balls-in-bins case is Lemma 2.8 of Schuchardt & Kalinin (digest ``notes/random-allocation.md`` §2.4).
With ``x ~ Q`` the likelihood ratio is

    S = E_tau exp(Y_tau - Var(Y_tau) / 2),   Y_tau = sum_e Y_{u_e},   Y = M x / sigma^2 ~ N(0, G / sigma^2),

``G = M M^T`` the ``n x n`` Gram matrix of the steps' columns (``n = k b``), and both directions'
hockey-stick divergences are ``E f(S)`` for a convex ``f`` (remove ``(s - e^eps)_+``, add
``(1 - e^eps s)_+``).

**Step 1 (make the epochs independent).** For every pair ``(u, v)`` of steps in different epochs
add ``G_uv (e_u - e_v)(e_u - e_v)^T`` (positive semidefinite: ``G_uv >= 0`` as ``C >= 0``): the sum
``P`` cancels every cross-epoch entry and adds ``d_u = sum_{v in another epoch} G_uv`` to the
diagonal. With ``W ~ N(0, P / sigma^2)`` independent of ``Y`` and ``Y' = Y + W``,
``S' = E_tau exp(Y'_tau - Var(Y'_tau) / 2)`` has ``E[S' | Y] = S`` (a mean-one lognormal factor per
pattern), so ``E f(S) <= E f(S')`` (conditional Jensen). ``Y'`` has no cross-epoch covariance, so
``Var(Y'_tau) = sum_e Var(Y'_{u_e})`` and ``S' = prod_e S'_e`` with independent
``S'_e = (1/b) sum_i exp(Y'_{eb+i} - Var / 2)``, ``Cov(Y'_e) = (G_ee + diag(d)) / sigma^2``.

**Step 2 (each epoch to the identity's pair).** The spectral groups of :mod:`.correlated` (Jensen
over the residue classes modulo ``q``, then Lemma 1 at ``lambda >= lambda_max`` of each class's Gram
and Lemma 2) show ``S'_e <=_cx S*``, the mean of ``n_q`` i.i.d. mean-one lognormals of parameter
``lambda / sigma^2`` (the identity's one-epoch allocation pair with ``n_q`` steps at noise
``sigma / sqrt(lambda)``), with ``n_q`` the smallest class and ``lambda`` the largest bound over the
classes *and the epochs*. (Jensen over the classes is a convex-order step too: ``S'_e = sum_r w_r
S'_{e,r} <=_cx S'_{e,R}``, ``R`` a random class of law ``w``.)

**Step 3 (products).** For independent non-negative ``A <=_cx A'`` and ``B <=_cx B'``,
``AB <=_cx A'B'`` (``x -> f(x b)`` is convex for ``b >= 0``; condition on one factor at a time). So
``S <=_cx prod_e S*_e``, the likelihood ratio of ``k`` independent copies of the identity's pair:
both directions' epsilons are at most those of the ``k``-fold composition that
:func:`~dpmf.accounting.allocation.pld.allocation_pld_epsilon` computes with ``fresh_slots=True``
(pessimistic grid), at noise ``sigma / sqrt(lambda)`` over ``n_q`` steps. The accountant takes the
smallest over the periods ``q``.

What it costs: step 1 raises the diagonal of the steps next to an epoch boundary by their
correlation with the neighbouring epoch (for a ``p``-banded ``C``, the first and last ``p - 1``
steps of each epoch). No Markov members here (they bound hockey-sticks, not a composable PLD).

**Rounding.** ``G`` is a float product of non-negative numbers, rounded up by
``1 + 2 (N + 2) u`` entrywise; the boundary sums ``d`` are rounded up by ``1 + 2 (n + 2) u``; the
eigenvalue bounds are those of :func:`~dpmf.accounting.allocation.correlated.perron_upper_bound`.
"""

from __future__ import annotations

import numpy as np

from dpmf.accounting.allocation.correlated import MAX_GRAM_ENTRIES, Reductions, spectral_groups_of_grams
from dpmf.accounting.allocation.dominating_pair import mixture_means
from dpmf.errors import DPMFError, UnsupportedConfigurationError

__all__ = ["epoch_grams", "fresh_slot_problem", "fresh_slot_reductions"]

_U = 2.0**-53


def epoch_grams(means: np.ndarray, epochs: int) -> list[np.ndarray]:
    """The ``k`` per-epoch Gram matrices of step 1 (module docstring): ``G_ee + diag(d)``, ``d_u`` the
    sum of step ``u``'s Gram entries with the other epochs' steps, all rounded up.

    >>> import numpy as np
    >>> m = np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])  # 2 epochs x 2
    >>> [g.round(12).tolist() for g in epoch_grams(m, 2)]
    [[[1.0, 1.0], [1.0, 3.0]], [[3.0, 1.0], [1.0, 1.0]]]
    """
    m = np.asarray(means, dtype=np.float64)
    n, dim = m.shape
    b = n // epochs
    gram = np.maximum(m @ m.T, 0.0) * (1 + 2 * (dim + 2) * _U)
    gram = np.maximum(gram, gram.T)
    epoch = np.arange(n) // b
    cross = np.where(epoch[:, None] != epoch[None, :], gram, 0.0).sum(axis=1) * (1 + 2 * (n + 2) * _U)
    out = []
    for e in range(epochs):
        idx = slice(e * b, (e + 1) * b)
        g = gram[idx, idx].copy()
        g[np.diag_indices(b)] += cross[idx]
        out.append(g * (1 + 2 * _U))  # (the diagonal sum, rounded up)
    return out


def fresh_slot_problem(strategy, scheme) -> str | None:
    """Why the bound does not apply to ``strategy`` under the fresh-slot ``scheme`` (``C`` not
    non-negative lower-triangular, or the Gram matrix of all steps too large), or ``None``."""
    n = scheme.steps
    dim = getattr(strategy, "n", n)
    if n * max(n, dim) > MAX_GRAM_ENTRIES:
        return (f"fresh slots with a correlated C need the {n} x {n} Gram matrix of all steps; "
                f"n * max(n, N) = {n * max(n, dim)} > {MAX_GRAM_ENTRIES}: use montecarlo or reused slots")
    try:
        mixture_means(strategy, 1, n)
    except DPMFError as exc:
        return str(exc)
    return None


def fresh_slot_reductions(strategy, scheme) -> Reductions:
    """:class:`~dpmf.accounting.allocation.correlated.Reductions` (spectral groups only; no orthogonal
    groups, no Markov members) bounding ``strategy`` under ``scheme`` with a fresh slot each epoch:
    each member ``(q, slots, lambda)`` means the ``k``-fold composition of the identity's one-epoch
    pair with ``slots`` steps at noise ``sigma / sqrt(lambda)`` (module docstring)."""
    why = fresh_slot_problem(strategy, scheme)
    if why:
        raise UnsupportedConfigurationError(why)
    k, n = scheme.epochs, scheme.steps
    grams = epoch_grams(mixture_means(strategy, 1, n), k)
    return Reductions(None, tuple(spectral_groups_of_grams(grams)))
