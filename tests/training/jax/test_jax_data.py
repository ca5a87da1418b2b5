"""A dpmf scheme as a JAX input pipeline's batches (dpmf.training.jax.data.SchemeBatches) and
jax_privacy's batch selections converted to dpmf schemes (dpmf.training.jax.config): the batches
are the scheme's own draws (what the accountant reads), padded without changing them; the law of
each converted scheme matches jax_privacy's generator (inclusion rates, phases, separations)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("jax_privacy")
pytest.importorskip("optax")

from jax_privacy import batch_selection as bs  # noqa: E402

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError  # noqa: E402
from dpmf.sampling import (  # noqa: E402
    BallsInBinsSampling,
    CyclicPoissonSampling,
    MinSepSampling,
    PoissonSampling,
)
from dpmf.training.jax.config import scheme_from_jax_privacy  # noqa: E402
from dpmf.training.jax.data import SchemeBatches  # noqa: E402

M = 400


def _real(batch):
    return batch.indices[~batch.is_padding]


@pytest.mark.parametrize("scheme", [PoissonSampling(0.05, 12), CyclicPoissonSampling(0.2, 12, 3),
                                    MinSepSampling(0.1, 12, 3, warm_start=True), BallsInBinsSampling(3, 12),
                                    PoissonSampling(0.05, 12, max_batch_size=20, dataset_size=M)])
def test_batches_are_the_schemes_draws_padded(scheme):
    batches = list(SchemeBatches(scheme, M, seed=11, pad_multiple=16))
    ref = list(scheme.batches(M, np.random.default_rng(11)))
    assert len(batches) == scheme.steps == len(ref)
    cap = getattr(scheme, "max_batch_size", None)
    for t, (b, r) in enumerate(zip(batches, ref)):
        assert b.step == t
        np.testing.assert_array_equal(_real(b), r)  # the real examples, in the scheme's order
        assert b.indices.dtype == np.int64 and b.indices.shape == b.is_padding.shape
        assert not b.is_padding[: len(r)].any() and b.is_padding[len(r):].all()  # padding at the end
        assert len(b.indices) == (cap if cap else max(16, -(-len(r) // 16) * 16))


def test_no_padding_and_resume_replays_the_same_batches():
    scheme = MinSepSampling(0.2, 10, 2)
    full = [_real(b) for b in SchemeBatches(scheme, M, seed=4, pad_multiple=None)]
    first = SchemeBatches(scheme, M, seed=4, pad_multiple=None)
    for _ in range(6):
        next(first)
    state = first.state_dict()
    resumed = SchemeBatches(scheme, M, seed=4, pad_multiple=None)
    resumed.load_state_dict(state)
    assert resumed.steps_done == 6
    for a, b in zip(full[6:], resumed):
        np.testing.assert_array_equal(a, _real(b))
    other = SchemeBatches(scheme, M, seed=5)
    with pytest.raises(InvalidParameterError, match="seed"):
        other.load_state_dict(state)
    with pytest.raises(InvalidParameterError, match="steps_done"):
        resumed.load_state_dict({**state, "steps_done": 99})


def test_balls_in_bins_law_every_example_once_per_epoch_same_slot():
    scheme = BallsInBinsSampling(epochs=3, steps=12)  # 4 steps per epoch
    batches = [_real(b) for b in SchemeBatches(scheme, M, seed=0)]
    for e in range(3):
        seen = np.concatenate(batches[4 * e: 4 * e + 4])
        np.testing.assert_array_equal(np.sort(seen), np.arange(M))
    for t in range(4):
        np.testing.assert_array_equal(batches[t], batches[t + 4])
    # slots uniform: each step's share ~ 1/4 (binomial sd sqrt(400 * 3/16) = 8.7; allow 5 sd)
    assert all(abs(len(batches[t]) - 100) < 44 for t in range(4))


# ---- jax_privacy batch selections converted: the law of the converted scheme is jax_privacy's ----


def _inclusion(batches, m, steps):
    inc = np.zeros((steps, m), dtype=bool)
    for t, b in enumerate(batches):
        inc[t, np.asarray(b, dtype=np.int64)] = True
    return inc


def _reps(gen, reps):
    return np.mean([g for g in (gen(r) for r in range(reps))], axis=0)


def test_cyclic_poisson_converted_has_jax_privacys_law():
    sel = bs.CyclicPoissonSampling(sampling_prob=0.3, iterations=6, cycle_length=3)
    scheme = scheme_from_jax_privacy(sel)
    assert isinstance(scheme, CyclicPoissonSampling) and (scheme.sampling_prob, scheme.cycle_length) == (0.3, 3)
    m = 300
    for gen in (lambda seed: sel.batch_iterator(m, seed), lambda seed: scheme.batches(m, seed)):
        rates, phases_ok = [], True
        for seed in range(40):
            inc = _inclusion(list(gen(seed)), m, 6)
            # an example joins only steps of one phase (t mod 3)
            phases = [set(np.flatnonzero(inc[:, i]) % 3) for i in range(m)]
            phases_ok &= all(len(p) <= 1 for p in phases)
            rates.append(inc.sum() / (m * 6 / 3))  # per active step, each example of the group w.p. q
        assert phases_ok
        assert abs(np.mean(rates) - 0.3) < 0.015  # 5 sd: the mean of 24,000 Bernoulli(0.3), sd 0.003


def test_b_min_sep_converted_has_jax_privacys_law():
    sel = bs.BMinSepSampling(sampling_prob=0.4, iterations=8, min_sep=3, warm_start=True)
    scheme = scheme_from_jax_privacy(sel)
    assert isinstance(scheme, MinSepSampling) and scheme.warm_start and scheme.min_sep == 3
    m = 300
    p0 = scheme.participation_rate  # 1 / (1/p + b - 1) = 0.2222
    for gen in (lambda seed: sel.batch_iterator(m, seed), lambda seed: scheme.batches(m, seed)):
        rates = []
        for seed in range(20):
            inc = _inclusion(list(gen(seed)), m, 8)
            for i in range(m):  # participations at least min_sep apart
                steps = np.flatnonzero(inc[:, i])
                assert np.all(np.diff(steps) >= 3)
            rates.append(inc.mean())
        assert abs(np.mean(rates) - p0) < 0.01  # warm start: p0 at every step; sd ~ 0.002


def test_balls_in_bins_and_poisson_converted():
    s = scheme_from_jax_privacy(bs.BallsInBinsSampling(iterations=12, cycle_length=4))
    assert isinstance(s, BallsInBinsSampling) and (s.epochs, s.steps, s.steps_per_epoch) == (3, 12, 4)
    p = scheme_from_jax_privacy(bs.CyclicPoissonSampling(sampling_prob=0.01, iterations=5))
    assert isinstance(p, PoissonSampling) and p.max_batch_size is None
    t = scheme_from_jax_privacy(bs.CyclicPoissonSampling(sampling_prob=0.01, iterations=5, truncated_batch_size=9),
                                num_examples=1000)
    assert (t.max_batch_size, t.dataset_size) == (9, 1000)
    ind = scheme_from_jax_privacy(bs.CyclicPoissonSampling(sampling_prob=0.1, iterations=4, cycle_length=2,
                                                           partition_type=bs.PartitionType.INDEPENDENT))
    assert ind.partition == "independent"


def test_unconvertible_selections_are_refused():
    with pytest.raises(UnsupportedConfigurationError, match="FixedBatchSampling"):
        scheme_from_jax_privacy(bs.FixedBatchSampling(batch_size=4, iterations=3))
    with pytest.raises(UnsupportedConfigurationError, match="multiple of cycle_length"):
        scheme_from_jax_privacy(bs.BallsInBinsSampling(iterations=10, cycle_length=4))
    with pytest.raises(UnsupportedConfigurationError, match="truncated cyclic"):
        scheme_from_jax_privacy(bs.CyclicPoissonSampling(sampling_prob=0.1, iterations=4, cycle_length=2,
                                                         truncated_batch_size=3))
    with pytest.raises(InvalidParameterError, match="num_examples"):
        scheme_from_jax_privacy(bs.CyclicPoissonSampling(sampling_prob=0.1, iterations=4, truncated_batch_size=3))
    with pytest.raises(InvalidParameterError, match="batch selection"):
        scheme_from_jax_privacy(object())
    with pytest.raises(InvalidParameterError, match="seed"):
        SchemeBatches(PoissonSampling(0.1, 3), 10, seed=None)
