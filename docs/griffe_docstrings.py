"""A griffe extension for the API reference: renders dpmf's reST-flavoured docstrings as Markdown.

dpmf's docstrings are plain text with a few reStructuredText habits (doctest examples, ``::``
literal blocks, simple tables, ``:func:`~x.y``` roles, underlined section titles). mkdocstrings
renders docstrings as Markdown, where those habits turn into block quotes, headings or stray
links. This extension rewrites the docstring text (for the site only; the source is unchanged):

* ``>>>`` examples (with their ``...`` continuations and output, up to a blank line) become
  ``pycon`` code blocks;
* a paragraph ending in ``::`` and the indented block after it become a code block;
* reST simple tables (``=== ===`` borders) become code blocks, kept as drawn;
* ``:func:`~a.b.c``` and the other roles become code spans (``c``, or ``a.b.c`` without ``~``);
* a title underlined with ``----`` or ``====`` becomes a bold paragraph.

Loaded by ``mkdocs.yml`` (``extensions: [docs/griffe_docstrings.py]``).
"""

from __future__ import annotations

import re

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|data|attr|exc|obj|ref|const):`(~?)([^`]+)`")
_TABLE_BORDER = re.compile(r"^\s*=+(\s+=+)+\s*$")
_UNDERLINE = re.compile(r"^\s*([-=~^])\1{3,}\s*$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _role(match: re.Match) -> str:
    tilde, target = match.groups()
    target = target.strip()
    if "<" in target and target.endswith(">"):  # :ref:`text <target>`
        target = target[: target.index("<")].strip()
    return f"`{target.split('.')[-1] if tilde else target}`"


def _fence(lines: list[str], lang: str, indent: int) -> list[str]:
    pad = " " * indent
    body = [ln[indent:] if ln[:indent].strip() == "" else ln.lstrip() for ln in lines]
    while body and not body[-1].strip():
        body.pop()
    return [f"{pad}```{lang}", *(pad + ln if ln.strip() else "" for ln in body), f"{pad}```"]


def convert(text: str) -> str:
    """Markdown for one docstring (see the module docstring)."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith(">>>"):  # doctest example, up to the next blank line
            start = i
            while i < len(lines) and lines[i].strip():
                i += 1
            out += _fence(lines[start:i], "pycon", _indent(line))
            continue
        if _TABLE_BORDER.match(line):  # reST simple table: three border lines
            start, borders = i, 0
            while i < len(lines):
                if _TABLE_BORDER.match(lines[i]):
                    borders += 1
                i += 1
                if borders == 3:
                    break
            if out and out[-1].strip():
                out.append("")
            out += _fence(lines[start:i], "text", _indent(line))
            continue
        if (
            i + 1 < len(lines)
            and stripped
            and _UNDERLINE.match(lines[i + 1])
            and len(lines[i + 1].strip()) >= len(stripped) // 2
        ):
            out.append(" " * _indent(line) + f"**{_ROLE.sub(_role, stripped)}**")
            i += 2
            continue
        if stripped.endswith("::"):  # literal block after this paragraph
            base = _indent(line)
            text_part = line.rstrip()[:-2].rstrip()
            if text_part.strip():
                out.append(_ROLE.sub(_role, text_part + ("" if text_part.endswith(":") else ":")))
            i += 1
            start = i
            while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
                i += 1
            block = lines[start:i]
            while block and not block[0].strip():
                block.pop(0)
            if block:
                inner = min(_indent(ln) for ln in block if ln.strip())
                out.append("")
                out += _fence(block, "text", inner)
                out.append("")
            continue
        out.append(_ROLE.sub(_role, line))
        i += 1
    return "\n".join(out)


class ReSTDocstrings(griffe.Extension):
    """Rewrite every docstring once the object tree is loaded."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:  # noqa: D102
        if obj.docstring is not None and not getattr(obj.docstring, "_dpmf_converted", False):
            obj.docstring.value = convert(obj.docstring.value)
            obj.docstring._dpmf_converted = True
