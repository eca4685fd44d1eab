"""Which function runs each kind of op on a rank: the engine's ``_execute`` looks the op's kind
up here. The kinds, their payloads and who records them are ``wire/kinds.py``'s table;
``tests/tensor/test_op_kinds.py`` checks that the two agree."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import (
    activate,
    aten,
    checkpoint,
    distribute,
    local,
    module,
    programs,
    recovery,
    reduce,
    remote,
    rref,
    transfer,
    views,
)
from .state import EngineState

# (engine, payload, output ids) -> one value per output id
Handler = Callable[[EngineState, Any, tuple[int, ...]], Sequence[Any]]

HANDLERS: dict[str, Handler] = {
    "aten": aten.run_aten,
    "constant": aten.run_constant,
    "distribute": distribute.run_distribute,
    "distribute_staged": distribute.run_distribute_staged,
    "random": distribute.run_random,
    "redistribute": distribute.run_redistribute,
    "placements": distribute.run_placements,
    "factory": activate.run_factory,
    "rank": activate.run_rank,
    "reduce": reduce.run_reduce,
    "mesh_view": views.run_mesh_view,
    "pin": local.run_pin,
    "define": remote.run_define,
    "remote_call": remote.run_call,
    "unpack": remote.run_unpack,
    "rref": rref.run_rref,
    "module_build": module.run_build,
    "grad_sync": module.run_grad_sync,
    "relayout": module.run_relayout,
    "link": transfer.run_link,
    "send": transfer.run_send,
    "recv": transfer.run_recv,
    "checkpoint_save": checkpoint.run_save,
    "checkpoint_load": checkpoint.run_load,
    "snapshot": recovery.run_snapshot,
    "restore": recovery.run_restore,
    "allocate": recovery.run_allocate,
    "program": programs.run_program,
}
