"""Loading compiled kernels into the current CUDA context and launching them through ``cuda.core``.

A kernel is launched with plain pointer arguments (seven forward, nine backward) through ``cuda.core.launch``
with a prebuilt ``LaunchConfig``: about 5 us from Python on the H200, against 27-56 us for Numba's
dispatcher (direct driver launches were measured no faster: see ``Loaded.launcher``). PTX is first linked
to a cubin for the device with nvJitLink (so a PTX ISA newer than the driver still loads, as long as nvJitLink knows it);
if that fails the driver JIT-compiles the PTX; if both fail a :class:`normc.CompileError` says why.
"""

from __future__ import annotations

import functools
import os
import threading

from ..errors import ArgumentError, CompileError

try:  # cuda-core >= 0.4 exports these at the top level; older releases under .experimental
    from cuda.core import Device, LaunchConfig, Linker, LinkerOptions, ObjectCode, Stream, launch
except ImportError:  # pragma: no cover - depends on the installed cuda-core
    from cuda.core.experimental import (Device, LaunchConfig, Linker, LinkerOptions, ObjectCode, Stream,
                                        launch)


@functools.lru_cache(maxsize=None)
def device_cc(ordinal: int) -> tuple:
    """The compute capability normc compiles for on CUDA device ``ordinal``, as (major, minor): the device's
    own, or, on a device newer than every target the installed CUDA toolkit compiles for
    (:func:`normc.lowering.supported_ccs`), the newest of those (the driver JIT-compiles PTX for an older
    target onto a newer device)."""
    from ..lowering import supported_ccs

    cc = Device(ordinal).compute_capability
    cc = (cc.major, cc.minor) if hasattr(cc, "major") else tuple(cc)
    known = supported_ccs()
    if known and cc not in known:
        older = [k for k in known if k <= cc]
        if older:
            return older[-1]
    return cc


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


@functools.lru_cache(maxsize=None)
def primary_context(ordinal: int) -> int:
    """Handle (an int) of device ``ordinal``'s primary context: the one :func:`set_device` makes current.

    Retained once per process and never released (``cuda.core``'s ``Device.set_current`` retains the same
    context), so the handle stays valid for the comparison in :func:`check_context`.
    """
    from cuda.bindings import driver

    (err,) = driver.cuInit(0)
    _ok(err, "cuInit")
    err, dev = driver.cuDeviceGet(ordinal)
    _ok(err, f"cuDeviceGet({ordinal})")
    err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
    _ok(err, f"cuDevicePrimaryCtxRetain({ordinal})")
    return int(ctx)


def _ok(err, what):
    from cuda.bindings import driver

    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")


# CUmemorytype: CU_MEMORYTYPE_DEVICE (cuda.h); the pure check below needs no driver to import
MEMORYTYPE_DEVICE = 2


def in_foreign_context(ctx: int, memory_type: int, is_managed: bool, primary: int) -> bool:
    """Whether memory with these pointer attributes is device memory of a context other than ``primary``.

    Only plain device memory (``cuMemAlloc``/``cudaMalloc``) belongs to the context it was allocated in; it is
    not mapped in the other contexts of the device, so kernels launched in the primary context would fault on
    it. Everything else is accepted: managed memory (``cuMemAllocManaged``) and host memory (pinned or
    registered) are reachable from every context; stream-ordered pool allocations (``cuMemAllocAsync``) and VMM
    mappings (``cuMemCreate``/``cuMemMap``) belong to no context, and the driver reports a NULL context for
    them (as for pointers it does not know).
    """
    if not ctx or is_managed or int(memory_type) != MEMORYTYPE_DEVICE:
        return False
    return int(ctx) != int(primary)


def check_context(ptr: int, ordinal: int, name: str):
    """Raise :class:`ArgumentError` if argument ``name`` at ``ptr`` is device memory allocated in a CUDA context
    other than the primary context of device ``ordinal`` (the context normc launches in).

    One ``cuPointerGetAttributes`` call (context, memory type, managed). Pointers the driver cannot describe
    pass: the check only turns a known misuse into an error naming the argument, instead of a fault in the
    kernel.
    """
    from cuda.bindings import driver

    a = driver.CUpointer_attribute
    attrs = [a.CU_POINTER_ATTRIBUTE_CONTEXT, a.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a.CU_POINTER_ATTRIBUTE_IS_MANAGED]
    err, values = driver.cuPointerGetAttributes(len(attrs), attrs, ptr)
    if err != driver.CUresult.CUDA_SUCCESS:
        return
    ctx, memory_type, is_managed = values
    try:
        primary = primary_context(ordinal)
    except RuntimeError:  # no primary context to compare with: the launch will report the driver's error
        return
    if in_foreign_context(int(ctx), int(memory_type), bool(is_managed), primary):
        raise ArgumentError(
            f"{name} is device memory of a CUDA context other than the primary context of cuda:{ordinal}, the one "
            f"normc launches in (kernels there cannot read it); allocate it with the primary context current "
            f"(as torch, CuPy, Numba and JAX do), or pass managed memory"
        )


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


def _max_active_clusters(kernel, config) -> int:
    """cudaOccupancyMaxActiveClusters of ``kernel`` launched as ``config``: how many of its clusters the device
    can hold at once. cuda.core 1.x requires a ``stream`` keyword (the query runs in its context); 0.x takes
    none. (Called without it, cuda.core 1.2 raised TypeError, which :meth:`Loaded.clusters_fit` took for
    "unknown, assume it fits": the re-planning with smaller clusters never ran.)"""
    try:
        return kernel.occupancy.max_active_clusters(config, stream=Device().default_stream)
    except TypeError:  # cuda.core 0.x: no stream argument
        return kernel.occupancy.max_active_clusters(config)


# Launch the kernels a plan marks ``pdl`` (the second and third of split schedules) as programmatic dependents
# of the kernel before them (normc.lowering.codegen.PDL). NORMC_PDL=0 launches them as ordinary kernels; the
# kernels are the same either way (their griddepcontrol instructions are then no-ops).
PDL = os.environ.get("NORMC_PDL", "1") != "0"


class Loaded:
    """A kernel loaded on one device: ``loaded.launcher(stream_handle, *pointers)`` launches it."""

    __slots__ = ("kernel", "config", "entry", "cluster_allowed")

    def __init__(self, ptx: str, cubin: bytes | None, entry: str, grid: int, block: int, cluster: int = 1,
                 coop: bool = False, pdl: bool = False):
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
        if coop:
            # A cooperative kernel's CTAs wait for each other: launch no more than are co-resident (the
            # occupancy API), as a cooperative launch (the driver refuses one that cannot all be resident).
            # The planner keeps a reduction's CTAs (splits) <= SMs, so one CTA per SM covers them.
            per_sm = kernel.occupancy.max_active_blocks_per_multiprocessor(block, 0)
            if per_sm < 1:
                raise CompileError(f"{entry}: no CTA of {block} threads fits an SM; cannot launch cooperatively")
            sms = Device().properties.multiprocessor_count
            self.config = LaunchConfig(grid=min(grid, per_sm * sms), block=block, is_cooperative=True)
        elif cluster > 1:
            # cuda.core (>= 0.4, as pyproject.toml requires) counts the grid in clusters when a cluster shape is
            # given
            self.config = LaunchConfig(grid=grid // cluster, cluster=cluster, block=block)
        elif pdl and PDL:
            try:  # programmatic dependent launch, where this cuda-core's LaunchConfig has it (else as usual)
                self.config = LaunchConfig(grid=grid, block=block, programmatic_stream_serialization=True)
            except TypeError:
                self.config = LaunchConfig(grid=grid, block=block)
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
            return _max_active_clusters(self.kernel, self.config) > 0
        except Exception:
            return True

    def launcher(self, stream: int, *ptrs):
        """Launch on the stream with raw ``CUstream`` handle ``stream`` (0: the legacy default stream), with
        the kernel's pointer arguments (seven forward, nine backward).

        Launching through the driver directly was measured against cuda.core on the H200 (2026-12-01, a whole
        cached normc call on torch tensors in one loop): cuda.core 15.9 us, cuda.bindings' cuLaunchKernel on a
        prebuilt parameter buffer 15.3 us, ctypes' cuLaunchKernel 20.3 us (it converts each of 11 arguments
        per call); 0.6 us is within run-to-run noise, so cuda.core stays (docs/performance.md)."""
        launch(stream_of(stream), self.config, self.kernel, *ptrs)


_streams = {}


def load_fitting_clusters(plan_for, kernels_for, cluster_of):
    """Plan, compile and load kernels, re-planning with smaller thread-block clusters while the device cannot
    co-schedule the planned one (:meth:`Loaded.clusters_fit`; e.g. a partitioned GPU).

    Args:
        plan_for: ``plan_for(max_cluster)`` -> a plan (``max_cluster`` None first, then half the last cluster).
        kernels_for: ``kernels_for(plan)`` -> the compiled kernels as dicts (``ptx``, ``cubin``, ``entry``,
            ``grid``, ``block``, optional ``cluster``, ``coop``, ``pdl``), in launch order.
        cluster_of: ``cluster_of(plan)`` -> CTAs per cluster of the plan (1: none).

    Returns:
        ``(plan, [Loaded, ...])``.
    """
    max_cluster = None
    while True:
        plan = plan_for(max_cluster)
        kernels = [Loaded(k["ptx"], k.get("cubin"), k["entry"], k["grid"], k["block"], k.get("cluster", 1),
                          k.get("coop", False), k.get("pdl", False)) for k in kernels_for(plan)]
        C = cluster_of(plan)
        if C <= 1 or all(k.clusters_fit() for k in kernels):
            return plan, kernels
        max_cluster = C // 2


def stream_of(handle: int):
    """A cached ``cuda.core`` Stream wrapping a foreign stream handle (0: the legacy default stream)."""
    s = _streams.get(handle)
    if s is None:
        s = Stream.from_handle(handle)
        _streams[handle] = s
    return s
