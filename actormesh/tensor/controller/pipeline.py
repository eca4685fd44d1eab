"""Pipeline parallelism from one loop on the controller: stages on meshes (slices of one proc
mesh, or proc meshes of their own), microbatches, and a schedule that is a plain list.

A schedule says, per stage, the order of its forward and backward steps: ``("F", m)`` and
``("B", m)`` for microbatch ``m``. ``gpipe`` runs every forward, then every backward;
``one_f_one_b`` lets stage ``s`` run ``stages - s - 1`` forwards ahead, then alternates one
forward and one backward, so that at most that many microbatches' activations wait on a stage.
Both leave the same *bubble* (the share of a step a stage idles): ``(stages - 1) /
(microbatches + stages - 1)`` when every step takes the same time (``bubble_fraction``).

``pipeline_step`` records the steps of one training step in that order: each stage's op stream
gets its steps in the schedule's order, and the stages run them concurrently, each waiting only
for what comes to it from its neighbours (``to_mesh``: activations forward, their gradients
back). Nothing here waits for a rank: the loop returns once everything is recorded (and sent),
with the step's loss on the last stage, a MeshTensor to ``item()`` when wanted.

The loop, for one microbatch ``m`` on stage ``s`` (what ``_forward``/``_backward`` record; a
move's send is recorded right after the stage that makes the value, its receive right before
the stage that needs it, so that no stream waits in between for what it does not need yet):

    x = inputs[m] if s == 0 else act[s][m].receive().requires_grad_()
    y[s][m] = stages[s](x)                         # the last stage adds its loss
    act[s + 1][m] = send(y[s][m].detach(), meshes[s + 1])
    ...
    loss[m].backward() if s == last else torch.autograd.backward(y[s][m], g[s + 1][m].receive())
    g[s][m] = send(x.grad, meshes[s - 1])          # the input's gradient, back one stage
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import compat
from .grad_sync import grad_syncs_put_off
from .mesh import tensor_mesh
from .tensor import MeshTensor
from .transfer import Sent, send

Step = tuple[str, int]  # ("F", microbatch) or ("B", microbatch)
Schedule = list[list[Step]]  # per stage, its steps in order


def gpipe(stages: int, microbatches: int) -> Schedule:
    """Every stage: all forwards, then all backwards (GPipe)."""
    _check(stages, microbatches)
    order = [("F", m) for m in range(microbatches)] + [("B", m) for m in range(microbatches)]
    return [list(order) for _ in range(stages)]


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """Stage ``s``: ``stages - s - 1`` forwards to fill the pipeline, then one forward and one
    backward in turn, then the backwards left (1F1B, as in PipeDream-Flush)."""
    _check(stages, microbatches)
    schedule = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        steps: list[Step] = [("F", m) for m in range(warmup)]
        for i in range(microbatches - warmup):
            steps += [("F", warmup + i), ("B", i)]
        steps += [("B", m) for m in range(microbatches - warmup, microbatches)]
        schedule.append(steps)
    return schedule


SCHEDULES: dict[str, Callable[[int, int], Schedule]] = {"gpipe": gpipe, "1f1b": one_f_one_b}


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The share of a step each stage idles under GPipe or 1F1B, steps of equal length."""
    return (stages - 1) / (microbatches + stages - 1)


def _check(stages: int, microbatches: int) -> None:
    if stages < 1 or microbatches < 1:
        raise compat.MeshUsageError(
            f"a pipeline needs a stage and a microbatch at least, got {stages} stage(s) and "
            f"{microbatches} microbatch(es)"
        )


def pipeline_step(
    stages: Sequence[Callable[[Any], Any]],
    meshes: Sequence[Any],
    inputs: Any,
    targets: Any,
    loss_fn: Callable[[Any, Any], Any],
    *,
    microbatches: int,
    schedule: str | Schedule = "1f1b",
) -> MeshTensor:
    """Record one training step of a pipeline: forward and backward of every microbatch, the
    gradients accumulated into each stage's parameters (``.grad``, as ``loss.backward()``
    would), and return the step's loss (the mean of the microbatches' losses) on the last
    stage's mesh, without waiting for any rank.

    Args:
        stages: one callable per stage (a ``module_to_mesh`` model on its mesh, or any function
            of MeshTensors on it); stage ``s`` takes stage ``s - 1``'s output. A model is the
            user's own class, its forward recorded on the controller: stage ``s > 0`` gets a
            MeshTensor on its mesh (placed as on the previous stage, by dimension name), stage
            0 a controller tensor it splits over its data dimension, and a forward that mixes
            rows (a batch statistic) sees the whole microbatch, as in one process.
        meshes: the mesh of each stage (``procs.slice(pp=s)``, or a proc mesh of its own).
        inputs, targets: the batch (controller tensors or MeshTensors), split along dim 0 into
            ``microbatches`` equal parts; ``targets`` only meets the last stage's output.
        loss_fn: ``loss_fn(output, target)``, the mean loss of one microbatch.
        schedule: ``"1f1b"`` (default), ``"gpipe"``, or a list per stage of its steps
            (``("F", m)``/``("B", m)``) in order.

    Failures: an op that fails on a rank poisons what depends on it, across stages too, and the
    returned loss raises ``RemoteTensorError`` naming that rank (its place in the proc mesh,
    which stage) at ``item()``; no stage waits for a neighbour that failed.
    """
    if len(stages) != len(meshes) or not stages:
        raise compat.MeshUsageError(
            f"pipeline_step needs one mesh per stage, got {len(stages)} stage(s) and "
            f"{len(meshes)} mesh(es)"
        )
    plan = SCHEDULES[schedule](len(stages), microbatches) if isinstance(schedule, str) else schedule
    _check_schedule(plan, len(stages), microbatches)
    run = _Run(stages, meshes, _split(inputs, microbatches, "inputs"),
               _split(targets, microbatches, "targets"), loss_fn)  # fmt: skip
    for s, tm in enumerate(run.meshes):  # what the sidebar says each stage's ranks are
        role = f"stage {s} of {len(run.meshes)}"
        if tm.base.role != role:
            tm.base.role = role
            tm.engine.set_role.broadcast(role)
    # A stage's gradients are summed over its data dimension once, after its last backward.
    with grad_syncs_put_off():
        _record_steps(run, plan)
    for mesh in run.meshes:  # the rest of each stage's steps (its first went as recorded)
        mesh.stream.flush()
    return run.total()


def _record_steps(run: _Run, plan: Schedule) -> None:
    """Record each stage's steps in the schedule's order, each as soon as what it needs is
    recorded (a forward, the previous stage's; a backward, the next stage's)."""
    pending = [deque(steps) for steps in plan]
    started: set[int] = set()
    while any(pending):
        progressed = False
        for s, steps in enumerate(pending):
            while steps and run.ready(s, *steps[0]):
                run.do(s, *steps.popleft())
                progressed = True
                if s not in started:
                    # The stage starts its first step while the rest of the schedule is
                    # recorded: waiting for the whole step's recording put it (tens of ms)
                    # on every step's critical path.
                    started.add(s)
                    run.meshes[s].stream.flush()
        if not progressed:
            stuck = {s: steps[0] for s, steps in enumerate(pending) if steps}
            raise compat.MeshUsageError(
                f"this schedule cannot go on: each stage's next step waits for one that "
                f"comes after it ({stuck}); a stage's backward of a microbatch needs the "
                "next stage's, its forward the previous stage's"
            )


def _split(batch: Any, microbatches: int, what: str) -> list[Any]:
    if batch.shape[0] % microbatches:
        raise compat.MeshUsageError(
            f"pipeline_step splits {what} into {microbatches} equal microbatches along dim 0, "
            f"but it has {batch.shape[0]} rows"
        )
    return list(torch.chunk(batch, microbatches))


def _check_schedule(plan: Schedule, stages: int, microbatches: int) -> None:
    want = sorted([("F", m) for m in range(microbatches)] + [("B", m) for m in range(microbatches)])
    if len(plan) != stages or any(sorted(steps) != want for steps in plan):
        raise compat.MeshUsageError(
            f"a schedule lists, for each of the {stages} stages, ('F', m) and ('B', m) once "
            f"for every microbatch m < {microbatches}"
        )
    for s, steps in enumerate(plan):
        for m in range(microbatches):
            if steps.index(("B", m)) < steps.index(("F", m)):
                raise compat.MeshUsageError(
                    f"stage {s}'s schedule runs microbatch {m}'s backward before its forward"
                )


class _Run:
    """One step's state: what each stage produced and received, by microbatch."""

    def __init__(
        self,
        stages: Sequence[Callable[[Any], Any]],
        meshes: Sequence[Any],
        inputs: list[Any],
        targets: list[Any],
        loss_fn: Callable[[Any, Any], Any],
    ) -> None:
        self.stages = stages
        self.meshes = [tensor_mesh(m) for m in meshes]
        self.procs = list(meshes)
        self.inputs, self.targets, self.loss_fn = inputs, targets, loss_fn
        self.n = len(inputs)
        # (stage, m) -> its input, sent (and whether it requires grad)
        self.activations: dict[tuple[int, int], tuple[Sent, bool]] = {}
        self.received: dict[tuple[int, int], Any] = {}  # (stage, m) -> its input, a leaf
        self.outputs: dict[tuple[int, int], Any] = {}  # (stage, m) -> its output (or loss)
        self.grads: dict[tuple[int, int], Sent] = {}  # (stage, m) -> its output's grad, sent
        self.done: set[tuple[str, int, int]] = set()
        self.losses: list[Any] = []

    def ready(self, s: int, kind: str, m: int) -> bool:
        if kind == "F":
            return s == 0 or ("F", s - 1, m) in self.done
        return ("F", s, m) in self.done and (
            s == len(self.stages) - 1 or ("B", s + 1, m) in self.done
        )

    def do(self, s: int, kind: str, m: int) -> None:
        (self._forward if kind == "F" else self._backward)(s, m)
        self.done.add((kind, s, m))

    def _forward(self, s: int, m: int) -> None:
        if s == 0:
            x = self.inputs[m]
        else:  # received now, just before it is needed (sent as soon as it was made)
            sent, grad = self.activations.pop((s, m))
            x = self.received[s, m] = sent.receive().requires_grad_(grad)
        y = self.stages[s](x)
        if s == len(self.stages) - 1:
            loss = self.loss_fn(y, self.targets[m]) / self.n
            self.outputs[s, m] = loss
            self.losses.append(loss.detach())
            return
        self.outputs[s, m] = y
        self.activations[s + 1, m] = (send(y.detach(), self.procs[s + 1]), y.requires_grad)

    def _backward(self, s: int, m: int) -> None:
        out = self.outputs.pop((s, m))
        if s == len(self.stages) - 1:
            out.backward()
        else:
            torch.autograd.backward(out, self.grads.pop((s + 1, m)).receive())
        if s > 0:
            x = self.received.pop((s, m))
            if x.grad is None:
                raise compat.MeshUsageError(
                    f"stage {s}'s output does not depend on its input (microbatch {m}): "
                    f"no gradient to send back to stage {s - 1}"
                )
            self.grads[s, m] = send(x.grad, self.procs[s - 1])

    def total(self) -> MeshTensor:
        total = self.losses[0]
        for loss in self.losses[1:]:
            total = total + loss
        return total
