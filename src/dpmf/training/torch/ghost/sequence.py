"""Per-example norms and clipped sums of a linear map applied along a sequence (the core of the
Linear and convolution rules), with rounding bounds that make the norms upper bounds.

Example ``i`` has input rows ``a_{i,t}`` (``A_i``, ``T x d_in``) and output-gradient rows ``g_{i,t}``
(``G_i``, ``T x d_out``); its weight gradient is ``G_i^T A_i`` and

    ||G_i^T A_i||_F^2 = <A_i A_i^T, G_i G_i^T>_F = sum_{s,t} (a_s . a_t)(g_s . g_t)     (ghost norm)

(Li et al. 2021, arXiv 2110.05679, Sec. 4; for ``T = 1`` it is ``||a_i||^2 ||g_i||^2``, Goodfellow 2015).
The clipped sum is one product, ``sum_i f_i G_i^T A_i = (f * G)^T A`` over the flattened batch and
positions ("book-keeping", Bu et al. arXiv 2210.00038).

Per layer (:func:`norm_plan`) the cheapest of three ways, by an operation count per example in
multiply-adds of a float32 GEMM (the mixed ghost norm of Bu et al., arXiv 2205.10683, with the
book-keeping product and the passes over memory counted; constants measured on one CPU thread,
``benchmarks/README.md``, issue 52):

* ``"gram"``: the two ``T x T`` Grams (``T^2 (d_in + d_out)``; on the CPU symmetric products through
  BLAS ``?syrk``, :func:`symmetric_gram`, :data:`SYRK` of that; an input read by several layers has its
  Gram formed once), their float64 contraction (:data:`GRAM_PASS` per entry), then the book-keeping
  product (``T d_in d_out``);
* ``"keep"``: the per-example gradients ``P_i = G_i^T A_i`` (``T d_in d_out``, times
  :data:`BMM_PENALTY` for a batch of small products), their float64 norms, and the clipped sum
  ``sum_i f_i P_i`` from the very same tensor (:data:`KEEP_PASS` per entry): no book-keeping product. Held
  until the clip factors are known, so only where ``P`` takes no more memory than the captured ``A`` and
  ``G`` it is formed from (``d_in d_out <= KEEP_MEMORY T (d_in + d_out)``);
* ``"materialize"``: ``P_i`` a chunk of examples at a time for the norms only, then book-keeping.

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
import functools

import numpy as np

from dpmf.resources import one_blas_thread
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.clipping import toward_zero

torch = require_torch()

__all__ = ["gamma", "sequence_sq_norms", "sequence_parts", "sequence_weighted_sum", "rows_sq_norms", "use_gram",
           "norm_plan", "step_cache", "symmetric_gram", "gram_norms", "per_example_norms", "per_example_sums", "weighted_rows",
           "factors_toward_zero", "rows_sum_and_abs", "compiled_form", "cpu_plain", "position_weighted_sum", "in_dtype"]

F64 = torch.float64
#: floats of materialized per-example gradients held at once in the materialized branch
CHUNK_FLOATS = 1 << 23
#: floats of per-example gradients whose float64 norms are taken at once (the norm makes a float64 copy)
NORM_FLOATS = 1 << 20
#: entries above which a float64 reduction of a CPU tensor runs compiled (:func:`compiled_form`; 1 MB in float64)
COMPILED_FLOATS = 1 << 17
#: cost of one Gram entry's float64 contraction (conversions, product, sum), in float32 GEMM multiply-adds
GRAM_PASS = 70
#: cost of one materialized entry's float64 norm
NORM_PASS = 25
#: cost of one kept entry: its float64 norm and its share of ``sum_i f_i P_i``
KEEP_PASS = 30
#: a batch of ``B`` small per-example products runs slower per multiply-add than one large GEMM
BMM_PENALTY = 1.2
#: ``"keep"`` only where ``d_in d_out <= KEEP_MEMORY T (d_in + d_out)``: ``P`` no larger than ``A`` and ``G``
KEEP_MEMORY = 0.5
#: positions up to which a CPU Gram is ``torch.bmm`` rather than numpy's symmetric product (:func:`symmetric_gram`:
#: at ``T = 17`` the wrapper and the per-matrix BLAS calls cost more than the half of the product ``?syrk``
#: skips; a ViT's step read 1.4% faster, issue 52)
BMM_GRAM_T = 32
#: cost of a symmetric Gram ``X Xᵀ`` (:func:`symmetric_gram`: BLAS ``?syrk`` through numpy, one triangle) per
#: multiply-add of the general product (measured 0.6-0.7 at ``T = 128`` on one thread, issue 52)
SYRK = 0.7


def gamma(m: int, dtype) -> float:
    """``gamma_m = m u / (1 - m u)`` for the unit roundoff ``u`` of ``dtype`` (inf if ``m u >= 1``)."""
    mu = m * torch.finfo(dtype).eps / 2
    return float("inf") if mu >= 1 else mu / (1 - mu)


@functools.lru_cache(maxsize=4096)  # (a pure function of its arguments: one look-up per layer and step, issue 52)
def norm_plan(T: int, d_in: int, d_out: int, *, keep: bool = True, float64: bool = False, syrk: bool = True,
              input_share: int = 1) -> str:
    """``"gram"``, ``"keep"`` or ``"materialize"``: the cheapest way (module docstring) to the norms and
    the clipped sum of a linear map along ``T`` positions, ``d_in`` to ``d_out``. ``keep=False``: not
    ``"keep"`` (a caller that has no such form); ``float64``: the caller materializes in float64 (about
    twice the time of float32); ``syrk``: the Grams are symmetric products (:func:`symmetric_gram` on the
    CPU, :data:`SYRK` of a general product); ``input_share``: the number of layers reading the same input,
    whose Gram is formed once for all of them (a Llama block's q/k/v projections)."""
    size = d_in * d_out
    grams = T * T * (d_in / max(1, input_share) + d_out) * (SYRK if syrk else 1.0)
    cost = {"gram": grams + T * T * GRAM_PASS + T * size,
            "materialize": ((1 + BMM_PENALTY) * T * size + NORM_PASS * size) * (2 if float64 else 1)}
    if keep and size <= KEEP_MEMORY * T * (d_in + d_out):
        cost["keep"] = BMM_PENALTY * T * size + KEEP_PASS * size
    return min(cost, key=cost.get)


def use_gram(T: int, d_in: int, d_out: int) -> bool:
    """Whether :func:`norm_plan` takes the Gram form."""
    return norm_plan(T, d_in, d_out) == "gram"


def _row_norm_products(A, G):
    """``s_i = sum_t ||a_{i,t}|| ||g_{i,t}||`` in the inputs' precision, ``(B,)``."""
    return (torch.linalg.vector_norm(A, dim=2) * torch.linalg.vector_norm(G, dim=2)).sum(1)


def _gammas(m, dtype):
    """:func:`gamma` of an int, or elementwise of a float64 tensor of ints."""
    if not isinstance(m, torch.Tensor):
        return gamma(m, dtype)
    mu = m * (torch.finfo(dtype).eps / 2)
    return torch.where(mu >= 1, float("inf"), mu / (1 - mu))


def gram_bound(n2, s, su, sv, R, C, T: int, work):
    """Upper bound of the exact ``sum_{s,t} (u_s . u_t)(v_s . v_t)`` from its computed value (module
    docstring, "Gram form"): ``n2`` the float64 contraction of the working-precision Grams ``a = (u_s . u_t)``
    and ``b = (v_s . v_t)`` (:func:`contract`); ``s``, ``su``, ``sv`` upper bounds of
    ``sum_t ||u_t|| ||v_t||``, ``sum_t ||u_t||``, ``sum_t ||v_t||``; all float64 ``(B,)``. ``R``, ``C``: the
    lengths of the ``u`` and ``v`` rows; ``T``: the positions.

    The error terms need the sums of ``|a b|``, ``|a|`` and ``|b|`` over the *computed* entries; they are
    bounded from the row norms rather than summed: ``|a_st| <= (1 + gamma_R) ||u_s|| ||u_t|| + R eta``, so
    ``sum |a| <= (1 + gamma_R) su^2 + T^2 R eta`` and, with ``sum_{s,t} ||u_s|| ||u_t|| ||v_s|| ||v_t|| = s^2``,
    ``sum |a b| <= (1 + gamma_R)(1 + gamma_C) s^2 + eta ((1 + gamma_R) C su^2 + (1 + gamma_C) R sv^2) +
    T^2 R C eta^2``. (``sum |a b|`` enters only through the float64 term, ``gamma^{(64)}_{T^2+2}`` times it.)

    Many layers at once (:func:`gram_norms`): ``R`` and ``C`` float64 ``(L, 1)`` tensors, the others ``(L, B)``;
    every entry gets the same formula as alone.

    Collected by powers (all coefficients non-negative, formed first: a handful of operations on the
    ``(B,)`` tensors, which a small layer's step spent ~40 of), the error is
    ``c_s s^2 + c_u su^2 + c_v sv^2 + c_0`` with ``c_s = g_r + g_c + 3 g_r g_c + g64 (1 + g_r)(1 + g_c)``,
    ``c_u = eta ((1 + g64)(1 + g_r) C + 2 (g_r + g_c)(R + C))``, ``c_v`` the same with ``R``, ``g_c``, and
    ``c_0 = (3 + g64) T^2 R C eta^2`` (``g64 = gamma^{(64)}_{T^2+2}``)."""
    g_r, g_c = _gammas(R + 2, work), _gammas(C + 2, work)
    eta = torch.finfo(work).smallest_normal
    TT = T * T
    g64 = gamma(TT + 2, F64)
    up = 1 + 1e-10  # the float64 rounding of this bound itself
    mixed = 2 * (g_r + g_c) * (R + C)
    c_s = (g_r + g_c + 3 * g_r * g_c + g64 * (1 + g_r) * (1 + g_c)) * up
    c_u = eta * ((1 + g64) * (1 + g_r) * C + mixed) * up
    c_v = eta * ((1 + g64) * (1 + g_c) * R + mixed) * up
    c_0 = (3 + g64) * TT * R * C * eta * eta * up
    if isinstance(c_s, torch.Tensor):  # (many layers: coefficients per layer)
        return n2.clamp_min(0.0) + (c_s * s * s + c_u * su * su + c_v * sv * sv + c_0)
    out = torch.addcmul(n2.clamp_min(0.0) + c_0, s, s, value=c_s)
    out.addcmul_(su, su, value=c_u)
    return out.addcmul_(sv, sv, value=c_v)


def cpu_plain(*tensors) -> bool:
    """Plain float32/float64 CPU tensors (what numpy and the compiled reductions read without a copy)."""
    return all(type(t) is torch.Tensor and t.device.type == "cpu" and t.dtype in (torch.float32, F64)
               and not t.requires_grad and not torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors)


def compiled_form(*tensors) -> bool:
    """Whether the compiled float64 reductions (:mod:`~dpmf.training.torch.ghost._norms_compiled`) take these
    tensors: :func:`cpu_plain` ones of which the first has more than :data:`COMPILED_FLOATS` entries (below,
    the tensor forms' float64 copies are small enough to be reused from the allocator's free lists, and
    loading numba, ~40 MB, would cost a small model more memory than the copies; issue 52)."""
    return bool(tensors) and tensors[0].numel() > COMPILED_FLOATS and cpu_plain(*tensors)


def _row_dots(a, b, out) -> None:
    """:func:`~dpmf.training.torch.ghost._norms_compiled.row_dots` (numba: loaded on first use)."""
    from dpmf.training.torch.ghost._norms_compiled import row_dots

    row_dots(a, b, out)


def _weighted_rows(r, f, out) -> None:
    """:func:`~dpmf.training.torch.ghost._norms_compiled.weighted_rows` (numba: loaded on first use)."""
    from dpmf.training.torch.ghost._norms_compiled import weighted_rows as compiled

    compiled(r, f, out)


def rows_sum_and_abs(rows):
    """``(sum_i r_i, sum_i |r_i|)`` in float64, ``rows.shape[1:]``, of per-example rows ``(B, ...)``: of a float64
    copy, or for a large CPU tensor (:func:`compiled_form`) in one compiled pass
    (:func:`~dpmf.training.torch.ghost._norms_compiled.column_sums`, no copy)."""
    B = rows.shape[0]
    if compiled_form(rows) and B:
        total = torch.empty(rows.shape[1:], dtype=F64)
        absolute = torch.empty(rows.shape[1:], dtype=F64)
        from dpmf.training.torch.ghost._norms_compiled import column_sums

        column_sums(_rows_array(rows, B), total.view(-1).numpy(), absolute.view(-1).numpy())
        return total, absolute
    g = rows.to(F64)
    return g.sum(0), g.abs().sum(0)


def _rows_array(t, B: int):
    """``t`` as a C-contiguous ``(B, N)`` numpy array (no copy where ``t`` is contiguous)."""
    return t.reshape(B, -1).contiguous().numpy()


def contract(a, b, b64=None):
    """``sum_{s,t} a_st b_st`` per example in float64 (products of float32 numbers are exact there) of two
    ``(B, T_1, T_2)`` Grams, ``(B,)``: one batched float64 dot product, or, for large Grams on the CPU
    (:func:`compiled_form`), one compiled pass that reads them as they are
    (:func:`~dpmf.training.torch.ghost._norms_compiled.row_dots`; GPT-2's ``T = 128`` Grams made 2 MB float64
    copies each). ``b64``: ``b`` in float64 where the caller holds it already (the same numbers)."""
    B = a.shape[0]
    if compiled_form(a, b) and B:
        out = torch.empty(B, dtype=F64)
        _row_dots(_rows_array(a, B), _rows_array(b, B), out.numpy())
        return out
    b64 = b.to(F64) if b64 is None else b64
    return torch.bmm(a.to(F64).reshape(B, 1, -1), b64.reshape(B, -1, 1)).reshape(B)


def row_norm_sums(U, V, work, d: int):
    """``(sum_t ||u_t|| ||v_t||, sum_t ||u_t||, sum_t ||v_t||)`` in ``work``, rounded up: float64 ``(B,)``.

    Each row norm errs by at most ``gamma_d / 2 + u`` (relative) through its sum of squares and the square
    root, the products and the ``T``-term sums by ``gamma_T`` more: ``1 + 2 gamma_{d+T+2}`` covers them (also
    for row norms taken from a Gram's diagonal, :func:`_gram_rows`)."""
    T = V.shape[1]
    un = torch.linalg.vector_norm(U.to(work), dim=2)
    vn = torch.linalg.vector_norm(V.to(work), dim=2)
    return _rounded_sums(un, vn, 1 + 2 * gamma(d + T + 2, work))


_GRAMS: dict | None = None  # inside step_cache(): what one backward's layers share (step_cache)


@contextlib.contextmanager
def step_cache():
    """Within the block (the norms and clipped sums of one backward), what many layers share is formed
    once: the Gram ``A Aᵀ`` of an input and its row norms, for all layers that read the same tensor (a
    Llama block's q/k/v projections, its gate/up projections); the norms :func:`gram_norms` and
    :func:`per_example_norms` formed for many layers at once (found by :func:`sequence_parts` and
    :func:`rows_sq_norms`), the sums of :func:`per_example_sums` (found by :func:`weighted_rows`); the clip
    factors rounded toward zero (:func:`factors_toward_zero`). The key of an input is its memory
    (storage, offset, shape, strides, dtype) and version counter; of a layer's tensors, the tensors
    themselves (held by the entry, compared by identity). Every recorded tensor stays alive during the
    block, so equal keys mean equal values. Products inside run in full float32 (:func:`full_float32`)."""
    global _GRAMS
    old, _GRAMS = _GRAMS, {}
    with one_blas_thread(), full_float32():
        try:
            yield
        finally:
            _GRAMS = old


@contextlib.contextmanager
def full_float32():
    """float32 matrix products and convolutions in full float32 inside (``torch``'s matmul precision
    ``"highest"``, cuDNN's TF32 off), restored after. The rounding bounds of this module assume the
    working precision's unit roundoff (2^-24 for float32); a GPU allowed to form float32 products in TF32
    (10-bit mantissa: ``torch.set_float32_matmul_precision("high")``, cuDNN's default for convolutions)
    errs ~8000x more, so a norm could come out below the exact one and an example be clipped too little.
    Only the clipper's norms and sums run inside; the model's own forward and backward keep the user's
    setting. (On the CPU both flags are inert.)"""
    precision = torch.get_float32_matmul_precision()
    cudnn = torch.backends.cudnn.allow_tf32
    try:
        if precision != "highest":
            torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False
        yield
    finally:
        if precision != "highest":
            torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = cudnn


def in_dtype(t, dtype):
    """``t.to(dtype)`` without the call where ``t`` has that dtype already (``to`` returns ``t`` itself then; a
    ViT step made ~200 such calls, issue 52)."""
    return t if t.dtype == dtype else t.to(dtype)


def _memory_key(A, *tag):
    """The cache key of ``A``'s values (module docstring of :func:`step_cache`), or None outside it."""
    if _GRAMS is None or A.device.type == "meta":
        return None
    return (A.untyped_storage().data_ptr(), A.storage_offset(), tuple(A.shape), tuple(A.stride()), A.dtype,
            A._version) + tag


def symmetric_gram(X, work, out=None):
    """``X Xᵀ`` per example in ``work`` (float32 or float64), ``(B, T, T)``, for ``X``: ``(B, T, d)``.

    On the CPU it is numpy's ``matmul`` of ``X`` with its own transpose, which BLAS forms as a symmetric
    rank-``d`` update (``?syrk``: one triangle, copied to the other -- exactly symmetric) on one thread: 1.6-1.9x
    faster than ``torch.bmm`` at ``T = 128`` (``benchmarks/README.md``, issue 52). Up to :data:`BMM_GRAM_T`
    positions (ViT's 17 tokens) ``torch.bmm`` (one call, no numpy wrapper: faster in the step there; not
    always exactly symmetric). Every entry is still one dot product of length ``d`` in ``work``, summed in
    some order, so the rounding bound of the module docstring (any order, blocked or with FMA) covers it.
    Elsewhere (another device, a tensor numpy cannot view) ``torch.bmm``. ``out``: a ``(B, T, T)`` tensor of
    ``work`` to write into."""
    Xw = in_dtype(X, work)
    if (Xw.device.type != "cpu" or type(Xw) is not torch.Tensor or Xw.requires_grad or Xw.is_conj()
            or torch._C._functorch.is_functorch_wrapped_tensor(Xw) or Xw.shape[1] <= BMM_GRAM_T):
        return torch.bmm(Xw, Xw.transpose(1, 2), out=out)
    if not Xw.is_contiguous():
        Xw = Xw.contiguous()
    if out is None:
        out = torch.empty(Xw.shape[0], Xw.shape[1], Xw.shape[1], dtype=work, device=Xw.device)
    xn = Xw.numpy()
    with one_blas_thread(), np.errstate(all="ignore"):  # (an overflow gives inf, as torch's: retried in float64)
        np.matmul(xn, xn.transpose(0, 2, 1), out=out.numpy())
    return out


def _input_gram(A, work, ones: bool = False):
    """``A Aᵀ`` in ``work``, ``(B, T, T)`` (cached inside :func:`step_cache`); ``ones``: of ``[A, 1]`` (a column of
    ones appended: ``fl(a_s . a_t) + 1``, one evaluation order of a dot product of length ``d + 1``, so the Gram
    bound with ``C = d + 1`` covers it)."""
    key = _memory_key(A, work, "gram1" if ones else "gram")
    got = None if key is None else _GRAMS.get(key)
    if got is None:
        got = _input_gram(A, work) + 1.0 if ones else symmetric_gram(A, work)
        if key is not None:
            _GRAMS[key] = got
    return got


def _input_gram64(A, work, ones: bool = False):
    """:func:`_input_gram` in float64 for :func:`contract` (exact: a float32 or float64 Gram), cached inside
    :func:`step_cache` (the layers reading one input -- a ViT block's q/k/v -- convert it once); None where
    :func:`contract` takes its compiled form (it reads the Grams as they are)."""
    gram = _input_gram(A, work, ones)
    if compiled_form(gram):
        return None
    key = _memory_key(A, work, "gram64-1" if ones else "gram64")
    got = None if key is None else _GRAMS.get(key)
    if got is None:
        got = gram.to(F64)
        if key is not None:
            _GRAMS[key] = got
    return got


def _gram_rows(X, gram, work, ones: bool = False):
    """``||x_t||`` in ``work``, ``(B, T)``, of ``X`` whose Gram ``X Xᵀ`` is ``gram``: on the CPU from its diagonal
    (``x_t . x_t``, a sum of ``d`` squares in ``work`` as a norm forms it -- :func:`symmetric_gram`'s BLAS
    product --, so :func:`row_norm_sums`' rounding up covers it: no second pass over ``X``; issue 52 measured
    those passes at a quarter of the Gram-form layers' norm time at ``T = 128``); elsewhere a norm of ``X``
    (a device's matrix product may run in a lower precision, TF32). ``ones``: ``||[x_t, 1]||`` (``gram`` that of
    ``[X, 1]``; elsewhere ``sqrt(||x_t||^2 + 1)``, three roundings more, which the rounding up's ``gamma_{d+T+2}``
    with ``d`` at least ``d_in + 1`` covers)."""
    if X.device.type == "cpu":
        return torch.diagonal(gram, dim1=1, dim2=2).sqrt()
    if ones:
        return torch.linalg.vector_norm(X.to(work), dim=2).square().add_(1.0).sqrt_()
    return torch.linalg.vector_norm(X.to(work), dim=2)


def _input_rows(A, work, ones: bool = False):
    """``||a_t||`` (``ones``: ``||[a_t, 1]||``) in ``work``, ``(B, T)`` (:func:`_gram_rows`; cached inside
    :func:`step_cache`)."""
    key = _memory_key(A, work, "rows1" if ones else "rows")
    got = None if key is None else _GRAMS.get(key)
    if got is None:
        got = _gram_rows(A, _input_gram(A, work, ones), work, ones)
        if key is not None:
            _GRAMS[key] = got
    return got


def _rounded_sums(un, vn, up):
    """``(sum_t un vn, sum_t un, sum_t vn)`` over the last dim in float64, times ``up`` (row_norm_sums')."""
    return (un * vn).sum(-1).to(F64) * up, un.sum(-1).to(F64) * up, vn.sum(-1).to(F64) * up


def gram_norms(pairs) -> None:
    """Inside :func:`step_cache`, the Gram-form norms (:func:`sequence_sq_norms`) of every ``(A, G, work)``
    of ``pairs`` that :func:`norm_plan` sends to the Gram form, found there by :func:`sequence_parts`: per
    layer its Grams, row norms and float64 contraction (:func:`_gram_each`), and one rounding bound
    (:func:`gram_bound`, the same formula entry by entry) for all layers of each ``(B, T, work)`` -- a model
    with short sequences and many layers (ViT: 17 tokens) spent much of its norm time in small per-layer
    operations. (Stacking the layers' Grams for one contraction was measured slower: the stack and its
    float64 copies were fresh memory every step, issue 52.) A layer alone in its ``(B, T, work)`` stays
    as it was. A pair may carry a fourth entry ``ones`` (:func:`sequence_parts`: a bias folded in)."""
    if _GRAMS is None:
        return
    pairs = [(p[0], p[1], p[2], len(p) > 3 and bool(p[3])) for p in pairs]
    for A, _, work, _ in pairs:  # how many layers read each input (its Gram is formed once for all)
        key = _memory_key(A, work, "share")
        if key is not None:
            _GRAMS[key] = _GRAMS.get(key, 0) + 1
    groups: dict = {}
    for A, G, work, ones in pairs:
        B, T, d_in = A.shape
        if (B == 0 or T == 1 or A.device.type == "meta" or _pair_key(A, G, work, ones) in _GRAMS
                or _plan(A, G, work) != "gram"):
            continue
        _GRAMS[_pair_key(A, G, work, ones)] = None  # (a pair listed twice is formed once)
        groups.setdefault((B, T, work, A.device), []).append((A, G, ones))
    for (B, T, work, device), jobs in groups.items():
        if len(jobs) > 1:
            _gram_each(jobs, B, T, work, device)
        else:  # alone: as sequence_parts forms it
            del _GRAMS[_pair_key(*jobs[0][:2], work, jobs[0][2])]


def _pair_key(A, G, work, ones: bool):
    """The :func:`step_cache` key of a layer's Gram-form norms (``ones``: with its bias folded in)."""
    return (id(A), id(G), work, True) if ones else (id(A), id(G), work)


def _gram_each(jobs, B: int, T: int, work, device) -> None:
    """:func:`gram_norms` of several layers of the same ``(B, T, work)``: each layer's Grams formed and
    contracted (:func:`contract`, the float64 copy of an input's Gram formed once for the layers reading it) in
    turn, then the row norms of all (on the CPU the Grams' diagonals, one square root) and one rounding bound
    for all: a ViT step's 24 such layers spent ~6 small operations each on writing their results into one
    tensor (issue 52)."""
    n2, g_rows, a_rows = [], [], []
    cpu = device.type == "cpu"
    for A, G, ones in jobs:
        gram, a_gram = symmetric_gram(G, work), _input_gram(A, work, ones)
        n2.append(contract(gram, a_gram, _input_gram64(A, work, ones)))
        g_rows.append(torch.diagonal(gram, dim1=1, dim2=2) if cpu else _gram_rows(G, gram, work))
        a_rows.append(torch.diagonal(a_gram, dim1=1, dim2=2) if cpu else _input_rows(A, work, ones))
    g_rows, a_rows = torch.stack(g_rows), torch.stack(a_rows)
    if cpu:  # (_gram_rows: the square roots of the diagonals)
        g_rows, a_rows = g_rows.sqrt_(), a_rows.sqrt_()
    _bound_many(jobs, torch.stack(n2), g_rows, a_rows, T, work, device)


def _bound_many(jobs, n2, g_rows, a_rows, T: int, work, device) -> None:
    """The rounding bound (:func:`gram_bound`) of the contractions ``n2`` (``(L, B)``) and row norms ``g_rows``,
    ``a_rows`` (``(L, B, T)``: output gradients', inputs') of ``jobs``, stored for :func:`sequence_parts`."""
    d_out = torch.tensor([[G.shape[2]] for _, G, _ in jobs], dtype=F64, device=device)
    d_in = torch.tensor([[A.shape[2] + ones] for A, _, ones in jobs], dtype=F64, device=device)  # [A, 1]: d_in + 1
    up = 1 + 2 * _gammas(torch.maximum(d_in, d_out) + (T + 2), work)  # row_norm_sums' rounding up
    out = gram_bound(n2, *_rounded_sums(g_rows, a_rows, up), d_out, d_in, T, work)
    finite = torch.isfinite(out).all(1).tolist()
    for k, (A, G, ones) in enumerate(jobs):
        sq = out[k] if finite[k] or work == F64 else _gram_sq_norms(A, G, F64, ones)  # overflow in ``work``
        _GRAMS[_pair_key(A, G, work, ones)] = (A, G, sq)


def _gram_sq_norms(A, G, work, ones: bool = False):
    """Gram form: the Grams in precision ``work``, their contraction in float64, plus the rounding bound
    (row norms by :func:`_gram_rows`); ``ones``: of ``[A, 1]`` (:func:`sequence_parts`)."""
    if _GRAMS is not None:
        got = _GRAMS.get(_pair_key(A, G, work, ones))
        if got is not None and got[0] is A and got[1] is G:
            return got[2]
    T, d_in, d_out = A.shape[1], A.shape[2] + ones, G.shape[2]
    gram = symmetric_gram(G, work)
    up = 1 + 2 * gamma(max(d_in, d_out) + T + 2, work)
    s, sg, sa = _rounded_sums(_gram_rows(G, gram, work), _input_rows(A, work, ones), up)
    n2 = contract(gram, _input_gram(A, work, ones))
    out = gram_bound(n2, s, sg, sa, d_out, d_in, T, work)
    if work != F64 and not bool(torch.isfinite(out).all()):  # overflow in the working precision
        return _gram_sq_norms(A, G, F64, ones)
    return out


def sequence_sq_norms(A, G, work_dtype=torch.float32):
    """Upper bounds of ``||G_i^T A_i||_F^2``, float64 ``(B,)``; ``A``: ``(B, T, d_in)``, ``G``: ``(B, T, d_out)``.

    ``work_dtype`` is the precision of the Grams and of the materialized products (at least float32)."""
    return sequence_parts(A, G, work_dtype)[0]


def sequence_parts(A, G, work_dtype=torch.float32, ones: bool = False):
    """``(sq, summed)``: :func:`sequence_sq_norms` and ``summed(f, dtype)`` = ``sum_i f_i G_i^T A_i``
    (``(d_out, d_in)``, ``dtype``; ``f`` float64 ``(B,)``), the way :func:`norm_plan` finds cheapest: with
    ``"keep"`` the sum is taken from the per-example gradients whose norms were taken, otherwise by
    book-keeping (:func:`sequence_weighted_sum`).

    ``ones``: ``sq`` also covers the layer's bias gradient ``b_i = sum_t g_{i,t}`` (``summed`` stays the
    weight's). In the Gram form the bias is folded in: the input is ``[A, 1]`` (a column of ones), so
    ``||(G_i^T A_i, b_i)||^2 = <G_i G_iᵀ, A_i A_iᵀ + 1>`` is one contraction, its bound that of ``d_in + 1``
    columns, and the bias's clipped sum is :func:`position_weighted_sum` (one product over examples and
    positions, as the weight's book-keeping); in the other forms (not taken for ``ones`` by the Linear rule,
    which folds only Gram-form layers) ``(||fl(b_i)|| + gamma_{T+1} sum_t ||g_t||)^2`` is added: ``fl(b_i)``
    summed in ``work_dtype`` is within ``gamma_{T-1} sum_t ||g_t||`` of ``b_i``, the float64 norms' rounding
    within the rest."""
    B, T, d_in = A.shape
    d_out = G.shape[2]

    def book_keeping(f, dtype, bias=None):
        return sequence_weighted_sum(A, G, f, dtype, bias)

    if B == 0:
        return torch.zeros(0, dtype=F64, device=A.device), book_keeping
    got = None if _GRAMS is None else _GRAMS.get(_pair_key(A, G, work_dtype, ones))
    if got is not None and got[0] is A and got[1] is G:  # formed by gram_norms (the Gram form): no plan again
        return got[2], book_keeping
    if ones and (T == 1 or _plan(A, G, work_dtype) != "gram"):
        sq, summed = sequence_parts(A, G, work_dtype)
        err = gamma(T + 1, work_dtype) * torch.linalg.vector_norm(G.to(F64), dim=2).sum(1)
        return sq + (rows_sq_norms(G.to(work_dtype).sum(1)).sqrt() + err) ** 2, summed
    if T == 1:
        a, g = A[:, 0].to(F64), G[:, 0].to(F64)
        sq = (a * a).sum(1) * (g * g).sum(1)
        return sq * (1 + gamma(max(d_in, d_out) + 2, F64)), book_keeping
    plan = _plan(A, G, work_dtype)
    if plan == "gram":
        return _gram_sq_norms(A, G, work_dtype, ones), book_keeping
    if plan == "keep":
        P, sq = _materialized(A, G, work_dtype)

        def kept(f, dtype, bias=None):
            fz = factors_toward_zero(f.to(P.device), P.dtype)
            return torch.mv(P.reshape(B, -1).t(), fz).reshape(d_out, d_in).to(dtype)

        return sq, kept
    out = torch.empty(B, dtype=F64, device=A.device)  # materialized, a chunk of examples at a time
    step = max(1, CHUNK_FLOATS // max(1, d_in * d_out))
    for lo in range(0, B, step):
        out[lo : lo + step] = _materialized(A[lo : lo + step], G[lo : lo + step], work_dtype)[1]
    return out, book_keeping


def _plan(A, G, work) -> str:
    """:func:`norm_plan` of a ``(B, T, d_in)`` input and ``(B, T, d_out)`` output gradient: the symmetric
    Grams' cost on the CPU, the input's Gram shared by the layers :func:`gram_norms` saw read it."""
    key = _memory_key(A, work, "share")
    share = 1 if key is None else _GRAMS.get(key, 1)
    return norm_plan(A.shape[1], A.shape[2], G.shape[2], syrk=A.device.type == "cpu", input_share=share)


def _materialized(A, G, work):
    """``(P, sq)``: the per-example gradients ``P_i = fl(G_i^T A_i)`` in ``work``, ``(B, d_out, d_in)``, and
    ``(||P_i|| + gamma_T s_i)^2`` (module docstring, "Materialized form"), float64 ``(B,)``."""
    T = A.shape[1]
    a, g = A.to(work), G.to(work)
    P = torch.bmm(g.transpose(1, 2), a)
    flat = P.reshape(P.shape[0], -1)
    rows = max(1, NORM_FLOATS // max(1, flat.shape[1]))  # the float64 copy a norm makes: a few rows at a time
    norm = torch.cat([torch.linalg.vector_norm(flat[lo : lo + rows], dim=1, dtype=F64)
                      for lo in range(0, flat.shape[0], rows)])
    inflate = 1 + 2 * gamma(max(A.shape[2], G.shape[2]) + T + 2, work)  # s in the working precision, rounded up
    s = _row_norm_products(a, g).to(F64) * inflate
    return P, (norm + gamma(T, work) * s) ** 2


def sequence_weighted_sum(A, G, f, dtype, bias: list | None = None):
    """``sum_i f_i G_i^T A_i`` (``(d_out, d_in)``, ``dtype``); ``f`` float64 ``(B,)``. ``bias``: a list to which
    :func:`position_weighted_sum` of ``G`` is appended (a folded bias's clipped sum), from the scaled output
    gradients where the product scales them (contiguous ``A``, ``G``, ``d_out <= d_in``: the same factors).

    One product over the flattened batch and positions: of ``A`` and ``G`` themselves when they are
    contiguous ``(B, T, d)`` (Linear); otherwise (transposed views, as the convolution rule passes) of
    contiguous copies of a chunk of examples at a time (at most :data:`CHUNK_FLOATS` floats of copies), each
    chunk's product added (a batched product of the examples summed afterwards ran 5-8x slower: ViT's patch
    embedding, issue 52). The factors scale the narrower of the two."""
    B, d_in, d_out = A.shape[0], A.shape[-1], G.shape[-1]
    if B == 0:
        return torch.zeros(d_out, d_in, dtype=dtype, device=A.device)
    fz = factors_toward_zero(f, dtype).view(-1, 1)
    scale_g = d_out <= d_in  # the factors multiply the narrower of the two

    def product(a, g, fa):
        n = a.shape[0]
        g, a = in_dtype(g, dtype), in_dtype(a, dtype)
        if scale_g:
            g = (g.contiguous().view(n, -1) * fa).view(-1, d_out)
            a = a.contiguous().view(-1, d_in)
        else:
            a = (a.contiguous().view(n, -1) * fa).view(-1, d_in)
            g = g.contiguous().view(-1, d_out)
        return g, a

    if A.is_contiguous() and G.is_contiguous():
        g, a = product(A, G, fz)
        if bias is not None:
            bias.append(g.sum(0) if scale_g else position_weighted_sum(G, f, dtype))
        return g.t().mm(a)
    if bias is not None:
        bias.append(position_weighted_sum(G, f, dtype))
    out = torch.zeros(d_out, d_in, dtype=dtype, device=A.device)
    step = max(1, CHUNK_FLOATS // max(1, A.shape[1] * (d_in + d_out)))
    for lo in range(0, B, step):
        g, a = product(A[lo : lo + step], G[lo : lo + step], fz[lo : lo + step])
        out.addmm_(g.t(), a)
    return out


def position_weighted_sum(G, f, dtype):
    """``sum_i f_i sum_t g_{i,t}`` (``(d,)``, ``dtype``) of ``G``: ``(B, T, d)`` and float64 factors ``f``
    (``(B,)``, rounded toward zero as the book-keeping's): a folded bias's clipped sum (:func:`sequence_parts`,
    ``ones``), one product over the examples and a sum over the positions in ``dtype`` -- the rounding of the
    whole sum, as the weight's book-keeping product (no per-example bias is formed)."""
    B, T, d = G.shape
    if B == 0:
        return torch.zeros(d, dtype=dtype, device=G.device)
    fz = factors_toward_zero(f.to(G.device), dtype)
    return torch.mv(in_dtype(G, dtype).reshape(B, T * d).t(), fz).view(T, d).sum(0)


def _cached(key, *held):
    """The value stored under ``key`` inside :func:`step_cache` for the very tensors ``held``, or None."""
    got = None if _GRAMS is None else _GRAMS.get(key)
    if got is None or any(a is not b for a, b in zip(got[:-1], held)):
        return None
    return got[-1]


def factors_toward_zero(f, dtype):
    """:func:`~dpmf.training.torch.clipping.toward_zero` of the clip factors ``f``, formed once per dtype
    inside :func:`step_cache` (every layer scales by the same factors)."""
    got = _cached(("toward_zero", id(f), dtype), f)
    if got is None:
        got = toward_zero(f, dtype)
        if _GRAMS is not None:
            _GRAMS[("toward_zero", id(f), dtype)] = (f, got)
    return got


def rows_sq_norms(rows):
    """``||r_i||^2`` in float64 of per-example rows ``(B, ...)`` of any float dtype (materialized small
    gradients; their float64 copy squared and summed), or what :func:`per_example_norms` formed for them."""
    got = _cached(("rows_sq", id(rows)), rows)
    if got is not None:
        return got
    r = rows.to(F64).reshape(rows.shape[0], -1)
    return (r * r).sum(1)


def _flat64(tensors, B: int, device):
    """The float64 ``(B, N)`` of per-example tensors side by side and their column offsets (cached inside
    :func:`step_cache` for the same list of tensors)."""
    key = ("flat64",) + tuple(id(t) for t in tensors)
    got = _cached(key, *tensors)
    if got is None:
        got = (torch.cat([t if t.ndim == 2 else t.reshape(B, -1) for t in tensors], dim=1).to(F64) if tensors else
               torch.zeros(B, 0, dtype=F64, device=device))
        if _GRAMS is not None:
            _GRAMS[key] = (*tensors, got)
    sizes = [t[0].numel() if B else 0 for t in tensors]
    return got, sizes


def _per_example_groups(tensors) -> dict:
    """Distinct float tensors of at least one row, by ``(B, device)``."""
    groups: dict = {}
    seen = set()
    for t in tensors:
        if id(t) in seen or t.ndim == 0 or t.shape[0] == 0 or t.device.type == "meta":
            continue
        seen.add(id(t))
        groups.setdefault((t.shape[0], t.device), []).append(t)
    return groups


def per_example_norms(tensors) -> None:
    """Inside :func:`step_cache`, :func:`rows_sq_norms` of every per-example tensor of ``tensors`` (biases,
    normalization layers: ``(B, *shape)``), found there by :func:`rows_sq_norms`. On the CPU tensor by tensor
    (a large one in one compiled pass, no float64 copy: :func:`compiled_form`; one float64 copy of all side by
    side, 2.4 MB in a ViT, was fresh memory every step); elsewhere all of them formed together: one float64
    copy side by side, squared, and summed per tensor (one ``index_add``). The same float64
    numbers as alone, summed in another order (float64 rounding, as before)."""
    if _GRAMS is None:
        return
    for (B, device), group in _per_example_groups(tensors).items():
        if device.type == "cpu":
            for t in group:
                if compiled_form(t):
                    r = _rows_array(t, B)
                    out = torch.empty(B, dtype=F64)
                    _row_dots(r, r, out.numpy())
                else:
                    r = t.reshape(B, -1).to(F64)
                    out = (r * r).sum(1)
                _GRAMS[("rows_sq", id(t))] = (t, out)
            continue
        flat, sizes = _flat64(group, B, device)
        which = torch.repeat_interleave(torch.arange(len(group), device=device), torch.tensor(sizes, device=device))
        sq = torch.zeros(B, len(group), dtype=F64, device=device).index_add_(1, which, flat * flat)
        for t, col in zip(group, sq.unbind(1)):
            _GRAMS[("rows_sq", id(t))] = (t, col)


def weighted_rows(rows, f):
    """``sum_i f_i r_i`` in float64, ``rows.shape[1:]``, of per-example rows ``(B, ...)`` and float64 factors
    ``f`` (``(B,)``), or what :func:`per_example_sums` formed for them."""
    got = _cached(("rows_sum", id(rows)), rows, f)
    if got is not None:
        return got
    return torch.tensordot(f.to(rows.device), rows.to(F64), dims=1)


def per_example_sums(tensors, f) -> None:
    """Inside :func:`step_cache`, :func:`weighted_rows` of every per-example tensor of ``tensors`` with the
    clip factors ``f``, found there by :func:`weighted_rows`: on the CPU tensor by tensor (a large one in one
    compiled pass, :func:`~dpmf.training.torch.ghost._norms_compiled.weighted_rows`), elsewhere one float64
    product with the float64 copy of :func:`per_example_norms`."""
    if _GRAMS is None:
        return
    for (B, device), group in _per_example_groups(tensors).items():
        if device.type == "cpu" and f.device.type == "cpu":
            for t in group:
                if compiled_form(t) and cpu_plain(f):
                    part = torch.empty(t.shape[1:], dtype=F64)
                    _weighted_rows(_rows_array(t, B), f.contiguous().numpy(), part.view(-1).numpy())
                else:
                    part = torch.mv(t.reshape(B, -1).t().to(F64), in_dtype(f, F64)).view(t.shape[1:])
                _GRAMS[("rows_sum", id(t))] = (t, f, part)
            continue
        flat, sizes = _flat64(group, B, device)
        sums = torch.mv(flat.t(), f.to(device))
        for t, part in zip(group, sums.split(sizes)):
            _GRAMS[("rows_sum", id(t))] = (t, f, part.view(t.shape[1:]))
