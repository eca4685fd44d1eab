"""The controller's half of the tensor layer: what runs in the user's process.

``tensor`` (MeshTensor) and ``recording`` turn torch ops into ops of the mesh's ``stream``;
``mesh`` is a proc mesh's tensor engine as the controller sees it; ``fetch`` (sync points),
``distribute``, ``activate``, ``module``, ``remote``, ``rref`` and ``adopt`` are the user's entry
points. Each module whose job has a half on the ranks has a namesake in ``worker/``.
"""
