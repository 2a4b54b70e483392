"""Running planned kernels on Numba's CUDA simulator (no GPU): numpy in, numpy out.

Each array is passed to the kernel as a flat 1-D view starting at its first element (float16/bfloat16 as
their uint16 bits), so the kernels' element offsets index it exactly as they index device memory.
"""

from __future__ import annotations

import numpy as np

from ..lowering.sim import load as _load_sim

__all__ = ["load", "run"]


def load(ks):
    """A simulator kernel for a :class:`normc.lowering.codegen.KernelSource`, launched as ``k(*arrays)``."""
    kern = _load_sim(ks)
    grid, block = ks.grid, ks.block

    def call(*arrays):
        kern[grid, block](*arrays)

    return call


def _flat(a):
    """1-D view of ``a``'s memory from its first element to its last (non-negative strides)."""
    if a is None:
        return np.zeros(1, np.float32)
    if any(s < 0 for s in a.strides):
        raise ValueError("negative strides are not supported on the simulator")
    isz = a.dtype.itemsize
    span = 1 + sum((n - 1) * s // isz for n, s in zip(a.shape, a.strides)) if a.size else 1
    flat = np.lib.stride_tricks.as_strided(a, shape=(span,), strides=(isz,), writeable=True)
    if isz == 2:
        flat = flat.view(np.uint16)
    return flat


def run(entry, x, y, scale, shift, mean, rstd):
    """Launch ``entry``'s kernels on the simulator over numpy arrays (results land in y, mean, rstd)."""
    ws = np.zeros(max(entry.ws, 1), np.float32)
    args = [_flat(x), _flat(y), _flat(scale), _flat(shift), _flat(mean), _flat(rstd), ws]
    for k in entry.kernels:
        k(*args)
