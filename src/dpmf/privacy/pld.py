"""Privacy-loss distributions (PLDs): a thin, explicit layer over ``dp_accounting.pld``.

A PLD of a dominating pair (P, Q) is the law of ``L = log(P(o)/Q(o))`` with ``o ~ P``. The
hockey-stick divergence is ``delta(eps) = E[(1 - exp(eps - L))_+] + Pr[L = +inf]``.

dpmf keeps **both adjacency directions** (zero-out adjacency, DESIGN.md):

* ``remove``: P = output *with* the example, Q = output without it;
* ``add``: P = output without the example, Q = output with it.

Every epsilon/delta this module reports is the worst over the two directions, and the
per-direction values are available. PMFs live on the grid ``k * discretization`` and are
*pessimistic*: every rounding moves privacy loss up, and truncated tail mass goes to
``+inf``. Composition is dp_accounting's FFT convolution (our composition engine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from dpmf import validation as _v
from dpmf._lazy import LazyModule
from dpmf.errors import InvalidParameterError
from dpmf.privacy import dp_pld
from dpmf.privacy.dp_pld import dense_pmf, pld_pmf

_dpa_pld = LazyModule("dp_accounting.pld.privacy_loss_distribution")

#: Default spacing of the privacy-loss grid (same as dp_accounting's default).
DEFAULT_DISCRETIZATION = 1e-4
#: Default tail mass moved to +inf at each composition (pessimistic truncation).
DEFAULT_TAIL_MASS_TRUNCATION = 1e-15

DIRECTIONS = ("remove", "add")


def _check_self_compose_fits(pmf, count: int, tail: float) -> None:
    """The memory guard (:func:`dpmf.resources.check_allocation`) before ``count``-fold
    self-composition of one direction's PMF, so ``compose(times=10**12)`` is refused at once in one
    line instead of numpy's MemoryError after a long wait (issue 44). An estimate that errs low:
    the composed loss has standard deviation ``sqrt(count) s`` (``s`` that of one run, in grid
    points), and keeping all but ``tail`` of its mass takes at least about
    ``2 sqrt(2 ln(1 / tail)) sqrt(count) s`` grid points (the Gaussian tail; dp_accounting's Chernoff
    bounds keep more), as two float64 arrays (the FFT's input and output)."""
    from dpmf.resources import check_allocation

    if dp_pld.is_dense(pmf):
        p = np.asarray(dp_pld.dense_arrays(pmf)[1], dtype=np.float64)
        x = np.arange(p.size, dtype=np.float64)
    else:
        items = dp_pld.loss_probs(pmf)
        x = np.fromiter(items.keys(), dtype=np.float64, count=len(items))
        p = np.fromiter(items.values(), dtype=np.float64, count=len(items))
    mass = float(p.sum())
    if not mass > 0:
        return
    mean = float(p @ x) / mass
    std = math.sqrt(max(float(p @ (x - mean) ** 2) / mass, 1.0))
    z = 2.0 * math.sqrt(2.0 * math.log(1.0 / min(max(tail, 1e-300), 0.5)))
    points = z * math.sqrt(float(count)) * std
    if points > 2**62:
        points = float(2**62)  # (check_allocation only compares bytes; the number is shown rounded)
    check_allocation(1, int(points), f"composing {int(count):,} runs (a privacy loss grid of at least "
                     f"{points:.3g} points)", copies=2, hint="use a smaller times (fewer runs)")


def _compose_pmfs(a, b, tail: float):
    """dp_accounting's composition of two PMFs; dense ones by :mod:`.dense_convolution` (the same
    numbers, without its Python loop over the tails)."""
    if dp_pld.is_dense(a) and dp_pld.is_dense(b):
        from dpmf.privacy.dense_convolution import compose_dense

        return compose_dense(a, b, tail)
    return pld_pmf.compose_pmfs(a, b, tail)


def _self_compose_pmf(pmf, count: int, tail: float):
    """dp_accounting's ``count``-fold self-composition; dense PMFs by :mod:`.dense_convolution`
    (real transforms, vectorized Chernoff bounds)."""
    if dp_pld.is_dense(pmf):
        from dpmf.privacy.dense_convolution import self_compose_dense

        return self_compose_dense(pmf, count, tail)
    return pmf.self_compose(count, tail)


def _no_memory(count: int) -> InvalidParameterError:
    return InvalidParameterError(
        f"composing {count:,} runs needs more memory than this machine has (dp_accounting's privacy loss "
        "grid); use a smaller times (fewer runs)"
    )


def _self_compose_compose_pmf(a, count: int, b, tail: float):
    """``a`` self-composed ``count`` times, then composed with ``b``; dense PMFs in one spectrum
    (:func:`.dense_convolution.self_compose_convolve_dense`)."""
    if dp_pld.is_dense(a) and dp_pld.is_dense(b):
        from dpmf.privacy.dense_convolution import self_compose_convolve_dense

        return self_compose_convolve_dense(a, count, b, tail)
    return _compose_pmfs(_self_compose_pmf(a, count, tail), b, tail)


def _epsilon_for_delta(pmf, delta: float) -> float:
    """dp_accounting's ``get_epsilon_for_delta``; for a dense PMF its loop compiled, bit for bit
    (:mod:`._pld_compiled`)."""
    if dp_pld.is_dense(pmf):
        from dpmf.privacy._pld_compiled import epsilon_for_delta

        lower, probs, inf, disc = dp_pld.dense_arrays(pmf)
        upper = (lower + len(probs) - 1) * disc
        return float(epsilon_for_delta(float(upper), -float(disc), np.ascontiguousarray(probs[::-1], dtype=np.float64),
                                       float(inf), float(delta)))
    return float(pmf.get_epsilon_for_delta(delta))


@dataclass(frozen=True)
class PrivacyLossDistribution:
    """A pessimistic PLD for both adjacency directions.

    Build one with :func:`dpmf.privacy.gaussian`, :func:`~dpmf.privacy.subsampled_gaussian`,
    :func:`~dpmf.privacy.mixture_of_gaussians`, :func:`from_probability_mass_functions` or
    :meth:`identity`; combine with :meth:`compose` and :meth:`self_compose`.
    """

    remove: pld_pmf.PLDPmf
    add: pld_pmf.PLDPmf

    # ----------------------------------------------------------------- construction
    @classmethod
    def identity(cls, discretization: float = DEFAULT_DISCRETIZATION) -> "PrivacyLossDistribution":
        """The PLD of a mechanism that reveals nothing (loss 0 with probability 1)."""
        return cls.from_dp_accounting(_dpa_pld.identity(discretization))

    @classmethod
    def from_dp_accounting(cls, pld: _dpa_pld.PrivacyLossDistribution) -> "PrivacyLossDistribution":
        """Wrap a ``dp_accounting`` PLD (it must be a pessimistic estimate)."""
        remove, add = dp_pld.directions(pld)
        if not dp_pld.is_pessimistic(remove):
            raise InvalidParameterError("only pessimistic dp_accounting PLDs can be wrapped")
        return cls(remove=remove, add=add)

    def to_dp_accounting(self) -> _dpa_pld.PrivacyLossDistribution:
        """The same PLD as a ``dp_accounting.pld.PrivacyLossDistribution``."""
        return _dpa_pld.PrivacyLossDistribution(self.remove, self.add)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain arrays that :meth:`from_arrays` turns back into this PLD bit for bit (dense and
        sparse PMFs keep their type, so a reloaded PLD composes exactly like the original)."""
        out: dict[str, np.ndarray] = {"symmetric": np.array(self.symmetric)}
        for d in (("remove",) if self.symmetric else DIRECTIONS):
            pmf = self._direction(d)
            head = [dp_pld.discretization(pmf), dp_pld.infinity_mass(pmf)]
            if dp_pld.is_dense(pmf):
                lower, probs, _, _ = dp_pld.dense_arrays(pmf)
                out[f"{d}_dense"] = np.array(head + [float(lower)])
                out[f"{d}_probs"] = np.asarray(probs, dtype=np.float64)
            else:
                items = sorted(dp_pld.loss_probs(pmf).items())
                out[f"{d}_sparse"] = np.array(head)
                out[f"{d}_losses"] = np.array([k for k, _ in items], dtype=np.int64)
                out[f"{d}_probs"] = np.array([v for _, v in items], dtype=np.float64)
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "PrivacyLossDistribution":
        """Inverse of :meth:`to_arrays` (e.g. from ``numpy.load``)."""

        def pmf(d: str) -> pld_pmf.PLDPmf:
            if f"{d}_dense" in arrays:
                disc, inf, lower = (float(x) for x in arrays[f"{d}_dense"])
                return dp_pld.make_dense(int(lower), np.array(arrays[f"{d}_probs"], dtype=np.float64), inf, disc)
            disc, inf = (float(x) for x in arrays[f"{d}_sparse"])
            losses, probs = arrays[f"{d}_losses"], arrays[f"{d}_probs"]
            return dp_pld.make_sparse({int(k): float(v) for k, v in zip(losses, probs)}, inf, disc)

        try:
            remove = pmf("remove")
            add = remove if bool(arrays["symmetric"]) else pmf("add")
        except (KeyError, ValueError, TypeError) as exc:
            raise InvalidParameterError(f"not a stored PrivacyLossDistribution: {exc}") from None
        return cls(remove=remove, add=add)

    # ----------------------------------------------------------------- properties
    @property
    def discretization(self) -> float:
        """Spacing of the privacy-loss grid."""
        return dp_pld.discretization(self.remove)

    @property
    def symmetric(self) -> bool:
        """True when both directions share one PMF object."""
        return self.add is self.remove

    def pmf(self, direction: str) -> tuple[np.ndarray, np.ndarray, float]:
        """``(losses, probabilities, infinity_mass)`` of one direction, densely."""
        lower, probs, inf, disc = dp_pld.dense_arrays(self._direction(direction).to_dense_pmf())
        probs = np.asarray(probs, dtype=np.float64)
        losses = (np.arange(probs.size) + lower) * disc
        return losses, probs, inf

    # ----------------------------------------------------------------- composition
    def _check_composable(self, other: object) -> None:
        if not isinstance(other, PrivacyLossDistribution):
            raise InvalidParameterError(f"other must be a PrivacyLossDistribution, got {type(other).__name__}")
        if not math.isclose(self.discretization, other.discretization, rel_tol=0, abs_tol=0):
            raise InvalidParameterError(
                "cannot compose PLDs with different discretizations: "
                f"{self.discretization!r} and {other.discretization!r}"
            )

    def compose(
        self, other: "PrivacyLossDistribution", tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION
    ) -> "PrivacyLossDistribution":
        """The PLD of running both mechanisms on independent randomness (convolution)."""
        self._check_composable(other)
        tail = _v.non_negative("tail_mass_truncation", tail_mass_truncation)
        remove = _compose_pmfs(self.remove, other.remove, tail)
        if self.symmetric and other.symmetric:
            return PrivacyLossDistribution(remove, remove)
        return PrivacyLossDistribution(remove, _compose_pmfs(self.add, other.add, tail))

    def self_compose(
        self, count: int, tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION
    ) -> "PrivacyLossDistribution":
        """The PLD of ``count`` independent runs of this mechanism."""
        count = _v.positive_int("count", count)
        tail = _v.non_negative("tail_mass_truncation", tail_mass_truncation)
        if count == 1:
            return self
        for direction in ("remove", "add") if not self.symmetric else ("remove",):
            _check_self_compose_fits(self._direction(direction), count, tail)
        try:
            remove = _self_compose_pmf(self.remove, count, tail)
            if not self.symmetric:
                add = _self_compose_pmf(self.add, count, tail)
        except MemoryError:
            raise _no_memory(count) from None
        if self.symmetric:
            return PrivacyLossDistribution(remove, remove)
        return PrivacyLossDistribution(remove, add)

    def self_compose_then(
        self, count: int, other: "PrivacyLossDistribution",
        tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION,
    ) -> "PrivacyLossDistribution":
        """``self.self_compose(count).compose(other)`` with one transform of the largest size
        instead of three (:func:`.dense_convolution.self_compose_convolve_dense`; the same law up to
        the FFT's rounding and the tail truncation, pessimistic)."""
        count = _v.positive_int("count", count)
        if count == 1:
            return self.compose(other, tail_mass_truncation)
        self._check_composable(other)
        tail = _v.non_negative("tail_mass_truncation", tail_mass_truncation)
        for direction in ("remove", "add") if not self.symmetric else ("remove",):
            _check_self_compose_fits(self._direction(direction), count, tail)
        try:
            remove = _self_compose_compose_pmf(self.remove, count, other.remove, tail)
            if self.symmetric and other.symmetric:
                return PrivacyLossDistribution(remove, remove)
            return PrivacyLossDistribution(remove, _self_compose_compose_pmf(self.add, count, other.add, tail))
        except MemoryError:
            raise _no_memory(count) from None

    def regrid(self, discretization: float) -> "PrivacyLossDistribution":
        """The same PLD on the grid ``k * discretization``, every loss rounded **up** (pessimistic:
        the result dominates this PLD in both directions), so that PLDs built on different grids can
        be composed. ``self`` when the grid is already that one. A coarser grid loses at most one
        new grid step of loss; a finer one changes nothing but the spacing."""
        disc = _v.positive("discretization", discretization)
        if disc == self.discretization:
            return self
        old = self.discretization
        ratio = disc / old

        def one(direction: str) -> pld_pmf.DensePLDPmf:
            lower, probs, inf, _ = dp_pld.dense_arrays(self._direction(direction).to_dense_pmf())
            probs = np.asarray(probs, dtype=np.float64)
            j = np.arange(probs.size, dtype=np.int64) + lower
            m = round(ratio)
            if m >= 1 and abs(ratio - m) <= 1e-12 * m and old * m == disc:
                idx = -((-j) // m)  # exact ceil(j / m): the new grid is every m-th old point
            else:  # ceil(j * old / disc), nudged up past its rounding error (never below the old loss)
                x = j * (old / disc)
                idx = np.ceil(x + 1e-12 + 8 * 2.0**-53 * np.abs(x)).astype(np.int64)
            lo = int(idx.min())
            new = np.bincount(idx - lo, weights=probs)
            return dense_pmf(lo, new, inf, disc)

        remove = one("remove")
        return PrivacyLossDistribution(remove, remove if self.symmetric else one("add"))

    # ----------------------------------------------------------------- queries
    def epsilon_by_direction(self, delta: float) -> dict[str, float]:
        """Smallest epsilon >= 0 with hockey-stick divergence <= delta, per direction."""
        delta = _v.open_unit("delta", delta)
        return {d: _epsilon_for_delta(self._direction(d), delta) for d in DIRECTIONS}

    def delta_by_direction(self, epsilon: float) -> dict[str, float]:
        """Hockey-stick divergence at ``epsilon``, per direction."""
        epsilon = _v.non_negative("epsilon", epsilon)
        return {d: float(self._direction(d).get_delta_for_epsilon(epsilon)) for d in DIRECTIONS}

    def epsilon(self, delta: float) -> float:
        """Worst epsilon over both adjacency directions at ``delta`` (inf if none is finite)."""
        return max(self.epsilon_by_direction(delta).values())

    def delta(self, epsilon: float) -> float:
        """Worst delta over both adjacency directions at ``epsilon``."""
        return max(self.delta_by_direction(epsilon).values())

    def _direction(self, direction: str) -> pld_pmf.PLDPmf:
        if direction == "remove":
            return self.remove
        if direction == "add":
            return self.add
        raise InvalidParameterError(f"direction must be 'remove' or 'add', got {direction!r}")


def _pmf_size(pmf) -> int:
    """Grid points of one direction's PMF (what one convolution with it costs)."""
    return dp_pld.dense_arrays(pmf)[1].size if dp_pld.is_dense(pmf) else len(dp_pld.loss_probs(pmf))


def _grid_size(pld: "PrivacyLossDistribution") -> int:
    """Grid points of a PLD's larger direction."""
    return max(_pmf_size(pld._direction(d)) for d in DIRECTIONS)


def compose_many(
    plds, counts=None, tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION
) -> "PrivacyLossDistribution | None":
    """The composition of ``plds[i]`` run ``counts[i]`` times each (default once; ``None`` if there
    is nothing to compose), on one grid.

    Each part is self-composed, then the parts are convolved two at a time, always the two with the
    fewest grid points (as a Huffman code merges): an FFT convolution costs about the size of its
    result, so merging small parts first costs ``O(N log k)`` points for ``k`` parts totalling ``N``
    instead of ``O(N k)`` in a fixed order (MMCC: the composed ramp-up rows of BandMF-16 x 500 are
    ~20 parts of ~2.5e5 points next to one part of ~4.5e6). Convolution is associative, so only
    floating-point rounding and the per-convolution tail truncation (``tail_mass_truncation`` moved
    to +inf each time, pessimistic) depend on the order. The part with the largest self-composition
    (``count x`` grid points) is left for last and self-composed in the spectrum of that last
    convolution (:meth:`PrivacyLossDistribution.self_compose_then`). Each direction is composed by
    :func:`compose_many_directions` (a symmetric composition once)."""
    plds = list(plds)
    if not plds:
        return None
    symmetric = all(p.symmetric for p in plds)
    pmfs = compose_many_directions(plds, counts, ("remove",) if symmetric else DIRECTIONS, tail_mass_truncation)
    return PrivacyLossDistribution(pmfs["remove"], pmfs["remove"] if symmetric else pmfs["add"])


def compose_many_directions(
    plds, counts=None, directions=DIRECTIONS, tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION
) -> dict:
    """``{direction: composed PMF}`` of :func:`compose_many` for the named directions only (the
    same numbers as :func:`compose_many`'s, direction for direction: each direction is merged in
    the order of its own sizes; the part composed last is chosen from the PLDs, both directions)."""
    import heapq

    plds = list(plds)
    counts = [1] * len(plds) if counts is None else [int(k) for k in counts]
    tail = _v.non_negative("tail_mass_truncation", tail_mass_truncation)
    if not plds:
        raise InvalidParameterError("nothing to compose")
    sizes = [_grid_size(p) for p in plds]
    # the part whose self-composition is largest is composed last, in one spectrum with the rest
    # (PrivacyLossDistribution.self_compose_then: two transforms of the largest size fewer)
    last = max(range(len(plds)), key=lambda i: (counts[i] > 1, counts[i] * sizes[i]))
    if counts[last] == 1 or len(plds) == 1:
        last = None
    out = {}
    for d in directions:
        heap = []
        for i, (pld, k) in enumerate(zip(plds, counts)):
            if i == last:
                continue
            pmf = pld._direction(d)
            if k > 1:
                _check_self_compose_fits(pmf, k, tail)
                try:
                    pmf = _self_compose_pmf(pmf, k, tail)
                except MemoryError:
                    raise _no_memory(k) from None
            heap.append((_pmf_size(pmf), i, pmf))
        heapq.heapify(heap)
        order = len(plds)
        while len(heap) > 1:
            _, _, a = heapq.heappop(heap)
            _, _, b = heapq.heappop(heap)
            ab = _compose_pmfs(a, b, tail)
            heapq.heappush(heap, (_pmf_size(ab), order, ab))
            order += 1
        if last is not None:
            a = plds[last]._direction(d)
            _check_self_compose_fits(a, counts[last], tail)
            try:
                out[d] = _self_compose_compose_pmf(a, counts[last], heap[0][2], tail)
            except MemoryError:
                raise _no_memory(counts[last]) from None
        else:
            out[d] = heap[0][2]
    return out


#: Grid coarsening of :func:`composed_epsilon`'s bound on the direction that is not the worst.
COARSEN_OTHER_DIRECTION = 16


@dataclass(frozen=True)
class ComposedEpsilon:
    """What :func:`composed_epsilon` found: the epsilon per direction, which of them are the coarse
    grid's upper bound (``bounded``), and the composed PLD (``None`` when a direction was bounded
    only)."""

    epsilon_by_direction: dict
    bounded: tuple
    pld: "PrivacyLossDistribution | None"

    @property
    def epsilon(self) -> float:
        """The worst direction's epsilon."""
        return max(self.epsilon_by_direction.values())


def composed_epsilon(
    plds, counts, delta: float, *, keep_points: int = 0, coarsen: int = COARSEN_OTHER_DIRECTION,
    tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION,
) -> ComposedEpsilon:
    """The epsilon at ``delta`` of :func:`compose_many` ``(plds, counts)``, the worst over both
    directions, composing on the PLDs' grid only the direction that decides it.

    Both directions are first composed on a grid ``coarsen`` times coarser (every part regridded
    with its losses rounded **up**, :meth:`PrivacyLossDistribution.regrid`: a composition that
    dominates the fine one, so its epsilon is an upper bound of that direction's, at ~1/coarsen of
    the cost). The direction whose coarse epsilon is larger is composed on the fine grid; the other
    one too only when its coarse bound exceeds that fine epsilon (or the fine PLD is wanted:
    ``keep_points``, below). Otherwise the other direction's fine epsilon is at most its coarse
    bound, which is at most the worst direction's: the reported worst epsilon is the one both
    fine compositions give (sound: the bound holds for the other direction), and the other
    direction reads its coarse bound (``bounded``). MMCC's rows at BandMF-16 x 500: the add
    direction's epsilon is 1-8% below the remove one's, far more than the coarse grid's shift.

    ``keep_points``: when both fine compositions together would hold at most about this many grid
    points (``coarsen`` x the coarse ones), both are composed and :attr:`ComposedEpsilon.pld` is
    the composed PLD, as :func:`compose_many` gives it.
    """
    delta = _v.open_unit("delta", delta)
    plds = list(plds)
    counts = [1] * len(plds) if counts is None else list(counts)
    if not plds:
        return ComposedEpsilon({d: 0.0 for d in DIRECTIONS}, (), None)
    if all(p.symmetric for p in plds):
        pld = compose_many(plds, counts, tail_mass_truncation)
        return ComposedEpsilon(pld.epsilon_by_direction(delta), (), pld)
    coarse_grid = plds[0].discretization * _v.positive_int("coarsen", coarsen)
    coarse = compose_many_directions([p.regrid(coarse_grid) for p in plds], counts, DIRECTIONS, tail_mass_truncation)
    bound = {d: _epsilon_for_delta(coarse[d], delta) for d in DIRECTIONS}
    worst = "add" if bound["add"] > bound["remove"] else "remove"
    other = "remove" if worst == "add" else "add"
    fine = compose_many_directions(plds, counts, (worst,), tail_mass_truncation)
    eps = {worst: _epsilon_for_delta(fine[worst], delta)}
    keep = coarsen * sum(_pmf_size(coarse[d]) for d in DIRECTIONS) <= keep_points
    if keep or not bound[other] <= eps[worst]:
        fine.update(compose_many_directions(plds, counts, (other,), tail_mass_truncation))
        eps[other] = _epsilon_for_delta(fine[other], delta)
        return ComposedEpsilon({d: eps[d] for d in DIRECTIONS}, (), PrivacyLossDistribution(fine["remove"], fine["add"]))
    eps[other] = bound[other]
    return ComposedEpsilon({d: eps[d] for d in DIRECTIONS}, (other,), None)


def from_probability_mass_functions(
    with_example: Mapping[object, float] | np.ndarray,
    without_example: Mapping[object, float] | np.ndarray,
    *,
    discretization: float = DEFAULT_DISCRETIZATION,
) -> PrivacyLossDistribution:
    """The PLD of a discrete mechanism given its output PMFs with and without the example.

    Each privacy loss ``log(P(o)/Q(o))`` is rounded **up** to the grid and outcomes with
    ``Q(o) = 0`` carry infinite loss, so the result dominates the exact pair in both directions.
    The PMFs may be dicts ``{outcome: probability}`` or aligned arrays over the same outcomes.
    """
    disc = _v.positive("discretization", discretization)
    if isinstance(with_example, Mapping) or isinstance(without_example, Mapping):
        if not (isinstance(with_example, Mapping) and isinstance(without_example, Mapping)):
            raise InvalidParameterError("with_example and without_example must both be dicts or both arrays")
        outcomes = sorted(set(with_example) | set(without_example), key=repr)
        p = np.array([float(with_example.get(o, 0.0)) for o in outcomes])
        q = np.array([float(without_example.get(o, 0.0)) for o in outcomes])
    else:
        p = _v.finite_array("with_example", with_example)
        q = _v.finite_array("without_example", without_example)
        if p.shape != q.shape:
            raise InvalidParameterError(
                f"with_example and without_example must have the same length, got {p.size} and {q.size}"
            )
    for name, arr in (("with_example", p), ("without_example", q)):
        if np.any(~np.isfinite(arr)) or np.any(arr < 0):
            raise InvalidParameterError(f"{name} must hold finite probabilities >= 0")
        if abs(math.fsum(arr.tolist()) - 1.0) > 1e-9:
            raise InvalidParameterError(f"{name} must sum to 1, got {math.fsum(arr.tolist())!r}")
    return PrivacyLossDistribution(_pmf_rounded_up(p, q, disc), _pmf_rounded_up(q, p, disc))


def _pmf_rounded_up(p: np.ndarray, q: np.ndarray, disc: float) -> pld_pmf.DensePLDPmf:
    """PMF of ``log(p/q)`` under ``p`` with losses rounded up; ``q = 0`` goes to +inf."""
    support = p > 0
    inf_mass = math.fsum(p[support & (q == 0)].tolist())
    finite = support & (q > 0)
    if not np.any(finite):
        return dense_pmf(0, np.zeros(1), inf_mass, disc)
    idx = np.ceil(np.log(p[finite] / q[finite]) / disc).astype(np.int64)
    lo = int(idx.min())
    probs = np.bincount(idx - lo, weights=p[finite])
    return dense_pmf(lo, probs, inf_mass, disc)
