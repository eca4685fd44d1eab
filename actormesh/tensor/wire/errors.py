"""Errors of the tensor layer: a worker op that failed, and where the user issued it."""

from __future__ import annotations

from collections.abc import Sequence

from ... import cell_names
from ...errors import ActorError, RemoteFailure, format_ranks


class RemoteTensorError(ActorError):
    """A tensor op failed on one or more ranks; raised at the sync point that touched its result.

    ``failures`` has one entry per failed rank (``rank`` is the first one's coordinates, e.g.
    ``"{dp=1, tp=1}"``; ``ranks`` all of them). ``op`` is the op that failed (the original
    failure, not an op that merely depended on it), ``site`` the ``file:line`` of the user's code
    that issued it (with ``ACTORMESH_TENSOR_TRACEBACKS=1``, the whole controller stack that
    issued it, outermost frame first), and ``remote_traceback`` the worker's traceback as text.
    """

    def __init__(self, failures: Sequence[RemoteFailure], op: str = "", site: str = ""):
        self.op = op
        self.site = site
        super().__init__(failures)

    def __reduce__(self):
        return (type(self), (self.failures, self.op, self.site))

    @property
    def ranks(self) -> list[str]:
        return [f.rank for f in self.failures]

    def _heading(self, ranks: list[str], failure: RemoteFailure) -> str:
        # The op that failed (``aten.mm.default``, ``remote function clip``), not the engine.
        return f"[{format_ranks(ranks)}] {failure.endpoint} raised {failure.headline()}"

    def _where(self) -> str:
        # One file:line, or the whole controller stack (ACTORMESH_TENSOR_TRACEBACKS=1); a
        # notebook cell's file as IPython names it ("Cell In[8], line 10").
        site = cell_names.in_text(self.site)
        if "\n" in site:
            return f"from (controller stack, most recent call last):\n{site}"
        return f"at {site}"

    def _summary(self) -> str:
        head = super()._summary()
        return f"{head}\n(op {self.op} issued {self._where()})" if self.site else head

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text}\nThe op {self.op} was issued {self._where()}" if self.site else text

    def _render_traceback_(self) -> list[str]:
        lines = super()._render_traceback_()
        if self.site:
            lines.extend(f"(op {self.op} issued {self._where()})".splitlines())
        return lines
