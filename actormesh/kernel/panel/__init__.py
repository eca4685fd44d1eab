"""The kernel's side of the actormesh JupyterLab sidebar (``labextension/``).

``protocol`` is the versioned message schema (see ``docs/panel-protocol.md``), ``watch`` builds
the per-rank view of every live mesh, ``service`` serves requests and pushes updates.
"""

from __future__ import annotations

from .protocol import PROTOCOL_VERSION as PROTOCOL_VERSION
from .protocol import REPLY_TYPE as REPLY_TYPE
from .protocol import REQUEST_TYPE as REQUEST_TYPE
from .service import PanelService as PanelService
