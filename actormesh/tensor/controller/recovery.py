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
  ranks keep no module, so nothing else is built again), survivors
  from their own copy, respawned ranks from a survivor holding the same shard. A value whose
  every holder died (an FSDP shard with no replica) comes from the last checkpoint instead,
  and then the whole state does, so the model never mixes two steps. Every other MeshTensor of
  the mesh is gone (using one raises ``MeshClosedError`` at the user's line).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import torch

from .. import compat
from ..wire.ops import issue_site
from ..worker.recovery import _RecoveryAgent
from . import checkpoint, checkpoint_state
from .fetch import fetch_value
from .mesh import SETUP_TIMEOUT
from .module import MeshModule, forget_engine_values
from .tensor import OpaqueRef

logger = logging.getLogger(__name__)

_agents = itertools.count(1)
KEEP_GENERATIONS = 4  # the controller's parts of the last commits (ranks keep one each)


@dataclass
class Commit:
    gen: int
    step: int
    spec: checkpoint_state.Spec


@dataclass
class RecoveryReport:
    """What one ``recover()`` did (``ft.recoveries`` keeps them; the sidebar shows them)."""

    lost: list[str]  # the ranks that were respawned
    step: int  # the step training resumes from
    source: str  # "replicas" or "checkpoint"
    seconds: float


class FaultTolerant:
    """A training run that survives the loss of a rank (see the module docs).

    ``state`` is a checkpoint's state dict (``{"model": model, "optim": optimizer, ...}``, as
    ``am.checkpoint.save`` takes). ``checkpoint_id`` and ``checkpoint_every``: a background
    checkpoint every that many committed steps, what recovery falls back to when no replica
    holds a lost shard. ``step`` counts the committed steps. Methods are for the controller's
    thread.
    """

    def __init__(
        self,
        state: dict[str, Any],
        *,
        checkpoint_id: Any = None,
        checkpoint_every: int | None = None,
    ) -> None:
        spec = checkpoint_state.build(state, "FaultTolerant")
        assert spec.mesh is not None
        if checkpoint_every is not None and checkpoint_id is None:
            raise compat.MeshUsageError("checkpoint_every needs checkpoint_id= (where to write)")
        self.state = state
        self.mesh = spec.mesh
        self.lineage = uuid.uuid4().hex
        self.step = 0
        self.checkpoint_id = checkpoint_id
        self.checkpoint_every = checkpoint_every
        self.checkpointed: int | None = None  # the step of the last checkpoint written
        self.saving: tuple[int, compat.Future[Any]] | None = None
        self.recoveries: list[RecoveryReport] = []
        self._gens = itertools.count(1)
        self._commits: dict[int, Commit] = {}

    # -- commit ------------------------------------------------------------------------------

    def commit(self) -> None:
        """The step completed (call it after the step's sync point): recovery comes back to
        the state as it is now. Records one op, sends nothing; ``step`` grows by one."""
        spec = checkpoint_state.build(self.state, "FaultTolerant.commit")
        if spec.mesh is not self.mesh:
            raise compat.MeshUsageError("FaultTolerant: the state moved to another mesh")
        gen = next(self._gens)
        self.step += 1
        self._commits[gen] = Commit(gen, self.step, spec)
        for old in [g for g in self._commits if g <= gen - KEEP_GENERATIONS]:
            del self._commits[old]
        self.mesh.stream.record(
            ("snapshot", (), tuple(spec.ids), (), (self.lineage, gen, tuple(spec.ids)),
             issue_site())
        )  # fmt: skip
        if self.checkpoint_every and self.step % self.checkpoint_every == 0:
            self._checkpoint()

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

    # -- recover -----------------------------------------------------------------------------

    def recover(self, timeout: float = SETUP_TIMEOUT) -> int:
        """Heal the mesh and restore the state of the last committed step; returns ``step``.

        Blocks. Raises ``SupervisionError`` if a rank dies meanwhile (call it again), and
        ``RuntimeError`` when neither the replicas nor a checkpoint hold the lost values.
        """
        start = time.monotonic()
        tm = self.mesh
        procs = tm.procs
        lost = [p for p, h in procs.health().items() if h != "alive"]
        procs.heal().get(timeout=timeout)
        agent = compat.helper_mesh_with_args(
            procs, f"_recovery_agent_{next(_agents)}", _RecoveryAgent
        )
        reports = agent.unblock.call(tm.key, self.lineage, 30.0).get(timeout=timeout).values()
        tm.restart()
        for module in self._modules():
            forget_engine_values(module)
        plan = self._plan(reports)
        if plan is not None:
            commit, metas, transfers = plan
            self._restore(commit, metas, transfers, timeout)
            source = "replicas"
        else:
            self._from_checkpoint(_every_meta(reports), timeout)
            source = "checkpoint"
        report = RecoveryReport([compat.point_label(p) for p in lost], self.step, source,
                                time.monotonic() - start)  # fmt: skip
        self.recoveries.append(report)
        logger.info("recovered: %s", report)
        return self.step

    def _modules(self) -> list[Any]:
        return [v for v in self.state.values() if isinstance(v, MeshModule)]

    def _plan(self, reports: list[tuple[int, list[Any]]]) -> Any:
        """The newest commit every survivor holds, and for each value of it a survivor per
        respawned rank; ``None`` when some value has no surviving holder."""
        gens = {gen for gen, _ in reports if gen >= 0}
        if len(gens) != 1:
            logger.warning("survivors hold snapshots %s: recovering from the checkpoint", gens)
            return None
        (gen,) = gens
        commit = self._commits.get(gen)
        if commit is None:
            return None
        metas: dict[int, Any] = {}
        for g, entries in reports:
            if g == gen:
                for id, dims, placements, shape, stride, dtype in entries:
                    metas[id] = (dims, placements, shape, stride, dtype)
        holders = [i for i, (g, _) in enumerate(reports) if g == gen]
        respawned = [i for i, (g, _) in enumerate(reports) if g != gen]
        transfers = []
        for id, (dims, placements, *_rest) in metas.items():
            sharded = [d for d, p in zip(dims, placements, strict=True) if not p.is_replicate()]
            for dst in respawned:
                src = next((h for h in holders if self._same(h, dst, sharded)), None)
                if src is None:
                    logger.warning("no replica of value %d: recovering from the checkpoint", id)
                    return None
                transfers.append((id, dst, src))
        return commit, metas, tuple(transfers)

    def _same(self, a: int, b: int, dims: list[str]) -> bool:
        tm = self.mesh
        pa = compat.Point(a, compat.Extent(list(tm.labels), list(tm.sizes)))
        pb = compat.Point(b, compat.Extent(list(tm.labels), list(tm.sizes)))
        return all(pa[d] == pb[d] for d in dims)

    def _restore(
        self, commit: Commit, metas: dict[int, Any], transfers: Any, timeout: float
    ) -> None:
        tm = self.mesh
        ids = [i for i in commit.spec.ids if i in metas]
        receipt = OpaqueRef(tm, tm.stream.new_id(), per_rank=True)
        meta = (*((tuple(metas[i][2]), metas[i][4], False) for i in ids), None)
        payload = (self.lineage, commit.gen, {i: metas[i] for i in ids}, transfers)
        tm.stream.keep(ids)
        tm.stream.record(
            ("restore", (*ids, receipt.value_id), tuple(ids), meta, payload, issue_site())
        )
        fetch_value(receipt, tm, 0).get(timeout=timeout)
        _prune_optimizers(self.state, commit.spec.tree)
        checkpoint_state.write_back(self.state, commit.spec.tree)
        self.step = commit.step

    def _from_checkpoint(self, metas: dict[int, Any], timeout: float) -> None:
        # What is at checkpoint_id is complete (a save is put there only once written): a save
        # whose end the controller did not hear of (a rank died meanwhile) may be there.
        path = self.checkpoint_id
        if path is None or not os.path.exists(os.path.join(os.fspath(path), ".metadata")):
            raise RuntimeError(
                "recovery needs the values of a rank that no surviving rank holds (FSDP shards "
                "have no replica), and no checkpoint was written yet: pass checkpoint_id= and "
                "checkpoint_every= to FaultTolerant"
            )
        for value in self.state.values():
            if isinstance(value, torch.optim.Optimizer):
                value.state.clear()  # its tensors were on the lost engine; load makes them anew
        # The load writes into the state's values in place: they must exist on the new engine
        # first, with the placements they had (the survivors' snapshots say them).
        ids = checkpoint_state.build(self.state, "FaultTolerant.recover").ids
        unknown = [i for i in ids if i not in metas]
        if unknown:
            raise RuntimeError(
                f"recovery cannot place {len(unknown)} value(s) of the state again: no surviving "
                "rank snapshotted them (was a step committed since they were made?)"
            )
        tm = self.mesh
        meta = tuple((tuple(metas[i][2]), metas[i][4], False) for i in ids)
        tm.stream.keep(ids)
        tm.stream.record(
            ("allocate", tuple(ids), (), meta, ({i: metas[i] for i in ids},), issue_site())
        )
        state = {**self.state, "fault_tolerant_step": self.step}
        checkpoint.load(state, checkpoint_id=self.checkpoint_id, timeout=timeout)
        self.step = int(state["fault_tolerant_step"])


def _every_meta(reports: list[tuple[int, list[Any]]]) -> dict[int, Any]:
    """Each value's metadata (mesh dimensions, placements, shape, stride, dtype) as any
    survivor's snapshot gives it (they agree: a value's placements are the same on every
    rank)."""
    metas: dict[int, Any] = {}
    for _gen, entries in reports:
        for id, dims, placements, shape, stride, dtype in entries:
            metas.setdefault(id, (dims, placements, shape, stride, dtype))
    return metas


def _prune_optimizers(state: dict[str, Any], tree: dict[str, Any]) -> None:
    """Drop optimizer state made after the commit (its tensors were on the lost engine): the
    optimizer then holds what it held at the commit, which the restore put back."""
    for key, value in state.items():
        if isinstance(value, torch.optim.Optimizer):
            committed = tree[key]["state"]
            names = [n for g in tree[key]["param_groups"] for n in g["params"]]
            params = [p for g in value.param_groups for p in g["params"]]
            for name, p in zip(names, params, strict=True):
                if name not in committed:
                    value.state.pop(p, None)
                else:
                    for k in [k for k in value.state[p] if k not in committed[name]]:
                        del value.state[p][k]
