"""The ranks' half of the tensor layer: what runs in a worker process.

``engine`` (the hidden ``_TensorEngine`` actor) runs the op batches the controller streams, with
the handlers of ``registry``: ``aten`` (torch ops on DTensors, via ``shard_ops``), ``module``
(``module_to_mesh``'s build, forward and backward), ``rref``; ``fetch`` answers sync points;
``side_effects`` says what a failed op poisons; ``local`` serves code beside the engine (actors,
``%%mesh`` cells). Nothing here imports ``controller/``: a test guards it.
"""
