"""Strategy catalog, summaries (notes/peer-libraries.md §B.5 numbers) and persistence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpmf.errors import InvalidParameterError
from dpmf.strategies import FixedEpochParticipation, catalog


@pytest.mark.parametrize(
    "kind,rmse,max_error",
    [("identity", 11.3578, 16.0), ("sqrt-toeplitz", 3.7496, 3.9965), ("optimal", 3.2681, None)],
)
def test_n128_two_epochs_matches_jax_privacy_table(kind, rmse, max_error):
    s = catalog.summarize(catalog.build(kind, 128, epochs=2), FixedEpochParticipation(2, 64))
    assert s["rmse"] == pytest.approx(rmse, abs=1e-4)
    if max_error is not None:
        assert s["max_error"] == pytest.approx(max_error, abs=1e-4)
    assert s["sensitivity_exact"]


@pytest.mark.parametrize("kind", catalog.KINDS[:-1])
def test_save_load_round_trip(kind, tmp_path):
    strat = catalog.build(kind, 16, epochs=2, bands=4)
    path = tmp_path / f"{kind}.npz"
    catalog.save(strat, path)
    back = catalog.load(path)
    np.testing.assert_allclose(back.encoder(), strat.encoder(), atol=1e-12)
    assert back.describe()["n"] == 16


def test_matrix_kind_and_validation(tmp_path):
    C = np.tril(np.ones((5, 5))) / 2
    strat = catalog.build("matrix", 5, matrix=C)
    assert strat.n == 5
    with pytest.raises(InvalidParameterError):
        catalog.build("matrix", 5, matrix=np.ones((5, 5)))  # not lower triangular
    with pytest.raises(InvalidParameterError):
        catalog.build("matrix", 4, matrix=C)
    with pytest.raises(InvalidParameterError, match="kind must be one of"):
        catalog.build("bogus", 4)
    with pytest.raises(InvalidParameterError, match="needs bands"):
        catalog.build("bsr", 8)
    with pytest.raises(InvalidParameterError, match="epochs must divide"):
        catalog.build("optimal", 10, epochs=3)


def test_load_refuses_foreign_and_tampered_files(tmp_path):
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"nope")
    with pytest.raises(InvalidParameterError, match="not a dpmf strategy file"):
        catalog.load(junk)
    strat = catalog.build("tree", 8)
    path = tmp_path / "tree.npz"
    catalog.save(strat, path)
    with np.load(path) as data:
        meta, enc = str(data["metadata"]), data["encoder"].copy()
    enc[0, 0] = 7.0
    bad = tmp_path / "bad.npz"
    np.savez(bad, metadata=np.array(meta), encoder=enc)
    with pytest.raises(InvalidParameterError, match="does not match"):
        catalog.load(bad)
    other = tmp_path / "other.npz"
    np.savez(other, metadata=np.array(json.dumps({"kind": "something"})), encoder=enc)
    with pytest.raises(InvalidParameterError, match="not a dpmf strategy file"):
        catalog.load(other)
