"""Issue 44: the CLI writes in any locale. Under ``PYTHONIOENCODING=ascii`` (or a minimal container's
``LANG=C``) a character the output cannot take ("Rényi") degrades to ASCII instead of a traceback.

Each locale runs in one subprocess (the encoding of stdout is fixed when Python starts) that walks
every command's ``--help`` and a few real commands through the console entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpmf.cli.console import _ascii_degrade, degrade_unencodable_output

SRC = Path(__file__).resolve().parents[2] / "src"

#: runs inside the subprocess: every command's --help (wide and narrow), then real commands; each
#: result is "<args> -> <exit code>" on stderr so the test sees which one failed
DRIVER = r"""
import sys, os
import typer.main
from dpmf.cli.main import app, run

def walk(c, path):
    yield path
    for name, sub in getattr(c, "commands", {}).items():
        yield from walk(sub, path + [name])

cases = [p + ["--help"] for p in walk(typer.main.get_command(app), [])]
cases += [
    ["individual", "steps", "--noise-multiplier", "100", "--epsilon", "0.81563", "--delta", "1e-5"],
    ["account", "--strategy", "tree", "--steps", "8", "--sampling-prob", "0.1", "--noise-multiplier", "2",
     "--delta", "1e-5"],
    ["strategy", "build", "tree", "--steps", "8", "--out", os.path.join(sys.argv[1], "tree.npz")],
    ["strategy", "show", os.path.join(sys.argv[1], "tree.npz"), "--participation", "fixed-epoch", "--epochs", "2"],
    ["account", "--steps", "-3", "--noise-multiplier", "1", "--delta", "1e-5"],
    ["account", "--bogus"],
]
for args in cases:
    sys.argv = ["dpmf", *args]
    try:
        run()
    except SystemExit as exc:
        print(f"CASE {' '.join(args)} -> {exc.code}", file=sys.stderr)
"""


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii", "DPMF_PROGRESS": "bar"},
                                 {"LANG": "C", "LC_ALL": "C", "COLUMNS": "60"}],
                         ids=["PYTHONIOENCODING=ascii-bar", "LANG=C-narrow"])
def test_every_command_writes_in_an_ascii_locale(env, tmp_path):
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "LANG", "LC_ALL", "COLUMNS")}
    full.update(env, PYTHONPATH=str(SRC))
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path)], env=full, capture_output=True, timeout=120)
    stderr = proc.stderr.decode("ascii", "replace")
    assert proc.returncode == 0 and "Traceback" not in stderr and "UnicodeEncodeError" not in stderr, stderr
    codes = dict(line[5:].rsplit(" -> ", 1) for line in stderr.splitlines() if line.startswith("CASE "))
    assert len(codes) >= 20, stderr
    helps = {args: code for args, code in codes.items() if args.endswith("--help")}
    assert set(helps.values()) == {"0"}, helps
    assert codes["individual steps --noise-multiplier 100 --epsilon 0.81563 --delta 1e-5"] == "0"
    assert [code for args, code in codes.items() if args.startswith("strategy ") and "--help" not in args] == ["0", "0"]
    assert codes["account --steps -3 --noise-multiplier 1 --delta 1e-5"] == "2"
    assert codes["account --bogus"] == "2"
    stdout = proc.stdout.decode(env.get("PYTHONIOENCODING", "utf-8"))  # (LANG=C: Python's UTF-8 mode)
    assert "Renyi filter" in stdout or "Rényi filter" in stdout  # the accent degrades, the line stays
    if env.get("PYTHONIOENCODING") == "ascii":
        assert "Renyi filter: 420 full-gradient steps" in stdout
        assert max(proc.stdout) < 128  # nothing but ASCII reached the stream


def test_ascii_degrade_maps_accents_and_symbols():
    degrade_unencodable_output(object())  # registers the handler (an object that is not a stream is skipped)
    text = "Rényi — ε ≤ 2 × σ, μ ∞ ∩ ☃ naïve"
    assert text.encode("ascii", errors="dpmf-ascii").decode() == "Renyi -- eps <= 2 x sigma, mu inf & ? naive"


def test_a_utf8_stream_and_a_chosen_handler_are_left_alone(tmp_path):
    import io

    utf8 = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    chosen = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="replace")
    strict = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    degrade_unencodable_output(utf8, chosen, strict)
    assert (utf8.errors, chosen.errors, strict.errors) == ("strict", "replace", "dpmf-ascii")
    strict.write("Rényi")
    strict.flush()
    assert strict.buffer.getvalue() == b"Renyi"
    with pytest.raises(UnicodeDecodeError):  # the handler is for encoding only
        _ascii_degrade(UnicodeDecodeError("ascii", b"\xff", 0, 1, "x"))
