"""Code locations as the notebook user knows them: ``Cell In[8], line 10``, IPython's own form,
for the file that IPython compiled cell 8 into (``/tmp/ipykernel_11051/3000816498.py``).

Remote tracebacks are text made on the ranks, which know nothing of the kernel's cells; the
names are put in where the text is shown, in the process that runs the notebook. Outside
IPython (a script), every location stays as it is.
"""

from __future__ import annotations

import re
import sys

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_SITE = re.compile(r"(\S+\.py):(\d+)\b")


def cell_name(filename: str) -> str | None:
    """``In[8]`` for the file of the kernel's cell 8; None for any other file, or outside IPython
    (nothing is imported: without IPython loaded there is no notebook)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        shell = ipython.get_ipython()
        named = shell.compile.format_code_name(filename)  # ("Cell", "In[8]") or None
    except Exception:  # no shell, or an IPython without the method: the file's own name
        return None
    return named[1] if named else None


def in_text(text: str) -> str:
    """``text`` (a traceback, or ``issued at path.py:10``) with each cell's file as its cell."""
    if "IPython" not in sys.modules or not text:
        return text
    return _SITE.sub(_named, _FRAME.sub(_named, text))


def _named(m: re.Match[str]) -> str:
    """A matched (file, line) as ``Cell In[8], line 10`` if the file is a cell's."""
    cell = cell_name(m.group(1))
    return f"Cell {cell}, line {m.group(2)}" if cell else m.group(0)
