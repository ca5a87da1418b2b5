"""Train PyTorch models with correlated noise and a sound amplified epsilon.

Install with ``pip install 'dpmf[torch]'`` (the CPU build, ``torch==2.13.0``). ``import dpmf`` never
imports torch; importing this package without torch raises one :class:`ImportError` saying how to
install it.

One entry point in Opacus' vocabulary, :func:`make_private` (``module, optimizer, data_loader,
privacy``), and the pieces for your own loop:

* :class:`~dpmf.training.plan.ExecutionPlan` / :func:`~dpmf.training.plan.build_plan` - the frozen,
  certified description of the run (strategy, sampler, sigma, clip norm, normalizer, report);
* :class:`SchemeBatchSampler` / :func:`private_data_loader` - the scheme's batches as a data loader;
* :class:`Clipper` - what every clipper provides; :class:`PerExampleClipper` (per-example
  gradients, ``torch.func`` or Opacus' hooks) and :class:`GhostClipper` (ghost norms) implement it;
* :func:`correlated_noise` - the strategy's ``sigma * clip * (C^{-1} z)_t`` streamed in torch;
* :class:`DPOptimizer` - any optimizer, stepped with clipped sum + noise over a public normalizer;
* :class:`Privacy` - reports, ``get_epsilon``, checkpoints that resume bit for bit;
* :class:`IndividualAccounting` - DP-SGD with per-example GDP budgets (Gaussian-DP filter);
* :func:`per_example_causal_lm_loss` - each padded sequence's own token mean, then the batch.
"""

from dpmf.training.plan import ExecutionPlan, StepOutOfPlanError, build_plan, expected_batch_size
from dpmf.training.torch._deps import require_torch

require_torch()

from dpmf.training.torch.data import EmptyBatchCollate, SchemeBatchSampler, private_data_loader  # noqa: E402
from dpmf.training.torch.engine import Privacy, PrivateRun, ShardedBatchSampler, make_private  # noqa: E402
from dpmf.training.torch.ghost.clipper import GhostClipper  # noqa: E402
from dpmf.training.torch.clipping import ClippedGradients, Clipper  # noqa: E402
from dpmf.training.torch.grad_sample import PerExampleClipper  # noqa: E402
from dpmf.training.torch.individual import IndividualAccounting  # noqa: E402
from dpmf.training.torch.losses import per_example_causal_lm_loss  # noqa: E402
from dpmf.training.torch.noise import NoiseExhaustedError, TorchCorrelatedNoise, correlated_noise  # noqa: E402
from dpmf.training.torch.optimizer import DPOptimizer  # noqa: E402

__all__ = [
    "make_private",
    "PrivateRun",
    "Privacy",
    "DPOptimizer",
    "ExecutionPlan",
    "build_plan",
    "expected_batch_size",
    "StepOutOfPlanError",
    "SchemeBatchSampler",
    "ShardedBatchSampler",
    "private_data_loader",
    "EmptyBatchCollate",
    "PerExampleClipper",
    "GhostClipper",
    "ClippedGradients",
    "Clipper",
    "correlated_noise",
    "TorchCorrelatedNoise",
    "NoiseExhaustedError",
    "IndividualAccounting",
    "per_example_causal_lm_loss",
]
