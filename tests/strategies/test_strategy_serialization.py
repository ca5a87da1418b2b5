"""strategy_from_dict(s.describe()) rebuilds s: every strategy kind, structured ones structured,
floats exact through JSON, dense matrices inline or by content hash (.npz lookup), and every
malformed description refused with an InvalidParameterError naming the key."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpmf.errors import InvalidParameterError
from dpmf.strategies import (
    BLT,
    BLTStrategy,
    BinaryTree,
    DenseStrategy,
    FFTMechanism,
    FixedEpochParticipation,
    Identity,
    Participation,
    ToeplitzStrategy,
    bisr,
    bsr,
    optimize_banded_toeplitz,
    participation_from_dict,
    save_matrices,
    strategy_from_dict,
)
from dpmf.strategies import catalog
from dpmf.strategies.bandmf import optimize_bandmf
from dpmf.strategies.serialization import INLINE_MAX_N, find_matrix, matrix_sha256
from dpmf.strategies.stamping import StampedEncoder


def _json(d: dict) -> dict:
    return json.loads(json.dumps(d))


def _random_lower(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.tril(rng.uniform(0.1, 1.0, (n, n))) + np.eye(n)


STRATEGIES = {
    "identity": lambda: Identity(7),
    "sqrt-toeplitz": lambda: ToeplitzStrategy.sqrt_prefix_sum(9),
    "toeplitz-random": lambda: ToeplitzStrategy(np.concatenate(([5.0], np.random.default_rng(1).normal(size=8))), 9),
    "toeplitz-trailing-zeros": lambda: ToeplitzStrategy([1.0, 0.5, 0.0, 0.0], 8),
    "bsr": lambda: bsr(12, 3),
    "bisr": lambda: bisr(12, 3),
    "banded-toeplitz": lambda: optimize_banded_toeplitz(12, 3, 2),
    "band-inv": lambda: catalog.build("band-inv", 12, epochs=2, bands=3, constraints="all_signs"),
    "band-inv-normalized": lambda: catalog.build("band-inv", 10, bands=2).normalized(FixedEpochParticipation(2, 5)),
    "identity-normalized": lambda: Identity(8).normalized(Participation(2, 4)),
    "blt-strategy": lambda: BLT([0.5, 0.9], [0.1, 0.2]).to_toeplitz(10),
    "blt-scaled": lambda: BLTStrategy.from_blt(BLT([0.3], [0.7]), 6, 2.5),
    "blt-normalized": lambda: BLT([0.5, 0.9], [0.1, 0.2]).to_toeplitz(8).normalized(FixedEpochParticipation(2, 4)),
    "blt-general": lambda: BLT([0.5, 0.9], [0.1, 0.2]).inverse(),
    "blt": lambda: BLT([0.25, 0.75], [0.3, 0.05]),
    "tree": lambda: BinaryTree(8),
    "tree-scaled": lambda: BinaryTree(5, 0.3),
    "tree-normalized": lambda: BinaryTree(6).normalized(FixedEpochParticipation(2, 3)),
    "fft": lambda: FFTMechanism(6),
    "fft-normalized": lambda: FFTMechanism(4).normalized(Participation(1, 1)),
    "dense": lambda: DenseStrategy(_random_lower(6)),
    "dense-named": lambda: DenseStrategy(np.tri(5), name="toeplitz"),  # a free name: dispatch is by class
    "bandmf": lambda: optimize_bandmf(10, 3, max_iter=20),
    "optimal": lambda: catalog.build("optimal", 8, epochs=2),
    "matrix": lambda: catalog.build("matrix", 4, matrix=np.tri(4)),
    "stamped": lambda: StampedEncoder(np.tri(3), 2),
}


@pytest.mark.parametrize("kind", sorted(STRATEGIES))
def test_round_trip_every_kind(kind):
    s = STRATEGIES[kind]()
    d = _json(s.describe())
    back = strategy_from_dict(d)
    assert type(back) is type(s)
    assert back.describe() == s.describe()
    assert _json(back.describe()) == d
    if isinstance(s, BLT):
        np.testing.assert_array_equal(back.buf_decay, s.buf_decay)
        np.testing.assert_array_equal(back.output_scale, s.output_scale)
        assert back.nonnegative == s.nonnegative
        np.testing.assert_array_equal(back.toeplitz_coefs(9), s.toeplitz_coefs(9))
        return
    assert back.n == s.n
    assert np.array_equal(back.encoder(), s.encoder())
    if isinstance(s, ToeplitzStrategy):
        assert np.array_equal(back.coefs, s.coefs)
        assert np.array_equal(back.noising_coefficients(), s.noising_coefficients())
        assert (back.inverse_coefs is None) == (s.inverse_coefs is None)
        if s.inverse_coefs is not None:
            assert np.array_equal(back.inverse_coefs, s.inverse_coefs)
    if hasattr(s, "noising_matrix"):
        assert np.array_equal(back.noising_matrix(), s.noising_matrix())


def test_every_exported_strategy_class_is_covered():
    import dpmf.strategies as S

    classes = {S.Identity, S.DenseStrategy, S.ToeplitzStrategy, S.BinaryTree, S.FFTMechanism, S.BLT, S.BLTStrategy,
               S.BandInvStrategy}
    covered = {type(f()) for f in STRATEGIES.values()}
    assert classes | {StampedEncoder} <= covered
    # every catalog kind, built small, comes back
    for kind in catalog.KINDS:
        kw = {"bands": 2} if kind in ("banded-toeplitz", "banded", "bsr", "bisr", "band-inv") else {}
        if kind == "matrix":
            kw["matrix"] = np.tri(4)
        s = catalog.build(kind, 4, **kw)
        back = strategy_from_dict(_json(s.describe()))
        assert type(back) is type(s) and np.array_equal(back.encoder(), s.encoder()), kind


def test_structured_strategies_stay_structured():
    t = bsr(2000, 5)
    d = t.describe()
    assert d["coefs"] == t.coefs.tolist() and len(d["coefs"]) == 5 and "matrix" not in d
    back = strategy_from_dict(_json(d))
    assert isinstance(back, ToeplitzStrategy) and back.coefs.size == 5
    blt = BLT([0.5, 0.9], [0.1, 0.2]).to_toeplitz(5000)
    d = blt.describe()
    assert "coefs" not in d and "matrix" not in d  # a BLT is its parameters
    assert len(json.dumps(d)) < 400
    back = strategy_from_dict(_json(d))
    assert isinstance(back, BLTStrategy) and np.array_equal(back.coefs, blt.coefs)
    assert strategy_from_dict(BinaryTree(4096).describe()) == BinaryTree(4096)


def test_toeplitz_floats_round_trip_exactly_through_json():
    rng = np.random.default_rng(7)
    coefs = np.concatenate(([1.0], rng.normal(size=40) * 10.0 ** rng.integers(-300, 300, size=40)))
    s = ToeplitzStrategy(coefs, 41)
    back = strategy_from_dict(json.loads(json.dumps(s.describe())))
    assert back.coefs.tobytes() == s.coefs.tobytes()


def test_blt_with_explicit_coefficients_keeps_them():
    blt = BLT([0.5], [0.25])
    canonical = blt.toeplitz_coefs(6)
    off = canonical * (1 + 1e-14)  # within BLTStrategy's tolerance, not bit-equal
    s = BLTStrategy(off, 6, blt=blt)
    d = s.describe()
    assert d["coefs"] == s.coefs.tolist()
    assert np.array_equal(strategy_from_dict(_json(d)).coefs, s.coefs)


# ------------------------------------------------------------------------- dense by content hash
def test_small_dense_is_inline_large_by_hash():
    small = DenseStrategy(_random_lower(INLINE_MAX_N))
    d = small.describe()
    assert d["matrix"] == small.C.tolist() and d["sha256"] == matrix_sha256(small.C)
    big = DenseStrategy(_random_lower(INLINE_MAX_N + 1))
    d = big.describe()
    assert "matrix" not in d and d["sha256"] == matrix_sha256(big.C) and d["rows"] == INLINE_MAX_N + 1
    assert len(json.dumps(d)) < 400


def test_large_dense_found_in_matrices_or_search_dir(tmp_path):
    big = DenseStrategy(_random_lower(70, seed=3), name="optimal")
    d = _json(big.describe())
    with pytest.raises(InvalidParameterError, match="sha256 .* not found"):
        strategy_from_dict(d)
    for given in ([big.C], {"whatever": big.encoder()}, (np.eye(70), big.C)):
        back = strategy_from_dict(d, matrices=given)
        assert np.array_equal(back.C, big.C) and back.name == "optimal"
    paths = save_matrices(big, tmp_path)
    assert [p.name for p in paths] == [f"{d['sha256']}.npz"]
    back = strategy_from_dict(d, search_dir=tmp_path)
    assert np.array_equal(back.C, big.C) and back.describe() == big.describe()
    assert save_matrices(Identity(3), tmp_path) == []


def test_search_dir_finds_a_catalog_file_under_any_name(tmp_path):
    big = DenseStrategy(_random_lower(66, seed=4), name="matrix")
    catalog.save(big, tmp_path / "my-strategy.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")  # unreadable files are skipped
    back = strategy_from_dict(_json(big.describe()), search_dir=tmp_path)
    assert np.array_equal(back.C, big.C)


def test_mismatching_or_pickled_file_named_by_the_hash_is_refused(tmp_path):
    big = DenseStrategy(_random_lower(65, seed=5))
    sha = big.describe()["sha256"]
    np.savez(tmp_path / f"{sha}.npz", matrix=_random_lower(65, seed=6))
    with pytest.raises(InvalidParameterError, match="mismatching file"):
        strategy_from_dict(big.describe(), search_dir=tmp_path)
    obj = np.empty(1, dtype=object)
    obj[0] = {"a": 1}
    np.savez(tmp_path / f"{sha}.npz", matrix=obj)  # needs pickle to read: never unpickled
    with pytest.raises(InvalidParameterError, match=sha):
        strategy_from_dict(big.describe(), search_dir=tmp_path)
    with pytest.raises(InvalidParameterError, match="not a directory"):
        strategy_from_dict(big.describe(), search_dir=tmp_path / "missing")


def test_find_matrix_checks_the_shape():
    C = np.arange(6.0).reshape(2, 3)
    sha = matrix_sha256(C)
    assert np.array_equal(find_matrix(sha, (2, 3), matrices=[C]), C)
    with pytest.raises(InvalidParameterError, match="not found"):
        find_matrix(sha, (3, 2), matrices=[C])  # same bytes, other shape


def test_edited_inline_matrix_is_refused():
    d = _json(DenseStrategy(np.tri(4)).describe())
    d["matrix"][2][0] = 0.5
    with pytest.raises(InvalidParameterError, match="'matrix' does not match its sha256"):
        strategy_from_dict(d)


def test_stamped_large_block_by_hash():
    block = _random_lower(65, seed=8)
    s = StampedEncoder(block, 2)
    d = _json(s.describe())
    assert "block" not in d and d["block_shape"] == [65, 65]
    back = strategy_from_dict(d, matrices=[block])
    assert np.array_equal(back.encoder(), s.encoder())


# ------------------------------------------------------------------------- bad input
BAD = [
    ({"n": 3}, "key 'name' is missing"),
    ({"name": "nope", "n": 3}, "key 'name' must be one of"),
    ({"name": 7, "n": 3}, "key 'name' must be a non-empty string"),
    ({"name": "identity"}, "key 'n' is missing"),
    ({"name": "identity", "n": "5"}, "key 'n' must be an integer"),
    ({"name": "identity", "n": 5.5}, "key 'n' must be an integer"),
    ({"name": "identity", "n": True}, "key 'n' must be an integer"),
    ({"name": "identity", "n": 0}, "key 'n' must be an integer >= 1"),
    ({"name": "identity", "n": 3, "extra": 1}, "unknown key 'extra'"),
    ({"name": "toeplitz", "n": 3, "band": 3}, "key 'coefs' is missing"),
    ({"name": "toeplitz", "n": 3, "band": 2, "coefs": [1.0, "x"]}, "key 'coefs' must be a non-empty list"),
    ({"name": "toeplitz", "n": 3, "band": 2, "coefs": []}, "key 'coefs' must be a non-empty list"),
    ({"name": "toeplitz", "n": 3, "band": 2, "coefs": {"a": 1}}, "key 'coefs' must be a non-empty list"),
    ({"name": "toeplitz", "n": 3, "band": 2, "coefs": [0.0, 1.0]}, "coefs\\[0\\] must be nonzero"),
    ({"name": "toeplitz", "n": 3, "band": 2, "coefs": [1.0, 0.5], "inverse_coefs": [1.0, 0.5]}, "inverse_coefs"),
    ({"name": "toeplitz", "n": 3, "band": 3, "coefs": [1.0, 0.5]}, "key 'band' is 3 there, 2 rebuilt"),
    ({"name": "binary_tree", "n": 4, "levels": 2, "rows": 7, "scale": -1.0}, "scale must be a finite number > 0"),
    ({"name": "binary_tree", "n": 4, "levels": 3, "rows": 7}, "key 'levels' is 3 there, 2 rebuilt"),
    ({"name": "blt", "num_buffers": 1, "buf_decay": [0.5], "output_scale": [0.1], "nonnegative": "yes"},
     "key 'nonnegative' must be true or false"),
    ({"name": "blt", "num_buffers": 1, "buf_decay": [1.5], "output_scale": [0.1], "nonnegative": True},
     "buf_decay must lie in \\(0, 1\\)"),
    ({"name": "blt", "num_buffers": 1, "buf_decay": [0.5], "output_scale": [0.1]}, "key 'nonnegative' is missing"),
    ({"name": "blt", "n": 4, "band": 4, "num_buffers": 1, "buf_decay": [0.5], "output_scale": [0.1],
      "nonnegative": True, "scale": 0.0}, "key 'scale' must be > 0"),
    ({"name": "optimal", "n": 4, "adaptive": True, "nonnegative": True}, "older dpmf: it carries no matrix"),
    ({"name": "x", "class": "Foo"}, "key 'class' must be one of"),
    ({"name": "x", "class": "DenseStrategy", "n": 2, "rows": 2, "adaptive": True, "nonnegative": True,
      "sha256": "abc"}, "key 'sha256' must be a lowercase hex"),
    ({"name": "x", "class": "DenseStrategy", "n": 2, "rows": 2, "adaptive": True, "nonnegative": True,
      "sha256": matrix_sha256([[1.0, 2.0], [0.0, 1.0]]), "matrix": [[1.0, 2.0], [0.0, 1.0]]},
     "C must be lower triangular"),
    ({"name": "x", "class": "DenseStrategy", "n": 2, "rows": 2, "adaptive": True, "nonnegative": True,
      "sha256": "0" * 64, "matrix": [[1.0], [0.0, 1.0]]}, "key 'matrix' must be a matrix"),
    ({"name": "stamped", "n": 4, "copies": 2, "block_shape": [2], "sha256": "0" * 64}, "key 'block_shape'"),
]


@pytest.mark.parametrize("d,match", BAD, ids=[m for _, m in BAD])
def test_malformed_descriptions_are_refused_naming_the_key(d, match):
    with pytest.raises(InvalidParameterError, match=match):
        strategy_from_dict(d)


@pytest.mark.parametrize("d", [None, [1, 2], "identity", 3])
def test_non_dict_is_refused(d):
    with pytest.raises(InvalidParameterError, match="must be a dict"):
        strategy_from_dict(d)


def test_every_key_of_a_description_is_checked():
    # set each key of a rich description to another value: an InvalidParameterError (never a raw
    # KeyError/TypeError), unless the edited description is itself valid and rebuilt exactly
    valid = 0
    for s in (bisr(6, 2), BLT([0.5], [0.2]).to_toeplitz(5), BinaryTree(5, 0.5), DenseStrategy(np.tri(3))):
        d = _json(s.describe())
        for key in d:
            for other in (None, "x", -1, [], {"k": 1}, 1e300, True):
                edited = dict(d, **{key: other})
                if edited == d:
                    continue
                try:
                    back = strategy_from_dict(edited)
                except InvalidParameterError:
                    continue
                assert _json(back.describe()) == edited
                valid += 1
    assert valid == 3  # scale 1e300 (BLT, tree) and the free name "x" of a dense strategy


def test_participation_round_trip_and_bad_input():
    for p in (Participation(3, 2), Participation(1), FixedEpochParticipation(3, 4)):
        assert participation_from_dict(_json(p.describe())) == p
    with pytest.raises(InvalidParameterError, match="key 'schema'"):
        participation_from_dict({"schema": "other", "max_participations": 1, "separation": 1})
    with pytest.raises(InvalidParameterError, match="key 'min_sep' is missing"):
        participation_from_dict({"max_participations": 2})
