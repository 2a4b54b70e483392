"""Running planned kernels on Numba's CUDA simulator (no GPU): numpy in, numpy out.

Each array is passed to the kernel as a flat 1-D view starting at its first element (float16/bfloat16 as
their uint16 bits), so the kernels' element offsets index it exactly as they index device memory.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np

from ..errors import ArgumentError
from ..lowering.sim import load as _load_sim

__all__ = ["load", "run"]

# Numba's simulator keeps a process-wide "inside a kernel" stack: a launch from a second host thread while
# another runs would be taken for a device-function call. Launches are therefore serialized.
_launch_lock = threading.Lock()


def load(ks):
    """A simulator kernel for a :class:`normc.lowering.codegen.KernelSource`, launched as ``k(*arrays)``."""
    return _load_sim(ks)


def _flat(a, name):
    """1-D view of ``a``'s memory from its first element to its last (non-negative strides)."""
    if a is None:
        return np.zeros(1, np.float32)
    if any(s < 0 and n > 1 for n, s in zip(a.shape, a.strides)):
        raise ArgumentError(
            f"{name} has negative byte strides {a.strides}; the simulator supports non-negative strides "
            f"only (pass a copy, e.g. numpy.ascontiguousarray)"
        )
    isz = a.dtype.itemsize
    span = 1 + sum((n - 1) * s // isz for n, s in zip(a.shape, a.strides)) if a.size else 1
    flat = np.lib.stride_tricks.as_strided(a, shape=(span,), strides=(isz,), writeable=a.flags.writeable)
    if not flat.flags.writeable:
        # a read-only input (e.g. a broadcast view with zero strides): the simulator copies every argument
        # back after the launch, so hand it a private copy (kernels only load from inputs)
        flat = flat.copy()
    if isz == 2:  # the 16-bit words, in the array's byte order (a big-endian float16 array: big-endian words)
        order = a.dtype.byteorder if a.dtype.byteorder in "<>" else "="
        flat = flat.view(np.dtype(np.uint16).newbyteorder(order))
    return flat


def run(entry, x, y, scale, shift, mean, rstd):
    """Launch ``entry``'s kernels on the simulator over numpy arrays (results land in y, mean, rstd)."""
    ws = np.zeros(max(entry.ws, 1), np.float32)
    args = [_flat(x, "x"), _flat(y, "out"), _flat(scale, "scale"), _flat(shift, "shift"), _flat(mean, "mean"),
            _flat(rstd, "rstd"), ws]
    # Idle simulated threads compute statistics of empty slices (0/0) that are never stored: keep numpy quiet.
    # (np.errstate is per thread and the simulated CUDA threads are new threads, so filter the warnings.)
    with _launch_lock, warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=RuntimeWarning, message=r"(invalid value|divide by zero|overflow)")
        for k in entry.kernels:
            k(*args)
