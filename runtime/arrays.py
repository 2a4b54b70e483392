"""Array interchange: read pointer, shape, strides, dtype and device from any array; allocate like it.

torch tensors are read directly (the hot path: a few attribute reads); other CUDA arrays (CuPy, Numba,
JAX, anything with ``__cuda_array_interface__`` or DLPack) through ``cuda.core``'s ``StridedMemoryView``;
numpy arrays (and CPU torch tensors) are host arrays, used by the simulator path.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """

    obj: object
    kind: str
    ptr: int
    shape: tuple
    strides: tuple
    dtype: str
    device: int | None


def _torch_dtype_name(dt):
    return str(dt).replace("torch.", "")


def describe(obj, name: str) -> ArrayInfo:
    """Describe ``obj`` (argument ``name``); raises :class:`ArgumentError` if it is not an array."""
    mod = type(obj).__module__
    if mod.startswith("torch"):
        dev = obj.device
        return ArrayInfo(obj, "torch", obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()),
                         _torch_dtype_name(obj.dtype), dev.index if dev.type == "cuda" else None)
    if isinstance(obj, np.ndarray):
        isz = obj.dtype.itemsize
        if any(s % isz for s in obj.strides):
            raise ArgumentError(f"{name} has strides {obj.strides} bytes, not a multiple of its itemsize {isz}")
        return ArrayInfo(obj, "numpy", obj.__array_interface__["data"][0], tuple(obj.shape),
                         tuple(s // isz for s in obj.strides), obj.dtype.name, None)
    if hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__dlpack__"):
        from cuda.core.utils import StridedMemoryView

        try:
            make = getattr(StridedMemoryView, "from_any_interface", None)
            v = make(obj, stream_ptr=-1) if make is not None else StridedMemoryView(obj, stream_ptr=-1)
        except Exception as e:
            raise ArgumentError(f"{name} could not be read as a CUDA array ({e})") from e
        if not v.is_device_accessible:
            raise ArgumentError(f"{name} is a host array; expected a CUDA array on the GPU")
        dt = getattr(v.dtype, "name", str(v.dtype))
        strides = v.strides
        if strides is None:
            strides, acc = [], 1
            for n in reversed(v.shape):
                strides.insert(0, acc)
                acc *= n
        kind = "cupy" if mod.startswith("cupy") else "numba" if mod.startswith("numba") else "other"
        return ArrayInfo(obj, kind, int(v.ptr), tuple(v.shape), tuple(strides), dt, int(v.device_id))
    raise ArgumentError(
        f"{name} is a {type(obj).__name__}; expected an array (torch tensor, CuPy/Numba CUDA array, or a "
        f"numpy array on the simulator)"
    )


def empty(like: ArrayInfo, shape, strides, dtype: str):
    """Allocate an uninitialized array of the same kind and device as ``like``.

    ``strides`` are element strides of a dense layout (a permutation of row-major).
    """
    if like.kind == "torch":
        import torch

        return torch.empty_strided(tuple(shape), tuple(strides), dtype=getattr(torch, dtype),
                                   device=like.obj.device)
    order = sorted(range(len(shape)), key=lambda d: -strides[d]) if shape else []
    phys = [shape[d] for d in order]
    inv = np.argsort(order) if shape else []
    if like.kind == "numpy":
        if dtype == "bfloat16":
            import ml_dtypes  # noqa: F401  (registers numpy's 'bfloat16' dtype)

            npdt = np.dtype("bfloat16")
        else:
            npdt = np.dtype(dtype)
        return np.empty(phys, dtype=npdt).transpose(inv)
    if dtype == "bfloat16":
        raise ArgumentError(
            f"out: normc cannot allocate a bfloat16 {like.kind} array; pass out= (or use torch tensors)"
        )
    if like.kind == "cupy":
        import cupy

        with cupy.cuda.Device(like.device):
            return cupy.empty(phys, dtype=dtype).transpose(inv)
    from numba import cuda

    isz = np.dtype(dtype).itemsize
    with cuda.gpus[like.device]:
        return cuda.device_array(tuple(shape), dtype=dtype, strides=tuple(s * isz for s in strides))
