"""The pickler's fast path for plain values: builtin scalars, small trees of tuples, lists and
str-keyed dicts, and CPU tensors, which travel as their bytes (zero-copy frames when large) and
are rebuilt on the receiver straight on those bytes.

``codec.dumps`` gives such a tree to the C pickler alone; its cloudpickle pickler reduces the
tensors it meets elsewhere here too, and torch's op objects to the names that find them.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

SIMPLE_TYPES = frozenset((int, float, str, bytes, bool, type(None)))
# Tensors and arrays smaller than this travel inside the payload (a copy is cheaper than a frame).
OOB_THRESHOLD = 64 * 1024


def _rebuild_tensor(
    data: Any, dtype_name: str, shape: tuple[int, ...], requires_grad: bool, param: bool
) -> Any:
    dtype = _DTYPES.get(dtype_name)
    if dtype is None:
        dtype = _torch_dtype(dtype_name)
    torch = sys.modules["torch"]  # imported by _torch_dtype for the first tensor
    if type(data) is bytes:
        data = bytearray(data)  # a tensor needs a writable buffer
    # The frame is ours alone (ZeroMQ gave us the message), so the tensor may own it.
    # What a tensor costs here is the number of library calls, each slow on the caches a
    # message leaves behind (in the real path ~10 µs for the three calls through numpy against
    # ~3 µs in a loop), so a vector, the common case, takes one torch call; other shapes go
    # through numpy where it has the dtype (one torch call instead of torch's three).
    if len(shape) == 1 and shape[0]:
        t = torch.frombuffer(data, dtype=dtype, count=shape[0])
    elif len(memoryview(data)) == 0:
        t = torch.empty(shape, dtype=dtype)
    else:
        np_dtype = _NUMPY_DTYPES.get(dtype_name)
        if np_dtype is not None:
            import numpy

            t = torch.from_numpy(numpy.frombuffer(data, dtype=np_dtype).reshape(shape))
        else:
            t = torch.frombuffer(data, dtype=dtype).reshape(shape)
    if param:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    if requires_grad:
        t.requires_grad_(True)
    return t


# torch dtypes that numpy has under the same name
_NUMPY_DTYPES = {
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
    "complex64": "complex64",
    "complex128": "complex128",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "bool": "bool",
}
_DTYPES: dict[str, Any] = {}  # dtype name -> torch dtype, filled as tensors come and go
_DTYPE_NAMES: dict[Any, str] = {}  # and the other way


def _torch_dtype(name: str) -> Any:
    dtype = _DTYPES.get(name)
    if dtype is None:
        import torch

        dtype = getattr(torch, name)
        _dtype_name(dtype)
    return dtype


def _dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
        _DTYPES[name] = dtype
    return name


def reduce_tensor(t: Any, torch: Any) -> Any:
    param = type(t) is torch.nn.Parameter
    try:
        # numpy() refuses what is not a plain CPU tensor (device, layout, quantized, nested,
        # conjugate bit) and dtypes numpy lacks (bfloat16): those take the general path below.
        # Its checks are in C, several times cheaper than asking each property from Python.
        arr = (t.detach() if t.requires_grad else t).numpy()
    except (RuntimeError, TypeError):
        return _reduce_tensor_general(t, torch, param)
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")
    nbytes = arr.nbytes
    if nbytes >= OOB_THRESHOLD:
        buf: Any = pickle.PickleBuffer(arr)
    else:
        buf = arr.tobytes() if nbytes else b""
    return (_rebuild_tensor, (buf, _dtype_name(t.dtype), tuple(t.shape), t.requires_grad, param))


def _reduce_tensor_general(t: Any, torch: Any, param: bool) -> Any:
    if t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized or t.is_nested:
        return None  # torch's own pickling handles the rest
    data = t.detach().resolve_conj().resolve_neg()
    if not data.is_contiguous():
        data = data.contiguous()
    nbytes = data.numel() * data.element_size()
    flat = data.reshape(-1).view(torch.uint8) if data.numel() else None
    if flat is None:
        buf: Any = b""
    elif nbytes >= OOB_THRESHOLD:
        buf = pickle.PickleBuffer(flat.numpy())
    else:
        buf = flat.numpy().tobytes()
    return (_rebuild_tensor, (buf, _dtype_name(data.dtype), tuple(t.shape), t.requires_grad, param))


class _Reduced:
    """A tensor in a tree that the C pickler takes whole (see ``plain_tree``): pickles as the
    call that rebuilds it."""

    __slots__ = ("reduced",)

    def __init__(self, reduced: Any) -> None:
        self.reduced = reduced

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.reduced


NOT_PLAIN: Any = object()
_MAX_TREE_DEPTH = 3
_MAX_TREE_ITEMS = 64


def plain_tree(obj: Any, tensor: type, memo: dict[int, Any], depth: int = 0) -> Any:
    """``obj`` with its tensors replaced by ``_Reduced``, when it is a small tree of builtin
    scalars, tuples, lists, dicts with str keys and plain tensors, else ``NOT_PLAIN``.

    Such a tree (a call's arguments, a result) pickles with the C pickler alone, which has no
    Python hook per object: cloudpickle's costs tens of µs even for ``((t,), {})``. What is
    shared stays shared (``memo``, by id), as pickle's own memo keeps it.
    """
    kind = type(obj)
    if kind in SIMPLE_TYPES:
        return obj
    done = memo.get(id(obj))
    if done is not None:
        return done
    if kind is tensor:
        torch = sys.modules["torch"]
        reduced = reduce_tensor(obj, torch)
        if reduced is None:
            return NOT_PLAIN
        out: Any = _Reduced(reduced)
    elif depth >= _MAX_TREE_DEPTH:
        return NOT_PLAIN
    elif kind is tuple or kind is list:
        if len(obj) > _MAX_TREE_ITEMS:
            return NOT_PLAIN
        items = []
        for x in obj:
            y = plain_tree(x, tensor, memo, depth + 1)
            if y is NOT_PLAIN:
                return NOT_PLAIN
            items.append(y)
        out = tuple(items) if kind is tuple else items
    elif kind is dict:
        if len(obj) > _MAX_TREE_ITEMS:
            return NOT_PLAIN
        out = {}
        for k, v in obj.items():
            if type(k) is not str:
                return NOT_PLAIN
            y = plain_tree(v, tensor, memo, depth + 1)
            if y is NOT_PLAIN:
                return NOT_PLAIN
            out[k] = y
    else:
        return NOT_PLAIN
    memo[id(obj)] = out
    return out


def torch_op_path(obj: Any, kind: type, torch: Any) -> tuple[str, ...] | None:
    """``torch.ops``, a namespace of it or an op (``torch.ops.aten.mm.default``), as the names
    that find it again: they hold C++ handles that do not pickle, and a function that uses
    ``torch.ops.aten...`` (a remote function's body) pickles them with it."""
    ops = torch._ops  # noqa: SLF001
    if kind is ops._Ops:  # noqa: SLF001
        return ()
    if kind is ops._OpNamespace:  # noqa: SLF001
        return (obj.name,)
    if kind is ops.OpOverloadPacket:
        return tuple(obj._qualified_op_name.split("::", 1))  # noqa: SLF001
    if kind is ops.OpOverload:
        return (obj.namespace, obj._overloadpacket.__name__, obj._overloadname)  # noqa: SLF001
    return None


def torch_op(*path: str) -> Any:
    import torch

    found: Any = torch.ops
    for name in path:
        found = getattr(found, name)
    return found
