"""What a controller's workers and their host agents report, each to the record of its mesh:
a rank is up (READY) or exited (EXIT), its output (LOG, FDLOG), metrics and resource samples,
the actors that own meshes on it (OWNED), an actor mesh stopped (ACTOR_STOPPED), a failure
nobody handled (UNHANDLED). Handled on the I/O thread; the controller (controller.py) makes one
``WorkerReports`` over its tables.
"""

from __future__ import annotations

import logging

from ...errors import ProcDeath
from ..faults import failure_of_broadcast, unhandled_fault_hook
from ..messaging import LogSink, Message, Node, call_records
from ..messaging.envelopes import (
    ActorStoppedEnvelope,
    ExitEnvelope,
    LogEnvelope,
    MetricsEnvelope,
    OwnedEnvelope,
    ReadyEnvelope,
    ResourcesEnvelope,
    UnhandledEnvelope,
)
from ..messaging.protocol import (
    ACTOR_STOPPED,
    EXIT,
    FDLOG,
    LOG,
    METRICS,
    OWNED,
    READY,
    RESOURCES,
    UNHANDLED,
)
from .mesh_record import MeshRecord
from .sampling import Sample
from .tensorboard import TensorBoardExport

logger = logging.getLogger(__name__)


class WorkerReports:
    """The handlers of the reports, over the controller's own tables (shared, not copied)."""

    def __init__(
        self,
        node: Node,
        meshes: dict[str, MeshRecord],
        logs: LogSink,
        stopped_ids: set[str],
        tensorboard: TensorBoardExport | None,
    ) -> None:
        self.meshes = meshes  # mesh id -> record
        self.logs = logs
        self.stopped_ids = stopped_ids  # meshes stop() was called on
        self.tensorboard = tensorboard
        register = node.register
        register(READY, self._on_ready)
        register(EXIT, self._on_exit)
        register(LOG, self._on_log)
        register(FDLOG, self._on_log)
        register(UNHANDLED, self._on_unhandled)
        register(OWNED, self._on_owned)
        register(ACTOR_STOPPED, self._on_actor_stopped)
        register(METRICS, self._on_metrics)
        register(RESOURCES, self._on_resources)

    def _on_ready(self, msg: Message) -> None:
        ready = ReadyEnvelope.of(msg)
        rank = ready.rank
        record = self.meshes.get(ready.mesh_id)
        if record is not None:
            if ready.tcp_port is not None:  # a worker on another host: known only now
                addresses = record.table.addresses
                addresses[rank] = addresses[rank]._replace(tcp=ready.tcp_port)
            record.on_ready(rank, ready.pid)

    def _on_exit(self, msg: Message) -> None:
        ended = ExitEnvelope.of(msg)
        record = self.meshes.get(ended.mesh_id)
        if record is None:
            return
        address = record.table.addresses[ended.rank]
        death = ProcDeath(
            rank=record.table.labels[ended.rank],
            host=address.host,
            pid=ended.pid,
            exitcode=ended.exitcode,
            signal=ended.signal,
            stderr_tail=tuple(ended.stderr_tail) or self.logs.stderr_tail(address.mailbox),
            reason="mesh stopped" if record.stopping else (ended.reason or ""),
        )
        record.on_exit(ended.rank, death)

    def _on_log(self, msg: Message) -> None:
        # "log" comes from a worker's sys.stdout/stderr, "fdlog" from its file descriptors
        # (through the agent); both carry the worker's mailbox, which keys its stderr tail.
        log = LogEnvelope.of(msg)  # an FDLOG has the same fields
        self.logs.write(log.mailbox, log.label, log.stream, log.text)

    def _on_metrics(self, msg: Message) -> None:
        logged = MetricsEnvelope.of(msg)
        record = self.meshes.get(logged.mesh_id)
        if record is not None:
            records = call_records(logged.calls)
            record.metrics.add(logged.rank, records)
            if self.tensorboard is not None:
                label = record.table.labels[logged.rank]
                self.tensorboard.write(logged.mesh_id, label, records)

    def _on_resources(self, msg: Message) -> None:
        sampled = ResourcesEnvelope.of(msg)
        meshes = self.meshes
        for mesh_id, rank, *reading in sampled.samples:
            record = meshes.get(mesh_id)
            if record is not None:
                record.resources.add(rank, Sample(sampled.time, *reading))

    def _on_owned(self, msg: Message) -> None:
        owned = OwnedEnvelope.of(msg)
        record = self.meshes.get(owned.mesh_id)
        if record is not None:
            record.on_owned(owned.rank, owned.owner)

    def _on_actor_stopped(self, msg: Message) -> None:
        stopped = ActorStoppedEnvelope.of(msg)
        record = self.meshes.get(stopped.mesh_id)
        if record is not None:
            record.table.stopped_actors.setdefault(stopped.key, set()).add(stopped.rank)

    def _on_unhandled(self, msg: Message) -> None:
        """A broadcast raised, or an owner actor escalated a failure it did not handle."""
        mesh_id = UnhandledEnvelope.of(msg).mesh_id
        try:
            failure = failure_of_broadcast(msg.value())
        except Exception:
            logger.exception("an unhandled failure report could not be read")
            return
        record = self.meshes.get(mesh_id) if mesh_id else None
        if mesh_id in self.stopped_ids:
            # A rank that is being stopped lost what it owned (its own meshes go with it):
            # the stop's doing, not a failure to report.
            logger.info("a stopping rank of %s reported: %s", mesh_id, failure)
        elif record is not None:
            record.report_unhandled(failure)
        else:
            unhandled_fault_hook(failure)
