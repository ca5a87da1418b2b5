"""Issue 24 items 8 and 9: environment variables with bad values, strategy files whose matrix no longer
matches its recorded SHA-256, and output paths checked (for the real reason) before any work.

Each bad input is refused with exit status 2 and one ``error:`` line naming what to change, at once;
the one place refusing would be wrong (an unwritable *default* cache folder nobody asked for) is a
single note.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli_checks import one_line_error
from dpmf.cli.main import app
from dpmf.errors import DPMFError, InvalidParameterError

runner = CliRunner()
HAS_PROC = Path("/proc/self").is_dir()
proc_only = pytest.mark.skipif(not HAS_PROC, reason="needs Linux /proc (a folder that takes no new files)")

ACCOUNT = ["account", "--strategy", "tree", "--steps", "8", "--sampling-prob", "0.1", "--noise-multiplier", "2",
           "--delta", "1e-5"]


def invoke(args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env)


class _Reached(DPMFError):
    pass


@pytest.fixture
def no_work(monkeypatch):
    """The planner and the accountant stop the command with a marker error if they are reached."""
    import dpmf.accounting
    import dpmf.planner

    def reached(*a, **k):
        raise _Reached("the work started")

    monkeypatch.setattr(dpmf.planner, "plan", reached)
    monkeypatch.setattr(dpmf.accounting, "account", reached)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from dpmf.accounting.individual import IndividualGDPLedger
    from dpmf.strategies import DenseStrategy, catalog
    from dpmf.strategies.stamping import StampedEncoder

    root = tmp_path_factory.mktemp("files")
    C = np.tri(8) + 0.5 * np.tri(8, k=-1)
    catalog.save(DenseStrategy(C, name="optimal"), root / "dense.npz")
    catalog.save(StampedEncoder(np.tri(4), 2), root / "stamped.npz")
    IndividualGDPLedger(4, 1.0, run_id="r").save(root / "ledger.npz")

    def edit(src, dst, change):
        arrays = dict(np.load(root / src))
        arrays["encoder"] = change(arrays["encoder"].copy())
        with open(root / dst, "wb") as fh:
            np.savez_compressed(fh, **arrays)

    def bump(i, j):
        def change(enc):
            enc[i, j] += 1e-9
            return enc
        return change

    edit("dense.npz", "dense-edited.npz", bump(3, 1))
    edit("dense.npz", "dense-grown.npz", lambda enc: enc * 2.0)
    edit("stamped.npz", "stamped-both-blocks.npz", lambda enc: bump(6, 4)(bump(2, 0)(enc)))
    edit("stamped.npz", "stamped-second-block.npz", bump(6, 4))
    return root


# ============================================================== item 8: environment variables
BAD_ENV = [
    ("DPMF_PROGRESS", "banana", "auto, bar, log, off"),
    ("DPMF_PROGRESS", "of", "auto, bar, log, off"),
    ("DPMF_PROGRESS_INTERVAL", "abc", "seconds >= 0"),
    ("DPMF_PROGRESS_INTERVAL", "-5", "seconds >= 0"),
    ("DPMF_PROGRESS_INTERVAL", "nan", "seconds >= 0"),
]


@pytest.mark.parametrize("command", [
    ACCOUNT,
    ["plan"],
    ["strategy", "show", "{dense}"],
    ["montecarlo", "run", "--strategy", "bsr", "--bands", "2", "--steps", "8", "--sampling", "b-min-sep",
     "--min-sep", "2", "--sampling-prob", "0.1", "--noise-multiplier", "1", "--delta", "1e-2"],
])
@pytest.mark.parametrize("var,value,valid", BAD_ENV)
def test_a_bad_progress_variable_is_refused_before_any_work(files, no_work, command, var, value, valid):
    args = [a.replace("{dense}", str(files / "dense.npz")) for a in command]
    line = one_line_error(invoke(args, env={var: value}), f"environment variable {var}={value!r}", valid)
    assert "the work started" not in line


@pytest.mark.parametrize("env,expected", [
    ({}, ("auto", 10.0)),
    ({"DPMF_PROGRESS": "", "DPMF_PROGRESS_INTERVAL": ""}, ("auto", 10.0)),
    ({"DPMF_PROGRESS": " OFF "}, ("off", 10.0)),
    ({"DPMF_PROGRESS": "log", "DPMF_PROGRESS_INTERVAL": "0"}, ("log", 0.0)),
    ({"DPMF_PROGRESS_INTERVAL": "2.5"}, ("auto", 2.5)),
    ({"DPMF_PROGRESS_INTERVAL": "inf"}, ("auto", float("inf"))),
])
def test_valid_progress_variables_are_read(monkeypatch, env, expected):
    from dpmf.cli.console import progress_settings

    monkeypatch.delenv("DPMF_PROGRESS", raising=False)
    monkeypatch.delenv("DPMF_PROGRESS_INTERVAL", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert progress_settings() == expected


@pytest.mark.parametrize("var,value", [(v, x) for v, x, _ in BAD_ENV])
def test_progress_settings_raise_a_dpmf_error_naming_the_variable(monkeypatch, var, value):
    from dpmf.cli.console import progress_settings

    monkeypatch.setenv(var, value)
    with pytest.raises(InvalidParameterError, match=f"environment variable {var}="):
        progress_settings()


def _bad_cache_dirs(tmp_path):
    (tmp_path / "file").write_text("x")
    cases = [(tmp_path / "file", "exists and is not a folder"),
             (tmp_path / "file" / "sub", "cannot be created")]
    if HAS_PROC:
        cases += [(Path("/proc/dpmf-cache"), "cannot be created"), (Path("/proc/self"), "'/proc/self'")]  # not writable
    return cases


def test_a_bad_dpmf_cache_dir_is_refused_by_plan_before_any_work(tmp_path, no_work):
    for folder, reason in _bad_cache_dirs(tmp_path):
        line = one_line_error(invoke(["plan"], env={"DPMF_CACHE_DIR": str(folder)}),
                              "environment variable DPMF_CACHE_DIR", reason, "writable folder")
        assert "the work started" not in line


def test_dpmf_cache_dir_is_refused_by_the_library_too(tmp_path, monkeypatch):
    from dpmf.planning.cache import default_cache_dir

    for folder, reason in _bad_cache_dirs(tmp_path):
        monkeypatch.setenv("DPMF_CACHE_DIR", str(folder))
        with pytest.raises(InvalidParameterError, match=f"DPMF_CACHE_DIR .*{reason}"):
            default_cache_dir()
    monkeypatch.setenv("DPMF_CACHE_DIR", str(tmp_path / "new" / "cache"))
    assert default_cache_dir() == tmp_path / "new" / "cache" and (tmp_path / "new" / "cache").is_dir()


@pytest.mark.parametrize("flags", [["--no-cache"], ["--cache-dir", "{tmp}/rows"]])
def test_dpmf_cache_dir_is_not_read_when_the_command_line_says_otherwise(tmp_path, no_work, flags):
    (tmp_path / "file").write_text("x")
    args = ["plan", *[f.replace("{tmp}", str(tmp_path)) for f in flags]]
    one_line_error(invoke(args, env={"DPMF_CACHE_DIR": str(tmp_path / "file")}), "the work started")


def test_an_unwritable_default_cache_folder_is_one_note_and_the_plan_runs(tmp_path, no_work, monkeypatch):
    """Nobody asked for ~/.cache/dpmf: refusing would be wrong (the cache only saves time)."""
    (tmp_path / "file").write_text("x")
    monkeypatch.delenv("DPMF_CACHE_DIR")
    res = invoke(["plan"], env={"XDG_CACHE_HOME": str(tmp_path / "file")})
    one_line_error(res, "the work started")  # the plan was reached
    notes = [line for line in res.stderr.splitlines() if "rows will not be cached" in line]
    assert len(notes) == 1 and notes[0].startswith("note: the default cache folder"), res.stderr


# ============================================================== item 9: strategy files' recorded digest
DIGEST_COMMANDS = [
    ["strategy", "show", "{f}"],
    ["account", "--strategy", "{f}", "--sampling-prob", "0.1", "--noise-multiplier", "2", "--delta", "1e-5"],
]


@pytest.mark.parametrize("command", DIGEST_COMMANDS)
@pytest.mark.parametrize("name,reason", [
    ("dense-edited", "the encoder hashes to sha256"),
    ("dense-grown", "the encoder hashes to sha256"),
    ("stamped-both-blocks", "the encoder's block hashes to sha256"),
    ("stamped-second-block", "is not 2 copies of its block"),
])
def test_a_strategy_file_whose_matrix_no_longer_matches_its_sha256_is_refused(files, command, name, reason):
    path = files / f"{name}.npz"
    args = [str(path) if a == "{f}" else a for a in command]
    one_line_error(invoke(args), f"{path}: corrupt strategy file", reason)


@pytest.mark.parametrize("name", ["dense", "stamped"])
def test_an_unedited_strategy_file_is_accepted(files, name):
    res = invoke(["strategy", "show", files / f"{name}.npz", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["strategy"]["name"] in ("optimal", "stamped")


def test_the_library_loader_verifies_the_digest(files):
    from dpmf.strategies import catalog

    with pytest.raises(InvalidParameterError, match="dense-edited.npz: corrupt strategy file .*sha256"):
        catalog.load(files / "dense-edited.npz")


# ============================================================== item 9: output paths before the work
def _output_cases(files, tmp):
    mc = ["montecarlo", "run", "--strategy", "bsr", "--bands", "2", "--steps", "8", "--sampling", "b-min-sep",
          "--min-sep", "2", "--sampling-prob", "0.1", "--noise-multiplier", "1", "--delta", "1e-2", "--checkpoint"]
    cases = [
        (["plan", "--plot", tmp / "nope" / "p.png"], "--plot", "does not exist"),
        (["plan", "--plot", tmp], "--plot", "is a directory"),
        (["plan", "--plot", tmp / "p.foo"], "--plot", "extension '.foo'"),
        (["plan", "--plot", tmp / "p"], "--plot", "no file extension"),
        (["plan", "--plot", tmp / "file" / "p.png"], "--plot", "is not a folder"),
        (["individual", "report", files / "ledger.npz", "--plot", tmp / "e.txt"], "--plot", "extension '.txt'"),
        (["strategy", "build", "identity", "--steps", "4", "--out", tmp / "s.bin"], "--out", "must end in .npz"),
        (["strategy", "build", "identity", "--steps", "4", "--out", tmp], "--out", "is a directory"),
        ([*mc, tmp / "nope" / "c.npz"], "--checkpoint", "does not exist"),
        ([*ACCOUNT, "--cache-dir", tmp / "file"], "--cache-dir", "not a folder"),
    ]
    if HAS_PROC:
        cases += [
            (["plan", "--plot", "/proc/p.png"], "--plot", "/proc"),
            (["individual", "report", files / "ledger.npz", "--plot", "/proc/e.png"], "--plot", "/proc"),
            (["strategy", "build", "identity", "--steps", "4", "--out", "/proc/s.npz"], "--out", "/proc"),
            ([*mc, "/proc/c.npz"], "--checkpoint", "/proc"),
            ([*ACCOUNT, "--cache-dir", "/proc/self"], "--cache-dir", "/proc"),
        ]
    return cases


def test_output_paths_are_refused_at_once_with_the_real_reason(files, tmp_path, no_work):
    (tmp_path / "file").write_text("x")
    for args, option, reason in _output_cases(files, tmp_path):
        line = one_line_error(invoke(args), f"error: {option} ", reason)
        assert "the work started" not in line  # at once: before the planner or an accountant ran (no_work)
        if "/proc" in reason:
            assert "not writable" in line or "cannot write" in line or "cannot be created" in line, line


@proc_only
def test_plan_plot_into_proc_fails_before_the_plan(no_work):
    """The issue's example: `dpmf plan --plot /proc/p.png` failed after 136 s (also when run as root,
    where permission bits say every folder is writable): now at once, saying why."""
    line = one_line_error(invoke(["plan", "--plot", "/proc/p.png"]), "--plot '/proc/p.png'")
    assert "cannot write in the folder '/proc'" in line or "not writable" in line


@proc_only
def test_montecarlo_resume_checks_its_checkpoint_is_writable(tmp_path, monkeypatch):
    """'resume' saves every chunk into its checkpoint: an unwritable one is refused before sampling."""
    import dpmf.files
    from dpmf.accounting.montecarlo.run import MonteCarloRun
    from dpmf.sampling import PoissonSampling

    def gauss(strategy, scheme, sigma, m, rng, *, direction="remove"):
        y = rng.normal(1.0 if direction == "remove" else 0.0, sigma, m)
        ll = (2 * y - 1) / (2 * sigma**2)
        return ll if direction == "remove" else -ll

    path = tmp_path / "mc.npz"
    MonteCarloRun(None, PoissonSampling(1.0, 1), 1.0, 1000, seed=0, chunk_size=500, sampler=gauss,
                  checkpoint=path).run()
    real = dpmf.files._cannot_create_in
    monkeypatch.setattr(dpmf.files, "_cannot_create_in",
                        lambda folder: "read-only file system" if Path(folder) == tmp_path else real(folder))
    one_line_error(invoke(["montecarlo", "resume", path]), "checkpoint", "read-only file system")


def test_check_output_file_tries_for_real(tmp_path, monkeypatch):
    """Permission bits are not trusted (root passes them everywhere): a folder that refuses a new file
    is reported with the reason the system gives."""
    import errno
    import tempfile

    from dpmf.files import check_output_dir, check_output_file

    def refuse(**kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(InvalidParameterError, match=r"--plot .*cannot write in the folder .*read-only file system"):
        check_output_file(tmp_path / "p.png", "--plot", plot=True)
    with pytest.raises(InvalidParameterError, match=r"--cache-dir .*cannot write in it \(read-only file system\)"):
        check_output_dir(tmp_path, "--cache-dir")
    assert not list(tmp_path.iterdir())  # the check leaves nothing behind
