"""dpmf.memo: bounded memos keyed by content, and the accountants' fits memoized by their Grams."""

import math

import numpy as np

from dpmf.memo import BoundedMemo, array_key


def test_memo_returns_the_stored_result_and_drops_the_oldest():
    calls = []
    m = BoundedMemo(2)
    for key in ("a", "b", "a", "c", "a"):
        m.get(key, lambda key=key: calls.append(key) or key.upper())
    assert calls == ["a", "b", "c", "a"]  # ("a" was dropped when "c" came: the oldest first)
    assert len(m) == 2


def test_memo_copy_out_protects_the_stored_result():
    m = BoundedMemo(4)
    first = m.get("k", lambda: {"x": [1.0]}, copy_out=True)
    first["x"].append(2.0)
    assert m.get("k", lambda: None, copy_out=True) == {"x": [1.0]}


def test_array_key_is_content_not_identity():
    a = np.arange(6.0).reshape(2, 3)
    assert array_key(a) == array_key(a.copy()) == array_key(np.asfortranarray(a))
    assert array_key(a) != array_key(a.T) and array_key(a) != array_key(a.astype(np.float32))
    b = a.copy()
    b[1, 2] = np.nextafter(b[1, 2], 9)
    assert array_key(a) != array_key(b)


def test_fresh_slot_fits_run_once_per_gram(monkeypatch):
    """A calibration evaluates one strategy at many noises: the Markov members (noise-free fits of
    the epochs' Grams) are fitted once, and the reports are the same as when fitted anew."""
    import dpmf
    from dpmf.accounting.allocation import fresh_correlated as fc
    from dpmf.sampling import BallsInBinsSampling
    from dpmf.strategies import bsr

    fits = []
    real = fc._fit_markov_members
    monkeypatch.setattr(fc, "_fit_markov_members", lambda g: fits.append(1) or real(g))
    fc._MEMBERS.clear()
    strat, scheme = bsr(12, bands=2), BallsInBinsSampling(epochs=3, steps=12, fresh_slots=True)
    first = [dpmf.account(strat, scheme, s, 1e-5, method="allocation_pld").epsilon for s in (2.0, 2.5)]
    assert len(fits) == 1
    fc._MEMBERS.clear()
    from dpmf.accounting.allocation import pld

    monkeypatch.setattr(pld, "_MEMO", BoundedMemo(4))
    again = [dpmf.account(strat, scheme, s, 1e-5, method="allocation_pld").epsilon for s in (2.0, 2.5)]
    assert again == first and len(fits) == 2


def test_markov_epsilon_is_memoized_by_every_input_and_hands_out_copies(monkeypatch):
    """``markov_epsilon`` (a calibration runs its contenders twice at a noise: to steer, then in the
    accountant) computes once per inputs: equal inputs give equal numbers without a table, a changed
    input (here ``eps_hi``, which sets the strike grid) computes again, and a caller changing the
    returned dict does not change the memo."""
    from dpmf.accounting.allocation.surrogates import markov_programs
    from dpmf.accounting.allocation.surrogates.markov_chain import MarkovSurrogate
    from dpmf.memo import BoundedMemo

    monkeypatch.setattr(markov_programs, "_RESULTS", BoundedMemo(8))
    runs = []
    real = MarkovSurrogate.table
    monkeypatch.setattr(MarkovSurrogate, "table", lambda self, *a, **k: runs.append(1) or real(self, *a, **k))
    sur = MarkovSurrogate(alpha=0.8, beta=0.6, rho=0.5, s=0.866, order="natural", proxy=0.0)
    first = markov_programs.markov_epsilon(sur, 1.5, 8, 1e-5, 6.0, directions=("remove",))
    n = len(runs)
    assert n > 0
    first["epsilon"] = -1.0
    again = markov_programs.markov_epsilon(sur, 1.5, 8, 1e-5, 6.0, directions=("remove",))
    assert len(runs) == n and again["epsilon"] != -1.0 and math.isfinite(again["epsilon"])
    other = markov_programs.markov_epsilon(sur, 1.5, 8, 1e-5, 6.5, directions=("remove",))
    assert len(runs) > n and other["epsilon_by_direction"]["remove"] != again["epsilon_by_direction"]["remove"]
