"""Array interchange: read pointer, shape, strides, dtype and device from any array; allocate like it.

torch tensors are read directly (the hot path: a few attribute reads); other CUDA arrays (CuPy, Numba,
JAX, anything with ``__cuda_array_interface__`` or DLPack) through ``cuda.core``'s ``StridedMemoryView``,
which also does the producer/consumer stream handshake of both protocols; numpy arrays, and host arrays
exported through DLPack (e.g. JAX CPU arrays, read as numpy views), are host arrays, used by the simulator
path.
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass, replace

import numpy as np

from ..errors import ArgumentError

SUPPORTED = ("float32", "float16", "bfloat16")


@dataclass
class ArrayInfo:
    """What normc needs to know about one array argument.

    Attributes:
        obj: the array itself.
        kind: ``"torch"``, ``"cupy"``, ``"numba"``, ``"numpy"`` or ``"other"``.
        ptr: address of element 0 (device address for CUDA arrays, host address for host arrays).
        shape: tuple of extents; strides: tuple of element strides.
        dtype: dtype name (``"float32"``, ``"float16"``, ``"bfloat16"``, or another name to reject).
        device: CUDA device ordinal, or ``None`` for a host array.
        readonly: the array must not be written (a read-only numpy array or CUDA array interface, a DLPack
            tensor flagged read-only, a JAX array, or a host copy of a DLPack array); only ``out`` cares.

    For a host array read through DLPack, ``obj`` is the numpy view of it (kind ``"numpy"``).
    """

    obj: object
    kind: str
    ptr: int
    shape: tuple
    strides: tuple
    dtype: str
    device: int | None
    readonly: bool = False


# DLPack device types (dlpack.h, DLDeviceType)
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13


def kind_of(obj) -> str:
    """The ``kind`` :func:`describe` will give ``obj`` (cheap: its type only; ``"other"`` for any foreign object)."""
    mod = type(obj).__module__
    if mod.startswith("torch"):
        return "torch"
    if isinstance(obj, np.ndarray):
        return "numpy"
    return "cupy" if mod.startswith("cupy") else "numba" if mod.startswith("numba") else "other"


def dlpack_stream(handle: int) -> int:
    """The ``stream`` value that asks a DLPack producer to order its work before the CUDA stream ``handle``.

    The Python array API standard's ``__dlpack__(stream=...)`` on CUDA: an int stream handle; 1 is the legacy
    default stream, 2 the per-thread default stream, and 0 is disallowed (ambiguous). normc launches on
    handle 0 when it has no stream, which the driver reads as the legacy default stream (the per-thread one
    when cuda.bindings runs with ``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1``), so 0 becomes 1 (or 2).
    Other handles (including 1 and 2 themselves) pass through. The same value serves as the consumer stream of
    the ``__cuda_array_interface__`` handshake, where 1 and 2 are the driver's CU_STREAM_LEGACY and
    CU_STREAM_PER_THREAD handles.
    """
    handle = int(handle)
    if handle != 0:
        return handle
    try:
        per_thread = int(os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") or 0)
    except ValueError:
        per_thread = 0
    return 2 if per_thread else 1


def _torch_dtype_name(dt):
    return str(dt).replace("torch.", "")


def describe(obj, name: str, stream=None) -> ArrayInfo:
    """Describe ``obj`` (argument ``name``); raises :class:`ArgumentError` if it is not an array.

    ``stream``: for arrays read through DLPack or ``__cuda_array_interface__``, a callable with no arguments
    returning the raw handle of the CUDA stream normc will launch on (called at most once, only for such
    arrays). The producer's pending work on ``obj`` is then ordered before that stream: DLPack passes
    ``stream=`` :func:`dlpack_stream` of it to ``obj.__dlpack__``; the CUDA array interface makes it wait for
    an event on the stream the array names. ``None``: no ordering (for arrays normc allocated itself).
    """
    kind = kind_of(obj)
    if kind == "torch":
        dev = obj.device
        if dev.type != "cuda":
            # a host tensor: read as a numpy view of its memory (DLPack), so the simulator can take it as
            # scale, shift or out; kind stays "torch", which check_x refuses for x (y would come back as numpy)
            return replace(_describe_host_dlpack(obj.detach(), name), kind="torch")
        return ArrayInfo(obj, "torch", obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()),
                         _torch_dtype_name(obj.dtype), dev.index if dev.type == "cuda" else None)
    if kind == "numpy":
        return _describe_numpy(obj, name, not obj.flags.writeable)
    has_dlpack = hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")
    if has_dlpack:
        try:
            dev_type = int(obj.__dlpack_device__()[0])
        except Exception as e:
            raise ArgumentError(f"{name} could not be read through DLPack (__dlpack_device__ failed: {e})") from e
        if dev_type == KDL_CPU:
            return _describe_host_dlpack(obj, name)
        if dev_type not in (KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED):
            raise ArgumentError(f"{name} is on DLPack device type {dev_type}; expected a CUDA array (device type "
                                f"{KDL_CUDA}, or CUDA host/managed memory)")
    elif not hasattr(obj, "__cuda_array_interface__"):
        raise ArgumentError(
            f"{name} is a {type(obj).__name__}; expected an array (torch tensor, CuPy/Numba/JAX CUDA array, or a "
            f"numpy array on the simulator)"
        )
    try:
        from cuda.core.utils import StridedMemoryView
    except ImportError:  # pragma: no cover - depends on the installed cuda-core
        from cuda.core.experimental.utils import StridedMemoryView

    # -1: cuda.core's "no stream ordering" for both protocols (never 0, which it would pass as stream=None)
    stream_ptr = -1 if stream is None else dlpack_stream(stream())
    try:
        make = getattr(StridedMemoryView, "from_any_interface", None)
        v = make(obj, stream_ptr=stream_ptr) if make is not None else StridedMemoryView(obj, stream_ptr=stream_ptr)
        device_accessible = v.is_device_accessible
        dtype, shape, strides = v.dtype, tuple(v.shape), v.strides
        ptr, device, readonly = int(v.ptr), int(v.device_id), bool(v.readonly)
    except Exception as e:
        raise ArgumentError(f"{name} could not be read as a CUDA array ({e})") from e
    if not device_accessible:
        raise ArgumentError(f"{name} is a host array; expected a CUDA array on the GPU")
    dt = getattr(dtype, "name", str(dtype))
    if strides is None:
        strides, acc = [], 1
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= n
    readonly = readonly or _immutable(obj)
    return ArrayInfo(obj, kind, ptr, shape, tuple(strides), dt, device, readonly)


def c_order(info: ArrayInfo) -> bool:
    """Whether ``info``'s strides are C order (row-major) over its extents greater than 1; an array with no
    element is (torch and numpy agree)."""
    if math.prod(info.shape) == 0:
        return True
    nontrivial = [(n, s) for n, s in zip(info.shape, info.strides) if n > 1]
    return all(nontrivial[i][1] == nontrivial[i + 1][1] * nontrivial[i + 1][0]
               for i in range(len(nontrivial) - 1)) and (not nontrivial or nontrivial[-1][1] == 1)


def _immutable(obj) -> bool:
    """JAX arrays are immutable, whatever their DLPack export says."""
    return type(obj).__module__.startswith(("jax", "jaxlib"))


def _describe_numpy(arr, name, readonly) -> ArrayInfo:
    if isinstance(arr, np.ma.MaskedArray):  # its mask would be ignored, and y would come back unmasked
        raise ArgumentError(f"{name} is a numpy masked array; normc would ignore its mask: pass {name}.filled(v) "
                            f"or {name}.data")
    isz = arr.dtype.itemsize
    if any(s % isz for s in arr.strides):
        raise ArgumentError(f"{name} has byte strides {arr.strides}, not a multiple of its itemsize {isz}")
    return ArrayInfo(arr, "numpy", arr.__array_interface__["data"][0], tuple(arr.shape),
                     tuple(s // isz for s in arr.strides), arr.dtype.name, None, bool(readonly))


def _describe_host_dlpack(obj, name) -> ArrayInfo:
    """A host array exported through DLPack (device type kDLCPU), read as a numpy view of the same memory.

    numpy's DLPack import knows no bfloat16: such arrays (and any other numpy cannot import) are read with
    ``numpy.asarray`` instead, which may copy, so they are marked read-only (a result written into a copy
    would be lost).
    """
    readonly = _immutable(obj)
    try:
        arr = np.from_dlpack(obj)
    except Exception:
        try:
            arr = np.asarray(obj)
        except Exception as e:
            raise ArgumentError(f"{name} is a host array (DLPack device type {KDL_CPU}) that numpy could not read "
                                f"({e})") from e
        readonly = True
    if not isinstance(arr, np.ndarray) or arr.dtype.kind == "O":
        raise ArgumentError(f"{name} is a host array (DLPack device type {KDL_CPU}) that numpy could not read")
    return _describe_numpy(arr, name, readonly or not arr.flags.writeable)


def empty(like: ArrayInfo, shape, strides, dtype: str, stream: int = 0):
    """Allocate an uninitialized array of the same kind and device as ``like``.

    ``strides`` are element strides of a dense layout (a permutation of row-major). ``stream``: the raw handle
    of the stream the kernels writing the array run on; a Numba device array (what CUDA arrays other than torch
    and CuPy get) is bound to it when it is not 0, so that its ``__cuda_array_interface__`` names the stream and
    a consumer (CuPy, ``jax.numpy.asarray``, ``cuda.core``) orders its reads after the kernels.
    """
    if like.kind == "torch" and like.device is not None:
        import torch

        return torch.empty_strided(tuple(shape), tuple(strides), dtype=getattr(torch, dtype),
                                   device=like.obj.device)
    order = sorted(range(len(shape)), key=lambda d: -strides[d]) if shape else []
    phys = [shape[d] for d in order]
    inv = np.argsort(order) if shape else []
    if like.kind == "numpy" or like.device is None:  # host arrays (a host torch tensor is read as numpy)
        if dtype == "bfloat16":
            importlib.import_module("ml_dtypes")  # registers numpy's 'bfloat16' dtype

            npdt = np.dtype("bfloat16")
        else:
            npdt = np.dtype(dtype)
        return np.empty(phys, dtype=npdt).transpose(inv)
    if dtype == "bfloat16":
        raise ArgumentError(
            f"out: normc cannot allocate a bfloat16 {like.kind} array; pass out= (a writeable bfloat16 CUDA array), "
            f"compile with out_dtype='float32', or use torch tensors"
        )
    if like.kind == "cupy":
        import cupy

        with cupy.cuda.Device(like.device):
            return cupy.empty(phys, dtype=dtype).transpose(inv)
    from numba import cuda

    isz = np.dtype(dtype).itemsize
    with cuda.gpus[like.device]:
        bound = cuda.external_stream(stream) if stream else 0
        return cuda.device_array(tuple(shape), dtype=dtype, strides=tuple(s * isz for s in strides), stream=bound)
