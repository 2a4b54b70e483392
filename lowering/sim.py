"""Simulator implementations of the operations generated kernels call, for Numba's CUDA simulator.

The simulator runs each CUDA thread as a Python thread and lacks warp shuffles and raw-pointer
intrinsics. Here pointers are flat numpy arrays (float32, or uint16 holding float16/bfloat16 bits), loads
and stores convert through numpy, and a shuffle is an exchange among the 32 threads of a warp at a warp
barrier (every generated kernel calls shuffles uniformly across each warp, as ``shfl.sync`` with a full
mask requires on the GPU; different warps may take different paths).
"""

from __future__ import annotations

import functools
import sys
import threading
import time

import numpy as np
from numba import cuda

from .device import HINTS, TAGS, WIDTHS


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


def _make_ldm(tag, w):
    ld = _make_ld(tag, w)
    zero = np.float32(0.0) if w == 1 else (np.float32(0.0),) * w
    return lambda p, i, ok: ld(p, i) if ok else zero


def _make_ldw(tag, w):
    """Word loads (device.py's ``ldw``/``ldwm``): here the raw 16-bit values themselves, converted by ``cvw``."""
    def ldw(p, i):
        return tuple(np.uint16(p[int(i) + k]) for k in range(w))

    zero = (np.uint16(0),) * w
    return ldw, (lambda p, i, ok: ldw(p, i) if ok else zero)


def _make_cvw(tag, w):
    if w == 1:
        return lambda words: _cvt_in(tag, words[0])
    return lambda words: tuple(_cvt_in(tag, v) for v in words)


def _make_stm(tag, w):
    st = _make_st(tag, w)

    def stm(p, i, vals, ok):
        if ok:
            st(p, i, vals)

    return stm


def sel(c, a, b):
    """``a if c else b`` as float32."""
    return np.float32(a if c else b)


_WARP_LOCK = threading.Lock()
# A warp barrier not met within this many seconds means a kernel shuffled in code not uniform across the warp
# (undefined on the GPU too): raise instead of hanging.
WARP_SYNC_TIMEOUT_S = 300


def _warp_barrier(t):
    """The barrier of ``t``'s warp (its block's threads with the same ``thread_id // 32``), made on first use."""
    mgr = t._manager
    w = t.thread_id // 32
    bars = mgr.__dict__.setdefault("_normc_warp_bars", {})
    bar = bars.get(w)
    if bar is None:
        with _WARP_LOCK:
            bar = bars.get(w)
            if bar is None:
                n = int(np.prod(mgr._block_dim))
                bar = bars[w] = threading.Barrier(min(32, n - 32 * w), timeout=WARP_SYNC_TIMEOUT_S)
    return bar


_BLOCK_FAILED = "another simulated thread of this block raised"


def _stop_if_block_failed(t):
    """Raise in simulated thread ``t`` once another thread of its block has failed (normc's block manager,
    :class:`_BlockBarrier`; nothing under Numba's own), so a thread about to wait for it stops instead."""
    block = t._manager.__dict__.get("_normc_barrier")
    if block is not None and block.failed is not None:
        raise RuntimeError(_BLOCK_FAILED)


def _exchange(v, partner_of):
    """Each lane publishes ``v``, the warp meets, each lane reads its partner's. Only the warp's own lanes take
    part (as ``shfl.sync`` with a full mask): other warps may be elsewhere, e.g. idle warps of a loop that gives
    each warp a row.

    Shuffles alternate between two slots (by each lane's count of its shuffles, the same on every lane of a
    warp), so one barrier per shuffle suffices: a lane writes a slot again two shuffles later, after the
    barrier of the shuffle in between, which no lane passes before it has read this one."""
    t = threading.current_thread()
    n = t.__dict__.get("_normc_shuffles", 0)
    t._normc_shuffles = n + 1
    slots = t._manager.__dict__.setdefault("_normc_xchg", ({}, {}))
    store = slots[n & 1]
    me = t.thread_id
    bar = _warp_barrier(t)
    _stop_if_block_failed(t)  # after the warp barrier is registered: no race with _BlockBarrier.exit
    store[me] = v
    try:
        bar.wait()
        out = store[partner_of(me)]
    except threading.BrokenBarrierError:
        raise RuntimeError(f"simulated warp shuffle: warp {me // 32} did not meet within {WARP_SYNC_TIMEOUT_S} s "
                           "(a shuffle in code that is not uniform across the warp)") from None
    return out


def shfl_xor(v, m):
    """Simulator warp shuffle (xor): an exchange among the warp's lanes between two warp barriers."""
    return _exchange(v, lambda me: (me // 32) * 32 + ((me % 32) ^ int(m)))


def shfl_idx(v, src):
    """Simulator warp shuffle (indexed): an exchange among the warp's lanes between two warp barriers."""
    return _exchange(v, lambda me: (me // 32) * 32 + int(src))


def rsqrt(v):
    """1 / sqrt(v) in float32, inf for 0 (as on the GPU), without numpy warnings."""
    v = np.float32(v)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.float32(1.0) / np.sqrt(v)


def sqrtf(v):
    """sqrt(v) in float32."""
    with np.errstate(invalid="ignore"):
        return np.sqrt(np.float32(v))


def _i64(v):
    return int(v)


class _Dim:
    __slots__ = ("x", "y", "z")

    def __init__(self, x):
        self.x, self.y, self.z = x, 0, 0


class _ClusterShared:
    def __init__(self, owner):
        self.owner = owner

    def array(self, n, dtype):
        """This CTA's slice of one allocation shared by the whole simulated cluster (keyed by call site)."""
        t = threading.current_thread()
        f = sys._getframe(1)
        store = t._manager.__dict__.setdefault("_normc_cluster_smem", {})
        big = store.setdefault((f.f_code, f.f_lineno), np.zeros(self.owner.C * int(n), dtype))
        r = t.threadIdx.x // self.owner.T
        return big[r * int(n):(r + 1) * int(n)]


class _ClusterCuda:
    """The ``cuda`` name for a cluster kernel on the simulator.

    The simulator runs blocks one after another, so CTAs that wait for each other would deadlock. A cluster
    of ``C`` CTAs of ``T`` threads therefore runs as *one* simulated block of ``C * T`` threads: this object
    reports each thread's CTA-local ``threadIdx`` and its CTA's ``blockIdx``, gives each CTA its own slice of
    every shared array, and ``syncthreads`` (a barrier of the whole simulated block) stands in for both the
    CTA barrier and the cluster barrier (both are stronger-than-needed, never weaker).
    """

    def __init__(self, C, T, grid=1):
        self.C, self.T, self._grid = C, T, grid
        self.shared = _ClusterShared(self)

    @property
    def threadIdx(self):
        return _Dim(threading.current_thread().threadIdx.x % self.T)

    @property
    def blockIdx(self):
        t = threading.current_thread()
        return _Dim(t.blockIdx.x * self.C + t.threadIdx.x // self.T)

    @property
    def gridDim(self):
        return _Dim(self._grid * self.C)

    @staticmethod
    def syncthreads():
        threading.current_thread().syncthreads()

    @staticmethod
    def threadfence():
        """Python threads see each other's numpy writes at once: nothing to order."""


def cluster_arrive():
    """Simulator cluster arrive: a barrier of the simulated cluster block (see :class:`_ClusterCuda`)."""
    threading.current_thread().syncthreads()


def cluster_wait():
    """Simulator cluster wait: nothing left to wait for after :func:`cluster_arrive`'s full barrier."""


def dsmem_ld(arr, i, rank):
    """Element ``i`` of CTA ``rank``'s copy of the shared array ``arr`` (a slice of one cluster-wide array)."""
    return arr.base[int(rank) * len(arr) + int(i)]


def griddep_wait():
    """Simulator: kernels run one after another; nothing to wait for."""


def griddep_launch_dependents():
    """Simulator: no dependent launch to release."""


def smem_base(arr):
    """Simulator: the shared array itself stands for its address."""
    return arr


def lds_f32(base, i):
    """Simulator: element ``i`` of the shared array ``base``."""
    return base[int(i)]


def sts_f32(base, i, v):
    """Simulator: store ``v`` at element ``i`` of the shared array ``base``."""
    base[int(i)] = v


_counter_lock = threading.Lock()


def arrive_u32(p, i):
    """Simulator arrive: add 1 to the counter at ``p[i]`` (a float32 holding a small integer), atomically."""
    with _counter_lock:
        p[int(i)] += 1


def acquire_u32(p, i):
    """Simulator acquire load of the counter at ``p[i]``; yields the GIL so the CTAs it waits for run. Raises
    once a thread of the simulated block has failed (a CTA spinning for one that raised would spin forever)."""
    time.sleep(0)
    _stop_if_block_failed(threading.current_thread())
    return int(p[int(i)])


class _BlockBarrier:
    """``syncthreads`` for one simulated block, without polling: a thread arriving last (of those still running)
    releases the others. A thread that has exited no longer counts, as on the GPU and in Numba's own simulator
    (whose block manager finds the same by polling every thread in a loop on the main thread; under the GIL
    that loop took about half the CPU time of a 512-thread block's barriers). A thread that exits with an
    exception breaks this barrier and the block's warp barriers, so the other threads stop instead of waiting
    (``failed``: a warp barrier made after that is checked by :func:`_exchange`)."""

    def __init__(self, manager, n):
        self.manager, self.cond = manager, threading.Condition()
        self.alive, self.arrived, self.generation = n, 0, 0
        self.failed = None  # the first thread that raised

    def _release(self):
        self.arrived = 0
        self.generation += 1
        self.cond.notify_all()

    def wait(self):
        with self.cond:
            if self.failed is None:
                gen = self.generation
                self.arrived += 1
                if self.arrived == self.alive:
                    self._release()
                while gen == self.generation and self.failed is None:
                    self.cond.wait()
            if self.failed is not None:
                raise RuntimeError(_BLOCK_FAILED)

    def exit(self, thread):
        with self.cond:
            self.alive -= 1
            if thread.exception is not None and self.failed is None:
                self.failed = thread
                self.cond.notify_all()
                for bar in list(self.manager.__dict__.get("_normc_warp_bars", {}).values()):
                    bar.abort()
            elif self.alive and self.arrived == self.alive:
                self._release()


@functools.cache
def _block_manager():
    """A subclass of Numba's simulator ``BlockManager`` that runs a block's threads with :class:`_BlockBarrier`
    and joins them, instead of polling them (same semantics: one block at a time, exited threads do not count
    at a barrier, the first exception is raised on the launching thread). Made once: ``(Numba's simulator
    kernel module, the subclass)``."""
    from numba.cuda.simulator import kernel as K

    class Thread(K.BlockThread):
        def syncthreads(self):
            self._manager._normc_barrier.wait()

        def run(self):
            try:
                super().run()  # keeps an exception in self.exception, as Numba's
            finally:
                self._manager._normc_barrier.exit(self)

    class BlockManager(K.BlockManager):
        def run(self, grid_point, *args):
            points = list(np.ndindex(*self._block_dim))
            self._normc_barrier = barrier = _BlockBarrier(self, len(points))
            threads = [Thread(lambda: self._f(*args), self, grid_point, p, self._debug) for p in points]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if barrier.failed is not None:
                exc, tb = barrier.failed.exception
                raise exc.with_traceback(tb)

    return K, BlockManager


class _FastBlocks:
    """Context: Numba's simulator runs blocks with :func:`_block_manager`'s manager (re-entrant, thread-safe;
    Numba's own is put back when the last launch leaves)."""

    _lock = threading.Lock()
    _depth = 0  # launches inside the swap
    _numba_manager = None  # Numba's own BlockManager while swapped out

    def __enter__(self):
        cls = _FastBlocks
        with cls._lock:
            if cls._depth == 0:
                K, fast = _block_manager()
                cls._numba_manager = K.BlockManager
                K.BlockManager = fast
            cls._depth += 1

    def __exit__(self, *exc):
        cls = _FastBlocks
        K, _ = _block_manager()
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0:
                K.BlockManager = cls._numba_manager


def namespace(cluster=1, threads=1, blocks=1) -> dict:
    """Globals for exec'ing generated kernel source for Numba's CUDA simulator (``cluster`` CTAs of
    ``threads`` threads per simulated block, ``blocks`` simulated blocks)."""
    ns = {
        "cuda": cuda if cluster == 1 else _ClusterCuda(cluster, threads, blocks), "I64": _i64, "I32": _i64, "U32": _i64,
        "F32": np.float32, "F32T": np.float32, "rsqrt": rsqrt, "sqrtf": sqrtf, "shfl_xor": shfl_xor,
        "shfl_idx": shfl_idx,
        "cluster_arrive": cluster_arrive, "cluster_wait": cluster_wait, "dsmem_ld": dsmem_ld,
        "smem_base": smem_base, "lds_f32": lds_f32, "sts_f32": sts_f32, "griddep_wait": griddep_wait,
        "griddep_launch_dependents": griddep_launch_dependents,
        "arrive_u32": arrive_u32, "acquire_u32": acquire_u32, "ldcg_f32": _make_ld("f32", 1),
        "min": min, "max": max, "range": range,
    }
    for tag in TAGS:
        for w in WIDTHS[tag]:
            ns[f"ld{w}_{tag}"] = _make_ld(tag, w)
            ns[f"st{w}_{tag}"] = _make_st(tag, w)
            ns[f"ldm{w}_{tag}"] = _make_ldm(tag, w)
            ns[f"stm{w}_{tag}"] = _make_stm(tag, w)
            if tag != "f32":
                ns[f"ldw{w}_{tag}"], ns[f"ldwm{w}_{tag}"] = _make_ldw(tag, w)
                ns[f"cvw{w}_{tag}"] = _make_cvw(tag, w)
            for h in HINTS:  # cache hints change nothing a simulated memory can show
                for op in ("ld", "ldm", "st", "stm"):
                    ns[f"{op}{w}_{tag}_{h}"] = ns[f"{op}{w}_{tag}"]
    ns["sel"] = sel
    return ns


def load(ks):
    """exec a :class:`KernelSource` for the simulator; returns ``launch(*arrays)``.

    A cluster kernel (``ks.cluster`` > 1) runs each cluster as one simulated block (:class:`_ClusterCuda`). So
    does a cooperative kernel (``ks.coop``), whose CTAs spin until others have arrived: its whole grid is one
    simulated block, so every CTA runs at once (a barrier is then a barrier of the whole grid, which a coop
    kernel's items, whole reductions per round, pass through together)."""
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    C = ks.grid if ks.coop else ks.cluster
    ns = namespace(C, ks.block, ks.grid // C)
    exec(compile(ks.source, f"<normc-sim:{ks.name}>", "exec"), ns)
    kern = FakeCUDAKernel(ns[ks.name], device=False)
    grid, block = ks.grid // C, ks.block * C

    def launch(*arrays):
        with _FastBlocks():
            kern[grid, block](*arrays)

    return launch
