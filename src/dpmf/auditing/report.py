"""``AuditReport``: what an audit found, next to what the run's report certifies.

An audit answers "is my run as private as it says?" from the outside. It can say **no** with
confidence (an empirical lower bound above the certified epsilon is evidence of a bug: in the
training code, the accountant, or the configuration), and it can say how much of the claim an
attacker could actually demonstrate. It can never say **yes**: a small lower bound means this
attack found little, not that the run is private -- the certified upper bound (``dpmf.account``)
is the only guarantee. Every number a user sees is labelled accordingly
(:data:`~dpmf.auditing.bounds.LOWER_BOUND_LABEL`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from dpmf.auditing.bounds import LOWER_BOUND_LABEL

__all__ = ["AuditReport", "THREAT_MODELS"]

#: What each threat model lets the attacker see.
THREAT_MODELS = {
    "white-box": "every noisy gradient the run released (Dirac gradient canaries in their own coordinates, "
                 "scored by the likelihood ratio after undoing C^-1)",
    "black-box": "only the final model (input-space canaries, scored by how much training lowered their loss)",
}


def _num(x):
    if isinstance(x, float) and not math.isfinite(x):
        return "inf" if x > 0 else "nan"
    return x


@dataclass(frozen=True)
class AuditReport:
    """The result of an audit (:func:`dpmf.training.torch.audit.audit_training`).

    ``epsilon_lower`` is an **empirical lower bound** at ``confidence`` (``bound`` names the theorem):
    with probability at least ``confidence`` over the audit's randomness, the run's true epsilon at
    ``delta`` is at least this. ``epsilon_certified`` is the run's proven upper bound (the same
    configuration's :class:`~dpmf.accounting.report.PrivacyReport`, kept in ``certified``).
    ``roc`` holds the attack's empirical ``(FPR upper bound, TPR lower bound)`` points (for
    :meth:`plot`). ``exceeds`` (lower > certified) is the alarm: a correct implementation raises it with probability
    at most ``1 - confidence``. ``reference`` is the ideal attacker on the Gaussian mechanism with the
    claimed privacy (same canaries and confidence; a simulation), ``mechanism_reference`` the ideal
    attacker on this very mechanism without any training code (white-box only; a simulation).
    """

    epsilon_lower: float
    epsilon_certified: float
    delta: float
    confidence: float
    threat_model: str
    canaries: int
    mode: str
    bound: str
    runs: int
    statistics: dict
    configuration: dict
    score: dict
    reference: dict | None = None
    mechanism_reference: dict | None = None
    roc: tuple = ()
    roc_estimates: tuple = ()
    seed: int | None = None
    seconds: float = 0.0
    model: str = "built-in"
    certified: object = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------------ derived
    @property
    def gap(self) -> float:
        """``epsilon_certified - epsilon_lower`` (negative: the alarm)."""
        return self.epsilon_certified - self.epsilon_lower

    @property
    def exceeds(self) -> bool:
        """The lower bound is above the certified epsilon: evidence the run is *less* private than its
        report says (false-alarm probability at most ``1 - confidence`` for a correct run)."""
        return self.epsilon_lower > self.epsilon_certified

    @property
    def fraction_of_reference(self) -> float | None:
        """``epsilon_lower`` over the ideal Gaussian reference's median (None without one, or when the
        reference is 0)."""
        if not self.reference or not self.reference.get("median"):
            return None
        return self.epsilon_lower / self.reference["median"]

    # ------------------------------------------------------------------ output
    def to_dict(self) -> dict:
        d = {
            "epsilon_lower": _num(self.epsilon_lower),
            "epsilon_lower_is": LOWER_BOUND_LABEL,
            "epsilon_certified": _num(self.epsilon_certified),
            "delta": self.delta,
            "confidence": self.confidence,
            "threat_model": self.threat_model,
            "threat_model_sees": THREAT_MODELS.get(self.threat_model, ""),
            "canaries": self.canaries,
            "mode": self.mode,
            "runs": self.runs,
            "bound": self.bound,
            "gap": _num(self.gap),
            "exceeds_certified": self.exceeds,
            "verdict": self.verdict(),
            "statistics": self.statistics,
            "configuration": self.configuration,
            "score": self.score,
            "reference": self.reference,
            "fraction_of_reference": self.fraction_of_reference,
            "mechanism_reference": self.mechanism_reference,
            "roc": [list(p) for p in self.roc],
            "roc_estimates": [list(p) for p in self.roc_estimates],
            "seed": self.seed,
            "seconds": self.seconds,
            "model": self.model,
        }
        if self.certified is not None:
            d["certified_report"] = self.certified.to_dict()
        return d

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def verdict(self) -> str:
        """One sentence for people: what the audit shows about the claim."""
        pct = f"{self.confidence:.0%}"
        if self.exceeds:
            return (f"ALARM: the empirical lower bound {self.epsilon_lower:.3g} EXCEEDS the certified epsilon "
                    f"{self.epsilon_certified:.3g}: the run leaks more than its report says (a correct run raises this "
                    f"alarm with probability at most {1 - self.confidence:.0%}); check the training code and the "
                    "configuration")
        return (f"no evidence against the claim: this attack proves epsilon >= {self.epsilon_lower:.3g} at {pct} "
                f"confidence, below the certified {self.epsilon_certified:.3g}. An audit cannot prove privacy: only "
                "the certified bound does")

    def summary(self) -> str:
        """Several lines for people (what ``dpmf audit`` prints)."""
        st = self.statistics
        lines = [
            f"dpmf audit: {self.threat_model}, {self.mode} ({self.runs} run{'s' if self.runs != 1 else ''}), "
            f"{self.canaries} canaries" + (f" ({st['included']} included by their coins)" if "included" in st else ""),
            f"  empirical lower bound: epsilon >= {self.epsilon_lower:.4g} at {self.confidence:.0%} confidence "
            f"-- evidence, not a certificate ({self.bound})",
        ]
        if self.certified is not None:
            tag = "certified upper bound" if getattr(self.certified, "certified", True) else "ESTIMATE"
            lines.append(f"  certified upper bound: epsilon <= {self.epsilon_certified:.4g} at delta {self.delta:.3g} "
                         f"({tag}, method {self.certified.method}, noise multiplier "
                         f"{self.certified.noise_multiplier:.4g})")
        else:
            lines.append(f"  certified upper bound: epsilon <= {self.epsilon_certified:.4g} at delta {self.delta:.3g}")
        lines.append(f"  gap (certified - empirical lower): {self.gap:.4g}")
        if "guesses" in st:
            lines.append(f"  guesses: {st['correct']} of {st['guesses']} right ({st['k_in']} 'in' on the highest "
                         f"scores, {st['k_out']} 'out' on the lowest; ceiling {st['ceiling']:.3g}); "
                         f"{st.get('selection', '')}")
        elif "false_positives" in st:
            lines.append(f"  runs: {st['false_positives']} of {st['negatives']} left-out canaries flagged, "
                         f"{st['false_negatives']} of {st['positives']} included ones missed at threshold "
                         f"{st['threshold']:.4g}")
        if self.reference:
            r = self.reference
            frac = self.fraction_of_reference
            lines.append(
                f"  ideal attacker on the Gaussian mechanism with the claimed privacy (mu {r['mu']:.3g}): "
                f"{r['median']:.3g} (simulated median of {r['trials']}; 10-90%: {r['low']:.3g}-{r['high']:.3g})"
                + (f"; this audit reached {frac:.0%} of it" if frac is not None and self.threat_model == "white-box"
                   else "; a white-box reference: black-box audits reach far less" if self.threat_model != "white-box"
                   else ""))
        if self.mechanism_reference:
            r = self.mechanism_reference
            lines.append(f"  ideal attacker on this mechanism without training code: {r['median']:.3g} "
                         f"(simulated median of {r['trials']})")
        sc = self.score
        if sc:
            words = sc.get("description", "")
            lines.append(f"  score: {words}")
            chk = sc.get("noise_check") or {}
            if chk.get("checked"):
                below = chk["directions_below"]
                lines.append(
                    f"  noise check: smallest eigenvalue of the whitened noise covariance {chk['smallest_eigenvalue_over_sigma2']:.3g}"
                    f" sigma^2 (threshold {chk['threshold_over_sigma2']:.3g})"
                    + (f": {below} direction(s) carry LESS noise than claimed" if below else ": as claimed"))
        lines.append(f"  verdict: {self.verdict()}")
        return "\n".join(lines)

    def plot(self, path=None, *, scale: str = "both"):
        """The audit's empirical ``(FPR, TPR)`` against the certified report's f-DP trade-off curve
        (:func:`dpmf.plots.tradeoff_figure`): the attack's ROC (point estimates, dashed) and, as
        points, its FPR upper and TPR lower confidence bounds at a few thresholds (:attr:`roc`,
        simultaneous at the audit's confidence). A correct run's points lie below the curve; a
        point above it is drawn as a red cross. With ``path`` the PNG is written there (checked
        first) and the path returned; without, the matplotlib figure."""
        from dpmf.errors import InvalidParameterError
        from dpmf.files import check_output_file
        from dpmf.plots import tradeoff_figure

        if self.certified is None:
            raise InvalidParameterError("this audit report carries no certified report to draw the curve of")
        if path is not None:
            check_output_file(path, "path", plot=True)
        label = f"audit ({self.threat_model}): (FPR upper, TPR lower) bounds at {self.confidence:.0%}"
        pts = {label: list(self.roc)} if self.roc else None
        title = (f"audit: empirical lower bound {self.epsilon_lower:.3g} vs certified {self.epsilon_certified:.3g} "
                 f"(delta {self.delta:.2g})")
        fig = tradeoff_figure({f"certified ({self.certified.method}): eps={self.epsilon_certified:.3g}": self.certified},
                              pts, scale=scale, title=title)
        if self.roc_estimates:
            import numpy as np

            f, t = np.asarray(self.roc_estimates, dtype=float).T
            for ax in fig.axes:
                ax.plot(f, t, ls="--", lw=1, color="0.35", label="audit ROC (point estimates)")
                ax.legend(loc="lower right", fontsize=7) if ax is fig.axes[0] else None
        if path is None:
            return fig
        from dpmf.plots import save_figure

        return save_figure(fig, path)
