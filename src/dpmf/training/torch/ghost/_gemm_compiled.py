"""A small float32 matrix product for the compiled recurrent loops (numba), with explicit 16-lane vectors.

The recurrent rules' loops call a product per time step (``h_{t-1} W_hh^T`` in the forward, ``dg_t W_hh`` in
the backward through time) and one per example (the kept per-example gradients ``A_b^T G_b``), each small
(``64 x 64`` by ``64 x 256``). Through numba's ``np.dot`` they run on SciPy's OpenBLAS, whose kernel is chosen
by the environment (``OPENBLAS_CORETYPE``; AVX2 kernels where it names Haswell) at about 40 G multiply-adds a
second on one core here; PyTorch's own LSTM runs oneDNN's AVX-512 kernels. :func:`gemm` is a register-blocked
product written with LLVM vector values (``<16 x float>``, one ``llvm.fma`` per lane group): a ``4 x 64``
block of the result in 16 vector accumulators, the right factor's row loaded as four vectors and each left
entry broadcast (``4 x 32`` and ``4 x 16`` blocks for narrower panels; column panels outside, rows inside, so a
panel of the right factor stays in cache); where the CPU has AVX-512 each vector is one register and this ran
at 60-110 G multiply-adds a second on the products above (1.3-3.6x OpenBLAS' Haswell kernels). Tails: rows one
at a time, columns one at a time.

Rounding: every entry is ``sum_k a_{m,k} b_{k,n}`` accumulated in ``k`` order by fused multiply-adds (one
rounding a step), so the standard bound ``|fl - exact| <= gamma_K sum_k |a_{m,k}| |b_{k,n}|`` holds, as for
any BLAS (:mod:`~dpmf.training.torch.ghost.sequence`'s bounds assume no more).

:func:`applies`: float32 only (a float64 product takes :func:`numpy.dot`), and only where the host CPU has
AVX-512 and numba compiles for it (elsewhere the 16 accumulators of 16 lanes would spill: the callers then
keep ``np.dot``).

Callers compiled with ``cache=True`` in other modules (``_recurrent_compiled``) hold this code inlined, and
numba's cache checks only a function's own file: after changing this module, clear their cached entries
(``__pycache__/_recurrent_compiled.*.nb*``).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, overload, register_model

__all__ = ["applies", "gemm", "product"]


class _F32x16(types.Type):
    """16 float32 lanes (an LLVM vector value: kept in a register by the compiler)."""

    def __init__(self) -> None:
        super().__init__(name="dpmf_f32x16")


_f32x16 = _F32x16()
_VT = ir.VectorType(ir.FloatType(), 16)


@register_model(_F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type) -> None:
        super().__init__(dmm, fe_type, _VT)


@intrinsic
def _vzero(typingctx):
    def codegen(context, builder, signature, args):
        return ir.Constant(_VT, [0.0] * 16)

    return _f32x16(), codegen


def _lane_pointer(context, builder, arrty, arr, idx):
    """A ``<16 x float>*`` to element ``idx`` (counted from the array's data pointer, in elements)."""
    ary = context.make_array(arrty)(context, builder, arr)
    return builder.bitcast(builder.gep(ary.data, [idx]), _VT.as_pointer())


@intrinsic
def _vload(typingctx, arr, idx):
    """16 consecutive float32 of ``arr`` from element ``idx`` (past its data pointer; any layout)."""

    def codegen(context, builder, signature, args):
        return builder.load(_lane_pointer(context, builder, signature.args[0], args[0], args[1]), align=4)

    return _f32x16(arr, idx), codegen


@intrinsic
def _vstore(typingctx, arr, idx, v):
    def codegen(context, builder, signature, args):
        builder.store(args[2], _lane_pointer(context, builder, signature.args[0], args[0], args[1]), align=4)
        return context.get_dummy_value()

    return types.void(arr, idx, v), codegen


@intrinsic
def _vfma(typingctx, s, w, c):
    """``c + s * w`` lane by lane (one rounding), ``s`` a float32 broadcast to every lane."""

    def codegen(context, builder, signature, args):
        s, w, c = args
        i32 = ir.IntType(32)
        sv = builder.insert_element(ir.Constant(_VT, ir.Undefined), s, ir.Constant(i32, 0))
        sv = builder.shuffle_vector(sv, ir.Constant(_VT, ir.Undefined), ir.Constant(ir.VectorType(i32, 16), [0] * 16))
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VT, [_VT, _VT, _VT]), "llvm.fma.v16f32")
        return builder.call(fma, [sv, w, c])

    return _f32x16(s, w, c), codegen


@nb.njit(cache=True, nogil=True, inline="always")
def _start(out, o, acc):  # pragma: no cover - compiled
    return _vload(out, o) if acc else _vzero()


@nb.njit(cache=True, nogil=True)
def _tile4x64(a, b, out, m, j, acc, rb, ro):  # pragma: no cover - compiled
    """``out[m:m + 4, j:j + 64]``: 16 vector accumulators, per ``k`` four loads of ``b``'s row and four broadcasts."""
    K = a.shape[1]
    o = m * ro + j
    c00, c01, c02, c03 = _start(out, o, acc), _start(out, o + 16, acc), _start(out, o + 32, acc), _start(out, o + 48, acc)
    o += ro
    c10, c11, c12, c13 = _start(out, o, acc), _start(out, o + 16, acc), _start(out, o + 32, acc), _start(out, o + 48, acc)
    o += ro
    c20, c21, c22, c23 = _start(out, o, acc), _start(out, o + 16, acc), _start(out, o + 32, acc), _start(out, o + 48, acc)
    o += ro
    c30, c31, c32, c33 = _start(out, o, acc), _start(out, o + 16, acc), _start(out, o + 32, acc), _start(out, o + 48, acc)
    for k in range(K):
        base = k * rb + j
        w0, w1, w2, w3 = _vload(b, base), _vload(b, base + 16), _vload(b, base + 32), _vload(b, base + 48)
        s = a[m, k]
        c00, c01, c02, c03 = _vfma(s, w0, c00), _vfma(s, w1, c01), _vfma(s, w2, c02), _vfma(s, w3, c03)
        s = a[m + 1, k]
        c10, c11, c12, c13 = _vfma(s, w0, c10), _vfma(s, w1, c11), _vfma(s, w2, c12), _vfma(s, w3, c13)
        s = a[m + 2, k]
        c20, c21, c22, c23 = _vfma(s, w0, c20), _vfma(s, w1, c21), _vfma(s, w2, c22), _vfma(s, w3, c23)
        s = a[m + 3, k]
        c30, c31, c32, c33 = _vfma(s, w0, c30), _vfma(s, w1, c31), _vfma(s, w2, c32), _vfma(s, w3, c33)
    o = m * ro + j
    _vstore(out, o, c00), _vstore(out, o + 16, c01), _vstore(out, o + 32, c02), _vstore(out, o + 48, c03)
    o += ro
    _vstore(out, o, c10), _vstore(out, o + 16, c11), _vstore(out, o + 32, c12), _vstore(out, o + 48, c13)
    o += ro
    _vstore(out, o, c20), _vstore(out, o + 16, c21), _vstore(out, o + 32, c22), _vstore(out, o + 48, c23)
    o += ro
    _vstore(out, o, c30), _vstore(out, o + 16, c31), _vstore(out, o + 32, c32), _vstore(out, o + 48, c33)


@nb.njit(cache=True, nogil=True)
def _tile4x32(a, b, out, m, j, acc, rb, ro):  # pragma: no cover - compiled
    """``out[m:m + 4, j:j + 32]``: 8 vector accumulators (independent chains enough to keep both FMA units busy)."""
    K = a.shape[1]
    o = m * ro + j
    c00, c01, c10, c11 = _start(out, o, acc), _start(out, o + 16, acc), _start(out, o + ro, acc), _start(out, o + ro + 16, acc)
    o += 2 * ro
    c20, c21, c30, c31 = _start(out, o, acc), _start(out, o + 16, acc), _start(out, o + ro, acc), _start(out, o + ro + 16, acc)
    for k in range(K):
        base = k * rb + j
        w0, w1 = _vload(b, base), _vload(b, base + 16)
        s = a[m, k]
        c00, c01 = _vfma(s, w0, c00), _vfma(s, w1, c01)
        s = a[m + 1, k]
        c10, c11 = _vfma(s, w0, c10), _vfma(s, w1, c11)
        s = a[m + 2, k]
        c20, c21 = _vfma(s, w0, c20), _vfma(s, w1, c21)
        s = a[m + 3, k]
        c30, c31 = _vfma(s, w0, c30), _vfma(s, w1, c31)
    o = m * ro + j
    _vstore(out, o, c00), _vstore(out, o + 16, c01), _vstore(out, o + ro, c10), _vstore(out, o + ro + 16, c11)
    o += 2 * ro
    _vstore(out, o, c20), _vstore(out, o + 16, c21), _vstore(out, o + ro, c30), _vstore(out, o + ro + 16, c31)


@nb.njit(cache=True, nogil=True)
def _tile4x16(a, b, out, m, j, acc, rb, ro):  # pragma: no cover - compiled
    """``out[m:m + 4, j:j + 16]``."""
    K = a.shape[1]
    o = m * ro + j
    c0, c1, c2, c3 = _start(out, o, acc), _start(out, o + ro, acc), _start(out, o + 2 * ro, acc), _start(out, o + 3 * ro, acc)
    for k in range(K):
        w0 = _vload(b, k * rb + j)
        c0, c1, c2, c3 = _vfma(a[m, k], w0, c0), _vfma(a[m + 1, k], w0, c1), _vfma(a[m + 2, k], w0, c2), _vfma(
            a[m + 3, k], w0, c3)
    _vstore(out, o, c0), _vstore(out, o + ro, c1), _vstore(out, o + 2 * ro, c2), _vstore(out, o + 3 * ro, c3)


@nb.njit(cache=True, nogil=True)
def _tile1x16(a, b, out, m, j, acc, rb, ro):  # pragma: no cover - compiled
    """``out[m, j:j + 16]``."""
    K = a.shape[1]
    o = m * ro + j
    c = _start(out, o, acc)
    for k in range(K):
        c = _vfma(a[m, k], _vload(b, k * rb + j), c)
    _vstore(out, o, c)


@nb.njit(cache=True, nogil=True)
def _panel(a, b, out, j, width, acc, rb, ro):  # pragma: no cover - compiled
    """Columns ``j .. j + width - 1`` (``width`` 64, 32 or 16) of every row: rows in fours, then one at a time.
    Column panels outside, rows inside, so the panel of ``b`` (``K x width``) stays in cache over the rows."""
    M = a.shape[0]
    m = 0
    while m + 4 <= M:
        if width == 64:
            _tile4x64(a, b, out, m, j, acc, rb, ro)
        elif width == 32:
            _tile4x32(a, b, out, m, j, acc, rb, ro)
        else:
            _tile4x16(a, b, out, m, j, acc, rb, ro)
        m += 4
    while m < M:
        for jj in range(j, j + width, 16):
            _tile1x16(a, b, out, m, jj, acc, rb, ro)
        m += 1


@nb.njit(cache=True, nogil=True)
def _scalar(a, b, out, m0, m1, j0, acc):  # pragma: no cover - compiled
    """Rows ``m0 .. m1 - 1``, columns from ``j0``: the same ``k``-ordered sums, one entry at a time."""
    K = a.shape[1]
    for m in range(m0, m1):
        for j in range(j0, b.shape[1]):
            s = out[m, j] if acc else np.float32(0)
            for k in range(K):
                s = s + a[m, k] * b[k, j]
            out[m, j] = s


@nb.njit(cache=True, nogil=True)
def gemm(a, b, out, acc):  # pragma: no cover - compiled
    """``out = a @ b`` (``acc``: ``out += a @ b``), float32: ``a`` ``(M, K)`` any strides, ``b`` ``(K, N)`` and
    ``out`` ``(M, N)`` with contiguous rows (any row stride); ``out`` must not overlap ``a`` or ``b``. Every entry
    summed in ``k`` order by fused multiply-adds (the module docstring)."""
    M = a.shape[0]
    if b.strides[1] != 4 or out.strides[1] != 4:  # (rows not contiguous: the plain loop)
        _scalar(a, b, out, 0, M, 0, acc)
        return
    rb = b.strides[0] // 4
    ro = out.strides[0] // 4
    N = b.shape[1]
    j = 0
    while j + 64 <= N:
        _panel(a, b, out, j, 64, acc, rb, ro)
        j += 64
    if j + 32 <= N:
        _panel(a, b, out, j, 32, acc, rb, ro)
        j += 32
    if j + 16 <= N:
        _panel(a, b, out, j, 16, acc, rb, ro)
        j += 16
    _scalar(a, b, out, 0, M, j, acc)


def product(a, b, out, acc, simd):  # pragma: no cover - replaced in compiled code (overload below)
    """In compiled code: ``out = a @ b`` (``acc``: ``out += a @ b``) by :func:`gemm` where ``simd`` and the arrays
    are float32, else by ``np.dot`` (``out`` C-contiguous then). Chosen by dtype when compiled, so a float64
    caller compiles no vector code."""
    raise NotImplementedError("compiled code only")


@overload(product, jit_options={"cache": True, "nogil": True})
def _product(a, b, out, acc, simd):
    if a.dtype == b.dtype == out.dtype == types.float32:
        def impl(a, b, out, acc, simd):  # pragma: no cover - compiled
            if simd:
                gemm(a, b, out, acc)
            elif acc:
                out += np.dot(a, b)
            else:
                np.dot(a, b, out)
        return impl

    def impl(a, b, out, acc, simd):  # pragma: no cover - compiled
        if acc:
            out += np.dot(a, b)
        else:
            np.dot(a, b, out)
    return impl


def applies() -> bool:
    """Whether :func:`gemm` is the product to use here: numba compiles for this host (no ``NUMBA_CPU_NAME``),
    whose CPU has AVX-512 (a 16-lane vector in one register)."""
    global _APPLIES
    if _APPLIES is None:
        from llvmlite import binding as ll
        from numba.core import config

        try:
            _APPLIES = not config.CPU_NAME and bool(ll.get_host_cpu_features().get("avx512f", False))
        except (AttributeError, RuntimeError, OSError):  # (a build without the query: keep np.dot)
            _APPLIES = False
    return _APPLIES


_APPLIES: bool | None = None
