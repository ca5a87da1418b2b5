"""Per-parameter *contributions*: what one call of one layer adds to a parameter's per-example
gradient, in a form whose norms and inner products can be taken without materializing it. A
parameter used by several calls -- weights tied between layers (GPT-2's ``wte`` / ``lm_head``), a
layer called twice in one forward -- has per-example gradient ``g_i = sum_k c_{k,i}`` over its
contributions, and

    ||g_i||^2 = sum_k ||c_{k,i}||^2 + 2 sum_{k<l} <c_{k,i}, c_{l,i}>,

which needs every pair's cross term (summing per-call norms would under-estimate: not a bound).

Two forms:

* :class:`PerExample` -- a materialized ``(B, *shape)`` tensor (biases, normalization layers, the
  fallback); inner products in float64.
* :class:`Factored` -- ``c_i = sum_t u_{i,t} v_{i,t}^T`` (a ``R x C`` matrix, reshaped to the parameter):
  ``u`` dense rows ``U`` (``B x T x R``) or one-hot rows given by indices (an embedding lookup: ``R`` the
  vocabulary), ``v`` dense rows ``V`` (``B x T x C``). Linear: ``U = G`` (output gradients),
  ``V = A`` (inputs); Hugging Face ``Conv1D`` (weight ``in x out``): ``U = A``, ``V = G``; Embedding:
  ``U`` = the token ids, ``V = G``. A list of factored contributions is one longer sequence (positions
  stacked), so

      ||sum_k c_k||^2 = sum_{k,l} <U_k U_l^T, V_k V_l^T>_F = sum_{s,t} (u_s . u_t)(v_s . v_t)

  over all stacked positions ``s, t`` (Li et al. 2021, arXiv 2110.05679, Sec. 4, for one call). With
  one-hot rows, ``u_s . u_t = [x_s = x_t]`` (two lookups) or ``U_l[t, x_s]`` (a lookup against a dense
  row: the tied embedding against ``lm_head``'s output gradient) -- exact, no rounding. So the cross
  term of GPT-2's tied weight is ``sum_{s,t} G_lm[s, x_t] (h_s . g_t)``: the ``lm_head`` output gradient
  at position ``s`` for the token looked up at ``t``, times the hidden state at ``s`` against the
  embedding's output gradient at ``t``.

Rounding (the norms are upper bounds of the exact norms of the computed ``U``, ``V``): the Gram blocks
are taken in the working precision and contracted in float64, with the error bound of
:func:`~dpmf.training.torch.ghost.sequence.gram_bound` for the stacked sequence (its ``s``, ``sum ||u||``,
``sum ||v||`` summed over the contributions; ``T + K`` positions in the float64 term, which also covers
adding the ``K^2`` block totals); float64 if the working precision overflows.
When materializing in float64 is cheaper (:func:`~dpmf.training.torch.ghost.sequence.norm_plan`) or a
contribution is materialized anyway, the summed
per-example gradient is formed in float64 (products of float32 numbers are exact there; the sums over
``T`` err by at most ``gamma_{T+K+2} s``, added to the norm).
"""

from __future__ import annotations

from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.ghost.registry import LayerGradients
from dpmf.training.torch.ghost.sequence import (
    CHUNK_FLOATS,
    F64,
    contract,
    factors_toward_zero,
    gamma,
    gram_bound,
    in_dtype,
    norm_plan,
    position_weighted_sum,
    row_norm_sums,
    rows_sq_norms,
    sequence_parts,
    sequence_weighted_sum,
    symmetric_gram,
    weighted_rows,
)

torch = require_torch()

__all__ = ["PerExample", "Factored", "joint_sq_norms", "joint_weighted_sum", "from_contributions", "zero_rows"]


class PerExample:
    """A materialized contribution: ``grads`` is ``(B, *param.shape)`` (any float dtype). ``folded_into``: a
    :class:`Factored` of the same call whose ``ones`` norm covers this one (a Linear layer's bias,
    ``grads = fl(sum_t U_t)``): :func:`from_contributions` then takes no norm of its own for it, and its clipped
    sum is :func:`~dpmf.training.torch.ghost.sequence.position_weighted_sum` of ``U``. ``grads`` may be a
    function of no argument, formed when first read (a folded bias reads it only when joined)."""

    def __init__(self, grads, folded_into: "Factored | None" = None) -> None:
        self._grads = grads
        self.folded_into = folded_into

    @property
    def grads(self):
        if callable(self._grads):
            self._grads = self._grads()
        return self._grads

    @property
    def batch(self) -> int:
        return self.grads.shape[0]

    def sq_alone(self):
        return rows_sq_norms(self.grads) if self.batch else torch.zeros(0, dtype=F64, device=self.grads.device)

    def weighted_sum(self, f, param):
        if self.batch == 0:
            return torch.zeros_like(param)
        return in_dtype(weighted_rows(self.grads, f), param.dtype)

    def without_rows(self, bad) -> "PerExample":
        """A copy whose ``bad`` examples contribute 0."""
        return PerExample(zero_rows(self.grads, bad))


def zero_rows(t, bad):
    """``t`` with the rows (dim 0) of the ``bad`` examples set to 0."""
    mask = bad.to(t.device).view(-1, *([1] * (t.ndim - 1)))
    return torch.where(mask, torch.zeros((), dtype=t.dtype, device=t.device), t)


class Factored:
    """``c_i = sum_t u_{i,t} v_{i,t}^T`` reshaped to the parameter (module docstring).

    ``U``: float ``(B, T, R)``, or integer ``(B, T)`` row indices into ``rows`` one-hot rows; ``V``:
    ``(B, T, C)``; ``keep``: optional bool ``(B, T)`` (index form only) -- positions that contribute
    (an embedding's ``padding_idx`` positions do not); ``work``: the working precision (at least float32);
    ``ones``: a bias ``sum_t u_t`` of the same call may be folded into this norm (:meth:`sq_alone`,
    ``fold``: the input ``[V, 1]``; dense ``U`` only).
    """

    def __init__(self, U, V, *, rows: int | None = None, keep=None, work=torch.float32, ones: bool = False) -> None:
        self.index = not U.is_floating_point()
        if self.index:
            if rows is None:
                raise ValueError("an index contribution needs rows=")
            if keep is not None:
                V = V * keep.unsqueeze(-1).to(V.dtype)
        self.U, self.V, self.keep, self.work = U, V, keep, work
        self.R = rows if self.index else U.shape[2]
        self.C = V.shape[2]
        self._alone_sum = None  # set by sq_alone: this contribution's own clipped sum
        self.ones = ones and not self.index

    @property
    def batch(self) -> int:
        return self.V.shape[0]

    def without_rows(self, bad) -> "Factored":
        """A copy whose ``bad`` examples contribute 0 (their rows zeroed: ``0 * inf`` would poison the rest)."""
        U = self.U if self.index else zero_rows(self.U, bad)
        return Factored(U, zero_rows(self.V, bad), rows=self.R if self.index else None, keep=self.keep,
                        work=self.work)

    @property
    def T(self) -> int:
        return self.V.shape[1]

    def row_norm_sums(self, work):
        """``(sum_t ||u_t|| ||v_t||, sum_t ||u_t||, sum_t ||v_t||)`` in ``work``, rounded up: float64 ``(B,)``."""
        if not self.index:
            return row_norm_sums(self.U, self.V, work, max(self.R, self.C))
        vn = torch.linalg.vector_norm(self.V.to(work), dim=2).sum(1).to(F64) * (1 + 2 * gamma(self.C + self.T + 2, work))
        ones = torch.full_like(vn, float(self.T))  # ||e_x|| = 1
        return vn, ones, vn

    def s(self, work):
        """``sum_t ||u_t|| ||v_t||`` in ``work``, rounded up: float64 ``(B,)``."""
        return self.row_norm_sums(work)[0]

    @property
    def sequence_pair(self):
        """``(A, G, work, ones)``: what :meth:`sq_alone` hands to
        :func:`~dpmf.training.torch.ghost.sequence.sequence_parts` (``None`` in index form), so that
        :func:`~dpmf.training.torch.ghost.sequence.gram_norms` can form many layers' norms at once first (with
        ``ones``: the norms :meth:`sq_alone` forms with ``fold``)."""
        return None if self.index else (self.V, self.U, self.work, self.ones)

    def sq_alone(self, fold: bool = False):
        """Upper bounds of ``||c_i||^2``; ``fold`` (dense ``U``): of ``||(c_i, sum_t u_t)||^2``, the bias of the
        same call folded in (:func:`~dpmf.training.torch.ghost.sequence.sequence_parts`, ``ones``)."""
        if not self.index:  # the clipped sum of this contribution alone: as its norms' plan says
            sq, self._alone_sum = sequence_parts(self.V, self.U, self.work, fold)
            return sq
        # exact grouping: sum_v ||sum_{t: x_t = v} g_t||^2, the rows summed in float64
        B, R = self.batch, self.R
        idx = self.U.reshape(B, -1)
        V = self.V.reshape(B, -1, self.C)
        if V.device.type == "cpu" and V.dtype in (torch.float32, torch.float64) and idx.shape[1] and B:
            from dpmf.training.torch.ghost._index_compiled import grouped_sq_norms

            keep = torch.ones_like(idx, dtype=torch.bool) if self.keep is None else self.keep.reshape(B, -1)
            out = torch.empty(B, dtype=F64)
            grouped_sq_norms(idx.contiguous().numpy(), keep.contiguous().numpy(), V.contiguous().numpy(), out.numpy())
            return out
        return self._grouped_sq_norms_tensors()

    def _grouped_sq_norms_tensors(self):
        """:meth:`sq_alone` of the index form by tensor operations (any device)."""
        B, R = self.batch, self.R
        idx = self.U.reshape(B, -1)
        example = torch.arange(B, device=idx.device).unsqueeze(1).expand_as(idx)
        keep = torch.ones_like(idx, dtype=torch.bool) if self.keep is None else self.keep.reshape(B, -1)
        key = example[keep] * R + idx[keep]
        uniq, inverse = torch.unique(key, return_inverse=True)
        grouped = torch.zeros(uniq.shape[0], self.C, dtype=F64, device=self.V.device).index_add_(
            0, inverse, self.V.reshape(B, -1, self.C)[keep].to(F64))
        return torch.zeros(B, dtype=F64, device=self.V.device).index_add_(0, uniq // R, (grouped * grouped).sum(1))

    def weighted_sum(self, f, param, *, alone: bool = False, bias: list | None = None):
        """``sum_i f_i c_i`` in ``param``'s dtype and shape; ``alone``: after :meth:`sq_alone`, from what it
        formed (the kept per-example gradients, when its plan kept them). ``bias`` (dense ``U``): a list to which
        ``sum_i f_i sum_t u_{i,t}`` may be appended, a folded bias's clipped sum (from the book-keeping product's
        scaled rows: :func:`~dpmf.training.torch.ghost.sequence.sequence_weighted_sum`)."""
        if not self.index:
            if alone and self._alone_sum is not None:
                return self._alone_sum(f.to(self.V.device), param.dtype, bias).reshape(param.shape)
            return sequence_weighted_sum(self.V, self.U, f.to(self.V.device), param.dtype, bias).reshape(param.shape)
        B = self.batch
        idx, V = self.U.reshape(B, -1), self.V.reshape(B, -1, self.C)
        scale = factors_toward_zero(f.to(V.device), param.dtype).view(-1, 1, 1)
        if self.keep is not None:
            keep = self.keep.reshape(B, -1)
            rows, vals = idx[keep], (V.to(param.dtype) * scale)[keep]
        else:
            rows, vals = idx.reshape(-1), (V.to(param.dtype) * scale).reshape(-1, self.C)
        out = torch.zeros(self.R, self.C, dtype=param.dtype, device=param.device).index_add_(0, rows, vals)
        return out.reshape(param.shape)

    def materialize64(self, lo: int, hi: int):
        """``c_i`` for examples ``lo:hi`` in float64, ``(hi - lo, R, C)``."""
        V = self.V[lo:hi].to(F64)
        if not self.index:
            return torch.bmm(self.U[lo:hi].to(F64).transpose(1, 2), V)
        b = V.shape[0]
        out = torch.zeros(b * self.R, self.C, dtype=F64, device=V.device)
        rows = (self.U[lo:hi].reshape(b, -1) + torch.arange(b, device=V.device).unsqueeze(1) * self.R).reshape(-1)
        if self.keep is not None:
            keep = self.keep[lo:hi].reshape(-1)
            return out.index_add_(0, rows[keep], V.reshape(-1, self.C)[keep]).reshape(b, self.R, self.C)
        return out.index_add_(0, rows, V.reshape(-1, self.C)).reshape(b, self.R, self.C)


def _u_gram(a: Factored, b: Factored, work):
    """``(u_{a,s} . u_{b,t})`` for all ``s, t``: ``(B, T_a, T_b)`` in ``work`` (exact for one-hot rows)."""
    B = a.batch
    if a.index and b.index:
        return (a.U.reshape(B, -1, 1) == b.U.reshape(B, 1, -1)).to(work)
    if a.index:  # e_{x_s} . u_t = U_b[t, x_s]
        idx = a.U.reshape(B, 1, -1).expand(B, b.T, a.T)
        return b.U.to(work).gather(2, idx).transpose(1, 2)
    if b.index:
        return _u_gram(b, a, work).transpose(1, 2)
    if a is b:
        return symmetric_gram(a.U, work)
    return torch.bmm(a.U.to(work), b.U.to(work).transpose(1, 2))


def _v_gram(a: Factored, b: Factored, work):
    """``(v_{a,s} . v_{b,t})`` for all ``s, t``: ``(B, T_a, T_b)`` in ``work``."""
    if a is b:
        return symmetric_gram(a.V, work)
    return torch.bmm(a.V.to(work), b.V.to(work).transpose(1, 2))


def _gram_joint(fac: list, work):
    B = fac[0].batch
    T = sum(c.T for c in fac)
    K = len(fac)
    R, C = fac[0].R, fac[0].C
    device = fac[0].V.device
    z = lambda: torch.zeros(B, dtype=F64, device=device)  # noqa: E731
    n2, s, su, sv = z(), z(), z(), z()
    for k, a in enumerate(fac):
        s_k, su_k, sv_k = a.row_norm_sums(work)
        s, su, sv = s + s_k, su + su_k, sv + sv_k
        for b in fac[k:]:
            twice = 1 if b is a else 2  # the (l, k) block is the transpose of (k, l)
            n2 += twice * contract(_u_gram(a, b, work), _v_gram(a, b, work))
    return gram_bound(n2, s, su, sv, R, C, T + K, work)


def joint_sq_norms(contribs: list):
    """Upper bounds of ``||sum_k c_{k,i}||^2``, float64 ``(B,)`` (module docstring)."""
    if len(contribs) == 1:
        return contribs[0].sq_alone()
    B = contribs[0].batch
    device = (contribs[0].grads if isinstance(contribs[0], PerExample) else contribs[0].V).device
    if B == 0:
        return torch.zeros(0, dtype=F64, device=device)
    fac = [c for c in contribs if isinstance(c, Factored)]
    per = [c for c in contribs if isinstance(c, PerExample)]
    T = sum(c.T for c in fac)
    if fac and not per and norm_plan(T, fac[0].R, fac[0].C, keep=False, float64=True,
                                     syrk=device.type == "cpu") == "gram":
        work = fac[0].work
        for c in fac[1:]:
            work = torch.promote_types(work, c.work)
        out = _gram_joint(fac, work)
        if not bool(torch.isfinite(out).all()) and work != F64:  # overflow in the working precision
            out = _gram_joint(fac, F64)
        return out
    # materialized: the summed per-example gradient in float64, a chunk of examples at a time
    numel = (per[0].grads[0].numel() if per else fac[0].R * fac[0].C)
    step = max(1, CHUNK_FLOATS // max(1, numel))
    s = torch.zeros(B, dtype=F64, device=device)
    for c in fac:
        s += c.s(F64)
    err = gamma(T + len(contribs) + 2, F64)
    out = torch.empty(B, dtype=F64, device=device)
    for lo in range(0, B, step):
        hi = min(B, lo + step)
        P = torch.zeros(hi - lo, numel, dtype=F64, device=device)
        for c in per:
            P += c.grads[lo:hi].reshape(hi - lo, -1).to(F64)
        for c in fac:
            P += c.materialize64(lo, hi).reshape(hi - lo, -1)
        out[lo:hi] = (torch.linalg.vector_norm(P, dim=1) + err * s[lo:hi]) ** 2
    return out


def joint_weighted_sum(contribs: list, f, param):
    """``sum_i f_i sum_k c_{k,i}`` in ``param``'s dtype and shape."""
    out = None
    for c in contribs:
        s = c.weighted_sum(f, param)
        out = s if out is None else out + s
    return out


def from_contributions(contributions: dict, params: dict) -> LayerGradients:
    """The :class:`~dpmf.training.torch.ghost.registry.LayerGradients` of one call whose parameters
    ``name -> contribution`` each have one contribution: squared norms added over the parameters,
    clipped sums from the same contributions. Keeps ``contributions`` for joint use (tied weights,
    repeated calls): the squared norms are formed only if read (a joined call never reads them). A
    :class:`PerExample` ``folded_into`` a :class:`Factored` of the same call has its norm in that one's
    (``fold``): one Gram contraction for a Linear layer's weight and bias."""
    members = {id(c) for c in contributions.values()}  # (by identity: the contributions are held here)
    folded = {id(c) for c in contributions.values() if isinstance(c, PerExample)
              and isinstance(c.folded_into, Factored) and c.folded_into.ones and id(c.folded_into) in members}
    hosts = {id(c.folded_into) for c in contributions.values() if id(c) in folded}

    def sq():
        out = None
        for c in contributions.values():
            if id(c) in folded:
                continue  # in its host's norm
            x = c.sq_alone(fold=True) if id(c) in hosts else c.sq_alone()
            out = x if out is None else out + x
        return out

    def weighted_sum(f):
        out, biases = {}, {}
        for name, c in contributions.items():
            if isinstance(c, Factored):
                held = [] if id(c) in hosts else None
                out[name] = c.weighted_sum(f, params[name], alone=True, bias=held)
                if held:
                    biases[id(c)] = held[0]
        for name, c in contributions.items():
            if id(c) in folded:  # its norm in the host's; its sum over positions of the host's U
                b = biases.get(id(c.folded_into))
                if b is None or b.dtype != params[name].dtype:
                    b = position_weighted_sum(c.folded_into.U, f, params[name].dtype)
                out[name] = b.reshape(params[name].shape)
            elif not isinstance(c, Factored):
                out[name] = c.weighted_sum(f, params[name])
        return {name: out[name] for name in contributions}

    return LayerGradients(sq, weighted_sum, contributions=dict(contributions))
