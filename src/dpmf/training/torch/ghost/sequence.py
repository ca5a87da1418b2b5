"""Per-example norms and clipped sums of a linear map applied along a sequence (the core of the
Linear and convolution rules), with rounding bounds that make the norms upper bounds.

Example ``i`` has input rows ``a_{i,t}`` (``A_i``, ``T x d_in``) and output-gradient rows ``g_{i,t}``
(``G_i``, ``T x d_out``); its weight gradient is ``G_i^T A_i`` and

    ||G_i^T A_i||_F^2 = <A_i A_i^T, G_i G_i^T>_F = sum_{s,t} (a_s . a_t)(g_s . g_t)     (ghost norm)

(Li et al. 2021, arXiv 2110.05679, Sec. 4; for ``T = 1`` it is ``||a_i||^2 ||g_i||^2``, Goodfellow 2015).
Per layer we take the cheaper of the Gram form (``O(T^2 (d_in + d_out))`` per example) and the
materialized gradient (``O(T d_in d_out)``): Gram iff ``2 T^2 <= d_in d_out`` (Bu et al.'s mixed
ghost norm, arXiv 2205.10683). The clipped sum is one product, ``sum_i f_i G_i^T A_i = (f * G)^T A``
over the flattened batch and positions ("book-keeping", Bu et al. arXiv 2210.00038).

Rounding (why the returned squares are upper bounds). Let ``s_i = sum_t ||a_{i,t}|| ||g_{i,t}||``; it
bounds ``||G_i^T A_i||_F`` and, entrywise, ``|| |G_i|^T |A_i| ||_F``. With ``gamma_m = m u / (1 - m u)``
(Higham, Accuracy and Stability, Lemma 3.1; ``u`` the unit roundoff of the arithmetic):

* Gram form, computed in the working precision (float32 for float32 models; float64 if it
  overflows): every inner product and the ``T^2``-term sum together err by at most
  ``gamma_{d + T^2 + 2} S_i`` with ``S_i = sum_{s,t} |a_s.a_t| |g_s.g_t| <= s_i^2`` (``d = max(d_in, d_out)``;
  the bound holds for any summation order, blocked or with FMA); we return
  ``max(fl(N^2), 0) + gamma s_i^2`` plus ``(d + T^2 + 2) T^2`` times the smallest normal number for
  underflow. In float32 ``gamma`` is about ``6e-8 (d + T^2)``: for typical sequences the bound exceeds the
  exact squared norm by well under 1%, so examples near the clip norm are clipped a little harder;
  where the Gram value cancels it is the (safe) bound that clips.
* Materialized form, ``P_i = fl(G_i^T A_i)`` in the working precision ``u_w`` (float32): each entry errs
  by ``gamma_T (|G_i|^T |A_i|)_{jk}``, so ``||G_i^T A_i|| <= ||P_i|| + gamma_T s_i``; ``||P_i||`` is taken in
  float64. We return ``(||P_i|| + gamma_T s_i)^2``. Here ``s_i`` enters only the error term, so it is
  formed in the working precision from row norms and inflated by ``1 + 2 gamma_{d+T+2}`` of that
  precision (an upper bound of the exact ``s_i``), which saves a float64 copy of ``A`` and ``G``.
* ``T = 1``: ``||a||^2 ||g||^2`` in float64 (relative error ``gamma_{d+2}``, added as well).

``s_i`` is formed from row norms in the working precision and inflated by ``1 + 2 gamma_{d+T+2}``. These bounds are loose only where they must be (cancelling sequences: the
cancellation is exactly what makes the computed Gram value untrustworthy).
"""

from __future__ import annotations

from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.clipping import toward_zero

torch = require_torch()

__all__ = ["gamma", "sequence_sq_norms", "sequence_weighted_sum", "rows_sq_norms", "use_gram"]

F64 = torch.float64
#: floats of materialized per-example gradients held at once in the materialized branch
CHUNK_FLOATS = 1 << 23


def gamma(m: int, dtype) -> float:
    """``gamma_m = m u / (1 - m u)`` for the unit roundoff ``u`` of ``dtype`` (inf if ``m u >= 1``)."""
    mu = m * torch.finfo(dtype).eps / 2
    return float("inf") if mu >= 1 else mu / (1 - mu)


def use_gram(T: int, d_in: int, d_out: int) -> bool:
    """The mixed ghost norm rule: the Gram form iff ``2 T^2 <= d_in d_out``."""
    return 2 * T * T <= d_in * d_out


def _row_norm_products(A, G):
    """``s_i = sum_t ||a_{i,t}|| ||g_{i,t}||`` in the inputs' precision, ``(B,)``."""
    return (torch.linalg.vector_norm(A, dim=2) * torch.linalg.vector_norm(G, dim=2)).sum(1)


def _gram_sq_norms(A, G, work):
    """Gram form in precision ``work`` plus its rounding bound (module docstring)."""
    T, d = A.shape[1], max(A.shape[2], G.shape[2])
    Aw, Gw = A.to(work), G.to(work)
    s = _row_norm_products(Aw, Gw).to(F64) * (1 + 2 * gamma(d + T + 2, work))
    n2 = (torch.bmm(Aw, Aw.transpose(1, 2)) * torch.bmm(Gw, Gw.transpose(1, 2))).sum((1, 2)).to(F64)
    # gamma bound for normal numbers, plus every operation's possible underflow (absolute, tiny)
    underflow = (d + T * T + 2) * T * T * torch.finfo(work).smallest_normal
    return n2.clamp_min(0.0) + gamma(d + T * T + 2, work) * s * s + underflow


def sequence_sq_norms(A, G, work_dtype=torch.float32):
    """Upper bounds of ``||G_i^T A_i||_F^2``, float64 ``(B,)``; ``A``: ``(B, T, d_in)``, ``G``: ``(B, T, d_out)``.

    ``work_dtype`` is the precision of the materialized branch (at least float32)."""
    B, T, d_in = A.shape
    d_out = G.shape[2]
    if B == 0:
        return torch.zeros(0, dtype=F64, device=A.device)
    if T == 1:
        a, g = A[:, 0].to(F64), G[:, 0].to(F64)
        sq = (a * a).sum(1) * (g * g).sum(1)
        return sq * (1 + gamma(max(d_in, d_out) + 2, F64))
    if use_gram(T, d_in, d_out):
        out = _gram_sq_norms(A, G, work_dtype)
        if not bool(torch.isfinite(out).all()) and work_dtype != F64:  # overflow in the working precision
            out = _gram_sq_norms(A, G, F64)
        return out
    # materialized, a chunk of examples at a time
    out = torch.empty(B, dtype=F64, device=A.device)
    step = max(1, CHUNK_FLOATS // max(1, d_in * d_out))
    g_T = gamma(T, work_dtype)
    inflate = 1 + 2 * gamma(max(d_in, d_out) + T + 2, work_dtype)  # s in the working precision, rounded up
    for lo in range(0, B, step):
        a, g = A[lo : lo + step].to(work_dtype), G[lo : lo + step].to(work_dtype)
        p = torch.bmm(g.transpose(1, 2), a).reshape(a.shape[0], -1)
        norm = torch.linalg.vector_norm(p, dim=1, dtype=F64)
        s = _row_norm_products(a, g).to(F64) * inflate
        out[lo : lo + step] = (norm + g_T * s) ** 2
    return out


def sequence_weighted_sum(A, G, f, dtype):
    """``sum_i f_i G_i^T A_i`` (``(d_out, d_in)``, ``dtype``); ``f`` float64 ``(B,)``.

    One product over the flattened batch and positions when ``A`` and ``G`` are contiguous
    ``(B, T, d)`` (Linear); otherwise (transposed views, as the convolution rule passes) a batched
    product summed over examples, a chunk at a time, so no transposed copy of ``A`` is made."""
    B, d_in, d_out = A.shape[0], A.shape[-1], G.shape[-1]
    if B == 0:
        return torch.zeros(d_out, d_in, dtype=dtype, device=A.device)
    fz = toward_zero(f, dtype).view(-1, 1, 1)
    if A.is_contiguous() and G.is_contiguous():
        scaled = G.to(dtype) * fz
        return scaled.reshape(-1, d_out).t().mm(A.to(dtype).reshape(-1, d_in))
    out = torch.zeros(d_out, d_in, dtype=dtype, device=A.device)
    step = max(1, CHUNK_FLOATS // max(1, d_in * d_out))
    for lo in range(0, B, step):
        g = G[lo : lo + step].to(dtype) * fz[lo : lo + step]
        out += torch.bmm(g.transpose(1, 2), A[lo : lo + step].to(dtype)).sum(0)
    return out


def rows_sq_norms(rows64):
    """``||r_i||^2`` of float64 per-example rows ``(B, ...)`` (materialized small gradients)."""
    r = rows64.reshape(rows64.shape[0], -1)
    return (r * r).sum(1)
