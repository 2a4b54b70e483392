"""Loading compiled kernels (as context-independent libraries) and launching them through the CUDA driver
API (``cuda.bindings``).

A kernel is launched with plain 64-bit pointer arguments (seven forward, nine backward) packed into a
parameter buffer built once per kernel: one ``cuLaunchKernel`` (``cuLaunchKernelEx`` for clusters,
cooperative and programmatic-dependent launches) from Python, about 4-6 us on the H100/H200 machines,
against 27-56 us for Numba's dispatcher. Only ``cuda.bindings`` is imported on this path: a new process whose
kernels are all in the disk cache reaches its first launch without importing ``cuda.core`` (about 140 ms on
the GPU machines' image) or Numba. PTX is first linked to a cubin for the device with nvJitLink (so a PTX ISA
newer than the driver still loads, as long as nvJitLink knows it); if that fails the driver JIT-compiles the
PTX; if both fail a :class:`normc.CompileError` says why.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
import threading
import weakref

from cuda.bindings import driver as _cu

from ..errors import ArgumentError, CompileError

_attr = _cu.CUdevice_attribute


def _error_name(err) -> str:
    """The driver error's name, e.g. CUDA_ERROR_INVALID_VALUE (read from the enum: no driver call)."""
    return getattr(err, "name", None) or str(err)


def _check(result, what: str, error=RuntimeError):
    """The values of a ``cuda.bindings`` driver call's result tuple, or ``error`` naming ``what`` and the
    driver's error."""
    err, *values = result
    if err:
        raise error(f"{what} failed: {_error_name(err)}")
    return values[0] if len(values) == 1 else values


@functools.lru_cache(maxsize=None)
def _device(ordinal: int):
    _check(_cu.cuInit(0), "cuInit")
    return _check(_cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")


def _attribute(ordinal: int, attribute) -> int:
    return int(_check(_cu.cuDeviceGetAttribute(attribute, _device(ordinal)), f"cuDeviceGetAttribute({attribute.name})"))


@functools.lru_cache(maxsize=None)
def device_cc(ordinal: int) -> tuple:
    """The compute capability normc compiles for on CUDA device ``ordinal``, as (major, minor): the device's
    own, or, on a device newer than every target the installed CUDA toolkit compiles for
    (:func:`normc.lowering.supported_ccs`), the newest of those (the driver JIT-compiles PTX for an older
    target onto a newer device)."""
    from ..lowering import supported_ccs

    cc = (_attribute(ordinal, _attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
          _attribute(ordinal, _attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
    known = supported_ccs()
    if known and cc not in known:
        older = [k for k in known if k <= cc]
        if older:
            return older[-1]
    return cc


@functools.lru_cache(maxsize=None)
def device_sms(ordinal: int) -> int:
    """Multiprocessor count of CUDA device ``ordinal`` (sizes the planner's grids)."""
    return _attribute(ordinal, _attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)


_tls = threading.local()  # a CUDA context is current per host thread


def set_device(ordinal: int):
    """Make the primary context of ``ordinal`` current on this thread (the one torch/CuPy/Numba use)."""
    if getattr(_tls, "current", None) != ordinal:
        _check(_cu.cuCtxSetCurrent(_cu.CUcontext(primary_context(ordinal))), f"cuCtxSetCurrent(cuda:{ordinal})")
        _tls.current = ordinal


@functools.lru_cache(maxsize=None)
def primary_context(ordinal: int) -> int:
    """Handle (an int) of device ``ordinal``'s primary context: the one :func:`set_device` makes current.

    Retained once per process and never released (as torch's and cuda.core's contexts are), so the handle
    stays valid for :func:`set_device` and the comparison in :func:`check_context`.
    """
    return int(_check(_cu.cuDevicePrimaryCtxRetain(_device(ordinal)), f"cuDevicePrimaryCtxRetain({ordinal})"))


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
    a = _cu.CUpointer_attribute
    attrs = [a.CU_POINTER_ATTRIBUTE_CONTEXT, a.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a.CU_POINTER_ATTRIBUTE_IS_MANAGED]
    err, values = _cu.cuPointerGetAttributes(len(attrs), attrs, ptr)
    if err:
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
        err, v = _cu.cuDriverGetVersion()
        return 0 if err else int(v)
    except Exception:
        return 0


def link_cubin(ptx: str, cc) -> bytes | None:
    """PTX -> cubin for ``cc`` with nvJitLink, or ``None`` if nvJitLink cannot (e.g. it predates the PTX ISA).

    Runs only when a kernel is compiled (the cubin is stored in the disk cache with its PTX)."""
    from ..lowering import assemble

    try:
        return assemble(ptx, f"sm_{cc[0]}{cc[1]}")[0]
    except Exception:
        return None


# Launch the kernels a plan marks ``pdl`` (the second and third of split schedules) as programmatic dependents
# of the kernel before them (normc.lowering.codegen.PDL). NORMC_PDL=0 launches them as ordinary kernels; the
# kernels are the same either way (their griddepcontrol instructions are then no-ops).
PDL = os.environ.get("NORMC_PDL", "1") != "0"

# Kernel arguments are 64-bit integers (pointers, or 0 for an absent one): the forward kernels take 7, the
# backward kernels 9. A Loaded kernel's parameter buffer has room for MAX_ARGS of them.
MAX_ARGS = 16
_PACK = tuple(struct.Struct(f"<{n}Q").pack_into for n in range(MAX_ARGS + 1))  # by argument count

# Streams seen by launches, as cuda.bindings CUstream objects (building one per launch costs ~0.1 us)
_streams: dict = {}


def _stream(handle: int):
    s = _streams.get(handle)
    if s is None:
        if len(_streams) > 256:  # a program making streams without end: do not grow without bound
            _streams.clear()
        s = _streams[handle] = _cu.CUstream(handle)
    return s


def _launch_attribute(name: str):
    """A ``CUlaunchAttribute`` with id ``CU_LAUNCH_ATTRIBUTE_<name>``; the caller sets its value."""
    attr = _cu.CUlaunchAttribute()
    attr.id = getattr(_cu.CUlaunchAttributeID, "CU_LAUNCH_ATTRIBUTE_" + name)
    return attr


class Loaded:
    """A kernel loaded for the device current at loading (made current by :func:`set_device`):
    ``loaded.launcher(stream_handle, *pointers)`` launches it.

    The cubin (else the PTX, for the driver to JIT-compile) is loaded as a context-independent library
    (``cuLibraryLoadData``, as cuda.core loads it) and launched as its ``CUkernel``, which runs in the context
    of the stream it is launched on; the library is unloaded when the object is collected.

    Attributes:
        entry: the kernel's name; ``grid`` and ``block``: CTAs launched and threads per CTA; ``cluster``: CTAs
        per thread-block cluster (1: none); ``coop``: a cooperative launch (``grid`` capped to what the device
        holds at once); ``pdl``: a programmatic dependent launch.

    Raises:
        CompileError: neither the cubin nor the PTX loads on this device.
    """

    __slots__ = ("library", "function", "entry", "grid", "block", "cluster", "coop", "pdl", "cluster_allowed",
                 "_args", "_params", "_params_ptr", "_configs", "_lock", "__weakref__")

    def __init__(self, ptx: str, cubin: bytes | None, entry: str, grid: int, block: int, cluster: int = 1,
                 coop: bool = False, pdl: bool = False):
        errors = []
        self.library = None
        for what, image in (("cubin", cubin), ("PTX JIT", ptx.encode() + b"\0" if ptx else None)):
            if self.library is None and image:
                err, library = _cu.cuLibraryLoadData(image, [], [], 0, [], [], 0)
                if err:
                    errors.append(f"{what}: {_error_name(err)}")
                else:
                    self.library = library
        if self.library is None:
            raise CompileError(
                "could not load the kernel on this device (" + "; ".join(errors) + "). If the PTX ISA is "
                "newer than the driver, install an nvJitLink at least as new as the NVVM that produced it, or "
                "a NVVM no newer than the driver"
            )
        # unload when collected (not at interpreter exit, when the driver may already be shutting down)
        weakref.finalize(self, _cu.cuLibraryUnload, self.library).atexit = False
        self.function = _check(_cu.cuLibraryGetKernel(self.library, entry.encode()), f"cuLibraryGetKernel({entry})",
                               CompileError)
        self.entry, self.block, self.cluster, self.coop = entry, block, cluster, coop
        self.pdl = bool(pdl and PDL and cluster <= 1 and not coop)
        self.cluster_allowed = True
        if cluster > 8 or coop:
            dev = _check(_cu.cuCtxGetDevice(), "cuCtxGetDevice")
        if cluster > 8:
            # clusters of more than 8 CTAs need cudaFuncAttributeNonPortableClusterSizeAllowed; where the driver
            # refuses it, clusters_fit() says no and the runtime plans smaller clusters
            err, = _cu.cuKernelSetAttribute(
                _cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, self.function, dev)
            self.cluster_allowed = not err
        if coop:
            # A cooperative kernel's CTAs wait for each other: launch no more than are co-resident (the
            # occupancy API), as a cooperative launch (the driver refuses one that cannot all be resident).
            # The planner keeps a reduction's CTAs (splits) <= SMs, so one CTA per SM covers them.
            per_sm = _check(_cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function, block, 0),
                            f"{entry}: cuOccupancyMaxActiveBlocksPerMultiprocessor", CompileError)
            if per_sm < 1:
                raise CompileError(f"{entry}: no CTA of {block} threads fits an SM; cannot launch cooperatively")
            sms = _check(_cu.cuDeviceGetAttribute(_attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                         "cuDeviceGetAttribute")
            grid = min(grid, per_sm * sms)
        self.grid = grid
        # The parameter buffer (MAX_ARGS 8-byte slots) and the array of pointers to its slots that
        # cuLaunchKernel reads; the driver copies the arguments during the call, so one buffer per kernel
        # serves every launch, filled under a lock (two threads launching the same kernel at once).
        self._args = (ctypes.c_uint64 * MAX_ARGS)()
        base = ctypes.addressof(self._args)
        self._params = (ctypes.c_void_p * MAX_ARGS)(*(base + 8 * i for i in range(MAX_ARGS)))
        self._params_ptr = ctypes.addressof(self._params)
        self._lock = threading.Lock()
        self._configs = {} if (cluster > 1 or coop or self.pdl) else None

    def _config(self, stream) -> "_cu.CUlaunchConfig":
        """The ``cuLaunchKernelEx`` configuration of this kernel on ``stream`` (a CUstream): grid and block, and
        the cluster shape, cooperative flag or programmatic-dependent-launch flag as attributes."""
        cfg = _cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = self.grid, 1, 1  # in CTAs, a multiple of the cluster's
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.block, 1, 1
        cfg.sharedMemBytes = 0  # the kernels' shared memory is static
        cfg.hStream = stream
        attrs = []
        if self.cluster > 1:
            a = _launch_attribute("CLUSTER_DIMENSION")
            a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = self.cluster, 1, 1
            attrs.append(a)
        if self.coop:
            a = _launch_attribute("COOPERATIVE")
            a.value.cooperative = 1
            attrs.append(a)
        if self.pdl:
            a = _launch_attribute("PROGRAMMATIC_STREAM_SERIALIZATION")
            a.value.programmaticStreamSerializationAllowed = 1
            attrs.append(a)
        cfg.attrs, cfg.numAttrs = attrs, len(attrs)
        return cfg

    def clusters_fit(self) -> bool:
        """Whether the device can co-schedule at least one cluster of this kernel's launch shape
        (``cuOccupancyMaxActiveClusters`` > 0); True for launches without clusters or when unknown."""
        if not self.cluster_allowed:
            return False
        if self.cluster <= 1:
            return True
        err, n = _cu.cuOccupancyMaxActiveClusters(self.function, self._config(_stream(0)))
        return True if err else n > 0

    def launcher(self, stream: int, *ptrs):
        """Launch on the stream with raw ``CUstream`` handle ``stream`` (0: the legacy default stream), with
        the kernel's pointer arguments (ints: seven forward, nine backward).

        Raises:
            RuntimeError: the driver refused the launch (its error name, e.g. CUDA_ERROR_INVALID_CONTEXT)."""
        s = _streams.get(stream)
        if s is None:
            s = _stream(stream)
        with self._lock:
            _PACK[len(ptrs)](self._args, 0, *ptrs)
            if self._configs is None:
                err, = _cu.cuLaunchKernel(self.function, self.grid, 1, 1, self.block, 1, 1, 0, s,
                                          self._params_ptr, 0)
            else:
                cfg = self._configs.get(stream)
                if cfg is None:
                    if len(self._configs) > 64:
                        self._configs.clear()
                    cfg = self._configs[stream] = self._config(s)
                err, = _cu.cuLaunchKernelEx(cfg, self.function, self._params_ptr, 0)
        if err:
            raise RuntimeError(f"launching {self.entry} failed: {_error_name(err)}")


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
