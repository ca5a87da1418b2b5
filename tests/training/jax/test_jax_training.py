"""A JAX training run built through dpmf (dpmf.training.jax.make_private): it adds noise with the
certified covariance, draws the certified batches, its clipped sum is the per-example float64
reference, its report passes `dpmf verify`, checkpoints resume bit for bit, and it refuses what it
cannot certify with the PyTorch side's messages."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax_privacy")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

from dpmf.accounting.verify import verify_report  # noqa: E402
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError  # noqa: E402
from dpmf.sampling import BallsInBinsSampling, PoissonSampling  # noqa: E402
from dpmf.strategies import Identity, bsr  # noqa: E402
from dpmf.training.jax import make_private  # noqa: E402
from dpmf.training.jax.engine import _derived_seed  # noqa: E402
from dpmf.training.run_spec import resolve_run_spec  # noqa: E402

M, FEATURES, CLASSES = 96, 4, 3
_rng = np.random.default_rng(0)
X = _rng.normal(size=(M, FEATURES)).astype(np.float32)
Y = (np.arange(M) % CLASSES).astype(np.int32)


def loss(params, example):
    x, y = example
    return -jax.nn.log_softmax(x @ params["w"] + params["b"])[y]


def _params():
    return {"w": jnp.zeros((FEATURES, CLASSES)), "b": jnp.zeros(CLASSES)}


def _run(strategy=None, sampling=None, **kw):
    kw.setdefault("optimizer", optax.sgd(0.1, momentum=0.9))
    kw.setdefault("delta", 1e-5)
    kw.setdefault("max_grad_norm", 1.0)
    kw.setdefault("seed", 0)
    if "target_epsilon" not in kw and "plan" not in kw:
        kw.setdefault("noise_multiplier", 2.0)  # one accounting (allocation_pld, ~1 s); calibration: the example
    return make_private(loss, _params(), M, strategy=strategy or bsr(8, 2),
                        sampling=sampling or BallsInBinsSampling(epochs=4, steps=8), **kw)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = _run()
    params, opt_state = _params(), run.tx.init(_params())
    for batch in run.batches:
        params, opt_state = run.step(params, opt_state, (X[batch.indices], Y[batch.indices]), batch.is_padding)
    return run, params, opt_state, tmp_path_factory.mktemp("jax_run")


def test_run_adds_noise_with_the_certified_covariance():
    """The run's optax transformation, on zero gradients with the identity optimizer, releases
    (sigma clip / normalizer) L u: covariance (sigma clip / normalizer)^2 C^{-1} C^{-T}, sigma the
    plan's certified noise multiplier."""
    strategy, steps, R = bsr(8, 2), 8, 20_000
    run = _run(strategy, optimizer=optax.identity(), max_grad_norm=0.7, seed=3)
    plan = run.privacy.run_spec
    zeros = jnp.zeros(R)

    def body(state, _):
        out, state = run.tx.update(zeros, state, zeros)
        return state, out

    _, W = jax.lax.scan(body, run.tx.init(zeros), None, length=steps)
    W = np.asarray(W, dtype=np.float64)
    emp = W @ W.T / R
    Cinv = np.linalg.inv(strategy.encoder())
    exact = (plan.noise_multiplier * plan.max_grad_norm / plan.normalizer) ** 2 * Cinv @ Cinv.T
    tol = 6.0 * math.sqrt(2.0 / R) * float(np.max(np.diag(exact)))
    assert np.max(np.abs(emp - exact)) < tol
    assert np.max(np.abs(emp - 1.2 * exact)) > tol  # a 20% louder noise is rejected
    assert np.max(np.abs(emp - np.diag(np.diag(exact)))) > tol  # and so is independent noise


def test_run_draws_the_certified_batches(trained):
    run, _, _, _ = trained
    plan = run.privacy.run_spec
    ref = list(plan.scheme.batches(M, np.random.default_rng(_derived_seed(0, 0))))
    fresh = _run()
    got = [b.indices[~b.is_padding] for b in fresh.batches]
    assert len(got) == plan.steps == len(ref)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    # and they follow the certified law: every example once per epoch of 2 steps, the same slot
    for e in range(4):
        np.testing.assert_array_equal(np.sort(np.concatenate(got[2 * e: 2 * e + 2])), np.arange(M))
    for t in range(6):
        np.testing.assert_array_equal(got[t], got[t + 2])


def test_clipped_sum_is_the_float64_per_example_reference():
    run = _run()
    params = {"w": jnp.asarray(_rng.normal(size=(FEATURES, CLASSES)), jnp.float32), "b": jnp.ones(CLASSES)}
    idx = np.array([0, 5, 7, 0])
    pad = np.array([False, False, False, True])
    g = run.grad_fn(params, (X[idx], Y[idx]), is_padding_example=pad)
    ref = {"w": np.zeros((FEATURES, CLASSES)), "b": np.zeros(CLASSES)}
    for i in idx[:3]:  # per example, float64, by hand
        x, y = X[i].astype(np.float64), int(Y[i])
        logits = x @ np.asarray(params["w"], np.float64) + np.asarray(params["b"], np.float64)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        dz = p - np.eye(CLASSES)[y]
        gw, gb = np.outer(x, dz), dz
        norm = math.sqrt(float(np.sum(gw**2) + np.sum(gb**2)))
        f = min(1.0, 1.0 / norm)
        ref["w"] += f * gw
        ref["b"] += f * gb
    np.testing.assert_allclose(np.asarray(g["w"]), ref["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(g["b"]), ref["b"], rtol=1e-5, atol=1e-6)


def test_report_passes_dpmf_verify(trained):
    run, _, opt_state, tmp = trained
    report = run.privacy.report(opt_state)
    assert report.certified and report.noise_multiplier == 2.0
    t = report.diagnostics["training"]
    assert (t["steps_done"], t["steps_planned"], t["framework"]) == (8, 8, "jax")
    path = tmp / "report.json"
    run.privacy.save_report(path, opt_state)
    v = verify_report(path)
    assert v.holds and v.edited is False
    doc = json.loads(path.read_text())
    doc["epsilon"] = doc["epsilon"] / 2  # a false claim fails verification
    path.write_text(json.dumps(doc))
    assert not verify_report(path).holds


def test_checkpoint_resumes_bit_for_bit(tmp_path):
    def train(run, params, opt_state, k):
        for _ in range(k):
            b = next(run.batches)
            params, opt_state = run.step(params, opt_state, (X[b.indices], Y[b.indices]), b.is_padding)
        return params, opt_state

    run = _run()
    p, s = train(run, _params(), run.tx.init(_params()), 3)
    run.privacy.save_checkpoint(tmp_path / "ck.npz", p, s)
    p_full, s_full = train(run, p, s, 5)

    again = _run()
    p2, s2 = again.privacy.load_checkpoint(tmp_path / "ck.npz", _params(), again.tx.init(_params()))
    assert again.privacy.steps_done == 3 and again.privacy.noise_steps(s2) == 3
    p2, s2 = train(again, p2, s2, 5)
    for a, b in zip(jax.tree.leaves(p_full), jax.tree.leaves(p2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    other = _run(noise_multiplier=3.0)  # another plan: refused, naming what differs
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        other.privacy.load_checkpoint(tmp_path / "ck.npz", _params(), other.tx.init(_params()))
    state = run.privacy.state_dict(p, s)
    state["steps_done"] = 2  # counters edited
    with pytest.raises(InvalidParameterError, match="inconsistent"):
        again.privacy.load_state_dict(state, _params(), again.tx.init(_params()))
    with pytest.raises(InvalidParameterError, match="noise steps"):
        again.privacy.report(again.tx.init(_params()))  # the batch contract: 8 batches, 0 noise steps


def test_refuses_with_the_pytorch_sides_messages():
    def message(call):
        with pytest.raises((InvalidParameterError, UnsupportedConfigurationError)) as info:
            call()
        return type(info.value), str(info.value)

    common = dict(plan=None, num_examples=M, delta=1e-5, noise_multiplier=1.0, target_epsilon=None, accountant="auto",
                  normalizer=None, accountant_options=None)
    cases = [
        dict(strategy=None, sampling=PoissonSampling(0.1, 8), max_grad_norm=1.0),  # missing strategy
        dict(strategy=bsr(6, 2), sampling=PoissonSampling(0.1, 8), max_grad_norm=1.0),  # steps differ
        dict(strategy=bsr(8, 2), sampling=BallsInBinsSampling(4, 8), max_grad_norm=1.0, accountant="mmcc"),  # uncovered
        dict(strategy=bsr(8, 2), sampling=PoissonSampling(0.1, 8), max_grad_norm=-1.0),  # bad clip norm
    ]
    kinds = set()
    for plan_kw in cases:
        expected = message(lambda: resolve_run_spec(**{**common, **plan_kw}))
        got = message(lambda: make_private(loss, _params(), M, optimizer=optax.sgd(0.1), seed=0, delta=1e-5,
                                           noise_multiplier=1.0, **plan_kw))
        assert got == expected
        kinds.add(got[0])
    assert kinds == {InvalidParameterError, UnsupportedConfigurationError}
    with pytest.raises(InvalidParameterError, match="seed"):
        _run(seed=None)
    with pytest.raises(InvalidParameterError, match="optimizer"):
        _run(optimizer="sgd")
    with pytest.raises(InvalidParameterError, match="exactly one of noise_multiplier and target_epsilon"):
        _run(noise_multiplier=1.0, target_epsilon=2.0)


def test_plan_is_reused_without_accounting(trained):
    run, _, _, _ = trained
    again = make_private(loss, _params(), M, optimizer=optax.sgd(0.1), plan=run.privacy.run_spec, seed=1)
    assert again.privacy.run_spec is run.privacy.run_spec
    with pytest.raises(InvalidParameterError, match="plan= fixes"):
        make_private(loss, _params(), M, optimizer=optax.sgd(0.1), plan=run.privacy.run_spec, seed=1,
                     strategy=Identity(8))


def test_checkpoint_written_before_issue_51_resumes():
    """A JAX checkpoint written by main at 5518073 (tests/training/data/make_old_checkpoints.py),
    whose fingerprint hashes the accountant's epsilon of that machine: it resumes and runs on."""
    import sys
    from pathlib import Path

    data = Path(__file__).parent.parent / "data"
    sys.path.insert(0, str(data))
    try:
        from make_old_checkpoints import jax_data, jax_run
    finally:
        sys.path.remove(str(data))
    run, params = jax_run()
    p, s = run.privacy.load_checkpoint(data / "checkpoint_5518073_jax.npz", params, run.tx.init(params))
    assert run.privacy.steps_done == run.privacy.noise_steps(s) == 3
    x, y = jax_data()
    for b in run.batches:
        p, s = run.step(p, s, (x[b.indices], y[b.indices]), b.is_padding)
    assert run.privacy.report(s).diagnostics["training"]["steps_done"] == 6
