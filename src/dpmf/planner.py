"""The planner behind ``dpmf plan``: which (strategy, sampler, accountant) should a run use?

Given a training run (dataset size, batch size, epochs, target (epsilon, delta)), every
configuration dpmf can account for is calibrated to the target and ranked by the error the noise
causes in the model updates: the RMSE of the prefix sums of the noisy gradient sums, in units of
the clip norm (the utility measure of the matrix-factorization papers). Lower is better.

The candidates (:func:`candidates`, :mod:`dpmf.planning.candidates`): DP-SGD, sqrt-Toeplitz,
banded Toeplitz (a band sweep), BLT, the binary tree and the multi-epoch optimal factorization
under the shuffled fixed order (no amplification); DP-SGD under Poisson sampling; banded Toeplitz
under cyclic Poisson sampling (the min-sep sweep: cycle = bands); MMCC for banded Toeplitz and the
tree under Poisson sampling (``mmcc=True``, the default, up to 2048 steps); random allocation
(balls-in-bins) for DP-SGD and BSR; Monte Carlo rows (b-min-sep, estimates) only when asked for.

Rows build what they describe (:mod:`dpmf.planning.rows`): each carries its strategy and scheme
as specs, its accountant's options and the run it was planned for; ``row.build()`` returns
``(strategy, scheme, noise_multiplier)``, :func:`export_row` writes a row to a file (``dpmf plan
--export FILE``), and ``dpmf.training.torch.make_private(..., plan=row)`` trains exactly what the
row certified, without calibrating again (docs/tutorials/plan-to-training.md).

Speed (:func:`plan`): candidates run in three waves, cheapest first; a candidate of a later wave
that provably cannot beat the best row so far is *pruned* after one evaluation (a sound bound,
never a reported epsilon: :mod:`dpmf.planning.evaluate`); finished rows are cached on disk
(:mod:`dpmf.planning.cache`), so a rerun is instant; a wave's candidates can run on a Dask cluster
(``scheduler``), with the same rows as a local run. Progress: one :func:`dpmf.progress.task`.
:func:`plan`'s defaults are the command's (a 25 s budget for the costly wave, the default cache,
workers), so ``plan(run)`` answers like ``dpmf plan``; the words of the output are explained once,
in :mod:`dpmf.planning.legend`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

from dpmf import validation as _v
from dpmf.planning.candidates import (  # noqa: F401 - the public names of the planner
    BAND_SWEEP,
    MAX_MMCC_STEPS,
    MAX_OPTIMAL_STEPS,
    MAX_TREE_STEPS,
    OPTIMAL_GAP,
    Candidate,
    StrategySpec,
    TrainingRun,
    band_sweep,
    candidates,
    sort_rows,
)
from dpmf.planning.evaluate import estimate_montecarlo, evaluate  # noqa: F401
from dpmf.planning.rows import BuiltRow, PlanRow, export_row, load_row  # noqa: F401
from dpmf.resources import usable_workers

__all__ = ["TrainingRun", "Candidate", "PlanRow", "PlanResult", "candidates", "plan", "plan_figure", "plot_plan", "export_row",
           "load_row"]


def _evaluate_task(cand: Candidate, run: TrainingRun, threshold: float) -> PlanRow:
    """What a Dask worker or a local worker process runs (a top-level function: picklable), on one
    BLAS thread (:func:`dpmf.resources.one_blas_thread`: the workers already fill the CPUs)."""
    from dpmf.resources import one_blas_thread

    with one_blas_thread():
        return evaluate(cand, run, threshold)


class PlanResult(list):
    """The rows of :func:`plan` (a list, best first) and what its time budget left out: ``cut``
    (:class:`~dpmf.planning.budget.Cut`: candidates stopped before they certified any noise, or
    skipped), ``budget`` (seconds, ``None``: none) and ``seconds`` (the plan's wall time)."""

    def __init__(self, rows=(), *, cut=(), budget=None, seconds=0.0):
        super().__init__(rows)
        self.cut = list(cut)
        self.budget = budget
        self.seconds = seconds

    @property
    def complete(self) -> bool:
        """Every candidate calibrated or pruned (nothing cut by the budget)."""
        return not self.cut and not any(r.cut for r in self)

    def counts(self) -> dict:
        """How each candidate ended: ``certified`` (ranked, calibrated to the end), ``estimates``
        (ranked Monte Carlo estimates), ``pruned``, ``cut`` (stopped by the time budget: a cut row
        or a candidate with none), ``skipped`` (no row for another reason: memory, a worker that
        died) and ``candidates`` (all of them)."""
        ranked = [r for r in self if not r.pruned]
        out = {
            "certified": sum(1 for r in ranked if r.certified and not r.cut),
            "estimates": sum(1 for r in ranked if not r.certified),
            "pruned": sum(1 for r in self if r.pruned),
            "cut": sum(1 for r in self if r.cut) + sum(1 for c in self.cut if c.by_budget),
            "skipped": sum(1 for c in self.cut if not c.by_budget),
        }
        out["candidates"] = len(self) + len(self.cut)
        return out

    def summary(self) -> str:
        """One line: ``"20 candidates: 12 certified, 2 pruned, 6 cut by the time budget (2 with a
        certified noise, 4 not ranked)"`` (zero counts left out, except certified)."""
        return _summary(self.counts(), sum(1 for r in self if r.cut))


def _summary(n: dict, cut_rows: int) -> str:
    parts = [f"{n['certified']} certified"]
    if n["estimates"]:
        parts.append(f"{n['estimates']} Monte Carlo estimates")
    if n["pruned"]:
        parts.append(f"{n['pruned']} pruned")
    if n["cut"]:
        unranked = n["cut"] - cut_rows
        parts.append(f"{n['cut']} cut by the time budget ({cut_rows} with a certified noise, {unranked} not ranked)")
    if n["skipped"]:
        parts.append(f"{n['skipped']} skipped")
    return f"{n['candidates']} candidates: " + ", ".join(parts)


def plan(
    run: TrainingRun,
    *,
    budget: float | None = None,
    thorough: bool = False,
    cache=True,
    workers: int | None = None,
    scheduler=None,
    prune: bool = True,
    only: list[Candidate] | None = None,
    on_row: Callable[[PlanRow], None] | None = None,
    on_first: Callable[[list[PlanRow], int], None] | None = None,
    force: bool = False,
) -> PlanResult:
    """Calibrate every candidate to ``(run.epsilon, run.delta)``; rows sorted best first (pruned
    rows, ``row.pruned``, last, with a lower bound on their prefix RMSE). The defaults are those of
    ``dpmf plan``, so ``plan(run)`` answers like the command, within the same time budget:

    * ``budget``: seconds (wall time from the call) after which the costly last wave
      (:mod:`dpmf.planning.budget`) is stopped; ``None`` (default): the command's default,
      :data:`~dpmf.planning.budget.DEFAULT_BUDGET` (25 s). Its candidates run in worker processes
      (one per CPU, or ``workers``); one stopped after certifying a noise gives a *cut* row
      (``row.cut``: certified, not yet the smallest noise), one stopped before gives an entry of
      ``result.cut``. Every costly candidate gets its first answer (a certified noise, or pruned)
      before any is refined, and one without an answer at the deadline runs on for up to
      :func:`~dpmf.planning.budget.answer_grace` seconds more (1.4x the budget). The earlier waves always run to the end (their amplified candidates also in
      one process per CPU).
    * ``thorough``: ``True``: no time budget, every candidate calibrated (``dpmf plan --thorough``).
      A ``budget`` together with ``thorough=True`` is refused
      (:class:`~dpmf.errors.InvalidParameterError`), as is a budget that is not a finite number > 0.
    * ``cache``: ``True`` (default): the command's cache folder
      (:func:`default_cache_dir`: ``$DPMF_CACHE_DIR``, ``$XDG_CACHE_HOME/dpmf`` or ``~/.cache/dpmf``;
      an unwritable fallback folder means no cache, with a warning); a folder (rows are kept in its
      ``plan/`` subfolder, :mod:`dpmf.planning.cache`) or a :class:`~dpmf.planning.cache.PlanCache`;
      ``None`` or ``False``: no cache. A row cut under one budget is computed again under a larger
      one (or thorough); under the same or a smaller budget the cached cut is reused.
    * ``workers``: ``None`` (default): one process per CPU for the waves a budget runs in worker
      processes, one process for the rest; a number: run each wave's candidates in this many local
      processes (same rows as one; never more processes than candidates or CPUs:
      :func:`dpmf.resources.usable_workers`).
    * ``scheduler``: a Dask scheduler address or ``distributed.Client`` to run each wave's
      candidates on (same rows as locally; the waves then run whole, so an explicit ``budget`` is
      refused with it).

    ``prune``: ``True`` (default) prunes candidates that provably cannot beat the best row of an
    earlier wave (same best row, fewer calibrations); ``False`` calibrates every candidate
    precisely. ``only``: rank these candidates instead of :func:`candidates` ``(run)``.
    ``on_row(row)``: called as each row is found. ``on_first(rows, pending)``: called with the
    ranked rows of the earlier waves when ``pending`` last-wave candidates are still to run under
    the budget (the CLI prints them at once on a terminal).

    Memory: a candidate whose estimated peak (:meth:`~dpmf.planning.candidates.Candidate.memory_bytes`)
    exceeds half the memory available now is skipped before anything is built -- an entry of
    ``result.cut`` whose ``reason`` gives the estimate -- unless ``force``. A plan left with no ranked
    row at all is refused (:class:`~dpmf.errors.UnsupportedConfigurationError`, saying why), never an
    empty answer. Progress: one :func:`dpmf.progress.task` whose count is the candidates calibrated
    or pruned; when the budget cut some, its last line says ``stopped by the time budget`` (not
    ``done``) and counts them (:meth:`PlanResult.summary`).
    """
    import time

    from dpmf import progress
    from dpmf.planning.budget import COSTLY_WAVE, resolve_budget

    started = time.monotonic()
    if scheduler is not None and budget is not None:
        from dpmf.errors import InvalidParameterError

        raise InvalidParameterError("budget applies to a local plan: with a scheduler each wave runs whole on the "
                                    "cluster; leave budget out (or pass thorough=True)")
    budget = resolve_budget(budget, thorough)
    cache = _plan_cache(cache)
    cands = candidates(run) if only is None else list(only)
    client, own, pool = None, False, None
    if scheduler is not None:
        from dpmf.accounting._dask import connect

        client, own = connect(scheduler)
        budget = None  # (a cluster runs the waves whole)
    elif workers is not None and usable_workers(_v.positive_int("workers", workers), len(cands)) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn: fresh processes (no copy of a live progress bar or of BLAS threads); never more
        # processes than candidates or CPUs
        pool = ProcessPoolExecutor(usable_workers(workers, len(cands)), mp_context=multiprocessing.get_context("spawn"))
    deadline = None if budget is None else started + budget
    cands, cut_list = (cands, []) if force else _too_large(cands)
    rows: list[PlanRow | None] = [None] * len(cands)
    waves = sorted({c.wave for c in cands})
    last = COSTLY_WAVE if deadline is not None and COSTLY_WAVE in waves else None  # (quick waves run whole)
    try:
        with progress.task(f"plan candidates ({run.steps} steps)", total=len(cands), unit="candidates") as bar:
            tally = _Tally(bar, rows, cut_list, on_row)
            for wave in waves:
                found = [r.prefix_sum_rmse for r in rows if r is not None and not r.pruned]
                threshold = min(found, default=math.inf) if prune else math.inf
                if wave > 0 and last is not None and client is None:  # (a budget: the rest together)
                    _together([i for i, c in enumerate(cands) if c.wave > 0], cands, run, cache, threshold,
                              deadline, budget, workers, tally, prune, on_first)
                    break
                todo = []
                for i, cand in enumerate(cands):
                    if cand.wave != wave:
                        continue
                    hit = cache.get(cand.key(run), threshold, budget=budget) if cache is not None else None
                    stopped = cache.get_cut(cand.key(run), budget) if hit is None and wave == last and cache else None
                    if hit is not None:
                        tally.done(i, hit)
                    elif stopped is not None:  # (stopped by a budget at least this one before: instant)
                        tally.cut(stopped)
                    else:
                        todo.append(i)
                if wave == last:
                    if todo and on_first is not None:
                        on_first(_ranked(sort_rows([r for r in rows if r is not None])), len(todo))
                    _budgeted(todo, cands, run, cache, threshold, deadline, budget, workers, tally)
                elif pool is not None:
                    from concurrent.futures import as_completed as completed

                    futures = {pool.submit(_evaluate_task, cands[i], run, threshold): i for i in todo}
                    for fut in completed(list(futures)):
                        _finish(futures[fut], fut.result(), cands, run, cache, threshold, tally.done)
                elif client is None and deadline is not None and wave > 0 and len(todo) > 1:
                    _budgeted(todo, cands, run, cache, threshold, None, budget, workers, tally)
                elif client is None:
                    for i in todo:
                        bar.update(note=f"calibrating {cands[i].strategy_name} / {cands[i].sampling_name}")
                        _finish(i, evaluate(cands[i], run, threshold), cands, run, cache, threshold, tally.done)
                else:
                    from distributed import as_completed

                    futures = {
                        client.submit(_evaluate_task, cands[i], run, threshold, pure=False): i for i in todo
                    }
                    for fut in as_completed(list(futures)):
                        _finish(futures[fut], fut.result(), cands, run, cache, threshold, tally.done)
            result = PlanResult(_ranked(sort_rows([r for r in rows if r is not None])), cut=cut_list, budget=budget,
                                seconds=time.monotonic() - started)
            tally.close(result)
    finally:
        if own:
            client.close()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    if not any(not r.pruned for r in result):
        _refuse_empty(result)
    return result


class _Tally:
    """The plan's progress: the count is the candidates calibrated or pruned (a cut one is not
    done), the note names the last one and, at the end, how every candidate ended; a plan the
    budget cut ends ``stopped by the time budget``, never ``done``."""

    def __init__(self, bar, rows: list, cut_list: list, on_row) -> None:
        self.bar, self.rows, self.cut_list, self.on_row = bar, rows, cut_list, on_row
        self.finished = 0

    def done(self, i: int, row: PlanRow) -> None:
        self.rows[i] = row
        if not row.cut:
            self.finished += 1
        note = f"{row.strategy} / {row.sampling}" + (" (pruned)" if row.pruned else "")
        note += " (cut by the budget)" if row.cut else ""
        self.bar.update(completed=self.finished, note=note + (" (cached)" if row.cached else ""))
        if self.on_row is not None:
            self.on_row(row)

    def cut(self, c) -> None:
        self.cut_list.append(c)
        self.bar.update(note=f"{c.strategy} / {c.sampling} (cut by the budget)" if c.by_budget else
                        f"{c.strategy} / {c.sampling} (skipped)")

    def close(self, result: PlanResult) -> None:
        self.bar.update(note=result.summary())
        if any(c.by_budget for c in result.cut) or any(r.cut for r in result):
            self.bar.end_as("stopped by the time budget")


def _plan_cache(cache):
    """``plan``'s ``cache`` argument as a :class:`~dpmf.planning.cache.PlanCache` or ``None``."""
    from dpmf.planning.cache import PlanCache, default_plan_cache

    if cache is None or cache is False:
        return None
    if cache is True:
        found, note = default_plan_cache()
        if note:
            import warnings

            warnings.warn(note, stacklevel=3)
        return found
    return cache if isinstance(cache, PlanCache) else PlanCache(cache)


def _too_large(cands: list[Candidate]) -> tuple[list[Candidate], list]:
    """``(kept, skipped)``: the candidates whose estimated peak memory is more than half of what is
    available now are skipped before anything is built, each a :class:`~dpmf.planning.budget.Cut`
    giving the estimate."""
    from dpmf.planning.budget import Cut
    from dpmf.resources import available_memory, format_bytes

    room = available_memory() / 2  # (one row of a plan never takes more than half of what is free)
    keep, skipped = [], []
    for c in cands:
        need = c.memory_bytes()
        if need > room:
            skipped.append(Cut(c.label, c.strategy_name, c.sampling_name, c.method, 0, 0.0, reason=(
                f"needs about {format_bytes(need)} of memory, more than half of the {format_bytes(2 * room)} "
                "available: skipped before it was built (plan fewer epochs or steps, or --force)")))
        else:
            keep.append(c)
    return keep, skipped


def _refuse_empty(result: PlanResult) -> None:
    """A plan with no ranked row is an error saying why (the first candidate's reason) and what to
    change -- never an empty answer."""
    from dpmf.errors import UnsupportedConfigurationError

    n = len(result.cut)
    if not n:
        raise UnsupportedConfigurationError("the plan has no candidate to rank (only=[] or every candidate removed)")
    c = result.cut[0]
    more = f" (and {n - 1} more)" if n > 1 else ""
    raise UnsupportedConfigurationError(
        f"the plan has no row: none of its {n} candidates could be ranked ({result.summary()}); e.g. {c.strategy} / "
        f"{c.sampling}{more}: {c.reason}"
    )


def _budgeted(todo, cands, run, cache, threshold, deadline, budget, workers, tally, quick=()) -> None:
    """A wave's candidates in worker processes (one per CPU), the last one under the deadline
    (:func:`dpmf.planning.budget.run_until`; ``deadline=None``: run them whole; ``quick``: indices
    that run whole whatever the deadline; ``threshold``: a number or a function of nothing)."""
    import os

    from dpmf.planning.budget import answer_grace, run_until

    if not todo:
        return
    processes = usable_workers(workers if workers is not None else (os.cpu_count() or 1), len(todo))
    if quick and len(todo) > len(quick):  # (the worker kept for the costly candidates comes on top)
        processes = min(processes + 1, len(todo))
    sub = [cands[i] for i in todo]
    running: list[str] = []

    def started(j: int) -> None:  # (the progress note names the rows being calibrated)
        running.append(f"{sub[j].strategy_name} / {sub[j].sampling_name}")
        tally.bar.update(note="calibrating " + ", ".join(running[-processes:]))

    def lookup(j: int, thr: float):
        return None if cache is None else cache.get(sub[j].key(run), thr, budget=budget)

    def found(j: int, row: PlanRow, thr: float) -> None:
        if row.cached:
            tally.done(todo[j], row)
        else:
            _finish(todo[j], row, cands, run, cache, thr, tally.done)

    quick_set = set(quick)
    finished, partial, cut = run_until(sub, run, threshold, deadline, processes=processes, on_start=started,
                                       quick=[j for j, i in enumerate(todo) if i in quick_set], lookup=lookup,
                                       on_row=found, grace=answer_grace(budget) if deadline is not None else 0.0)
    for j, row in partial.items():
        if cache is not None:
            cache.put(cands[todo[j]].key(run), row, threshold() if callable(threshold) else threshold, budget=budget)
        tally.done(todo[j], row)
    for j, c in cut.items():
        if cache is not None and c.by_budget:  # a worker that died is not a property of the budget
            cache.put_cut(cands[todo[j]].key(run), c, budget)
        tally.cut(c)


def win_order(cand: Candidate) -> tuple:
    """The order a budgeted plan starts its costly candidates in: those its first evaluation usually
    decides first, then the most likely to win. From the thorough plans measured (benchmarks/README.md,
    "dpmf plan"): MMCC under Poisson sampling (looser than generalized MMCC under cyclic Poisson, a
    quick candidate) was pruned by its first evaluation, which the compiled MMCC rows (issue 50) made
    0.2-2 CPU-s -- the fewest bands first; BandMF under balls-in-bins with fresh slots each epoch
    ranked first whenever it was a candidate, the reused slot next; then the tree under MMCC (its
    first evaluation at 500 steps outlasted a 25 s budget at load 7); the optimal factorization and
    Monte Carlo estimates last. (Starting with balls-in-bins, whose first evaluation took 21-41
    CPU-s in a fresh process, left every MMCC candidate queued behind it unranked at load 6-8.)"""
    from dpmf.sampling.schemes import BallsInBinsSampling

    s = cand.scheme
    if cand.method == "mmcc" and cand.spec.kind != "tree":
        return (0, cand.spec.bands or 0)
    if isinstance(s, BallsInBinsSampling):
        return (1 if s.fresh_slots else 2, 0)
    if cand.method == "mmcc":  # the tree: its first MMCC evaluation is the costliest of the rows
        return (3, 0)
    return (4 if cand.spec.kind == "optimal" else 5, 0)


def _together(todo, cands, run, cache, base, deadline, budget, workers, tally, prune, on_first) -> None:
    """The waves after the first under a budget, in one set of worker processes (one per CPU): the
    quick ones run to the end, the costly ones (:func:`win_order`, most likely to win first) until
    the deadline, one worker kept for them from the start, on top of the one per CPU
    (:func:`dpmf.planning.budget.run_until`), each started against the best row certified so far
    (``base``: the first wave's)."""
    from dpmf.planning.budget import COSTLY_WAVE

    quick = [i for i in todo if cands[i].wave < COSTLY_WAVE]
    costly = sorted((i for i in todo if cands[i].wave >= COSTLY_WAVE), key=lambda i: win_order(cands[i]))
    kept = []
    for i in costly:  # stopped by a budget at least this one before, and no row since: instant
        stopped = None
        if cache is not None and cache.get(cands[i].key(run), base, budget=budget) is None:
            stopped = cache.get_cut(cands[i].key(run), budget)
        if stopped is not None:
            tally.cut(stopped)
        else:
            kept.append(i)
    if kept and on_first is not None:
        on_first(_ranked(sort_rows([r for r in tally.rows if r is not None])), len(kept))

    def threshold() -> float:
        found = [r.prefix_sum_rmse for r in tally.rows if r is not None and not r.pruned and not r.cut]
        return min([base, *found]) if prune else math.inf

    _budgeted(quick + kept, cands, run, cache, threshold, deadline, budget, workers, tally, quick=quick)


def _ranked(rows: list[PlanRow]) -> list[PlanRow]:
    """``rows`` (sorted) with ``rank`` 1, 2, ... on the calibrated rows (pruned rows have none)."""
    from dataclasses import replace

    out, k = [], 0
    for r in rows:
        if not r.pruned:
            k += 1
        out.append(r if r.pruned else replace(r, rank=k))
    return out


def _finish(i, row, cands, run, cache, threshold, done) -> None:
    if cache is not None:
        cache.put(cands[i].key(run), row, threshold)
    done(i, row)


def default_cache_dir() -> Path:
    """Where ``dpmf plan`` keeps its rows by default (``$DPMF_CACHE_DIR``, ``$XDG_CACHE_HOME/dpmf``
    or ``~/.cache/dpmf``)."""
    from dpmf.planning.cache import default_cache_dir as _default

    return _default()


def plan_figure(run: TrainingRun, rows: list[PlanRow]):
    """The matplotlib figure of :func:`plot_plan`, laid out so every label is inside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.strategy} / {r.sampling}\n({r.method}, sigma={r.noise_multiplier:.3g})" for r in rows]
    fig, ax = plt.subplots(figsize=(7.5, 1.3 + 0.7 * len(rows)))
    ax.barh(range(len(rows)), [r.prefix_sum_rmse for r in rows], color="tab:blue")
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("RMSE of prefix sums of noisy gradient sums\n(clip-norm units; lower is better)")
    ax.set_title(
        f"dpmf plan: N={run.dataset_size}, batch={run.batch_size}, epochs={run.epochs},\n"
        f"target (eps={run.epsilon:g}, delta={run.delta:g})",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def plot_plan(run: TrainingRun, rows: list[PlanRow], path: str) -> None:
    """Save a PNG: each configuration's noise-induced RMSE, best first, at the target epsilon
    (``path``'s folder must exist; checked before drawing)."""
    from dpmf.files import check_output_file, save_figure

    check_output_file(path, "path", plot=True)
    save_figure(plan_figure(run, rows), path)
