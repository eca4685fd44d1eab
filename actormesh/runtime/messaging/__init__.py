"""Messages between processes: signed frames over ZeroMQ, each process's node and inboxes.

The face of ``runtime/messaging``: other layers import these names from here, never from its
modules, with two exceptions, public as modules since every layer that sends or handles a
message names its kind and reads its fields (``tests/unit/test_faces.py``): ``protocol``, the
table of every message kind and its fields (``from ..messaging.protocol import CALL``), and
``envelopes``, each kind's envelope by field name (``CallEnvelope.of(msg).endpoint``),
generated from that table.

- Messages: ``Message`` (a received envelope and its payload), ``dumps``/``loads`` (the one
  pickle boundary, ``codec``), ``Address`` (where a process or actor listens).
- A process's node: ``Node`` (handlers by kind, ports, deaths), ``current_node``, ``Port`` (a
  reply address), ``reply_port``; its ``Transport`` (sockets and the I/O thread).
- Inboxes: an actor's own socket (``ActorInbox`` and its item kinds), a thread's reply inbox
  (``ReplyInbox``, ``thread_reply_inbox``).
- Output and metrics of ranks: ``LogSink``, ``flush_output``, ``MetricsLog``, ``log_metrics``.
- Shared memory for large payloads between processes of a host (``shm_lane``), run
  directories, CURVE keys, tunnels.
"""

from .actor_inbox import (
    CALL_ITEM,
    NOTHING,
    SPAWN_ITEM,
    STOP_ITEM,
    SUPERVISE_ITEM,
    TASK_ITEM,
    ActorInbox,
)
from .address import Address, actor_address
from .codec import Message, dumps, loads, new_id, new_key, payload_digest, read_key_file
from .curve import curve_keys
from .logs import TEE_MARK, LogSink, capture_output, flush_output, rank_label
from .main_inbox import hand_back_replies, thread_reply_inbox, waiting_inbox
from .metrics import MetricsLog, call_records, in_worker, local_log, log_metrics, start_outbox
from .node import (
    FAILED_VALUE,
    OK_VALUE,
    SHUT_DOWN,
    Node,
    Port,
    current_node,
    node_if_started,
    port_of,
    reply_port,
    sender_rank,
    set_node,
    set_node_factory,
    spawn_hint,
)
from .plain_pickle import SIMPLE_TYPES
from .reply_inbox import ReplyInbox
from .run_dir import forget_shared_memory, make_run_dir, remove_segments
from .shm_lane import SHM_DIR, NoRoom, map_reserved
from .transport import Transport
from .tunnel import TunnelEnds, open_tunnel

__all__ = [
    "CALL_ITEM",
    "FAILED_VALUE",
    "NOTHING",
    "OK_VALUE",
    "SHM_DIR",
    "SHUT_DOWN",
    "SIMPLE_TYPES",
    "SPAWN_ITEM",
    "STOP_ITEM",
    "SUPERVISE_ITEM",
    "TASK_ITEM",
    "TEE_MARK",
    "ActorInbox",
    "Address",
    "LogSink",
    "Message",
    "MetricsLog",
    "NoRoom",
    "Node",
    "Port",
    "ReplyInbox",
    "Transport",
    "TunnelEnds",
    "actor_address",
    "call_records",
    "capture_output",
    "current_node",
    "curve_keys",
    "dumps",
    "flush_output",
    "forget_shared_memory",
    "hand_back_replies",
    "in_worker",
    "loads",
    "local_log",
    "log_metrics",
    "make_run_dir",
    "map_reserved",
    "new_id",
    "new_key",
    "node_if_started",
    "open_tunnel",
    "payload_digest",
    "port_of",
    "rank_label",
    "read_key_file",
    "remove_segments",
    "reply_port",
    "sender_rank",
    "set_node",
    "set_node_factory",
    "spawn_hint",
    "start_outbox",
    "thread_reply_inbox",
    "waiting_inbox",
]
