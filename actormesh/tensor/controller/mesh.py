"""A proc mesh's tensor engine, as the controller sees it: labels, sizes, engine, op stream.

The first tensor use of a set of processes forms a ``torch.distributed`` group over them
(``init_process_group``), spawns the hidden ``_TensorEngine`` actor on exactly those processes,
and each engine builds the ``DeviceMesh`` (row-major actormesh rank = DeviceMesh rank). One set
of processes in one order has one engine: a slice or ``rename`` of an engine's mesh that covers
the same processes in the same shape reuses it, and another shape of the same processes in the
same order (a ``rename``, ``flatten`` or ``split``) is a *view* of it: a ``TensorMesh`` with its
own labels and sizes over the same engine and op stream, whose ``DeviceMesh`` the ranks build
when its first op reaches them (worker/views.py).

Several tensor meshes at once. Meshes over disjoint processes (two proc meshes, the slices
``pp=0`` and ``pp=1`` of one) each form their own group and run their own engine and stream,
concurrently. A mesh over *some* of the processes of a group that is already formed (a slice
of a mesh whose whole runs an engine) gets an engine of its own on those processes, in that
group, with process groups of its own (worker/groups.py): two engines on one process run on two
threads, and their collectives must never pair across them. Its op stream is its own: the only
order between two streams is what moves between them (``to_mesh``, which the receiving side
waits for). A mesh over processes of two groups, or over part of a group and processes outside
it, is refused at the user's line: a process belongs to one group.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from .. import compat
from ..wire.ops import issue_site
from ..worker.engine import _TensorEngine
from ..worker.recovery import _SocketBaseline
from . import lifetime
from .dims import MeshDims
from .stream import Stream, flush_all

logger = logging.getLogger(__name__)

SETUP_TIMEOUT = 120.0

_meshes: dict[Any, TensorMesh] = {}
_groups: list[ProcessGroup] = []  # the process groups the tensor layer formed
_lock = threading.Lock()


def engine_device(backend: str) -> str:
    """Where a tensor mesh computes: on the GPUs when its group has NCCL (a GPU per rank).

    Ranks that share a GPU get a group whose CUDA tensors go through gloo (``distributed.py``);
    DTensor's collectives crash a rank there (torch 2.11, SIGSEGV in gloo's CUDA path), so such
    a mesh computes on the CPU, and says so.
    """
    if "nccl" in backend:
        return "cuda"
    if "cuda" in backend:
        logger.warning(
            "the ranks of this tensor mesh share a GPU (NCCL needs one per rank), so its "
            "tensors live on the CPU; a 'gpus' dimension no larger than the GPU count puts "
            "them on the GPUs"
        )
    return "cpu"


@contextlib.contextmanager
def _saying_so(mesh: str, processes: int, in_group: bool) -> Iterator[None]:
    """One line on stderr while a mesh's tensor engine starts (seconds, once per mesh: a
    process group, then an engine on every process), so that the first tensor step of a
    notebook or script does not wait in silence; it ends with how long it took. A slice of a
    mesh whose group is formed starts only its engine (``in_group``)."""
    how = (
        "in the process group of the mesh it is a slice of"
        if in_group
        else f"a process group over its {processes} processes"
    )
    print(
        f"actormesh: starting the tensor engine of {mesh}: {how}, once per mesh ...",
        end="",
        file=sys.stderr,
        flush=True,
    )
    start = time.monotonic()
    try:
        yield
    except BaseException:
        print(" failed", file=sys.stderr, flush=True)
        raise
    print(f" ready in {time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)


class ProcessGroup:
    """A ``torch.distributed`` group the tensor layer formed: its processes' mailboxes in rank
    order, and the engines that run in it (the first over all of them)."""

    def __init__(self, procs: compat.ProcMesh, backend: str) -> None:
        self.procs = procs
        self.mailboxes = compat.mailboxes(procs)
        self.backend = backend
        self.engines: list[TensorMesh] = []

    def __repr__(self) -> str:
        return f"{{{', '.join(f'{k}: {v}' for k, v in self.procs.sizes.items())}}}"


class TensorMesh(MeshDims):
    """The controller's handle on one engine. Not built by users (``tensor_mesh(procs)``)."""

    view_id = 0  # which shape of the engine's processes this is (0: the engine's own)

    def __init__(self, procs: compat.ProcMesh, group: ProcessGroup | None = None) -> None:
        """An engine on ``procs``: in ``group`` (some of its processes), else in a group
        formed now over exactly ``procs``."""
        self.origin = procs  # the user's mesh (stopped and healed as a whole)
        self.procs = procs  # the engine's processes: the origin's, or some after a shrink
        self.labels = tuple(procs.sizes)
        self.sizes = tuple(procs.sizes.values())
        self.base = self
        self.views: dict[tuple[tuple[str, ...], tuple[int, ...]], TensorMesh] = {}
        import torch

        joins = group is not None
        with _saying_so(
            f"{compat.mesh_name(procs)!r} {self!r}", len(compat.mailboxes(procs)), joins
        ):
            device = self._start(group)
        self.stream = Stream(self.engine, procs)
        self.mailboxes = self.stream.mailboxes
        self.name = self.stream.name
        self.role = ""  # what the ranks were told this mesh is for (pipeline: "stage 1 of 2")
        # What MeshTensors report as their device: the workers' kind. With an index: autograd
        # on the controller keeps a ready queue per device, and finds none for a bare "cuda".
        self.device = torch.device("cuda", 0) if device == "cuda" else torch.device(device)

    def view(self, procs: compat.ProcMesh) -> TensorMesh:
        """This engine's processes in the shape of ``procs`` (the same processes in the same
        order: a rename, flatten or split), made once per shape."""
        base = self.base
        shape = (tuple(procs.sizes), tuple(procs.sizes.values()))
        if shape == (base.labels, base.sizes):
            return base
        with _lock:
            found = base.views.get(shape)
            if found is not None:
                return found
            view = object.__new__(TensorMesh)
            view.__dict__.update(base.__dict__)
            view.procs = procs
            view.labels, view.sizes = shape
            view.view_id = len(base.views) + 1
            view.engine = compat.actor_mesh_as(base.engine, procs)
            base.views[shape] = view
            # Under the lock: no other thread may use the view before this op is in the stream.
            view.stream.record(
                ("mesh_view", (), (), (), (view.view_id, view.labels, view.sizes), issue_site())
            )
        return view

    def _start(self, group: ProcessGroup | None) -> str:
        """Spawn the engine (a new key each time) in ``group`` (some of its processes), else in
        a process group formed now over exactly these processes; the device."""
        import torch

        self.key = uuid.uuid4().hex
        # Which sockets each process had before the group (recovery shuts down the group's).
        compat.helper_mesh_with_args(
            self.procs, f"_socket_baseline_{self.key}", _SocketBaseline
        ).initialized.get(timeout=SETUP_TIMEOUT)
        ranks: tuple[int, ...] | None = None
        if group is None:
            members = compat.init_process_group(self.procs).get(timeout=SETUP_TIMEOUT).values()
            group = ProcessGroup(self.procs, members[0].backend)
        else:
            ranks = tuple(group.mailboxes.index(m) for m in compat.mailboxes(self.procs))
        device = engine_device(group.backend)
        # From the controller's generator: torch.manual_seed here makes the ranks reproducible.
        seed = int(torch.randint(0, 2**62, ()).item())
        self.engine = compat.helper_mesh_with_args(
            self.procs, "_tensor_engine", _TensorEngine, self.key, self.labels, self.sizes, seed,
            device, ranks, compat.places(self.procs),
        )  # fmt: skip
        self.engine.initialized.get(timeout=SETUP_TIMEOUT)
        # Where other engines send this one what moves to it (to_mesh), by engine index.
        ports = self.engine.inbox_port.call().get(timeout=SETUP_TIMEOUT)
        self.inbox_ports = tuple(ports.values())
        self.group = group
        group.engines.append(self)
        return device

    def restart(
        self, procs: compat.ProcMesh | None = None, leaving: compat.ProcMesh | None = None
    ) -> None:
        """A new process group and engine, keeping this handle, its stream and its ids:
        recovery (recovery.py) then puts the values it restores back under their ids; every
        other value of the mesh is gone. Over ``procs`` (default: the same processes; after a
        shrink or grow another set, the same dimensions in other sizes), once the processes
        of ``leaving`` (default: the engine's; a respawned one has no group to leave) left the
        old group."""
        if self.group.procs is not self.procs:
            raise compat.MeshUsageError(
                "recovery restarts an engine over its own process group; this mesh's engine "
                "runs in the group of a larger mesh (a slice): recover that mesh instead"
            )
        compat.destroy_process_group(leaving or self.procs).get(timeout=SETUP_TIMEOUT)
        if procs is not None:
            if tuple(procs.sizes) != self.labels:
                raise compat.MeshUsageError(
                    f"a tensor mesh restarts with its dimensions {self.labels}, not "
                    f"{tuple(procs.sizes)}"
                )
            self.procs = procs
            self.sizes = tuple(procs.sizes.values())
        old = self.group
        self._start(None)
        with _lock:  # slices of the mesh find the group it runs in now
            _groups[:] = [self.group if g is old else g for g in _groups]
        self.views = {}  # views of the old engine (renames, flattens) are gone with it
        self.stream.restart(self.engine, compat.mailboxes(self.procs))
        self.mailboxes = self.stream.mailboxes

    @property
    def resized(self) -> bool:
        """Whether the engine runs on other processes than its mesh's (after a shrink)."""
        return self.procs is not self.origin

    def describe(self) -> str:
        """The mesh's name and dimensions, ``'procs-2' {dp: 2, tp: 2}``: two meshes of one shape
        read differently."""
        return f"{self.name!r} {self!r}"

    def to_table(self) -> str:
        """The processes of this mesh as a table (Monarch's ``t.mesh.to_table()``)."""
        return str(self.procs.to_table())

    @staticmethod
    def install_cell_hook() -> None:
        """In IPython (a notebook), send every mesh's buffered ops at the end of each cell."""
        ipython = sys.modules.get("IPython")  # not imported: no shell runs in this process
        if ipython is None:
            return
        ip = ipython.get_ipython()
        if ip is None or flush_all in ip.events.callbacks.get("post_run_cell", ()):
            return
        ip.events.register("post_run_cell", flush_all)


def _normalize(mesh: Any) -> compat.ProcMesh:
    if not isinstance(mesh, compat.ProcMesh):
        raise compat.MeshUsageError(
            f"expected a ProcMesh (or a slice of one), got {type(mesh).__name__}; "
            "pass the mesh from this_host().spawn_procs(...)"
        )
    sizes = mesh.sizes
    if "hosts" in sizes and sizes["hosts"] == 1 and len(sizes) > 1:
        mesh = mesh.slice(hosts=0)  # the size-1 hosts dimension is not a tensor dimension
    return mesh


def tensor_mesh(mesh: Any, what: str = "tensors") -> TensorMesh:
    """The engine of ``mesh``'s processes, started on first use (blocks while it starts);
    ``what`` names the call in an error (``distribute``)."""
    procs = _normalize(mesh)
    if compat.is_stopped(procs):
        raise lifetime.stopped_mesh(compat.mesh_name(procs), what)
    ident = compat.mesh_id(procs)
    with _lock:
        for key, old in list(_meshes.items()):  # forget engines of stopped meshes
            if compat.is_stopped(old.origin):
                old.stream.close()
                del _meshes[key]
        _groups[:] = [g for g in _groups if not compat.is_stopped(g.procs)]
        tm = _meshes.get(ident)
        if tm is not None and tm.stream.lost is not None:
            _leave(tm.group, tm.stream.lost)
            tm = None
        if tm is None:
            tm = TensorMesh(procs, _group_for(procs))
            if tm.group not in _groups:
                _groups.append(tm.group)
            _meshes[ident] = tm
    TensorMesh.install_cell_hook()  # checked on each use: the shell may start after the mesh
    if tm.resized:
        return _resized(tm, procs, what)
    return tm.view(procs)


def _resized(tm: TensorMesh, procs: compat.ProcMesh, what: str) -> TensorMesh:
    """The engine of a mesh that shrank runs on some of its processes: the whole mesh stands
    for it (tensors go where the training runs); no slice or other shape of it does."""
    if procs.sizes == tm.origin.sizes:
        return tm
    raise compat.MeshUsageError(
        f"{what}: the tensor engine of these processes runs on {tm!r}, some of them, since a "
        f"rank was lost (FaultTolerant.shrink); pass the whole mesh, or grow it back first "
        "(FaultTolerant.grow)"
    )


def view_of(tm: TensorMesh, mesh: Any) -> TensorMesh | None:
    """``mesh`` as a view of ``tm``'s engine if it is the same processes in the same order
    (``None`` if not: then it would need an engine of its own)."""
    procs = _normalize(mesh)
    if compat.mailboxes(procs) != tm.mailboxes:
        return None
    return tm.view(procs)


def engine_mesh(mesh: Any, what: str) -> TensorMesh:
    """``tensor_mesh(mesh)`` for what works only on the shape the engine was started on (the
    worker's side of it uses the engine's own ``DeviceMesh``)."""
    tm = tensor_mesh(mesh, what)
    if tm.view_id != 0:
        raise compat.MeshUsageError(
            f"{what} needs the mesh its processes' tensor engine was started on ({tm.base!r}); "
            f"{tm!r} is a rename, flatten or split of it: pass that mesh (and name its "
            "dimensions as it does)"
        )
    return tm


def _leave(group: ProcessGroup, error: BaseException) -> None:
    """A rank of ``group`` died (and was perhaps healed): the survivors still hold the old
    group. Every engine in it loses its values; leave the group everywhere, so that the next
    use starts over with a new group and engines. Under ``_lock``."""
    for tm in group.engines:
        tm.stream.lose(error)
        tm.stream.close()
        for key in [k for k, v in _meshes.items() if v is tm]:
            del _meshes[key]
    if group in _groups:
        _groups.remove(group)
    compat.destroy_process_group(group.procs).get(timeout=SETUP_TIMEOUT)


def _group_for(procs: compat.ProcMesh) -> ProcessGroup | None:
    """The formed group whose processes include all of ``procs`` (None: they share none with
    any group, so a new one is formed over them). Processes of a process group and others, or
    of two groups, cannot form one: said here, at the user's line, before any process is asked
    to join a second group. Under ``_lock``."""
    mine = compat.mailboxes(procs)
    for group in _groups:
        if set(mine) <= set(group.mailboxes):
            return group
    for group in _groups:
        if not set(mine).isdisjoint(group.mailboxes):
            raise compat.MeshUsageError(
                f"a tensor mesh over {procs.extent} would take processes of the process group "
                f"over {group!r} (formed by a tensor mesh on them) and others with it, and a "
                "process belongs to one group; start the tensor mesh over the larger mesh "
                "first (actormesh.tensor.device_mesh(procs)): its slices then run in its "
                "group; or spawn other procs for this one"
            )
    return None


def meshes() -> list[TensorMesh]:
    """The tensor meshes this controller started (and did not forget since)."""
    with _lock:
        return list(_meshes.values())


def device_mesh(mesh: Any) -> TensorMesh:
    """The tensor engine of a proc mesh (its ``labels`` and ``sizes``), started if needed."""
    return tensor_mesh(mesh)
