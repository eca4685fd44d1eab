"""The actor runtime: processes, messages, actors and meshes. Nothing here knows about Jupyter.

Layers
======

Bottom first. A module imports only from its own layer or a lower one, ``TYPE_CHECKING`` imports
included; ``tests/unit/test_layers.py`` checks every import form, function-level ones included.
Above the runtime sit ``actormesh.hosts``, ``actormesh.tensor``, ``actormesh.kernel`` and
``actormesh.debugger``, in that order; the runtime imports none of them.

Each sub-package has a face, its ``__init__.py``: the names other layers may use, in its
``__all__``. Code outside a sub-package imports from the face, never from its modules
(``tests/unit/test_faces.py``); ``messaging/protocol.py`` is public as a whole, and the modules
that run as ``python -m`` are imported by name. The table lists every module (a test checks it).

====  ================  ==========================================================================
 0    ``extent.py``     ``Extent``, ``Point``: named sizes and coordinates. Pure.
      ``strides.py``    the strides of a shape's views (slice, split, flatten). Pure.
      ``shape.py``      ``Shape``: a strided view of a rank space. Pure.
      ``mesh_shape.py`` ``MeshShape``: the slicing every mesh shares. Pure.
 1    ``faults/``       ``supervision`` (where failures nobody waits for go; exit status),
                        ``stacks`` (stack dumps, interrupts).
 2    ``messaging/``    ``codec`` (pickling, signing: the only place that unpickles),
                        ``plain_pickle`` (the C pickler's fast path: builtins and
                        tensors as zero-copy buffers, rebuilt on arrival), ``shm_lane``
                        (those buffers through shared memory between processes of a host),
                        ``protocol`` (every message kind and its fields), ``envelopes``
                        (each kind's envelope by field name, generated from it), ``curve``,
                        ``address``, ``receive`` (reading signed messages off a socket),
                        ``run_dir``, ``io_loop`` (the I/O thread: sockets and fds polled,
                        calls and timers), ``wake_pipe`` (waking a thread asleep in
                        ``poll()``), ``open_files`` (the open-file limit, checked before a
                        connection), ``outboxes`` (a socket per destination, the routes
                        to them, one-way messages queued on them; built on ``io_loop``),
                        ``transport`` (the inbox and the send paths, built on ``outboxes``),
                        ``node`` (a process's handlers, ports, deaths), ``actor_inbox``,
                        ``reply_inbox``, ``main_inbox`` (the main thread's), ``datagrams``
                        (replies to a waiting thread of the same host, as unix datagrams),
                        ``socket_waker`` (waking a thread asleep in a receive), ``tunnel``,
                        ``logs`` (rank-labelled output), ``metrics`` (``log_metrics``,
                        batched).
 3    ``actors/``       ``actor`` (``Actor``, ``@endpoint``), ``runner`` (an actor's thread),
                        its parts ``lifecycle`` (its construction, stop, ``__cleanup__`` and
                        end), ``reentry`` (what runs at an await), ``ownership`` (who hears of
                        its failures) and ``response_port`` (explicit response ports), which
                        see it as ``runner_parts.Runner``; ``stand_in`` (who reads its inbox
                        while a long ``__init__`` runs), ``failures`` (failures as text),
                        ``actor_host`` (the actors of one process, a proc mesh's bootstrap),
                        ``actor_context`` (``context()``), ``future``, ``combinators``
                        (``then``, ``when_all``).
 4    ``meshes/``       ``proc_table`` (where ranks live), ``relay`` (fan-out through host
                        agents), ``value_mesh``, ``display`` (values as a notebook shows
                        them), ``collect`` (gathering replies), ``waits`` (who waits on whom,
                        for timeouts), ``arguments`` (a call's arguments pickled once, and
                        who reads them), ``endpoint`` (the adverbs), ``actor_mesh``,
                        ``proc_mesh`` (its record: ``MeshOwner``), ``one_proc`` (a process
                        as a one-proc mesh), ``rank_table`` (``ProcMesh.to_table()``),
                        ``ports``, ``tensor_seam`` (the one way up into the tensor layer).
 5    ``procs/``        ``controller``, ``worker_reports`` (what workers and agents report
                        to it), ``mesh_record`` (one proc mesh's start-up, exits, stop),
                        ``spawn_request`` (what a rank starts with), ``record_parts`` (the
                        controller and the record as each other see them), ``agent_handle``
                        (the controller's handle on a host agent, starting this machine's),
                        ``rehost`` (healed ranks elsewhere), ``respawn`` (a heal's actors
                        created again), ``host_mesh``, ``singletons``
                        (``get_or_spawn_controller``), ``worker``, ``rank_exit`` (what a worker
                        runs as a graceful stop ends it), ``host_agent``, ``worker_output`` (an
                        agent's workers and their pipes), ``zygote`` (the fork server),
                        ``osutil``, ``sampling`` (ranks' CPU and memory), ``tensorboard``
                        (metrics export).
 6    ``dataplane/``    ``buffers`` (``TensorBuffer``), ``cuda_buffers`` (its CUDA IPC side),
                        ``buffer_owner`` (the tensors a process lends, its answers to
                        holders), ``shm`` (its /dev/shm room and reader mappings),
                        ``rank_layout`` (a group's ranks and backend; pure), ``distributed``
                        (process groups over meshes), ``elastic_env`` (torchrun's variables
                        on each rank), ``spmd`` (``python -m actormesh run``), ``spmd_actor``
                        (Monarch's ``SPMDActor``), ``script_runner`` (a script as ``__main__``
                        on each rank).
====  ================  ==========================================================================

The life of a call: ``mesh.step.call(x).get()``
===============================================

Controller, user thread:

1. ``ActorMesh.__getattr__`` (``meshes/actor_mesh.py``) gives the mesh's ``Endpoint`` for
   ``step`` (``meshes/endpoint.py``), built once per mesh.
2. ``Endpoint.call`` makes a ``Gather`` (``meshes/collect.py``: one slot per rank) and casts:
   ``codec.dumps`` of the arguments (``pickle_arguments`` in ``meshes/arguments.py``;
   ``messaging/codec.py``; plain values and tensors through ``messaging/plain_pickle.py``), a
   reply address from the thread's ``ReplyInbox`` (``messaging/reply_inbox.py``), the envelope
   ``(CALL, key, endpoint, shape, reply)`` (``messaging/protocol.py``). Ranks on this host get
   it straight on each actor's own socket (``Outboxes.route_to_actor`` in
   ``messaging/outboxes.py``, ``Transport.send_many`` in ``messaging/transport.py``, signed
   once by ``codec.Signer.frames``; tensors of 64 KiB and more are copied once into a
   shared-memory slot that every rank reads, ``messaging/shm_lane.py``); ranks on other hosts
   through their host agent (``relay.cast`` → ``Relayer.on_relay`` in ``meshes/relay.py``).

Worker:

3. The actor's thread, ``ActorRunner._run`` (``actors/runner.py``), reads it from its
   ``ActorInbox`` (``messaging/actor_inbox.py``), asleep in a blocking receive on that socket
   until it comes. Messages that came through the process inbox
   instead go ``Transport`` I/O thread → ``Node.dispatch`` (``messaging/node.py``) →
   ``ActorHost._on_call`` (``actors/actor_host.py``) → ``ActorRunner.post``.
4. ``ActorRunner.handle_call`` reads the call by field name (``CallEnvelope.of``,
   ``messaging/envelopes.py``), runs the endpoint, flushes its output and sends ``(REPLY,
   port_id, index, status[, after])`` with the value or the rendered failure
   (``send_reply`` in ``actors/response_port.py``).

Controller again:

5. ``Future.get`` (``actors/future.py``) waits in ``ReplyInbox.wait``, which reads the replies
   on the waiting thread itself; ``Node.in_order`` keeps them behind earlier messages of the
   same sender; ``Gather.on_message`` fills the rank's slot (a failed or unreadable reply goes
   through ``Gather.deliver``); the last one
   resolves the future with a ``ValueMesh`` (``meshes/value_mesh.py``), or an ``ActorError``.

Extension points
================

================================  ===============================================================
``Node.register(kind, handler)``  handle a kind of ``messaging/protocol.py`` (one per kind)
``Node.on_close(fn)``             run ``fn`` when the process's node closes (buffers, inboxes)
``set_node_factory(fn)``          how the first ``current_node()`` is made (the controller's)
``on_controller(hook)``           run ``hook(controller)`` once the controller exists
``future.wait_hooks``             called while a ``Future.get`` blocks (the debugger ends waits
                                  on paused ranks)
``supervision.set_fault_hook``    where failures nobody waits for go (a broadcast that raised)
``tensor_seam.install(layer)``    what the runtime calls in the tensor layer above it
                                  (``ProcMesh.activate``/``rank``, ``Endpoint.rref``): one
                                  typed ``TensorLayer``, loaded on first use
================================  ===============================================================

For tools (the kernel, the debugger, the sidebar)
=================================================

Tools built on the runtime use these names of the faces, never its private fields (ruff's
``SLF001`` is on):

====================================  ===========================================================
``controller_if_started()``           this process's controller, or ``None`` (never makes one)
``Controller.live_record(mesh_id)``   a mesh's ``MeshRecord`` unless it is stopping or stopped;
                                      ``Controller.live_records()`` for all of them
``MeshRecord.proc_mesh(shape)``       a ``ProcMesh`` on a mesh found by its id (a view of it)
``MeshShape.rank_view(i)``            the one-actor view of rank ``i`` (``Shape.rank_view`` too)
``view_shape``, ``proc_table_of``,    a mesh's ``Shape``, its ``ProcTable``, an actor mesh's key
``actor_key``                         (functions: an attribute would hide a same-named endpoint)
``with_shape(mesh, shape)``           the view of a mesh on a ``Shape`` the tool worked out
``new_value_mesh(shape, values)``     a ``ValueMesh`` of the tool's own (``new_proc_mesh``,
                                      ``new_actor_mesh``, ``new_host_mesh`` likewise)
``Endpoint.cast(shape, ..., c)``      a cast on a view, its replies to a ``Collector`` ``c`` of
                                      the tool's own (``meshes/collect.py``)
``Future.pending_ranks()``            the ``(mesh_id, rank)`` a mesh call still waits for
``local_actor_host()``                the actors of this process (a worker's tools find theirs)
``stacks.TOOL_ACTOR_PREFIX``          actor names reserved for tools: left out of stack dumps
``stacks.without_busy_time(text)``    a stack dump that compares equal across ranks
====================================  ===========================================================
"""
