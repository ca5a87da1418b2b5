"""The time budget of ``dpmf plan``: the costly candidates calibrated in worker processes until a
deadline, keeping every certificate they produce on the way.

The plan's first waves (closed forms and the cheap amplified accountants, :mod:`.candidates`) take
seconds and always run to the end. Its last wave -- MMCC under Poisson sampling, BandMF under
balls-in-bins with the Markov members of ``allocation_pld``, the optimal factorization -- can take
minutes (one evaluation of BandMF with a fresh slot each epoch costs 10-20 s at 1000 steps, and a
calibration needs about ten). :func:`run_until` runs those candidates in worker processes (one per
CPU, at most ``workers``) and stops them at the deadline, first answers first: a candidate that has
certified a noise is paused (``SIGSTOP``) while another has no answer yet, so every candidate is
certified or pruned before any is refined, and an unanswered one gets :func:`answer_grace` more.
Since the plan's calibrations start their search at the noise they must beat (a passing probe
there is a certified row at once; :func:`dpmf.calibrate`'s ``max_noise_multiplier``), a first
answer costs one evaluation.

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


def _child(i: int, cand: Candidate, run: TrainingRun, threshold: float, conn, spool: str) -> None:
    """A worker: calibrate ``cand`` and report each evaluation, then the row (or the error), on its
    own pipe ``conn`` (one per worker: stopping one mid-message cannot garble another's).

    Every message is small (under ``PIPE_BUF``, written by one ``write``: a worker paused with
    ``SIGSTOP`` is never caught half-way through one); the row itself, which may carry matrices, is
    pickled into a file of the folder ``spool`` and its path sent."""
    import os
    import pickle

    from dpmf import progress
    from dpmf.files import atomic_write
    from dpmf.planning.evaluate import evaluate
    from dpmf.resources import one_blas_thread

    try:  # (one BLAS thread: the workers already fill the CPUs, and threaded small products are slower)
        with progress.reporting("off"), one_blas_thread():
            row = evaluate(cand, run, threshold, callback=lambda s, e: conn.send(("eval", i, float(s), float(e))))
        path = os.path.join(spool, f"{i}.row")
        with atomic_write(path, "plan row", fsync=False) as f:  # (a transport file: the parent reads it at once)
            pickle.dump(row, f, protocol=pickle.HIGHEST_PROTOCOL)
        conn.send(("row", i, path))
    except BaseException as exc:  # (reported to the parent, which raises it there)
        conn.send(("error", i, f"{type(exc).__name__}: {exc}"[:2000]))
    finally:
        conn.close()


def _context():
    import multiprocessing
    import sys

    # fork where it exists (a worker starts in milliseconds, with dpmf already imported)
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


#: A costly candidate still without an answer at the deadline -- no noise certified, not pruned --
#: runs on for up to this fraction of the budget more (and no more than :data:`ANSWER_GRACE_MAX`
#: seconds) to give its first one: on a machine loaded by other work the same evaluations take
#: longer, and a row that "could rank anywhere" answers nothing. Candidates with an answer stop at
#: the deadline itself. The default budget of 25 s thus ends by 60 s at the latest.
ANSWER_GRACE = 1.4
ANSWER_GRACE_MAX = 300.0


def answer_grace(budget: float | None) -> float:
    """Seconds past the deadline that unanswered costly candidates may run (:data:`ANSWER_GRACE`)."""
    return 0.0 if budget is None else min(ANSWER_GRACE * float(budget), ANSWER_GRACE_MAX)


def run_until(cands: list[Candidate], run: TrainingRun, threshold, deadline: float | None, *,
              processes: int, on_eval=None, on_start=None, quick=(), lookup=None, on_row=None, grace: float = 0.0
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
    (the cache), or ``None``.

    **First answers first.** A costly candidate that has certified a noise (it has a cut row) is
    paused (``SIGSTOP``) while a costly candidate that has no answer yet waits for a worker, and
    resumed once none waits: every candidate gets its first answer (a certified noise, or pruned)
    before any is refined. At the deadline the answered ones stop; ``grace`` (seconds,
    :func:`answer_grace`) lets the unanswered ones run on -- and start -- until they answer or the
    grace ends."""
    import shutil
    import tempfile

    spool = tempfile.mkdtemp(prefix="dpmf-plan-")
    try:
        pool = _Workers(cands, run, threshold, deadline, processes, set(quick), grace, spool, on_eval, on_start,
                        lookup, on_row)
        pool.run()
    finally:
        shutil.rmtree(spool, ignore_errors=True)
    partial, cut = _stopped_rows(cands, run, pool.evals, pool.stopped, pool.died, pool.pending)
    return pool.finished, partial, cut


class _Workers:
    """The worker processes of :func:`run_until` and their schedule."""

    def __init__(self, cands, run, threshold, deadline, processes, quick, grace, spool, on_eval, on_start, lookup,
                 on_row):
        self.cands, self.run_spec, self.threshold, self.deadline = cands, run, threshold, deadline
        self.processes, self.quick, self.spool = max(1, processes), quick, spool
        self.hard = None if deadline is None else deadline + max(0.0, grace)
        self.on_eval, self.on_start, self.lookup, self.on_row = on_eval, on_start, lookup, on_row
        self.ctx = _context()
        self.pipes: dict[int, object] = {}  # i -> the parent's end of its worker's pipe
        self.pending = list(range(len(cands)))
        self.active: dict[int, tuple] = {}  # i -> (process, start), running
        self.paused: dict[int, tuple] = {}  # i -> (process, start), stopped by SIGSTOP (answered)
        self.evals: dict[int, list[tuple[float, float]]] = {i: [] for i in self.pending}
        self.finished: dict[int, PlanRow] = {}
        self.used: dict[int, float] = {}  # i -> the threshold it ran against
        self.died: dict[int, tuple[int, float]] = {}  # i -> (exit code, seconds) of a worker that died
        self.stopped: dict[int, float] = {}  # i -> seconds, costly candidates stopped at the deadline

    # -- the clock
    def late(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def over(self) -> bool:
        return self.hard is not None and time.monotonic() >= self.hard

    def answered(self, i: int) -> bool:
        return any(e <= self.run_spec.epsilon for _, e in self.evals[i])

    # -- the schedule
    def next_index(self) -> int | None:
        """The next candidate to start: quick ones always; costly ones before the deadline, and
        after it (all unanswered: none started) until the grace ends."""
        allowed = [i for i in self.pending if i in self.quick or not self.over()]
        if not allowed:
            return None
        costly = [i for i in allowed if i not in self.quick]
        if self.quick and costly and not any(j not in self.quick for j in self.active):
            return costly[0]  # (the reserved worker)
        return allowed[0]

    def fill(self) -> None:
        """Start candidates while a worker is free; pause an answered costly one for a costly one that
        has no answer yet; resume the paused ones when nothing waits."""
        while True:
            if len(self.active) < self.processes:
                i = self.next_index()
                if i is not None:
                    self.start(i)
                    continue
                if self.paused and not self.late():
                    j = min(self.paused)  # (list order: the most likely to win first)
                    self.active[j] = self.paused.pop(j)
                    self._signal(self.active[j][0], "SIGCONT")
                    continue
                return
            waiting = [i for i in self.pending if i not in self.quick]
            ready = [j for j in self.active if j not in self.quick and self.answered(j)]
            if not (waiting and ready and not self.over()):
                return
            j = max(ready)  # (the least likely to win pauses first)
            self.paused[j] = self.active.pop(j)
            self._signal(self.paused[j][0], "SIGSTOP")

    def start(self, i: int) -> None:
        self.pending.remove(i)
        self.used[i] = self.threshold() if callable(self.threshold) else self.threshold
        hit = None if self.lookup is None else self.lookup(i, self.used[i])
        if hit is not None:
            self.done(i, hit)
            return
        reader, writer = self.ctx.Pipe(duplex=False)
        p = self.ctx.Process(target=_child, args=(i, self.cands[i], self.run_spec, self.used[i], writer, self.spool),
                             daemon=True)
        p.start()
        writer.close()  # (the child holds it: its end closes when the child does)
        self.pipes[i] = reader
        self.active[i] = (p, time.perf_counter())
        if self.on_start is not None:
            self.on_start(i)

    def done(self, i: int, row: PlanRow) -> None:
        self.finished[i] = row
        if self.on_row is not None:
            self.on_row(i, row, self.used[i])

    def stop(self, i: int) -> None:
        """Stop costly candidate ``i`` (running or paused): its evaluations so far are what it gives."""
        p, start = self.active.pop(i) if i in self.active else self.paused.pop(i)
        p.terminate()
        self._signal(p, "SIGCONT")  # (a stopped process acts on SIGTERM once continued)
        p.join()
        self.stopped[i] = time.perf_counter() - start

    @staticmethod
    def _signal(p, name: str) -> None:
        import os
        import signal

        if p.pid is not None and hasattr(signal, name):
            try:
                os.kill(p.pid, getattr(signal, name))
            except ProcessLookupError:  # (it ended on its own meanwhile)
                pass

    # -- the loop
    def run(self) -> None:
        try:
            while self.pending or self.active or self.paused:
                self.fill()
                if self.late():  # the answered costly candidates stop; past the grace all of them
                    for i in [i for i in [*self.active, *self.paused] if i not in self.quick]:
                        if self.over() or self.answered(i) or i in self.paused:
                            self.stop(i)
                    if not self.active and not any(i in self.quick for i in self.pending) and (
                            self.over() or self.next_index() is None):
                        break
                if not self.active:
                    if self.pending and self.next_index() is not None:
                        continue
                    if self.paused:
                        continue
                    break
                self.receive()
        finally:
            now = time.perf_counter()
            for table in (self.active, self.paused):
                self.stopped.update({i: now - start for i, (p, start) in table.items()})
            self.stopped.update({i: seconds for i, (_, seconds) in self.died.items()})
            for p, _ in [*self.active.values(), *self.paused.values()]:
                p.terminate()
                self._signal(p, "SIGCONT")
            for p, _ in [*self.active.values(), *self.paused.values()]:
                p.join()
            for c in self.pipes.values():
                c.close()

    def receive(self) -> None:
        """Wait (until the next deadline, a second at most) for one message and act on it."""
        from multiprocessing.connection import wait as wait_any

        now = time.monotonic()
        ends = [t - now for t in (self.deadline, self.hard) if t is not None and t > now]
        wait = min([1.0, *ends])
        ready = wait_any([self.pipes[i] for i in self.active], timeout=max(wait, 0.01))
        if not ready:
            return
        i = next(j for j in self.active if self.pipes[j] in ready)
        try:
            msg = self.pipes[i].recv()
        except (EOFError, OSError):  # a worker that ended without its row (killed from outside: memory)
            p, start = self.active.pop(i)
            p.join()
            self.died[i] = (p.exitcode, time.perf_counter() - start)  # (only its certified evaluations count)
            return
        kind = msg[0]
        if kind == "eval":
            self.evals[i].append((msg[2], msg[3]))
            if self.on_eval is not None:
                self.on_eval(i, msg[2], msg[3])
            return
        p, _ = self.active.pop(i)
        p.join()
        if kind == "row":
            import os
            import pickle

            with open(msg[2], "rb") as f:
                row = pickle.load(f)
            os.unlink(msg[2])
            self.done(i, row)
            return
        from dpmf.errors import DPMFError

        raise DPMFError(f"calibrating {self.cands[i].label!r}: {msg[2]}")


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
