"""Train PyTorch models with correlated noise and a sound amplified epsilon.

Install with ``pip install 'dpmf[torch]'`` (the CPU build, ``torch==2.13.0``). ``import dpmf`` never
imports torch; importing this package without torch raises one :class:`ImportError` saying how to
install it.

One entry point in Opacus' vocabulary, :func:`make_private` (``module, optimizer, data_loader,
privacy``), and the pieces for your own loop:

* :class:`~dpmf.training.run_spec.RunSpec` / :func:`~dpmf.training.run_spec.build_run_spec` - the frozen,
  certified description of the run (strategy, sampler, sigma, clip norm, normalizer, report);
* :class:`SchemeBatchSampler` / :func:`private_data_loader` - the scheme's batches as a data loader;
* :class:`Clipper` - what every clipper provides; :class:`PerExampleClipper` (per-example
  gradients, ``torch.func`` or Opacus' hooks) and :class:`GhostClipper` (ghost norms) implement it;
* :func:`correlated_noise` - the strategy's ``sigma * clip * (C^{-1} z)_t`` streamed in torch;
* :class:`DPOptimizer` - any optimizer, stepped with clipped sum + noise over a public normalizer;
* :class:`Privacy` - reports, ``get_epsilon``, checkpoints that resume bit for bit;
* :class:`IndividualAccounting` - DP-SGD with per-example GDP budgets (Gaussian-DP filter);
* :func:`per_example_causal_lm_loss` - each padded sequence's own token mean, then the batch;
* :func:`per_example_seq2seq_loss` - the same for an encoder-decoder's aligned (unshifted) labels;
* :func:`time_first` - declares an ``nn.RNN``/``GRU``/``LSTM(batch_first=False)`` called on
  ``(time, batch, features)``, when time steps may equal the batch size.
"""

from dpmf.training.run_spec import RunSpec, StepOutOfPlanError, build_run_spec, expected_batch_size
from dpmf.training.torch._deps import require_torch

require_torch()

from dpmf.training.torch.data import EmptyBatchCollate, SchemeBatchSampler, private_data_loader  # noqa: E402
from dpmf.training.torch.engine import Privacy, PrivateRun, ShardedBatchSampler, make_private  # noqa: E402
from dpmf.training.torch.ghost.clipper import GhostClipper  # noqa: E402
from dpmf.training.torch.clipping import ClippedGradients, Clipper  # noqa: E402
from dpmf.training.torch.grad_sample import PerExampleClipper  # noqa: E402
from dpmf.training.torch.individual import IndividualAccounting  # noqa: E402
from dpmf.training.torch.losses import per_example_causal_lm_loss, per_example_seq2seq_loss  # noqa: E402
from dpmf.training.torch.noise import NoiseExhaustedError, TorchCorrelatedNoise, correlated_noise  # noqa: E402
from dpmf.training.torch.optimizer import DPOptimizer  # noqa: E402
from dpmf.training.torch.recurrent import time_first  # noqa: E402

__all__ = [
    "make_private",
    "PrivateRun",
    "Privacy",
    "DPOptimizer",
    "RunSpec",
    "build_run_spec",
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
    "per_example_seq2seq_loss",
    "time_first",
]

#: names before the run description became :class:`RunSpec` (documented; each warns on use)
_DEPRECATED = {"ExecutionPlan": RunSpec, "build_plan": build_run_spec}


def __getattr__(name: str):
    if name in _DEPRECATED:
        import warnings

        new = _DEPRECATED[name].__name__
        warnings.warn(f"dpmf.training.torch.{name} is deprecated: use dpmf.training.torch.{new}",
                      DeprecationWarning, stacklevel=2)
        return _DEPRECATED[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
