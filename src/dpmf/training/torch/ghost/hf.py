"""Ghost rules for the layers of Hugging Face ``transformers`` models, registered without importing it.

* ``transformers.pytorch_utils.Conv1D`` (GPT-2's attention and MLP projections): a transposed Linear,
  ``y = x W + b`` with ``W`` of shape ``(in, out)``, so example ``i``'s weight gradient is
  ``A_i^T G_i = sum_t a_{i,t} g_{i,t}^T`` -- the Linear rule with the roles of ``A`` and ``G`` swapped
  (a :class:`~dpmf.training.torch.ghost.joint.Factored` contribution with ``U = A``, ``V = G``). Registered
  by its qualified name, and only for that class's own ``forward`` (a subclass that changes it falls back).
* RMSNorm-style layers: every model family defines its own class (``LlamaRMSNorm``, ``MistralRMSNorm``,
  ``Qwen2RMSNorm``, ``GemmaRMSNorm``, ``T5LayerNorm``, ...). A layer is recognized by what it is -- a
  class name containing ``RMSNorm`` (or ``T5LayerNorm``), one trainable 1-D ``weight`` and a float
  ``variance_epsilon`` or ``eps`` -- and then by what it computed: the rule recomputes
  ``xhat = x / sqrt(mean(x^2) + eps)`` over the last dimension from the recorded input as those classes
  do (the mean square in float32; the rest in float32 and cast back to the input's dtype, Llama, or in
  the input's dtype, T5) and accepts the
  call only if the recorded output equals ``w * xhat`` (Llama, T5) or ``(1 + w) * xhat`` (Gemma) to within
  the rounding of the output's dtype (the closest of these forms is used). Either way the weight's gradient is ``sum_t xhat_{i,t} * g_{i,t}``
  (materialized, ``B x d``, normed in float64 from the very tensor that is summed). Any other call --
  another formula, an output changed in place, a bias -- goes to the fallback, which is exact.
"""

from __future__ import annotations

from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.ghost.joint import Factored, PerExample, from_contributions
from dpmf.training.torch.ghost.registry import GHOST_MATCHERS, register_ghost_rule

torch = require_torch()

__all__ = ["hf_conv1d_rule", "rms_norm_like_rule", "is_rms_norm_like"]


@register_ghost_rule("transformers.pytorch_utils.Conv1D")
def hf_conv1d_rule(module, call, trainable):
    x, g = call.input, call.grad_output
    w = module.weight
    if not isinstance(x, torch.Tensor) or x.ndim < 2 or w.ndim != 2:
        return None
    B = x.shape[0]
    d_in, d_out = w.shape
    A = x.reshape(B, -1, d_in)
    G = g.reshape(B, -1, d_out)
    contributions = {}
    if "weight" in trainable:  # grad W = A^T G = sum_t a_t g_t^T: U = A, V = G
        contributions["weight"] = Factored(A, G, work=torch.promote_types(w.dtype, torch.float32))
    if "bias" in trainable:
        contributions["bias"] = PerExample(G.to(torch.promote_types(trainable["bias"].dtype, torch.float32)).sum(1))
    return from_contributions(contributions, trainable)


def _epsilon(module):
    for attr in ("variance_epsilon", "eps"):
        v = getattr(module, attr, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
            return float(v)
    return None


def is_rms_norm_like(module) -> bool:
    """A layer that looks like an RMSNorm (the rule still checks what it computed)."""
    name = type(module).__name__
    if "RMSNorm" not in name and not name.endswith("T5LayerNorm"):
        return False
    w = getattr(module, "weight", None)
    own = dict(module.named_parameters(recurse=False))
    return (isinstance(w, torch.nn.Parameter) and w.ndim == 1 and set(own) == {"weight"}
            and _epsilon(module) is not None)


def _normalized(x, w, eps: float) -> tuple:
    """``xhat`` as the Hugging Face classes compute it, the mean square always in float32: Llama-style,
    all in float32 and cast back to the input's dtype; T5-style, the input's own precision times the
    float32 ``rsqrt`` (cast to a half-precision weight's dtype). Equal for float32 inputs; the rule keeps
    the one that reproduces the layer's output best (a float64 T5 differs from the other by 1e-8)."""
    x32 = x.to(torch.float32)
    r = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    llama = (x32 * r).to(x.dtype)
    t5 = x * r
    if w.dtype in (torch.float16, torch.bfloat16):
        t5 = t5.to(w.dtype)
    return (llama,) if x.dtype == torch.float32 else (llama, t5)


def _abs_max(t) -> float:
    """``max |t|`` (0 for an empty tensor, NaN if ``t`` holds one), from one min/max pass."""
    if not t.numel():
        return 0.0
    lo, hi = torch.aminmax(t)
    return float(torch.maximum(-lo, hi))


def rms_norm_like_rule(module, call, trainable):
    x, y = call.input, call.outputs[0] if call.outputs else None
    w = module.weight
    if (not isinstance(x, torch.Tensor) or x.ndim < 2 or not isinstance(y, torch.Tensor) or y.shape != x.shape
            or x.shape[-1] != w.shape[0] or "weight" not in trainable):
        return None
    if not y.is_floating_point():
        return None
    work = torch.promote_types(x.dtype, torch.float32)
    # the layer's own rounding (float32 inside, cast to the output dtype): a few ulps of the output's dtype
    tol = 16 * max(torch.finfo(y.dtype).eps, torch.finfo(torch.float32).eps)
    y = y.detach().to(work)
    scale = _abs_max(y)
    ww = w.detach().to(work)
    best = None
    for xhat in _normalized(x, w, _epsilon(module)):
        xhat = xhat.to(work)
        for s in (ww, 1 + ww):
            err = _abs_max(torch.addcmul(y, xhat, s, value=-1))
            # allclose(xhat * s, y, rtol=tol, atol=tol * scale), decided by err alone unless it lies between
            # atol (every entry passes) and atol + rtol * scale (no entry can pass): one pass, not seven
            close = err <= tol * scale or (err <= 2 * tol * scale and torch.allclose(xhat * s, y, rtol=tol,
                                                                                        atol=tol * scale))
            if close and (best is None or err < best[0]):
                best = (err, xhat)
            if best is not None and best[0] == 0:
                break  # (reproduced exactly: no other form can be closer)
        if best is not None and best[0] == 0:
            break
    if best is None:
        return None
    xhat = best[1]
    g = call.grad_output.to(work)
    B = x.shape[0]
    per = (xhat * g).reshape(B, -1, x.shape[-1]).sum(1)
    return from_contributions({"weight": PerExample(per)}, trainable)


GHOST_MATCHERS.append((is_rms_norm_like, rms_norm_like_rule))


# the clipper may run these layers on detached parameters (their outputs are plain tensors)
hf_conv1d_rule.detachable = True
rms_norm_like_rule.detachable = True
