"""MMCC row checkpoints (``cache_dir``): interrupt, resume, same result bit for bit."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dpmf.accounting.mmcc import account_mmcc
from dpmf.accounting.mmcc import rows as rows_module
from dpmf.errors import InvalidParameterError
from dpmf.privacy import PrivacyLossDistribution, mixture_of_gaussians, subsampled_gaussian
from dpmf.sampling import PoissonSampling
from dpmf.strategies import ToeplitzStrategy


def _case():
    n = 24
    return ToeplitzStrategy(np.array([1.0, 0.6, 0.4, 0.3]), n), PoissonSampling(1 / 8, n), 3.0, 1e-6


@pytest.mark.parametrize(
    "pld",
    [
        subsampled_gaussian(1.0, 0.1, 1.0),
        mixture_of_gaussians(np.array([0.0, 1.0, 1.7]), np.array([0.5, 0.3, 0.2]), 2.0),
        PrivacyLossDistribution.identity(),
    ],
)
def test_pld_arrays_round_trip_bit_for_bit(pld):
    back = PrivacyLossDistribution.from_arrays(pld.to_arrays())
    assert type(back.remove) is type(pld.remove) and back.symmetric == pld.symmetric
    for d in ("remove", "add"):
        a, b = pld.pmf(d), back.pmf(d)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        assert a[2] == b[2]
    assert back.self_compose(7).epsilon(1e-6) == pld.self_compose(7).epsilon(1e-6)


def test_from_arrays_rejects_foreign_data():
    with pytest.raises(InvalidParameterError, match="stored PrivacyLossDistribution"):
        PrivacyLossDistribution.from_arrays({"x": np.zeros(2)})


def test_interrupted_run_resumes_to_the_same_report(tmp_path, monkeypatch):
    strat, scheme, sigma, delta = _case()
    # (the uninterrupted run with its own checkpoints: a checkpointed run keeps the requested grid)
    (tmp_path / "fresh").mkdir()
    fresh = account_mmcc(strat, scheme, sigma, delta, heuristic=False, workers=1, cache_dir=tmp_path / "fresh")
    total = fresh.diagnostics["distinct_units_computed"]
    (tmp_path / "run").mkdir()
    tmp_path = tmp_path / "run"

    class Stop(Exception):
        pass

    def stop_after_two(done, total):
        if done >= 2:
            raise Stop

    with pytest.raises(Stop):
        account_mmcc(strat, scheme, sigma, delta, heuristic=False, workers=1, cache_dir=tmp_path, callback=stop_after_two)
    saved = [f for f in os.listdir(tmp_path) if f.endswith(".npz")]
    assert len(saved) == 2 and not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]

    computed = []
    real = rows_module._job
    monkeypatch.setattr(rows_module, "_job", lambda job: computed.append(1) or real(job))
    resumed = account_mmcc(strat, scheme, sigma, delta, heuristic=False, workers=1, cache_dir=tmp_path)
    assert resumed.epsilon == fresh.epsilon
    assert resumed.epsilon_by_direction == fresh.epsilon_by_direction
    assert resumed.diagnostics["backend"]["rows_loaded"] == 2
    rows_total = len(os.listdir(tmp_path))
    assert len(computed) == rows_total - 2 > 0  # only the missing rows were computed
    assert rows_total == total

    computed.clear()
    again = account_mmcc(strat, scheme, sigma, delta, heuristic=False, workers=1, cache_dir=tmp_path)
    assert computed == [] and again.epsilon == fresh.epsilon


def test_other_sigma_does_not_reuse_rows_and_damaged_files_are_recomputed(tmp_path):
    strat, scheme, sigma, delta = _case()
    a = account_mmcc(strat, scheme, sigma, delta, heuristic=False, workers=1, cache_dir=tmp_path)
    k = len(os.listdir(tmp_path))
    b = account_mmcc(strat, scheme, 2 * sigma, delta, heuristic=False, workers=1, cache_dir=tmp_path)
    assert len(os.listdir(tmp_path)) == 2 * k and b.epsilon < a.epsilon
    for f in os.listdir(tmp_path):
        with open(tmp_path / f, "wb") as fh:
            fh.write(b"garbage")
    again = account_mmcc(strat, scheme, sigma, delta, heuristic=False, workers=1, cache_dir=tmp_path)
    assert again.epsilon == a.epsilon


def test_cache_dir_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    strat, scheme, sigma, delta = _case()
    with pytest.raises(InvalidParameterError, match="cache_dir"):
        account_mmcc(strat, scheme, sigma, delta, cache_dir=blocker / "sub")
