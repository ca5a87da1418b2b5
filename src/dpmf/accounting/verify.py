"""Re-check a saved privacy report: rebuild what it describes, recompute, compare.

A :class:`~dpmf.accounting.report.PrivacyReport` (``report.to_json()``, ``dpmf account --json``,
``dpmf calibrate --json``) names its strategy and sampling scheme by their ``describe()`` dicts and
records the noise multiplier, delta, method and the value-affecting ``options`` the method was
called with. :func:`verify_report` rebuilds the strategy
(:func:`~dpmf.strategies.serialization.strategy_from_dict`) and the scheme
(:func:`~dpmf.sampling.serialization.scheme_from_dict`) from the report's own dicts, recomputes
``dpmf.account(strategy, scheme, noise_multiplier, delta, method=method, **options)`` and says
whether the claim holds:

* the claimed epsilon holds iff ``recomputed <= claimed + REL_SLACK * |claimed|``
  (``REL_SLACK = 1e-9``, room for floating-point noise only: a claim below the recomputed value by
  more than that fails), the same for each direction the report lists in ``epsilon_by_direction``;
* a calibration report (``dpmf calibrate --json``, with ``target_epsilon``) must also meet its
  target;
* and the report's ``certified`` flag equals the recomputed one (a report claiming a proof where
  the method gives an estimate fails, and so does the reverse: the claim is wrong either way).

Separately, :func:`verify_report` says whether the report was **edited** since it was produced:
every serialized report carries a ``digest`` (:func:`~dpmf.accounting.report.report_digest`, a
sha256 over a canonical JSON of the fields that describe the mechanism and the claim), and
``Verification.edited`` is False when the report's digest matches its fields, True when it does
not (a report edited to describe a *more* private run can still hold, but it is no longer the
report that was produced), and None for a report without a digest ("no digest: cannot tell";
reports written before digests existed). The digest detects edits, not forgery: it is not a
signature, and whoever edits a report can recompute it.

Reports without ``options`` (written before the field existed) are recomputed with the method's
defaults. Monte Carlo reports (``montecarlo``, estimates) are recomputed with the seed, sample
count, chunk size, confidence and grid recorded in their ``diagnostics``, which reproduces the same
samples; a report without a recorded seed, with a custom sampler, or from a partial run is refused.
``montecarlo-evr`` reports (Monte Carlo calibration, Estimate-Verify-Release) are refused: re-checking
one means re-running the whole calibration. A ``composition`` report (``dpmf compose --json``) is
recomputed from its parts (``diagnostics["parts"]``), each part re-checked as above, and composed again.

Anything else that cannot be recomputed -- not JSON, not a dict, not a dpmf report, an unknown
method, an edited description -- raises :class:`~dpmf.errors.InvalidParameterError` with the reason.

>>> import dpmf
>>> from dpmf.sampling import PoissonSampling
>>> from dpmf.strategies import Identity
>>> r = dpmf.account(Identity(100), PoissonSampling(0.05, 100), 2.0, 1e-5)
>>> v = verify_report(r.to_json())
>>> v.holds, v.recomputed_epsilon == r.epsilon, v.edited
(True, True, False)
>>> d = r.to_dict()
>>> d["epsilon"] = 0.5
>>> v = verify_report(d)
>>> print(v.message)  # doctest: +ELLIPSIS
claimed epsilon 0.5 < recomputed 1.09... at delta 1e-05 (method pld)
>>> v.edited
True
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Mapping

from dpmf.accounting.report import DIGEST_PREFIX, PrivacyReport, jsonable, report_digest
from dpmf.errors import DPMFError, InvalidParameterError
from dpmf.files import read_json

try:  # the marker the accountant guard records for an option that is a Python object
    from dpmf.accounting.guard import EXECUTION_OPTIONS, NOT_RECORDABLE
except ImportError:  # pragma: no cover - older layout
    EXECUTION_OPTIONS = frozenset({"workers", "scheduler", "callback", "cache_dir", "checkpoint"})
    NOT_RECORDABLE = "<not recordable: a Python object>"

__all__ = ["Verification", "verify_report", "load_report", "training_summary", "REL_SLACK"]

#: Relative slack for floating-point noise when comparing the recomputed epsilon with the claim.
REL_SLACK = 1e-9

#: Keys every dpmf privacy report has (``PrivacyReport.to_dict()``).
REPORT_KEYS = ("epsilon", "delta", "noise_multiplier", "method", "certified", "strategy", "scheme")

MONTECARLO = "montecarlo"
COMPOSITION = "composition"  # dpmf.compose: recomputed from its parts
MONTECARLO_EVR = "montecarlo-evr"
#: Monte Carlo account options recovered from ``diagnostics`` when ``options`` lacks them.
_MC_FROM_DIAGNOSTICS = {
    "seed": "seed_entropy",
    "num_samples": "num_samples",
    "chunk_size": "chunk_size",
    "confidence": "confidence",
    "resolution": "grid_resolution",
}


@dataclass(frozen=True)
class Verification:
    """Outcome of :func:`verify_report`.

    ``holds`` is True iff the claimed epsilon (and every claimed direction) is at least the
    recomputed one up to :data:`REL_SLACK` and the ``certified`` claims agree; ``message`` says
    what holds or, otherwise, everything that does not. ``estimate`` is True for Monte Carlo
    reports (the recomputation reproduces an estimate, not a proof). ``edited`` is, separately,
    whether the report changed since it was produced: False (its digest matches), True (it does
    not) or None (no digest: cannot tell); ``edit_message`` says which in words. ``report`` is the
    recomputed :class:`~dpmf.accounting.report.PrivacyReport`.
    """

    holds: bool
    claimed_epsilon: float
    recomputed_epsilon: float
    method: str
    message: str
    delta: float
    noise_multiplier: float
    claimed_certified: bool
    recomputed_certified: bool
    estimate: bool = False
    problems: tuple[str, ...] = ()
    edited: bool | None = None
    edit_message: str = ""
    report: PrivacyReport | None = field(default=None, repr=False, compare=False)
    #: A training run's report says what was trained (its ``diagnostics["training"]``, covered by
    #: the digest like the rest of the description): that dict, and its line
    #: (:func:`training_summary`); ``None`` for other reports.
    training: dict | None = field(default=None, repr=False)
    trained: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready (infinite epsilons as ``"inf"``); the recomputed report's by-direction epsilons
        under ``recomputed_epsilon_by_direction``."""
        out = {
            "holds": self.holds,
            "claimed_epsilon": self.claimed_epsilon,
            "recomputed_epsilon": self.recomputed_epsilon,
            "method": self.method,
            "message": self.message,
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "claimed_certified": self.claimed_certified,
            "recomputed_certified": self.recomputed_certified,
            "estimate": self.estimate,
            "problems": list(self.problems),
            "edited": self.edited,
            "edit_message": self.edit_message,
        }
        if self.report is not None:
            out["recomputed_epsilon_by_direction"] = dict(self.report.epsilon_by_direction)
        if self.training is not None:
            out["training"] = self.training
        return jsonable(out)

    def summary(self) -> str:
        """For people, what ``dpmf verify`` prints: ``HOLDS: ...`` or ``DOES NOT HOLD: ...``, then
        whether the report was edited (``NOT EDITED: ...``, ``EDITED: ...`` or ``NO DIGEST: ...``),
        then, for a training run's report, what was trained (``trained: ...``,
        :func:`training_summary`)."""
        lines = [f"{'HOLDS' if self.holds else 'DOES NOT HOLD'}: {self.message}", self.edit_message]
        return "\n".join(lines + ([self.trained] if self.trained else []))


def training_summary(report) -> str | None:
    """One line saying what a training run's report covers (``privacy.report()``, or its JSON dict):
    steps done of steps planned, clip norm, normalizer, and the ``dpmf plan`` row it came from;
    ``None`` for a report that is not a training run's. ``dpmf verify`` and
    :meth:`Verification.summary` print it. A value of the wrong type reads ``?`` (a report is read,
    never trusted: an edited one must still print)."""
    t = _training(report)
    if t is None:
        return None

    def num(value, spec="g"):
        ok = isinstance(value, Real) and not isinstance(value, bool)
        return format(value, spec) if ok else "?"

    line = (f"trained: {t.get('steps_done', '?')} of {t.get('steps_planned', '?')} planned steps, clip norm "
            f"{num(t.get('max_grad_norm'))}, normalizer {num(t.get('normalizer'))}, {num(t.get('num_examples'))} "
            f"examples, per-example gradients {t.get('grad_sample_mode', '?')}")
    row = t.get("plan_row")
    if isinstance(row, Mapping):
        run = row.get("run") if isinstance(row.get("run"), Mapping) else {}
        rank = f" {row['rank']}" if row.get("rank") is not None else ""
        line += (f"; from dpmf plan row{rank}: {row.get('strategy')} / {row.get('sampling')} ({row.get('method')}, "
                 f"sigma {num(row.get('noise_multiplier', float('nan')), '.6g')}), planned for "
                 f"{run.get('dataset_size')} examples, batch {run.get('batch_size')}, {run.get('epochs')} epochs, "
                 f"target epsilon {run.get('epsilon')} at delta {run.get('delta')}")
    return line


# ---------------------------------------------------------------------------------- reading
def load_report(report) -> dict:
    """A saved report as a dict: from a :class:`PrivacyReport`, a dict, JSON text or a path to a JSON
    file (as written by ``dpmf account --json``); nothing is checked or recomputed here
    (:func:`verify_report` does that). Raises :class:`InvalidParameterError` for anything else."""
    if isinstance(report, PrivacyReport):
        return report.to_dict()
    if isinstance(report, Mapping):
        return dict(report)
    if isinstance(report, str) and report.lstrip().startswith("{"):
        text, where = report, "the report text"
    elif isinstance(report, (str, Path)):
        data = read_json(report, "dpmf report")  # one loader for every file dpmf reads (dpmf.files)
        if not isinstance(data, dict):
            raise InvalidParameterError(
                f"{report}: not a dpmf report (a JSON {type(data).__name__}, not an object)"
            )
        return data
    else:
        raise InvalidParameterError(
            f"report must be a dict, a JSON string or a path to a JSON file, got {type(report).__name__}"
        )
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InvalidParameterError(f"{where}: not a dpmf report (not JSON: {exc})") from None
    if not isinstance(data, dict):
        raise InvalidParameterError(f"{where}: not a dpmf report (a JSON {type(data).__name__}, not an object)")
    return data


def _epsilon(value, key: str) -> float:
    if isinstance(value, str) and value in ("inf", "Infinity"):
        return math.inf
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(float(value)) or float(value) < 0:
        raise InvalidParameterError(f"report key {key!r} must be a number >= 0 (or \"inf\"), got {value!r}")
    return float(value)


def _check_report(d: dict) -> None:
    missing = [k for k in REPORT_KEYS if k not in d]
    if missing:
        have = ", ".join(repr(k) for k in list(d)[:8]) or "none"
        raise InvalidParameterError(
            f"not a dpmf privacy report: missing key(s) {', '.join(repr(k) for k in missing)} (it has {have})"
        )
    for key in ("delta", "noise_multiplier"):
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(float(v)) or float(v) <= 0:
            raise InvalidParameterError(f"report key {key!r} must be a finite number > 0, got {v!r}")
    if not float(d["delta"]) < 1:
        raise InvalidParameterError(f"report key 'delta' must be in (0, 1), got {d['delta']!r}")
    if not isinstance(d["method"], str):
        raise InvalidParameterError(f"report key 'method' must be a string, got {d['method']!r}")
    if not isinstance(d["certified"], bool):
        raise InvalidParameterError(f"report key 'certified' must be true or false, got {d['certified']!r}")
    for key in ("strategy", "scheme"):
        if not isinstance(d[key], dict):
            raise InvalidParameterError(
                f"report key {key!r} must be the {key}'s description (a dict), got {type(d[key]).__name__}"
            )
    for key in ("options", "diagnostics", "epsilon_by_direction"):
        if key in d and not isinstance(d[key], dict):
            raise InvalidParameterError(f"report key {key!r} must be a dict, got {type(d[key]).__name__}")


def _options(d: dict) -> dict:
    opts = dict(d.get("options") or {})
    bad = sorted(k for k, v in opts.items() if isinstance(v, str) and v.startswith(NOT_RECORDABLE[:16]))
    if bad:
        raise InvalidParameterError(
            f"the report was made with option(s) {', '.join(map(repr, bad))} set to a Python object "
            "(e.g. a custom sampler) that a report cannot record; it cannot be recomputed"
        )
    return {k: v for k, v in opts.items() if k not in EXECUTION_OPTIONS and v is not None}


def _montecarlo_options(d: dict, opts: dict) -> dict:
    from dpmf.accounting.montecarlo.run import DEFAULT_SAMPLER

    diag = d.get("diagnostics") or {}
    sampler = diag.get("sampler")
    if sampler is not None and sampler != DEFAULT_SAMPLER:
        raise InvalidParameterError(
            f"the Monte Carlo report was made with the custom sampler {sampler!r}; verify can only re-run "
            "the default sampler"
        )
    if diag.get("spawn_key"):
        raise InvalidParameterError(
            "the Monte Carlo report is one candidate of a calibration (it has a spawn key); it cannot be "
            "re-checked on its own"
        )
    if diag.get("complete") is False:
        raise InvalidParameterError(
            "the Monte Carlo report is from a partial run (not all samples drawn); finish the run "
            "('dpmf montecarlo resume') and report again before verifying"
        )
    out = dict(opts)
    for opt, key in _MC_FROM_DIAGNOSTICS.items():
        if opt not in out and diag.get(key) is not None:
            out[opt] = diag[key]
    sampler_options = diag.get("sampler_options") or {}
    if "dataset_size" not in out and isinstance(sampler_options, dict) and sampler_options.get("dataset_size"):
        out["dataset_size"] = sampler_options["dataset_size"]
    if out.get("seed") is None:
        raise InvalidParameterError(
            "the Monte Carlo report records no seed (neither options['seed'] nor diagnostics['seed_entropy']): "
            "its estimate cannot be reproduced, so verify refuses it"
        )
    return out


# ---------------------------------------------------------------------------------- edits
def _edited(d: dict) -> tuple[bool | None, str]:
    """(edited, message) from the report's ``digest`` (module docstring)."""
    if "digest" not in d:
        return None, (
            "NO DIGEST: cannot tell whether the report was edited since it was produced (it records no "
            "digest: written before dpmf recorded digests, or the digest was removed)"
        )
    stored = d["digest"]
    if isinstance(stored, str) and stored.startswith(DIGEST_PREFIX) and stored == report_digest(d):
        return False, "NOT EDITED: the report's digest matches its description and claim"
    return True, (
        "EDITED since it was produced: its description or claim no longer matches its digest (the claim "
        "was checked as the report reads now)"
    )


# ---------------------------------------------------------------------------------- verify
def _recompose(d: dict, delta: float, search_dir, matrices, workers) -> PrivacyReport:
    """A composition report (:func:`dpmf.compose`) recomputed from its parts' descriptions (each part
    re-checked by :func:`verify_report`)."""
    from dpmf.accounting.composed import composition_parts, composition_report
    from dpmf.accounting.dispatch import METHODS

    reports, times = composition_parts(d)
    parts = []
    for i, (part, k) in enumerate(zip(reports, times), 1):
        m = part.get("method")
        takes = m == COMPOSITION or (m in METHODS and "workers" in METHODS[m].run_options)
        try:
            v = verify_report(part, search_dir=search_dir, matrices=matrices, workers=workers if takes else None)
        except DPMFError as exc:
            raise InvalidParameterError(f"part {i} of the composition cannot be recomputed: {exc}") from None
        parts.append((v.report, k, {"source": f"part {i}", "recomputed": True, "claim_held": v.holds}))
    disc = (d.get("options") or {}).get("discretization")
    try:
        return composition_report(parts, delta, discretization=disc)
    except DPMFError as exc:
        raise InvalidParameterError(f"the composition cannot be recomputed from its parts: {exc}") from None


def _folder_of(report) -> Path | None:
    """The folder of a report given as a path (None for a dict, JSON text or a report object): where
    ``save_report`` writes the dense matrices the report names by hash."""
    if isinstance(report, Path) or (isinstance(report, str) and not report.lstrip().startswith("{")):
        return Path(report).resolve().parent
    return None


def _fmt(x: float) -> str:
    return f"{x:.10g}" if math.isfinite(x) else str(x)


def _holds(recomputed: float, claimed: float) -> bool:
    if math.isinf(claimed):
        return True
    return recomputed <= claimed + REL_SLACK * abs(claimed)


def verify_report(
    report: dict | str | Path | PrivacyReport,
    *,
    search_dir: str | Path | None = None,
    matrices=None,
    workers: int | None = None,
):
    """Recompute a saved privacy report and say whether its claim holds (module docstring).

    ``report`` is a report dict (``PrivacyReport.to_dict()``), its JSON text, a path to a JSON
    file (e.g. the output of ``dpmf account --json``) or a :class:`PrivacyReport`. ``search_dir``
    / ``matrices`` supply dense strategy matrices the report references by hash
    (:func:`~dpmf.strategies.serialization.find_matrix`); ``search_dir`` defaults to the folder of a
    report given as a path, where ``save_report`` writes them. ``workers`` (MMCC, Monte Carlo) only
    changes how the recomputation runs, never its value. Returns a :class:`Verification` (the
    claim's verdict, and separately whether the report was edited); raises
    :class:`~dpmf.errors.InvalidParameterError` when the report cannot be recomputed.
    """
    from dpmf.accounting.dispatch import METHODS, account
    from dpmf.sampling.serialization import scheme_from_dict
    from dpmf.strategies.serialization import strategy_from_dict

    if search_dir is not None:
        from dpmf.files import check_input_dir

        check_input_dir(search_dir, "search_dir")
    d = load_report(report)
    if search_dir is None:
        search_dir = _folder_of(report)
    _check_report(d)
    edited, edit_message = _edited(d)
    method = d["method"]
    if method == MONTECARLO_EVR:
        seed = (d.get("diagnostics") or {}).get("seed_entropy")
        hint = f" with seed {seed}" if seed is not None else ""
        raise InvalidParameterError(
            "method 'montecarlo-evr' is a Monte Carlo calibration (Estimate-Verify-Release); re-checking it "
            "means re-running the whole calibration, which verify does not do (run 'dpmf calibrate --method "
            f"montecarlo' again{hint})"
        )
    if method not in METHODS and method != COMPOSITION:
        raise InvalidParameterError(
            f"report key 'method' must be one of {sorted([*METHODS, COMPOSITION])}, got {method!r}"
        )
    claimed = _epsilon(d["epsilon"], "epsilon")
    delta, sigma = float(d["delta"]), float(d["noise_multiplier"])
    claimed_dirs = {
        k: _epsilon(v, f"epsilon_by_direction[{k!r}]") for k, v in (d.get("epsilon_by_direction") or {}).items()
    }
    if method == COMPOSITION:  # (dpmf compose --json): recomputed from its parts, each from its description
        new = _recompose(d, delta, search_dir, matrices, workers)
    else:
        strategy = strategy_from_dict(d["strategy"], matrices=matrices, search_dir=search_dir)
        scheme = scheme_from_dict(d["scheme"])
        opts = _options(d)
        if method == MONTECARLO:
            opts = _montecarlo_options(d, opts)
        if workers is not None and "workers" in getattr(METHODS[method], "run_options", ()):
            opts["workers"] = workers
        elif workers is not None:  # an option the recomputation would ignore is an error (README)
            takes = sorted(name for name, m in METHODS.items() if "workers" in m.run_options)
            raise InvalidParameterError(
                f"workers (--workers) {workers!r} is not used to recompute a report of method {method!r} (it "
                f"runs in this process); only {', '.join(takes)} reports take workers: leave it out"
            )
        try:
            new = account(strategy, scheme, sigma, delta, method=method, **opts)
        except DPMFError as exc:
            raise InvalidParameterError(f"the report cannot be recomputed from its own inputs: {exc}") from None

    problems = []
    at = f"at delta {delta:g}"
    if not _holds(new.epsilon, claimed):
        problems.append(f"claimed epsilon {_fmt(claimed)} < recomputed {_fmt(new.epsilon)} {at} (method {method})")
    for direction, eps in claimed_dirs.items():
        got = new.epsilon_by_direction.get(direction)
        if got is None:
            problems.append(f"the report claims a {direction!r} direction that {method} does not compute")
        elif not _holds(float(got), eps):
            problems.append(
                f"claimed {direction}-direction epsilon {_fmt(eps)} < recomputed {_fmt(float(got))}"
            )
    target = d.get("target_epsilon")  # reports of dpmf calibrate --json
    if target is not None:
        target = _epsilon(target, "target_epsilon")
        if not _holds(new.epsilon, target):
            problems.append(f"recomputed epsilon {_fmt(new.epsilon)} > the calibration target {_fmt(target)}")
    if new.certified != d["certified"]:
        problems.append(
            f"the report claims certified={d['certified']} but {method} gives certified={new.certified}"
            + (" (an estimate, not a proof)" if not new.certified else "")
        )
    estimate = not new.certified
    if problems:
        message = "; ".join(problems)
    else:
        kind = "an ESTIMATE reproduced from its recorded seed" if estimate else "certified upper bound"
        message = f"claimed epsilon {_fmt(claimed)} >= recomputed {_fmt(new.epsilon)} {at} (method {method}, {kind})"
    return Verification(
        holds=not problems,
        claimed_epsilon=claimed,
        recomputed_epsilon=float(new.epsilon),
        method=method,
        message=message,
        delta=delta,
        noise_multiplier=sigma,
        claimed_certified=bool(d["certified"]),
        recomputed_certified=bool(new.certified),
        estimate=estimate,
        problems=tuple(problems),
        edited=edited,
        edit_message=edit_message,
        report=new,
        training=_training(d),
        trained=training_summary(d),
    )


def _training(report) -> dict | None:
    """The report's ``diagnostics["training"]`` (what a training run trained), else ``None``
    (``report``: a report dict or a :class:`PrivacyReport`)."""
    diag = report.get("diagnostics") if isinstance(report, Mapping) else getattr(report, "diagnostics", None)
    t = diag.get("training") if isinstance(diag, Mapping) else None
    return dict(t) if isinstance(t, Mapping) else None
