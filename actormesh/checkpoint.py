"""Checkpoints of a meshed model's training state, through ``torch.distributed.checkpoint``.

The calls and arguments are DCP's own, made once on the controller::

    import actormesh as am

    state = {"model": model, "optim": optimizer, "step": step}   # model from module_to_mesh
    am.checkpoint.save(state, checkpoint_id="ckpt/step-100")      # every rank writes its shards
    future = am.checkpoint.async_save(state, checkpoint_id="ckpt/step-200")  # goes on training
    am.checkpoint.load(state, checkpoint_id="ckpt/step-100")      # in place, resharding

See ``actormesh/tensor/controller/checkpoint.py`` for what each guarantees.
"""

from __future__ import annotations

from .tensor.controller.checkpoint import async_save as async_save
from .tensor.controller.checkpoint import load as load
from .tensor.controller.checkpoint import save as save

__all__ = ["async_save", "load", "save"]
