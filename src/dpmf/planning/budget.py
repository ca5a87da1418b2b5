"""The time budget of ``dpmf plan``: the costly candidates calibrated in worker processes until a
deadline, keeping every certificate they produce on the way.

The plan's first waves (closed forms and the cheap amplified accountants, :mod:`.candidates`) take
seconds and always run to the end. Its last wave -- MMCC under Poisson sampling, BandMF under
balls-in-bins with the Markov members of ``allocation_pld``, the optimal factorization -- can take
minutes (one evaluation of BandMF with a fresh slot each epoch costs 10-20 s at 1000 steps, and a
calibration needs about ten). :func:`run_until` runs those candidates in worker processes (one per
CPU, at most ``workers``) and stops them at the deadline.

**What a cut row certifies.** A calibration evaluates its accountant at a sequence of noises; every
evaluation whose epsilon is at most the target *certifies* that noise (the accountant's bound is
proved at that very noise). The workers report each evaluation as it ends, so a candidate stopped at
the deadline keeps the smallest noise certified so far: its row (``cut=True``) is as sound as any
other -- its epsilon is the accountant's at its noise -- only not the *smallest* noise the accountant
would certify (a full calibration gives at most that noise, hence at most that RMSE: tightening can
only move the row up the ranking). A candidate stopped before any passing evaluation gives no row;
:class:`Cut` names it. Evaluations above the target are lower bounds only for a single-method
candidate, and are not used as certificates.

Nothing else changes: a candidate that finishes before the deadline gives the same row as without a
budget (same threshold, same calibration).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from dpmf.planning.candidates import Candidate, TrainingRun
from dpmf.planning.rows import PlanRow

#: The costly wave (:mod:`dpmf.planning.candidates`), the only one a budget stops: the earlier,
#: quick waves always run to the end (also in a plan of ``only`` some candidates).
COSTLY_WAVE = 2
#: The time budget of ``dpmf plan`` and of :func:`dpmf.planner.plan` when none is given (seconds):
#: the plan answers within about half a minute. ``thorough=True`` (``--thorough``): no budget.
DEFAULT_BUDGET = 25.0


def resolve_budget(budget: float | None, thorough: bool, *, names=("budget", "thorough")) -> float | None:
    """The budget a plan runs under: ``budget`` (seconds, finite, > 0), :data:`DEFAULT_BUDGET` when
    it is ``None``, and ``None`` (no limit) with ``thorough``. Both a budget and ``thorough`` is a
    contradiction, refused (:class:`~dpmf.errors.InvalidParameterError`) rather than one of them
    silently ignored. ``names``: how the two are called in the message (the CLI's flags)."""
    from dpmf import validation as _v
    from dpmf.errors import InvalidParameterError

    if not isinstance(thorough, bool):
        raise InvalidParameterError(f"{names[1]} must be True or False, got {thorough!r}")
    if budget is None:
        return None if thorough else DEFAULT_BUDGET
    if isinstance(budget, bool):
        raise InvalidParameterError(f"{names[0]} must be a number of seconds > 0, got {budget!r}")
    value = _v.positive(names[0], budget)
    if thorough:
        raise InvalidParameterError(
            f"{names[0]} {value:g} and {names[1]} contradict each other: {names[1]} means no time budget; "
            f"pass one of them (a larger {names[0]} gives the costly candidates more time)"
        )
    return value


def budgeted_cost(estimate, budget: float | None):
    """The up-front estimate (:class:`~dpmf.accounting.cost.CostEstimate` of
    :func:`~dpmf.accounting.cost.plan_cost`) of a plan under ``budget``: its first part, the quick
    waves, in full (they always run to the end, whatever the budget), the costly parts scaled down
    to take at most ``budget`` seconds together. ``None``: no budget, ``estimate`` unchanged.
    Memory is unchanged (a stopped worker has already used it)."""
    from dpmf.accounting.cost import CostEstimate

    if budget is None or not estimate.parts:
        return estimate
    quick, costly = estimate.parts[0], estimate.parts[1:]
    total = sum(p[1] for p in costly)
    scale = min(1.0, budget / total) if total > 0 else 1.0
    parts = (quick,) + tuple((what + (" (until the budget)" if scale < 1 else ""), s * scale, m)
                             for what, s, m in costly)
    return CostEstimate(sum(p[1] for p in parts), estimate.memory_bytes, parts)


@dataclass(frozen=True)
class Cut:
    """A candidate with no row: the budget stopped it before it certified any noise
    (``by_budget``), or it was skipped or lost for another ``reason`` (it would not fit in memory,
    its worker died). Its label, names, the evaluations it made (none passing), the seconds it ran
    and why it has no row."""

    label: str
    strategy: str
    sampling: str
    method: str
    evaluations: int
    seconds: float
    #: why it has no row, in words (every cut has one)
    reason: str = ""
    #: the time budget stopped it (a larger budget or ``thorough`` computes it; cached per budget)
    by_budget: bool = False


def _child(i: int, cand: Candidate, run: TrainingRun, threshold: float, conn) -> None:
    """A worker: calibrate ``cand`` and report each evaluation, then the row (or the error), on its
    own pipe ``conn`` (one per worker: stopping one mid-message cannot garble another's)."""
    from dpmf import progress
    from dpmf.planning.evaluate import evaluate
    from dpmf.resources import one_blas_thread

    try:  # (one BLAS thread: the workers already fill the CPUs, and threaded small products are slower)
        with progress.reporting("off"), one_blas_thread():
            row = evaluate(cand, run, threshold, callback=lambda s, e: conn.send(("eval", i, float(s), float(e))))
        conn.send(("row", i, row))
    except BaseException as exc:  # (reported to the parent, which raises it there)
        conn.send(("error", i, f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _context():
    import multiprocessing
    import sys

    # fork where it exists (a worker starts in milliseconds, with dpmf already imported)
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def run_until(cands: list[Candidate], run: TrainingRun, threshold, deadline: float | None, *,
              processes: int, on_eval=None, on_start=None, quick=(), lookup=None, on_row=None
              ) -> tuple[dict[int, PlanRow], dict[int, PlanRow], dict[int, Cut]]:
    """Calibrate ``cands`` (indices into the list, started in list order) against ``threshold`` in up
    to ``processes`` worker processes until ``deadline`` (a :func:`time.monotonic` value; ``None``:
    no deadline).

    Returns ``(finished, partial, cut)``: the rows of the candidates that finished, the rows of those
    the deadline stopped after a passing evaluation (``cut=True``; module docstring), and the ones it
    stopped before any (:class:`Cut`). ``on_eval(i, sigma, epsilon)`` after each evaluation,
    ``on_start(i)`` when a worker starts on candidate ``i`` (the CLI's progress names it),
    ``on_row(i, row, threshold)`` when candidate ``i`` finishes (with the threshold it ran against).

    Running quick and costly candidates together (:func:`dpmf.planner.plan` under a budget):
    ``quick`` (indices) run to the end whatever the deadline (only the others are stopped by it);
    while costly candidates wait and none runs, the next free worker takes the first of them (one
    worker is kept for the costly ones: the quick ones never starve them). ``threshold`` may be a
    function, called when a candidate starts: the best prefix RMSE certified so far (pruning
    against any certified row is sound). ``lookup(i, threshold)``: a row found without running
    (the cache), or ``None``."""
    from multiprocessing.connection import wait as wait_any

    ctx = _context()
    pipes: dict[int, object] = {}  # i -> the parent's end of its worker's pipe
    quick = set(quick)
    pending = list(range(len(cands)))
    active: dict[int, tuple] = {}  # i -> (process, start)
    evals: dict[int, list[tuple[float, float]]] = {i: [] for i in pending}
    finished: dict[int, PlanRow] = {}
    used: dict[int, float] = {}  # i -> the threshold it ran against
    died: dict[int, tuple[int, float]] = {}  # i -> (exit code, seconds) of a worker that died
    stopped: dict[int, float] = {}  # i -> seconds, costly candidates stopped at the deadline

    def late() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    def next_index() -> int | None:
        allowed = [i for i in pending if i in quick or not late()]
        if not allowed:
            return None
        costly = [i for i in allowed if i not in quick]
        if quick and costly and not any(j not in quick for j in active):
            return costly[0]  # (the reserved worker)
        return allowed[0]

    def done(i: int, row: PlanRow) -> None:
        finished[i] = row
        if on_row is not None:
            on_row(i, row, used[i])

    try:
        while pending or active:
            while len(active) < max(1, processes) and (i := next_index()) is not None:
                pending.remove(i)
                used[i] = threshold() if callable(threshold) else threshold
                hit = None if lookup is None else lookup(i, used[i])
                if hit is not None:
                    done(i, hit)
                    continue
                reader, writer = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child, args=(i, cands[i], run, used[i], writer), daemon=True)
                p.start()
                writer.close()  # (the child holds it: its end closes when the child does)
                pipes[i] = reader
                active[i] = (p, time.perf_counter())
                if on_start is not None:
                    on_start(i)
            if late():  # stop the costly candidates; the quick ones run on
                for i in [i for i in active if i not in quick]:
                    p, start = active.pop(i)
                    p.terminate()
                    p.join()
                    stopped[i] = time.perf_counter() - start
                if not active and not any(i in quick for i in pending):
                    break
            if not active:
                if pending and next_index() is not None:
                    continue
                break
            wait = 1.0 if deadline is None or late() else min(deadline - time.monotonic(), 1.0)
            ready = wait_any([pipes[i] for i in active], timeout=max(wait, 0.01))
            if not ready:
                continue
            i = next(j for j in active if pipes[j] in ready)
            try:
                msg = pipes[i].recv()
            except (EOFError, OSError):  # a worker that ended without its row (killed from outside: memory)
                p, start = active.pop(i)
                p.join()
                died[i] = (p.exitcode, time.perf_counter() - start)  # (only its certified evaluations count)
                continue
            kind = msg[0]
            if kind == "eval":
                evals[i].append((msg[2], msg[3]))
                if on_eval is not None:
                    on_eval(i, msg[2], msg[3])
            elif kind == "row":
                p, _ = active.pop(i)
                p.join()
                done(i, msg[2])
            else:
                p, _ = active.pop(i)
                p.join()
                from dpmf.errors import DPMFError

                raise DPMFError(f"calibrating {cands[i].label!r}: {msg[2]}")
    finally:
        now = time.perf_counter()
        stopped.update({i: now - start for i, (p, start) in active.items()})
        stopped.update({i: seconds for i, (_, seconds) in died.items()})
        for p, _ in active.values():
            p.terminate()
        for p, _ in active.values():
            p.join()
        for c in pipes.values():
            c.close()
    partial, cut = _stopped_rows(cands, run, evals, stopped, died, pending)
    return finished, partial, cut


def _stopped_rows(cands, run, evals, stopped, died, pending) -> tuple[dict[int, PlanRow], dict[int, Cut]]:
    """The cut rows (a certified noise) and cut entries (none) of the candidates stopped or never
    started (:func:`run_until`)."""
    partial: dict[int, PlanRow] = {}
    cut: dict[int, Cut] = {}
    for i in list(stopped) + pending:
        cand, seconds = cands[i], stopped.get(i, 0.0)
        passing = [s for s, e in evals[i] if e <= run.epsilon]
        if passing:
            s = min(passing)
            eps = max(e for t, e in evals[i] if t == s)
            partial[i] = cut_row(cand, run, s, eps, len(evals[i]), seconds)
        else:
            if i in died:
                reason = (f"its worker process died (exit code {died[i][0]}, e.g. killed for memory) before it "
                          "certified a noise")
            else:
                reason = (f"stopped by the time budget after {len(evals[i])} evaluations in {seconds:.0f} s, before "
                          "any certified a noise: not ranked, it could rank anywhere (a larger budget, or a thorough "
                          "plan, computes it)")
            cut[i] = Cut(cand.label, cand.strategy_name, cand.sampling_name, cand.method, len(evals[i]), seconds,
                         reason, by_budget=i not in died)
    return partial, cut


def cut_row(cand: Candidate, run: TrainingRun, sigma: float, epsilon: float, evaluations: int,
            seconds: float) -> PlanRow:
    """The row of a candidate stopped by the budget after certifying ``sigma`` (epsilon
    ``<= run.epsilon`` there, from its accountant): certified, ``cut=True``."""
    from dpmf.planning.evaluate import make_row

    row = make_row(cand, run, method=cand.method, sigma=sigma, epsilon=epsilon, certified=True,
               rmse=sigma * cand.rmse_per_sigma(), start=time.perf_counter() - seconds,
               note=f"cut by the time budget after {evaluations} evaluations in {seconds:.0f} s: noise {sigma:.4g} is "
                    "certified, a full calibration (--thorough) finds at most that noise, so the row can only move up")
    return replace(row, cut=True)


def budget_left(deadline: float | None) -> float:
    """Seconds until ``deadline`` (``inf`` without one)."""
    return math.inf if deadline is None else max(0.0, deadline - time.monotonic())
