"""A float64 per-example reference for ghost clipping on whole models (imported by the test modules
beside it): each example alone through ``torch.autograd.grad``, clipped by the clipper's own factors."""

from __future__ import annotations

import torch

from dpmf.training.torch.clipping import clip_factors
from dpmf.training.torch.ghost import GhostClipper


def split(inputs: dict, i: int) -> dict:
    return {k: v[i:i + 1] for k, v in inputs.items()}


def reference(model, inputs: dict, loss, batch: int, clip: float, margin: float):
    """``(sum_i f_i g_i, n_i)``: ``loss(model(**one), i)`` is example ``i``'s loss, differentiated alone."""
    params = [p for p in model.parameters() if p.requires_grad]
    per, norms = [], []
    for i in range(batch):
        grads = torch.autograd.grad(loss(model(**split(inputs, i)), i), params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
        per.append(grads)
        norms.append(torch.sqrt(sum((g * g).sum() for g in grads)))
    norms = torch.stack(norms)
    f = clip_factors(norms, clip, margin)
    return [sum(f[i] * per[i][k] for i in range(batch)) for k in range(len(params))], norms


def ghost_step(model, inputs: dict, loss, clip: float):
    """One loop step in ghost mode: ``loss(model(**inputs), None)`` is the batch's mean loss."""
    clipper = GhostClipper(model, None, clip)
    try:
        loss(model(**inputs), None).backward()
        sums, norms, backwards = clipper.collect()
        assert backwards == 1
        return clipper, sums, norms
    finally:
        clipper.close()


def check(model, inputs: dict, loss, batch: int, rtol: float = 1e-6):
    """Ghost clipping at the median norm equals the float64 reference: clipped sums within ``rtol``, norms
    within ``1e-9`` and never below. Returns the clipper (closed) for its layer reports."""
    _, _, norms = ghost_step(model, inputs, loss, 1e9)
    clip = float(norms.median())
    clipper, sums, norms = ghost_step(model, inputs, loss, clip)
    want_sums, want_norms = reference(model, inputs, loss, batch, clip, clipper.margin)
    assert (norms >= want_norms * (1 - 1e-12)).all(), (norms - want_norms) / want_norms
    assert torch.allclose(norms, want_norms, rtol=1e-9)
    assert (want_norms > clip).sum() >= 1 and (want_norms < clip).sum() >= 1  # both sides of the clip
    flat = torch.cat([s.flatten() for s in sums])
    want = torch.cat([w.flatten() for w in want_sums])
    assert float((flat - want).norm() / want.norm()) < rtol
    for name, s, w in zip(clipper.param_names, sums, want_sums):
        assert torch.allclose(s, w, rtol=rtol, atol=1e-3 * rtol * float(want.abs().max())), name
    return clipper
