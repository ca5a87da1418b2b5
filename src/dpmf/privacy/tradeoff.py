r"""f-DP: the trade-off curve (TPR an optimal test reaches at each FPR) of what a mechanism is proved to be.

Dong, Roth & Su, "Gaussian Differential Privacy" (arXiv 1905.02383), Sec. 2: a membership test
``phi`` between the output *without* the example (the null, ``N``) and *with* it (the
alternative, ``A``) has false-positive rate ``FPR = E_N[phi]`` and true-positive rate
``TPR = E_A[phi]``; the trade-off function is ``T(N, A)(alpha) = 1 - sup{TPR : FPR <= alpha}``.
dpmf reports the **TPR curve** ``tpr(alpha) = 1 - f(alpha)``: an upper bound on the TPR of every
test at FPR ``alpha``, hence on what any membership attack (an audit) can reach. Zero-out adjacency
(DESIGN.md) asks for both orders of the pair, so every curve here is the pointwise **maximum**
over the two orders ``(N, A) = (without, with)`` and ``(with, without)``.

**From hockey-stick divergences** (the supporting-line duality, DRS Prop. 2.12; Zhu, Dong & Wang,
arXiv 2106.08567). For every test and every ``eps >= 0``,

    E_A[phi] - e^eps E_N[phi] <= H_{e^eps}(A || N)                 =>  TPR <= e^eps alpha + H_{e^eps}(A||N)
    E_N[1-phi] - e^eps E_A[1-phi] <= H_{e^eps}(N || A)             =>  TPR <= 1 - e^-eps (1 - alpha - H_{e^eps}(N||A))

so **any upper bounds** on the two hockey-stick divergences at any set of ``eps`` give a sound TPR
bound (the minimum of these lines and 1), and the infimum over all ``eps >= 0`` of the exact
divergences is the exact curve. ``H(with || without)`` is the PLD's *remove* direction,
``H(without || with)`` its *add* direction (:mod:`dpmf.privacy.pld`).

**From a pessimistic PLD** (:func:`tpr_from_pld`). A PLD that rounds every loss up upper-bounds
both divergences at every ``eps``. For a discrete PLD, ``e^eps alpha + delta(eps)`` has derivative
``e^eps (alpha - Q[L > eps])`` in ``eps`` (``Q[L > eps] = sum_{l > eps} p_l e^{-l}``, non-increasing),
so it is unimodal with its minimum at an atom: the curve is found exactly for the discretized pair
by a binary search over the atoms (the second line likewise, where ``P[L > eps]`` crosses
``1 - alpha``), no grid-search error on top of the PLD's own pessimism. The divergences are
evaluated by suffix sums with an explicit floating-point allowance added (``delta`` is never
below its exact value for the discretized pair). Tail mass moved to ``+inf`` by truncation caps
the curve near ``alpha = 0`` (``tpr(0) = P[L = inf]``): sound, slightly pessimistic.

**Other forms** a report can hold (:class:`PrivacyCurve`):

* ``gdp``: exactly ``mu``-GDP (the Gaussian mechanism: ``mu = sensitivity / sigma``), closed form
  ``tpr(alpha) = Phi(Phi^{-1}(alpha) + mu)`` (:func:`tpr_gdp`);
* ``pld``: one or several pessimistic PLDs, each with a ``delta_offset`` added to both divergences
  (MMCC's ``delta_1``, the probability that the conditioning of its conditional composition fails:
  the mechanism is ``(eps, delta_PLD(eps) + delta_1)``-DP for every ``eps``); several PLDs mean
  "the worst of these" (MMCC's phases), the curve is their pointwise maximum;
* ``epsilon_delta``: only one ``(eps, delta)`` pair is known:
  ``tpr(alpha) = min(1, e^eps alpha + delta, 1 - e^-eps (1 - delta - alpha))`` (Kairouz, Oh &
  Viswanath, arXiv 1311.0776), :func:`tpr_epsilon_delta`.

**Composition** (:meth:`PrivacyCurve.compose`): GDP with GDP is GDP with ``sqrt(mu_1^2 + mu_2^2)``
(exact); otherwise every part becomes a pessimistic PLD on one grid (the coarsest part's, losses
rounded up, :meth:`~dpmf.privacy.pld.PrivacyLossDistribution.regrid`) and the PLDs are convolved
per direction (dp_accounting), offsets add (conditional composition: the failure events of the
parts, union bound). An ``(eps, delta)`` part enters as its dominating pair
(:func:`epsilon_delta_pld`; this is the *optimal* composition of ``(eps, delta)``-DP mechanisms,
Kairouz et al. Thm 3.3, never looser than basic composition). A worst-of-several-PLDs part cannot
be composed as PLDs (the worst case over the parts' combinations is not one PLD); it enters as the
dominating pair of its ``(eps, delta)`` claim, and the result says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.privacy.pld import DEFAULT_DISCRETIZATION, DIRECTIONS, PrivacyLossDistribution, dense_pmf

__all__ = [
    "PrivacyCurve",
    "tpr_from_pld",
    "tpr_from_profile",
    "tpr_gdp",
    "tpr_epsilon_delta",
    "epsilon_delta_pld",
    "KINDS",
    "TradeOff",
    "gdp_mu_of",
    "default_fpr",
    "compose_curves",
]

#: The forms of :class:`PrivacyCurve` (module docstring).
KINDS = ("gdp", "pld", "epsilon_delta")

_U = 2.0**-53  # unit roundoff of float64


def _fpr_array(fpr) -> tuple[np.ndarray, bool]:
    scalar = np.ndim(fpr) == 0
    try:
        a = np.atleast_1d(np.asarray(fpr, dtype=np.float64))
    except (TypeError, ValueError):
        raise InvalidParameterError(f"fpr must be a number or an array of numbers in [0, 1], got {fpr!r}") from None
    if a.ndim != 1:
        raise InvalidParameterError(f"fpr must be a number or a 1-D array, got an array of shape {np.shape(fpr)}")
    if a.size == 0:
        raise InvalidParameterError("fpr must not be empty")
    if not np.all(np.isfinite(a)) or np.any(a < 0) or np.any(a > 1):
        bad = a[~(np.isfinite(a) & (a >= 0) & (a <= 1))][0]
        raise InvalidParameterError(f"fpr must be in [0, 1], got {bad!r}")
    return a, scalar


def _finish(alpha: np.ndarray, tpr: np.ndarray) -> np.ndarray:
    """Clip to [alpha, 1] and make non-decreasing in alpha (each step keeps an upper bound: the true
    curve is non-decreasing and at least alpha, so the smallest bound at any larger FPR also bounds it)."""
    tpr = np.minimum(np.maximum(tpr, alpha), 1.0)
    order = np.argsort(alpha, kind="stable")
    sorted_tpr = np.minimum.accumulate(tpr[order][::-1])[::-1]
    out = np.empty_like(tpr)
    out[order] = sorted_tpr
    return out


# ----------------------------------------------------------------------------------- closed forms
def tpr_gdp(mu: float, fpr) -> np.ndarray | float:
    """TPR of the optimal test at FPR ``fpr`` against ``mu``-GDP: ``Phi(Phi^{-1}(fpr) + mu)``
    (``1 - G_mu(fpr)``, DRS Eq. (3)); exact for the Gaussian mechanism with ``mu = sens / sigma`` (the
    value is nudged up by a relative 1e-12, past the special functions' rounding)."""
    from scipy import special

    mu = _v.non_negative("mu", mu)
    alpha, scalar = _fpr_array(fpr)
    with np.errstate(all="ignore"):
        tpr = special.ndtr(special.ndtri(alpha) + mu) * (1 + 1e-12)  # (nudged up past the evaluation's rounding)
    tpr = np.where(alpha >= 1, 1.0, np.where(alpha <= 0, 0.0, tpr))
    tpr = np.minimum(np.maximum(tpr, alpha), 1.0)
    return float(tpr[0]) if scalar else tpr


def tpr_epsilon_delta(epsilon: float, delta: float, fpr) -> np.ndarray | float:
    """The TPR bound implied by ``(epsilon, delta)``-DP alone (both orders):
    ``min(1, e^eps fpr + delta, 1 - e^-eps (1 - delta - fpr))`` (Kairouz, Oh & Viswanath 2015)."""
    eps = _v.non_negative("epsilon", epsilon) if not (isinstance(epsilon, float) and math.isinf(epsilon)) else math.inf
    d = _v.non_negative("delta", delta)
    alpha, scalar = _fpr_array(fpr)
    if math.isinf(eps) or d >= 1:
        tpr = np.ones_like(alpha)
    else:
        with np.errstate(over="ignore"):
            a = math.exp(eps) * alpha + d
        b = 1.0 - math.exp(-eps) * (1.0 - d - alpha)
        tpr = np.minimum(np.minimum(a, b), 1.0)
    tpr = np.minimum(np.maximum(tpr, alpha), 1.0)
    return float(tpr[0]) if scalar else tpr


def epsilon_delta_pld(
    epsilon: float, delta: float, discretization: float = DEFAULT_DISCRETIZATION
) -> PrivacyLossDistribution:
    """The pessimistic PLD of the pair that dominates every ``(epsilon, delta)``-DP mechanism (both
    directions): loss ``+inf`` with probability ``delta``, ``+eps`` with ``(1 - delta) e^eps / (1 + e^eps)``
    and ``-eps`` with ``(1 - delta) / (1 + e^eps)`` (Kairouz, Oh & Viswanath 2015, Thm 2.1), losses
    rounded up to the grid. Composing it is the optimal composition of ``(eps, delta)``-DP parts."""
    eps = _v.non_negative("epsilon", epsilon)
    d = _v.probability("delta", delta, allow_zero=True)
    disc = _v.positive("discretization", discretization)
    if d >= 1:
        pmf = dense_pmf(0, np.zeros(1), 1.0, disc)
        return PrivacyLossDistribution(pmf, pmf)
    hi = math.ceil(eps / disc - 1e-12)
    if hi * disc < eps:  # (pessimistic: the grid loss is never below eps)
        hi += 1
    lo = -math.floor(eps / disc + 1e-12)
    if lo * disc < -eps:
        lo += 1
    w_hi = (1.0 - d) / (1.0 + math.exp(-eps))  # e^eps / (1 + e^eps), stable for large eps
    w_lo = (1.0 - d) - w_hi
    probs = np.zeros(hi - lo + 1)
    probs[0] += w_lo
    probs[-1] += w_hi
    pmf = dense_pmf(lo, probs, d, disc)
    return PrivacyLossDistribution(pmf, pmf)


# ----------------------------------------------------------------------------------- from a PLD
class _Direction:
    """One direction's pessimistic PMF as suffix sums: ``delta(eps)`` at any ``eps >= 0``."""

    def __init__(self, pld: PrivacyLossDistribution, direction: str) -> None:
        losses, probs, inf_mass = pld.pmf(direction)
        keep = probs > 0
        self.losses, probs = losses[keep], probs[keep]
        self.inf_mass = inf_mass
        with np.errstate(under="ignore", over="ignore"):
            w = probs * np.exp(-self.losses)
        # suffix sums over the losses at and above each index (accumulated from the small tail)
        self.c0 = np.concatenate((np.cumsum(probs[::-1])[::-1], [0.0]))
        self.c1 = np.concatenate((np.cumsum(w[::-1])[::-1], [0.0]))

    def atoms(self) -> np.ndarray:
        """``0`` and every positive loss: where the exact minimum over ``eps`` of either line lies."""
        return np.concatenate(([0.0], self.losses[self.losses > 0]))

    def delta(self, eps: np.ndarray) -> np.ndarray:
        """``delta(eps) = P[L > eps] - e^eps sum_{l > eps} p_l e^{-l}`` plus an allowance for the sums'
        rounding (recursive summation: ``n u`` of the summed terms; the product and difference a few
        ``u`` more), so it is never below the exact divergence of this PMF."""
        idx = np.searchsorted(self.losses, eps, side="right")  # first loss > eps
        s0 = self.c0[idx] + self.inf_mass
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = np.exp(eps) * self.c1[idx]
            delta = np.maximum(s0 - scaled, 0.0) + (self.losses.size + 4) * 2 * _U * (s0 + scaled)
        return np.minimum(np.where(np.isfinite(delta), delta, 1.0), 1.0)


def _lower_envelope(eps: np.ndarray, d_an: np.ndarray, eps2: np.ndarray, d_na: np.ndarray, alpha: np.ndarray,
                    offset: float) -> np.ndarray:
    """``min(1, min_k e^eps_k alpha + d_an_k + offset, min_k 1 - e^-eps2_k (1 - alpha - d_na_k - offset))``:
    every term is a valid TPR bound (module docstring), whatever the grids. The minimum over ``k`` is
    found by a binary search on the discrete slopes, exact when ``delta`` is convex in ``e^eps`` (every
    hockey-stick curve, pessimistic PLDs and maxima of such included; the minimum over ``eps`` of each line
    is then at a grid point): the first line is convex in ``x = e^eps`` and decreases while
    ``alpha < -(Delta d / Delta x)``; the second is convex in ``y = e^-eps`` and decreases (as ``eps``
    grows) while ``Delta(y d) / Delta y > 1 - alpha - offset``. Neighbours of the index found are tried
    too (rounding), and any index found gives a sound bound."""
    best = np.ones_like(alpha)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        x = np.exp(eps)
        if eps.size > 1:
            r = -np.diff(d_an) / np.diff(x)  # non-increasing in k
            k = np.searchsorted(-r, -alpha, side="left")
        else:
            k = np.zeros(alpha.shape, dtype=np.int64)
        for j in (-1, 0, 1):
            kk = np.clip(k + j, 0, eps.size - 1)
            val = x[kk] * alpha + d_an[kk] + offset
            best = np.minimum(best, np.where(np.isfinite(val), val, 1.0))
        y = np.exp(-eps2)
        if eps2.size > 1:
            u = np.diff(y * d_na) / np.diff(y)  # non-increasing in k
            k = np.searchsorted(-u, -(1.0 - alpha - offset), side="left")
        else:
            k = np.zeros(alpha.shape, dtype=np.int64)
        for j in (-1, 0, 1):
            kk = np.clip(k + j, 0, eps2.size - 1)
            best = np.minimum(best, 1.0 - y[kk] * (1.0 - alpha - d_na[kk] - offset))
    return best


def tpr_from_profile(epsilons, delta_remove, delta_add, fpr, *, delta_offset: float = 0.0,
                     symmetric: bool = False) -> np.ndarray | float:
    """Upper bound on the TPR of every membership test at FPR ``fpr`` from upper bounds on the two
    hockey-stick divergences at the grid ``epsilons >= 0`` (sorted): ``delta_remove[k] >=
    H_{e^eps_k}(with || without)`` and ``delta_add[k] >= H_{e^eps_k}(without || with)``, e.g. from an RDP
    conversion at each ``eps``. Sound for any grid (a coarser grid gives a larger curve); the worst of
    both orders (``symmetric=True``: with ``max(delta_remove, delta_add)`` in both lines, a concave
    curve that is a proper symmetric trade-off function)."""
    eps = _v.finite_array("epsilons", epsilons)
    d_r = _v.finite_array("delta_remove", delta_remove)
    d_a = _v.finite_array("delta_add", delta_add)
    if not (eps.shape == d_r.shape == d_a.shape) or eps.size == 0:
        raise InvalidParameterError("epsilons, delta_remove and delta_add must be non-empty and of one length")
    if np.any(eps < 0) or np.any(np.diff(eps) < 0):
        raise InvalidParameterError("epsilons must be >= 0 and sorted")
    if np.any(d_r < 0) or np.any(d_a < 0):
        raise InvalidParameterError("delta_remove and delta_add must be >= 0")
    off = _v.non_negative("delta_offset", delta_offset)
    alpha, scalar = _fpr_array(fpr)
    if symmetric:
        h = np.maximum(d_r, d_a)
        tpr = _lower_envelope(eps, h, eps, h, alpha, off)
    else:
        tpr = np.maximum(_lower_envelope(eps, d_r, eps, d_a, alpha, off),
                         _lower_envelope(eps, d_a, eps, d_r, alpha, off))
    tpr = _finish(alpha, tpr)
    return float(tpr[0]) if scalar else tpr


def tpr_from_pld(pld: PrivacyLossDistribution, fpr, *, delta_offset: float = 0.0,
                 symmetric: bool = False) -> np.ndarray | float:
    """Upper bound on the TPR of every membership test at FPR ``fpr``, from a pessimistic PLD
    (module docstring): the worst of both orders of the pair (their pointwise maximum: the tightest
    sound answer, exact for the discretized pair; it need not be concave). ``symmetric=True`` gives
    instead the curve of ``max(delta_remove, delta_add)`` (at every atom of either direction): concave,
    at least as large, the proper symmetric trade-off function an f-DP statement for both orders can
    use. ``delta_offset`` is added to both hockey-stick divergences (e.g. MMCC's ``delta_1``)."""
    if not isinstance(pld, PrivacyLossDistribution):
        raise InvalidParameterError(f"pld must be a dpmf.privacy.PrivacyLossDistribution, got {type(pld).__name__}")
    off = _v.non_negative("delta_offset", delta_offset)
    alpha, scalar = _fpr_array(fpr)
    remove = _Direction(pld, "remove")
    add = remove if pld.symmetric else _Direction(pld, "add")
    if symmetric:
        eps = np.unique(np.concatenate((remove.atoms(), add.atoms())))
        h = np.maximum(remove.delta(eps), add.delta(eps))
        tpr = _lower_envelope(eps, h, eps, h, alpha, off)
    else:
        e_r, e_a = remove.atoms(), add.atoms()
        d_r, d_a = remove.delta(e_r), add.delta(e_a)
        tpr = _lower_envelope(e_r, d_r, e_a, d_a, alpha, off)  # null = without, alternative = with
        if not pld.symmetric:
            tpr = np.maximum(tpr, _lower_envelope(e_a, d_a, e_r, d_r, alpha, off))  # null = with
    tpr = _finish(alpha, tpr)
    return float(tpr[0]) if scalar else tpr


# ----------------------------------------------------------------------------------- the curve
@dataclass(frozen=True)
class PrivacyCurve:
    """What a mechanism is *proved* to satisfy, in the strongest form its accountant has (module
    docstring): ``kind`` is ``"gdp"`` (``mu``), ``"pld"`` (``plds``: pairs ``(PLD, delta_offset)``,
    the worst of them) or ``"epsilon_delta"`` (``epsilon``, ``delta``). ``epsilon`` / ``delta`` may
    also be set on the other kinds: the claim made from the curve (used where a PLD part cannot be
    composed as a PLD). ``note`` says in words where the curve comes from.

    Build one with :meth:`gaussian`, :meth:`from_pld` or :meth:`from_epsilon_delta`; query with
    :meth:`tpr`; combine with :meth:`compose` / :meth:`self_compose`.
    """

    kind: str
    mu: float | None = None
    plds: tuple = field(default=(), repr=False)
    epsilon: float | None = None
    delta: float | None = None
    note: str = ""
    #: ``gdp`` only: True when the mechanism *is* this Gaussian pair (nothing tighter holds, e.g. the
    #: matrix mechanism with a fixed participation pattern); False when mu-GDP is a bound that
    #: credits nothing for the sampler's randomness
    exact: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidParameterError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "gdp" and (self.mu is None or not self.mu >= 0 or not math.isfinite(self.mu)):
            raise InvalidParameterError(f"a GDP curve needs a finite mu >= 0, got {self.mu!r}")
        if self.kind == "pld" and not self.plds:
            raise InvalidParameterError("a PLD curve needs at least one (PLD, delta_offset) pair")
        if self.kind == "epsilon_delta" and (self.epsilon is None or self.delta is None):
            raise InvalidParameterError("an (epsilon, delta) curve needs both epsilon and delta")

    # ------------------------------------------------------------------ construction
    @classmethod
    def gaussian(cls, mu: float, note: str = "", *, exact: bool = True) -> "PrivacyCurve":
        """``mu``-GDP (the Gaussian mechanism with ``mu = sensitivity / sigma``); ``exact=False`` when
        it is a bound on a mechanism with more randomness (e.g. a sampler whose amplification is not
        credited)."""
        return cls("gdp", mu=_v.non_negative("mu", mu), note=note or f"mu-GDP, mu = {mu:.6g}", exact=bool(exact))

    @classmethod
    def from_pld(
        cls, pld: PrivacyLossDistribution | list | tuple, delta_offset: float = 0.0, *, epsilon=None, delta=None,
        note: str = "",
    ) -> "PrivacyCurve":
        """From one pessimistic PLD (``delta_offset`` added to its divergences), or from a list of
        ``(PLD, delta_offset)`` pairs meaning "the worst of these"."""
        if isinstance(pld, PrivacyLossDistribution):
            pairs = ((pld, _v.non_negative("delta_offset", delta_offset)),)
        else:
            pairs = tuple((p, _v.non_negative("delta_offset", o)) for p, o in pld)
            if not all(isinstance(p, PrivacyLossDistribution) for p, _ in pairs):
                raise InvalidParameterError("from_pld takes a PrivacyLossDistribution or (PLD, delta_offset) pairs")
        return cls("pld", plds=pairs, epsilon=epsilon, delta=delta, note=note or "pessimistic PLD")

    @classmethod
    def from_epsilon_delta(cls, epsilon: float, delta: float, note: str = "") -> "PrivacyCurve":
        """Only ``(epsilon, delta)``-DP is known."""
        eps = float(epsilon)
        if math.isnan(eps) or eps < 0:
            raise InvalidParameterError(f"epsilon must be >= 0 (or inf), got {epsilon!r}")
        return cls("epsilon_delta", epsilon=eps, delta=_v.probability("delta", delta, allow_zero=True),
                   note=note or f"(epsilon, delta) = ({eps:.6g}, {delta:.3g}) only")

    # ------------------------------------------------------------------ queries
    @property
    def bound(self) -> str:
        """Which bound :meth:`tpr` is, in words."""
        if self.kind == "gdp":
            return f"exact GDP curve Phi(Phi^-1(fpr) + mu), mu = {self.mu:.6g}"
        if self.kind == "pld":
            offsets = [o for _, o in self.plds]
            extra = f", plus delta offset {max(offsets):.3g}" if any(offsets) else ""
            many = f", the worst of {len(self.plds)} PLDs" if len(self.plds) > 1 else ""
            return f"from the pessimistic PLD (both directions, exact for the discretized pair{extra}{many})"
        return (f"implied by (epsilon, delta) = ({self.epsilon:.6g}, {self.delta:.3g}) alone: "
                "min(1, e^eps fpr + delta, 1 - e^-eps (1 - delta - fpr))")

    @property
    def discretization(self) -> float | None:
        """The coarsest loss grid of the curve's PLDs (``None`` for GDP and ``(eps, delta)`` curves)."""
        if self.kind != "pld":
            return None
        return max(p.discretization for p, _ in self.plds)

    def tpr(self, fpr, *, symmetric: bool = False) -> np.ndarray | float:
        """Upper bound on the TPR of every membership test at each FPR (module docstring): the worst of
        both orders of the pair. ``symmetric=True``: the concave, symmetric curve of the worst delta over
        both directions (and over the PLDs), at least as large -- a proper trade-off function (GDP and
        (epsilon, delta) curves are already both)."""
        if self.kind == "gdp":
            return tpr_gdp(self.mu, fpr)
        if self.kind == "epsilon_delta":
            return tpr_epsilon_delta(self.epsilon, self.delta, fpr)
        alpha, scalar = _fpr_array(fpr)
        if not symmetric:
            tpr = np.max([np.atleast_1d(tpr_from_pld(p, alpha, delta_offset=o)) for p, o in self.plds], axis=0)
        elif len(self.plds) == 1:
            (p, o), = self.plds
            tpr = np.atleast_1d(tpr_from_pld(p, alpha, delta_offset=o, symmetric=True))
        else:  # the worst delta over every PLD and direction, at every atom of any of them
            dirs = [(_Direction(p, d), o) for p, o in self.plds for d in (("remove",) if p.symmetric else DIRECTIONS)]
            eps = np.unique(np.concatenate([d.atoms() for d, _ in dirs]))
            h = np.minimum(np.max([d.delta(eps) + o for d, o in dirs], axis=0), 1.0)
            tpr = _finish(alpha, _lower_envelope(eps, h, eps, h, alpha, 0.0))
        return float(tpr[0]) if scalar else tpr

    def delta_at(self, epsilon: float) -> float:
        """A sound delta at ``epsilon`` (worst direction; ``inf`` epsilon only for the claim)."""
        from dpmf.privacy.gdp import gdp_delta

        eps = _v.non_negative("epsilon", epsilon)
        if self.kind == "gdp":
            return gdp_delta(self.mu, eps) if self.mu > 0 else 0.0
        if self.kind == "epsilon_delta":
            return self.delta if eps >= self.epsilon else 1.0
        return max(min(1.0, p.delta(eps) + o) for p, o in self.plds)

    def epsilon_at(self, delta: float) -> float:
        """Smallest epsilon with a sound delta <= ``delta`` (worst direction)."""
        from dpmf.privacy.gdp import gdp_epsilon

        d = _v.open_unit("delta", delta)
        if self.kind == "gdp":
            return gdp_epsilon(self.mu, d) if self.mu > 0 else 0.0
        if self.kind == "epsilon_delta":
            return self.epsilon if d >= self.delta else math.inf
        return max(p.epsilon(d - o) if d > o else math.inf for p, o in self.plds)

    # ------------------------------------------------------------------ composition
    def as_pld(self, discretization: float) -> tuple[PrivacyLossDistribution, float, str]:
        """``(PLD on the grid discretization, delta_offset, how)``: this curve as one pessimistic PLD,
        for composition (module docstring)."""
        from dpmf.privacy.gaussian_plds import gaussian

        disc = _v.positive("discretization", discretization)
        if self.kind == "gdp":
            if self.mu == 0:
                return PrivacyLossDistribution.identity(disc), 0.0, "exact (GDP, mu = 0)"
            return gaussian(1.0 / self.mu, discretization=disc), 0.0, "exact GDP, as its pessimistic Gaussian PLD"
        if self.kind == "pld" and len(self.plds) == 1:
            p, o = self.plds[0]
            how = "tight (its pessimistic PLD" + (", regridded up" if p.discretization != disc else "") + ")"
            return p.regrid(disc), o, how
        if self.kind == "pld" and (self.epsilon is None or self.delta is None):
            raise UnsupportedConfigurationError(
                f"a curve that is the worst of {len(self.plds)} PLDs cannot be composed as one PLD, and it records "
                "no (epsilon, delta) claim to fall back to"
            )
        why = "" if self.kind == "epsilon_delta" else (
            f" (its curve is the worst of {len(self.plds)} PLDs, which is not one PLD)")
        return (
            epsilon_delta_pld(self.epsilon, self.delta, disc), 0.0,
            f"NOT tight: only its (epsilon, delta) = ({self.epsilon:.6g}, {self.delta:.3g}){why}, composed through "
            "the (epsilon, delta) dominating pair (optimal composition of (epsilon, delta)-DP parts, never looser "
            "than basic composition)",
        )

    def self_compose(self, count: int, *, discretization: float | None = None) -> "PrivacyCurve":
        """``count`` independent runs of this mechanism (e.g. hyperparameter tuning)."""
        count = _v.positive_int("count", count)
        return PrivacyCurve.compose_all([self], [count], discretization=discretization)

    def compose(self, *others: "PrivacyCurve", discretization: float | None = None) -> "PrivacyCurve":
        """This mechanism and ``others`` run on the same data with independent randomness."""
        return PrivacyCurve.compose_all([self, *others], discretization=discretization)

    @staticmethod
    def compose_all(
        curves, counts=None, *, discretization: float | None = None, tail_mass_truncation: float | None = None
    ) -> "PrivacyCurve":
        """Compose ``curves[i]`` ``counts[i]`` times each (default once); see :func:`compose_curves`."""
        return compose_curves(curves, counts, discretization=discretization,
                              tail_mass_truncation=tail_mass_truncation)[0]


def compose_curves(
    curves, counts=None, *, discretization: float | None = None, tail_mass_truncation: float | None = None
) -> tuple[PrivacyCurve, list[str]]:
    """Compose ``curves[i]`` ``counts[i]`` times each (default once): ``(curve, how each part
    entered)``. All GDP: exact GDP (``mu = sqrt(sum counts_i mu_i^2)``). Otherwise PLDs on the
    coarsest grid of the parts (``discretization`` to choose another;
    :data:`~dpmf.privacy.pld.DEFAULT_DISCRETIZATION` when no part has a grid), convolved per
    direction, ``delta_offset`` summed; a part's "how" starts with ``"NOT tight"`` when it entered
    only through its (epsilon, delta) claim (module docstring)."""
    from dpmf.privacy.pld import DEFAULT_TAIL_MASS_TRUNCATION, compose_many

    curves = list(curves)
    if not curves:
        raise InvalidParameterError("nothing to compose: give at least one curve")
    if not all(isinstance(c, PrivacyCurve) for c in curves):
        raise InvalidParameterError("compose takes PrivacyCurve objects")
    counts = [1] * len(curves) if counts is None else [_v.positive_int("count", k) for k in counts]
    if len(counts) != len(curves):
        raise InvalidParameterError(f"counts must have one entry per curve ({len(curves)}), got {len(counts)}")
    if all(c.kind == "gdp" for c in curves):
        mu = math.sqrt(math.fsum(k * c.mu**2 for c, k in zip(curves, counts)))
        curve = PrivacyCurve.gaussian(
            mu, note=f"composition of GDP parts: mu = sqrt(sum of the parts' mu^2) = {mu:.6g}",
            exact=all(c.exact for c in curves),
        )
        return curve, ["exact (GDP: mu^2 adds up)"] * len(curves)
    if discretization is None:
        grids = [c.discretization for c in curves if c.discretization is not None]
        disc = max(grids) if grids else DEFAULT_DISCRETIZATION
    else:
        disc = _v.positive("discretization", discretization)
    tail = DEFAULT_TAIL_MASS_TRUNCATION if tail_mass_truncation is None else _v.non_negative(
        "tail_mass_truncation", tail_mass_truncation)
    parts, offset, hows = [], 0.0, []
    for c, k in zip(curves, counts):
        p, o, how = c.as_pld(disc)
        hows.append(how)
        parts.append(p)
        offset += k * o
    total = compose_many(parts, counts, tail)
    return PrivacyCurve.from_pld(total, offset, note="composition: " + "; ".join(hows)), hows


# ----------------------------------------------------------------------------------- results
#: FPRs of the default curve: log-spaced from 1e-6 to 1e-2, then linear to 1.
def default_fpr() -> np.ndarray:
    """The FPR grid :meth:`TradeOff.of` uses when none is given (dense where audits look: small FPR)."""
    return np.unique(np.concatenate(([0.0], np.logspace(-6, -2, 41), np.linspace(0.01, 1.0, 100))))


def gdp_mu_of(curve: PrivacyCurve) -> tuple[float | None, str]:
    """``(mu, note)``: the exact GDP mu of a ``gdp`` curve, else ``(None, why none is given)``."""
    if curve.kind == "gdp" and curve.exact:
        return curve.mu, f"exact: the mechanism is exactly mu-GDP ({curve.note})"
    if curve.kind == "gdp":
        return curve.mu, (f"an upper bound: the mechanism is mu-GDP ({curve.note}), and more private than that since "
                          "the sampler's randomness is not credited")
    if curve.kind == "pld":
        return None, ("not available: the mechanism is not proved Gaussian (e.g. amplified by sampling); its f-DP "
                      "curve is the PLD's (tradeoff()), and any single mu would be an approximation")
    return None, "not available: only an (epsilon, delta) pair is known"


@dataclass(frozen=True)
class TradeOff:
    """The result of ``report.tradeoff(fpr)``: ``tpr[i]`` is an upper bound on the true-positive rate
    of every membership test at false-positive rate ``fpr[i]`` (a float when ``fpr`` was a number).

    ``kind`` is the curve's form (``"gdp"``, ``"pld"``, ``"epsilon_delta"``) and ``bound`` says in
    words which bound it is; ``mu`` is the exact GDP mu (``None`` unless the mechanism is exactly
    GDP, ``mu_note`` says why); ``certified`` is False when the report is an estimate (then so is
    this curve)."""

    fpr: np.ndarray | float
    tpr: np.ndarray | float
    kind: str
    bound: str
    certified: bool
    mu: float | None
    mu_note: str
    note: str = ""

    @classmethod
    def of(cls, curve: PrivacyCurve, fpr=None, *, certified: bool = True, symmetric: bool = False) -> "TradeOff":
        if fpr is None:
            fpr = default_fpr()
        alpha, scalar = _fpr_array(fpr)
        tpr = curve.tpr(alpha, symmetric=symmetric)
        mu, mu_note = gdp_mu_of(curve)
        if scalar:
            return cls(float(alpha[0]), float(np.atleast_1d(tpr)[0]), curve.kind, curve.bound, bool(certified), mu,
                       mu_note, curve.note)
        return cls(alpha, np.asarray(tpr), curve.kind, curve.bound, bool(certified), mu, mu_note, curve.note)

    def to_dict(self) -> dict:
        """JSON-ready."""
        as_list = (lambda x: x.tolist()) if isinstance(self.fpr, np.ndarray) else float
        return {"fpr": as_list(self.fpr), "tpr": as_list(self.tpr), "kind": self.kind, "bound": self.bound,
                "certified": self.certified, "mu": self.mu, "mu_note": self.mu_note, "note": self.note}
