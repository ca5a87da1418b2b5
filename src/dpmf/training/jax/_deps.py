"""The one place that imports JAX, optax and jax_privacy for :mod:`dpmf.training.jax` and says how
to install them."""

from __future__ import annotations

INSTALL_HINT = "pip install 'dpmf[jax]'  (jax==0.10.2, jaxlib==0.10.2, jax-privacy==2.0.0, optax==0.2.8)"


def require_jax():
    """Return ``(jax, optax, jax_privacy)``, or raise one clear :class:`ImportError` saying how to
    get them."""
    try:
        import jax
        import jax_privacy
        import optax
    except ImportError as exc:  # pragma: no cover - exercised where the extra is not installed
        raise ImportError(f"dpmf.training.jax needs JAX, optax and jax_privacy: {INSTALL_HINT}") from exc
    return jax, optax, jax_privacy
