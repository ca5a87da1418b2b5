"""The multi-epoch optimizer's Newton-CG path (used above ``_MAX_NEWTON_VARS`` dual variables, e.g.
the paper's (k, b) = (20, 100) and (10, 100) Table 1 rows) and its certificate.

Oracles: the dense Hessian and central finite differences of the gradient (for the exact
Hessian-vector product); an independent *primal* solver written here (SLSQP over the Cholesky
factor of X, no duality, no CVX) on tiny problems; weak duality checked against that independent
optimum at every stop of the dual iteration; the reported loss recomputed from the returned C alone
(exact sensitivity by ``sensitivity_squared``, not the optimizer's normalization).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.optimize as so

import dpmf.strategies.optimal as optimal
from dpmf.strategies import FixedEpochParticipation, sensitivity_squared
from dpmf.strategies.optimal import optimal_multi_epoch_gram


def workload(n: int, seed: int) -> np.ndarray:
    """Prefix sums plus a random lower-triangular perturbation (no special structure)."""
    rng = np.random.default_rng(seed)
    return np.tri(n) + 0.3 * np.tril(rng.standard_normal((n, n)))


def primal_reference(A: np.ndarray, k: int, constraints: str = "nonneg") -> float:
    """min tr(A^T A X^-1) s.t. 1_pi^T X 1_pi <= 1 (b patterns pi_s = {s, s+b, ...}) and X >= 0
    (Eq. 35; "orthogonal": X[i, j] >= 0 only for i != j in a common pattern, Eq. 36), by SLSQP
    over the lower-triangular L with X = L L^T (a primal method, independent of the dual Newton
    iteration). Returns the loss of the final point after scaling it to exact
    feasibility (so it is an upper bound on the optimum)."""
    n = A.shape[0]
    b = n // k
    T = A.T @ A
    il = np.tril_indices(n)
    pats = [np.arange(s, n, b) for s in range(b)]

    def X_of(z):
        L = np.zeros((n, n))
        L[il] = z
        return L, L @ L.T

    def f(z):
        L, X = X_of(z)
        Xi = np.linalg.inv(X)
        G = -Xi @ T @ Xi  # d tr(T X^-1) / dX
        return float(np.trace(T @ Xi)), (2.0 * G @ L)[il]

    iu = np.triu_indices(n, 1)
    if constraints == "orthogonal":
        same = (iu[0] % b) == (iu[1] % b)
        iu = (iu[0][same], iu[1][same])
    cons = [{"type": "ineq", "fun": lambda z: np.array([1.0 - X_of(z)[1][np.ix_(p, p)].sum() for p in pats])},
            {"type": "ineq", "fun": lambda z: X_of(z)[1][iu]}]
    z0 = (np.eye(n) / math.sqrt(k))[il]
    out = so.minimize(f, z0, jac=True, constraints=cons, method="SLSQP",
                      options={"maxiter": 2000, "ftol": 1e-13})
    _, X = X_of(out.x)
    X[iu] = np.maximum(X[iu], 0.0)  # exact feasibility: clip rounding negatives, then scale the pattern sums to <= 1
    X /= max(X[np.ix_(p, p)].sum() for p in pats)
    return float(np.trace(T @ np.linalg.inv(X)))


def exact_loss(res, A: np.ndarray, k: int) -> float:
    """sens^2 (recomputed from C) x ||A C^-1||_F^2: the loss of the returned strategy, from C alone."""
    n = A.shape[0]
    sens2 = sensitivity_squared(res.C, FixedEpochParticipation(k, n // k)).value
    B = np.linalg.solve(res.C.T, A.T).T
    return float(sens2 * np.sum(B * B))


# --------------------------------------------------------------------------- Hessian-vector product
@pytest.mark.parametrize("n, k, constraints, off", [(12, 3, "orthogonal", False), (12, 3, "all_signs", False),
                                                     (8, 2, "nonneg", True)])
def test_hvp_is_the_exact_hessian(n, k, constraints, off):
    rng = np.random.default_rng(1)
    A = workload(n, 3)
    dual = optimal._Dual(A, k, constraints)
    theta = dual.initial(float(np.linalg.svd(A, compute_uv=False).sum())) * (1 + 0.1 * rng.random(dual.m_in))
    if off:  # cross-pattern multipliers for X >= 0 (Eq. 35 active set)
        dual.add_off(np.array([0, 1]), np.array([5, 6]))
        theta = np.r_[theta, 1e-3, 2e-3]
    ev = dual.evaluate(theta)
    assert ev is not None
    for mu in (0.0, 0.3):
        H = dual.hessian(ev, full=True, extra=math.sqrt(mu) * ev["Uinv"] if mu > 0 else None)
        v = rng.standard_normal(dual.m)
        hv = dual.hvp(ev, v, mu)
        # the dense Hessian truncates its kernel at 1e-8 relative: agreement to ~1e-8
        assert np.abs(H @ v - hv).max() <= 1e-7 * np.abs(hv).max()
    v = rng.standard_normal(dual.m)
    h = 1e-6
    fd = (dual.evaluate(theta + h * v)["grad"] - dual.evaluate(theta - h * v)["grad"]) / (2 * h)
    assert np.abs(fd - dual.hvp(ev, v)).max() <= 1e-5 * np.abs(fd).max()


# --------------------------------------------------------------------------- optimum vs an independent solver
@pytest.mark.parametrize("n, k, seed", [(6, 3, 1), pytest.param(8, 2, 0, marks=pytest.mark.slow),
                                         pytest.param(9, 3, 2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("constraints", ["nonneg", "orthogonal"])
def test_newton_cg_and_newton_equal_an_independent_primal_solver(monkeypatch, n, k, seed, constraints):
    """Random workloads: the Eq. (35) optimum may need cross-pattern X >= 0 multipliers, which only the
    dense-Hessian path adds (documented); Newton-CG is checked on Eq. (36) there, and on Eq. (35) for
    prefix sums (next test), whose optimum is non-negative."""
    A = workload(n, seed)
    ref = primal_reference(A, k, constraints)
    runs = [optimal_multi_epoch_gram(A, k, constraints=constraints, tol=1e-10)]
    if constraints == "orthogonal":
        monkeypatch.setattr(optimal, "_MAX_NEWTON_VARS", 1)  # force Newton-CG
        runs.append(optimal_multi_epoch_gram(A, k, constraints=constraints, tol=1e-10))
    for res in runs:
        assert res.converged
        # weak duality against an independently computed feasible point, and agreement of optima
        assert res.dual <= ref * (1 + 1e-12)
        assert res.loss == pytest.approx(ref, rel=1e-6)
        if constraints == "nonneg":
            assert exact_loss(res, A, k) == pytest.approx(res.loss, rel=1e-9)
            assert float(res.X.min()) >= 0.0


@pytest.mark.parametrize("n, k", [(9, 3), pytest.param(8, 2, marks=pytest.mark.slow)])
def test_newton_cg_prefix_sums_equal_an_independent_primal_solver(monkeypatch, n, k):
    A = np.tri(n)
    ref = primal_reference(A, k)
    monkeypatch.setattr(optimal, "_MAX_NEWTON_VARS", 1)
    res = optimal_multi_epoch_gram(A, k, tol=1e-10)
    assert res.converged and res.dual <= ref * (1 + 1e-12)
    assert res.loss == pytest.approx(ref, rel=1e-6)
    assert exact_loss(res, A, k) == pytest.approx(res.loss, rel=1e-9)


def test_dual_bound_is_below_the_primal_at_every_stop(monkeypatch):
    """Stopped after 1, 2, ... iterations (and at every callback): the dual value never exceeds
    the independent optimum nor the reported loss, and the reported loss is the exact loss of the
    returned C (recomputed sensitivity), on both the Newton and the Newton-CG path."""
    n, k = 9, 3
    A = workload(n, 5)
    ref = primal_reference(A, k, "orthogonal")
    for cg in (False, True):
        if cg:
            monkeypatch.setattr(optimal, "_MAX_NEWTON_VARS", 1)
        seen = []
        final = optimal_multi_epoch_gram(A, k, constraints="orthogonal", tol=1e-12, max_iter=40,
                                         callback=lambda it, loss, gap: seen.append((loss, loss - gap)) and None)
        assert len(seen) >= 3
        for loss, dual in seen:
            assert dual <= ref * (1 + 1e-12) and dual <= loss * (1 + 1e-12)
            assert loss >= ref * (1 - 1e-9)
        for stop in sorted({1, 2, 3, 5, final.iterations}):
            res = optimal_multi_epoch_gram(A, k, constraints="orthogonal", tol=1e-12, max_iter=stop)
            assert res.dual <= ref * (1 + 1e-12) and res.dual <= res.loss
            assert res.gap == pytest.approx(res.loss - res.dual, rel=1e-12, abs=1e-12)
            # Eq. (36) strategies have X >= 0 inside the patterns, so Eq. (3) is exact (Thm. H.1)
            assert exact_loss(res, A, k) == pytest.approx(res.loss, rel=1e-9)


def test_newton_cg_on_the_paper_structure_is_superlinear(monkeypatch):
    """Prefix sums, k = 10 epochs of b = 6 steps (the (10, 100) row's structure, small): Newton-CG
    reaches the full-Newton optimum in about as many iterations (not the linear block-Jacobi rate)."""
    full = optimal_multi_epoch_gram(60, 10, tol=1e-9)
    monkeypatch.setattr(optimal, "_MAX_NEWTON_VARS", 1)
    cg = optimal_multi_epoch_gram(60, 10, tol=1e-9)
    assert full.converged and cg.converged
    assert cg.loss == pytest.approx(full.loss, rel=2e-9)
    assert cg.dual <= full.loss * (1 + 1e-12) and full.dual <= cg.loss * (1 + 1e-12)
    assert cg.iterations <= full.iterations + 3
