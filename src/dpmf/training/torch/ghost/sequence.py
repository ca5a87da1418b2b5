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

* Gram form: the two Gram matrices ``a_{st} = g_s . g_t`` (length ``R = d_out``) and ``b_{st} = a_s . a_t``
  (length ``C = d_in``) in the working precision (float32 for float32 models; float64 if it overflows),
  each entry with error ``|e| <= gamma_R ||g_s|| ||g_t|| + R eta`` (resp. ``C``; ``eta`` the smallest normal
  number, for underflow; any summation order, blocked or with FMA); the ``T^2``-term contraction
  ``sum a b`` in float64 (products of float32 numbers are exact there), erring by at most
  ``gamma^{(64)}_{T^2+2} sum |a b|``. Expanding ``a b - a* b*`` with ``sum_{st} ||g_s|| ||g_t|| ||a_s|| ||a_t|| = s_i^2``
  gives (:func:`gram_bound`) ``N^2 <= max(fl(N^2), 0) + (gamma_R + gamma_C + 3 gamma_R gamma_C) s_i^2 +
  gamma^{(64)}_{T^2+2} sum|a b| + eta (R sum|b| + C sum|a| + 2 (gamma_R + gamma_C)(R + C)((sum ||g||)^2 +
  (sum ||a||)^2)) + T^2 R C eta^2``. The ``T^2`` enters only through float64 (an earlier version summed
  in float32 with ``gamma_{d + T^2 + 2}``: at ``T = 64`` that inflated float32 norms by about 0.5%); in
  float32 the bound now exceeds the exact squared norm by about ``1.2e-7 max(d_in, d_out) s_i^2``, so
  examples near the clip norm are clipped a little harder; where the Gram value cancels it is the
  (safe) bound that clips.
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

import contextlib

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


def gram_bound(n2, abs_ab, abs_a, abs_b, s, su, sv, R: int, C: int, T: int, work):
    """Upper bound of the exact ``sum_{s,t} (u_s . u_t)(v_s . v_t)`` from its computed value (module
    docstring, "Gram form"): ``n2`` the float64 contraction of the working-precision Grams ``a = (u_s . u_t)``
    and ``b = (v_s . v_t)``; ``abs_ab``, ``abs_a``, ``abs_b`` the sums of ``|a b|``, ``|a|``, ``|b|``; ``s``,
    ``su``, ``sv`` upper bounds of ``sum_t ||u_t|| ||v_t||``, ``sum_t ||u_t||``, ``sum_t ||v_t||``; all float64
    ``(B,)``. ``R``, ``C``: the lengths of the ``u`` and ``v`` rows; ``T``: the positions."""
    g_r, g_c = gamma(R + 2, work), gamma(C + 2, work)
    eta = torch.finfo(work).smallest_normal
    err = (g_r + g_c + 3 * g_r * g_c) * s * s + gamma(T * T + 2, F64) * abs_ab
    err = err + eta * (R * abs_b + C * abs_a + 2 * (g_r + g_c) * (R + C) * (su * su + sv * sv)) + T * T * R * C * eta * eta
    return n2.clamp_min(0.0) + err * (1 + 1e-10)  # (1 + 1e-10): the float64 rounding of this bound itself


def contract(a, b):
    """``(sum a b, sum |a b|, sum |a|, sum |b|)`` per example, float64, of two ``(B, T_1, T_2)`` Grams."""
    a64, b64 = a.to(F64), b.to(F64)
    ab = a64 * b64
    return ab.sum((1, 2)), ab.abs().sum((1, 2)), a64.abs().sum((1, 2)), b64.abs().sum((1, 2))


def row_norm_sums(U, V, work, d: int):
    """``(sum_t ||u_t|| ||v_t||, sum_t ||u_t||, sum_t ||v_t||)`` in ``work``, rounded up: float64 ``(B,)``."""
    T = V.shape[1]
    un = torch.linalg.vector_norm(U.to(work), dim=2)
    vn = torch.linalg.vector_norm(V.to(work), dim=2)
    up = 1 + 2 * gamma(d + T + 2, work)
    return ((un * vn).sum(1).to(F64) * up, un.sum(1).to(F64) * up, vn.sum(1).to(F64) * up)


_GRAMS: dict | None = None  # inside gram_cache(): input Grams by the input's memory


@contextlib.contextmanager
def gram_cache():
    """Within the block, the Gram ``A Aᵀ`` of an input is formed once for all layers that read the
    same tensor (a Llama block's q/k/v projections, its gate/up projections). The key is the memory
    (storage, offset, shape, strides, dtype) and the version counter of the recorded input: every
    recorded tensor stays alive during the block, so equal keys mean equal values."""
    global _GRAMS
    old, _GRAMS = _GRAMS, {}
    try:
        yield
    finally:
        _GRAMS = old


def _input_gram(A, work):
    """``A Aᵀ`` in ``work``, ``(B, T, T)`` (cached inside :func:`gram_cache`)."""
    key = None
    if _GRAMS is not None and A.device.type != "meta":
        key = (A.untyped_storage().data_ptr(), A.storage_offset(), tuple(A.shape), tuple(A.stride()), A.dtype,
               A._version, work)
        got = _GRAMS.get(key)
        if got is not None:
            return got
    Aw = A.to(work)
    gram = torch.bmm(Aw, Aw.transpose(1, 2))
    if key is not None:
        _GRAMS[key] = gram
    return gram


def _gram_sq_norms(A, G, work):
    """Gram form: the Grams in precision ``work``, their contraction in float64, plus the rounding bound."""
    T, d_in, d_out = A.shape[1], A.shape[2], G.shape[2]
    Gw = G.to(work)
    s, sg, sa = row_norm_sums(Gw, A, work, max(d_in, d_out))
    n2, abs_ab, abs_g, abs_a = contract(torch.bmm(Gw, Gw.transpose(1, 2)), _input_gram(A, work))
    return gram_bound(n2, abs_ab, abs_g, abs_a, s, sg, sa, d_out, d_in, T, work)


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
