"""The user mistakes :func:`dpmf.training.jax.make_private` catches where they are made (issue 51),
each one :class:`~dpmf.errors.InvalidParameterError` naming the argument, the value and what is valid,
instead of a ``ZeroDivisionError``, a reshape error or ``TypeError: grad requires real- or
complex-valued inputs`` from inside JAX at the first step.

* :func:`check_params` and :func:`check_microbatch_size`, at ``make_private``: every parameter is a
  floating array (gradients are taken with respect to all of them); ``microbatch_size`` is ``None``
  or a positive integer dividing the padded batch size.
* :func:`check_seed` and :func:`check_prng_key`: an integer seed ``>= 0``, a JAX key (a typed
  ``jax.random.key`` or a legacy ``uint32[2]`` ``PRNGKey``).
* :func:`checked_grad_fn`: the clipped-gradient function with one abstract call of ``loss_fn`` on a
  single example (``jax.eval_shape``: shapes only, no arithmetic) the first time a batch of a given
  shape arrives, so once per compilation: the loss must run on one example without its batch axis
  (and with one random key when it takes one, ``takes_rng=True``) and return a real scalar, or
  ``(scalar, aux)`` with ``has_aux=True`` (a vector, a pair without ``has_aux``, or a loss written for
  a batch, is named as such).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from dpmf.errors import DPMFError, InvalidParameterError
from dpmf.training.jax._deps import require_jax

jax, _optax, _jax_privacy = require_jax()

__all__ = ["check_params", "check_microbatch_size", "check_seed", "check_prng_key", "checked_grad_fn"]


def check_params(params) -> None:
    """Every leaf of ``params`` is a floating-point array (its path named otherwise)."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    if not leaves:
        raise InvalidParameterError("params must be a non-empty pytree of arrays")
    for path, leaf in leaves:
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or not jax.numpy.issubdtype(dtype, jax.numpy.floating):
            where = jax.tree_util.keystr(path) or "params"
            got = f"dtype {dtype}" if dtype is not None else f"a {type(leaf).__name__}"
            raise InvalidParameterError(
                f"params{where if where != 'params' else ''} has {got}: every parameter must be a floating-point "
                "array (gradients are taken with respect to all of them), e.g. jnp.asarray(p, jnp.float32); keep "
                "integer constants out of params (in loss_fn's closure)"
            )


def check_microbatch_size(microbatch_size, pad_multiple) -> int | None:
    """``None``, or a positive integer dividing ``pad_multiple`` (every batch is padded to a multiple of
    it, and jax_privacy splits a batch into whole microbatches)."""
    if microbatch_size is None:
        return None
    if isinstance(microbatch_size, bool) or not isinstance(microbatch_size, (int, np.integer)) or microbatch_size < 1:
        raise InvalidParameterError(
            f"microbatch_size must be a positive integer (examples per vmap) or None (the whole batch at once), "
            f"got {microbatch_size!r}"
        )
    if pad_multiple is not None and pad_multiple % microbatch_size:
        divisors = [d for d in range(1, int(pad_multiple) + 1) if pad_multiple % d == 0]
        raise InvalidParameterError(
            f"microbatch_size={microbatch_size} does not divide pad_multiple={pad_multiple}: batches are padded to a "
            f"multiple of pad_multiple and split into whole microbatches; use one of {divisors} (or a pad_multiple "
            f"that is a multiple of {microbatch_size})"
        )
    return int(microbatch_size)


def check_seed(seed) -> int:
    """An integer seed ``>= 0`` (dpmf never draws hidden seeds)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidParameterError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def check_prng_key(key):
    """``key`` as a typed JAX key: a ``jax.random.key(...)`` as it is, a legacy ``jax.random.PRNGKey``
    (``uint32[2]``) wrapped (the same random stream)."""
    dtype = getattr(key, "dtype", None)
    shape = tuple(getattr(key, "shape", (None,)))
    if dtype is not None and jax.numpy.issubdtype(dtype, jax.dtypes.prng_key) and shape == ():
        return key
    if dtype == np.uint32 and shape == (2,):
        return jax.random.wrap_key_data(key)
    raise InvalidParameterError(
        f"prng_key must be one JAX random key (jax.random.key(0), or jax.random.PRNGKey(0)), got "
        f"{type(key).__name__} of shape {shape} and dtype {dtype}"
    )


def _example_spec(batch):
    """The abstract value of one example of ``batch`` (its leading axis removed), or an error."""
    def one(x):
        shape = getattr(x, "shape", None)
        if shape is None or len(shape) == 0:
            raise InvalidParameterError(
                f"batch must be a pytree of arrays with a leading example axis, got a leaf {type(x).__name__} "
                f"of shape {shape}"
            )
        return jax.ShapeDtypeStruct(tuple(shape[1:]), x.dtype)

    return jax.tree.map(one, batch)


def _is_real_scalar(value) -> bool:
    leaves = jax.tree.leaves(value)
    return len(leaves) == 1 and tuple(leaves[0].shape) == () and jax.numpy.issubdtype(leaves[0].dtype,
                                                                                      jax.numpy.floating)


def _check_output(out, has_aux: bool) -> None:
    """``out`` (abstract) is one real scalar, or ``(real scalar, aux)`` with ``has_aux``."""
    def shapes(tree):
        return jax.tree.map(lambda s: f"{s.dtype}{list(s.shape)}", tree)

    if has_aux:
        if not (isinstance(out, (tuple, list)) and len(out) == 2 and _is_real_scalar(out[0])):
            raise InvalidParameterError(
                f"with has_aux=True, loss_fn must return (loss, aux) for one example, loss one real scalar, got "
                f"{shapes(out)}"
            )
        return
    if not _is_real_scalar(out):
        pair = isinstance(out, (tuple, list)) and len(out) == 2 and _is_real_scalar(out[0])
        raise InvalidParameterError(
            f"loss_fn(params, example) must return one real scalar for one example, got {shapes(out)}: "
            + ("it returns a pair (loss, aux): pass has_aux=True" if pair else
               "return the loss of that example alone (no per-position vector; sum or average inside the example; "
               "auxiliary outputs as (loss, aux) with has_aux=True)")
        )


def _check_loss(loss_fn: Callable, params, batch, microbatch_size: int | None, rng_args: tuple = (),
                has_aux: bool = False) -> None:
    """One abstract call of ``loss_fn`` on a single example of ``batch`` (and one key per
    ``rng_args``; see the module docstring)."""
    sizes = {getattr(x, "shape", (None,))[0] for x in jax.tree.leaves(batch)}
    if len(sizes) > 1:
        raise InvalidParameterError(f"batch: its arrays have different leading (example) sizes {sorted(sizes)}")
    size = next(iter(sizes), None)
    if microbatch_size is not None and size is not None and size % microbatch_size:
        raise InvalidParameterError(
            f"microbatch_size={microbatch_size} does not divide the batch size {size}: pad batches to a multiple of it "
            "(pad_multiple) or choose a microbatch_size dividing it"
        )
    example = _example_spec(batch)
    keys = tuple(jax.ShapeDtypeStruct(tuple(k.shape), k.dtype) for k in rng_args)  # one example's key: the same
    try:
        out = jax.eval_shape(loss_fn, params, example, *keys)
    except DPMFError:
        raise
    except Exception as exc:
        shapes = jax.tree.map(lambda s: tuple(s.shape), example)
        call = "loss_fn(params, example, rng)" if keys else "loss_fn(params, example)"
        hint = ("; with takes_rng=True it gets a third argument, the example's random key" if keys else
                "; a loss taking a random key (dropout) needs takes_rng=True and a key (prng_key= or seed=)")
        raise InvalidParameterError(
            f"{call} fails on one example (example shapes {shapes}, without the batch axis): "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. loss_fn is called per example "
            "(vmapped over the batch); a loss written for a whole batch (e.g. a mean over it) must be rewritten "
            f"for one example{hint if isinstance(exc, TypeError) else ''}"
        ) from exc
    _check_output(out, has_aux)


def checked_grad_fn(grad_fn: Callable, loss_fn: Callable, microbatch_size: int | None, *,
                    has_aux: bool = False) -> Callable:
    """``grad_fn`` that checks ``loss_fn`` on one example the first time a batch of a new shape comes
    (so inside ``jax.jit`` the check runs while tracing, never per step). Extra positional arguments
    (the step's random key) are passed on to ``grad_fn`` and, one example's worth, to the check."""
    seen: set = set()

    def checked(params, batch, *rng_args, is_padding_example=None):
        key = (jax.tree.structure(batch), tuple((getattr(x, "shape", None), str(getattr(x, "dtype", "")))
                                                for x in jax.tree.leaves(batch)))
        if key not in seen:
            _check_loss(loss_fn, params, batch, microbatch_size, rng_args, has_aux)
            seen.add(key)
        return grad_fn(params, batch, *rng_args, is_padding_example=is_padding_example)

    return checked
