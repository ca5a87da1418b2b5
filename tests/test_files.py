"""dpmf.files: the one loader for every file dpmf reads, and the output-path checks.

Every malformed input -- missing, empty, a folder, random bytes, truncated, a .npy for an .npz,
pickled (object) arrays, foreign archives, bad metadata -- becomes one InvalidParameterError that
names the file and never suggests unpickling; each reader of dpmf (strategy files, GDP ledgers,
Monte Carlo checkpoints, MMCC row caches, matrix archives, reports) goes through it.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest

from dpmf.errors import DPMFError, InvalidParameterError
from dpmf.files import (
    check_output_dir,
    check_output_file,
    read_array,
    read_json,
    read_npz,
    reading,
    writing,
)


def _npz(path, **arrays):
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


@pytest.fixture
def files(tmp_path):
    good = _npz(tmp_path / "good.npz", metadata=np.array(json.dumps({"kind": "k"})), x=np.arange(3.0))
    raw = good.read_bytes()
    out = {
        "missing": (tmp_path / "missing.npz", "no such file"),
        "folder": (tmp_path, "directory"),
        "empty": (tmp_path / "empty.npz", "empty"),
        "random": (tmp_path / "random.npz", "not an .npz archive"),
        "truncated": (tmp_path / "truncated.npz", "truncated or damaged"),
        "npy": (tmp_path / "one.npz", "a single .npy array"),
        "pickled": (tmp_path / "pickled.npz", "pickled (object) data, which dpmf never loads"),
        "no metadata": (_npz(tmp_path / "nometa.npz", x=np.ones(2)), "no metadata record"),
        "metadata not text": (_npz(tmp_path / "meta_num.npz", metadata=np.ones(2)), "not a text record"),
        "metadata not JSON": (_npz(tmp_path / "meta_bad.npz", metadata=np.array("{oops")), "metadata is not JSON"),
        "metadata a list": (_npz(tmp_path / "meta_list.npz", metadata=np.array("[1, 2]")), "metadata is a JSON list"),
        "foreign kind": (_npz(tmp_path / "kind.npz", metadata=np.array('{"kind": "other"}')), "kind 'other'"),
    }
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "random.npz").write_bytes(bytes(range(7, 250)))
    (tmp_path / "truncated.npz").write_bytes(raw[: len(raw) // 2])
    with open(tmp_path / "one.npz", "wb") as fh:
        np.save(fh, np.ones(3))
    with open(tmp_path / "pickled.npz", "wb") as fh:
        np.savez(fh, metadata=np.array(json.dumps({"kind": "k"})), obj=np.array([{"a": 1}], dtype=object))
    return good, out


def test_good_archive_is_read_fully(files):
    good, _ = files
    c = read_npz(good, "test file", kind="k", required=("x",))
    assert c.metadata == {"kind": "k"} and c.arrays["x"].tolist() == [0.0, 1.0, 2.0]
    assert read_npz(io.BytesIO(good.read_bytes()), "test file", kind="k").arrays.keys() == {"x"}


@pytest.mark.parametrize(
    "case", ["missing", "folder", "empty", "random", "truncated", "npy", "pickled", "no metadata",
             "metadata not text", "metadata not JSON", "metadata a list", "foreign kind"],
)
def test_every_malformed_archive_is_one_error_naming_the_file(files, case):
    _, cases = files
    path, reason = cases[case]
    with pytest.raises(InvalidParameterError) as info:
        read_npz(path, "test file", kind="k")
    msg = str(info.value)
    assert msg.startswith(str(path)) and reason in msg, msg
    assert "\n" not in msg and "allow_pickle" not in msg and "pickle.load" not in msg


def test_truncated_in_memory_archive(files):
    good, _ = files
    raw = good.read_bytes()
    with pytest.raises(InvalidParameterError, match="<in-memory file>: not a test file"):
        read_npz(io.BytesIO(raw[:-20]), "test file")


def test_read_array_npy_npz_and_refusals(tmp_path):
    np.save(tmp_path / "m.npy", np.eye(3))
    np.savez(tmp_path / "m.npz", matrix=np.eye(2))
    assert read_array(tmp_path / "m.npy").shape == (3, 3)
    assert read_array(tmp_path / "m.npz").shape == (2, 2)
    np.save(tmp_path / "s.npy", np.array(["a", "b"]))
    with pytest.raises(InvalidParameterError, match="expected numbers"):
        read_array(tmp_path / "s.npy")
    np.save(tmp_path / "o.npy", np.array([{}], dtype=object), allow_pickle=True)
    with pytest.raises(InvalidParameterError, match="pickled") as info:
        read_array(tmp_path / "o.npy")
    assert "allow_pickle" not in str(info.value)
    (tmp_path / "t.npy").write_bytes((tmp_path / "m.npy").read_bytes()[:60])
    with pytest.raises(InvalidParameterError, match="t.npy: not a matrix file"):
        read_array(tmp_path / "t.npy")


def test_read_json(tmp_path):
    (tmp_path / "a.json").write_text('{"x": 1}')
    (tmp_path / "b.json").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "c.json").write_text("{nope")
    assert read_json(tmp_path / "a.json", "report") == {"x": 1}
    with pytest.raises(InvalidParameterError, match="not a JSON text file"):
        read_json(tmp_path / "b.json", "report")
    with pytest.raises(InvalidParameterError, match="not JSON"):
        read_json(tmp_path / "c.json", "report")
    with pytest.raises(InvalidParameterError, match="cannot read the report"):
        read_json(tmp_path / "missing.json", "report")


def test_reading_names_the_file_for_any_error(tmp_path):
    with pytest.raises(InvalidParameterError, match=r"f.npz: corrupt ledger \(missing field 'run_id'\)"):
        with reading("f.npz", "ledger"):
            {}["run_id"]
    with pytest.raises(InvalidParameterError, match=r"f.npz: corrupt ledger \(TypeError"):
        with reading("f.npz", "ledger"):
            int(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match=r"f.npz: corrupt ledger \(steps must be"):
        with reading("f.npz", "ledger"):
            raise InvalidParameterError("steps must be >= 0")


def test_output_checks(tmp_path):
    (tmp_path / "file").write_text("x")
    assert check_output_file(tmp_path / "new.png", "--plot") == tmp_path / "new.png"
    for path, reason in [
        (tmp_path / "nope" / "a.png", "the folder"),
        (tmp_path, "is a directory"),
        (tmp_path / "file" / "a.png", "is not a folder"),
    ]:
        with pytest.raises(InvalidParameterError, match=reason) as info:
            check_output_file(path, "--plot")
        assert str(info.value).startswith("--plot ")
    assert check_output_dir(tmp_path / "a" / "b", "cache_dir").is_dir()
    with pytest.raises(InvalidParameterError, match="cache_dir .* not a folder"):
        check_output_dir(tmp_path / "file", "cache_dir")
    with pytest.raises(InvalidParameterError, match="cannot write the plot"):
        with writing(tmp_path / "x.png", "plot"):
            raise PermissionError(13, "Permission denied")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_folder(tmp_path):  # pragma: no cover - CI runs as root
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(DPMFError, match="not writable"):
        check_output_file(ro / "x.npz", "path")
