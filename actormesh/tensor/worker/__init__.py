"""The ranks' half of the tensor layer: what runs in a worker process.

``engine`` (the hidden ``_TensorEngine`` actor) runs the op batches the controller streams, each
op with the function ``handlers`` names for its kind. A handler takes the engine as the
``EngineState`` it is (``state``: its place, values and their failures), so none imports the
engine that calls it. The handlers sit in the namesakes of the controller modules that record
their ops: ``aten`` (recording's torch ops, on DTensors via ``shard_ops``), ``distribute``,
``activate``, ``remote``, ``module``, ``rref``; ``fetch`` answers sync points and ``adopt``
takes a ``%%mesh`` cell's tensor. ``side_effects`` and ``stand_ins``
say what a failed op poisons and leaves in place of its results; ``local`` serves code beside
the engine (actors, ``%%mesh`` cells). Nothing here imports ``controller/``: a test guards it.
"""
