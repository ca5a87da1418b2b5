"""The one calibration of the allocation accountants' dispatcher entries (``noise_and_report`` of
:mod:`.accountant` and of :mod:`.pld`): the smallest noise whose epsilon meets the target, and the
report at it, from an accountant's epsilon function and report builder.
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

from dpmf.privacy.calibration import ProgressCallback, check_limit, smallest_noise

__all__ = ["smallest_noise_and_report"]

R = TypeVar("R")


def smallest_noise_and_report(
    epsilon_at: Callable[[float], float],
    report_at: Callable[[float], R],
    target: float,
    *,
    rel_tol: float,
    callback: ProgressCallback | None = None,
    limit: float | None = None,
    initial: float | None = None,
    secant: bool = False,
    steer_at: Callable[[float], float] | None = None,
    settled: Callable[[float, float], bool] | None = None,
    revised: Callable[[float], float | None] | None = None,
) -> tuple[float, R]:
    """``(sigma, report_at(sigma))`` for the smallest ``sigma`` (to relative ``rel_tol``, searched
    by :func:`~dpmf.privacy.calibration.smallest_noise` from ``initial`` or the active
    :func:`~dpmf.privacy.calibration.search_hint`) with ``epsilon_at(sigma) <= target``.

    ``epsilon_at`` must be non-increasing in sigma; ``report_at`` is called once, at the answer (an
    accountant that memoizes its evaluations builds it from the search's own one). ``limit``: only
    noises up to it are of interest: ``epsilon_at(limit)`` is checked first
    (:func:`~dpmf.privacy.calibration.check_limit`, which raises
    :class:`~dpmf.privacy.calibration.NoiseLimitExceeded` above the target); the search then runs as
    without it, so its answer does not depend on the limit. ``callback(sigma, epsilon)`` after each
    evaluation.

    ``steer_at``: a cheaper bound, ``steer_at(sigma) >= epsilon_at(sigma)`` where it passes (so a
    noise where it passes passes the accountant), that the search runs on instead -- where the two
    agree, on the same path. Its failures only steer: the failing end ``f`` of the final bracket
    (below the answer ``p``) is checked with ``epsilon_at`` unless ``settled(p, f)`` says the bracket
    holds for the accountant already, and where the accountant passes at ``f`` the search goes on
    from it with ``epsilon_at``. The limit's check uses ``epsilon_at``. ``revised``: the accountant's
    epsilon at a noise where ``steer_at``'s was read first, once known (else ``None``), for the secant's
    chords (:func:`~dpmf.privacy.calibration.smallest_noise`).
    """
    if limit is not None:
        check_limit(epsilon_at, target, limit, callback=callback)
    search = functools.partial(smallest_noise, target_epsilon=target, rel_tol=rel_tol, callback=callback, secant=secant)
    found = search(epsilon_at if steer_at is None else steer_at, initial=initial, revised=revised)
    below = [x for x, e in found.trace if e > target and x < found.value]
    if steer_at is not None and not found.at_floor and below:
        if not (settled is not None and settled(found.value, max(below))) and not epsilon_at(max(below)) > target:
            found = search(epsilon_at, initial=max(below))
    return found.value, report_at(found.value)
