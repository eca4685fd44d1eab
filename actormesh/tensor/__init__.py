"""Distributed tensors driven from the controller (issue 19).

```python
import torch, actormesh as am

procs = am.this_host().spawn_procs(per_host={"dp": 2, "tp": 2})
x = torch.randn(8, 8)
dt = am.distribute(x, procs, sharding_spec=["dp", None])   # a MeshTensor
r = dt @ dt.T                     # recorded and streamed; returns at once
print(r.shape, am.inspect(r))     # metadata is local; inspect is a sync point
```

Layout
======

Three sub-packages, by where the code runs; a job with a half on each side has one module of the
same name on each (``controller/fetch.py`` asks, ``worker/fetch.py`` answers).
``tests/unit/test_layers.py`` orders them ``compat`` < ``wire`` < ``worker`` < ``controller``:
the ranks' half never imports the controller's.

==============================  ==================================================================
``compat.py``                   the one way into the runtime (and back: its ``TensorLayer`` seam)
``wire/ops.py``                 what an op of the stream is; ``Ref``, ``IN``; the issuing line
``wire/kinds.py``               the table of op kinds: payload fields, recorder, handler
``wire/shapes.py``              shapes on meta tensors, signatures, the plans' cache
``wire/errors.py``              ``RemoteTensorError``
``wire/programs.py``            a repeated run of ops as a program: its template, ids and values
``wire/optim_ops.py``           ``actormesh::adam_``: Adam(W)'s foreach step as one op
``controller/tensor.py``        ``MeshTensor``: metadata here, every op recorded
``controller/recording.py``     aten ops into the stream (the fast path and the general one)
``controller/stream.py``        a mesh's op buffer: ids, batches, when they are sent
``controller/idle_flush.py``    the buffer sent once the controller records nothing for a while
``controller/step_sends.py``    a finished step sent as the next begins, where cores are spare
``controller/packing.py``       a batch pickled with the C pickler (memory formats by name)
``controller/constants.py``     controller tensors as arguments: sent once (small ones by contents)
``controller/known.py``         a model's integer inputs, and values made of them, read here
``controller/interrupts.py``    Ctrl-C held back while a batch goes to every rank
``controller/mesh.py``          a proc mesh's tensor engine as the controller sees it
``controller/dims.py``          its dimensions as users name them: coordinates, sharding specs
``controller/lifetime.py``      what a user is told when a mesh's values are gone
``controller/fetch.py``         sync points: values back to the controller
``controller/distribute.py``    global MeshTensors from controller tensors, random factories
``controller/activate.py``      per-rank MeshTensors (Monarch's ``activate``), ``rank``
``controller/reduce.py``        ``MeshTensor.reduce``, ``reduce_``: Monarch's collectives
``controller/gradients.py``     ``grad_generator``: gradients one at a time (Monarch's)
``controller/borrows.py``       Monarch's ``Stream``, ``borrow``: one stream per rank here
``controller/transfer.py``      ``MeshTensor.to_mesh``: a value moves to another tensor mesh
``controller/pipeline.py``      pipeline schedules (GPipe, 1F1B) run from one controller loop
``controller/module.py``        ``module_to_mesh``
``controller/inputs.py``        a model's tensor inputs: split as the batch, reused while unchanged
``controller/grad_sync.py``     a model's gradients to its parameters' placements per backward
``controller/plans.py``         a ``tp_plan``'s styles on the mesh: placements and layouts
``controller/optim.py``         ``torch.optim`` steps over MeshTensors take their foreach path;
                                Adam(W)'s records ``actormesh::adam_``
``controller/programs.py``      a repeated step sent by reference (a ``program`` op)
``controller/remote.py``        remote functions
``controller/rref.py``          ``endpoint.rref(...)``: an endpoint as a step of the stream
``controller/adopt.py``         a ``%%mesh`` cell's tensor as a MeshTensor
``controller/checkpoint.py``    checkpoints: DCP save, load, async_save as ops of the stream
``controller/checkpoint_state.py`` a state dict in DCP's layout, MeshTensors as Refs, and back
``controller/recovery.py``      ``FaultTolerant``: commit a step, recover, shrink, grow
``controller/recovery_plan.py`` which rank gives which value to which, from the ranks' reports
``controller/restore.py``       the committed state put back, from the ranks' copies or a checkpoint
``controller/seams.py``         binds MeshTensor's late-bound methods and the runtime's seam
``worker/engine.py``            ``_TensorEngine``: the actor that runs the batches, op by op
``worker/state.py``             ``EngineState``: an engine's place, values and their failures
``worker/handlers.py``          which function runs each kind of op
``worker/aten.py``              aten ops on DTensors, and constants
``worker/shard_ops.py``         ops run on the local shards, skipping DTensor's: the routes
``worker/shard_linear.py``      a linear layer's ops (``t``, ``mm``, ``addmm``, ``sum``, ``view``)
``worker/shard_losses.py``      ``mse_loss``, mean ``nll_loss`` on a split batch
``worker/shard_batch.py``       batch norm, a convolution's backward, the fused encoder layer
``worker/shard_attention.py``   CPU attention and its backward
``worker/shard_foreach.py``     ``_foreach_`` ops (an optimizer's update) on the local shards
``worker/shard_views.py``       a view of a batch split by rows, on each rank's rows
``worker/shard_rows.py``        ops that leave dim 0 alone on a batch split by rows (GPT-2's)
``worker/shard_row_masks.py``   ops keeping a batch's rows beside replicated values (a mask's)
``worker/shard_partials.py``    ops linear in a partial sum (two gradients added)
``worker/shard_replicas.py``    any op whose inputs are all replicated (an attention mask's)
``worker/dtensors.py``          a rank's local tensor as a DTensor, specs' layouts, cached
``worker/programs.py``          a program's steps, decoded once, run with each run's ids
``worker/step_args.py``         a step's arguments: what its template holds, what a run fills in
``worker/lowered.py``           a program's step on the local tensors, as its first run showed
``worker/chunks.py``            a run of lowered steps as one generated function, checked once
``worker/distribute.py``        the ranks' side of ``distribute``, ``redistribute``, placements
``worker/activate.py``          per-rank factories, ``rank``
``worker/reduce.py``            the collective each rank runs for ``MeshTensor.reduce``
``worker/views.py``             a rename/flatten/split of the engine's mesh: its ``DeviceMesh``
``worker/groups.py``            process groups of an engine on part of its group's processes
``worker/transfer.py``          ``to_mesh`` on the ranks: sending, assembling
``worker/inbox.py``             where other engines' ``send`` ops deliver to this one
``worker/module.py``            a module's build, forward and backward
``worker/remote.py``            remote functions' definitions, calls and results
``worker/rref.py``              an endpoint run on its actor's thread
``worker/fetch.py``             one rank's answer to a sync point
``worker/adopt.py``             a cell's tensor taken as an engine value
``worker/checkpoint.py``        DCP run by every rank; staged writes; the background save's end
``worker/recovery.py``          snapshots, freeing a stuck rank, restore from a replica
``worker/snapshots.py``         the last committed step's copies, freed with their FaultTolerant
``worker/side_effects.py``      what a failed op poisons besides its outputs
``worker/stand_ins.py``         what a failed op leaves in place of its outputs
``worker/local.py``             the engines, for code beside them (actors, ``%%mesh`` cells)
``tools.py``                    what the kernel, the sidebar and the debugger use
==============================  ==================================================================

The life of an op: ``r = dt @ dt.T``, then ``r.item()``
=======================================================

Here ``dt`` is a (1, 8) MeshTensor split along ``tp`` (``sharding_spec=[None, "tp"]``), so ``r``
is (1, 1), a ``Partial`` sum over ``tp`` on the ranks.

Controller, user thread: recording, which returns at once.

1. ``dt.T`` and ``@`` reach ``MeshTensor.__torch_dispatch__`` (``controller/tensor.py``) as
   ``torch.ops.aten.permute.default`` and ``torch.ops.aten.mm.default``: below autograd, since
   MeshTensor switches ``__torch_function__`` off. It calls ``recording.dispatch``
   (``controller/recording.py``) through ``tensor.methods``, which ``seams.install``
   (``controller/seams.py``) fills.
2. ``recording.dispatch`` keys the op on its inputs' signatures and scalars. The first op of a
   key takes the general path, ``recording._record``: ``shapes.propagate`` (``wire/shapes.py``)
   runs the op on meta tensors (a shape error raises here, and nothing is sent) and
   ``shapes.remember`` keeps a plan in ``shapes.plans``; a later op of that key is recorded from
   the plan. Either way its outputs are new MeshTensors (``tensor.make_wrapper``: metadata, no
   storage) whose ids come from ``Stream.new_id`` (``controller/stream.py``), and
   ``Stream.record`` appends the op ``("aten", out, ins, meta, payload, site)`` (``wire/ops.py``;
   the payload's fields as ``kinds.KINDS`` in ``wire/kinds.py`` lists them; ``ops.issue_site``
   finds the user's line) to the mesh's buffer.

Controller, the sync point.

3. ``MeshTensor.item`` calls ``MeshTensor.get``, which is ``fetch.get`` (``controller/fetch.py``):
   a value the controller knows (``known.read``, ``controller/known.py``: a model's integer input
   and what integer ops made of it) is answered at once; else ``fetch._requests`` names the value
   and the rank wanted, and ``Stream.fetch_after_batch`` sends the buffered ops and the fetch as
   one call, ``_TensorEngine.run_and_fetch``, one message per process, with Ctrl-C held back
   meanwhile (``interrupts.held``, ``controller/interrupts.py``: the batch reaches every rank or
   none). ``packing.pack`` (``controller/packing.py``) pickles the batch with the C pickler when
   every op's kind is ``plain``; the call goes as any call does (``Endpoint.call``, walked hop by
   hop in ``runtime/__init__.py``).

Worker, the engine's thread.

4. ``_TensorEngine.run_and_fetch`` (``worker/engine.py``) waits for its turn
   (``_TensorEngine._turn``: ``%%mesh`` cells launched before it), and ``_TensorEngine._run_batch``
   unpickles the batch (``codec.loads``) and runs each op with ``_TensorEngine._execute``: the
   function ``handlers.HANDLERS`` (``worker/handlers.py``) names for the kind, here
   ``aten.run_aten`` (``worker/aten.py``). It finds the op (``aten.resolve_op``) and its inputs
   in ``EngineState.env`` (``worker/state.py``); ``shard_ops.on_shards``
   (``worker/shard_ops.py``) picks the op's route on the local shards where that is known to
   be exact (``mm``'s is in ``shard_linear.ROUTES``, ``worker/shard_linear.py``: a ``Partial``
   sum, as the contraction is split), else DTensor runs it (with its own collectives, the same
   on every rank), as it does the ``permute``. The results go into ``env`` under the
   controller's ids. An op that raises poisons them instead (``side_effects.written``,
   ``stand_ins.stand_in``).
5. ``_TensorEngine._fetch`` answers with ``fetch.answer_fetch`` (``worker/fetch.py``): each rank
   its failure if the value failed there; else, ``r`` being a small partial sum
   (``fetch.combinable``), each rank along ``tp`` its term.

Controller again.

6. ``fetch._assemble`` (``controller/fetch.py``) adds the terms up into one tensor (or raises
   ``RemoteTensorError``, ``wire/errors.py``, naming the ranks, the op and the line from step 2),
   and ``MeshTensor.item`` returns its ``item()``.
"""

from __future__ import annotations

from .controller.activate import activate as activate
from .controller.activate import no_mesh as no_mesh
from .controller.activate import rank as rank
from .controller.adopt import adopt as adopt
from .controller.borrows import Stream as Stream
from .controller.borrows import get_active_stream as get_active_stream
from .controller.distribute import distribute as distribute
from .controller.distribute import rand as rand
from .controller.distribute import randn as randn
from .controller.fetch import busy_spans as busy_spans
from .controller.fetch import fetch as fetch
from .controller.fetch import inspect as inspect
from .controller.fetch import live as live
from .controller.fetch import overlap as overlap
from .controller.fetch import show as show
from .controller.gradients import grad_generator as grad_generator
from .controller.mesh import device_mesh as device_mesh
from .controller.module import MeshModule as MeshModule
from .controller.module import module_to_mesh as module_to_mesh
from .controller.pipeline import bubble_fraction as bubble_fraction
from .controller.pipeline import gpipe as gpipe
from .controller.pipeline import one_f_one_b as one_f_one_b
from .controller.pipeline import pipeline_step as pipeline_step
from .controller.recovery import FaultTolerant as FaultTolerant
from .controller.reduce import reduce_tree as reduce
from .controller.reduce import reduce_tree_ as reduce_
from .controller.remote import call_on_shard_and_fetch as call_on_shard_and_fetch
from .controller.remote import remote as remote
from .controller.seams import install as _install_seams
from .controller.stream import flush_all as flush_all
from .controller.tensor import MeshTensor as MeshTensor
from .controller.transfer import to_mesh_tree as to_mesh
from .wire.errors import RemoteTensorError as RemoteTensorError

# MeshTensor's methods that live in the modules built on it, and what the runtime calls up here.
_install_seams()

__all__ = [
    "FaultTolerant",
    "MeshModule",
    "MeshTensor",
    "RemoteTensorError",
    "Stream",
    "activate",
    "adopt",
    "bubble_fraction",
    "busy_spans",
    "call_on_shard_and_fetch",
    "device_mesh",
    "distribute",
    "fetch",
    "flush_all",
    "get_active_stream",
    "gpipe",
    "grad_generator",
    "inspect",
    "live",
    "module_to_mesh",
    "no_mesh",
    "one_f_one_b",
    "overlap",
    "pipeline_step",
    "rand",
    "randn",
    "rank",
    "reduce",
    "reduce_",
    "remote",
    "show",
    "to_mesh",
]
