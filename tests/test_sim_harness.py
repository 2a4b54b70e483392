"""The simulator harness itself (normc.lowering.sim): its block barrier and warp shuffles on hand-written
kernels, so a wrong harness cannot hide behind a kernel that happens to agree with it."""

from __future__ import annotations

import time
import types

import numpy as np
import pytest

from normc.lowering import sim


def _launch(source, name, block, grid=1, coop=False):
    ks = types.SimpleNamespace(source=source, name=name, block=block, grid=grid, cluster=1, coop=coop)
    return sim.load(ks)


BARRIER_WITH_EXITED_THREADS = """
def k(out):
    sm = cuda.shared.array(64, F32)
    t = cuda.threadIdx.x
    if t >= 40:  # these threads have exited before the others' barriers: they must not be waited for
        return
    for step in range(3):
        sm[t] = F32(t * 10 + step)
        cuda.syncthreads()
        out[cuda.blockIdx.x * 64 + t] += sm[(t + 1) % 40]
        cuda.syncthreads()
"""


def test_block_barrier_counts_only_running_threads():
    """Threads 40-63 return at once; threads 0-39 pass six barriers, each reading its neighbour's value
    written before the barrier (a barrier that let a thread through early would read a stale step)."""
    out = np.zeros(128, np.float32)
    _launch(BARRIER_WITH_EXITED_THREADS, "k", 64, grid=2)(out)
    t = np.arange(40)
    want = sum(((t + 1) % 40) * 10.0 + s for s in range(3))
    for b in range(2):
        np.testing.assert_array_equal(out[b * 64:b * 64 + 40], want)
        np.testing.assert_array_equal(out[b * 64 + 40:(b + 1) * 64], 0.0)


SHUFFLE_SUM = """
def k(out):
    t = cuda.threadIdx.x
    v = F32(t)
    for off in (16, 8, 4, 2, 1):
        v = v + shfl_xor(v, off)
    out[t] = v
"""


def test_warp_shuffle_sums_within_each_warp():
    out = np.zeros(96, np.float32)
    _launch(SHUFFLE_SUM, "k", 96)(out)
    for w in range(3):
        np.testing.assert_array_equal(out[32 * w:32 * (w + 1)], float(sum(range(32 * w, 32 * (w + 1)))))


RAISES = """
def k(out):
    t = cuda.threadIdx.x
    if t == 37:
        out[1000] = 1.0  # out of bounds: IndexError
    v = shfl_xor(F32(t), 1)  # warp 1 waits here for lane 37, which never comes
    cuda.syncthreads()  # warp 0 waits here for warp 1
    out[t] = v
"""


def test_a_raising_thread_stops_its_block_at_once():
    """The first exception reaches the caller, with the other threads released from the block barrier and the
    warp barrier they wait at (not after the warp barrier's 300 s timeout); Numba's own block manager is
    back in place afterwards."""
    from numba.cuda.simulator import kernel as K

    numba_manager = K.BlockManager
    t0 = time.perf_counter()
    with pytest.raises(IndexError, match="tid=.37"):
        _launch(RAISES, "k", 64)(np.zeros(64, np.float32))
    assert time.perf_counter() - t0 < 30
    assert K.BlockManager is numba_manager


RAISES_BEFORE_THE_WARP_MEETS = """
def k(out):
    t = cuda.threadIdx.x
    if t == 0:
        out[1000] = 1.0  # out of bounds: IndexError, before any lane has reached the shuffle
    else:
        __import__("time").sleep(0.2)
    out[t] = shfl_xor(F32(t), 1)  # lanes 1-31 make warp 0's barrier after lane 0 has failed
"""


def test_a_warp_that_meets_after_the_failure_does_not_wait_for_it():
    t0 = time.perf_counter()
    with pytest.raises(IndexError, match="tid=.0,"):
        _launch(RAISES_BEFORE_THE_WARP_MEETS, "k", 64)(np.zeros(64, np.float32))
    assert time.perf_counter() - t0 < 30


COOP_RAISES_BEFORE_ARRIVING = """
def k(wp, out):
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    if t == 0:
        if b == 1:
            out[1000] = 1.0  # out of bounds: CTA 1 fails before it arrives
        arrive_u32(wp, 0)
        while acquire_u32(wp, 0) < 2:  # CTA 0 spins for CTA 1
            pass
    cuda.syncthreads()
    out[b * 32 + t] = 1.0
"""


def test_a_cta_spinning_for_one_that_failed_stops():
    """A cooperative kernel (its grid one simulated block) whose CTA 1 raises before arriving: CTA 0's thread
    spinning on the arrival counter stops, and the IndexError reaches the caller (found by a review: the
    launch hung)."""
    t0 = time.perf_counter()
    with pytest.raises(IndexError):
        launch = _launch(COOP_RAISES_BEFORE_ARRIVING, "k", 32, grid=2, coop=True)
        launch(np.zeros(1, np.float32), np.zeros(64, np.float32))
    assert time.perf_counter() - t0 < 30
