"""The one calibration of the allocation accountants' dispatcher entries (``noise_and_report`` of
:mod:`.accountant` and of :mod:`.pld`): the smallest noise whose epsilon meets the target, and the
report at it, from an accountant's epsilon function and report builder.
"""

from __future__ import annotations

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
    """
    if limit is not None:
        check_limit(epsilon_at, target, limit, callback=callback)
    sigma = smallest_noise(epsilon_at, target, initial=initial, rel_tol=rel_tol, callback=callback, secant=secant).value
    return sigma, report_at(sigma)
