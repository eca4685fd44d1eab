"""Rich output of ``%%mesh`` cells on a rank: ``display()``, ``IPython.display`` and matplotlib
figures, turned into MIME bundles here and sent to the kernel through the running cell's port as
it happens, after flushing the rank's pending prints, so text and displays keep their order.

Imported by workers (through ``executor``): no IPython at import time; IPython's own
``display`` is replaced the moment a cell imports it.
"""

from __future__ import annotations

import base64
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import types
from typing import Any

from ..runtime.messaging import Port, flush_output


class _CellOutput(threading.local):
    """Where the cell running on this thread shows its output (set by ``MeshExecutor.run``)."""

    port: Port | None = None
    rank: int = 0


cell_output = _CellOutput()
_REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
)


def mime_bundle(obj: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(data, metadata)`` for ``obj``, as IPython's display formatter would make them."""
    data: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    method = getattr(obj, "_repr_mimebundle_", None)
    if method is not None and not isinstance(obj, type):
        try:
            got = method(include=None, exclude=None)
        except TypeError:
            got = method()
        if isinstance(got, tuple):
            got, md = got
            metadata.update(md or {})
        data.update(got or {})
    for name, mime in _REPR_METHODS:
        if mime in data or isinstance(obj, type):
            continue
        method = getattr(obj, name, None)
        if method is None:
            continue
        value = method()
        if isinstance(value, tuple):
            value, md = value
            metadata[mime] = md
        if value is not None:
            data[mime] = value
    if "image/png" not in data and _is_figure(obj):
        data["image/png"] = _figure_png(obj)
    for mime in ("image/png", "image/jpeg"):
        if isinstance(data.get(mime), bytes):
            data[mime] = base64.b64encode(data[mime]).decode("ascii")
    data.setdefault("text/plain", repr(obj))
    return data, metadata


def _is_figure(obj: Any) -> bool:
    return type(obj).__module__.startswith("matplotlib.") and hasattr(obj, "savefig")


def _figure_png(fig: Any) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def publish(data: dict[str, Any], metadata: dict[str, Any] | None = None) -> None:
    """Send one MIME bundle to the cell's output, labelled with this rank."""
    port = cell_output.port
    if port is None:  # not inside a blocking %%mesh cell: plain text is all we can show
        print(data.get("text/plain", ""))
        return
    flush_output()  # what the cell printed so far arrives first (same ordered pipe)
    port.send(("display", cell_output.rank, data, metadata or {}))


def display(
    *objs: Any, raw: bool = False, metadata: dict[str, Any] | None = None, **_: Any
) -> None:
    """``IPython.display.display`` for cells running on a rank."""
    for obj in objs:
        if raw:
            publish(obj, metadata)
        else:
            data, md = mime_bundle(obj)
            publish(data, {**md, **(metadata or {})})


def flush_figures() -> None:
    """Show and close the figures a cell left open, as the inline backend does."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        for num in plt.get_fignums():
            display(plt.figure(num))
    finally:
        plt.close("all")


class _PatchDisplay(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Replace ``IPython.core.display_functions.display`` the moment it is imported, so
    ``from IPython.display import display`` in a cell gets ours. Costs nothing until then."""

    target = "IPython.core.display_functions"

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.target:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        real = spec.loader

        class Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return real.create_module(spec)

            def exec_module(self, module: types.ModuleType) -> None:
                real.exec_module(module)
                _patch(module)

        spec.loader = Loader()
        return spec


def _patch(module: types.ModuleType) -> None:
    module.display = display  # type: ignore[attr-defined]
    display_mod = sys.modules.get("IPython.display")
    if display_mod is not None:
        display_mod.display = display  # type: ignore[attr-defined]


def install_display_hook() -> None:
    existing = sys.modules.get(_PatchDisplay.target)
    if existing is not None:
        _patch(existing)
    elif not any(isinstance(f, _PatchDisplay) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchDisplay())
    if "MPLBACKEND" not in os.environ and "matplotlib" not in sys.modules:
        try:
            import importlib.util

            if importlib.util.find_spec("matplotlib_inline") is not None:
                os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        except (ImportError, ValueError):
            pass
