"""Live recovery of a meshed training run: ``am.FaultTolerant``.

::

    ft = am.FaultTolerant({"model": model, "optim": optimizer}, checkpoint_id="ckpt",
                          checkpoint_every=100)
    while ft.step < steps:
        try:
            loss = train_step(batches[ft.step])
            losses.append(loss.item())      # the step's sync point
            ft.commit()                     # the step completed: recovery comes back here
        except am.SupervisionError:
            ft.recover()                    # heal, restore, go on from ft.step

The design, after reading torchft and TorchElastic. TorchElastic restarts every worker and
reloads the last checkpoint: simple, but every healthy process is lost with the dead one, and
so is the work since that checkpoint. torchft keeps the healthy replicas running: a Lighthouse
forms a quorum per step, ``should_commit`` lets the optimizer step only if no replica failed,
and a recovering replica gets the state of the last committed step live from a healthy peer.
Here the controller already is what torchft's Lighthouse and Manager provide: it knows which
ranks live (the runtime's supervision reports a death in milliseconds), and it orders every op
of every rank, so no quorum protocol is needed. What we take from torchft is the idea of a
*committed step* and of a live transfer from a healthy replica; we do not use its code: its
unit of failure is a whole replica group of an SPMD job (each with a Manager, its store and a
Rust Lighthouse), while here one rank of an FSDP or tensor-parallel mesh is lost and the
controller must rebuild the mesh around it.

- ``commit()`` records one ``snapshot`` op right after the step's sync point (so every rank
  runs it before any collective of the next step): each rank copies its shards of the state
  (memory: one more copy of the model and optimizer state per rank). The controller keeps its
  own part (optimizer step counts, learning rates, plain values).
- ``recover()``: ``procs.heal()`` respawns the dead ranks; each survivor's old engine is freed
  from any collective stuck on the dead peer (worker/recovery.py) and reports its snapshot;
  a new process group and engine start (``TensorMesh.restart``); a ``restore`` op puts every
  value of the committed step back under its id (a meshed model is only its MeshTensors: the
  ranks keep no module, so nothing else is built again), survivors from their own copy,
  respawned ranks from a survivor holding the same shard. A value whose every holder died (an
  FSDP shard with no replica) comes from the last checkpoint instead, and then the whole state
  does, so the model never mixes two steps. Every other MeshTensor of the mesh is gone (using
  one raises ``MeshClosedError`` at the user's line).
- ``shrink()`` (no spare process): the engine restarts on the survivors, leaving out each
  slice along the data-parallel dimension that lost a rank; values replicated along it come
  from the survivors' own copies (no transfer), values split along it (FSDP) from the last
  checkpoint, which DCP reshards. The batch a model is given is split over the ranks left
  (the numbers stay those of one process), and ``on_resize`` (the user's rule, e.g. for the
  learning rate) is called with the new size. ``grow()`` respawns the lost ranks (or takes a
  spare host, ``hosts=``) and brings the mesh back whole: the survivors first copy each value
  whole along the data dimension (one collective), so every rank then takes its own slice.
  ``recover()`` on a shrunk mesh also brings it back whole.

Which rank sends which value to which is decided from the ranks' reports in recovery_plan.py.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import compat
from ..wire.ops import issue_site
from ..worker.recovery import _RecoveryAgent
from . import checkpoint, checkpoint_state, recovery_plan
from .fetch import fetch_value
from .mesh import SETUP_TIMEOUT
from .module import MeshModule, forget_engine_values, placement
from .restore import from_checkpoint, from_replicas
from .tensor import OpaqueRef

logger = logging.getLogger(__name__)

_agents = itertools.count(1)
# proc mesh id -> its training run's last recovery as the sidebar shows it (kernel/panel reads
# it through tools.recovery_of: the phase, what was lost, the step; see _announce)
RECOVERIES: dict[str, dict[str, Any]] = {}
KEEP_GENERATIONS = 4  # the controller's parts of the last commits (ranks keep one each)
UNBLOCK_TIMEOUT = 30.0  # seconds for an engine to stop once its group's sockets are shut
NO_SNAPSHOT: recovery_plan.Report = (-1, {}, {}, {})


@dataclass
class Commit:
    gen: int
    step: int
    spec: checkpoint_state.Spec


@dataclass
class RecoveryReport:
    """What one ``recover()``, ``shrink()`` or ``grow()`` did (``ft.recoveries`` keeps them;
    the sidebar shows them)."""

    kind: str  # "recover", "shrink" or "grow"
    ranks: list[str]  # the ranks lost (recover: respawned; shrink: left out), or that rejoined
    step: int  # the step training resumes from
    source: str  # "replicas" (the ranks' copies of the last commit) or "checkpoint"
    sizes: dict[str, int]  # the mesh's sizes after it
    seconds: float
    started: float = field(default=0.0, repr=False)  # time.time() when it began


@dataclass
class _Change:
    """One recover, shrink or grow: the ranks it is about, the processes the new engine runs
    on, those that leave the old one (``stuck``: it may wait on a dead peer), when it began."""

    kind: str
    ranks: list[str]
    procs: Any
    leaving: Any
    stuck: bool
    started: float


class FaultTolerant:
    """A training run that survives the loss of a rank (see the module docs).

    ``state`` is a checkpoint's state dict (``{"model": model, "optim": optimizer, ...}``, as
    ``am.checkpoint.save`` takes). ``checkpoint_id`` and ``checkpoint_every``: a background
    checkpoint every that many committed steps, what recovery falls back to when no replica
    holds a lost shard. ``on_resize(size, previous)``: called after the data-parallel dimension
    changed size (``shrink``, ``grow``), for the user's rule (the learning rate, the batch).
    ``step`` counts the committed steps. Methods are for the controller's thread.
    """

    def __init__(
        self,
        state: dict[str, Any],
        *,
        checkpoint_id: Any = None,
        checkpoint_every: int | None = None,
        on_resize: Callable[[int, int], None] | None = None,
    ) -> None:
        spec = checkpoint_state.build(state, "FaultTolerant")
        assert spec.mesh is not None
        if checkpoint_every is not None and checkpoint_id is None:
            raise compat.MeshUsageError("checkpoint_every needs checkpoint_id= (where to write)")
        if on_resize is not None and not callable(on_resize):
            raise compat.MeshUsageError(
                f"on_resize takes a function (size, previous), got {type(on_resize).__name__}"
            )
        self.state = state
        self.mesh = spec.mesh
        self.procs = self.mesh.origin  # what is healed; the engine may run on fewer
        self.data_dim = _data_dim(state)
        self.on_resize = on_resize
        self.lineage = uuid.uuid4().hex
        # The ranks keep the last committed step's copy until this object is collected: then
        # the anchor is dropped as a collected MeshTensor's value is (worker/snapshots.py).
        self._anchor = self.mesh.stream.new_id()
        weakref.finalize(self, _drop_anchor, self.mesh, self._anchor)
        self.step = 0
        self.checkpoint_id = checkpoint_id
        self.checkpoint_every = checkpoint_every
        self.checkpointed: int | None = None  # the step of the last checkpoint written
        self.saving: tuple[int, compat.Future[Any]] | None = None
        self.recoveries: list[RecoveryReport] = []
        self._gens = itertools.count(1)
        self._commits: dict[int, Commit] = {}

    @property
    def sizes(self) -> dict[str, int]:
        """The mesh's sizes now (smaller than its proc mesh's after ``shrink``)."""
        return dict(zip(self.mesh.labels, self.mesh.sizes, strict=True))

    # -- commit ------------------------------------------------------------------------------

    def commit(self) -> None:
        """The step completed (call it after the step's sync point): recovery comes back to
        the state as it is now. Records one op, sends nothing; ``step`` grows by one."""
        self.step += 1
        self._snapshot(None)
        shown = RECOVERIES.get(self._mesh_id)
        if shown is not None and shown["phase"] == "restored":
            self._announce({**shown, "phase": "resumed", "step": self.step})
        if self.checkpoint_every and self.step % self.checkpoint_every == 0:
            self._checkpoint()

    def _snapshot(self, gather: str | None) -> OpaqueRef | None:
        """Record a snapshot of the state as generation of ``step``; with ``gather``, each
        value copied whole along that dimension, and a receipt to wait on."""
        spec = checkpoint_state.build(self.state, "FaultTolerant.commit")
        if spec.mesh is not self.mesh:
            raise compat.MeshUsageError("FaultTolerant: the state moved to another mesh")
        gen = next(self._gens)
        self._commits[gen] = Commit(gen, self.step, spec)
        for old in [g for g in self._commits if g <= gen - KEEP_GENERATIONS]:
            del self._commits[old]
        tm = self.mesh
        receipt = None if gather is None else OpaqueRef(tm, tm.stream.new_id(), per_rank=True)
        out = () if receipt is None else (receipt.value_id,)
        payload = (self.lineage, gen, tuple(spec.ids), gather, self._anchor)
        tm.stream.record(
            ("snapshot", out, tuple(spec.ids), (None,) * len(out), payload, issue_site())
        )
        return receipt

    def _checkpoint(self) -> None:
        if self.saving is not None and not self.saving[1].done():
            return  # the previous one still writes: skip this one rather than queue
        step = self.step
        future = checkpoint.async_save(
            {**self.state, "fault_tolerant_step": step}, checkpoint_id=self.checkpoint_id
        )
        self.saving = (step, future)
        future.add_done_callback(lambda done: self._saved(step, done))

    def _saved(self, step: int, future: compat.Future[Any]) -> None:
        exc = future.exception()
        if exc is None:
            self.checkpointed = max(step, self.checkpointed or 0)
        else:
            logger.error("the checkpoint of step %d failed: %s", step, exc)

    # -- recover, shrink, grow -------------------------------------------------------------

    def recover(self, timeout: float = SETUP_TIMEOUT) -> int:
        """Heal the mesh and restore the state of the last committed step; returns ``step``.
        A mesh that shrank comes back whole.

        Blocks. Raises ``SupervisionError`` if a rank dies meanwhile (call it again), and
        ``RuntimeError`` when neither the replicas nor a checkpoint hold the lost values.
        """
        started = time.time()
        lost = self._dead()
        self.procs.heal().get(timeout=timeout)
        return self._resume(
            _Change("recover", lost, self.procs, self.procs, True, started), timeout
        )

    def shrink(self, timeout: float = SETUP_TIMEOUT) -> int:
        """Go on without the dead ranks (no spare process): the data-parallel dimension loses
        each slice that lost a rank, and the state of the last committed step is restored on
        the ranks left; returns ``step``. ``on_resize`` is called with the new size. Blocks;
        raises as ``recover`` does, and ``MeshUsageError`` when nothing can shrink."""
        started = time.time()
        tm = self.mesh
        if self.data_dim is None:
            raise compat.MeshUsageError(
                "shrink needs a data-parallel dimension to go on without: the state holds no "
                "model from module_to_mesh (its data_dim is the one that shrinks)"
            )
        alive = self._alive()
        dead = {i for i, mailbox in enumerate(tm.mailboxes) if mailbox not in alive}
        if not dead:
            raise compat.MeshUsageError(
                "no rank of the mesh is dead, so there is nothing to shrink; shrink() is for "
                "the except clause of a lost rank's SupervisionError"
            )
        lost = [tm.coords_of(i) for i in sorted(dead)]
        kept, sizes = recovery_plan.shrunk(tm.labels, tm.sizes, dead, self.data_dim)
        origin = {m: i for i, m in enumerate(compat.mailboxes(self.procs))}
        shape = dict(zip(tm.labels, sizes, strict=True))
        new = compat.subset_mesh(self.procs, [origin[tm.mailboxes[i]] for i in kept], shape)
        living = [origin[m] for m in tm.mailboxes if m in alive]
        leaving = compat.subset_mesh(self.procs, living, {"ranks": len(living)})
        return self._resume(_Change("shrink", lost, new, leaving, True, started), timeout)

    def grow(self, hosts: Any = None, timeout: float = SETUP_TIMEOUT) -> int:
        """Bring a mesh that shrank back to all its processes: the dead ones respawned (on a
        spare host from ``hosts``, e.g. ``listener.wait_for_hosts(1)``, when theirs was lost),
        the state as it is now spread over them; returns ``step``. Call it between steps, after
        ``commit()``. ``on_resize`` is called with the new size. Blocks."""
        started = time.time()
        tm = self.mesh
        if not tm.resized:
            raise compat.MeshUsageError(
                "the mesh did not shrink, so there is nothing to grow (recover() heals a mesh "
                "that lost a rank)"
            )
        if self.saving is not None:
            self.saving[1].exception(timeout=timeout)  # a background checkpoint ends first
        rejoin = self._left_out()
        self.procs.heal(hosts).get(timeout=timeout)
        receipt = self._snapshot(self.data_dim)
        assert receipt is not None
        fetch_value(receipt, tm, 0).get(timeout=timeout)
        return self._resume(
            _Change("grow", rejoin, self.procs, self.procs, False, started), timeout
        )

    def _resume(self, change: _Change, timeout: float) -> int:
        """Free the old engine on ``leaving``'s processes, start one on ``procs``'s and put the
        last committed state back on it (see the module docs), saying so to the sidebar."""
        before = self.sizes.get(self.data_dim or "")
        shown = {"phase": "restoring", "kind": change.kind, "ranks": change.ranks,
                 "step": self.step, "source": None, "extent": self.sizes, "seconds": None,
                 "time": change.started, "error": None}  # fmt: skip
        self._announce(shown)
        try:
            self._restart_and_restore(change, timeout)
        except BaseException as exc:
            error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self._announce({**shown, "phase": "failed", "error": error})
            raise
        after = self.sizes.get(self.data_dim or "")
        if self.on_resize is not None and after != before and after is not None:
            self.on_resize(after, before or 0)
        return self.step

    def _restart_and_restore(self, change: _Change, timeout: float) -> None:
        tm = self.mesh
        leaving = change.leaving
        agent = compat.helper_mesh_with_args(
            leaving, f"_recovery_agent_{next(_agents)}", _RecoveryAgent
        )
        answers = agent.unblock.call(tm.key, self.lineage, change.stuck, UNBLOCK_TIMEOUT)
        replies = answers.get(timeout=timeout).values()
        by_process = dict(zip(compat.mailboxes(leaving), replies, strict=True))
        tm.restart(change.procs, leaving)
        reports = [by_process.get(m, NO_SNAPSHOT) for m in tm.mailboxes]
        for module in self._modules():
            forget_engine_values(module)
        plan = recovery_plan.restore_plan(reports, list(self._commits), tm.labels, tm.sizes)
        if plan is not None and not set(self._commits[plan.gen].spec.ids) - plan.metas.keys():
            commit = self._commits[plan.gen]
            from_replicas(tm, self.state, self.lineage, commit.gen, commit.spec, plan, timeout)
            self.step = commit.step
            source = "replicas"
        else:
            metas = recovery_plan.every_meta(reports)
            path = self.checkpoint_id
            self.step = from_checkpoint(tm, self.state, self.step, path, metas, timeout)
            source = "checkpoint"
        seconds = time.time() - change.started
        report = RecoveryReport(change.kind, change.ranks, self.step, source, self.sizes,
                                seconds, change.started)  # fmt: skip
        self.recoveries.append(report)
        self._announce({"phase": "restored", "kind": change.kind, "ranks": change.ranks,
                        "step": self.step, "source": source, "extent": self.sizes,
                        "seconds": seconds, "time": change.started, "error": None})  # fmt: skip
        logger.info("%s: %s", change.kind, report)

    @property
    def _mesh_id(self) -> str:
        return compat.mesh_id(self.procs)[0]

    def _announce(self, shown: dict[str, Any]) -> None:
        """What the sidebar shows of this run's last recovery (the panel polls it)."""
        RECOVERIES[self._mesh_id] = shown

    def _dead(self) -> list[str]:
        return [compat.point_label(p) for p, h in self.procs.health().items() if h != "alive"]

    def _alive(self) -> set[bytes]:
        health = self.procs.health().values()
        mailboxes = compat.mailboxes(self.procs)
        return {m for m, h in zip(mailboxes, health, strict=True) if h == "alive"}

    def _left_out(self) -> list[str]:
        """The ranks of the proc mesh the engine does not run on (after a shrink)."""
        mine = set(self.mesh.mailboxes)
        points = [p for p, _ in self.procs.health().items()]
        mailboxes = compat.mailboxes(self.procs)
        return [
            compat.point_label(p) for p, m in zip(points, mailboxes, strict=True) if m not in mine
        ]

    def _modules(self) -> list[Any]:
        return [v for v in self.state.values() if isinstance(v, MeshModule)]


def _drop_anchor(mesh: Any, anchor: int) -> None:
    mesh.stream.died(anchor)  # any thread, any time (a finalizer): only appends to a list


def _data_dim(state: dict[str, Any]) -> str | None:
    """The data-parallel dimension of the state's first meshed model (what shrinks)."""
    for value in state.values():
        if isinstance(value, MeshModule):
            return placement(value).data_dim
    return None
