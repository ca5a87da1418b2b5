"""Ghost clipping (``grad_sample_mode="ghost"``): per-example gradient norms from each layer's inputs
and output gradients, and the clipped sum by book-keeping, from one forward and one backward.

* :class:`GhostClipper` -- the clipper (:mod:`~dpmf.training.torch.ghost.clipper`);
* :data:`GHOST_RULES` / :func:`register_ghost_rule` -- the per-layer registry
  (:mod:`~dpmf.training.torch.ghost.registry`), with rules for Linear
  (:mod:`~dpmf.training.torch.ghost.linear`), Conv1d/Conv2d (:mod:`~dpmf.training.torch.ghost.conv`),
  Embedding (:mod:`~dpmf.training.torch.ghost.embedding`), LayerNorm, GroupNorm and RMSNorm
  (:mod:`~dpmf.training.torch.ghost.normalization`); other layers fall back to per-example gradients of
  that layer alone (:mod:`~dpmf.training.torch.ghost.fallback`).
"""

from dpmf.training.torch.ghost.clipper import GhostClipper, model_loss
from dpmf.training.torch.ghost.registry import GHOST_RULES, LayerCall, LayerGradients, register_ghost_rule, rule_for

__all__ = ["GhostClipper", "GHOST_RULES", "register_ghost_rule", "rule_for", "LayerCall", "LayerGradients", "model_loss"]
