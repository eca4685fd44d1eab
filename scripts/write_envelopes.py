"""Write actormesh/runtime/messaging/envelopes.py from the table in protocol.py: run it after a
change to the table (tests/unit/test_protocol.py fails until envelopes.py is what it writes).

    python scripts/write_envelopes.py

It loads protocol.py alone, not the package, so it works while envelopes.py is stale.
"""

from __future__ import annotations

import importlib.util
import pathlib

PROTOCOL = (
    pathlib.Path(__file__).resolve().parent.parent / "actormesh/runtime/messaging/protocol.py"
)

spec = importlib.util.spec_from_file_location("protocol", PROTOCOL)
assert spec is not None and spec.loader is not None
protocol = importlib.util.module_from_spec(spec)
spec.loader.exec_module(protocol)
protocol.write_envelopes()
print(f"wrote {PROTOCOL.with_name('envelopes.py')}")
