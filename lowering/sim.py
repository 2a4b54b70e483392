"""Simulator implementations of the operations generated kernels call, for Numba's CUDA simulator.

The simulator runs each CUDA thread as a Python thread and lacks warp shuffles and raw-pointer
intrinsics. Here pointers are flat numpy arrays (float32, or uint16 holding float16/bfloat16 bits), loads
and stores convert through numpy, and a shuffle is an exchange through the block's shared state between two
``syncthreads`` (every generated kernel calls shuffles uniformly across the block, as warps do on the GPU).
"""

from __future__ import annotations

import threading

import numpy as np
from numba import cuda

from .device import TAGS, WIDTHS


def _cvt_in(tag, raw):
    if tag == "f32":
        return np.float32(raw)
    if tag == "f16":
        return np.float32(np.uint16(raw).view(np.float16))
    return np.array([np.uint32(raw) << np.uint32(16)], dtype=np.uint32).view(np.float32)[0]


def _cvt_out(tag, v):
    v = np.float32(v)
    if tag == "f32":
        return v
    if tag == "f16":
        with np.errstate(over="ignore"):
            return np.float16(v).view(np.uint16)
    if np.isnan(v):
        return np.uint16(0x7FC0)
    u = int(np.array([v], dtype=np.float32).view(np.uint32)[0])
    return np.uint16(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)


def _make_ld(tag, w):
    if w == 1:
        return lambda p, i: _cvt_in(tag, p[int(i)])
    return lambda p, i: tuple(_cvt_in(tag, p[int(i) + k]) for k in range(w))


def _make_st(tag, w):
    def st(p, i, vals):
        i = int(i)
        if w == 1:
            p[i] = _cvt_out(tag, vals)
            return
        for k in range(w):
            p[i + k] = _cvt_out(tag, vals[k])

    return st


def _exchange(v, partner_of):
    t = threading.current_thread()
    mgr = t._manager
    store = mgr.__dict__.setdefault("_normc_xchg", {})
    me = t.thread_id
    store[me] = v
    t.syncthreads()
    out = store[partner_of(me)]
    t.syncthreads()
    return out


def shfl_xor(v, m):
    """Simulator warp shuffle (xor): an exchange through the block between two barriers."""
    return _exchange(v, lambda me: (me // 32) * 32 + ((me % 32) ^ int(m)))


def shfl_idx(v, src):
    """Simulator warp shuffle (indexed): an exchange through the block between two barriers."""
    return _exchange(v, lambda me: (me // 32) * 32 + int(src))


def rsqrt(v):
    """1 / sqrt(v) in float32, inf for 0 (as on the GPU), without numpy warnings."""
    v = np.float32(v)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.float32(1.0) / np.sqrt(v)


def _i64(v):
    return int(v)


def namespace() -> dict:
    """Globals for exec'ing generated kernel source for Numba's CUDA simulator."""
    ns = {
        "cuda": cuda, "I64": _i64, "F32": np.float32, "F32T": np.float32, "rsqrt": rsqrt,
        "shfl_xor": shfl_xor, "shfl_idx": shfl_idx, "min": min, "max": max, "range": range,
    }
    for tag in TAGS:
        for w in WIDTHS[tag]:
            ns[f"ld{w}_{tag}"] = _make_ld(tag, w)
            ns[f"st{w}_{tag}"] = _make_st(tag, w)
    return ns


def load(ks):
    """exec a :class:`KernelSource` for the simulator; returns a simulator kernel (``k[grid, block](...)``)."""
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    ns = namespace()
    exec(compile(ks.source, f"<normc-sim:{ks.name}>", "exec"), ns)
    return FakeCUDAKernel(ns[ks.name], device=False)
