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
    """What a Dask worker runs (a top-level function: picklable)."""
    return evaluate(cand, run, threshold)


class PlanResult(list):
    """The rows of :func:`plan` (a list, best first) and what its time budget left out: ``cut``
    (:class:`~dpmf.planning.budget.Cut`: candidates stopped before they certified any noise),
    ``budget`` (seconds, ``None``: none) and ``seconds`` (the plan's wall time)."""

    def __init__(self, rows=(), *, cut=(), budget=None, seconds=0.0):
        super().__init__(rows)
        self.cut = list(cut)
        self.budget = budget
        self.seconds = seconds

    @property
    def complete(self) -> bool:
        """Every candidate calibrated or pruned (nothing cut by the budget)."""
        return not self.cut and not any(r.cut for r in self)


def plan(
    run: TrainingRun,
    *,
    on_row: Callable[[PlanRow], None] | None = None,
    cache=None,
    scheduler=None,
    prune: bool = True,
    only: list[Candidate] | None = None,
    workers: int | None = None,
    budget: float | None = None,
    on_first: Callable[[list[PlanRow], int], None] | None = None,
    force: bool = False,
) -> PlanResult:
    """Calibrate every candidate to ``(run.epsilon, run.delta)``; rows sorted best first (pruned
    rows, ``row.pruned``, last, with a lower bound on their prefix RMSE).

    ``cache``: a folder (rows are kept in its ``plan/`` subfolder, :mod:`dpmf.planning.cache`) or a
    :class:`~dpmf.planning.cache.PlanCache`; ``None``: no cache. ``scheduler``: a Dask scheduler
    address or ``distributed.Client`` to run each wave's candidates on (same rows as locally).
    ``prune``: ``True`` (default) prunes candidates that provably cannot beat the best row of an
    earlier wave (same best row, fewer calibrations); ``False`` calibrates every candidate
    precisely. ``only``: rank these candidates instead of :func:`candidates` ``(run)``.
    ``workers``: run each wave's candidates in this many local processes (same rows as one; never
    more processes than candidates or CPUs: :func:`dpmf.resources.usable_workers`).

    ``budget``: seconds (wall time from the call) after which the costly last wave
    (:mod:`dpmf.planning.budget`) is stopped; its candidates then run in worker processes (one per
    CPU, or ``workers``), and a candidate stopped after certifying a noise gives a *cut* row
    (``row.cut``: certified, not yet the smallest noise), one stopped before gives an entry of
    ``result.cut``. ``None`` (default): no limit, every candidate calibrated (``dpmf plan
    --thorough``). The earlier waves always run to the end (with a budget, their amplified candidates also in one process per CPU). A cached cut row is reused only for a
    budget at most as large as the one it was cut by. ``on_first(rows, pending)``: called with the
    ranked rows of the earlier waves when ``pending`` last-wave candidates are still to run (the CLI
    prints them at once).

    Memory: a candidate whose estimated peak (:meth:`~dpmf.planning.candidates.Candidate.memory_bytes`)
    exceeds half the memory available now is skipped before anything is built -- an entry of
    ``result.cut`` whose ``reason`` gives the estimate -- unless ``force``.
    """
    import time

    from dpmf import progress
    from dpmf.planning.cache import PlanCache

    started = time.monotonic()
    if budget is not None:
        budget = _v.positive("budget", budget)
    deadline = None if budget is None else started + budget
    if cache is not None and not isinstance(cache, PlanCache):
        cache = PlanCache(cache)
    cands = candidates(run) if only is None else list(only)
    rows: list[PlanRow | None] = [None] * len(cands)
    cut_list = []
    client, own, pool = None, False, None
    if scheduler is not None:
        from dpmf.accounting._dask import connect

        client, own = connect(scheduler)
        deadline = budget = None  # (a cluster runs the waves whole)
    elif workers is not None and usable_workers(_v.positive_int("workers", workers), len(cands)) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn: fresh processes (no copy of a live progress bar or of BLAS threads); never more
        # processes than candidates or CPUs
        pool = ProcessPoolExecutor(usable_workers(workers, len(cands)), mp_context=multiprocessing.get_context("spawn"))
    if not force:  # (rows that would not fit in memory: skipped up front, saying so)
        from dpmf.planning.budget import Cut
        from dpmf.resources import available_memory, format_bytes

        room = available_memory() / 2  # (one row of a plan never takes more than half of what is free)
        keep = []
        for c in cands:
            need = c.memory_bytes()
            if need > room:
                cut_list.append(Cut(c.label, c.strategy_name, c.sampling_name, c.method, 0, 0.0, reason=(
                    f"needs about {format_bytes(need)} of memory, more than half of the {format_bytes(2 * room)} "
                    "available: skipped before it was built (plan fewer epochs or steps, or --force)")))
            else:
                keep.append(c)
        cands = keep
        rows = [None] * len(cands)
    waves = sorted({c.wave for c in cands})
    last = waves[-1] if deadline is not None and waves and waves[-1] > 0 else None
    try:
        with progress.task(f"plan candidates ({run.steps} steps)", total=len(cands), unit="candidates") as bar:

            def done(i: int, row: PlanRow) -> None:
                rows[i] = row
                note = f"{row.strategy} / {row.sampling}" + (" (pruned)" if row.pruned else "")
                note += " (cut by the budget)" if row.cut else ""
                bar.update(completed=bar.completed + 1, note=note + (" (cached)" if row.cached else ""))
                if on_row is not None:
                    on_row(row)

            for wave in waves:
                found = [r.prefix_sum_rmse for r in rows if r is not None and not r.pruned]
                threshold = min(found, default=math.inf) if prune else math.inf
                todo = []
                for i, cand in enumerate(cands):
                    if cand.wave != wave:
                        continue
                    hit = cache.get(cand.key(run), threshold, budget=budget) if cache is not None else None
                    stopped = cache.get_cut(cand.key(run), budget) if hit is None and wave == last and cache else None
                    if hit is not None:
                        done(i, hit)
                    elif stopped is not None:  # (stopped by a budget at least this one before: instant)
                        cut_list.append(stopped)
                        bar.update(completed=bar.completed + 1, note=f"{stopped.strategy} / {stopped.sampling} (cut)")
                    else:
                        todo.append(i)
                if wave == last:
                    if todo and on_first is not None:
                        on_first(_ranked(sort_rows([r for r in rows if r is not None])), len(todo))
                    _budgeted(todo, cands, run, cache, threshold, deadline, budget, workers, done, cut_list, bar)
                elif pool is not None:
                    from concurrent.futures import as_completed as completed

                    futures = {pool.submit(_evaluate_task, cands[i], run, threshold): i for i in todo}
                    for fut in completed(list(futures)):
                        _finish(futures[fut], fut.result(), cands, run, cache, threshold, done)
                elif client is None and deadline is not None and wave > 0 and len(todo) > 1:
                    _budgeted(todo, cands, run, cache, threshold, None, budget, workers, done, cut_list, bar)
                elif client is None:
                    for i in todo:
                        bar.update(note=f"calibrating {cands[i].strategy_name} / {cands[i].sampling_name}")
                        _finish(i, evaluate(cands[i], run, threshold), cands, run, cache, threshold, done)
                else:
                    from distributed import as_completed

                    futures = {
                        client.submit(_evaluate_task, cands[i], run, threshold, pure=False): i for i in todo
                    }
                    for fut in as_completed(list(futures)):
                        _finish(futures[fut], fut.result(), cands, run, cache, threshold, done)
    finally:
        if own:
            client.close()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    ranked = _ranked(sort_rows([r for r in rows if r is not None]))
    return PlanResult(ranked, cut=cut_list, budget=budget, seconds=time.monotonic() - started)


def _budgeted(todo, cands, run, cache, threshold, deadline, budget, workers, done, cut_list, bar) -> None:
    """A wave's candidates in worker processes (one per CPU), the last one under the deadline
    (:func:`dpmf.planning.budget.run_until`; ``deadline=None``: run them whole)."""
    import os

    from dpmf.planning.budget import run_until

    if not todo:
        return
    processes = usable_workers(workers if workers is not None else (os.cpu_count() or 1), len(todo))
    sub = [cands[i] for i in todo]
    running: list[str] = []

    def started(j: int) -> None:  # (the progress note names the rows being calibrated)
        running.append(f"{sub[j].strategy_name} / {sub[j].sampling_name}")
        bar.update(note="calibrating " + ", ".join(running[-processes:]))

    finished, partial, cut = run_until(sub, run, threshold, deadline, processes=processes, on_start=started)
    for j, row in finished.items():
        _finish(todo[j], row, cands, run, cache, threshold, done)
    for j, row in partial.items():
        if cache is not None:
            cache.put(cands[todo[j]].key(run), row, threshold, budget=budget)
        done(todo[j], row)
    for j, c in cut.items():
        if cache is not None and not c.reason:  # a worker that died is not a property of the budget
            cache.put_cut(cands[todo[j]].key(run), c, budget)
        cut_list.append(c)
        bar.update(completed=bar.completed + 1, note=f"{c.strategy} / {c.sampling} (cut by the budget)")


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
    import matplotlib.pyplot as plt

    from dpmf.files import check_output_file, writing

    check_output_file(path, "path", plot=True)
    fig = plan_figure(run, rows)
    try:
        with writing(path, "plot"):
            fig.savefig(path, dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
