"""Values as a notebook shows them: floats rounded to a readable precision.

Display only: a value's ``repr`` and the values handed to Python code stay exact (a table cell
that rounds keeps the exact text for its tooltip). ``0.1 + 0.2`` shows as ``0.3``, not
``0.30000000000000004``.
"""

from __future__ import annotations

import html
import re

SIGNIFICANT = 6  # digits a rounded float keeps
TITLE_CHARS = 2000  # of the exact text, in a tooltip

# Quoted strings in a repr keep their text: digits in a string are not numbers.
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
# A float literal standing alone: not part of a name, a version ("1.2.3") or an address.
_FLOAT = re.compile(r"(?<![\w.])\d+(?:\.\d+(?:[eE][+-]?\d+)?|[eE][+-]?\d+)(?![\w.])")


def round_float(text: str) -> str:
    """One float literal with at most :data:`SIGNIFICANT` significant digits; it stays a float
    literal (``2.0000001`` shows as ``2.0``, not ``2``). One that has no more is kept as it
    is written (``0.1000`` in a tensor's repr)."""
    digits = re.split(r"[eE]", text)[0].replace(".", "").lstrip("0")
    if len(digits) <= SIGNIFICANT:
        return text
    short = f"{float(text):.{SIGNIFICANT}g}"
    if not any(c in short for c in ".e"):
        short += ".0"
    return short


def round_floats(text: str) -> str:
    """``text`` (a repr, or a debugger's rendering of a value) with every float literal outside
    quoted strings rounded by :func:`round_float`."""
    out, start = [], 0
    for string in _STRING.finditer(text):
        out.append(_FLOAT.sub(lambda m: round_float(m.group()), text[start : string.start()]))
        out.append(string.group())
        start = string.end()
    out.append(_FLOAT.sub(lambda m: round_float(m.group()), text[start:]))
    return "".join(out)


def value_cell(text: str, limit: int | None = None, attrs: str = "") -> str:
    """An HTML table cell showing ``text`` rounded and cut to ``limit`` characters, with the
    exact text as its tooltip where it shows less; ``attrs`` go into the tag as they are."""
    shown = round_floats(text)
    if limit is not None and len(shown) > limit:
        shown = shown[: limit - 3] + "..."
    title = f" title='{html.escape(text[:TITLE_CHARS])}'" if shown != text else ""
    return f"<td{attrs}{title}>{html.escape(shown)}</td>"
