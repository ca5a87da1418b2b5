"""``dpmf.account`` and ``dpmf.calibrate``: one entry point over every valid accountant.

Each accountant module exposes ``NAME``, ``supports(strategy, scheme) -> reason | None`` and a
function returning a :class:`PrivacyReport`. ``method="auto"`` runs every method that is valid
for the (strategy, scheme) pair and returns the tightest report; all of them are sound upper
bounds, so the minimum is one too.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Callable

from dpmf import validation as _v
from dpmf.accounting import allocation, dpsgd, mmcc, montecarlo, unamplified
from dpmf.accounting.report import PrivacyReport
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.privacy.calibration import ProgressCallback, smallest_noise
from dpmf.sampling.schemes import SCHEMES


@dataclass(frozen=True)
class AccountingMethod:
    """A registered accountant."""

    name: str
    description: str
    supports: Callable[[object, object], str | None]
    run: Callable[..., PrivacyReport]
    fast_calibration: Callable[..., float] | None = None  # (strategy, scheme, target, delta, **opts) -> sigma
    in_auto: bool = True  # False for estimates (Monte Carlo): never chosen silently
    #: Replaces the generic calibration entirely; returns an object with ``noise_multiplier``,
    #: ``report`` and ``evaluations`` (Monte Carlo's Estimate-Verify-Release, Algorithm 5).
    own_calibration: Callable[..., object] | None = None

    def options(self, options: dict) -> dict:
        """The subset of ``options`` this method's ``run`` accepts as keyword arguments."""
        return _accepted(self.run, options)


def _accepted(func: Callable, options: dict) -> dict:
    params = inspect.signature(func).parameters
    return {k: v for k, v in options.items() if k in params and v is not None}


METHODS: dict[str, AccountingMethod] = {
    m.name: m
    for m in (
        AccountingMethod(
            dpsgd.NAME,
            "PLD of Poisson-subsampled Gaussian steps (DP-SGD, tight up to discretization)",
            dpsgd.supports,
            dpsgd.account_dpsgd,
        ),
        AccountingMethod(
            unamplified.NAME,
            "Gaussian mechanism with the strategy's worst-case sensitivity (no amplification)",
            unamplified.supports,
            unamplified.account_unamplified,
            unamplified.calibrate_unamplified,
        ),
        AccountingMethod(
            mmcc.NAME,
            "MMCC: conditional composition of per-row mixture-of-Gaussians PLDs (any non-negative "
            "lower-triangular C; Poisson or cyclic Poisson sampling)",
            mmcc.supports,
            mmcc.account_mmcc,
            fast_calibration=mmcc.calibrate_mmcc,
        ),
        AccountingMethod(
            allocation.NAME,
            "random allocation (balls-in-bins), sampling-free: the tighter of the Renyi dynamic program and "
            "conditional composition",
            allocation.supports,
            allocation.account_allocation,
            fast_calibration=allocation.calibrate_allocation,
        ),
        AccountingMethod(
            montecarlo.NAME,
            "Monte Carlo estimate of the exact dominating pair (b-min-sep, balls-in-bins, cyclic Poisson); "
            "an ESTIMATE, certified only through calibration (Estimate-Verify-Release)",
            montecarlo.supports,
            montecarlo.account_montecarlo,
            in_auto=False,
            own_calibration=montecarlo.calibrate_montecarlo,
        ),
    )
}


def valid_methods(strategy, scheme) -> dict[str, str | None]:
    """For every registered method: ``None`` if it applies, else why not."""
    return {name: m.supports(strategy, scheme) for name, m in METHODS.items()}


def _check_common(strategy, scheme, delta: float) -> float:
    delta = _v.open_unit("delta", delta)
    if not isinstance(scheme, SCHEMES):
        raise InvalidParameterError(f"scheme must be a dpmf.sampling scheme, got {type(scheme).__name__}")
    n = getattr(strategy, "n", None)
    if n is not None and n != scheme.steps:
        raise InvalidParameterError(
            f"the strategy has n={n} steps but the sampling scheme has steps={scheme.steps}"
        )
    return delta


def _select(strategy, scheme, method: str) -> list[AccountingMethod]:
    reasons = valid_methods(strategy, scheme)
    if method == "auto":
        chosen = [METHODS[name] for name, why in reasons.items() if why is None and METHODS[name].in_auto]
        if not chosen:
            detail = "; ".join(f"{k}: {v}" for k, v in reasons.items())
            raise UnsupportedConfigurationError(f"no accountant covers this configuration ({detail})")
        return chosen
    if method not in METHODS:
        raise InvalidParameterError(f"method must be 'auto' or one of {sorted(METHODS)}, got {method!r}")
    if reasons[method] is not None:
        raise UnsupportedConfigurationError(f"method {method!r} does not apply: {reasons[method]}")
    return [METHODS[method]]


def account(
    strategy, scheme, noise_multiplier: float, delta: float, method: str = "auto", **options
) -> PrivacyReport:
    """Privacy of running ``strategy`` with batches from ``scheme`` and noise ``noise_multiplier``.

    ``options`` (e.g. ``workers=2`` for MMCC, ``num_samples``/``seed`` for Monte Carlo) go to every
    selected method that takes them; ``None`` values are dropped. ``method="auto"`` never picks an
    estimate (Monte Carlo) on its own.

    >>> from dpmf.strategies import Identity
    >>> from dpmf.sampling import PoissonSampling
    >>> r = account(Identity(1000), PoissonSampling(0.01, 1000), 1.0, 1e-6)
    >>> round(r.epsilon, 3), r.method, r.certified
    (2.125, 'pld', True)
    """
    delta = _check_common(strategy, scheme, delta)
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    reports = [m.run(strategy, scheme, sigma, delta, **m.options(options)) for m in _select(strategy, scheme, method)]
    best = min(reports, key=lambda r: r.epsilon)
    if len(reports) > 1:
        others = {r.method: r.epsilon for r in reports}
        best = dataclasses.replace(best, diagnostics={**best.diagnostics, "all_methods": others})
    return best


@dataclass(frozen=True)
class Calibration:
    """A calibrated noise multiplier and the report that certifies it."""

    noise_multiplier: float
    report: PrivacyReport
    evaluations: int


def calibrate(
    strategy,
    scheme,
    target_epsilon: float,
    delta: float,
    method: str = "auto",
    *,
    rel_tol: float = 1e-4,
    callback: ProgressCallback | None = None,
    **options,
) -> Calibration:
    """Smallest noise multiplier whose *reported* epsilon is <= ``target_epsilon``.

    With ``method="auto"`` every valid method is calibrated and the smallest noise wins. The
    returned report is recomputed at the returned noise and always satisfies the target.
    """
    delta = _check_common(strategy, scheme, delta)
    target = _v.positive("target_epsilon", target_epsilon)
    best: Calibration | None = None
    for m in _select(strategy, scheme, method):
        opts = m.options(options)

        def run(s: float, m=m, opts=opts) -> PrivacyReport:
            return m.run(strategy, scheme, s, delta, **opts)

        if m.own_calibration is not None:
            cal = m.own_calibration(strategy, scheme, target, delta, **_accepted(m.own_calibration, opts))
            cal = Calibration(cal.noise_multiplier, cal.report, cal.evaluations)
            if best is None or cal.noise_multiplier < best.noise_multiplier:
                best = cal
            continue
        if m.fast_calibration is not None:
            extra = {**opts, "rel_tol": rel_tol, "callback": callback}
            sigma = m.fast_calibration(strategy, scheme, target, delta, **_accepted(m.fast_calibration, extra))
            report, evals = run(sigma), 1
            while report.epsilon > target:  # float rounding: step to the safe side
                sigma = math.nextafter(sigma, math.inf) * (1 + 1e-12)
                report, evals = run(sigma), evals + 1
        else:
            res = smallest_noise(lambda s: run(s).epsilon, target, rel_tol=rel_tol, callback=callback)
            sigma, evals = res.value, res.evaluations
            report = run(sigma)
        cal = Calibration(sigma, report, evals)
        if best is None or cal.noise_multiplier < best.noise_multiplier:
            best = cal
    assert best is not None
    return best
