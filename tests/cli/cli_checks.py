"""Assertions the CLI tests share (imported as a plain module: pytest puts this folder on sys.path)."""

from __future__ import annotations


def one_line_error(res, *needles) -> str:
    """Exit 2, exactly one 'error:' line on stderr (notes aside) containing every needle, no traceback,
    nothing on stdout. Returns the line."""
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output and res.stdout == ""
    lines = [line for line in res.stderr.strip().splitlines() if not line.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
