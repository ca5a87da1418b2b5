"""Contribution bounding for multi-attribution data (Dong & Ganesh 2026, Sec. 6, 7.3 and App. C).

In the multi-attribution setting every example ``e`` is attributed to a set of users ``U(e)``,
and neighbouring datasets differ in *all* examples of one user (fixed-graph adjacency, Ganesh et
al. 2025, "It's my data too", arXiv 2503.03622). The attribution graph is public: preprocessing
that reads only the graph costs no privacy (App. C). The accounting of multi-attribution b-min-sep
(Thm. 6.1) needs every user to have at most ``k_u`` examples, so the data is bounded first:

* **user bound** ``k_u`` (``max_user_examples``): greedy in the spirit of Ganesh et al.'s
  contribution bounding. Examples are visited in ascending number of users (ties in an order
  drawn from ``seed``); an example is kept when each of its users has fewer than ``k_u`` kept
  examples, and then counts once for each of them. The result is *maximal*: every dropped example
  has a user already at ``k_u``. It need not be a maximum (that is a b-matching problem).
* **edge bound** ``k_e`` (``max_neighbourhood``, optional; App. C): additionally the
  user-sharing neighbourhood ``N(e) = {e' : U(e') ∩ U(e) != {}}`` (``e`` included) of every kept
  example, *counted in the kept graph*, has at most ``k_e`` examples. An example is kept only if
  its own ``|N(e)|`` and that of every kept example it would join stay ``<= k_e``. Under Alg. 3 a
  sampled example bars its whole neighbourhood for ``b - 1`` steps; App. C's toy model says an
  example is worth keeping roughly when ``b p k_e < 1`` (:func:`edge_bound_rule_of_thumb`).

Both bounds read the graph only, so they are free under fixed-graph adjacency. The kept examples,
the bounded :class:`~dpmf.sampling.Attribution` (examples renumbered ``0..K-1`` in their original
order) and a :class:`BoundingReport` (what was dropped and why, which users lost examples) come
back in a :class:`BoundedAttribution`. Deterministic given ``seed``; ``O(edges * k_u)`` time
(a compiled loop: ~0.2 s for 10^6 edges, ``benchmarks/bench_bounding.py``).

>>> from dpmf.sampling import bound_contributions
>>> res = bound_contributions([["ann"], ["ann", "bob"], ["ann"], ["bob"]], max_user_examples=2, seed=0)
>>> res.report.kept_examples, res.report.dropped["user_bound"], res.report.max_user_examples
(3, 1, 2)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError
from dpmf.sampling.schemes import Attribution, as_generator

__all__ = [
    "BoundedAttribution",
    "BoundingReport",
    "RuleOfThumb",
    "attribution_from_edges",
    "bound_contributions",
    "edge_bound_rule_of_thumb",
    "neighbourhood_sizes",
]

#: reasons an example is dropped, in the order they are checked
REASONS = ("user_bound", "edge_bound")


# ---------------------------------------------------------------------------------------- graph
def _int_ids(name: str, value: object) -> np.ndarray:
    """A 1-d integer array (``>= 0``) from ``value``; floats only when integral."""
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise InvalidParameterError(f"{name} must be a 1-dimensional array of integer ids, got shape {arr.shape}")
    if arr.size and not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise InvalidParameterError(f"{name} must hold integer ids, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise InvalidParameterError(f"{name} must hold integer ids (no NaN, inf or fractions)")
    out = arr.astype(np.int64)
    if out.size and out.min() < 0:
        i = int(np.argmin(out))
        raise InvalidParameterError(f"{name} must hold ids >= 0, got {name}[{i}] = {int(out[i])}")
    return out


def attribution_from_edges(example_ids, user_ids, num_examples: int | None = None) -> Attribution:
    """The :class:`~dpmf.sampling.Attribution` of an edge list: edge ``i`` attributes example
    ``example_ids[i]`` to user ``user_ids[i]`` (vectorized; duplicate edges count once).

    Examples are ``0..num_examples-1`` (default ``max(example_ids) + 1``) and each needs at least
    one user; users keep their integer ids (``Attribution.user_ids``), in increasing order.

    >>> att = attribution_from_edges([0, 0, 1, 2], [7, 3, 7, 3])
    >>> att.num_examples, att.user_ids, att.examples_per_user().tolist()
    (3, (3, 7), [2, 2])
    """
    ex = _int_ids("example_ids", example_ids)
    us = _int_ids("user_ids", user_ids)
    if ex.size != us.size:
        raise InvalidParameterError(
            f"example_ids and user_ids must have the same length (one entry per edge), got {ex.size} and {us.size}"
        )
    if ex.size == 0:
        raise InvalidParameterError("the attribution graph must have at least one edge (example, user)")
    m = int(ex.max()) + 1 if num_examples is None else _v.positive_int("num_examples", num_examples)
    if int(ex.max()) >= m:
        raise InvalidParameterError(
            f"example_ids must be < num_examples={m}, got example id {int(ex.max())}"
        )
    labels, uidx = _unique_inverse(us)
    key = np.sort(ex * labels.size + uidx)  # sorted by (example, user); duplicates merged next
    key = key[np.concatenate(([True], key[1:] != key[:-1]))]
    ex, uidx = key // labels.size, key % labels.size
    degree = np.bincount(ex, minlength=m)
    if np.any(degree == 0):
        e = int(np.flatnonzero(degree == 0)[0])
        raise InvalidParameterError(
            f"example {e} has no user (num_examples={m}): every example must be attributed to at least one user"
        )
    return _csr(ex, uidx, m, tuple(labels.tolist()))


def _unique_inverse(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_inverse=True)`` by one sort (numpy's hash path is slower on 10^6 ids)."""
    order = np.argsort(a, kind="stable")
    s = a[order]
    first = np.concatenate(([True], s[1:] != s[:-1]))
    inverse = np.empty(a.size, dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return s[first], inverse


def _csr(ex: np.ndarray, uidx: np.ndarray, m: int, labels: tuple) -> Attribution:
    """Attribution from edges sorted by (example, user) with users ``0..len(labels)-1``."""
    example_ptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(ex, minlength=m), out=example_ptr[1:])
    order = np.argsort(uidx, kind="stable")  # within a user, examples stay increasing
    user_ptr = np.zeros(len(labels) + 1, dtype=np.int64)
    np.cumsum(np.bincount(uidx, minlength=len(labels)), out=user_ptr[1:])
    return Attribution(example_ptr, uidx.astype(np.int64), user_ptr, ex[order].astype(np.int64), labels)


def as_attribution(graph) -> Attribution:
    if isinstance(graph, Attribution):
        return graph
    if isinstance(graph, (str, bytes)) or not hasattr(graph, "__iter__"):
        raise InvalidParameterError(
            "attribution must be an Attribution (attribution_from_edges(example_ids, user_ids) for an edge list) "
            f"or one iterable of user ids per example, got {type(graph).__name__}"
        )
    return Attribution.from_user_sets(graph)


def neighbourhood_sizes(attribution) -> np.ndarray:
    """``|N(e)|`` for every example: the examples sharing a user with ``e``, ``e`` included (App. C).

    >>> neighbourhood_sizes([[0], [0, 1], [1], [2]]).tolist()
    [2, 3, 2, 1]
    """
    att = as_attribution(attribution)
    return _neighbourhood_sizes(att.example_ptr, att.user_of, att.user_ptr, att.example_of)


# ---------------------------------------------------------------------------------------- report
@dataclass(frozen=True)
class BoundingReport:
    """What contribution bounding kept and dropped (all counts are of the input graph's objects).

    ``dropped[reason]`` counts dropped examples per reason (``user_bound``: a user of the example
    already had ``k_u`` kept examples; ``edge_bound``: keeping it would have made some ``|N(e)|``
    exceed ``k_e``); ``kept_examples + sum(dropped.values()) == examples``. ``users_affected`` lost
    at least one example, ``users_emptied`` lost all of theirs. ``max_user_examples`` and
    ``max_neighbourhood`` are the largest counts *after* bounding (what the accountant may use).
    """

    examples: int
    edges: int
    users: int
    kept_examples: int
    kept_edges: int
    dropped: dict
    users_affected: int
    users_emptied: int
    max_user_examples: int
    max_neighbourhood: int
    user_bound: int
    edge_bound: int | None
    seed: object = None

    def describe(self) -> dict:
        return {
            "examples": self.examples,
            "edges": self.edges,
            "users": self.users,
            "kept_examples": self.kept_examples,
            "kept_edges": self.kept_edges,
            "dropped": dict(self.dropped),
            "users_affected": self.users_affected,
            "users_emptied": self.users_emptied,
            "max_user_examples": self.max_user_examples,
            "max_neighbourhood": self.max_neighbourhood,
            "user_bound": self.user_bound,
            "edge_bound": self.edge_bound,
            "seed": self.seed,
        }

    def summary(self) -> str:
        """One line for logs: kept / dropped by reason / users affected."""
        why = ", ".join(f"{n} {r.replace('_', ' ')}" for r, n in self.dropped.items() if n)
        return (
            f"kept {self.kept_examples} of {self.examples} examples ({self.kept_edges} of {self.edges} attributions); "
            f"dropped {self.examples - self.kept_examples}{f' ({why})' if why else ''}; "
            f"{self.users_affected} of {self.users} users lost examples ({self.users_emptied} lost all); "
            f"now at most {self.max_user_examples} examples per user, |N(e)| <= {self.max_neighbourhood}"
        )


@dataclass(frozen=True, eq=False)
class BoundedAttribution:
    """The result of :func:`bound_contributions`.

    ``kept``: sorted indices of the kept examples in the input; ``attribution``: the bounded graph
    over them, example ``i`` of it being input example ``kept[i]`` (index your dataset with
    ``kept``, e.g. ``torch.utils.data.Subset(dataset, res.kept)``); ``reason``: per input example,
    ``""`` if kept else the reason it was dropped; ``report``: the counts.
    """

    kept: np.ndarray
    attribution: Attribution
    report: BoundingReport
    reason: np.ndarray = field(repr=False)

    @property
    def max_user_examples(self) -> int:
        """The ``k_u`` the accountant can use: the most examples any user has after bounding."""
        return self.report.max_user_examples

    def scheme(self, sampling_prob: float, steps: int, min_sep: int, warmup_steps: int = 0):
        """The :class:`~dpmf.sampling.MultiAttributionMinSepSampling` for the bounded graph, with
        ``max_user_examples`` = :attr:`max_user_examples` (the tightest valid ``k_u``)."""
        from dpmf.sampling.schemes import MultiAttributionMinSepSampling

        return MultiAttributionMinSepSampling(sampling_prob, steps, min_sep, self.max_user_examples, warmup_steps)


# ---------------------------------------------------------------------------------------- greedy
def bound_contributions(
    attribution,
    max_user_examples: int,
    *,
    max_neighbourhood: int | None = None,
    seed: np.random.Generator | int | None = None,
) -> BoundedAttribution:
    """Keep a maximal set of examples with at most ``k_u`` per user (and ``|N(e)| <= k_e``).

    Args:
        attribution: the public graph: an :class:`~dpmf.sampling.Attribution` (for large graphs
            build it from integer edge arrays with :func:`attribution_from_edges`, vectorized), or
            one iterable of (hashable) user ids per example.
        max_user_examples: ``k_u >= 1``, the most examples any user keeps.
        max_neighbourhood: ``k_e >= 1`` or ``None`` (no edge bound): the largest user-sharing
            neighbourhood ``|N(e)|`` (``e`` included) of a kept example, counted in the kept graph.
        seed: integer seed or ``numpy.random.Generator`` for the order among examples with the same
            number of users (required: dpmf never draws hidden seeds).

    Greedy (module docstring): examples in ascending number of users, ties in a random order; keep
    ``e`` iff every user of ``e`` has ``< k_u`` kept examples and (with ``k_e``) ``|N(e)|`` and
    ``|N(e')|`` for every kept ``e'`` sharing a user with ``e`` stay ``<= k_e`` once ``e`` is in.
    Only the graph is read (free under fixed-graph adjacency, Dong & Ganesh 2026, App. C).
    """
    att = as_attribution(attribution)
    k_u = _v.positive_int("max_user_examples", max_user_examples)
    k_e = None if max_neighbourhood is None else _v.positive_int("max_neighbourhood", max_neighbourhood)
    if seed is None:
        raise InvalidParameterError(
            "seed must be an integer or a numpy.random.Generator (it orders examples with equal numbers of users; "
            "dpmf never draws hidden seeds)"
        )
    gen = as_generator(seed)
    m = att.num_examples
    degree = np.diff(att.example_ptr)
    order = np.lexsort((gen.permutation(m), degree)).astype(np.int64)  # by degree, ties shuffled
    code = _greedy(order, att.example_ptr, att.user_of, att.user_ptr, att.example_of, k_u,
                   -1 if k_e is None else k_e, att.num_users)
    keep = code == 0
    kept = np.flatnonzero(keep)
    reason = np.array(("",) + REASONS)[code]  # fixed-width strings
    # bounded graph: the kept examples' edges, renumbered; users without a kept example vanish
    ex_of_edge = np.repeat(np.arange(m), degree)
    edge_kept = keep[ex_of_edge]
    new_index = np.cumsum(keep) - 1
    uidx = att.user_of[edge_kept]
    has = np.bincount(uidx, minlength=att.num_users) > 0
    present = np.flatnonzero(has)
    bounded = _csr(new_index[ex_of_edge[edge_kept]], (np.cumsum(has) - 1)[uidx], kept.size,
                   tuple(map(att.user_ids.__getitem__, present.tolist())))
    per_user_before = att.examples_per_user()
    per_user_after = np.zeros(att.num_users, dtype=np.int64)
    per_user_after[present] = bounded.examples_per_user()
    nsize = _neighbourhood_sizes(bounded.example_ptr, bounded.user_of, bounded.user_ptr, bounded.example_of)
    report = BoundingReport(
        examples=m,
        edges=int(att.user_of.size),
        users=att.num_users,
        kept_examples=int(kept.size),
        kept_edges=int(edge_kept.sum()),
        dropped={r: int(np.count_nonzero(code == i + 1)) for i, r in enumerate(REASONS)},
        users_affected=int(np.count_nonzero(per_user_after < per_user_before)),
        users_emptied=int(np.count_nonzero(per_user_after == 0)),
        max_user_examples=int(per_user_after.max()) if kept.size else 0,
        max_neighbourhood=int(nsize.max()) if kept.size else 0,
        user_bound=k_u,
        edge_bound=k_e,
        seed=seed if isinstance(seed, (int, np.integer)) else None,
    )
    return BoundedAttribution(kept, bounded, report, reason)


def _compiled():
    """The numba kernels (compiled on first use, cached on disk)."""
    global _greedy_nb, _nsize_nb
    if _greedy_nb is None:
        import numba as nb

        _greedy_nb = nb.njit(cache=True)(_greedy_py)
        _nsize_nb = nb.njit(cache=True)(_nsize_py)
    return _greedy_nb, _nsize_nb


_greedy_nb = None
_nsize_nb = None


def _greedy(order, ex_ptr, user_of, user_ptr, ex_of, k_u, k_e, num_users):
    return _compiled()[0](order, ex_ptr, user_of, user_ptr, ex_of, k_u, k_e, num_users)


def _neighbourhood_sizes(ex_ptr, user_of, user_ptr, ex_of):
    if ex_ptr.size <= 1:
        return np.zeros(0, dtype=np.int64)
    return _compiled()[1](ex_ptr, user_of, user_ptr, ex_of)


def _greedy_py(order, ex_ptr, user_of, user_ptr, ex_of, k_u, k_e, num_users):
    """Per-example code: 0 kept, 1 dropped by the user bound, 2 by the edge bound (``k_e < 0``: none).

    ``count[u]``: kept examples of user u; ``kept_of[user_ptr[u] : user_ptr[u] + count[u]]`` lists
    them; ``nsize[e]``: ``|N(e)|`` in the kept graph; ``stamp`` dedups ``e``'s kept neighbours.
    """
    m = ex_ptr.size - 1
    code = np.zeros(m, dtype=np.int64)
    count = np.zeros(num_users, dtype=np.int64)
    kept_of = np.empty(ex_of.size, dtype=np.int64)
    nsize = np.zeros(m, dtype=np.int64)
    stamp = np.full(m, -1, dtype=np.int64)
    nbrs = np.empty(m, dtype=np.int64)
    for t in range(m):
        e = order[t]
        ok = True
        for j in range(ex_ptr[e], ex_ptr[e + 1]):
            if count[user_of[j]] >= k_u:
                ok = False
                break
        if not ok:
            code[e] = 1
            continue
        w = 0
        if k_e >= 0:
            for j in range(ex_ptr[e], ex_ptr[e + 1]):
                u = user_of[j]
                for i in range(user_ptr[u], user_ptr[u] + count[u]):
                    f = kept_of[i]
                    if stamp[f] != e:
                        stamp[f] = e
                        nbrs[w] = f
                        w += 1
            if w + 1 > k_e:
                ok = False
            else:
                for i in range(w):
                    if nsize[nbrs[i]] + 1 > k_e:
                        ok = False
                        break
            if not ok:
                code[e] = 2
                continue
            for i in range(w):
                nsize[nbrs[i]] += 1
            nsize[e] = w + 1
        for j in range(ex_ptr[e], ex_ptr[e + 1]):
            u = user_of[j]
            kept_of[user_ptr[u] + count[u]] = e
            count[u] += 1
    return code


def _nsize_py(ex_ptr, user_of, user_ptr, ex_of):
    """``|N(e)|`` of every example (``e`` included), deduplicated with a stamp array."""
    m = ex_ptr.size - 1
    out = np.zeros(m, dtype=np.int64)
    stamp = np.full(m, -1, dtype=np.int64)
    for e in range(m):
        c = 0
        for j in range(ex_ptr[e], ex_ptr[e + 1]):
            u = user_of[j]
            for i in range(user_ptr[u], user_ptr[u + 1]):
                f = ex_of[i]
                if stamp[f] != e:
                    stamp[f] = e
                    c += 1
        out[e] = c
    return out


# ---------------------------------------------------------------------------------------- App. C
@dataclass(frozen=True)
class RuleOfThumb:
    """App. C's rough test of an edge bound ``k_e`` for b-min-sep with sampling probability ``p``.

    ``value = b p k_e``; ``holds`` when ``value < 1``. ``loss_per_draw`` is the toy model's exact
    expected batch-size loss each time a shared example is drawn, ``(1 - p) (b - 1) / (b - 1 + 1/p)
    (k_e - 1)`` (against a gain of 1), ``worth_keeping`` when it is below 1.
    ``largest_edge_bound`` is the largest integer ``k_e`` with ``b p k_e < 1``.
    """

    min_sep: int
    sampling_prob: float
    edge_bound: int
    value: float
    holds: bool
    loss_per_draw: float
    worth_keeping: bool
    largest_edge_bound: int

    def __bool__(self) -> bool:
        return self.holds


def edge_bound_rule_of_thumb(min_sep: int, sampling_prob: float, max_neighbourhood: int) -> RuleOfThumb:
    """Does ``k_e`` pass App. C's rule of thumb ``b p k_e < 1`` (Dong & Ganesh 2026)?

    Toy model: ``k_e - 1`` users with one example each, plus one example shared by all of them.
    Each draw of the shared example bars the others that were not drawn themselves for ``b - 1``
    steps, costing ``(1 - p) (b - 1)/(b - 1 + 1/p) (k_e - 1)`` examples of batch on average against
    the one it adds; for ``p -> 0``, ``1/p >> b`` that is ``b p k_e < 1``. A heuristic for choosing
    ``k_e`` from the public graph (it ignores the graph's structure), not a privacy statement.

    >>> r = edge_bound_rule_of_thumb(8, 0.01, 10)
    >>> round(r.value, 3), r.holds, r.largest_edge_bound
    (0.8, True, 12)
    """
    b = _v.positive_int("min_sep", min_sep)
    p = _v.probability("sampling_prob", sampling_prob)
    k_e = _v.positive_int("max_neighbourhood", max_neighbourhood)
    value = b * p * k_e
    loss = (1.0 - p) * (b - 1) / (b - 1 + 1.0 / p) * (k_e - 1)
    largest = int(np.ceil(1.0 / (b * p))) - 1  # largest integer strictly below 1/(b p)
    return RuleOfThumb(b, p, k_e, value, value < 1.0, loss, loss < 1.0, max(largest, 0))
