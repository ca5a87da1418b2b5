r"""User-level (multi-attribution) accounting facts shared by the accountants.

Multi-attribution b-min-sep (Dong & Ganesh 2026, Alg. 3) with at most ``k_u`` examples per user
(after :func:`~dpmf.sampling.bound_contributions`) is accounted under fixed-graph adjacency
(neighbours differ in *all* examples of one user). Two facts, each used by the accountant that
owns the pair:

**One example per user (k_u = 1) is example-level cold-start b-min-sep.** Thm. 6.1's dominating
pair is ``P = C x + z``, ``Q = z`` with ``x_i = 0`` if one of ``x_{i-1..i-b+1} > 0`` and otherwise
``x_i ~ Binomial(k_u, p)``. For ``k_u = 1`` that is ``x_i ~ Bernoulli(p)`` whenever the previous
``b - 1`` entries are 0: the participation chain of Alg. 1 (cold start), i.e. the pair of
:class:`~dpmf.sampling.MinSepSampling` ``(p, steps, b, warm_start=False)``. The pairs are equal, so
are their privacy profiles (both directions); :func:`single_example_users_reduction` gives that
scheme and the Monte Carlo sampler uses it (a test enumerates both pairs' patterns).

**No amplification: sensitivity ``k_u`` times the example-level one.** A user joins at most once in
any ``b`` consecutive steps (Alg. 3 bars every user of an interim example for ``b - 1`` steps),
so at most ``ceil(steps / b)`` times, ``>= b`` apart; each time its examples add at most ``k_u``
clipped gradients, a vector of norm ``<= k_u``. Its contribution divided by ``k_u`` is in the
example-level schema ``Participation(ceil(steps / b), b)``, hence the user-level L2 sensitivity
is ``k_u * sens(C, Participation(ceil(steps / b), b))`` (:func:`user_sensitivity_factor`), and
the Gaussian mechanism with it is a proved bound (the unamplified accountant; Monte Carlo's
Algorithm 5 uses it as its certified fallback).

>>> from dpmf.sampling import MultiAttributionMinSepSampling
>>> single_example_users_reduction(MultiAttributionMinSepSampling(0.1, 12, 3, 1)).describe()["warm_start"]
False
>>> user_sensitivity_factor(MultiAttributionMinSepSampling(0.1, 12, 3, 2))
2
"""

from __future__ import annotations

import warnings

from dpmf.sampling.schemes import MinSepSampling, MultiAttributionMinSepSampling

__all__ = ["single_example_users_reduction", "user_sensitivity_factor"]


def single_example_users_reduction(scheme) -> MinSepSampling | None:
    """The cold-start :class:`~dpmf.sampling.MinSepSampling` whose dominating pair equals the
    multi-attribution one when ``max_user_examples == 1``, else ``None`` (module docstring)."""
    if not isinstance(scheme, MultiAttributionMinSepSampling) or scheme.max_user_examples != 1:
        return None
    with warnings.catch_warnings():  # (a min_sep longer than the run was already warned about)
        warnings.simplefilter("ignore")
        return MinSepSampling(scheme.sampling_prob, scheme.steps, scheme.min_sep, warm_start=False)


def user_sensitivity_factor(scheme) -> int:
    """``k_u`` for a multi-attribution scheme (a user's per-step contribution has norm ``<= k_u``),
    1 for every example-level scheme."""
    if isinstance(scheme, MultiAttributionMinSepSampling):
        return int(scheme.max_user_examples)
    return 1
