r"""Optimal dense strategies: multi-epoch (k, b) and single-epoch matrix factorizations.

Implements Sec. 3 and App. I of Choquette-Choo, McMahan, Rush, Thakurta, *Multi-Epoch Matrix
Factorization Mechanisms for Private Machine Learning*, ICML 2023 (arXiv 2211.06530), and the
single-epoch fixed point of Denisov, McMahan, Rush, Smith, Thakurta, *Improved Differential Privacy
for SGD via Optimal Private Linear Operators on Adaptive Streams*, NeurIPS 2022 (Thm. 3.2).
``optimal_multi_epoch_gram`` computes what ``jax_privacy.matrix_factorization.dense.optimize(n,
epochs=k, A=A)`` computes (same problem, same answer), with a certified duality gap.

The problem
-----------
Release ``B (C x + z)`` with ``A = B C`` for a workload ``A`` (n x n, full rank; prefix sums
``np.tri(n)`` by default) and the optimal decoder ``B = A C^{-1}``. With the Gram matrix
``X = C^T C`` and ``C`` normalized to sensitivity 1, the total squared error per unit noise
multiplier is ``loss = ||B||_F^2 = tr(A^T A X^{-1})``; the RMSE over the n queries is
``sqrt(loss / n)``. Under (k, b) fixed-epoch-order participation (``k = epochs``,
``b = n // k``: an example participates in steps ``s, s + b, ..., s + (k-1) b`` for one
``s in [0, b)``; indices 0-based, the paper's are 1-based) the b residue classes mod b are the
participation patterns ``pi_s``, and the paper solves (Eq. 6)

    minimize tr(A^T A X^{-1})  over X > 0 (positive definite)
    subject to  u^T X u <= 1  for the constraint vectors u of one of three sets (App. I.3):

* ``constraints="nonneg"`` -- Eq. (35), the one used for the paper's experiments and the default:
  ``1_pi^T X 1_pi <= 1`` for the b all-ones pattern vectors **and** ``X >= 0`` entrywise. Then
  ``sens(C) = max_s sqrt(1^T X[pi_s, pi_s] 1)`` exactly, also for vector contributions
  (Eq. 3, Cor. 2.1).
* ``constraints="orthogonal"`` -- Eq. (36): the all-ones vectors and ``X[i, j] >= 0`` only for
  ``i != j`` in a common pattern. At the optimum these entries are 0 (shown below), i.e. the
  columns of C for the steps of one example are orthogonal: this is jax_privacy's
  ``get_orthogonal_mask``. Eq. (3) is still exact (Thm. H.1 needs X >= 0 only inside patterns).
* ``constraints="all_signs"`` -- Eq. (34): ``u^T X u <= 1`` for all ``b 2^(k-1)`` sign vectors
  supported on a pattern, no sign constraint on X. Returns the optimum for **scalar** (d = 1)
  contributions; for d > 1 and k > 2 scalar sensitivity may underestimate vector sensitivity
  unless X >= 0 (App. H.2): check before using such a C for vector data.

For prefix sums all three give the same optimum (Table 6; the optimal X is non-negative).

Duality (Thm. 3.1, Cor. I.1)
----------------------------
With multipliers ``v_u >= 0`` for the vector constraints and ``Lambda >= 0`` (symmetric) for
``X >= 0``, put ``U = sum_u v_u u u^T - Lambda``. For ``U > 0`` the Lagrangian is minimized at the
matrix geometric mean ``X(U) = U^{-1} # A^T A``, computed here as ``X = L^{-T} R L^{-1}`` with
``U = L L^T`` and ``R = (L^T A^T A L)^{1/2}`` (Lemma I.2 with ``U_L = L``), and the dual function is

    g(U) = 2 tr((L^T A^T A L)^{1/2}) - sum_u v_u   <=   optimum          (Eq. 7)

for every dual-feasible U. Its gradient is ``d g / d U = X(U)`` (Cor. 3.1: ``dg/dv_u = u^T X u - 1``).

Algorithm (replaces the paper's dual ascent; same optimum, certified)
---------------------------------------------------------------------
The paper maximizes g by a multiplicative fixed-point update of v and momentum SGD on the n^2
multipliers Lambda (thousands of iterations; notes §9.1). Here we use three ingredients:

1. *Block structure.* Restrict Lambda to pairs inside one pattern. Sort the steps by residue
   class; then U is block diagonal with b blocks of size k x k, ``U_s = v_s 1 1^T - Lambda_s``.
   Because ``U_s`` is PSD, ``U_s[i, j] <= sqrt(U_s[i,i] U_s[j,j])``, so *every* PSD block with
   constant diagonal ``v_s`` is of this form with ``Lambda_s >= 0``. The restricted dual is
   therefore an unconstrained concave maximization over ``b (1 + k(k-1)/2)`` numbers (the
   diagonal ``v_s`` and the off-diagonal entries of each block) -- a few hundred instead of
   ``n^2 + b``. It is exactly the Lagrange dual of Eq. (36), so strong duality (Slater: X = I/k)
   makes it tight for (36); its optimizer X* has ``X*[i, j] = 0`` on the in-pattern pairs
   (complementary slackness). If X* is also non-negative elsewhere (always observed for prefix
   sums), X* is feasible for (35) and the same dual value bounds (35) from below, so X* is the
   optimum of (35) as well. When some X*[i, j] < 0 across patterns (e.g. momentum workloads), the
   missing multipliers ``Lambda[i, j] >= 0`` for those entries are added as bound-constrained
   variables (an active set), which makes the method solve (35) exactly in general.
   For Eq. (34) the variables are the ``2^(k-1)`` sign multipliers of each block, ``v >= 0``.
2. *Newton's method.* g is smooth and concave on ``U > 0``. Differentiating ``X U X = A^T A``
   gives the exact Hessian: with ``R = E diag(r) E^T`` and ``F = L^{-T} E``,

       d^2 g[dU1, dU2] = -sum_pq K_pq (F^T dU1 F)_pq (F^T dU2 F)_pq,   K_pq = r_p r_q / (r_p + r_q).

   K is a positive-definite Cauchy-like matrix with fast spectral decay; with its eigenvectors
   ``K = sum_s lam_s q_s q_s^T`` (kept while ``lam_s > 1e-8 lam_max``, typically 10-20 terms)
   the Hessian becomes ``-sum_s lam_s tr(N_s dU1 N_s dU2)`` with ``N_s = F diag(q_s) F^T``,
   i.e. one n x n matrix product per term. We take damped Newton steps with an Armijo
   backtracking line search that also keeps U positive definite. Convergence is quadratic: 6-8
   iterations from ``U = alpha I`` for the prefix sums at n = 128 ... 512 (the paper's scheme
   needs thousands). When the number of dual variables exceeds ``_MAX_NEWTON_VARS`` (large k:
   ``b (1 + k(k-1)/2) = 19100`` for the paper's (20, 100)) the m x m Hessian is never formed:
   the Newton direction is computed by preconditioned conjugate gradients (Newton-CG) with the
   *exact* Hessian-vector product ``dX = -F (K o (F^T dU F)) F^T`` (two n x n products, no
   kernel truncation) and the b diagonal nv x nv Hessian blocks as the preconditioner, to a
   relative residual ``min(0.1, sqrt(relative gap))`` (inexact Newton: superlinear). Using the
   diagonal blocks alone (block-Jacobi Newton, the previous fallback) ignores the coupling of
   the patterns through ``A^T A`` and converges only linearly, with a contraction of about 0.8 per
   iteration at n = 1000, k = 10 -- that is why the Table 1 rows at k = 10, 20 did not converge.
3. *Barrier safeguard.* Plain Newton can "jam" against the boundary of the cone ``U > 0``, where
   the Hessian blows up and the steps shrink to nothing before the optimum is reached (seen for
   some random dense workloads). After 3 consecutive damped steps, or when there are
   bound-constrained multipliers (sign multipliers, cross-pattern Lambda), the method maximizes
   ``g(U) + mu (log det U + sum log(bounded multipliers))`` instead, a standard log-barrier path
   following: ``mu <= 0.1 gap / (n + #bounded)`` follows the certified gap down and shrinks
   tenfold whenever a full Newton step ends near the barrier center. At a barrier center
   ``X(U) + mu U^{-1}`` satisfies the equality conditions, so it is also tried as a primal
   candidate. The dual bound itself is always the plain g(U).

The result is the same optimum as the paper's dual ascent (same problem, same constraint sets;
the equivalence of the block-restricted dual with Eqs. (35)/(36) is shown in item 1), reached
faster and certified by the duality gap. Every iteration forms a primal candidate from ``X(U)``:
in-pattern off-diagonal entries set to 0 (and, for "nonneg", negative entries clipped to 0), then
scaled to sensitivity 1 (Eq. 3, or the sign enumeration for "all_signs"). Its loss is an upper
bound on the optimum, g(U) a lower bound; the run stops when ``(loss - dual) <= tol * loss``
(relative duality gap, as in the paper's code). The returned X is the best candidate, so ``loss``
is the exact loss of the returned strategy and ``gap`` certifies how far from optimal it can be.

Cost: one n x n symmetric eigendecomposition per function evaluation, plus one more and about
20 matrix products per Newton step; O(n^3) time, O(n^2) memory (plus the dense Hessian, at most
``_MAX_NEWTON_VARS^2`` doubles). In :func:`optimal_multi_epoch_gram`, per Newton iteration:
two n x n eigendecompositions and about n^3 (number of kernel terms, 10-20) / 2 flops of products, plus a Cholesky factorization of the dense Hessian over
``b (1 + k(k-1)/2)`` dual variables. Above ``_MAX_NEWTON_VARS`` (4096) variables the
direction comes from Newton-CG (at most ``_CG_MAXITER`` Hessian-vector products of two
n x n matrix products each, preconditioned by the diagonal Hessian blocks) and no
cross-pattern multipliers can be added, so a workload whose Eq. (35) optimum needs them
may end with ``converged=False`` (use ``constraints="orthogonal"`` there). Measured on 2
cores: n = 128, k = 2 in 0.3 s; n = 512, k = 4 in 2-3 s (6 iterations, relative gap
< 1e-8); Newton-CG: n = 400, k = 20 in 8 iterations to a relative gap of 3e-7;
n = 1000, k = 10 in 6 iterations (62 s CPU) and n = 2000, k = 20 in 7 iterations (258 s
CPU, 625 s wall on the shared machine) to a relative gap below 1e-4 (the Table 1 rows).

Strategy from the Gram matrix: see :func:`strategy_from_gram`.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from numbers import Integral
from typing import Callable, Literal, Optional

import numpy as np
import scipy.linalg as sla

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, NumericalError
from dpmf.resources import check_allocation

__all__ = [
    "OptimizationResult",
    "optimal_multi_epoch_gram",
    "single_epoch_optimal",
    "strategy_from_gram",
]

Constraints = Literal["nonneg", "orthogonal", "all_signs"]
ProgressCallback = Callable[[int, float, float], Optional[bool]]

#: Largest number of dual variables for which the full Newton Hessian is formed (128 MiB);
#: above it, Newton-CG with exact Hessian-vector products (:func:`_newton_cg`).
_MAX_NEWTON_VARS = 4096
#: Most Hessian-vector products per Newton-CG direction (each costs two n x n matrix products).
_CG_MAXITER = 40
#: Largest number of sign-vector multipliers accepted for ``constraints="all_signs"``.
_MAX_SIGN_VARS = 1 << 16
#: Working memory for one chunk of Hessian rows.
_CHUNK_BYTES = 32 * 2**20
#: Relative eigenvalue cut-off for the low-rank expansion of the Hessian kernel K.
_KERNEL_RTOL = 1e-8
#: Relative Cholesky pivot below which U counts as singular (outside the dual domain).
_MIN_PIVOT = 1e-12
#: Predicted ascent below this fraction of |g| is rounding noise: steps are then judged by the
#: gradient norm instead.
_FLAT_RTOL = 1e-11
#: Barrier weight: mu <= sigma * (certified gap) / (n + number of bounded multipliers).
_SIGMA = 0.1
#: Factor by which mu shrinks after a step that ends near the barrier center.
_MU_SHRINK = 0.1
#: Consecutive damped Newton steps after which the barrier is switched on.
_DAMPED_SWITCH = 3
#: Progress below this relative size (in both bounds, twice in a row) ends the run as stalled.
_STALL_RTOL = 1e-12


@dataclass(frozen=True)
class OptimizationResult:
    """An optimized strategy with its certificate.

    Attributes:
        X: Gram matrix ``C^T C`` (n x n), normalized to sensitivity 1 under the schema it was
            optimized for (0-based step indices).
        C: lower-triangular strategy with ``C^T C = X`` (:func:`strategy_from_gram`).
        loss: total squared error ``tr(A^T A X^{-1}) = ||A C^{-1}||_F^2`` of the returned strategy
            at sensitivity 1 and noise multiplier 1 (the paper's Eq. 4). An upper bound on the
            optimum.
        gap: ``loss - dual`` (>= 0 up to rounding). The optimum lies in ``[loss - gap, loss]``.
        iterations: Newton (or fixed-point) iterations performed.
        converged: ``gap <= tol * loss`` was reached.
        seconds: wall time of the optimization.
        dual: the best dual value, a certified lower bound on the optimal loss (Thm. 3.1).
        constraints: which constraint set was used (see the module docstring).
        epochs: k of the (k, b) fixed-epoch schema (1 for single participation).
        min_sep: b, the separation of an example's participations (n for single participation).
    """

    X: np.ndarray = field(repr=False)
    C: np.ndarray = field(repr=False)
    loss: float
    gap: float
    iterations: int
    converged: bool
    seconds: float
    dual: float = math.nan
    constraints: str = "nonneg"
    epochs: int = 1
    min_sep: int = 1

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @property
    def rmse(self) -> float:
        """Root-mean-squared error of the n queries per unit noise multiplier: ``sqrt(loss/n)``."""
        return math.sqrt(self.loss / self.n)

    @property
    def rel_gap(self) -> float:
        """``gap / loss``, the quantity compared with ``tol``."""
        return self.gap / self.loss if self.loss > 0 else math.inf

    @property
    def sensitivity(self) -> float:
        """Sensitivity of ``C`` under the schema it was optimized for (1 by construction)."""
        return 1.0

    def decoder(self, A: np.ndarray | int | None = None) -> np.ndarray:
        """The optimal decoder ``B = A C^{-1}`` (lower triangular when A is). Default: prefix sums."""
        A_ = np.tri(self.n) if A is None else _workload(A)
        if A_.shape != (self.n, self.n):
            raise InvalidParameterError(f"A must have shape {(self.n, self.n)}, got {A_.shape}")
        return sla.solve_triangular(self.C, A_.T, trans="T", lower=True).T


# ------------------------------------------------------------------------------------- helpers
def _workload(A: object) -> np.ndarray:
    """An int n means the n x n prefix-sum workload; otherwise a finite square float64 matrix."""
    if isinstance(A, (Integral, np.integer)) and not isinstance(A, bool):
        n = _v.positive_int("A (as the number of steps n)", A)
        check_allocation(n, n, "the optimal strategy's dense matrices", copies=12)
        return np.tri(n)
    try:
        arr = np.asarray(A, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"A must be an int n or an n x n matrix of numbers: {exc}") from None
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] < 1:
        raise InvalidParameterError(f"A must be a square n x n matrix (or an int n), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InvalidParameterError("A must contain only finite numbers (found NaN or inf)")
    return arr


def _check_full_rank(A: np.ndarray) -> np.ndarray:
    """The singular values of A; raises unless A has full rank."""
    s = np.linalg.svd(A, compute_uv=False)
    if not s.size or s[-1] <= s[0] * A.shape[0] * np.finfo(float).eps * 10:
        raise InvalidParameterError(
            f"A must have full rank (smallest singular value {s[-1]:.3g}, largest {s[0]:.3g})"
        )
    return s


def _tol(tol: object) -> float:
    out = _v.positive("tol", tol)
    if out >= 1:
        raise InvalidParameterError(f"tol (relative duality gap) must be in (0, 1), got {tol!r}")
    return out


def strategy_from_gram(X: np.ndarray) -> np.ndarray:
    """The lower-triangular ``C`` with positive diagonal and ``C^T C = X`` (a "reverse Cholesky").

    The ordinary Cholesky factorization ``X = L L^T`` gives ``X = (L^T)^T (L^T)`` with ``L^T``
    *upper* triangular, which would make step t of the mechanism depend on future inputs. Reversing
    the time order with the exchange matrix ``J`` (``J = J^T = J^{-1}``, ones on the
    anti-diagonal) fixes that: factor ``J X J = L L^T`` and put ``C = J L^T J``. Then
    ``C^T C = J L J J L^T J = J (J X J) J = X``, and ``J (upper) J`` is lower triangular, so C is
    causal (row t of ``C x`` only uses ``x_0..x_t``) and ``B = A C^{-1}`` is lower triangular when
    A is. The factor is unique, so this is *the* streaming strategy of X (mirrors
    ``jax_privacy.matrix_factorization.dense.strategy_from_X``).

    Raises:
        InvalidParameterError: X is not a finite, symmetric, positive-definite square matrix.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] != X.shape[1] or X.shape[0] < 1:
        raise InvalidParameterError(f"X must be a square matrix, got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise InvalidParameterError("X must contain only finite numbers (found NaN or inf)")
    scale = max(float(np.abs(X).max()), np.finfo(float).tiny)
    if not np.allclose(X, X.T, rtol=0, atol=1e-10 * scale):
        raise InvalidParameterError("X must be symmetric")
    Xr = (X + X.T)[::-1, ::-1] / 2
    try:
        L = np.linalg.cholesky(Xr)
    except np.linalg.LinAlgError:
        raise InvalidParameterError("X must be positive definite (Cholesky factorization failed)") from None
    return np.ascontiguousarray(L.T[::-1, ::-1])


# ------------------------------------------------------------------------------------ the dual
class _Dual:
    """The (restricted) Lagrange dual in class order: step ``c * k + j`` of the permuted problem
    is step ``j * b + c`` of the original one, so pattern c is the contiguous block c."""

    def __init__(self, A: np.ndarray, k: int, constraints: str):
        n = A.shape[0]
        self.n, self.k, self.b = n, k, n // k
        b = self.b
        self.perm = np.arange(n).reshape(k, b).T.reshape(-1)
        self.Ap = np.ascontiguousarray(A[:, self.perm])
        self.T = self.Ap.T @ self.Ap
        self.constraints = constraints
        # in-class pairs of one block: the k diagonal pairs, then i < j
        iu = np.triu_indices(k, 1)
        self.pi = np.concatenate([np.arange(k), iu[0]])
        self.pj = np.concatenate([np.arange(k), iu[1]])
        kp = self.kp = len(self.pi)
        if constraints == "all_signs":
            signs = np.array(list(itertools.product([1.0, -1.0], repeat=k - 1)), dtype=float)
            self.signs = np.hstack([np.ones((len(signs), 1)), signs]) if k > 1 else np.ones((1, 1))
            self.Mloc = (self.signs[:, self.pi] * self.signs[:, self.pj]).T  # kp x nv
            self.cost_loc = np.ones(len(self.signs))
            self.bounded_loc = np.ones(len(self.signs), dtype=bool)
        else:
            nv = 1 + kp - k
            M = np.zeros((kp, nv))
            M[:k, 0] = 1.0
            M[k:, 1:] = np.eye(kp - k)
            self.Mloc = M
            self.cost_loc = np.r_[1.0, np.zeros(nv - 1)]
            self.bounded_loc = np.zeros(nv, dtype=bool)
        self.nv = self.Mloc.shape[1]
        self.m_in = b * self.nv
        # pair factor: tr(N E_a N E_a') = 2 s_a s_a' (N_pr N_qt + N_pt N_qr), s = 1 (off), 1/2 (diag)
        s = np.where(self.pi != self.pj, 1.0, 0.5)
        self.fac = 2.0 * np.outer(s, s)
        kk = k * k
        self.idx1 = (self.pi[:, None] * k + self.pi[None, :]) * kk + (self.pj[:, None] * k + self.pj[None, :])
        self.idx2 = (self.pi[:, None] * k + self.pj[None, :]) * kk + (self.pj[:, None] * k + self.pi[None, :])
        # cross-pattern multipliers (constraints="nonneg" only): U[p, q] = -lam, p < q
        self.off_p = np.zeros(0, dtype=np.intp)
        self.off_q = np.zeros(0, dtype=np.intp)
        self.cls = np.arange(n) // k

    # -- variables -------------------------------------------------------------------------
    @property
    def m(self) -> int:
        return self.m_in + len(self.off_p)

    def cost(self) -> np.ndarray:
        return np.r_[np.tile(self.cost_loc, self.b), np.zeros(len(self.off_p))]

    def bounded(self) -> np.ndarray:
        return np.r_[np.tile(self.bounded_loc, self.b), np.ones(len(self.off_p), dtype=bool)]

    def initial(self, nuclear_norm: float) -> np.ndarray:
        # U = alpha I maximizes g over multiples of I: g(alpha I) = 2 sqrt(alpha) ||A||_* - b alpha
        alpha = (nuclear_norm / self.b) ** 2
        if self.constraints == "all_signs":
            # sum over the 2^(k-1) sign vectors of s s^T is 2^(k-1) I
            th = np.full(self.m_in, alpha / self.nv)
        else:
            th = np.zeros(self.m_in)
            th[:: self.nv] = alpha
        return th

    def blocks(self, theta: np.ndarray) -> np.ndarray:
        k, b = self.k, self.b
        y = theta[: self.m_in].reshape(b, self.nv) @ self.Mloc.T  # (b, kp) pair coefficients
        U = np.zeros((b, k, k))
        U[:, self.pi, self.pj] = y
        U[:, self.pj, self.pi] = y
        return U

    def add_off(self, p: np.ndarray, q: np.ndarray) -> None:
        self.off_p = np.r_[self.off_p, p].astype(np.intp)
        self.off_q = np.r_[self.off_q, q].astype(np.intp)

    def drop_off(self, m: int) -> None:
        keep = m - self.m_in
        self.off_p, self.off_q = self.off_p[:keep], self.off_q[:keep]

    # -- evaluation ------------------------------------------------------------------------
    def evaluate(self, theta: np.ndarray) -> Optional[dict]:
        """g(theta), its gradient and the pieces for the Hessian; None outside U > 0."""
        n, k, b = self.n, self.k, self.b
        Ub = self.blocks(theta)
        lam_off = theta[self.m_in:]
        if len(lam_off) == 0:
            try:
                Lb = np.linalg.cholesky(Ub)
            except np.linalg.LinAlgError:
                return None
            if not _well_posed(np.einsum("bii->bi", Lb), np.einsum("bii->bi", Ub)):
                return None
            Y = np.einsum("rbk,bkl->rbl", self.T.reshape(n, b, k), Lb).reshape(n, n)
            W = np.einsum("bkl,bkr->blr", Lb, Y.reshape(b, k, n)).reshape(n, n)
            Linv = np.linalg.inv(Lb)
            solve_LT = lambda E: np.einsum("bkl,bkr->blr", Linv, E.reshape(b, k, n)).reshape(n, n)
            Uinv_b = np.einsum("bki,bkj->bij", Linv, Linv)
            Uinv = np.zeros((n, n))
            Uinv.reshape(b, k, b, k)[np.arange(b), :, np.arange(b), :] = Uinv_b
            logdet = 2.0 * float(np.log(np.einsum("bii->bi", Lb)).sum())
        else:
            U = sla.block_diag(*Ub) if b > 1 else Ub[0].copy()
            U[self.off_p, self.off_q] = -lam_off
            U[self.off_q, self.off_p] = -lam_off
            try:
                L = np.linalg.cholesky(U)
            except np.linalg.LinAlgError:
                return None
            if not _well_posed(np.diag(L), np.diag(U)):
                return None
            W = L.T @ self.T @ L
            solve_LT = lambda E: sla.solve_triangular(L, E, trans="T", lower=True, check_finite=False)
            Uinv = sla.cho_solve((L, True), np.eye(n), check_finite=False)
            Uinv = (Uinv + Uinv.T) / 2
            logdet = 2.0 * float(np.log(np.diag(L)).sum())
        W = (W + W.T) / 2
        try:
            lam, E = sla.eigh(W, overwrite_a=True, check_finite=False, driver="evd")
        except (np.linalg.LinAlgError, ValueError):
            return None
        if not np.all(np.isfinite(lam)):
            return None
        r = np.sqrt(np.maximum(lam, 0.0))
        F = solve_LT(E)
        G = F * np.sqrt(r)
        X = G @ G.T
        X = (X + X.T) / 2
        phi = 2.0 * r.sum() - float(self.cost() @ theta)
        # gradient: d g / d U = X  (pair a: X_pp for diagonal pairs, 2 X_pq otherwise)
        Xb = X.reshape(b, k, b, k)[np.arange(b), :, np.arange(b), :]  # (b, k, k)
        gp = Xb[:, self.pi, self.pj] * np.where(self.pi == self.pj, 1.0, 2.0)
        grad_in = gp @ self.Mloc - self.cost_loc
        grad_off = -2.0 * X[self.off_p, self.off_q]
        grad = np.r_[grad_in.reshape(-1), grad_off]
        # gradient of log det U (for the barrier): d/dU = U^{-1}
        Ub_inv = Uinv.reshape(b, k, b, k)[np.arange(b), :, np.arange(b), :]
        bp = Ub_inv[:, self.pi, self.pj] * np.where(self.pi == self.pj, 1.0, 2.0)
        bgrad = np.r_[(bp @ self.Mloc).reshape(-1), -2.0 * Uinv[self.off_p, self.off_q]]
        if not (np.isfinite(phi) and np.all(np.isfinite(grad)) and np.all(np.isfinite(bgrad))):
            return None
        return {"phi": phi, "grad": grad, "X": X, "F": F, "r": r, "Uinv": Uinv, "logdet": logdet, "bgrad": bgrad}

    # -- Hessian ---------------------------------------------------------------------------
    def hessian(self, ev: dict, full: bool, extra: Optional[np.ndarray] = None) -> np.ndarray:
        """Dense Hessian (m x m) if ``full``, else its b diagonal (nv x nv) blocks (b, nv, nv).

        ``extra`` (symmetric n x n, e.g. ``sqrt(mu) U^{-1}`` for the barrier ``mu log det U``) adds
        the term ``-tr(N B_i N B_j)`` with ``N = extra``."""
        n, k, b, nv, kp = self.n, self.k, self.b, self.nv, self.kp
        F, r = ev["F"], ev["r"]
        with np.errstate(divide="ignore", invalid="ignore"):
            K = np.outer(r, r) / (r[:, None] + r[None, :])
        K[~np.isfinite(K)] = 0.0
        # eigenpairs above _KERNEL_RTOL * lam_max only (lam_max >= max K_pp = max r / 2)
        cut = _KERNEL_RTOL * max(float(r.max()) / 2, np.finfo(float).tiny)
        try:
            kl, kv = sla.eigh(K, overwrite_a=True, check_finite=False, driver="evr", subset_by_value=(cut, np.inf))
        except (np.linalg.LinAlgError, ValueError):
            kl, kv = sla.eigh(np.outer(r, r) / np.maximum(r[:, None] + r[None, :], 1e-300), driver="evd")
            kl, kv = kl[kl > cut], kv[:, kl > cut]
        Wt = (kv * np.sqrt(kl)).T  # (S, n): N_s = F diag(Wt[s]) F^T
        S = Wt.shape[0]
        kk = k * k
        if not full:
            # diagonal blocks only: Gd[c, s, i, j] = N_s[ci, cj]
            Fb = F.reshape(b, k, n)
            Gd = np.einsum("cip,sp,cjp->csij", Fb, Wt, Fb, optimize=True)
            if extra is not None:
                Ed = extra.reshape(b, k, b, k)[np.arange(b), :, np.arange(b), :]
                Gd = np.concatenate([Gd, Ed[:, None]], axis=1)
                S1 = S + 1
            else:
                S1 = S
            Y = Gd.transpose(0, 2, 3, 1).reshape(b, kk, S1)
            Q = (Y @ Y.transpose(0, 2, 1)).reshape(b, kk * kk)
            Hp = -(Q[:, self.idx1] + Q[:, self.idx2]) * self.fac
            return self.Mloc.T @ Hp @ self.Mloc
        m = self.m
        H = np.empty((m, m))
        FT = np.ascontiguousarray(F.T)
        S1 = S + (extra is not None)
        # chunks of block rows: bounded memory, and only block columns C >= c0 are computed
        # (about half the products with 8 or more chunks)
        chunk = max(1, min(int(_CHUNK_BYTES // (8 * k * S1 * n)), -(-b // 8)))
        for c0 in range(0, b, chunk):  # block rows c0..c1-1, block columns C >= c0 (H is symmetric)
            c1 = min(b, c0 + chunk)
            nc, bc = c1 - c0, b - c0
            rows = F[c0 * k:c1 * k]  # (nc k, n)
            G = ((rows[:, None, :] * Wt[None, :, :]).reshape(nc * k * S, n) @ FT[:, c0 * k:]).reshape(nc, k, S, bc, k)
            if extra is not None:
                G = np.concatenate([G, extra[c0 * k:c1 * k, c0 * k:].reshape(nc, k, 1, bc, k)], axis=2)
            Y = G.transpose(0, 3, 1, 4, 2).reshape(nc, bc, kk, S1)  # [c, C, (i, kk), s] = N_s[ci, Ckk]
            Q = (Y @ Y.swapaxes(-1, -2)).reshape(nc, bc, kk * kk)
            Hp = -(Q[..., self.idx1] + Q[..., self.idx2]) * self.fac  # (nc, bc, kp, kp)
            Hv = self.Mloc.T @ Hp @ self.Mloc  # (nc, bc, nv, nv)
            H[c0 * nv:c1 * nv, c0 * nv: self.m_in] = Hv.transpose(0, 2, 1, 3).reshape(nc * nv, bc * nv)
        Hin = H[: self.m_in, : self.m_in]
        lower = np.tril_indices(self.m_in, -1)
        Hin[lower] = Hin.T[lower]
        n_off = len(self.off_p)
        if n_off:
            P = np.arange(b)[:, None] * k + self.pi[None, :]
            Qn = np.arange(b)[:, None] * k + self.pj[None, :]
            P, Qn = P.reshape(-1), Qn.reshape(-1)
            fac_in = np.tile(np.where(self.pi != self.pj, 2.0, 1.0), b)  # 2 s_a s_off with s_off = 1
            H_io = np.zeros((b * kp, n_off))
            H_oo = np.zeros((n_off, n_off))
            op, oq = self.off_p, self.off_q
            for s in range(S + (extra is not None)):
                N = (F * Wt[s]) @ FT if s < S else extra
                H_io += N[np.ix_(P, op)] * N[np.ix_(Qn, oq)] + N[np.ix_(P, oq)] * N[np.ix_(Qn, op)]
                H_oo += N[np.ix_(op, op)] * N[np.ix_(oq, oq)] + N[np.ix_(op, oq)] * N[np.ix_(oq, op)]
            # the multiplier of pair (p, q) enters U with coefficient -1
            H_io = H_io * fac_in[:, None]
            H_iv = np.einsum("ap,cao->cpo", self.Mloc, H_io.reshape(b, kp, n_off)).reshape(self.m_in, n_off)
            H[: self.m_in, self.m_in:] = H_iv
            H[self.m_in:, : self.m_in] = H_iv.T
            H[self.m_in:, self.m_in:] = -2.0 * H_oo
            H = (H + H.T) / 2
        return H

    # -- Hessian-vector product ----------------------------------------------------------------
    def hvp(self, ev: dict, d: np.ndarray, mu: float = 0.0) -> np.ndarray:
        """The exact product ``H d`` of the Hessian of ``g + mu log det U`` with a direction d.

        Differentiating ``X U X = A^T A`` gives ``dX = -F (K o (F^T dU F)) F^T`` (module docstring,
        item 2) and ``d(U^{-1}) = -U^{-1} dU U^{-1}``; ``H d`` is the gradient map of
        ``dX + mu d(U^{-1})``. Two n x n products per call (no kernel truncation), so Newton-CG
        needs neither the m x m Hessian nor its memory."""
        n, k, b = self.n, self.k, self.b
        F, r = ev["F"], ev["r"]
        K = ev.get("K")
        if K is None:
            with np.errstate(divide="ignore", invalid="ignore"):
                K = np.outer(r, r) / (r[:, None] + r[None, :])
            K[~np.isfinite(K)] = 0.0
            ev["K"] = K
        dUb = self.blocks(d)
        d_off = d[self.m_in:]
        op, oq = self.off_p, self.off_q
        Fb = F.reshape(b, k, n)
        DF = np.matmul(dUb, Fb).reshape(n, n)  # dU F for the block-diagonal part
        if len(op):
            np.add.at(DF, op, -d_off[:, None] * F[oq])
            np.add.at(DF, oq, -d_off[:, None] * F[op])
        M = F.T @ DF
        FY = F @ (K * ((M + M.T) / 2))
        dXb = -np.matmul(FY.reshape(b, k, n), Fb.transpose(0, 2, 1))  # diagonal blocks of dX
        dX_off = -np.einsum("in,in->i", FY[op], F[oq]) if len(op) else np.zeros(0)
        if mu > 0:
            Uinv = ev["Uinv"]
            if len(op):
                dU = sla.block_diag(*dUb) if b > 1 else dUb[0].copy()
                dU[op, oq] -= d_off
                dU[oq, op] -= d_off
                dUi = Uinv @ dU @ Uinv
                dXb = dXb - mu * dUi.reshape(b, k, b, k)[np.arange(b), :, np.arange(b), :]
                dX_off = dX_off - mu * dUi[op, oq]
            else:
                Ub_inv = Uinv.reshape(b, k, b, k)[np.arange(b), :, np.arange(b), :]
                dXb = dXb - mu * np.matmul(np.matmul(Ub_inv, dUb), Ub_inv)
        gp = dXb[:, self.pi, self.pj] * np.where(self.pi == self.pj, 1.0, 2.0)
        return np.r_[(gp @ self.Mloc).reshape(-1), -2.0 * dX_off]

    # -- primal candidate --------------------------------------------------------------------
    def primal(self, X: np.ndarray) -> tuple[float, Optional[np.ndarray]]:
        """A feasible Gram matrix from X (permuted order) and its loss at sensitivity 1."""
        k, b = self.k, self.b
        Xf = X.copy()
        blocks = Xf.reshape(b, k, b, k)
        ar = np.arange(b)
        d = np.einsum("cici->ci", blocks).copy()
        if self.constraints == "all_signs":
            Xb = blocks[ar, :, ar, :]
            sens2 = float(np.einsum("si,cij,sj->cs", self.signs, Xb, self.signs).max())
        else:
            blocks[ar, :, ar, :] = 0.0
            blocks[ar[:, None], np.arange(k)[None, :], ar[:, None], np.arange(k)[None, :]] = d
            if self.constraints == "nonneg":
                np.maximum(Xf, 0.0, out=Xf)
            sens2 = float(d.sum(axis=1).max())
        if not sens2 > 0:
            return math.inf, None
        try:
            L = np.linalg.cholesky(Xf)
        except np.linalg.LinAlgError:
            return math.inf, None
        Z = sla.solve_triangular(L, self.Ap.T, lower=True, check_finite=False)
        loss = float(np.sum(Z * Z)) * sens2
        if not math.isfinite(loss):
            return math.inf, None
        return loss, Xf / sens2

    def unpermute(self, Xp: np.ndarray) -> np.ndarray:
        inv = np.argsort(self.perm)
        return np.ascontiguousarray(Xp[np.ix_(inv, inv)])


def _well_posed(diag_L: np.ndarray, diag_U: np.ndarray) -> bool:
    """U = L L^T is safely positive definite: no row of U is (nearly) a combination of the
    previous ones, ``L_ii^2 / U_ii >= _MIN_PIVOT`` (the boundary of the dual domain, where X(U)
    blows up, e.g. a sign multiplier driven to 0 that leaves U singular)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = diag_L**2 / diag_U
    return bool(np.all(ratio >= _MIN_PIVOT))


def _newton_direction(H: np.ndarray, g: np.ndarray, blockwise: bool, nv: int) -> np.ndarray:
    """Solve ``(-H) d = g`` (H: the dense Hessian, or its (b, nv, nv) diagonal blocks), adding a
    growing ridge if ``-H`` is numerically not positive definite."""
    if blockwise:
        b = H.shape[0]
        Hn = -H
        ridge = 1e-12 * np.abs(np.einsum("bii->bi", Hn)).max(axis=1)
        rhs = g.reshape(b, nv)
        try:
            return np.linalg.solve(Hn + ridge[:, None, None] * np.eye(nv), rhs[..., None])[..., 0].reshape(-1)
        except np.linalg.LinAlgError:
            return g / max(float(np.abs(np.einsum("bii->bi", Hn)).max()), 1e-300)
    Hn = -H
    ridge = 1e-12 * max(float(np.abs(np.diag(Hn)).max()), np.finfo(float).tiny)
    eye = np.eye(len(g))
    for _ in range(8):
        try:
            c = sla.cho_factor(Hn + ridge * eye, check_finite=False)
            return sla.cho_solve(c, g, check_finite=False)
        except (np.linalg.LinAlgError, ValueError):
            ridge *= 100.0
    return g / max(float(np.abs(np.diag(Hn)).max()), 1e-300)


def _newton_cg(
    apply: Callable[[np.ndarray], np.ndarray], H_blocks: np.ndarray, g: np.ndarray, nv: int, rtol: float, maxiter: int
) -> tuple[np.ndarray, int]:
    """Inexact Newton direction: preconditioned conjugate gradients on ``(-H) d = g``.

    ``apply(p)`` returns ``(-H) p`` exactly (:meth:`_Dual.hvp`); the preconditioner is the
    block-diagonal part ``-H_blocks`` (one nv x nv block per pattern), so the first iterate is the
    block-Newton direction and every further one adds the coupling between patterns. Stops when
    ``||r|| <= rtol ||g||``, after ``maxiter`` products, or on non-positive curvature (rounding at
    the boundary of the cone); the iterate always has ``g . d > 0`` (an ascent direction).
    Returns the direction and the number of Hessian-vector products used."""

    b = H_blocks.shape[0]
    Hn = -H_blocks
    ridge = 1e-12 * np.abs(np.einsum("bii->bi", Hn)).max(axis=1)
    try:  # factor the b blocks once; every application is then b small triangular solves
        Lb = np.linalg.cholesky(Hn + ridge[:, None, None] * np.eye(nv))
        Lb_inv = np.linalg.inv(Lb)
        Pinv = np.matmul(Lb_inv.transpose(0, 2, 1), Lb_inv)
    except np.linalg.LinAlgError:
        Pinv = None

    def precond(v: np.ndarray) -> np.ndarray:
        if Pinv is None:
            return _newton_direction(H_blocks, v, blockwise=True, nv=nv)
        return np.matmul(Pinv, v.reshape(b, nv, 1)).reshape(-1)

    x = np.zeros_like(g)
    r = g.copy()
    z = precond(r)
    p = z.copy()
    rz = float(r @ z)
    gnorm = float(np.linalg.norm(g))
    products = 0
    for _ in range(maxiter):
        Ap = apply(p)
        products += 1
        pAp = float(p @ Ap)
        if not (pAp > 0 and math.isfinite(pAp)):
            break
        alpha = rz / pAp
        x += alpha * p
        r -= alpha * Ap
        if float(np.linalg.norm(r)) <= rtol * gnorm:
            break
        z = precond(r)
        rz_new = float(r @ z)
        if not rz_new > 0:
            break
        p = z + (rz_new / rz) * p
        rz = rz_new
    if not np.any(x):
        x = precond(g)
    return x, products


# --------------------------------------------------------------------------- public: multi-epoch
def optimal_multi_epoch_gram(
    A: np.ndarray | int,
    epochs: int = 1,
    min_sep: Optional[int] = None,
    *,
    constraints: Constraints = "nonneg",
    tol: float = 1e-6,
    max_iter: int = 200,
    callback: Optional[ProgressCallback] = None,
) -> OptimizationResult:
    """The optimal Gram matrix ``X = C^T C`` for workload A under (k, b) fixed-epoch participation.

    Solves Eq. (6) of Choquette-Choo et al. (ICML 2023) with the constraint set ``constraints``
    (default Eq. 35: all-ones pattern constraints plus ``X >= 0``, as in the paper's
    experiments) by Newton's method on the Lagrange dual; see the module docstring for the math
    and why this equals the paper's dual fixed point. Mirrors
    ``jax_privacy.matrix_factorization.dense.optimize(n, epochs=k, A=A)``.

    Args:
        A: the n x n workload (full rank; lower triangular for a streaming mechanism), or an int
            n for the prefix sums ``np.tri(n)``.
        epochs: k, the number of participations of an example (fixed epoch order); must divide n.
            ``epochs=1`` is single participation (Denisov et al. 2022).
        min_sep: b, the number of steps between an example's participations. Optional: it is
            ``n // epochs`` by definition of the schema (``n = epochs * min_sep``); pass it to
            have that checked.
        constraints: "nonneg" (Eq. 35, default), "orthogonal" (Eq. 36, jax_privacy's orthogonality
            mask) or "all_signs" (Eq. 34, scalar contributions; at most 2^16 sign multipliers).
        tol: stop when the relative duality gap ``(loss - dual) / loss <= tol``.
        max_iter: maximum number of Newton iterations.
        callback: called as ``callback(iteration, loss, gap)`` after every iteration with the best
            loss so far and its gap; returning True stops the run (``converged`` then tells
            whether the gap was reached).

    Returns:
        :class:`OptimizationResult` with ``X`` and ``C`` normalized to sensitivity 1 under the
        schema, ``loss`` (total squared error, upper bound), ``dual`` (lower bound) and ``gap``.
        On KeyboardInterrupt the best point so far is returned with ``converged=False``.
        Whatever happens, the returned strategy is feasible (sensitivity 1, X >= 0 for "nonneg")
        and ``loss`` is its exact loss; a run that ends before the gap is reached (max_iter,
        stall at floating-point resolution) says ``converged=False``.

    Example (the RMSE of the 128 prefix sums per unit noise multiplier, 2 epochs):

        >>> res = optimal_multi_epoch_gram(128, epochs=2)
        >>> round(res.rmse, 4), res.converged, res.rel_gap <= 1e-6, float(res.X.min()) >= 0
        (3.2681, True, True, True)

    Notes:
        Cost per Newton iteration, the Newton-CG switch and measured times: the module docstring
        ("Cost").

    Raises:
        InvalidParameterError: A is not square, not finite or rank deficient; epochs does not
            divide n; min_sep inconsistent; unknown constraints; tol or max_iter out of range.
    """
    start = time.perf_counter()
    A, k, b, tol, max_iter, svals = _gram_arguments(A, epochs, min_sep, constraints, tol, max_iter)
    dual = _Dual(A, k, constraints)
    # a feasible starting point: X = I / k (C = I / sqrt(k), DP-SGD noise), loss = k ||A||_F^2
    run = _NewtonRun(dual, A.shape[0], best_X=np.eye(A.shape[0]) / k, best_loss=float(k * np.sum(A * A)))
    try:
        run.begin(float(svals.sum()))
        while not run.record(tol, max_iter, callback):
            run.iterate(constraints)
    except KeyboardInterrupt:
        run.converged = False

    X = dual.unpermute(run.best_X)
    return OptimizationResult(
        X=X, C=strategy_from_gram(X), loss=float(run.best_loss), gap=float(run.gap()), iterations=run.iterations,
        converged=bool(run.converged), seconds=time.perf_counter() - start, dual=float(run.best_dual),
        constraints=constraints, epochs=k, min_sep=b,
    )


def _gram_arguments(A, epochs, min_sep, constraints, tol, max_iter):
    """``(A, k, b, tol, max_iter, singular values of A)`` of :func:`optimal_multi_epoch_gram`,
    validated (its Raises section)."""
    A = _workload(A)
    n = A.shape[0]
    k = _v.positive_int("epochs", epochs)
    if k > n or n % k:
        raise InvalidParameterError(
            f"epochs must divide the number of steps n = {n} (fixed epoch order, n = epochs * min_sep), "
            f"got epochs={epochs!r}"
        )
    b = n // k
    if min_sep is not None:
        sep = _v.positive_int("min_sep", min_sep)
        if sep != b:
            raise InvalidParameterError(
                f"min_sep must equal n // epochs = {b} for the fixed epoch order with n = {n} and "
                f"epochs = {k}, got min_sep={min_sep!r}"
            )
    if constraints not in ("nonneg", "orthogonal", "all_signs"):
        raise InvalidParameterError(
            f"constraints must be 'nonneg', 'orthogonal' or 'all_signs', got {constraints!r}"
        )
    if constraints == "all_signs" and b * 2 ** (k - 1) > _MAX_SIGN_VARS:
        raise InvalidParameterError(
            f"constraints='all_signs' needs b * 2^(k-1) = {b} * 2^{k - 1} sign multipliers, more than "
            f"{_MAX_SIGN_VARS}; use constraints='nonneg' (or fewer epochs)"
        )
    tol = _tol(tol)
    max_iter = _v.positive_int("max_iter", max_iter)
    return A, k, b, tol, max_iter, _check_full_rank(A)


@dataclass
class _NewtonRun:
    """The state of :func:`optimal_multi_epoch_gram`'s Newton iteration on the dual: the best
    feasible primal point and dual bound so far, the iterate ``theta`` and its evaluation ``ev``,
    and the barrier ``mu log det U`` (switched on when Newton steps keep being damped -- the
    iterates hug the boundary of the cone ``U > 0`` and would "jam" there -- or progress stalls;
    pure Newton, ``mu = 0``, unless there are bounded multipliers)."""

    dual: _Dual
    n: int
    best_X: np.ndarray
    best_loss: float
    best_dual: float = -math.inf
    iterations: int = 0
    converged: bool = False
    theta: Optional[np.ndarray] = None
    ev: Optional[dict] = None
    barrier: bool = False
    mu: float = 0.0
    stalls: int = 0
    no_step: bool = False
    damped: int = 0
    centered: bool = False
    merit_gain: float = math.inf

    def gap(self) -> float:
        return self.best_loss - self.best_dual if math.isfinite(self.best_dual) else math.inf

    def begin(self, alpha: float) -> None:
        """The dual at ``U = alpha I``."""
        self.theta = self.dual.initial(alpha)
        self.ev = self.dual.evaluate(self.theta)
        if self.ev is None:
            raise NumericalError("the dual function is not finite at the starting point U = alpha I")
        self.best_dual = self.ev["phi"]
        bounded = self.dual.bounded()
        self.barrier = bool(bounded.any())
        self.mu = _SIGMA * self.gap() / (self.n + int(bounded.sum())) if self.barrier else 0.0

    def record(self, tol: float, max_iter: int, callback) -> bool:
        """Take the bounds at the current iterate; True when the run stops here."""
        ev, previous = self.ev, (self.best_loss, self.best_dual)
        self.best_dual = max(self.best_dual, ev["phi"])
        # primal candidates: X(U), and X(U) + mu U^{-1}, which is feasible at a barrier center
        for Xc in (ev["X"], ev["X"] + self.mu * ev["Uinv"]) if self.mu > 0 else (ev["X"],):
            loss, Xf = self.dual.primal(Xc)
            if Xf is not None and loss < self.best_loss:
                self.best_loss, self.best_X = loss, Xf
        self.converged = self.gap() <= tol * self.best_loss
        # stalled: neither bound moved beyond rounding twice in a row, or no ascent step exists
        moved = self.best_loss < previous[0] * (1 - _STALL_RTOL) or (
            self.best_dual - previous[1] > _STALL_RTOL * abs(self.best_dual)
        ) or (self.barrier and self.merit_gain > _STALL_RTOL * abs(ev["phi"]))
        self.stalls = 0 if moved else self.stalls + 1
        stop = self.iterations > 0 and callback is not None and bool(
            callback(self.iterations, self.best_loss, self.gap())
        )
        if not self.barrier and (self.no_step or self.stalls >= 2 or self.damped >= _DAMPED_SWITCH):
            self.barrier, self.no_step, self.stalls = True, False, 0
        return bool(self.converged or stop or self.no_step or self.stalls >= 2 or self.iterations >= max_iter)

    def iterate(self, constraints: str) -> None:
        """One damped Newton step on the barrier merit ``phi + mu (log det U + sum log theta_bounded)``."""
        dual = self.dual
        nu = self.n + int(dual.bounded().sum())
        if self.barrier:  # mu follows the certified gap down (never up), faster once centered
            if self.mu == 0.0:
                self.mu = _SIGMA * self.gap() / nu
            else:
                self.mu = min(self.mu * (_MU_SHRINK if self.centered else 1.0), _SIGMA * self.gap() / nu)
        # cross-pattern multipliers for negative entries of X (Eq. 35 only)
        if constraints == "nonneg":
            m_before = dual.m
            self.theta, self.ev = _maybe_add_off(
                dual, self.ev, self.theta, self.mu if self.barrier else _SIGMA * self.gap() / nu
            )
            if dual.m > m_before and not self.barrier:
                self.barrier, self.mu = True, _SIGMA * self.gap() / (self.n + int(dual.bounded().sum()))
        merit = _Merit(self.mu, dual.bounded())
        g, d = self.direction(merit)
        step, slope, psi, new = self.line_search(merit, g, d)
        self.iterations += 1
        self.damped = self.damped + 1 if step < 1.0 else 0
        # Newton decrement of psi / mu below 1: close to the barrier center for this mu
        self.centered = self.mu > 0 and step == 1.0 and slope <= self.mu
        if new is None:
            self.no_step = True  # report this iteration, then stop (or switch the barrier on)
        else:
            self.merit_gain = merit(new[1], new[0]) - psi
            self.theta, self.ev = new

    def direction(self, merit: "_Merit") -> tuple[np.ndarray, np.ndarray]:
        """``(g, d)``: the merit's gradient and the Newton (or Newton-CG) ascent direction."""
        dual, ev, theta, mu, bounded = self.dual, self.ev, self.theta, merit.mu, merit.bounded
        g = merit.grad(ev, theta)
        full = dual.m <= _MAX_NEWTON_VARS
        H = dual.hessian(ev, full=full, extra=math.sqrt(mu) * ev["Uinv"] if mu > 0 else None)
        curv = np.where(bounded, mu / np.where(bounded, theta, 1.0) ** 2, 0.0)
        if bounded.any():
            if full:
                H[np.diag_indices_from(H)] -= curv
            else:
                H -= curv[: dual.m_in].reshape(dual.b, dual.nv)[:, :, None] * np.eye(dual.nv)
        if full:
            return g, _newton_direction(H, g, blockwise=False, nv=dual.nv)
        # Newton-CG: exact Hessian-vector products, block-diagonal preconditioner; the
        # forcing term follows the certified gap (superlinear convergence)
        rel = self.gap() / self.best_loss if self.best_loss > 0 else 1.0
        d, _ = _newton_cg(
            lambda p, ev=ev, mu=mu, curv=curv: curv * p - dual.hvp(ev, p, mu),
            H, g, dual.nv, rtol=min(0.1, math.sqrt(max(rel, 0.0))), maxiter=_CG_MAXITER,
        )
        return g, d

    def line_search(self, merit: "_Merit", g: np.ndarray, d: np.ndarray):
        """``(step, slope, psi, new)``: backtracking (Armijo) along ``d``, strictly inside the
        bounds (fraction to the boundary); ``new = (theta, ev)`` or ``None`` when no step ascends."""
        theta, bounded = self.theta, merit.bounded
        shrink = bounded & (d < 0)
        step = min(1.0, 0.99 * float(np.min(-theta[shrink] / d[shrink]))) if shrink.any() else 1.0
        psi, slope, gnorm = merit(self.ev, theta), float(g @ d), float(np.abs(g).max())
        for _ in range(40):
            cand = theta + step * d
            ev_c = self.dual.evaluate(cand)
            if ev_c is not None and slope > 0:
                if merit(ev_c, cand) >= psi + 1e-4 * step * slope:
                    return step, slope, psi, (cand, ev_c)
                # the predicted increase is below the rounding error of the merit function:
                # judge the step by the gradient instead, as Newton's method near the optimum
                if step * slope <= _FLAT_RTOL * abs(psi) and (
                    float(np.abs(merit.grad(ev_c, cand)).max()) < 0.5 * gnorm
                ):
                    return step, slope, psi, (cand, ev_c)
            step *= 0.5
        return step, slope, psi, None


@dataclass(frozen=True)
class _Merit:
    """The barrier merit ``phi + mu (log det U + sum log theta_bounded)`` and its gradient."""

    mu: float
    bounded: np.ndarray

    def __call__(self, e: dict, th: np.ndarray) -> float:
        return e["phi"] + self.mu * (e["logdet"] + float(np.log(th[self.bounded]).sum()))

    def grad(self, e: dict, th: np.ndarray) -> np.ndarray:
        gr = e["grad"] + self.mu * e["bgrad"]
        gr[self.bounded] += self.mu / th[self.bounded]
        return gr


def _maybe_add_off(dual: _Dual, ev: dict, theta: np.ndarray, mu: float) -> tuple[np.ndarray, dict]:
    """Add multipliers for the most negative cross-pattern entries of X(U) (Eq. 35 active set).

    A new multiplier starts where its barrier gradient balances the violation,
    ``mu / lam = 2 |X_pq|``, shrunk if U would leave the positive-definite cone."""
    X = ev["X"]
    n = dual.n
    scale = float(np.abs(np.diag(X)).max())
    tri = np.triu(np.ones((n, n), dtype=bool), 1) & (dual.cls[:, None] != dual.cls[None, :])
    if len(dual.off_p):
        tri[dual.off_p, dual.off_q] = False
    cand = np.flatnonzero(tri & (X < -1e-9 * scale))
    if cand.size == 0:
        return theta, ev
    # wait until the in-pattern dual is roughly solved, unless the violation is large
    gin = np.abs(ev["grad"][: dual.m_in]).max()
    worst = -float(X.reshape(-1)[cand].min())
    if gin > 1e-2 and worst < 1e-2 * scale:
        return theta, ev
    limit = n  # at most n new multipliers per iteration
    if cand.size > limit:
        cand = cand[np.argsort(X.reshape(-1)[cand])[:limit]]
    room = _MAX_NEWTON_VARS - dual.m
    if room <= 0:
        return theta, ev
    cand = cand[:room]
    p, q = np.divmod(cand, n)
    lam0 = mu / (2.0 * np.abs(X[p, q]))
    m_old = dual.m
    dual.add_off(p, q)
    for _ in range(60):
        th = np.r_[theta, lam0]
        ev_new = dual.evaluate(th)
        if ev_new is not None:
            return th, ev_new
        lam0 = lam0 * 0.1
    dual.drop_off(m_old)  # could not enter the cone: keep the previous variables
    return theta, ev


# ------------------------------------------------------------------------- public: single epoch
def single_epoch_optimal(
    A: np.ndarray | int,
    *,
    tol: float = 1e-6,
    max_iter: int = 10_000,
    callback: Optional[ProgressCallback] = None,
) -> OptimizationResult:
    """Optimal single-participation factorization by the fixed point of Denisov et al. (2022).

    The paper's "MF(k=1, n)" (notes §4.4). With ``T = A^T A`` and multipliers ``v`` for the
    column-norm constraints ``X[i, i] <= 1``: start from ``v = diag(T^{1/2})``, repeat
    ``D = diag(v)^{1/2}``, ``R = (D T D)^{1/2}``, ``X = D^{-1} R D^{-1}``, ``v <- diag(R)``
    (= ``v * diag(X)``, the fixed point of Denisov et al. Thm. 3.2 / Cor. 3.1 with H = diag(v)^{1/2}).
    Primal: ``X / max_i X[i, i]`` (sensitivity = largest column norm of C = 1), loss
    ``tr(T X^{-1}) max_i X[i, i]``; dual ``g(v) = 2 tr R - sum v``. Stops at relative gap ``tol``.
    Linear convergence (about 40-70 iterations at 1e-4 for prefix sums, more at 1e-6);
    ``optimal_multi_epoch_gram(A, epochs=1, constraints="orthogonal")`` solves the same problem by
    Newton's method in fewer iterations.

    Returns an :class:`OptimizationResult` (``epochs=1``, ``min_sep=n``, constraints "column_norm").
    KeyboardInterrupt returns the best point so far with ``converged=False``.
    """
    start = time.perf_counter()
    A = _workload(A)
    n = A.shape[0]
    tol = _tol(tol)
    max_iter = _v.positive_int("max_iter", max_iter)
    _check_full_rank(A)
    T = A.T @ A
    w, V = np.linalg.eigh(T)
    v = (V * V) @ np.sqrt(np.maximum(w, 0.0))  # diag(T^{1/2})
    best_loss = float(np.sum(A * A))  # X = I: C = I is feasible
    best_state = None  # (d, E, r, max diag X) of the best iterate; X is built once at the end
    best_dual = -math.inf
    iterations = 0
    converged = False
    try:
        while True:
            d = np.sqrt(v)
            M = d[:, None] * T * d[None, :]
            lam, E = sla.eigh((M + M.T) / 2, check_finite=False, driver="evd")
            rr = np.sqrt(np.maximum(lam, 0.0))
            diag_R = (E * E) @ rr
            diag_X = diag_R / v
            mx = float(diag_X.max())
            best_dual = max(best_dual, 2.0 * rr.sum() - v.sum())
            # tr(T X^{-1}) = tr(D T D R^{-1}) = tr(R^2 R^{-1}) = tr(R); scaled to max diag 1
            if lam.min() > 0:
                loss = float(rr.sum()) * mx
                if loss < best_loss:
                    best_loss, best_state = loss, (d, E, rr, mx)
            gap = best_loss - best_dual
            if gap <= tol * best_loss:
                converged = True
                break
            if iterations >= max_iter:
                break
            v = diag_R
            iterations += 1
            if callback is not None and callback(iterations, best_loss, gap):
                break
    except KeyboardInterrupt:
        converged = False
    if best_state is None:
        best_X = np.eye(n)
    else:
        d, E, rr, mx = best_state
        G = (E * np.sqrt(rr)) / d[:, None]
        best_X = G @ G.T / mx
        best_X = (best_X + best_X.T) / 2
    return OptimizationResult(
        X=best_X,
        C=strategy_from_gram(best_X),
        loss=float(best_loss),
        gap=float(best_loss - best_dual) if math.isfinite(best_dual) else math.inf,
        iterations=iterations,
        converged=bool(converged),
        seconds=time.perf_counter() - start,
        dual=float(best_dual),
        constraints="column_norm",
        epochs=1,
        min_sep=n,
    )
