"""Individual accounting: ledger updates for 10^6 examples, per-example epsilons.

* ``ledger_step_1e6``: one filtered step for 10^6 examples (clip, mu, admit, accumulate). The
  peer is the plain numpy bookkeeping of the paper's public code (accumulate squared clipped
  norms, compare with the budget); no library offers per-example filters. Agreement: identical
  spent budgets and active sets.
* ``individual_epsilon_2000``: epsilon at delta = 1e-5 for 2000 examples' GDP parameters. Peer:
  ``dp_accounting.get_epsilon_gaussian`` per example (Gaussian mechanism with noise 1/mu, exact
  analytic); dpmf: ``IndividualGDPLedger.individual_epsilon`` (vectorized). Agreement 1e-6.
"""

from __future__ import annotations

import numpy as np
from case import Case

import dpmf.accounting.individual as ind

N, SIGMA, CLIP, STEPS = 1_000_000, 10.0, 1.0, 5
_rng = np.random.default_rng(0)
NORMS = [_rng.exponential(0.7, N) for _ in range(STEPS)]
BUDGET = np.sqrt(3.0) / SIGMA


def _peer_ledger():
    spent = np.zeros(N)
    for norms in NORMS:
        mu = np.minimum(norms, CLIP) / (SIGMA * CLIP)
        new = spent + mu**2
        active = new <= BUDGET**2
        spent[active] = new[active]
    return spent, active


def _dpmf_ledger():
    ledger = ind.IndividualGDPLedger(N, BUDGET, noise_multiplier=SIGMA)
    for norms in NORMS:
        step = ind.filtered_step(ledger, norms, clip_norm=CLIP, noise_multiplier=SIGMA, normalizer=N)
    return ledger.spent_sq, step.active


def _compare_ledger(peer, ours):
    ok = np.array_equal(peer[1], ours[1]) and np.allclose(peer[0], ours[0], rtol=1e-15, atol=0)
    return ok, f"active {int(ours[1].sum())} of {N}; spent identical: {ok}"


MUS = np.sqrt(_rng.uniform(0.01, 1.0, 2000))


def _peer_eps():
    import dp_accounting

    return np.array([dp_accounting.get_epsilon_gaussian(1.0 / m, 1e-5) for m in MUS])


def _dpmf_eps():
    ledger = ind.IndividualGDPLedger(MUS.size, 2.0)
    ledger.step(MUS)
    return ledger.individual_epsilon(1e-5)


def _compare_eps(peer, ours):
    diff = float(np.max(np.abs(peer - ours)))
    return diff <= 1e-6, f"max |diff| {diff:.2e}"


CASES = [
    Case("ledger_step_1e6", _peer_ledger, _dpmf_ledger, _compare_ledger, "identical spent budgets and active sets",
         peer_name="numpy reference"),
    Case("individual_epsilon_2000", _peer_eps, _dpmf_eps, _compare_eps, "max |eps diff| <= 1e-6"),
]
