"""MMCC at scale: the structured tail-bound path equals the dense reference path, bit for bit.

The dense path (``MMCCAccountant(..., structured=False)``: the encoder matrix, an incremental Gram
matrix, a partial sort per row) is the oracle; the structured path
(:mod:`dpmf.accounting.mmcc.structured`) must produce the same ``TailBoundStructure`` arrays,
the same row grouping and hence the same epsilon, for trees (powers of two and not), Toeplitz
strategies (square root, random non-negative with zero lags, integer, banded BSR/BISR, BLT) and
the identity, at several sampling probabilities and deltas. Strategies without structure (dense
matrices, BandMF) keep using the dense path. A large structured strategy must never be
materialized (``encoder()`` is monkeypatched to fail).
"""

from __future__ import annotations

import io

import numpy as np
import pytest

import dpmf
from dpmf import progress
from dpmf.accounting.mmcc import MMCCAccountant, account_mmcc, supports
from dpmf.sampling import CyclicPoissonSampling, PoissonSampling
from dpmf.strategies import BinaryTree, DenseStrategy, Identity, ToeplitzStrategy
from dpmf.strategies.banded import bisr, bsr
from dpmf.strategies.blt import BLT, BLTStrategy

_FIELDS = ("offsets", "columns", "sensitivities", "prior_norm", "prior_norm_sq", "signal")
_SCALARS = ("sampling_prob", "delta1", "delta_prime", "z", "tail_events")


def _accountants(strategy, q, delta=1e-6, **kw):
    scheme = PoissonSampling(q, strategy.n)
    fast = MMCCAccountant(strategy, scheme, delta, **kw)
    dense = MMCCAccountant(strategy, scheme, delta, structured=False, **kw)
    return fast, dense


def _assert_same_structure(fast, dense):
    assert fast.structured and not dense.structured
    assert len(fast.analyses) == len(dense.analyses) == 1
    a, b = fast.analyses[0], dense.analyses[0]
    sa, sb = a.structure, b.structure
    for name in _FIELDS:
        x, y = getattr(sa, name), getattr(sb, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        np.testing.assert_array_equal(x, y, err_msg=name, strict=True)
    for name in _SCALARS:
        assert getattr(sa, name) == getattr(sb, name), name
    info = {k: v for k, v in sa.info.items() if k != "structured"}
    assert info == sb.info
    assert a.groups == b.groups and a.heuristic_groups == b.heuristic_groups
    assert fast.grid_step == dense.grid_step and fast.num_rows == dense.num_rows


def _toeplitz_cases(n, rng):
    c = rng.random(min(n, 6)) + 0.05
    if c.size > 3:
        c[2] = 0.0  # a zero lag inside the band
    cases = [
        ToeplitzStrategy.sqrt_prefix_sum(n),
        ToeplitzStrategy(c, n),
        ToeplitzStrategy(rng.integers(1, 4, size=min(n, 5)).astype(float), n),
        BLT(np.array([0.9, 0.5]), np.array([0.3, 0.2])).to_toeplitz(n),
        Identity(n),
    ]
    if n >= 4:
        cases += [bsr(n, 3), bisr(n, 2)]
    return cases


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 12, 16, 31])
@pytest.mark.parametrize("q", [0.01, 0.2, 0.75])
def test_tree_structure_equals_dense(n, q):
    _assert_same_structure(*_accountants(BinaryTree(n), q))


@pytest.mark.parametrize("scale", [3.0, 0.37, 1 / np.sqrt(5.0)])
@pytest.mark.parametrize("n", [5, 16, 21])
def test_scaled_tree_structure_equals_dense(n, scale):
    _assert_same_structure(*_accountants(BinaryTree(n, scale), 0.1))


@pytest.mark.parametrize("n", [1, 2, 4, 7, 16, 40])
@pytest.mark.parametrize("q", [0.005, 0.1, 0.6])
def test_toeplitz_structures_equal_dense(n, q):
    rng = np.random.default_rng(n)
    for strategy in _toeplitz_cases(n, rng):
        if isinstance(strategy, ToeplitzStrategy) and np.any(strategy.coefs < 0):
            continue  # (not a valid MMCC input; covered by the error tests)
        _assert_same_structure(*_accountants(strategy, q))


@pytest.mark.parametrize("delta", [1e-12, 1e-3])
@pytest.mark.parametrize("delta_split", [0.1, 0.9])
def test_structures_equal_dense_other_deltas(delta, delta_split):
    for strategy in (BinaryTree(24), ToeplitzStrategy.sqrt_prefix_sum(24), bsr(24, 4)):
        _assert_same_structure(*_accountants(strategy, 0.05, delta, delta_split=delta_split))


@pytest.mark.parametrize(
    "strategy, q, sigma",
    [
        (BinaryTree(8), 0.1, 4.0),
        (BinaryTree(6), 0.3, 6.0),
        (ToeplitzStrategy.sqrt_prefix_sum(6), 0.2, 4.0),
        (bsr(10, 3), 0.05, 2.0),
        (BLT(np.array([0.8]), np.array([0.4])).to_toeplitz(5), 0.25, 4.0),
    ],
)
def test_epsilon_equals_dense_path(strategy, q, sigma):
    fast, dense = _accountants(strategy, q, 1e-5)
    ra, rb = fast.report(sigma), dense.report(sigma)
    assert ra.epsilon_by_direction == rb.epsilon_by_direction
    assert ra.diagnostics["independent_rows_heuristic_epsilon"] == rb.diagnostics["independent_rows_heuristic_epsilon"]
    assert ra.diagnostics["max_probability_ratio"] == rb.diagnostics["max_probability_ratio"]


def test_unstructured_strategies_use_the_dense_path():
    rng = np.random.default_rng(3)
    C = np.tril(rng.random((6, 6)))
    acc = MMCCAccountant(DenseStrategy(C), PoissonSampling(0.1, 6), 1e-6)
    assert not acc.structured
    ref = MMCCAccountant(C, PoissonSampling(0.1, 6), 1e-6)
    assert acc.epsilon(2.0) == ref.epsilon(2.0)
    # cyclic Poisson keeps the dense (generalized MMCC) path for every strategy
    cyc = MMCCAccountant(BinaryTree(8), CyclicPoissonSampling(0.1, 8, 2), 1e-6)
    assert not cyc.structured


def test_negative_toeplitz_is_refused_as_before():
    bad = ToeplitzStrategy(np.array([1.0, -0.5]), 5)
    with pytest.raises(dpmf.errors.UnsupportedConfigurationError, match="non-negative"):
        MMCCAccountant(bad, PoissonSampling(0.1, 5), 1e-6)


def test_steps_mismatch_is_refused_without_the_encoder(monkeypatch):
    monkeypatch.setattr(BinaryTree, "encoder", _forbidden)
    with pytest.raises(dpmf.errors.InvalidParameterError, match="steps"):
        MMCCAccountant(BinaryTree(8), PoissonSampling(0.1, 9), 1e-6)


def _forbidden(self, *args, **kwargs):
    if self.n > 64:
        raise AssertionError(f"encoder() of a {type(self).__name__} with n = {self.n} was materialized")
    return _ORIGINAL[type(self)](self, *args, **kwargs)


_ORIGINAL = {
    BinaryTree: BinaryTree.encoder,
    ToeplitzStrategy: ToeplitzStrategy.encoder,
    BLTStrategy: ToeplitzStrategy.encoder,
    Identity: Identity.encoder,
}


@pytest.fixture
def no_large_encoders(monkeypatch):
    for cls in (BinaryTree, ToeplitzStrategy, Identity):
        monkeypatch.setattr(cls, "encoder", _forbidden)


@pytest.mark.parametrize(
    "strategy",
    [
        BinaryTree(1024),
        ToeplitzStrategy.sqrt_prefix_sum(512),
        bsr(300, 4),
        BLT(np.array([0.9]), np.array([0.3])).to_toeplitz(512),
        Identity(300),
    ],
    ids=["tree", "sqrt-toeplitz", "bsr", "blt", "identity"],
)
def test_structured_strategies_are_never_materialized(no_large_encoders, strategy):
    n = strategy.n
    scheme = PoissonSampling(4 / n, n)
    assert supports(strategy, scheme) is None
    acc = MMCCAccountant(strategy, scheme, 1e-6)  # all encoder-dependent work happens here
    assert acc.structured and acc.num_rows >= n
    if strategy.band <= 4 if isinstance(strategy, ToeplitzStrategy) else isinstance(strategy, Identity):
        rep = account_mmcc(strategy, scheme, 8.0, 1e-6, heuristic=False)  # cheap rows: run it all
        assert 0 < rep.epsilon < np.inf and rep.epsilon == acc.epsilon(8.0)


def test_the_fixture_does_fail_on_a_large_encoder(no_large_encoders):
    with pytest.raises(AssertionError, match="materialized"):
        BinaryTree(128).encoder()
    assert BinaryTree(8).encoder().shape == (15, 8)


def test_rows_report_progress_and_callbacks_still_work():
    calls = []
    buf = io.StringIO()
    with progress.reporting("log", stream=buf, interval=0.0):
        rep = account_mmcc(BinaryTree(16), PoissonSampling(0.05, 16), 4.0, 1e-6, heuristic=False,
                           callback=lambda done, total: calls.append((done, total)))
    log = buf.getvalue()
    total = rep.diagnostics["distinct_units_computed"]
    assert f"MMCC rows: started ({total} units)" in log
    assert f"MMCC rows: done, {total}/{total}" in log
    assert calls == [(k, total) for k in range(1, total + 1)]
