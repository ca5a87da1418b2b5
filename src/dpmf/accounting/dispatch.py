"""``dpmf.account`` and ``dpmf.calibrate``: one entry point over every valid accountant.

Each accountant module exposes ``NAME``, ``supports(strategy, scheme) -> reason | None`` and a
function returning a :class:`PrivacyReport`. ``method="auto"`` runs every method that is valid
for the (strategy, scheme) pair and returns the tightest report; all of them are sound upper
bounds, so the minimum is one too.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Callable

from dpmf import validation as _v
from dpmf.accounting import allocation, dpsgd, mmcc, montecarlo, unamplified
from dpmf.accounting.report import PrivacyReport
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.privacy.calibration import ProgressCallback, smallest_noise
from dpmf.sampling.schemes import SCHEMES
from dpmf.strategies.identity import Identity


@dataclass(frozen=True)
class AccountingMethod:
    """A registered accountant and the options it takes, listed explicitly.

    ``run_options`` are the keyword options of ``run`` (``dpmf.account`` forwards them);
    ``calibration_options`` those of its calibration (``fast_calibration`` or ``own_calibration``;
    without either, calibration searches with ``run`` and takes ``run_options``). A test checks
    the lists against the functions' signatures, so a reader can follow an option from
    ``dpmf.account`` to the accountant that uses it.
    """

    name: str
    description: str
    supports: Callable[[object, object], str | None]
    run: Callable[..., PrivacyReport]
    run_options: frozenset[str] = frozenset()
    #: options that change which pairs the method covers; passed on to ``supports``
    pair_options: frozenset[str] = frozenset()
    fast_calibration: Callable[..., float] | None = None  # (strategy, scheme, target, delta, **opts) -> sigma
    calibration_options: frozenset[str] | None = None  # None: the run options
    calibration_searches: bool = True  # fast_calibration takes rel_tol and callback (False: closed form)
    in_auto: bool = True  # False for estimates (Monte Carlo): never chosen silently
    #: Replaces the generic calibration entirely; returns an object with ``noise_multiplier``,
    #: ``report`` and ``evaluations`` (Monte Carlo's Estimate-Verify-Release, Algorithm 5).
    own_calibration: Callable[..., object] | None = None

    def accepts(self, calibrating: bool) -> frozenset[str]:
        """Option names this method takes when accounting (``False``) or calibrating (``True``)."""
        if calibrating and self.calibration_options is not None:
            return self.calibration_options
        return self.run_options


_MMCC_OPTIONS = frozenset(
    {"delta_split", "adaptive", "grid_step", "discretization", "merge_budget", "workers", "scheduler", "cache_dir"}
)
_ALLOCATION_OPTIONS = frozenset(
    {"which", "bandwidth", "orders", "budget", "max_bandwidth", "delta_e", "temperatures", "discretization",
     "conditional_budget", "renyi_conversion"}
)
_MONTECARLO_COMMON = frozenset({"num_samples", "seed", "scheduler", "workers", "sampler", "chunk_size", "dataset_size"})

METHODS: dict[str, AccountingMethod] = {
    m.name: m
    for m in (
        AccountingMethod(
            dpsgd.NAME,
            "PLD of Poisson-subsampled Gaussian steps (DP-SGD, tight up to discretization)",
            dpsgd.supports,
            dpsgd.account_dpsgd,
            frozenset({"discretization"}),
        ),
        AccountingMethod(
            unamplified.NAME,
            "Gaussian mechanism with the strategy's worst-case sensitivity (no amplification)",
            unamplified.supports,
            unamplified.account_unamplified,
            frozenset(),
            frozenset(),
            unamplified.calibrate_unamplified,
            frozenset(),
            calibration_searches=False,
        ),
        AccountingMethod(
            mmcc.NAME,
            "MMCC: conditional composition of per-row mixture-of-Gaussians PLDs (any non-negative "
            "lower-triangular C; Poisson or cyclic Poisson sampling)",
            mmcc.supports,
            mmcc.account_mmcc,
            _MMCC_OPTIONS | {"heuristic", "callback"},
            frozenset({"adaptive"}),
            mmcc.calibrate_mmcc,
            _MMCC_OPTIONS,
        ),
        AccountingMethod(
            allocation.NAME,
            "random allocation (balls-in-bins), sampling-free: the tighter of the Renyi dynamic program and "
            "conditional composition",
            allocation.supports,
            allocation.account_allocation,
            _ALLOCATION_OPTIONS | {"callback"},
            frozenset(),
            allocation.calibrate_allocation,
            _ALLOCATION_OPTIONS,
        ),
        AccountingMethod(
            montecarlo.NAME,
            "Monte Carlo estimate of the exact dominating pair (b-min-sep, balls-in-bins, cyclic Poisson); "
            "an ESTIMATE, certified only through calibration (Estimate-Verify-Release)",
            montecarlo.supports,
            montecarlo.account_montecarlo,
            _MONTECARLO_COMMON | {"confidence", "checkpoint", "callback", "resolution"},
            calibration_options=_MONTECARLO_COMMON
            | {"candidates", "num_candidates", "ratio", "pilot_samples", "base_delta", "fallback_noise_multiplier"},
            in_auto=False,
            own_calibration=montecarlo.calibrate_montecarlo,
        ),
    )
}

ALL_OPTIONS = frozenset().union(*(m.accepts(c) for m in METHODS.values() for c in (False, True)))


def _options_for(methods: list[AccountingMethod], options: dict, calibrating: bool) -> list[dict]:
    """Per selected method, the given options it takes (``None`` values dropped); an option that no
    selected method takes is an error naming it, with what each method accepts and a close match."""
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(k for k in given if not any(k in m.accepts(calibrating) for m in methods))
    if unknown:
        what = "calibrating" if calibrating else "accounting"
        names = "/".join(m.name for m in methods)
        hints = []
        for k in unknown:
            owners = [m.name for m in METHODS.values() if k in m.accepts(calibrating)]
            if owners:
                hints.append(f"option {k!r} is not used when {what} with {names} (it is an option of {', '.join(owners)})")
                continue
            close = difflib.get_close_matches(k, sorted(ALL_OPTIONS), n=1)
            hints.append(f"unknown option {k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        listing = "; ".join(
            f"{m.name}: {', '.join(sorted(m.accepts(calibrating))) or '(no options)'}" for m in methods
        )
        raise InvalidParameterError(f"{'; '.join(hints)}. Accepted when {what} with {names}: {listing}")
    return [{k: v for k, v in given.items() if k in m.accepts(calibrating)} for m in methods]


def valid_methods(strategy, scheme, options: dict | None = None) -> dict[str, str | None]:
    """For every registered method: ``None`` if it applies, else why not (``options`` such as MMCC's
    ``adaptive=False`` can widen what a method covers)."""
    options = {k: v for k, v in (options or {}).items() if v is not None}
    return {
        name: m.supports(strategy, scheme, **{k: options[k] for k in m.pair_options if k in options})
        for name, m in METHODS.items()
    }


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


def _cannot_win(strategy, scheme, names: set[str]) -> dict[str, str]:
    """Valid methods that ``method="auto"`` skips because another selected method is known to be at
    least as tight for the pair, with the reason (reported in the diagnostics)."""
    skip = {}
    if {"pld", "mmcc"} <= names and isinstance(strategy, Identity):
        skip["mmcc"] = (
            "MMCC on the identity under Poisson sampling is DP-SGD, for which the pld accountant is exact "
            "(and MMCC would build the n x n encoder)"
        )
    return skip


def _select(strategy, scheme, method: str, options: dict) -> tuple[list[AccountingMethod], dict[str, str]]:
    """The methods to run and, for ``"auto"``, the valid ones skipped (name -> why)."""
    reasons = valid_methods(strategy, scheme, options)
    if method == "auto":
        valid = {name for name, why in reasons.items() if why is None and METHODS[name].in_auto}
        if not valid:
            detail = "; ".join(f"{k}: {v}" for k, v in reasons.items())
            raise UnsupportedConfigurationError(f"no accountant covers this configuration ({detail})")
        skipped = _cannot_win(strategy, scheme, valid)
        return [METHODS[name] for name in METHODS if name in valid and name not in skipped], skipped
    if method not in METHODS:
        raise InvalidParameterError(f"method must be 'auto' or one of {sorted(METHODS)}, got {method!r}")
    if reasons[method] is not None:
        raise UnsupportedConfigurationError(f"method {method!r} does not apply: {reasons[method]}")
    return [METHODS[method]], {}


def _checked_options(methods, skipped, options, calibrating) -> list[dict]:
    """Options per method to run; an option is checked against the skipped methods too (an option
    of a method ``auto`` decided not to run is not a user error)."""
    everyone = methods + [METHODS[name] for name in skipped]
    return _options_for(everyone, options, calibrating)[: len(methods)]


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
    methods, skipped = _select(strategy, scheme, method, options)
    per_method = _checked_options(methods, skipped, options, calibrating=False)
    reports = [m.run(strategy, scheme, sigma, delta, **opts) for m, opts in zip(methods, per_method)]
    best = min(reports, key=lambda r: r.epsilon)
    if len(reports) > 1 or skipped:
        others = {r.method: r.epsilon for r in reports}
        extra = {"all_methods": others, **({"skipped_methods": skipped} if skipped else {})}
        best = dataclasses.replace(best, diagnostics={**best.diagnostics, **extra})
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
    methods, skipped = _select(strategy, scheme, method, options)
    for m, opts in zip(methods, _checked_options(methods, skipped, options, calibrating=True)):

        def run(s: float, m=m, opts=opts) -> PrivacyReport:
            return m.run(strategy, scheme, s, delta, **opts)

        if m.own_calibration is not None:
            cal = m.own_calibration(strategy, scheme, target, delta, **opts)
            cal = Calibration(cal.noise_multiplier, cal.report, cal.evaluations)
            if best is None or cal.noise_multiplier < best.noise_multiplier:
                best = cal
            continue
        if m.fast_calibration is not None:
            extra = {"rel_tol": rel_tol, "callback": callback} if m.calibration_searches else {}
            sigma = m.fast_calibration(strategy, scheme, target, delta, **opts, **extra)
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
    if skipped:
        diag = {**best.report.diagnostics, "skipped_methods": skipped}
        best = dataclasses.replace(best, report=dataclasses.replace(best.report, diagnostics=diag))
    return best
