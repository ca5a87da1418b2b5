"""Contribution bounding (dpmf.sampling.bounding): the bounds hold on random graphs (hypothesis),
the compiled greedy equals a plain-Python reference on the same order, the result is maximal,
deterministic for a seed, its report adds up, App. C's rule of thumb, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmf.errors import DPMFError, InvalidParameterError
from dpmf.sampling import (
    Attribution,
    attribution_from_edges,
    bound_contributions,
    edge_bound_rule_of_thumb,
    neighbourhood_sizes,
)


def users_of(att: Attribution) -> list[set]:
    return [{att.user_ids[u] for u in att.user_of[att.example_ptr[e]: att.example_ptr[e + 1]]}
            for e in range(att.num_examples)]


def neighbourhoods(sets: list[set]) -> list[int]:
    """|N(e)| by brute force: examples sharing a user with e, e included."""
    return [sum(1 for f in sets if f & e) for e in sets]


def reference_greedy(sets: list[set], order, k_u: int, k_e: int | None) -> list[str]:
    """The greedy of the module docstring, literally: keep e iff its users are below k_u and every
    |N| in the kept graph with e added stays <= k_e."""
    kept: list[int] = []
    count: dict = {}
    code = [""] * len(sets)
    for e in order:
        if any(count.get(u, 0) >= k_u for u in sets[e]):
            code[e] = "user_bound"
            continue
        if k_e is not None:
            trial = [sets[f] for f in kept] + [sets[e]]
            if max(neighbourhoods(trial)) > k_e:
                code[e] = "edge_bound"
                continue
        kept.append(e)
        for u in sets[e]:
            count[u] = count.get(u, 0) + 1
    return code


graphs = st.lists(st.sets(st.integers(0, 11), min_size=1, max_size=3), min_size=1, max_size=30)


@settings(max_examples=30, deadline=None)
@given(graphs, st.integers(1, 4), st.one_of(st.none(), st.integers(1, 8)), st.integers(0, 2**32 - 1))
def test_bounds_hold_and_match_the_reference(sets, k_u, k_e, seed):
    res = bound_contributions(sets, k_u, max_neighbourhood=k_e, seed=seed)
    kept_sets = users_of(res.attribution)
    assert kept_sets == [sets[i] for i in res.kept]  # the bounded graph is the input restricted to kept
    per_user: dict = {}
    for s in kept_sets:
        for u in s:
            per_user[u] = per_user.get(u, 0) + 1
    assert max(per_user.values(), default=0) <= k_u  # never a user above k_u
    nbh = neighbourhoods(kept_sets)
    if k_e is not None:
        assert max(nbh, default=0) <= k_e  # k_e respected in the kept graph
    assert neighbourhood_sizes(res.attribution).tolist() == nbh if kept_sets else True
    # the compiled greedy is the literal one, on the same order (degree, then the seed's permutation)
    degree = np.array([len(s) for s in sets])
    order = np.lexsort((np.random.default_rng(seed).permutation(len(sets)), degree))
    assert res.reason.tolist() == reference_greedy(sets, order, k_u, k_e)
    # maximal: every example dropped for the user bound has a user at k_u
    for e in np.flatnonzero(res.reason == "user_bound"):
        assert any(per_user.get(u, 0) == k_u for u in sets[e])
    # the report adds up
    rep = res.report
    assert rep.kept_examples + sum(rep.dropped.values()) == rep.examples == len(sets)
    assert rep.dropped == {"user_bound": int(np.sum(res.reason == "user_bound")),
                           "edge_bound": int(np.sum(res.reason == "edge_bound"))}
    before: dict = {}
    for s in sets:
        for u in s:
            before[u] = before.get(u, 0) + 1
    assert rep.users == len(before)
    assert rep.users_affected == sum(per_user.get(u, 0) < c for u, c in before.items())
    assert rep.users_emptied == sum(u not in per_user for u in before)
    assert rep.kept_edges == sum(map(len, kept_sets)) and rep.edges == sum(map(len, sets))
    assert rep.max_user_examples == max(per_user.values(), default=0)


def test_deterministic_for_a_seed_and_the_seed_matters():
    rng = np.random.default_rng(0)
    ex = np.concatenate([np.arange(500), rng.integers(0, 500, 700)])
    us = rng.integers(0, 150, ex.size)
    att = attribution_from_edges(ex, us)
    a = bound_contributions(att, 3, seed=5)
    b = bound_contributions(att, 3, seed=5)
    np.testing.assert_array_equal(a.kept, b.kept)
    assert a.report == b.report
    kept = {tuple(bound_contributions(att, 3, seed=s).kept) for s in range(4)}
    assert len(kept) > 1  # ties are broken by the seed
    g = np.random.default_rng(5)
    np.testing.assert_array_equal(bound_contributions(att, 3, seed=g).kept, a.kept)  # a Generator works too


def test_paper_toy_graph_edge_bound():
    # App. C's toy model: 6 users with one example each, and one example shared by all of them
    sets = [{u} for u in range(6)] + [set(range(6))]
    assert neighbourhood_sizes(sets).tolist() == [2] * 6 + [7]
    res = bound_contributions(sets, 2, max_neighbourhood=6, seed=0)
    assert res.reason.tolist() == [""] * 6 + ["edge_bound"]  # the shared example would make |N| = 7
    res = bound_contributions(sets, 2, max_neighbourhood=7, seed=0)
    assert res.report.kept_examples == 7 and res.report.max_neighbourhood == 7
    assert bound_contributions(sets, 1, seed=0).report.dropped == {"user_bound": 1, "edge_bound": 0}


def test_edges_and_user_sets_give_the_same_graph():
    sets = [[3, 7], [7], [1, 3, 3], [1]]
    ex = [0, 0, 1, 2, 2, 2, 3]
    us = [3, 7, 7, 1, 3, 3, 1]  # (2, 3) twice: counted once
    a, b = attribution_from_edges(ex, us), Attribution.from_user_sets(sets)
    assert users_of(a) == users_of(b) == [{3, 7}, {7}, {1, 3}, {1}]
    assert a.examples_per_user().tolist() == [2, 2, 2]  # users 1, 3, 7
    for k_u in (1, 2):
        assert bound_contributions(a, k_u, seed=1).kept.tolist() == bound_contributions(b, k_u, seed=1).kept.tolist()


def test_scheme_of_the_bounded_graph_accepts_it():
    res = bound_contributions([[0, 1], [1], [1], [0], [2]], 2, seed=0)
    scheme = res.scheme(0.2, 10, 2)
    assert scheme.max_user_examples == res.max_user_examples == 2
    assert scheme.attribution(res.attribution) is res.attribution
    batches = list(scheme.batches(res.attribution, 0))
    assert all(b.max(initial=-1) < res.report.kept_examples for b in batches)
    assert "kept 4 of 5 examples" in res.report.summary()


def test_rule_of_thumb():
    r = edge_bound_rule_of_thumb(8, 0.01, 10)
    assert r.value == pytest.approx(0.8) and r.holds and bool(r)
    assert r.loss_per_draw == pytest.approx(0.99 * 7 / (7 + 100) * 9)
    assert not edge_bound_rule_of_thumb(8, 0.01, 13).holds
    for b, p in [(8, 0.01), (4, 0.05), (1, 0.3), (16, 1 / 64), (3, 0.9)]:
        k = edge_bound_rule_of_thumb(b, p, 1).largest_edge_bound
        assert b * p * k < 1 <= b * p * (k + 1)
    assert edge_bound_rule_of_thumb(1, 0.3, 1).loss_per_draw == 0.0  # b = 1 bars nobody


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: bound_contributions([[0]], 0, seed=0), "max_user_examples must be an integer >= 1, got 0"),
        (lambda: bound_contributions([[0]], 1.5, seed=0), "max_user_examples"),
        (lambda: bound_contributions([[0]], 1, max_neighbourhood=0, seed=0), "max_neighbourhood"),
        (lambda: bound_contributions([[0]], 1), "seed"),
        (lambda: bound_contributions([[0], []], 1, seed=0), r"attribution\[1\] has no user"),
        (lambda: bound_contributions([[0], 5], 1, seed=0), r"attribution\[1\] must be an iterable"),
        (lambda: bound_contributions("abc", 1, seed=0), "attribution must be"),
        (lambda: bound_contributions(7, 1, seed=0), "attribution must be"),
        (lambda: attribution_from_edges([0, 1], [0]), "same length"),
        (lambda: attribution_from_edges([0, -1], [0, 0]), r"example_ids must hold ids >= 0, got example_ids\[1\] = -1"),
        (lambda: attribution_from_edges([0, 1], [0.5, 1]), "user_ids must hold integer ids"),
        (lambda: attribution_from_edges([0, 1], [np.nan, 1]), "user_ids must hold integer ids"),
        (lambda: attribution_from_edges([[0, 1]], [[0, 1]]), "1-dimensional"),
        (lambda: attribution_from_edges(["a"], [0]), "integer ids"),
        (lambda: attribution_from_edges([], []), "at least one edge"),
        (lambda: attribution_from_edges([0, 2], [0, 0]), "example 1 has no user"),
        (lambda: attribution_from_edges([0, 3], [0, 0], num_examples=3), "must be < num_examples=3"),
        (lambda: edge_bound_rule_of_thumb(0, 0.1, 3), "min_sep"),
        (lambda: edge_bound_rule_of_thumb(2, 1.5, 3), "sampling_prob"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(DPMFError, match=match):
        call()
    assert issubclass(InvalidParameterError, DPMFError)
