"""dpmf.training.jax.make_private catches the user's mistakes where they are made (issue 51): each is
one InvalidParameterError naming the argument, the value and what is valid, instead of a
ZeroDivisionError, a reshape error or a raw JAX error at the first step."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax_privacy")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

from dpmf.errors import InvalidParameterError  # noqa: E402
from dpmf.sampling import PoissonSampling  # noqa: E402
from dpmf.strategies import Identity  # noqa: E402
from dpmf.training.jax import make_private  # noqa: E402

M, FEATURES, CLASSES = 64, 4, 3
_rng = np.random.default_rng(1)
X = _rng.normal(size=(M, FEATURES)).astype(np.float32)
Y = (np.arange(M) % CLASSES).astype(np.int32)


def loss(params, example):
    x, y = example
    return -jax.nn.log_softmax(x @ params["w"] + params["b"])[y]


def _params(dtype=jnp.float32):
    return {"w": jnp.zeros((FEATURES, CLASSES), dtype), "b": jnp.zeros(CLASSES)}


def _make(loss_fn=loss, params=None, **kw):
    return make_private(loss_fn, _params() if params is None else params, M, optimizer=optax.sgd(0.1),
                        strategy=Identity(4), sampling=PoissonSampling(0.25, 4), delta=1e-5, max_grad_norm=1.0,
                        noise_multiplier=2.0, accountant="unamplified", seed=0, **kw)


def _first_step(run):
    params = _params()
    batch = next(iter(run.batches))
    return run.step(params, run.tx.init(params), (X[batch.indices], Y[batch.indices]), batch.is_padding)


def test_a_correct_run_steps():
    params, _ = _first_step(_make(microbatch_size=8))
    assert float(jnp.abs(params["w"]).sum()) > 0  # it moved: noise and gradients reached it


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_microbatch_size_must_be_a_positive_integer(bad):
    with pytest.raises(InvalidParameterError, match=rf"microbatch_size must be a positive integer .*got {bad!r}"):
        _make(microbatch_size=bad)


def test_microbatch_size_must_divide_the_padding():
    with pytest.raises(InvalidParameterError, match=r"microbatch_size=5 does not divide pad_multiple=32.*\[1, 2, 4, 8"):
        _make(microbatch_size=5)


def test_microbatch_size_must_divide_an_unpadded_batch():
    run = _make(microbatch_size=7, pad_multiple=None)
    batches = iter(run.batches)
    batch = next(b for b in batches if len(b.indices) % 7)
    params = _params()
    with pytest.raises(InvalidParameterError, match=rf"microbatch_size=7 does not divide the batch size {len(batch.indices)}"):
        run.step(params, run.tx.init(params), (X[batch.indices], Y[batch.indices]), batch.is_padding)


def test_integer_parameters_are_named():
    with pytest.raises(InvalidParameterError, match=r"params\['w'\] has dtype int32: every parameter must be a floating"):
        _make(params=_params(jnp.int32))


def test_a_loss_returning_a_vector_is_named():
    def per_class(params, example):
        x, _ = example
        return -jax.nn.log_softmax(x @ params["w"] + params["b"])

    with pytest.raises(InvalidParameterError, match=r"must return one real scalar for one example, got float32\[3\]"):
        _first_step(_make(per_class))


def test_a_loss_written_for_a_batch_is_named():
    def batch_mean(params, batch):
        x, y = batch
        logp = jax.nn.log_softmax(x @ params["w"] + params["b"])
        return -jnp.mean(logp[jnp.arange(x.shape[0]), y])

    with pytest.raises(InvalidParameterError, match=r"fails on one example \(example shapes \(\(4,\), \(\)\).*written "
                                                    r"for a whole batch"):
        _first_step(_make(batch_mean))


def test_the_grad_fn_checks_too_and_only_once_per_shape():
    calls = []

    def counted(params, example):
        calls.append(1)
        return loss(params, example)

    run = _make(counted)
    mask = np.zeros(8, dtype=bool)
    run.grad_fn(_params(), (X[:8], Y[:8]), is_padding_example=mask)
    first = len(calls)
    run.grad_fn(_params(), (X[8:16], Y[8:16]), is_padding_example=mask)
    assert len(calls) - first == first - 1  # the second call of the same shape skips the one abstract check


def test_aux_and_rng_mismatches_are_named():
    """A (loss, aux) pair without has_aux, a scalar with it, a loss taking a key without takes_rng
    and the reverse: each named with the flag that fixes it (issue 52)."""
    def with_aux(params, example):
        return loss(params, example), {"y": example[1]}

    def with_rng(params, example, rng):
        return loss(params, example) * jax.random.uniform(rng)

    with pytest.raises(InvalidParameterError, match=r"must return one real scalar.*returns a pair \(loss, aux\): "
                                                    r"pass has_aux=True"):
        _first_step(_make(with_aux))
    with pytest.raises(InvalidParameterError, match=r"with has_aux=True, loss_fn must return \(loss, aux\)"):
        _first_step(_make(loss, has_aux=True))
    with pytest.raises(InvalidParameterError, match=r"loss_fn\(params, example\) fails.*TypeError.*needs takes_rng=True"):
        _first_step(_make(with_rng))
    with pytest.raises(InvalidParameterError, match=r"loss_fn\(params, example, rng\) fails.*TypeError.*third argument"):
        _first_step(_make(loss, takes_rng=True))
    with pytest.raises(InvalidParameterError, match="has_aux must be True or False"):
        _make(loss, has_aux="yes")
    mask = np.zeros(8, dtype=bool)
    with pytest.raises(InvalidParameterError, match=r"pass grad_fn\(\.\.\., rng=<key>\)"):
        _make(with_rng, takes_rng=True).grad_fn(_params(), (X[:8], Y[:8]), is_padding_example=mask)
    with pytest.raises(InvalidParameterError, match="pass takes_rng=True"):
        _make().grad_fn(_params(), (X[:8], Y[:8]), is_padding_example=mask, rng=jax.random.key(0))
    g = _make(with_rng, takes_rng=True).grad_fn(_params(), (X[:8], Y[:8]), is_padding_example=mask,
                                                 rng=jax.random.key(0))
    assert g["w"].shape == (FEATURES, CLASSES)
