"""The words of ``dpmf plan``, explained once: the legend printed under its table, the same
paragraphs in ``dpmf plan --help``, and on the plan page (``docs/tutorials/plan.md``; a test keeps
all three equal to :data:`LEGEND`).

A row is *certified*, *pruned* or *cut*; two of the samplers change what a data loader does in a
way the other names do not say (``cyclic-poisson``, ``b-min-sep``). The legend under a table lists
only the words that occur in it (:func:`legend_lines`); ``--help`` lists them all
(:func:`legend_paragraphs`).
"""

from __future__ import annotations

#: term -> its explanation (one sentence or two; plain ASCII, so every terminal shows it whole)
LEGEND = {
    "certified": (
        "the row's accountant proves epsilon <= the target at the row's noise (sigma); rows from Monte Carlo "
        "are estimates, not proofs, and say so."
    ),
    "pruned": (
        "one evaluation proved the candidate needs more noise than a row already certified, so it cannot "
        "win: its > values are sound lower bounds, its accountant is the one that bounded it, and it has no rank "
        "(--no-prune calibrates it)."
    ),
    "cut": (
        "the time budget (--budget) stopped the candidate's calibration. A cut row's noise is certified but may "
        "not be the smallest, so a full calibration (--thorough) can only move it up; a cut candidate without a "
        "row certified no noise in time and could rank anywhere."
    ),
    "cyclic-poisson": (
        "a data loader that splits the examples into b fixed groups (b = the cycle length, the bands of the "
        "strategy) and at step t draws a Poisson batch (each example independently) from group t mod b only: "
        "an example takes part at most once every b steps."
    ),
    "b-min-sep": (
        "a data loader that draws each step's Poisson batch from the examples that took no part in the previous "
        "b - 1 steps: two participations of an example are always at least b steps apart (b-min-sep-16: b = 16). "
        "Its rows here are certified by the min-sep sensitivity bound, which credits none of the sampling's "
        "randomness; the note says what the tighter certified Monte Carlo (Algorithm 5) would cost."
    ),
}


def legend_paragraphs() -> list[str]:
    """Every term with its explanation, ``"term: explanation"`` (``dpmf plan --help``)."""
    return [f"{term}: {text}" for term, text in LEGEND.items()]


def terms_used(rows, cut=()) -> list[str]:
    """The terms of :data:`LEGEND` that ``rows`` (plan rows) and ``cut`` (cut candidates) show:
    ``certified`` always (a ranked row or not, it is what a row means), the others when they occur."""
    rows = list(rows)
    used = {"certified"}
    if any(r.pruned for r in rows):
        used.add("pruned")
    if any(getattr(r, "cut", False) for r in rows) or any(getattr(c, "by_budget", False) for c in cut):
        used.add("cut")
    samplings = {r.sampling for r in rows} | {c.sampling for c in cut}
    used |= samplings & {"cyclic-poisson", "b-min-sep"}
    if any(s.startswith("b-min-sep-") for s in samplings):  # (b-min-sep-16: min-sep 16)
        used.add("b-min-sep")
    return [term for term in LEGEND if term in used]


def legend_lines(rows, cut=()) -> list[str]:
    """The legend under a plan's table: ``"legend:"`` and one ``"  term: explanation"`` line per
    term it shows (:func:`terms_used`)."""
    return ["legend:"] + [f"  {term}: {LEGEND[term]}" for term in terms_used(rows, cut)]
