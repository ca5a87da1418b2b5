"""Ghost clipping (``grad_sample_mode="ghost"``): per-example gradient norms from each layer's inputs
and output gradients, and the clipped sum by book-keeping, from one forward and one backward.

* :class:`GhostClipper` -- the clipper (:mod:`~dpmf.training.torch.ghost.clipper`);
* :data:`GHOST_RULES` / :func:`register_ghost_rule` -- the per-layer registry
  (:mod:`~dpmf.training.torch.ghost.registry`), with rules for Linear
  (:mod:`~dpmf.training.torch.ghost.linear`), Conv1d/Conv2d (:mod:`~dpmf.training.torch.ghost.conv`),
  Embedding (:mod:`~dpmf.training.torch.ghost.embedding`), LayerNorm, GroupNorm and RMSNorm
  (:mod:`~dpmf.training.torch.ghost.normalization`), Hugging Face ``Conv1D`` and RMSNorm-like layers
  (:mod:`~dpmf.training.torch.ghost.hf`); other layers fall back to per-example gradients of
  that layer alone (:mod:`~dpmf.training.torch.ghost.fallback`);
* :class:`Factored` / :class:`PerExample` / :func:`from_contributions` -- what a rule returns so that
  a parameter used by several calls (tied weights, a layer called twice) gets exact cross terms
  (:mod:`~dpmf.training.torch.ghost.joint`);
* the loop's detached parameters kept in the graph, so that ``torch.autograd.grad`` on them is refused
  with a dpmf error naming ``clipper.plain()`` (:mod:`~dpmf.training.torch.ghost.detached`).
"""

from dpmf.training.torch.ghost.clipper import GhostClipper, model_loss
from dpmf.training.torch.ghost.joint import Factored, PerExample, from_contributions
from dpmf.training.torch.ghost.registry import GHOST_RULES, LayerCall, LayerGradients, register_ghost_rule, rule_for

__all__ = ["GhostClipper", "GHOST_RULES", "register_ghost_rule", "rule_for", "LayerCall", "LayerGradients", "model_loss",
           "Factored", "PerExample", "from_contributions"]
