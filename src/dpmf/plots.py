"""Plots of what a report proves: the f-DP trade-off curve, with an audit's empirical points.

:func:`tradeoff_plot` draws ``report.tradeoff()`` -- the largest true-positive rate any membership
test can reach at each false-positive rate (:mod:`dpmf.privacy.tradeoff`) -- on linear axes and on
log-log axes (where small FPRs, the audits' regime, are visible), with the diagonal of a test that
guesses. Empirical ``(FPR, TPR)`` points (e.g. an audit's attack, ideally its confidence bounds)
can be drawn against it: a point *above* the curve contradicts the report (if it is a valid lower
bound at its confidence) and is drawn in red.

matplotlib is imported only here, with the Agg backend (no display needed).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from dpmf.errors import InvalidParameterError

__all__ = ["tradeoff_plot", "tradeoff_figure"]

_SCALES = ("both", "linear", "log")


def _curves(reports) -> list[tuple[str, object, object]]:
    """``[(label, TradeOff, tpr at any FPR)]`` from a report, a TradeOff, a list of them or a
    ``{label: ...}`` dict (a report's curve is evaluated exactly at the points' FPRs; a TradeOff's
    is interpolated linearly between its own points)."""
    from dpmf.accounting.report import PrivacyReport
    from dpmf.privacy.tradeoff import TradeOff, default_fpr

    fpr = np.unique(np.concatenate((default_fpr(), np.logspace(-6, 0, 121))))

    def one(label, r):
        if isinstance(r, PrivacyReport):
            t = r.tradeoff(fpr)
            tag = "" if r.certified else ", ESTIMATE"
            return (label or f"{r.method}: eps={r.epsilon:.3g} at delta={r.delta:.2g}{tag}"), t, \
                (lambda x, r=r: np.atleast_1d(r.tradeoff(x).tpr))
        if isinstance(r, TradeOff):
            if np.ndim(r.fpr) == 0:
                raise InvalidParameterError("a TradeOff to plot must hold a curve (an array of FPRs), not one point")
            return (label or f"{r.kind} curve"), r, (lambda x, r=r: np.interp(x, r.fpr, r.tpr))
        raise InvalidParameterError(f"report must be a PrivacyReport or a TradeOff, got {type(r).__name__}")

    if isinstance(reports, Mapping):
        return [one(str(k), v) for k, v in reports.items()]
    if isinstance(reports, (list, tuple)):
        if not reports:
            raise InvalidParameterError("report must name at least one report to plot")
        return [one(None, r) for r in reports]
    return [one(None, reports)]


def _points(points) -> list[tuple[str, np.ndarray]]:
    if points is None:
        return []
    if isinstance(points, Mapping):
        items = list(points.items())
    else:
        items = [("empirical (FPR, TPR)", points)]
    out = []
    for label, pts in items:
        try:
            a = np.asarray(pts, dtype=np.float64).reshape(-1, 2)
        except (TypeError, ValueError):
            raise InvalidParameterError(
                f"points must be (FPR, TPR) pairs (an array of shape (k, 2)), got {type(pts).__name__}"
            ) from None
        if not np.all(np.isfinite(a)) or np.any(a < 0) or np.any(a > 1):
            raise InvalidParameterError("points must be (FPR, TPR) pairs with both rates in [0, 1]")
        out.append((str(label), a))
    return out


def tradeoff_figure(report, points=None, *, scale: str = "both", title: str | None = None):
    """The matplotlib figure of :func:`tradeoff_plot` (not saved)."""
    if scale not in _SCALES:
        raise InvalidParameterError(f"scale must be one of {_SCALES}, got {scale!r}")
    curves = _curves(report)
    pts = _points(points)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = ["linear", "log"] if scale == "both" else [scale]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 0.6, 4.4), squeeze=False)
    bound_of = curves[0][2]  # points are judged against the first curve
    for ax, kind in zip(axes[0], panels):
        for label, t, _ in curves:
            ax.plot(t.fpr, t.tpr, lw=2, label=label)
        grid = np.logspace(-6, 0, 100) if kind == "log" else np.linspace(0, 1, 2)
        ax.plot(grid, grid, color="0.6", ls=":", lw=1, label="guessing (TPR = FPR)")
        for label, a in pts:
            above = a[:, 1] > bound_of(a[:, 0]) + 1e-12
            if np.any(~above):
                ax.scatter(a[~above, 0], a[~above, 1], s=22, zorder=3, label=label)
            if np.any(above):
                ax.scatter(a[above, 0], a[above, 1], s=30, marker="x", color="tab:red", zorder=4,
                           label=f"{label}: ABOVE the curve")
        if kind == "log":
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(1e-6, 1)
            ax.set_ylim(1e-6, 1.05)
        else:
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1.01)
        ax.set_xlabel("false-positive rate (FPR)")
        ax.set_ylabel("true-positive rate (TPR)")
        ax.grid(alpha=0.3, which="both" if kind == "log" else "major")
    axes[0][0].legend(loc="lower right", fontsize=7)
    kinds = sorted({t.kind for _, t, _ in curves})
    words = {"pld": "from the PLD", "gdp": "exact GDP", "epsilon_delta": "from (epsilon, delta) only"}
    fig.suptitle(
        title or "largest TPR any membership test reaches at each FPR (upper bound; "
        + ", ".join(words[k] for k in kinds) + ")",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def tradeoff_plot(report, points=None, path=None, *, scale: str = "both", title: str | None = None):
    """Draw the f-DP trade-off curve of ``report`` (a :class:`~dpmf.accounting.report.PrivacyReport`,
    a :class:`~dpmf.privacy.tradeoff.TradeOff` with an array of FPRs, a list of them, or a
    ``{label: report}`` dict) with optional empirical ``points``: ``(FPR, TPR)`` pairs (shape
    ``(k, 2)``) or ``{label: pairs}``. Points above the (first) curve are drawn as red crosses.
    ``scale``: ``"both"`` (linear and log-log panels, default), ``"linear"`` or ``"log"``.

    With ``path`` the figure is saved there (the path is checked before any drawing:
    :func:`dpmf.files.check_output_file`) and closed; returns the path. Without it, returns the
    matplotlib figure (close it with ``matplotlib.pyplot.close(fig)``).
    """
    from dpmf.files import check_output_file

    if path is not None:
        check_output_file(path, "path", plot=True)
    fig = tradeoff_figure(report, points, scale=scale, title=title)
    return fig if path is None else save_figure(fig, path)


def save_figure(fig, path):
    """Save ``fig`` to ``path`` (its extension is the format, 120 dpi, tight box; written atomically,
    write errors as one DPMFError), close it, return ``path`` (:func:`dpmf.files.save_figure`)."""
    from dpmf.files import save_figure as save

    return save(fig, path)
