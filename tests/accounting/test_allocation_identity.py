"""Fast paths for C = I (``allocation/identity.py``) against the general Rényi and conditional code.

Oracles: the general dynamic program / conditional composition run on the dense ``I_b`` (sizes both
reach), brute-force enumeration of the Rényi tuple sum (Lemma 3.2) on tiny ``b``, the mixture PLD
builder of ``dpmf.privacy.mixture`` for each step's PMF, and dp_accounting's sequential composition.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpmf.accounting.allocation import accountant as acc
from dpmf.accounting.allocation import conditional as cond
from dpmf.accounting.allocation import identity as ident
from dpmf.accounting.allocation.renyi import RenyiAllocation, remove_rdp
from dpmf.privacy.mixture import GaussianMixture
from dpmf.privacy.pld import dense_pmf
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import Identity


# ----------------------------------------------------------------------------- Renyi
@pytest.mark.parametrize("b", [1, 2, 7, 64, 300])
@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
def test_renyi_power_equals_the_general_program(b, sigma):
    fast = ident.identity_remove_rdp(b, sigma, 40)
    general = remove_rdp(np.eye(b), sigma, 1, 40)
    finite = np.isfinite(general)
    assert np.array_equal(finite, np.isfinite(fast))
    np.testing.assert_allclose(fast[finite], general[finite], rtol=1e-11, atol=1e-14)


@pytest.mark.parametrize("b, a", [(2, 2), (3, 3), (3, 4), (4, 3)])
def test_renyi_power_equals_the_brute_force_tuple_sum(b, a):
    # Lemma 3.2 with G = I: sum over (r_1..r_a) in [b]^a of exp(#{j1 != j2: r_j1 = r_j2} / (2 s^2))
    sigma = 0.8
    total = 0.0
    for r in itertools.product(range(b), repeat=a):
        same = sum(1 for j1 in range(a) for j2 in range(a) if j1 != j2 and r[j1] == r[j2])
        total += math.exp(same / (2 * sigma**2))
    exact = (math.log(total) - a * math.log(b)) / (a - 1)
    got = ident.identity_remove_rdp(b, sigma, a)[a - 2]
    assert exact <= got <= exact + 1e-12  # (rounded up by its float allowance, never below)


def test_renyi_allocation_for_the_identity_equals_the_general_one():
    b = 50
    fast, general = RenyiAllocation.identity(b), RenyiAllocation.create(np.eye(b))
    for sigma, delta in [(0.7, 1e-5), (1.3, 1e-10), (3.0, 1e-6)]:
        f, g = fast.epsilon(sigma, delta), general.epsilon(sigma, delta)
        for d in ("remove", "add"):
            assert f["epsilon_by_direction"][d] == pytest.approx(g["epsilon_by_direction"][d], rel=1e-11)
    assert fast.gram is None and fast.size == b


def test_renyi_identity_at_1e5_steps_is_fast_and_finite():
    rho = ident.identity_remove_rdp(100_000, 1.0, 64)
    assert np.all(np.isfinite(rho)) and np.all(np.diff(rho) >= 0)  # RDP is non-decreasing in the order
    # order 2 in closed form: log(1 + (e - 1)/b); the float allowance (b + 16) 4 ulp (...) is ~4e-9 here
    exact = math.log1p(math.expm1(1.0) / 100_000)
    assert exact <= rho[0] <= exact + 1e-8


# ----------------------------------------------------------------------------- conditional
@pytest.mark.parametrize("b", [2, 5, 12, 40])
@pytest.mark.parametrize("sigma", [0.6, 1.0, 2.5])
def test_step_probabilities_equal_the_general_step_pairs(b, sigma):
    beta = 1e-6 / (b - 1) ** 2
    pairs = cond._step_pairs(np.eye(b), sigma, beta, cond.DEFAULT_TEMPERATURES, None)
    lam = ident.identity_step_probabilities(b, sigma, beta)
    for d in ("remove", "add"):
        ref = np.array([w[-1] for a, w in pairs[d]])  # weight of the mean-1 component (sorted last)
        assert all(a[-1] == 1.0 and np.all(a[:-1] == 0.0) for a, _ in pairs[d])
        np.testing.assert_allclose(lam[d], ref, rtol=1e-9)


@pytest.mark.parametrize("lam", [1e-4, 0.02, 0.3, 0.9, 0.999])
@pytest.mark.parametrize("sigma", [0.7, 2.0])
def test_step_pmfs_equal_the_mixture_builder(lam, sigma):
    disc = 2e-3
    s = 1.0 / sigma
    lo, hi = ident._tail_points(s, np.array([lam]))
    general = GaussianMixture.create([0.0, 1.0], [1.0 - lam, lam], sigma).pld(disc)
    for d in ("remove", "add"):
        j, P, inf = ident._rows(np.array([lam]), lo, hi, s, disc, d)
        mine = dense_pmf(int(j[0]), P[0], float(inf[0]), disc)
        ref = general.remove if d == "remove" else general.add
        eps = np.linspace(0.0, 3.0, 31)
        got = np.array([mine.get_delta_for_epsilon(e) for e in eps])
        want = np.array([ref.get_delta_for_epsilon(e) for e in eps])
        # the same PMF up to float rounding (erfc-based tails, closed-form inverse), except that the
        # add direction's top point (loss -log(1 - lam)) is placed at its own grid index where the
        # general builder puts it at the next grid point: that moves mass <= Phi(-10) ~ 7.6e-24 up
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-22)


def test_the_add_pmfs_top_point_sits_at_minus_log_one_minus_lambda():
    # sigma 3, lam 0.5: the add loss is at most -log(1/2) = 0.693, far above the last grid point
    # reached from the Gaussian's +-10 sd range; the last interval's mass goes there (pessimistic)
    lam, sigma, disc = 0.5, 3.0, 1e-2
    s = 1.0 / sigma
    lo, hi = ident._tail_points(s, np.array([lam]))
    first, n, width, floor_idx = ident._grid(np.array([lam]), lo, hi, s, disc, "add")
    top = 1 - int(floor_idx[0])
    assert top > int(first[0] + n[0])  # a gap between the grid and the top point
    j, P, _ = ident._rows(np.array([lam]), lo, hi, s, disc, "add")
    assert P[0, top - int(j[0])] > 0 and top * disc >= -math.log1p(-lam)
    assert np.all(P[0, int(n[0]) : top - int(j[0])] == 0)


def test_batched_tree_composition_equals_sequential_composition():
    rng = np.random.default_rng(3)
    pmfs = []
    for _ in range(7):
        p = rng.random(rng.integers(5, 40))
        p /= p.sum() * (1 + 1e-3)
        pmfs.append(dense_pmf(int(rng.integers(-20, 5)), p, 1e-3 * float(rng.random()), 1e-2))
    seq = pmfs[0]
    for p in pmfs[1:]:
        seq = seq.compose(p, 1e-15)
    width = max(len(p._probs) for p in pmfs)
    P = np.zeros((len(pmfs), width))
    for r, p in enumerate(pmfs):
        P[r, : len(p._probs)] = p._probs
    lo = np.array([p._lower_loss for p in pmfs])
    inf = np.array([p._infinity_mass for p in pmfs])
    j, probs, inf_mass = ident._compose_rows(lo, P, inf, 1e-15)
    tree = dense_pmf(j, probs, inf_mass, 1e-2)
    assert inf_mass == pytest.approx(seq._infinity_mass, rel=1e-12)
    for e in (0.0, 0.1, 0.5, 1.0):
        assert tree.get_delta_for_epsilon(e) == pytest.approx(seq.get_delta_for_epsilon(e), rel=1e-10, abs=1e-16)


@pytest.mark.parametrize("b, sigma, delta", [(2, 1.0, 1e-5), (12, 1.0, 1e-5), (40, 0.6, 1e-6), (40, 2.0, 1e-9)])
def test_conditional_epsilon_equals_the_general_code(b, sigma, delta):
    general = cond.conditional_epsilon(np.eye(b), sigma, delta)
    fast = ident.identity_conditional_epsilon(b, sigma, delta)
    assert fast["discretization"] == pytest.approx(general["discretization"], rel=1e-12)
    assert fast["beta"] == general["beta"]
    # the two compose in different orders (a tree of batched FFTs vs b - 1 sequential ones), whose
    # round-off differs by ~1e-16 absolute per PMF entry; at delta - delta_E = 5e-10 a delta error
    # of 3e-16 already moves epsilon by ~1e-7 relative (measured: 7e-8), at 5e-6 by < 1e-10
    rel = 1e-8 if delta >= 1e-6 else 1e-6
    for d in ("remove", "add"):
        assert fast["epsilon_by_direction"][d] == pytest.approx(general["epsilon_by_direction"][d], rel=rel)


# ----------------------------------------------------------------------------- the accountant
@pytest.mark.parametrize(
    "strategy, scheme, sigma, delta",
    [
        (Identity(16), BallsInBinsSampling(2, 16), 1.0, 1e-5),
        (Identity(40), BallsInBinsSampling(1, 40), 0.8, 1e-7),
        (Identity(30), BallsInBinsSampling(1, 30), 3.0, 1e-5),
    ],
)
def test_accountant_fast_path_equals_the_general_path(strategy, scheme, sigma, delta, monkeypatch):
    fast_problem = acc.AllocationProblem.create(strategy, scheme)
    assert fast_problem.identity_steps is not None and fast_problem.gram is None
    fast = acc.account_allocation(strategy, scheme, sigma, delta, problem=fast_problem)
    monkeypatch.setattr(acc, "_is_identity", lambda *args: False)  # the general (dense) path
    general_problem = acc.AllocationProblem.create(strategy, scheme)
    assert general_problem.identity_steps is None and general_problem.gram is not None
    general = acc.account_allocation(strategy, scheme, sigma, delta, problem=general_problem)
    assert fast.epsilon == pytest.approx(general.epsilon, rel=1e-8)
    # (conditional composition by itself: the combined general path skips it where it cannot win)
    fast_c = acc.account_allocation(strategy, scheme, sigma, delta, problem=fast_problem, which="conditional")
    general_c = acc.account_allocation(strategy, scheme, sigma, delta, problem=general_problem, which="conditional")
    for a, b in ((fast.diagnostics["renyi"], general.diagnostics["renyi"]), (fast_c.diagnostics["conditional"],
                                                                            general_c.diagnostics["conditional"])):
        for d in ("remove", "add"):
            assert a["epsilon_by_direction"][d] == pytest.approx(b["epsilon_by_direction"][d], rel=1e-8)
    assert fast.diagnostics["gaussian_epsilon"] == general.diagnostics["gaussian_epsilon"]


def test_the_identity_is_never_built(monkeypatch):
    def refuse(self):
        raise AssertionError(f"Identity({self.n}).encoder() was called")

    monkeypatch.setattr(Identity, "encoder", refuse)
    n = 3000
    r = acc.account_allocation(Identity(n), BallsInBinsSampling(1, n), 1.0, 1e-6)
    assert r.certified and math.isfinite(r.epsilon)
    assert r.diagnostics["conditional"]["fast_path"] == "identity"
    assert acc.supports(Identity(n), BallsInBinsSampling(1, n)) is None


def test_explicit_bandwidth_takes_the_general_path():
    p = acc.AllocationProblem.create(Identity(8), BallsInBinsSampling(1, 8), bandwidth=2)
    assert p.identity_steps is None and p.gram is not None


def test_binary_powering_equals_sequential_self_composition():
    rng = np.random.default_rng(5)
    rows = []
    for _ in range(3):
        p = rng.random(rng.integers(4, 30))
        rows.append((int(rng.integers(-10, 3)), p / (p.sum() * (1 + 1e-4)), 1e-4 * float(rng.random())))
    counts = np.array([1, 6, 13])
    lo, P, inf = ident._stack([(np.array([r[0]]), r[1][None, :], np.array([r[2]])) for r in rows])
    plo, pP, pinf = ident._power_rows(lo, P, inf, counts, 1e-15)
    for i, (l0, p, i0) in enumerate(rows):
        one = dense_pmf(l0, p, i0, 1e-2)
        seq = one
        for _ in range(counts[i] - 1):
            seq = seq.compose(one, 1e-15)
        got = dense_pmf(int(plo[i]), pP[i], float(pinf[i]), 1e-2)
        assert got._infinity_mass == pytest.approx(seq._infinity_mass, rel=1e-12)
        for e in (0.0, 0.05, 0.3):
            assert got.get_delta_for_epsilon(e) == pytest.approx(seq.get_delta_for_epsilon(e), rel=1e-10, abs=1e-16)


def test_grouped_steps_dominate_the_per_step_pairs_and_stay_close(monkeypatch):
    # above EXACT_STEPS each lambda is rounded up to its group's largest: never tighter than the
    # per-step composition, and at most about one group width (1e-3) looser
    b, sigma, delta = 600, 1.0, 1e-5
    exact = ident.identity_conditional_epsilon(b, sigma, delta)
    assert "grouped_steps" not in exact
    monkeypatch.setattr(ident, "EXACT_STEPS", 100)
    grouped = ident.identity_conditional_epsilon(b, sigma, delta, discretization=exact["discretization"])
    assert "grouped_steps" in grouped
    for d in ("remove", "add"):
        e, g = exact["epsilon_by_direction"][d], grouped["epsilon_by_direction"][d]
        assert e * (1 - 1e-9) <= g <= e * (1 + 2e-3), (d, e, g)


def test_groups_take_each_groups_largest_lambda():
    lam = np.sort(np.random.default_rng(0).uniform(1e-5, 2e-5, 5000))
    values, counts = ident._groups(lam, 1e-3)
    assert counts.sum() == lam.size
    idx = np.repeat(np.arange(values.size), counts)
    assert np.all(values[idx] >= lam)  # every step's pair is dominated by its group's
    assert np.all(values[idx] <= lam * (1 + 1e-3) * (1 + 1e-12))


def test_one_step_per_epoch_has_no_divide_by_zero_warning():
    """Issue 44: with one step per epoch every example is in every step (w = 1) and log(1 - w) = -inf
    was computed as log1p(-1) ("divide by zero encountered in log1p")."""
    import warnings

    import dpmf
    from dpmf.sampling import BallsInBinsSampling
    from dpmf.strategies import Identity

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = dpmf.account(Identity(3), BallsInBinsSampling(3, 3), 1.0, 1e-5)
        single = dpmf.account(Identity(1), BallsInBinsSampling(1, 1), 1.0, 1e-5)
    # one step per epoch: each epoch is one unamplified Gaussian step (k epochs: sigma / sqrt(k))
    assert single.epsilon == pytest.approx(dpmf.account(Identity(1), BallsInBinsSampling(1, 1), 1.0, 1e-5,
                                                        method="unamplified").epsilon, rel=1e-3)
    assert r.epsilon == pytest.approx(dpmf.account(Identity(3), BallsInBinsSampling(3, 3), 1.0, 1e-5,
                                                   method="unamplified").epsilon, rel=2e-3)


# ----------------------------------------------------------------------------- memory (issue 40 item 4)
def _traced_conditional(b, sigma, delta):
    import tracemalloc

    ident.identity_conditional_epsilon(100, sigma, delta)  # (first-call caches and imports: not the work)
    tracemalloc.start()
    try:
        eps = ident.identity_conditional_epsilon(b, sigma, delta)["epsilon"]
        return eps, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_grouped_powering_at_1e4_steps_traces_little_memory_and_chunking_only_moves_float_noise(monkeypatch):
    """Binary powering widens a chunk's rows; the chunk budget bounds its batched FFTs. At b = 10^4
    the old 2^21-entry chunks traced 67 MiB (peak RSS of ``dpmf.account`` 297-305 MiB, goal 300);
    2^17 traces ~26 MiB. A different chunking changes only which rows compose first, so the two
    epsilons (each a sound bound) agree to float noise."""
    eps, peak = _traced_conditional(10**4, 1.0, 1e-5)
    assert peak < 40 * 2**20, f"conditional composition at b = 10^4 traced {peak / 2**20:.1f} MiB"
    monkeypatch.setattr(ident, "_CHUNK_ENTRIES", 1 << 21)
    eps_wide, peak_wide = _traced_conditional(10**4, 1.0, 1e-5)
    assert peak_wide > peak
    assert eps == pytest.approx(eps_wide, rel=1e-8)


@pytest.mark.slow
def test_dpsgd_allocation_at_1e4_steps_peaks_under_300_mib():
    """Issue 40's goal, in a fresh process (imports included, ~170 MiB of it numpy, scipy,
    dp_accounting and numba): ``dpmf.account`` with method auto (every allocation accountant).

    The peak is the child's own ``VmHWM`` (Linux: the high-water mark of its address space, new at
    ``exec``), not ``ru_maxrss``: Linux carries the forking process's high-water mark into the child's
    ``ru_maxrss`` across ``exec``, so after a test that grew this process past 300 MiB the child read
    this process's peak, not its own (this test failed after the chunking test above, in any order)."""
    import subprocess
    import sys

    code = (
        "import resource, dpmf\n"
        "from dpmf.strategies import Identity\n"
        "from dpmf.sampling import BallsInBinsSampling\n"
        "r = dpmf.account(Identity(10**4), BallsInBinsSampling(1, 10**4), 1.0, 1e-5)\n"
        "try:\n"
        "    hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
        "    print(int(hwm.split()[1]) / 1024)\n"
        "except OSError:  # (no /proc: ru_maxrss, exact where nothing large forked this process)\n"
        "    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    peak = float(out.stdout.split()[-1])
    assert peak <= 300, f"peak RSS {peak:.0f} MiB"
