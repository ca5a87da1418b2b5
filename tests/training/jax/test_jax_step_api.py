"""What a JAX training loop needs from dpmf.training.jax.make_private beyond the clipped sum (issue 52
item 6): a loss with auxiliary outputs (has_aux), a per-step random key for dropout (takes_rng,
derived from prng_key= and the step index), the loss values of each step (train_step -> StepOutput),
jax_privacy's own strategy objects, and a step past the plan refused on the host.

References are computed independently: per-example losses in float64 numpy with the dropout masks
drawn from the documented keys (fold_in(fold_in(prng_key, 2), t), split over the batch), and
jax_privacy's own privatizer for a BufferedToeplitz. Models are tiny (a few compiles per test)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax_privacy")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402
from jax_privacy import noise_addition  # noqa: E402
from jax_privacy.matrix_factorization import banded  # noqa: E402
from jax_privacy.matrix_factorization.buffered_toeplitz import BufferedToeplitz  # noqa: E402

from dpmf.errors import InvalidParameterError  # noqa: E402
from dpmf.sampling import PoissonSampling  # noqa: E402
from dpmf.strategies import Identity  # noqa: E402
from dpmf.training.jax import make_private, strategy_from_jax_privacy  # noqa: E402
from dpmf.training.jax.noise import correlated_privatizer  # noqa: E402
from dpmf.training.run_spec import StepOutOfPlanError  # noqa: E402

M, F, H, C = 48, 3, 5, 2
STEPS = 4
KEEP = 0.5
_rng = np.random.default_rng(11)
X = _rng.normal(size=(M, F)).astype(np.float32)
Y = (np.arange(M) % C).astype(np.int32)
P0 = {"w1": jnp.asarray(_rng.normal(size=(F, H)), jnp.float32), "w2": jnp.asarray(_rng.normal(size=(H, C)), jnp.float32)}


def dropout_loss(params, example, rng):
    """Cross-entropy of a one-hidden-layer net with dropout on the hidden units; aux: the mask, the logits."""
    x, y = example
    h = jax.nn.relu(x @ params["w1"])
    keep = jax.random.bernoulli(rng, KEEP, h.shape)
    logits = jnp.where(keep, h / KEEP, 0.0) @ params["w2"]
    return -jax.nn.log_softmax(logits)[y], {"keep": keep, "logits": logits}


def plain_loss(params, example):
    x, y = example
    return -jax.nn.log_softmax(jax.nn.relu(x @ params["w1"]) @ params["w2"])[y]


def _make(loss_fn, strategy=None, **kw):
    kw.setdefault("noise_multiplier", 1.0)
    if "seed" not in kw:
        kw.setdefault("prng_key", jax.random.key(7))
    return make_private(loss_fn, P0, M, optimizer=optax.sgd(0.1), strategy=strategy or Identity(STEPS),
                        sampling=PoissonSampling(0.25, STEPS), delta=1e-5, max_grad_norm=1.0,
                        accountant="unamplified", pad_multiple=16, **kw)


def _batch(b):
    return (X[b.indices], Y[b.indices]), b.is_padding


def _reference_losses(params, indices, keys):
    """float64 per-example losses with the masks drawn from ``keys`` (one per row), and the masks."""
    w1, w2 = (np.asarray(params[k], np.float64) for k in ("w1", "w2"))
    out, masks = [], []
    for i, key in zip(indices, keys):
        keep = np.asarray(jax.random.bernoulli(key, KEEP, (H,)))
        h = np.maximum(X[i].astype(np.float64) @ w1, 0.0)
        z = np.where(keep, h / KEEP, 0.0) @ w2
        out.append(np.log(np.sum(np.exp(z - z.max()))) + z.max() - z[Y[i]])
        masks.append(keep)
    return np.array(out), np.array(masks)


def _step_keys(prng_key, t, size):
    """The documented keys of step ``t``: fold_in(fold_in(prng_key, 2), t), split over the batch."""
    return jax.random.split(jax.random.fold_in(jax.random.fold_in(prng_key, 2), t), size)


def test_dropout_losses_and_aux_equal_a_direct_computation():
    """has_aux + takes_rng: each step's per-example losses and masks are those of the documented keys
    (float64 reference), padding rows are 0, the mean is over the real examples; and the masks change
    from step to step (and from example to example)."""
    run = _make(dropout_loss, has_aux=True, takes_rng=True)
    params, state = P0, run.tx.init(P0)
    masks = []
    for b in run.batches:
        before = params
        batch, pad = _batch(b)
        params, state, out = run.train_step(params, state, batch, pad)
        assert int(out.step) == b.step
        ref, keep = _reference_losses(before, b.indices, _step_keys(jax.random.key(7), b.step, len(b.indices)))
        real = ~b.is_padding
        assert real.any() and (~real).any()  # both kinds of rows are checked
        np.testing.assert_allclose(np.asarray(out.losses)[real], ref[real], rtol=2e-5, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(out.losses)[~real], 0.0)
        np.testing.assert_allclose(float(out.loss), ref[real].mean(), rtol=2e-5)
        np.testing.assert_array_equal(np.asarray(out.aux["keep"])[real], keep[real])
        assert not np.asarray(out.aux["keep"])[~real].any() and out.aux["logits"].shape == (len(b.indices), C)
        masks.append(np.asarray(out.aux["keep"])[real][0])
        assert len({m.tobytes() for m in keep[real]}) > 1  # examples of one step get different masks
    assert len({m.tobytes() for m in masks}) > 1  # the first example's mask differs between steps


def test_same_key_same_run_other_key_other_masks():
    def train(run):
        params, state, outs = P0, run.tx.init(P0), []
        for b in run.batches:
            params, state, out = run.train_step(params, state, *_batch(b))
            outs.append(np.asarray(out.aux["keep"]))
        return params, outs

    p1, m1 = train(_make(dropout_loss, has_aux=True, takes_rng=True))
    p2, m2 = train(_make(dropout_loss, has_aux=True, takes_rng=True))
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(m1, m2):
        np.testing.assert_array_equal(a, b)
    _, m3 = train(_make(dropout_loss, has_aux=True, takes_rng=True, prng_key=jax.random.key(8)))
    assert any(a.shape != b.shape or not np.array_equal(a, b) for a, b in zip(m1, m3))


def test_resumed_run_draws_the_same_dropout_masks(tmp_path):
    run = _make(dropout_loss, has_aux=True, takes_rng=True)
    params, state = P0, run.tx.init(P0)
    outs = []
    for k in range(STEPS):
        if k == 2:  # between steps: two batches drawn, two noise steps taken
            run.privacy.save_checkpoint(tmp_path / "ck.npz", params, state)
        params, state, out = run.train_step(params, state, *_batch(next(run.batches)))
        outs.append(out)
    again = _make(dropout_loss, has_aux=True, takes_rng=True)
    p, s = again.privacy.load_checkpoint(tmp_path / "ck.npz", P0, again.tx.init(P0))
    for b, ref in zip(again.batches, outs[2:]):
        p, s, out = again.train_step(p, s, *_batch(b))
        np.testing.assert_array_equal(np.asarray(out.aux["keep"]), np.asarray(ref.aux["keep"]))
        np.testing.assert_array_equal(np.asarray(out.losses), np.asarray(ref.losses))
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_has_aux_leaves_the_clipped_sum_and_the_step_unchanged():
    """A loss returning (loss, aux) trains exactly as the same loss without aux; step and
    train_step are the same update; loss values of a plain loss equal the loss at the old params."""
    def with_aux(params, example):
        return plain_loss(params, example), {"y": example[1]}

    runs = [_make(plain_loss, seed=3), _make(with_aux, seed=3, has_aux=True), _make(plain_loss, seed=3)]
    idx, pad = np.arange(16), np.arange(16) >= 13
    g0 = runs[0].grad_fn(P0, (X[idx], Y[idx]), is_padding_example=pad)
    g1 = runs[1].grad_fn(P0, (X[idx], Y[idx]), is_padding_example=pad)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    states = [r.tx.init(P0) for r in runs]
    params = [P0, P0, P0]
    for batches in zip(*(r.batches for r in runs)):
        before = params[0]
        params[0], states[0] = runs[0].step(params[0], states[0], *_batch(batches[0]))
        params[1], states[1], out1 = runs[1].train_step(params[1], states[1], *_batch(batches[1]))
        params[2], states[2], out2 = runs[2].train_step(params[2], states[2], *_batch(batches[2]))
        b = batches[0]
        real = ~b.is_padding
        direct = np.array([float(plain_loss(before, (X[i], Y[i]))) for i in b.indices[real]])
        np.testing.assert_allclose(np.asarray(out2.losses)[real], direct, rtol=1e-5)
        np.testing.assert_array_equal(np.asarray(out1.aux["y"])[real], Y[b.indices[real]])
        assert out2.aux is None
    for a, b, c in zip(*(jax.tree.leaves(p) for p in params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))


def test_a_step_past_the_plan_raises_and_changes_nothing():
    run = _make(plain_loss, seed=0)
    params, state = P0, run.tx.init(P0)
    batches = list(run.batches)
    for b in batches:
        params, state = run.step(params, state, *_batch(b))
    with pytest.raises(StepOutOfPlanError, match=rf"step {STEPS} is outside the plan.*{STEPS} steps"):
        run.step(params, state, *_batch(batches[0]))
    with pytest.raises(StepOutOfPlanError, match=f"{STEPS} steps"):
        run.train_step(params, state, *_batch(batches[0]))
    copied = jax.tree.map(jnp.array, state)  # another array object: the counter is read from the device
    with pytest.raises(StepOutOfPlanError):
        run.step(params, copied, *_batch(batches[0]))
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))
    fresh = run.tx.init(P0)  # a new state (another run on the same plan) steps again
    p, _ = run.step(P0, fresh, *_batch(batches[0]))
    assert np.isfinite(np.asarray(p["w1"])).all()
    # inside a caller's jit the host cannot check: the step still traces (the noise's NaN guard remains)
    p, s = jax.jit(run.step)(P0, run.tx.init(P0), *_batch(batches[0]))
    assert int(s[0].count) == 1 and np.isfinite(np.asarray(p["w1"])).all()


def test_jax_privacy_strategy_objects_give_the_converted_noise():
    """BufferedToeplitz and ColumnNormalizedBanded are taken as they are: the noise equals that of
    the dpmf strategy strategy_from_jax_privacy converts them to, bit for bit, and the BLT's equals
    jax_privacy's own privatizer with the same key (float32)."""
    blt = BufferedToeplitz(buf_decay=jnp.array([0.9, 0.4]), output_scale=jnp.array([0.3, 0.2]))
    cnb = banded.ColumnNormalizedBanded.default(STEPS, 2)
    zeros = jnp.zeros(6)

    def noise(tx, k=STEPS):
        state, out = tx.init(zeros), []
        for _ in range(k):
            w, state = tx.update(zeros, state)
            out.append(np.asarray(w))
        return np.array(out)

    got = {}
    for name, obj in (("blt", blt), ("banded", cnb)):
        got[name] = noise(correlated_privatizer(obj, noise_multiplier=1.3, max_grad_norm=0.5, seed=4, steps=STEPS))
        ref = noise(correlated_privatizer(strategy_from_jax_privacy(obj, STEPS), noise_multiplier=1.3,
                                          max_grad_norm=0.5, seed=4))
        np.testing.assert_array_equal(got[name], ref)
        assert np.all(got[name] != 0)
    theirs = noise(noise_addition.matrix_factorization_privatizer(blt.inverse_as_streaming_matrix(), stddev=1.3 * 0.5,
                                                                  prng_key=jax.random.key(4)))
    np.testing.assert_allclose(got["blt"], theirs, rtol=1e-5, atol=1e-6)
    with pytest.raises(InvalidParameterError, match="BufferedToeplitz has no number of steps.*strategy_from_jax_privacy"):
        correlated_privatizer(blt, noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
    with pytest.raises(InvalidParameterError, match="steps=5 but the strategy has n=4"):
        correlated_privatizer(Identity(STEPS), noise_multiplier=1.0, max_grad_norm=1.0, seed=0, steps=5)

    # make_private: the same plan and the same training as with the converted strategy
    runs = [_make(plain_loss, strategy=cnb, seed=1), _make(plain_loss, strategy=strategy_from_jax_privacy(cnb, STEPS),
                                                            seed=1)]
    assert runs[0].privacy.run_spec.strategy.describe() == runs[1].privacy.run_spec.strategy.describe()
    assert runs[0].privacy.run_spec.noise_multiplier == runs[1].privacy.run_spec.noise_multiplier
    params = []
    for run in runs:
        p, s = P0, run.tx.init(P0)
        for b in run.batches:
            p, s = run.step(p, s, *_batch(b))
        params.append(p)
    for a, b in zip(*(jax.tree.leaves(p) for p in params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_prng_key_and_seed():
    with pytest.raises(InvalidParameterError, match="exactly one of seed"):
        _make(plain_loss, seed=0, prng_key=jax.random.key(0))
    with pytest.raises(InvalidParameterError, match="exactly one of seed"):
        make_private(plain_loss, P0, M, optimizer=optax.sgd(0.1), strategy=Identity(STEPS),
                     sampling=PoissonSampling(0.25, STEPS), delta=1e-5, max_grad_norm=1.0, noise_multiplier=1.0,
                     accountant="unamplified")
    with pytest.raises(InvalidParameterError, match="prng_key must be one JAX random key"):
        _make(plain_loss, prng_key=3)
    # a legacy uint32[2] PRNGKey is the same stream as the typed key: the same batches and noise
    a, b = _make(plain_loss, prng_key=jax.random.PRNGKey(5)), _make(plain_loss, prng_key=jax.random.key(5))
    za, zb = jnp.zeros(3), jnp.zeros(3)
    np.testing.assert_array_equal(np.asarray(a.tx.update(za, a.tx.init(za))[0]), np.asarray(b.tx.update(zb, b.tx.init(zb))[0]))
    for x, y in zip(a.batches, b.batches):
        np.testing.assert_array_equal(x.indices, y.indices)
