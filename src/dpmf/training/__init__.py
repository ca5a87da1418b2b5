"""Framework integrations: train with correlated noise, with the batches, the noise and the epsilon
coming from the same objects (DESIGN.md, ``training/``).

* :mod:`dpmf.training.torch` - PyTorch (install with ``pip install 'dpmf[torch]'``).
* :mod:`dpmf.training.jax` - JAX through jax_privacy and optax (``pip install 'dpmf[jax]'``); both
  adapters build the same framework-free :mod:`dpmf.training.run_spec`.

Nothing here is imported by ``import dpmf``; each framework is imported only when its subpackage is.
"""
