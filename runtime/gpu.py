"""Loading compiled kernels into the current CUDA context and launching them through ``cuda.core``.

A kernel is launched with a prebuilt ``LaunchConfig`` and seven plain pointer arguments; this costs a
few microseconds from Python, against tens for Numba's dispatcher. PTX is first linked to a cubin for
the device with nvJitLink (so a PTX ISA newer than the driver still loads, as long as nvJitLink knows it);
if that fails the driver JIT-compiles the PTX; if both fail a :class:`normc.CompileError` says why.
"""

from __future__ import annotations

import functools
import threading

from ..errors import CompileError

try:  # cuda-core >= 0.4 exports these at the top level; older releases under .experimental
    from cuda.core import Device, LaunchConfig, Linker, LinkerOptions, ObjectCode, Stream, launch
except ImportError:  # pragma: no cover - depends on the installed cuda-core
    from cuda.core.experimental import (Device, LaunchConfig, Linker, LinkerOptions, ObjectCode, Stream,
                                        launch)


@functools.lru_cache(maxsize=None)
def device_cc(ordinal: int) -> tuple:
    """Compute capability of CUDA device ``ordinal`` as (major, minor)."""
    cc = Device(ordinal).compute_capability
    return (cc.major, cc.minor) if hasattr(cc, "major") else tuple(cc)


@functools.lru_cache(maxsize=None)
def device_sms(ordinal: int) -> int:
    """Multiprocessor count of CUDA device ``ordinal`` (sizes the planner's grids)."""
    return Device(ordinal).properties.multiprocessor_count


_tls = threading.local()  # a CUDA context is current per host thread


def set_device(ordinal: int):
    """Make the primary context of ``ordinal`` current on this thread (the one torch/CuPy/Numba use)."""
    if getattr(_tls, "current", None) != ordinal:
        Device(ordinal).set_current()
        _tls.current = ordinal


def driver_version() -> int:
    """CUDA driver version as an int (e.g. 13000), 0 when no driver is present (part of the disk-cache key)."""
    try:
        from cuda.bindings import driver

        err, v = driver.cuDriverGetVersion()
        return int(v)
    except Exception:
        return 0


def link_cubin(ptx: str, cc) -> bytes | None:
    """PTX -> cubin for ``cc`` with nvJitLink, or ``None`` if nvJitLink cannot (e.g. it predates the PTX ISA)."""
    try:
        linker = Linker(ObjectCode.from_ptx(ptx.encode()), options=LinkerOptions(arch=f"sm_{cc[0]}{cc[1]}"))
        return bytes(linker.link("cubin").code)
    except Exception:
        return None


def _allow_non_portable_cluster(kernel):
    """Allow clusters of more than 8 CTAs for ``kernel`` (cudaFuncAttributeNonPortableClusterSizeAllowed)."""
    from cuda.bindings import driver

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
    handle = kernel.handle
    if isinstance(handle, driver.CUkernel):
        dev = driver.CUdevice(Device().device_id)
        err, = driver.cuKernelSetAttribute(attr, 1, handle, dev)
    else:
        err, = driver.cuFuncSetAttribute(handle, attr, 1)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CompileError(f"could not allow a non-portable cluster size for the kernel ({err})")


class Loaded:
    """A kernel loaded on one device: ``launch(stream, *pointers)``."""

    __slots__ = ("kernel", "config", "entry", "cluster_allowed")

    def __init__(self, ptx: str, cubin: bytes | None, entry: str, grid: int, block: int, cluster: int = 1):
        errors = []
        kernel = None
        if cubin:
            try:
                kernel = ObjectCode.from_cubin(cubin).get_kernel(entry)
            except Exception as e:
                errors.append(f"cubin: {e}")
        if kernel is None:
            try:
                kernel = ObjectCode.from_ptx(ptx.encode()).get_kernel(entry)
            except Exception as e:
                errors.append(f"PTX JIT: {e}")
        if kernel is None:
            raise CompileError(
                "could not load the kernel on this device (" + "; ".join(errors) + "). If the PTX ISA is "
                "newer than the driver, install an nvJitLink at least as new as the NVVM that produced it, or "
                "a NVVM no newer than the driver"
            )
        self.kernel = kernel
        self.entry = entry
        self.cluster_allowed = True
        if cluster > 8:
            try:
                _allow_non_portable_cluster(kernel)
            except Exception:
                self.cluster_allowed = False  # clusters_fit() says no: the runtime plans smaller clusters
        if cluster > 1:
            # cuda.core counts the grid in clusters when a cluster shape is given
            self.config = LaunchConfig(grid=grid // cluster, cluster=cluster, block=block)
        else:
            self.config = LaunchConfig(grid=grid, block=block)

    def clusters_fit(self) -> bool:
        """Whether the device can co-schedule at least one cluster of this kernel's launch shape
        (``cudaOccupancyMaxActiveClusters`` > 0); True for launches without clusters or when unknown."""
        if not self.cluster_allowed:
            return False
        if self.config.cluster is None or max(self.config.cluster) <= 1:
            return True
        try:
            return self.kernel.occupancy.max_active_clusters(self.config) > 0
        except Exception:
            return True

    def __call__(self, stream, *ptrs):
        launch(stream, self.config, self.kernel, *ptrs)


_streams = {}


def stream_of(handle: int):
    """A cached ``cuda.core`` Stream wrapping a foreign stream handle (0: the legacy default stream)."""
    s = _streams.get(handle)
    if s is None:
        s = Stream.from_handle(handle)
        _streams[handle] = s
    return s
