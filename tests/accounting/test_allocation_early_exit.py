"""Early exits of the Markov members (``surrogates/markov_programs.py``): a ring's table mixed over
its factor / anchor nodes stops once the nodes computed so far prove its reading at the strike of
interest is above what the member must beat (``stop``), and ``markov_epsilon`` then reports the
direction as ``inf`` (the member cannot win) -- what the whole table gives.

Oracles: the whole table (no ``stop``): the partial sums the exit trusts are never above its reading
(a ``stop`` at exactly that reading never fires, for calls and puts, at several noises); with and
without exits every member's result and every ``allocation_pld`` epsilon are the same, bit for bit.
Negative controls: a ``stop`` below the reading fires, after fewer node tables than the whole.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmf.accounting.allocation import pld
from dpmf.accounting.allocation.surrogates import markov_programs
from dpmf.accounting.allocation.surrogates.markov_chain import MarkovSurrogate
from dpmf.memo import BoundedMemo
from dpmf.accounting.allocation.surrogates.markov_programs import calls_at, markov_epsilon, puts_at
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import bsr

DELTA = 1e-5


def _rings(n: int = 24):
    """The ring members (factor or anchor) of bsr(n, 4) over 2 epochs of reused slots (24: both kinds,
    on 12 and 6 slots)."""
    groups = pld._reductions(bsr(n, 4), BallsInBinsSampling(epochs=2, steps=n))
    out = [(q, m, parts) for q, m, parts in groups.markov
           if isinstance(m, MarkovSurrogate) and (m.ring is not None or m.anchor is not None)]
    assert {m.ring is not None for _, m, _ in out} == {True, False}  # (both kinds: shared factor and anchored)
    return out


def _counting(monkeypatch) -> list:
    runs: list = []
    for name in ("call_bound_table", "put_bound_table"):
        real = getattr(markov_programs, name)
        monkeypatch.setattr(markov_programs, name, lambda *a, real=real, **k: runs.append(1) or real(*a, **k))
    return runs


@pytest.mark.parametrize("sigma", [1.0, 2.0])
@pytest.mark.parametrize("kind", ["call", "put"])
def test_a_stop_at_the_reading_never_fires_and_below_it_fires_early(monkeypatch, kind, sigma):
    runs = _counting(monkeypatch)
    for q, sur, parts in _rings():
        n = parts[0][0]
        strike = n * math.exp(3.0) if kind == "call" else n * math.exp(-0.5)
        k_max = strike * 1.02 if kind == "call" else n * 1.0001
        read = calls_at if kind == "call" else puts_at
        runs.clear()
        strikes, table = sur.table(sigma, n, kind, k_max, DELTA)
        whole = len(runs)
        value = float(read(strikes, table, strike))
        assert value > 0 and whole >= 8
        # the partial sums are lower bounds of the reading: a stop exactly there never fires
        again = sur.table(sigma, n, kind, k_max, DELTA, stop=(strike, value))
        assert again is not None and np.array_equal(again[1], table) and np.array_equal(again[0], strikes)
        # negative control: a stop at a tenth of the reading fires, before the last node
        runs.clear()
        assert sur.table(sigma, n, kind, k_max, DELTA, stop=(strike, 0.1 * value)) is None
        assert len(runs) < whole


def test_markov_epsilon_is_the_same_with_and_without_exits(monkeypatch):
    """Each ring member searched below a range of bounds (members that win, members that cannot): the
    same result with exits as with every table whole; the exits skip node tables."""
    cases = []
    for q, sur, parts in _rings():
        for sigma in (1.0, 1.6):
            ref = markov_epsilon(sur, sigma, parts, DELTA, 50.0)["epsilon_by_direction"]
            for d in ("remove", "add"):
                cases += [(sur, sigma, parts, d, ref[d] * f) for f in (0.9, 1.001)]
    runs = _counting(monkeypatch)
    with_exits = []
    for sur, sigma, parts, d, top in cases:
        with_exits.append(markov_epsilon(sur, sigma, parts, DELTA, top, directions=(d,)))
    fewer = len(runs)
    runs.clear()
    real = MarkovSurrogate.table
    monkeypatch.setattr(MarkovSurrogate, "table", lambda self, *a, stop=None, **k: real(self, *a, **k))
    monkeypatch.setattr(markov_programs, "_RESULTS", BoundedMemo(256))  # (markov_epsilon's memo: computed again)
    whole = [markov_epsilon(sur, sigma, parts, DELTA, top, directions=(d,)) for sur, sigma, parts, d, top in cases]
    assert with_exits == whole
    assert any(math.isinf(r["epsilon"]) for r in whole) and any(math.isfinite(r["epsilon"]) for r in whole)
    assert fewer < len(runs)


@pytest.mark.parametrize("sigma", [0.9326489806331935, 2.0])
def test_allocation_pld_epsilon_is_the_same_with_and_without_exits(monkeypatch, sigma):
    """The whole evaluation (bsr(24, 4), 2 epochs): every reduction row equal, bit for bit."""
    monkeypatch.setattr(pld, "_MEMO", BoundedMemo(256))
    strategy, scheme = bsr(24, 4), BallsInBinsSampling(epochs=2, steps=24)
    fast = pld.account_allocation_pld(strategy, scheme, sigma, DELTA)
    monkeypatch.setattr(pld, "_MEMO", BoundedMemo(256))
    monkeypatch.setattr(markov_programs, "_RESULTS", BoundedMemo(256))  # (the members computed again)
    real = MarkovSurrogate.table
    monkeypatch.setattr(MarkovSurrogate, "table", lambda self, *a, stop=None, **k: real(self, *a, **k))
    whole = pld.account_allocation_pld(strategy, scheme, sigma, DELTA)
    assert fast.epsilon_by_direction == whole.epsilon_by_direction
    assert fast.diagnostics["reductions"] == whole.diagnostics["reductions"]


def test_below_gives_the_same_epsilon_or_inf_and_skips_tables(monkeypatch):
    """``markov_epsilon(below=...)``: the epsilon computed without ``below`` where it is at most
    ``below`` (bit for bit: the strike grids follow ``eps_hi``), ``inf`` where it is above; a bound
    below the epsilon stops the ring tables early (negative control: one far above never does)."""
    runs = _counting(monkeypatch)
    checked = 0
    for q, sur, parts in _rings():
        for d in ("remove", "add"):
            ref = markov_epsilon(sur, 1.3, parts, DELTA, 50.0, directions=(d,))["epsilon"]
            assert math.isfinite(ref)
            for f, same in ((1.0, True), (1.2, True), (0.97, False), (0.5, False)):
                runs.clear()
                got = markov_epsilon(sur, 1.3, parts, DELTA, 50.0, directions=(d,), below=ref * f)["epsilon"]
                assert got == ref if same else math.isinf(got), (d, f, got, ref)
                if f == 0.5 and sur.anchor is not None:  # (the anchored rings mix 13 node tables)
                    assert len(runs) < 13
                checked += 1
    assert checked >= 16


def test_pick_chooses_as_a_ranking_of_every_member_in_full(monkeypatch):
    """The family's pick with bounds (members then rivals, each below the best so far) against the
    plain ranking (every member's and rival's coarse score in full, the first smallest; ``None`` when a
    rival ranks at least as well), at the README pair's noises of a calibration (the bounds cut members
    there: the rivals score within 2% of the best member)."""
    from dpmf.accounting.allocation.surrogates import markov_ring

    groups = pld._reductions(bsr(32, 4), BallsInBinsSampling(epochs=2, steps=32))
    (q, family, parts), = [(q, m, p) for q, m, p in groups.markov if isinstance(m, markov_ring.SurrogateFamily)]

    def plain(sigma, top):
        def score(m):
            return markov_epsilon(m, sigma, parts, DELTA, markov_ring._RANK_MARGIN * top, directions=("remove",),
                                  **markov_ring._RANK_GRID)["epsilon"]
        scores = [score(m) for m in family.members]
        best = int(np.argmin(scores))
        return None if min(score(r) for r in family.rivals) <= scores[best] else family.members[best]

    outcomes = set()
    for sigma, top in ((1.2679, 4.0), (1.3666, 3.66), (1.8653, 2.1)):
        want = plain(sigma, top)
        # whichever member was picked the last time (ranked first: markov_ring._LAST_PICK), the same choice
        for last in (None, 0, len(family.members) - 1):
            monkeypatch.setattr(markov_ring, "_LAST_PICK", {} if last is None else {family: last})
            got = markov_ring.pick(family, sigma, parts, DELTA, top, ["remove"])
            assert got is want, (sigma, last)
            assert markov_ring._LAST_PICK[family] == family.members.index(got)
        outcomes.add(got is None)
    assert outcomes == {False}  # (on this pair the family is picked at these noises)


def test_spreads_keep_their_40_digits_whatever_mpmath_mp_and_other_threads_do(monkeypatch):
    """The spreads' weights (``quadrature.spread_on``, ``mp_spread``) are computed in a context of the
    module's own, one per thread: the global ``mpmath.mp`` precision and other threads spreading at once
    do not change them. (Before, ``mp.workdps`` set the one global context: two threads spreading at once
    -- the first ring table of a process fills the caches from both -- restored each other's precision,
    and the first table differed from the next by ~1e-16; the flaky equality above.) Negative control:
    the global context at 53 bits gives other weights (tail cells off by ~1e-4 relative)."""
    import threading

    import mpmath

    from dpmf.accounting.allocation.surrogates import quadrature

    pts = tuple(float(x) for x in quadrature.points(7.0, 96, 2.0))
    lpts = tuple(float(x) for x in quadrature.points(8.0, 12, 2.0))

    def weights():
        return (quadrature.spread_on.__wrapped__(pts)[1], quadrature._mp_spread_cached.__wrapped__(lpts, 2.3))

    ref = weights()
    old = mpmath.mp.prec
    try:
        mpmath.mp.prec = 20
        assert all(np.array_equal(a, b) for a, b in zip(weights(), ref))
        results, start, done = [], threading.Barrier(5), threading.Event()

        def spreader():
            start.wait()
            results.append(weights())

        def meddler():  # (another thread's mp.workdps, entered and left over and over)
            start.wait()
            while not done.is_set():
                with mpmath.workdps(5):
                    pass

        threads = [threading.Thread(target=spreader) for _ in range(4)] + [threading.Thread(target=meddler)]
        for t in threads:
            t.start()
        for t in threads[:4]:
            t.join()
        done.set()
        threads[4].join()
        assert len(results) == 4
        assert all(np.array_equal(a, b) for r in results for a, b in zip(r, ref))
        # negative control: the weights of the global context at 53 bits (what a raced thread computed)
        mpmath.mp.prec = 53
        monkeypatch.setattr(quadrature, "_context", lambda: mpmath.mp)
        low = weights()
        assert not np.array_equal(low[0], ref[0]) and np.max(np.abs(low[0] - ref[0]) / ref[0]) > 1e-8
    finally:
        mpmath.mp.prec = old


def test_nodes_computed_in_the_order_they_mattered_give_the_same_tables_and_exit_sooner(monkeypatch):
    """``_mixed_tables`` computes first the nodes that added most to the reading the last time
    (``_NODE_SHARES``): any order gives the same table (summed in node order) or the same exit (only where
    the whole reading is above the stop), and with the shares of a first run an exit needs no more node
    tables than in weight order -- fewer on at least one ring (the reading of a call at a far strike sits
    above the weights' centre). Negative control: the hints of another member of the same shape are only
    a fallback (an unknown member falls back to them, a known one keeps its own)."""
    monkeypatch.setattr(markov_programs, "_NODE_SHARES", {})
    runs = _counting(monkeypatch)
    fewer = 0
    for q, sur, parts in _rings():
        n = parts[0][0]
        for kind, sigma in (("call", 1.0), ("put", 1.0), ("call", 2.0)):
            strike = n * math.exp(3.0) if kind == "call" else n * math.exp(-0.5)
            k_max = strike * 1.02 if kind == "call" else n * 1.0001
            read = calls_at if kind == "call" else puts_at
            markov_programs._NODE_SHARES.clear()
            whole = sur.table(sigma, n, kind, k_max, DELTA)
            value = float(read(whole[0], whole[1], strike))
            for frac in (1.0, 0.5, 0.9):
                markov_programs._NODE_SHARES.clear()
                runs.clear()
                first = sur.table(sigma, n, kind, k_max, DELTA, stop=(strike, frac * value))  # (weight order)
                by_weight = len(runs)
                runs.clear()
                again = sur.table(sigma, n, kind, k_max, DELTA, stop=(strike, frac * value))  # (the shares' order)
                assert (first is None) == (again is None) == (frac < 1.0)
                if again is not None:
                    assert np.array_equal(again[1], whole[1]) and np.array_equal(again[0], whole[0])
                assert len(runs) <= by_weight
                fewer += len(runs) < by_weight
    assert fewer >= 1
    # the fallback: another member of the same shape orders an unknown one; a known one keeps its own
    hint = ("a", 3, "call", 3, ())
    markov_programs._NODE_SHARES.clear()
    markov_programs._remember_order(hint, np.array([0.1, 0.2, 0.7]))
    ps = np.array([0.5, 0.3, 0.2])
    assert markov_programs._node_order(("b", 3, "call", 3, ()), ps) == [2, 1, 0]
    markov_programs._remember_order(("b", 3, "call", 3, ()), np.array([0.9, np.nan, np.nan]))
    assert markov_programs._node_order(("b", 3, "call", 3, ()), ps) == [0, 1, 2]  # (unknown shares: by weight)
    assert markov_programs._node_order(hint, ps) == [2, 1, 0]
    assert markov_programs._node_order(None, ps) == [0, 1, 2]
