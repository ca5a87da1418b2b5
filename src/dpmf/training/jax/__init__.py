"""Train JAX models with dpmf's strategies, samplers and certified noise, through jax_privacy and optax.

Install with ``pip install 'dpmf[jax]'``. ``import dpmf`` never imports JAX; importing this
package without it raises one :class:`ImportError` saying how to install it. A bridge, not a second
framework: jax_privacy clips per example (``clipped_grad``, ``vmap``) and adds the noise (its
matrix-factorization privatizer, an ``optax`` transformation); dpmf supplies the strategy's
noising matrix, the batches of a :class:`~dpmf.sampling.SamplingScheme` and the certified sigma
(the framework-free :class:`~dpmf.training.run_spec.RunSpec`, as for PyTorch).

* :func:`make_private` - loss, params, dataset size, strategy, sampler, target -> the optax
  transformation, the clipped-gradient function, the jitted steps (with their loss values,
  :class:`StepOutput`), the batch iterator and the privacy report;
* :func:`correlated_privatizer` / :func:`noising_matrix` - a dpmf strategy as jax_privacy's noise;
* :class:`SchemeBatches` - a scheme's batches as (padded) index arrays for a JAX input pipeline;
* :mod:`dpmf.training.jax.config` - a jax_privacy configuration (strategy object, batch selection,
  noise multiplier) read into dpmf objects, accounted and calibrated by dpmf, and compared with
  jax_privacy's own accounting.
"""

from dpmf._lazy import attach
from dpmf.training.jax._deps import require_jax

require_jax()

#: public name -> the submodule that defines it (imported on first use, :mod:`dpmf._lazy`)
_EXPORTS = {
    "make_private": ".engine",
    "PrivateRun": ".engine",
    "Privacy": ".engine",
    "StepOutput": ".engine",
    "StepOutOfPlanError": ".engine",
    "SchemeBatches": ".data",
    "scheme_batches": ".data",
    "correlated_privatizer": ".noise",
    "noising_matrix": ".noise",
    "streaming_matrix": ".noise",
    "account_jax_privacy": ".config",
    "calibrate_jax_privacy": ".config",
    "jax_privacy_noise_multiplier": ".config",
    "scheme_from_jax_privacy": ".config",
    "strategy_from_jax_privacy": ".config",
    "as_dpmf_strategy": ".config",
    "compare_with_jax_privacy": ".config",
    "jax_privacy_epsilon": ".config",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = attach(__name__, _EXPORTS, globals())
