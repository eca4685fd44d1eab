"""Code files as the notebook user knows them: ``In [N]`` for a cell the ranks or the kernel
ran, a path otherwise, both ways (label a file, resolve what the user typed)."""

from __future__ import annotations

import linecache
import os
import re
from typing import Any

from ..kernel.magic_args import usage
from .session import default_label

_CELL_FILE = re.compile(r"^In\s*\[\s*(\d+)\s*\]$")


class CellFiles:
    """Labels for the kernel's cells (cached: a cell's file never changes its number)."""

    def __init__(self, mesh_magics: Any) -> None:
        self.magics = mesh_magics
        self._labels: dict[str, str] = {}

    def label(self, path: str) -> str:
        """``In [N]`` for a notebook cell (``%%mesh`` or plain), a file's name otherwise."""
        if path in self._labels:
            return self._labels[path]
        if path.startswith("<mesh-cell-"):
            return default_label(path)
        for n, name in self._kernel_cells():
            if name == path:
                self._labels[path] = f"In [{n}]"
                return self._labels[path]
        return default_label(path)

    def _kernel_cells(self) -> list[tuple[int, str]]:
        """``(N, file)`` of this kernel's plain cells, newest first. IPython's compiler keeps
        the map (it is how its tracebacks say "Cell In[N]")."""
        names = getattr(getattr(self.magics.shell, "compile", None), "_filename_map", None) or {}
        return sorted(((n, path) for path, n in names.items()), reverse=True)

    def resolve(self, text: str) -> str:
        """The code file a user means: ``In[N]`` (a cell), ``<mesh-cell-N>``, or a path."""
        m = _CELL_FILE.match(text.strip())
        if m is not None:
            n = int(m.group(1))
            if self.magics.ran_on_mesh(n):
                return f"<mesh-cell-{n}>"
            for k, name in self._kernel_cells():
                if k == n:
                    return name
            raise usage(f"%mesh dbg break: there is no cell In [{n}] yet")
        if text.startswith("<"):
            return text
        path = os.path.abspath(os.path.expanduser(text))
        if not os.path.exists(path):
            raise usage(f"%mesh dbg break: no file {text!r}; give a path or In[N] for a cell")
        return path

    def cell_sources(self) -> dict[str, str]:
        """Plain cells of this kernel (where actor classes may be defined), for the ranks."""
        out = {}
        for path, entry in list(linecache.cache.items()):
            parent = os.path.basename(os.path.dirname(path))
            cell = parent.startswith("ipykernel_") or path.startswith("<ipython-input")
            if cell and len(entry) == 4:  # (size, mtime, lines, fullname); 1-tuples are lazy
                out[path] = "".join(entry[2])
        return out
