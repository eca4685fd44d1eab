"""The state of a committed step put back on a tensor mesh's new engine (``FaultTolerant``'s
recovery, recovery.py): from the ranks' own copies of the commit and the survivors' (one
``restore`` op, as recovery_plan.py planned it), or, when a value has no copy left, from the last
checkpoint.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..wire.ops import issue_site
from . import checkpoint, checkpoint_state, recovery_plan
from .fetch import fetch_value
from .mesh import TensorMesh
from .tensor import OpaqueRef


def from_replicas(
    tm: TensorMesh,
    state: dict[str, Any],
    lineage: str,
    gen: int,
    spec: checkpoint_state.Spec,
    plan: recovery_plan.Plan,
    timeout: float,
) -> None:
    """Put the values of commit ``gen`` (``spec``) back under their ids on ``tm``'s new engine,
    each rank from its own snapshot or a survivor's as ``plan`` says (one ``restore`` op), and
    the controller's parts of ``state`` as they were at that commit."""
    ids = list(spec.ids)
    receipt = OpaqueRef(tm, tm.stream.new_id(), per_rank=True)
    metas = {i: plan.metas[i] for i in ids}
    meta = (*((tuple(metas[i].shape), metas[i].dtype, False) for i in ids), None)
    payload = (lineage, gen, metas, plan.transfers)
    tm.stream.keep(ids)
    tm.stream.record(("restore", (*ids, receipt.value_id), tuple(ids), meta, payload, issue_site()))
    fetch_value(receipt, tm, 0).get(timeout=timeout)
    _prune_optimizers(state, spec.tree)
    checkpoint_state.write_back(state, spec.tree)


def from_checkpoint(
    tm: TensorMesh,
    state: dict[str, Any],
    step: int,
    path: Any,
    metas: dict[int, Any],
    timeout: float,
) -> int:
    """Place the values of ``state`` on ``tm``'s new engine again as the survivors' snapshots
    say (``metas``; an ``allocate`` op) and load the checkpoint at ``path`` into them; returns
    the step it was saved at (``step`` if it says none)."""
    # What is at checkpoint_id is complete (a save is put there only once written): a save
    # whose end the controller did not hear of (a rank died meanwhile) may be there.
    if path is None or not os.path.exists(os.path.join(os.fspath(path), ".metadata")):
        raise RuntimeError(
            "recovery needs the values of a rank that no surviving rank holds (FSDP shards "
            "have no replica, or the mesh changed size along the dimension that splits "
            "them), and no checkpoint was written yet: pass checkpoint_id= and "
            "checkpoint_every= to FaultTolerant"
        )
    for value in state.values():
        if isinstance(value, torch.optim.Optimizer):
            value.state.clear()  # its tensors were on the lost engine; load makes them anew
    # The load writes into the state's values in place: they must exist on the new engine
    # first, with the placements they had (the survivors' snapshots say them).
    ids = checkpoint_state.build(state, "FaultTolerant.recover").ids
    unknown = [i for i in ids if i not in metas]
    if unknown:
        raise RuntimeError(
            f"recovery cannot place {len(unknown)} value(s) of the state again: no surviving "
            "rank snapshotted them (was a step committed since they were made?)"
        )
    meta = tuple((tuple(metas[i].shape), metas[i].dtype, False) for i in ids)
    tm.stream.keep(ids)
    tm.stream.record(
        ("allocate", tuple(ids), (), meta, ({i: metas[i] for i in ids},), issue_site())
    )
    loaded = {**state, "fault_tolerant_step": step}
    checkpoint.load(loaded, checkpoint_id=path, timeout=timeout)
    return int(loaded["fault_tolerant_step"])


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
