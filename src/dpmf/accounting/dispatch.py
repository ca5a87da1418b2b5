"""``dpmf.account`` and ``dpmf.calibrate``: one entry point over every valid accountant.

Each accountant module exposes ``NAME``, ``supports(strategy, scheme) -> reason | None`` and a
function returning a :class:`PrivacyReport`. ``method="auto"`` runs every method that is valid
for the (strategy, scheme) pair and returns the tightest report; all of them are sound upper
bounds, so the minimum is one too.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from dpmf import validation as _v
from dpmf.accounting import dpsgd, truncated, unamplified
from dpmf.accounting.report import PrivacyReport
from dpmf.errors import InvalidParameterError, NoiseTooSmallError, UnsupportedConfigurationError
from dpmf.privacy.calibration import ProgressCallback, smallest_noise
from dpmf.sampling.schemes import SCHEMES, CyclicPoissonSampling, PoissonSampling
from dpmf.strategies.identity import Identity

if TYPE_CHECKING:  # (the deferred entries' modules, imported on first use by _Deferred; read by tests/test_layering.py)
    from dpmf.accounting import allocation, mmcc, montecarlo  # noqa: F401


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
    #: (strategy, scheme, target, delta, **opts) -> sigma, or (sigma, the report at sigma) when the
    #: search already computed it (then it is not recomputed)
    fast_calibration: Callable[..., float | tuple[float, PrivacyReport]] | None = None
    calibration_options: frozenset[str] | None = None  # None: the run options
    calibration_searches: bool = True  # fast_calibration takes rel_tol and callback (False: closed form)
    in_auto: bool = True  # False for estimates (Monte Carlo): never chosen silently
    #: options that make a run cheaper when only its epsilon is wanted (a calibration's probe at a
    #: bound): diagnostics-only work switched off, never anything that changes epsilon
    probe_options: tuple[tuple[str, object], ...] = ()
    #: ``probe(strategy, scheme, sigma, delta, target, **run options)`` -> the report at ``sigma``,
    #: or a float that is a *lower bound* on the method's epsilon there and already above
    #: ``target`` (found from part of the work: enough to know the method fails at ``sigma``)
    probe: Callable[..., PrivacyReport | float] | None = None
    #: Replaces the generic calibration entirely; returns an object with ``noise_multiplier``,
    #: ``report`` and ``evaluations`` (Monte Carlo's Estimate-Verify-Release, Algorithm 5).
    own_calibration: Callable[..., object] | None = None
    #: ``(strategy, scheme) -> bool``: calibrate this method before the other searching methods for
    #: that pair (its search is cheap there and often the tightest, so a costlier method is then
    #: probed once at its noise instead of searched). It changes only the order of the work: the
    #: smallest noise over the methods is kept either way.
    search_first: Callable[[object, object], bool] | None = None
    #: fast_calibration takes ``limit`` (the largest noise of interest) and raises
    #: :class:`~dpmf.privacy.calibration.NoiseLimitExceeded` when the method does not pass there: the
    #: probe at a bound is then the search's own first evaluation (not a separate one)
    calibration_limit: bool = False

    def accepts(self, calibrating: bool) -> frozenset[str]:
        """Option names this method takes when accounting (``False``) or calibrating (``True``)."""
        if calibrating and self.calibration_options is not None:
            return self.calibration_options
        return self.run_options


class _Deferred:
    """``module.attribute``, imported on the first call: the random-allocation accountants import
    SciPy's optimizer and their compiled kernels (~0.5 CPU-s), which a run of another method need
    not pay. ``__wrapped__`` is the function itself (so ``inspect.signature`` reads its options)."""

    def __init__(self, module: str, attribute: str) -> None:
        self.module, self.attribute = module, attribute

    @property
    def __wrapped__(self) -> Callable:
        import importlib

        return getattr(importlib.import_module(self.module), self.attribute)

    def __call__(self, *args, **kwargs):
        return self.__wrapped__(*args, **kwargs)

    def __repr__(self) -> str:
        return f"{self.module}.{self.attribute} (imported on first use)"


class _SchemeChecked(_Deferred):
    """A deferred ``supports`` that answers for a scheme outside ``schemes`` without importing its module:
    ``refusal`` (``{}`` the scheme's type name), the module's own first answer word for word (a test
    compares them for every scheme type) -- so a balls-in-bins calibration does not import MMCC (~0.06
    CPU-s of the README snippet's)."""

    def __init__(self, module: str, attribute: str, schemes: tuple[type, ...], refusal: str) -> None:
        super().__init__(module, attribute)
        self.schemes, self.refusal = schemes, refusal

    def __call__(self, strategy, scheme, *args, **kwargs):
        if not isinstance(scheme, self.schemes):
            return self.refusal.format(type(scheme).__name__)
        return self.__wrapped__(strategy, scheme, *args, **kwargs)


_ALLOCATION = "dpmf.accounting.allocation.accountant"
_ALLOCATION_PLD = "dpmf.accounting.allocation.pld"
_MMCC = "dpmf.accounting.mmcc.accountant"
_MONTECARLO = "dpmf.accounting.montecarlo.accountant"

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
            truncated.NAME,
            "truncated (padded) Poisson / cyclic Poisson: PLD of the rounds with the truncation revealed "
            "(Ganesh 2025, Dong & Ganesh 2026 Lemma D.1), truncation probability bounded from above",
            truncated.supports,
            truncated.account_truncated,
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
            "mmcc",  # (mmcc.NAME; a test checks it)
            "MMCC: conditional composition of per-row mixture-of-Gaussians PLDs (any non-negative "
            "lower-triangular C; Poisson or cyclic Poisson sampling)",
            _SchemeChecked(_MMCC, "supports", (PoissonSampling, CyclicPoissonSampling),
                           "MMCC needs Poisson or cyclic-Poisson sampling, not {}"),
            _Deferred(_MMCC, "account_mmcc"),
            _MMCC_OPTIONS | {"heuristic", "callback"},
            frozenset({"adaptive"}),
            _Deferred(_MMCC, "noise_and_report"),
            _MMCC_OPTIONS,
            probe_options=(("heuristic", False),),  # (the independent-rows estimate doubles the row work)
            probe=_Deferred(_MMCC, "probe_mmcc"),  # cheapest rows first: stops once they already exceed the target
        ),
        AccountingMethod(
            "allocation_pld",  # (allocation.pld.NAME; a test checks it)
            "random allocation (balls-in-bins: one slot reused, fresh slots each epoch, k of t slots) for DP-SGD "
            "(identity): the PLD of the dominating pair, pessimistically discretized (Feldman & Shenfeld 2026); "
            "for a correlated C, reductions to it (one reused slot; or fresh slots, composed over the epochs); "
            "tried before the Renyi/conditional bounds",
            _Deferred(_ALLOCATION_PLD, "supports"),
            _Deferred(_ALLOCATION_PLD, "account_allocation_pld"),
            frozenset({"accuracy", "max_points"}),
            frozenset(),
            _Deferred(_ALLOCATION_PLD, "noise_and_report"),  # (the calibrate_allocation_pld search, with the report at its answer)
            frozenset({"accuracy", "max_points"}),
            calibration_limit=True,
        ),
        AccountingMethod(
            "allocation",  # (allocation.NAME; a test checks it)
            "random allocation (balls-in-bins), sampling-free: the tighter of the Renyi dynamic program and "
            "conditional composition",
            _Deferred(_ALLOCATION, "supports"),
            _Deferred(_ALLOCATION, "account_allocation"),
            _ALLOCATION_OPTIONS | {"callback"},
            frozenset(),
            _Deferred(_ALLOCATION, "noise_and_report"),  # (calibrate_allocation, with the report at its answer)
            _ALLOCATION_OPTIONS,
            # (for C != I without Markov members -- b > 256 slots, k of t -- allocation_pld's groups cost more
            # per noise than a Renyi evaluation, so the Renyi search goes first; with Markov members one
            # allocation_pld evaluation costs seconds and usually wins, so allocation_pld is searched first in
            # registry order and this one probed once at its noise: the Renyi search then runs only where it
            # passes there -- README snippet 28.3 -> ~19 CPU-s; for DP-SGD allocation_pld is exact and cheap)
            search_first=lambda strategy, scheme: (not isinstance(strategy, Identity)
                                                   and not _Deferred(_ALLOCATION_PLD, "searches_markov_members")(
                                                       strategy, scheme)),
            calibration_limit=True,
        ),
        AccountingMethod(
            "montecarlo",  # (montecarlo.NAME; a test checks it)
            "Monte Carlo estimate of the exact dominating pair (b-min-sep, balls-in-bins, cyclic Poisson); "
            "an ESTIMATE, certified only through calibration (Estimate-Verify-Release)",
            _Deferred(_MONTECARLO, "supports"),
            _Deferred(_MONTECARLO, "account_montecarlo"),
            _MONTECARLO_COMMON | {"confidence", "checkpoint", "callback", "resolution"},
            calibration_options=_MONTECARLO_COMMON
            | {"candidates", "num_candidates", "ratio", "pilot_samples", "base_delta", "fallback_noise_multiplier"},
            in_auto=False,
            # Algorithm 5's fallback comes from the proved accountants registered here (montecarlo
            # itself does not import the dispatcher: the layering is one-way)
            own_calibration=functools.partial(_Deferred(_MONTECARLO, "calibrate_montecarlo"),
                                              fallback=lambda *a: certified_fallback(*a)),
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


def valid_methods(strategy, scheme, options: dict | None = None, names=None) -> dict[str, str | None]:
    """For every registered method (or those in ``names``): ``None`` if it applies, else why not
    (``options`` such as MMCC's ``adaptive=False`` can widen what a method covers)."""
    options = {k: v for k, v in (options or {}).items() if v is not None}
    return {
        name: m.supports(strategy, scheme, **{k: options[k] for k in m.pair_options if k in options})
        for name, m in METHODS.items() if names is None or name in names
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
    if method != "auto" and method not in METHODS:
        raise InvalidParameterError(f"method must be 'auto' or one of {sorted(METHODS)}, got {method!r}")
    # (auto: the methods it may choose; every method's reason only for the refusal -- Monte Carlo's loss
    # samplers are not imported by a run that cannot choose them)
    auto = tuple(name for name, m in METHODS.items() if m.in_auto)
    reasons = valid_methods(strategy, scheme, options, names=auto if method == "auto" else (method,))
    if method == "auto":
        valid = {name for name, why in reasons.items() if why is None}
        if not valid:
            reasons = valid_methods(strategy, scheme, options)
            detail = "; ".join(f"{k}: {v}" for k, v in reasons.items())
            raise UnsupportedConfigurationError(f"no accountant covers this configuration ({detail})")
        skipped = _cannot_win(strategy, scheme, valid)
        return [METHODS[name] for name in METHODS if name in valid and name not in skipped], skipped
    if reasons[method] is not None:
        raise UnsupportedConfigurationError(f"method {method!r} does not apply: {reasons[method]}")
    return [METHODS[method]], {}


def selected_methods(strategy, scheme, method: str = "auto", options: dict | None = None) -> list[str]:
    """Names of the methods ``dpmf.account`` / ``dpmf.calibrate`` run for these arguments (the
    CLI uses it to say, after Ctrl-C, whether a run could resume: only MMCC saves rows)."""
    options = {k: v for k, v in (options or {}).items() if v is not None}
    return [m.name for m in _select(strategy, scheme, method, options)[0]]


def _checked_options(methods, skipped, options, calibrating) -> list[dict]:
    """Options per method to run. An option none of them takes is refused, also when a method
    ``auto`` skipped for this pair takes it (issue 44: ``workers=2`` or ``cache_dir`` for DP-SGD
    under ``auto`` were silently unused, so a user believed a run could resume, while
    ``method="pld"`` refused them); the message then says which method was skipped and why."""
    try:
        return _options_for(methods, options, calibrating)
    except InvalidParameterError as exc:
        if not skipped:
            raise
        why = "; ".join(f"{name} is skipped: {reason}" for name, reason in skipped.items())
        raise InvalidParameterError(
            f"{exc} (method auto runs {'/'.join(m.name for m in methods)} here; {why})"
        ) from None


def check_options(strategy, scheme, method: str = "auto", options: dict | None = None, *,
                  calibrating: bool = False) -> list[str]:
    """Refuse, before any work, what :func:`account` (or :func:`calibrate`) would refuse about
    ``method`` and ``options`` (an option no method to run takes); return the names of the methods
    that would run. The CLI calls it before creating ``--cache-dir``, so no folder is made for an
    option that is then refused."""
    options = {k: v for k, v in (options or {}).items() if v is not None}
    methods, skipped = _select(strategy, scheme, method, options)
    _checked_options(methods, skipped, options, calibrating)
    return [m.name for m in methods]


#: Noise multipliers above this are accounted at this value (``report.diagnostics`` says so).
#: Adding noise is post-processing, so epsilon is non-increasing in the noise and the report at
#: the ceiling is a sound bound for any larger noise. At 1e8 the privacy loss of a unit-sensitivity
#: step (of order 1 / sigma) is 10^4 times finer than the accountants' loss grids (1e-4), so a larger
#: noise cannot lower the reported epsilon further; while near 1e12 some accountants' numerics
#: (conditional composition's bisection, variances sigma^2 near 1e154) leave their range.
NOISE_CEILING = 1e8


def account(
    strategy, scheme, noise_multiplier: float, delta: float, method: str = "auto", *, force: bool = False,
    **options
) -> PrivacyReport:
    """Privacy of running ``strategy`` with batches from ``scheme`` and noise ``noise_multiplier``.

    ``options`` (e.g. ``workers=2`` for MMCC, ``num_samples``/``seed`` for Monte Carlo) go to every
    selected method that takes them; ``None`` values are dropped. ``method="auto"`` never picks an
    estimate (Monte Carlo) on its own.

    Before any work, the rough memory estimate of :func:`dpmf.accounting.cost.accounting_cost`
    (the one ``dpmf account`` checks) is compared with the memory available, and a run that
    cannot fit is refused with :class:`~dpmf.errors.CostLimitError` (``force=True`` runs it anyway).
    A noise multiplier above :data:`NOISE_CEILING` is accounted at the ceiling (sound: more noise is
    post-processing); one too small for an accountant's grids raises
    :class:`~dpmf.errors.NoiseTooSmallError` naming the smallest it evaluates.

    >>> from dpmf.strategies import Identity
    >>> from dpmf.sampling import PoissonSampling
    >>> r = account(Identity(1000), PoissonSampling(0.01, 1000), 1.0, 1e-6)
    >>> round(r.epsilon, 3), r.method, r.certified
    (2.125, 'pld', True)
    """
    delta = _check_common(strategy, scheme, delta)
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    evaluated = min(sigma, NOISE_CEILING)
    if not force:  # (before choosing methods: deciding validity can itself take O(n) memory)
        _check_memory(strategy, scheme, evaluated, method, options.get("num_samples"))
    methods, skipped = _select(strategy, scheme, method, options)
    per_method = _checked_options(methods, skipped, options, calibrating=False)
    reports = [_run_checked(m, strategy, scheme, evaluated, delta, opts) for m, opts in zip(methods, per_method)]
    best = min(reports, key=lambda r: r.epsilon)
    if len(reports) > 1 or skipped:
        others = {r.method: r.epsilon for r in reports}
        extra = {"all_methods": others, **({"skipped_methods": skipped} if skipped else {})}
        best = dataclasses.replace(best, diagnostics={**best.diagnostics, **extra})
    if evaluated < sigma:
        best = dataclasses.replace(best, noise_multiplier=sigma, diagnostics={
            **best.diagnostics, "noise_multiplier_evaluated": evaluated,
            "noise_ceiling": f"noise multiplier {sigma:g} accounted at {evaluated:g} (dpmf.accounting.dispatch."
                             "NOISE_CEILING): more noise is post-processing, so this epsilon bounds it",
        })
    return best


def _check_memory(strategy, scheme, sigma: float, method: str, num_samples=None) -> None:
    """The CLI's memory guard (:func:`dpmf.accounting.cost.check_cost` on the rough estimate of
    :func:`~dpmf.accounting.cost.accounting_cost`, which decides from types alone what ``method``
    runs) at the API entry points (``account`` at its noise; ``calibrate`` at
    :data:`NOISE_CEILING`, the least memory any noise needs, so it refuses only what no noise fits): memory
    only (a long run is the caller's choice; a run that cannot fit only ends in ``MemoryError``
    or swapping). The refusal is one line naming the estimate and, where the strategy and scheme
    can be rebuilt at fewer steps, the most steps that would fit."""
    from dpmf.accounting.cost import accounting_cost
    from dpmf.errors import CostLimitError, DPMFError
    from dpmf.resources import available_memory, format_bytes

    def need(strat, sch) -> float:
        return accounting_cost(strat, sch, sigma, method=method, num_samples=num_samples).memory_bytes

    try:
        est = accounting_cost(strategy, scheme, sigma, method=method, num_samples=num_samples)
    except (DPMFError, ArithmeticError, AttributeError, TypeError, ValueError):
        return  # (an estimate that cannot be made is no reason to refuse: the accountant checks its inputs)
    have = available_memory()
    if est.memory_bytes > have:
        fits = _most_steps_that_fit(strategy, scheme, lambda a, b: need(a, b) <= have)
        what_fits = f"at most {fits:,} steps fit" if fits else "use fewer steps"
        at = " at any noise" if sigma >= NOISE_CEILING else ""
        larger = "" if at else " (or use a larger noise_multiplier)"
        raise CostLimitError(
            f"refusing to start: {int(scheme.steps):,} steps would need about {format_bytes(est.memory_bytes)} of "
            f"memory{at} (a rough estimate: {est.describe()}), more than the {format_bytes(have)} available; "
            f"{what_fits}{larger}, or pass force=True to run it anyway"
        )


def _most_steps_that_fit(strategy, scheme, fits) -> int | None:
    """The largest number of steps ``n < scheme.steps`` for which ``fits(strategy', scheme')``
    holds on the same strategy and scheme rebuilt at ``n`` steps (``dataclasses.replace`` of ``n``
    and ``steps``; a multiple of the scheme's epochs), by bisection over the estimate (types only,
    instant); ``None`` when they cannot be rebuilt or not even the smallest fits."""
    from dpmf.errors import DPMFError

    unit = int(getattr(scheme, "epochs", 1) or 1)

    def at(k: int) -> bool:
        import warnings

        try:
            n = k * unit
            with warnings.catch_warnings():  # (a probe size below the cycle length warns: not the user's call)
                warnings.simplefilter("ignore")
                return bool(fits(dataclasses.replace(strategy, n=n), dataclasses.replace(scheme, steps=n)))
        except (DPMFError, ArithmeticError, AttributeError, TypeError, ValueError):
            return False

    lo, hi = 1, int(scheme.steps) // unit  # at(lo) must hold; at(hi) does not
    if hi <= lo or not at(lo):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid) else (lo, mid)
    return lo * unit


def _run_checked(m: AccountingMethod, strategy, scheme, sigma: float, delta: float, opts: dict) -> PrivacyReport:
    """``m.run``, with a float64 overflow or division by zero deep inside an accountant (a noise far
    outside what it can represent) turned into a :class:`~dpmf.errors.NumericalError` that says so."""
    from dpmf.errors import DPMFError, NumericalError

    try:
        return m.run(strategy, scheme, sigma, delta, **opts)
    except DPMFError:
        raise
    except (OverflowError, ZeroDivisionError, FloatingPointError) as exc:
        change = "a larger noise_multiplier" if sigma < 1 else "a smaller noise_multiplier"
        raise NumericalError(
            f"the {m.name} accountant cannot compute epsilon at noise_multiplier={sigma!r}: its privacy loss leaves "
            f"float64's range ({type(exc).__name__}: {exc}); use {change}"
        ) from exc


@dataclass(frozen=True)
class Calibration:
    """A calibrated noise multiplier and the report that certifies it."""

    noise_multiplier: float
    report: PrivacyReport
    evaluations: int


#: A calibration's certified epsilon is within this relative distance below its target, or the
#: calibration fails (:class:`~dpmf.errors.CalibrationError`): it never returns, as a success, a
#: noise whose epsilon is far below the target (the searches bracket the noise to ``rel_tol``; only
#: a search stopped at the smallest noise an accountant represents could end further below).
LANDING_TOLERANCE = 0.01


def calibrate(
    strategy,
    scheme,
    target_epsilon: float,
    delta: float,
    method: str = "auto",
    *,
    rel_tol: float = 1e-4,
    callback: ProgressCallback | None = None,
    max_noise_multiplier: float | None = None,
    force: bool = False,
    **options,
) -> Calibration:
    """Smallest noise multiplier whose *reported* epsilon is <= ``target_epsilon``.

    With ``method="auto"`` every valid method is calibrated and the smallest noise wins. The
    returned report is recomputed at the returned noise and always satisfies the target.

    Work is reused where that cannot change the answer: closed-form methods (unamplified) run
    first, and a searching method is first evaluated at the best noise found so far -- if its
    epsilon is above the target there it cannot need less noise (accountants are non-increasing
    in the noise) and stops after that one evaluation (``diagnostics["not_calibrated"]``);
    otherwise its search starts from that upper bracket instead of sigma = 1 (for a method alone,
    from the unamplified noise when that is cheap: :func:`dpmf.privacy.calibration.search_hint`).
    Reports already computed at a noise are not recomputed.

    ``max_noise_multiplier``: only noises up to it are of interest (``dpmf plan`` passes the noise
    at which a candidate would tie the best one so far); when no method reaches the target there,
    :class:`~dpmf.privacy.calibration.NoiseLimitExceeded` is raised after one evaluation per
    method. ``force``: skip the memory guard of :func:`account` (a calibration that would not fit in
    the memory available at any noise, by the rough estimate, is refused up front). Progress: a :func:`dpmf.progress.task` from the first evaluation on, noting each noise and
    its epsilon (none for closed forms).
    """
    import contextlib

    delta = _check_common(strategy, scheme, delta)
    target = _v.positive("target_epsilon", target_epsilon)
    _check_delta_needs_noise(scheme, delta)
    limit = None if max_noise_multiplier is None else _v.positive("max_noise_multiplier", max_noise_multiplier)
    if not force:  # the memory guard of ``account``, for the least memory any noise needs
        _check_memory(strategy, scheme, NOISE_CEILING, method, options.get("num_samples"))
    methods, skipped = _select(strategy, scheme, method, options)
    per_method = _checked_options(methods, skipped, options, calibrating=True)
    with contextlib.ExitStack() as stack:  # the progress task opens at the first evaluation noted
        run = _CalibrationRun(strategy, scheme, target, delta, rel_tol, limit, methods, per_method, callback, stack)
        # closed forms first: their noise brackets the searches; then the searches that go first for this
        # pair (search_first); ties still go to the registry order
        order = sorted(range(len(methods)), key=lambda i: (not run.closed_form(methods[i]), not run.first(methods[i]), i))
        for i in order:
            _calibrate_method(run, i)
        if run.bar and run.results:  # the last note: the answer, not the last noise tried
            top = min(run.results.values(), key=lambda c: c.noise_multiplier)
            run.bar[0].update(note=f"result sigma={top.noise_multiplier:.6g}: epsilon={top.report.epsilon:.6g}")
    if limit is not None:
        _drop_above_limit(run)
    return _best_with_diagnostics(run, skipped)


@dataclass
class _CalibrationRun:
    """What :func:`calibrate`'s stages share: the call, the methods and what each found so far."""

    strategy: object
    scheme: object
    target: float
    delta: float
    rel_tol: float
    limit: float | None
    methods: list
    per_method: list
    callback: ProgressCallback | None
    stack: object  # the contextlib.ExitStack holding the progress task
    results: dict = dataclasses.field(default_factory=dict)  # method index -> Calibration
    at_limit: dict = dataclasses.field(default_factory=dict)  # method -> epsilon at the limit (when it does not pass there)
    lower_bounds: set = dataclasses.field(default_factory=set)  # methods whose at_limit epsilon is a lower bound (a partial probe)
    not_calibrated: dict = dataclasses.field(default_factory=dict)
    at_floor: dict = dataclasses.field(default_factory=dict)  # methods whose search stopped at the smallest noise they evaluate
    start: list = dataclasses.field(default_factory=list)  # the lazily computed unamplified start, when used
    evals: int = 0
    bar: list = dataclasses.field(default_factory=list)

    def note(self, s: float, e: float) -> None:
        from dpmf import progress

        self.evals += 1
        if not self.bar:
            self.bar.append(self.stack.enter_context(progress.task(f"calibrating noise ({'/'.join(m.name for m in self.methods)})", unit="evaluations")))
        self.bar[0].update(completed=self.bar[0].completed + 1, note=f"sigma={s:.6g}: epsilon={e:.6g}")
        if self.callback is not None:
            self.callback(s, e)

    @staticmethod
    def closed_form(m: AccountingMethod) -> bool:
        return m.own_calibration is None and m.fast_calibration is not None and not m.calibration_searches

    def first(self, m: AccountingMethod) -> bool:
        return m.search_first is not None and bool(m.search_first(self.strategy, self.scheme))


def _calibrate_method(run: _CalibrationRun, i: int) -> None:
    """Calibrate method ``i`` into ``run.results`` (or record why it has no smaller noise)."""
    from dpmf.privacy.calibration import NoiseLimitExceeded

    m, opts = run.methods[i], run.per_method[i]
    run.evals = 0
    memo: dict[float, PrivacyReport] = {}

    def evaluate(s: float, probe: bool = False) -> PrivacyReport:
        if s not in memo:
            extra = dict(m.probe_options) if probe else {}
            memo[s] = m.run(run.strategy, run.scheme, s, run.delta, **{**opts, **extra})
        return memo[s]

    if m.own_calibration is not None:
        cal = m.own_calibration(run.strategy, run.scheme, run.target, run.delta, **opts)
        run.results[i] = Calibration(cal.noise_multiplier, cal.report, cal.evaluations)
        return
    best = min(run.results.values(), key=lambda c: c.noise_multiplier, default=None)
    try:
        sigma = _search_method(run, i, memo, evaluate, best)
    except NoiseLimitExceeded as exc:
        _record_not_below(run, m.name, exc, best)
        return
    if run.limit is not None and sigma > run.limit and run.limit in memo and memo[run.limit].epsilon <= run.target:
        sigma = run.limit  # (the search ended within rel_tol above a bound already seen to pass)
    before = len(memo)
    report = evaluate(sigma)  # (already computed when the search evaluated it through ``evaluate``)
    while report.epsilon > run.target:  # float rounding: step to the safe side
        sigma = math.nextafter(sigma, math.inf) * (1 + 1e-12)
        report = evaluate(sigma)
    run.results[i] = Calibration(sigma, report, run.evals + len(memo) - before)


def _search_method(run: _CalibrationRun, i: int, memo: dict, evaluate, best) -> float:
    """Method ``i``'s noise: probed once at the bound it must beat (raising
    :class:`~dpmf.privacy.calibration.NoiseLimitExceeded` when it does not pass there), then its
    closed form, its own search from the best noise so far (or the unamplified one), or
    :func:`~dpmf.privacy.calibration.smallest_noise` over ``evaluate``."""
    from dpmf.privacy.calibration import search_hint

    m, opts = run.methods[i], run.per_method[i]
    cap = None if best is None else best.noise_multiplier  # it must beat this to matter
    # where its search starts: the best noise of the methods that run before it in the registry
    # order (closed forms and methods before it), so running a search_first method earlier
    # changes only the bound it is probed at, not its search or its answer; a method that may be
    # moved first (it has a search_first rule) starts from the closed forms' noise whatever ran
    # before it, so its answer does not depend on the order either
    movable = m.search_first is not None
    hint = min((c.noise_multiplier for j, c in run.results.items()
                if (j < i and not movable) or run.closed_form(run.methods[j])), default=None)
    searches = m.fast_calibration is None or m.calibration_searches
    # one evaluation at each bound tells whether the method can get below it at all; the
    # search itself is then the same as without a limit (so is its answer). A method whose
    # calibration takes the limit makes that evaluation the first of its own search.
    bound = min((b for b in (cap, run.limit) if b is not None), default=None)
    own_limit = m.fast_calibration is not None and m.calibration_limit and bound is not None
    if searches and bound is not None and not own_limit and (m.fast_calibration is not None or bound != cap):
        _probe_bound(run, m, opts, bound, memo, evaluate)
    if run.limit is not None and (own_limit or bound in memo) and (hint is None or bound < hint):
        # a plan's limit (max_noise_multiplier): a search that passes there (probed above, or checked
        # first by its own search, whose accountant memoizes it) starts there instead of at larger
        # noises it would only leave again, so every evaluation of a budgeted plan's candidate is a
        # noise it may keep. Outside a plan (no limit) the searches are unchanged.
        hint = bound
    if not searches:
        return m.fast_calibration(run.strategy, run.scheme, run.target, run.delta, **opts)
    if m.fast_calibration is not None:
        if hint is None and not run.start:
            run.start.append(_search_start(run.strategy, run.scheme, run.target, run.delta))
        # (in a plan -- a limit -- the steps below a passing start aim at the 1/sigma^2 answer instead
        # of halving: evaluations at small noises are the costliest; search_hint's near)
        with search_hint(hint if hint is not None else run.start[0], near=run.limit is not None):
            sigma = m.fast_calibration(
                run.strategy, run.scheme, run.target, run.delta, **opts, rel_tol=run.rel_tol, callback=run.note,
                **({"limit": bound} if own_limit else {}),
            )
        if isinstance(sigma, tuple):  # (noise, the report the search computed there)
            sigma, found = sigma
            memo[sigma] = found
        return sigma
    # cheap at any noise: from 1 (or the cap, if lower), given up above the cap
    found = smallest_noise(lambda s: evaluate(s).epsilon, run.target, rel_tol=run.rel_tol, callback=run.note, limit=cap)
    if found.at_floor:
        run.at_floor[m.name] = found.value
    return found.value


def _probe_bound(run: _CalibrationRun, m: AccountingMethod, opts: dict, bound: float, memo: dict, evaluate) -> None:
    """One evaluation of ``m`` at ``bound`` (its ``probe`` when it has one); raise
    :class:`~dpmf.privacy.calibration.NoiseLimitExceeded` unless it passes the target there."""
    from dpmf.privacy.calibration import NoiseLimitExceeded

    try:
        if m.probe is not None:
            probed = m.probe(run.strategy, run.scheme, bound, run.delta, run.target, **opts, **dict(m.probe_options))
            if isinstance(probed, PrivacyReport):
                memo[bound] = probed
        else:
            probed = evaluate(bound, probe=True)
    except NoiseTooSmallError:  # it cannot even evaluate the bound: it cannot get below it
        raise NoiseLimitExceeded("", bound, math.inf) from None
    eps, partial = (probed.epsilon, False) if isinstance(probed, PrivacyReport) else (probed, True)
    run.note(bound, eps)
    if eps > run.target:
        raise NoiseLimitExceeded("", bound, eps, lower_bound=partial)


def _record_not_below(run: _CalibrationRun, name: str, exc, best) -> None:
    """Why method ``name`` gives no noise below the best one so far or the limit (``exc``: its
    :class:`~dpmf.privacy.calibration.NoiseLimitExceeded`)."""
    if best is not None and exc.limit == best.noise_multiplier and math.isinf(exc.epsilon):
        run.not_calibrated[name] = (
            f"it cannot evaluate a noise as small as {exc.limit:.6g} (below the smallest noise it "
            f"evaluates), where {best.report.method} passes: it cannot give a smaller noise"
        )
    elif best is not None and exc.limit == best.noise_multiplier:
        at_least = ">= " if exc.lower_bound else ""
        run.not_calibrated[name] = (
            f"epsilon {at_least}{exc.epsilon:.6g} > {run.target:g} already at noise {exc.limit:.6g}, where "
            f"{best.report.method} passes: it cannot need less noise"
        )
    if run.limit is not None and exc.limit >= run.limit:
        run.at_limit[name] = exc.epsilon
        if exc.lower_bound:
            run.lower_bounds.add(name)


def _drop_above_limit(run: _CalibrationRun) -> None:
    """Drop the results above ``run.limit``; raise
    :class:`~dpmf.privacy.calibration.NoiseLimitExceeded` when none is left."""
    from dpmf.privacy.calibration import NoiseLimitExceeded

    limit = run.limit
    for i in [i for i, c in run.results.items() if c.noise_multiplier > limit]:
        run.at_limit.setdefault(run.methods[i].name, _epsilon_at(run.methods[i], run.per_method[i], run.strategy,
                                                                 run.scheme, limit, run.delta))
        del run.results[i]
    if not run.results:
        name = min(run.at_limit, key=run.at_limit.get, default=None)
        eps = math.inf if name is None else run.at_limit[name]
        partial = name in run.lower_bounds
        raise NoiseLimitExceeded(
            f"no accountant reaches epsilon <= {run.target:g} at noise_multiplier <= {limit:g} "
            f"(epsilon there: {'>= ' if partial else ''}{eps:.6g})",
            limit,
            eps,
            lower_bound=partial,
            method=name,
        )


def _best_with_diagnostics(run: _CalibrationRun, skipped: dict) -> Calibration:
    """The smallest noise found, its report noting skipped and uncalibrated methods and a search
    stopped at the smallest noise an accountant represents (refused when far below the target)."""
    results, target = run.results, run.target
    assert results
    best = results[min(results, key=lambda i: (results[i].noise_multiplier, i))]
    extra = {}
    if skipped:
        extra["skipped_methods"] = skipped
    if run.not_calibrated:
        extra["not_calibrated"] = run.not_calibrated
    if best.report.method in run.at_floor and best.noise_multiplier == run.at_floor[best.report.method]:
        if best.report.epsilon < (1 - LANDING_TOLERANCE) * target:
            from dpmf.errors import CalibrationError

            raise CalibrationError(
                f"no accountant can reach target_epsilon={target:g}: the smallest noise any privacy-loss grid "
                f"represents, noise_multiplier={best.noise_multiplier:.6g}, already gives epsilon "
                f"{best.report.epsilon:.6g} ({best.report.method}); a target that large needs less noise than "
                f"dpmf can account for: use target_epsilon <= {best.report.epsilon:.6g} (this noise) or a larger delta"
            )
        extra["at_smallest_noise"] = (
            f"the {best.report.method} accountant evaluates no noise below {best.noise_multiplier:.6g} (no "
            f"privacy-loss grid represents a smaller one), and epsilon there meets the target"
        )
    if extra:
        diag = {**best.report.diagnostics, **extra}
        best = dataclasses.replace(best, report=dataclasses.replace(best.report, diagnostics=diag))
    return best


def _check_delta_needs_noise(scheme, delta: float) -> None:
    """Refuse to calibrate at a delta that every noise multiplier meets with epsilon 0.

    Under zero-out adjacency the two outputs coincide when the example joins no batch, so the total
    variation between them -- delta at epsilon 0 -- is at most ``1 - P(never sampled)``, whatever
    the noise (even none). ``P(never sampled)`` is ``(1 - q)^steps`` under Poisson sampling,
    ``(1 - q)^ceil(steps / b)`` at least under cyclic Poisson (the example's group is active that
    often at most) and ``(1 - p)^steps`` at least under b-min-sep (an example never sampled is
    always available). At such a delta there is nothing to calibrate (the search would shrink the
    noise towards 0, each step costlier); at a delta below it an answer exists."""
    from dpmf.sampling.schemes import CyclicPoissonSampling, MinSepSampling, PoissonSampling

    if type(scheme) is PoissonSampling or type(scheme) is MinSepSampling:
        q, joins, how = float(scheme.sampling_prob), int(scheme.steps), "step"
    elif type(scheme) is CyclicPoissonSampling:
        q, joins, how = float(scheme.sampling_prob), -(-int(scheme.steps) // int(scheme.cycle_length)), "active step"
    else:
        return
    if q >= 1:
        return
    log_never = joins * math.log1p(-q)
    if math.log1p(-delta) <= log_never:
        never = math.exp(log_never)
        raise InvalidParameterError(
            f"delta {delta!r} needs no noise at all: an example joins no batch with probability (1 - {q:g})^{joins} = "
            f"{never:.3g} (rate {q:g} per {how}), and then the outputs are identical, so every noise multiplier (even "
            f"0) gives (0, delta)-DP and there is nothing to calibrate; use delta < {1 - never:.6g} (and well below "
            "1/dataset size for a meaningful guarantee)"
        )


def certified_fallback(strategy, scheme, target_epsilon: float, delta: float) -> tuple[float, str]:
    """Smallest noise multiplier a *proved* accountant gives for (target_epsilon, delta), and its name.

    Algorithm 5's fallback mechanism M_k (:func:`dpmf.accounting.montecarlo.calibrate_montecarlo`):
    every valid registered method that is not an estimate (``in_auto``) is calibrated and the
    smallest certified noise kept.
    """
    best: tuple[float, str] | None = None
    for name, why in valid_methods(strategy, scheme).items():
        if why is not None or not METHODS[name].in_auto:
            continue
        cal = calibrate(strategy, scheme, target_epsilon, delta, method=name)
        if cal.report.certified and cal.report.epsilon <= target_epsilon and (
            best is None or cal.noise_multiplier < best[0]
        ):
            best = (cal.noise_multiplier, name)
    if best is None:
        raise UnsupportedConfigurationError(
            "no proved accountant covers this configuration, so Algorithm 5 has no fallback mechanism; "
            "pass fallback_noise_multiplier only with a proof of (epsilon, delta)-DP"
        )
    return best


def _epsilon_at(m: AccountingMethod, opts: dict, strategy, scheme, sigma: float, delta: float) -> float:
    """Epsilon of method ``m`` at noise ``sigma`` (``inf`` when it cannot be computed)."""
    try:
        return m.run(strategy, scheme, sigma, delta, **opts).epsilon
    except Exception:  # noqa: BLE001 - only used to word an error message
        return math.inf


def _search_start(strategy, scheme, target: float, delta: float) -> float | None:
    """Where a method's own search starts: the unamplified noise (amplification only lowers
    epsilon, so it is an upper bracket; if a bound does not pass there, the search grows), when
    the unamplified accountant covers the pair and its sensitivity is cheap; else ``None`` (1)."""
    from dpmf.accounting.cost import accounting_cost
    from dpmf.errors import DPMFError

    if unamplified.supports(strategy, scheme) is not None:
        return None
    try:
        if accounting_cost(strategy, scheme, method="unamplified", calibrate=True).seconds > 5:
            return None
        return unamplified.calibrate_unamplified(strategy, scheme, target, delta)
    except (DPMFError, MemoryError):
        return None
