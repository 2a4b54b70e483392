"""The runtime: ``normc.compile(spec)`` returns a :class:`Compiled`, a callable that normalizes arrays.

The first call for a new specialization (shape, strides, dtypes, pointer alignment, device) plans,
lowers and loads its kernels; later calls hit an in-memory table and only allocate the output and launch.
Compiled kernels also go to an on-disk cache (:mod:`normc.runtime.cache`), so a new process skips NVVM.
With no GPU, numpy arrays run through the same kernels on Numba's CUDA simulator (slow; a warning says so
once).
"""

from __future__ import annotations

import math
import threading
import warnings

from ..canonical import check_no_overlap, dense_like
from ..errors import ArgumentError, CompileError, check_flag
from ..problem import dtype_name, make_problem, pointer_align
from .arrays import SUPPORTED, c_order, describe, empty, kind_of

__all__ = ["Compiled", "gpu_available"]

_gpu = None


def gpu_available() -> bool:
    """Whether a CUDA GPU and driver are usable (checked once): the driver initializes and counts at least one
    device. False under Numba's simulator (NUMBA_ENABLE_CUDASIM=1), where normc runs on the simulator as without
    a GPU. Asks the driver through cuda.bindings, not Numba: importing numba.cuda costs about 0.3 s, which a
    new process whose kernels are all in the disk cache never otherwise pays (it launches through cuda.bindings: runtime.gpu)."""
    global _gpu
    if _gpu is None:
        _gpu = not _cudasim() and _driver_has_device()
    return _gpu


def _cudasim() -> bool:
    """Whether Numba's CUDA simulator is on: Numba's own setting once numba is imported, else the environment
    variable it reads at import (a value that is not an integer counts as off, as Numba warns and ignores it)."""
    import os
    import sys

    if "numba" in sys.modules:
        from numba import config

        return bool(getattr(config, "ENABLE_CUDASIM", False))
    try:
        return int(os.environ.get("NUMBA_ENABLE_CUDASIM", "0") or 0) != 0
    except ValueError:
        return False


def _driver_has_device() -> bool:
    """cuInit succeeds and cuDeviceGetCount is at least 1 (False when cuda.bindings or the driver is missing)."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:  # no cuda.bindings, or no libcuda to load
        return False


_sim_warned = False


def _warn_sim():
    global _sim_warned
    if not _sim_warned:
        _sim_warned = True
        warnings.warn(
            "normc: no CUDA GPU found; running kernels on Numba's CUDA simulator (pure Python, very slow: "
            "use small arrays)", RuntimeWarning, stacklevel=_user_stacklevel(),
        )


def _user_stacklevel() -> int:
    """``stacklevel`` for a warning raised inside normc that points at the first caller outside normc."""
    import sys

    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("normc"):
        level, frame = level + 1, frame.f_back
    return level


def _stream_handle(stream, kind, device=None):
    """Raw handle of the stream to launch on: ``stream`` if given (already accepted by :func:`check_stream`, as
    :class:`_LaunchStream` does on creation), else the current stream of x's library (``kind``: torch on
    ``device``, CuPy), else 0 (the legacy default stream)."""
    if stream is None:
        if kind == "torch":
            if device is None:  # a host tensor: nothing is launched for it
                return 0
            import torch

            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # avoids building a Stream object
            if raw is not None:
                return raw(device)
            return torch.cuda.current_stream(device).cuda_stream
        if kind == "cupy":
            import cupy

            return cupy.cuda.get_current_stream().ptr
        return 0
    if isinstance(stream, int):
        return stream
    if _is_sim_stream(stream):  # the simulator runs each call to its end: no handle to order work on
        return 0
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    if hasattr(stream, "handle"):  # numba stream
        h = stream.handle
        return int(getattr(h, "value", h) or 0)
    return int(stream.__cuda_stream__()[1])  # cuda.core and other CUDA stream protocol objects


# attributes through which _stream_handle reads a stream object's raw handle
_STREAM_ATTRS = ("cuda_stream", "ptr", "handle", "__cuda_stream__")


def check_stream(stream):
    """Raise :class:`ArgumentError` unless ``stream`` is None, an int handle (a Python int in [0, 2**64)), or an
    object with a raw handle :func:`_stream_handle` can read (torch, CuPy, Numba, cuda.core streams)."""
    if stream is None or (isinstance(stream, int) and not isinstance(stream, bool) and 0 <= stream < 2**64):
        return
    if not any(hasattr(stream, a) for a in _STREAM_ATTRS) and not _is_sim_stream(stream):  # also -1 or a bool
        raise ArgumentError(f"stream is {stream!r}; expected a CUDA stream object (torch, CuPy, Numba, "
                            f"cuda.core) or an int handle (a Python int in [0, 2**64))")


def _is_sim_stream(stream) -> bool:
    """Whether ``stream`` is a stream of Numba's CUDA simulator (``numba.cuda.stream()`` under
    ``NUMBA_ENABLE_CUDASIM=1``): it has no raw handle, and the simulator needs none."""
    return type(stream).__module__.startswith("numba.cuda.simulator")


class _LaunchStream:
    """The raw handle of the stream a call launches on (:func:`_stream_handle` for ``stream`` and x), worked
    out on first use: :func:`describe` calls it for the DLPack / CUDA array interface stream handshake of
    arguments that are not torch tensors, the launch calls it last. Calls with torch or numpy arguments only
    never ask before the launch."""

    __slots__ = ("stream", "kind", "device", "handle")

    def __init__(self, stream, x):
        check_stream(stream)  # here, not only when the handle is first needed: the simulator never asks for it
        self.stream = stream
        self.kind = kind_of(x)
        self.device = None
        if self.kind == "torch" and x.device.type == "cuda":
            self.device = x.device.index
        self.handle = None

    def __call__(self) -> int:
        if self.handle is None:
            self.handle = _stream_handle(self.stream, self.kind, self.device)
        return self.handle


def check_not_transposed(name, shape, axes, sizes):
    """Raise :class:`ArgumentError` if parameter ``name`` of ``shape`` holds the extents of its step ``axes``
    (``sizes``: the spec's axis extents) in another order: a transposed weight, which would silently scale the
    wrong elements. Extents of 1 are ignored (moving them keeps the elements in spec order); any other shape of
    the right size is read in spec axis order."""
    want = tuple(sizes[a] for a in axes)
    got = [n for n in shape if n != 1]
    exp = [n for n in want if n != 1]
    if got != exp and sorted(got) == sorted(exp):
        raise ArgumentError(f"{name} has shape {tuple(shape)}; expected {want} (axes {' '.join(axes)}), or a flat "
                            f"array of {math.prod(want)} elements in that order")


def check_param(spec, sizes, step, name, shape, hint=""):
    """Check parameter ``name`` that serves the spec's ``step`` (``"scale"`` or ``"shift"``), given with
    ``shape`` (``None``: not given), against ``spec`` and its axis extents ``sizes``; ``hint`` ends the message of
    a parameter the spec has no step for. Shared by the runtime and normc.torch's reference path.

    Raises:
        ArgumentError: given for a spec without the step, missing for a spec with it, of the wrong element
            count, or transposed (:func:`check_not_transposed`).
    """
    axes = getattr(spec, step)
    if axes is None:
        if shape is not None:
            raise ArgumentError(f"{name} was given but the spec '{spec}' has no {step} step{hint}")
        return
    if shape is None:
        raise ArgumentError(f"{name} is required: the spec has '{step} {' '.join(axes)}'")
    want = math.prod(sizes[a] for a in axes)
    got = math.prod(shape)
    if got != want:
        ext = " x ".join(f"{a}={sizes[a]}" for a in axes)
        raise ArgumentError(f"{name} has {got} elements (shape {tuple(shape)}); expected {want} ({ext})")
    check_not_transposed(name, shape, axes, sizes)


def check_x(spec, xi):
    """Check x (an :class:`~normc.runtime.arrays.ArrayInfo`) against ``spec`` and the machine, for the forward
    and the backward alike; returns ``(sizes, sim)``: the spec's axis extents and whether the simulator runs.

    Raises:
        ArgumentError: unsupported dtype, rank not the spec's, a host array where a GPU is present, a host array
            other than numpy on the simulator, or a CUDA array where no GPU is usable.
    """
    if xi.dtype not in SUPPORTED:
        raise ArgumentError(f"x has dtype {xi.dtype}; expected one of {', '.join(SUPPORTED)}")
    if len(xi.shape) != spec.ndim:
        dims = ", ".join("(" + " ".join(d) + ")" if len(d) > 1 else d[0] for d in spec.dims)
        raise ArgumentError(
            f"x has rank {len(xi.shape)} (shape {xi.shape}) but spec '{spec}' has {spec.ndim} dims ({dims})"
        )
    sizes = spec.axis_sizes(xi.shape)
    sim = xi.device is None
    if sim and gpu_available():
        raise ArgumentError("x is a host array; expected a CUDA array on the GPU")
    if sim and xi.kind != "numpy":
        hint = ", e.g. x.numpy()" if xi.kind == "torch" else ""
        raise ArgumentError(f"x is a host {xi.kind} array; expected a CUDA array (or numpy on the simulator{hint})")
    if not sim and not gpu_available():
        raise ArgumentError(f"x is a CUDA array (cuda:{xi.device}) but no CUDA GPU or driver is usable here; "
                            f"expected a numpy array (simulator)")
    return sizes, sim


def _check_contexts(named):
    """Reject CUDA arguments allocated in a context other than their device's primary context, the one normc
    launches in (:func:`normc.runtime.gpu.check_context`: one driver call per argument). torch tensors are not
    checked (torch allocates in the primary context), nor host arrays, empty arrays, or a pointer already
    checked in this call (``out`` is ``x``)."""
    if not gpu_available():
        return
    from . import gpu

    gpu.set_device(named[0][1].device)  # the context the launch will use (cached per thread: no driver call)
    seen = set()
    for name, info in named:
        if info is None or info.kind == "torch" or info.device is None or info.ptr in seen:
            continue
        if info.ptr == 0 or math.prod(info.shape) == 0:
            continue
        seen.add(info.ptr)
        gpu.check_context(info.ptr, info.device, name)


class _Entry:
    """Everything one specialization needs at call time."""

    __slots__ = ("plan", "kernels", "out_shape", "out_strides", "out_dtype", "stat_shape", "ws", "sim", "problem")

    def __init__(self, plan, kernels, out_shape, out_strides, out_dtype, stat_shape, sim, problem=None):
        self.problem = problem
        self.plan = plan
        self.kernels = kernels
        self.out_shape = out_shape
        self.out_strides = out_strides
        self.out_dtype = out_dtype
        self.stat_shape = stat_shape
        self.ws = plan.workspace_floats
        self.sim = sim


def _is_jax(obj) -> bool:
    """Whether ``obj`` is a JAX array (its type lives in ``jax`` or ``jaxlib``)."""
    return type(obj).__module__.split(".", 1)[0] in ("jax", "jaxlib")


def check_sim_arch(plan, arch):
    """On the simulator, where ``arch`` picks no PTX: raise the CompileError a GPU would for a 16-bit ``plan``
    (forward or backward) and an ``arch`` older than sm_80 (:func:`normc.lowering.check_16bit_target`).

    Args:
        plan: a :class:`normc.Plan` or :class:`normc.backward_plan.BackwardPlan`.
        arch: the Compiled's ``arch`` override (any form :func:`normc.lowering.arch_cc` takes), or None.

    Raises:
        CompileError: float16/bfloat16 in ``plan`` with ``arch`` older than sm_80.
    """
    if arch is not None:
        from ..lowering import arch_cc, check_16bit_target

        check_16bit_target(plan, arch_cc(arch))


class Compiled:
    """A normalization compiled from a spec; call it on arrays.

    ``f(x, scale=None, shift=None, *, out=None, stream=None, return_stats=False)``

    Args:
        x: the input, of the spec's logical shape (one extent per spec dim), any strides; float32, float16 or
            bfloat16. A torch tensor, CuPy, Numba or JAX CUDA array, or any ``__cuda_array_interface__``/DLPack
            array on a CUDA device, allocated in the device's primary context; a numpy array (or a host
            DLPack array, e.g. a JAX CPU array, read as numpy) when no GPU is present (simulator).
        scale, shift: required exactly when the spec has the step; contiguous, holding the product of their
            axes' extents in the spec's axis order (any shape with that many elements, e.g. torch's (C,));
            float32/float16/bfloat16, possibly another dtype than x; on x's device.
        out: optional output of x's shape on x's device, float32/float16/bfloat16 (the result is converted to
            out's dtype; with ``out_dtype`` set it must match); may be x itself (in place) but may not otherwise
            overlap x, nor scale or shift; must be writeable.
        stream: stream to launch on (torch/CuPy stream object, Numba stream, or a raw handle); default: the
            current torch/CuPy stream of x's device, else the legacy default stream. Never synchronizes the host:
            arguments read through DLPack are asked to order their pending work before this stream
            (``__dlpack__(stream=...)``), and ``__cuda_array_interface__`` arguments that name a stream are
            waited for on it (an event).
        return_stats: ``True`` to also return float32 ``mean`` and ``rstd``, shaped like the kept axes in spec order
            (``mean`` is 0 for ``rms``).

    Returns:
        ``y`` of the same kind as x (torch in, torch out; CuPy in, CuPy out; numpy in, numpy out; any other CUDA
        array, JAX included: a Numba device array, bound to the launch stream when one was given), laid out in
        x's memory order; or ``(y, mean, rstd)`` with ``return_stats``.

    Raises:
        ArgumentError: rank, extents, dtype, device (or CUDA context), size of scale/shift/out, or overlap are
            wrong.
        CompileError: a kernel could not be compiled or loaded.

    Constructor arguments: ``spec`` (a :class:`normc.Spec` or its text), ``out_dtype`` (default: x's),
    ``arch`` (override the device's compute capability: ``"sm_90"``, ``"compute_90"``, ``"90"``, ``90`` or
    ``(9, 0)``; checked here by :func:`normc.lowering.arch_cc`, an ArgumentError naming arch; the simulator checks
    it but does not use it: numpy input runs the sm_90 plan for 4 SMs whatever ``arch`` says, except that a
    float16/bfloat16 call on an arch older than sm_80 is a CompileError there too, as on a GPU), ``schedule`` (force
    ``"persistent"``, ``"staged"``, ``"looped"``, ``"split"``, ``"coop"``, ``"cluster"`` or ``"grid"`` where the problem admits
    it, for tests and tuning; default: the planner's choice), ``use_tuning`` (True: take a schedule
    :func:`normc.autotune` stored for the problem, where there is one). A Compiled pickles and deep-copies as its
    spec and these options: the specializations it compiled are rebuilt on first use (from the disk cache).
    """

    def __init__(self, spec, *, out_dtype=None, arch=None, schedule=None, use_tuning=True):
        from ..spec import Spec, spec as parse

        if isinstance(spec, str):
            spec = parse(spec)
        if not isinstance(spec, Spec):
            raise ArgumentError(f"spec is a {type(spec).__name__}; expected a normc.Spec or spec text")
        name = dtype_name(out_dtype)  # strings, numpy and torch dtypes alike
        if out_dtype is not None and name not in SUPPORTED:
            raise ArgumentError(f"out_dtype is {out_dtype!r}; expected one of {', '.join(SUPPORTED)} (a name, or a "
                                f"numpy/torch dtype)")
        self.spec = spec
        self.out_dtype = name
        if arch is not None:
            from ..lowering import arch_cc

            arch_cc(arch)  # validate now: ArgumentError naming arch
        from .tune import SCHEDULES  # the one list of schedule names (autotuning tries each)

        if schedule not in SCHEDULES:
            raise ArgumentError(f"schedule is {schedule!r}; expected one of {SCHEDULES}")
        self.arch = arch
        self.schedule = schedule
        self.use_tuning = check_flag(use_tuning, "use_tuning")
        self._table = {}
        self._fast = {}  # torch-tensor keys -> closures that only allocate and launch (forward)
        self._bfast = {}  # the same for the backward (runtime/backward.py)
        self._lock = threading.Lock()

    def __repr__(self):
        opts = "".join(f", {k}={v!r}" for k, v, default in (
            ("out_dtype", self.out_dtype, None), ("arch", self.arch, None), ("schedule", self.schedule, None),
            ("use_tuning", self.use_tuning, True)) if v != default)
        return f"normc.compile({self.spec!r}{opts})"

    def __getstate__(self):
        """Pickling and deep copies keep the spec and options; the compiled specializations (loaded kernels,
        launch closures) belong to this process and are rebuilt on first use (from the disk cache)."""
        return {"spec": self.spec, "out_dtype": self.out_dtype, "arch": self.arch, "schedule": self.schedule,
                "use_tuning": self.use_tuning}

    def __setstate__(self, state):
        self.__init__(state["spec"], out_dtype=state["out_dtype"], arch=state["arch"], schedule=state["schedule"],
                      use_tuning=state["use_tuning"])

    # ------------------------------------------------------------------------------------------------
    def __call__(self, x, scale=None, shift=None, *, out=None, stream=None, return_stats=False):
        """Normalize ``x`` as the spec says: ``y`` or ``(y, mean, rstd)``. See the class docstring for the
        arguments, the output's dtype and layout, and the errors."""
        tt = _torch_tensor_type()
        fk = None
        if type(x) is tt and out is None and stream is None and (return_stats is False or return_stats is True):
            # Hot path for torch tensors: one dict probe on attributes torch reads in C, then allocate and
            # launch. Everything else (validation, planning, compiling) happened when the key was first seen.
            fk = (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15, _tkey(scale, tt), _tkey(shift, tt),
                  return_stats)
            fast = self._fast.get(fk)
            if fast is not None:
                return fast(x, scale, shift)
        return_stats = check_flag(return_stats, "return_stats")  # bool or numpy's bool_, as plan(stats=...)
        launch = _LaunchStream(stream, x)
        xi = describe(x, "x", launch)
        si = None if scale is None else describe(scale, "scale", launch)
        hi = None if shift is None else describe(shift, "shift", launch)
        oi = None if out is None else describe(out, "out", launch)
        if xi.device is not None:
            _check_contexts((("x", xi), ("scale", si), ("shift", hi), ("out", oi)))
        key = (
            xi.kind, xi.shape, xi.strides, xi.dtype, xi.device, pointer_align(xi.ptr),
            None if si is None else (si.shape, si.strides, si.dtype, si.device, pointer_align(si.ptr)),
            None if hi is None else (hi.shape, hi.strides, hi.dtype, hi.device, pointer_align(hi.ptr)),
            None if oi is None else (oi.shape, oi.strides, oi.dtype, oi.device, pointer_align(oi.ptr),
                                     oi.ptr == xi.ptr),
            bool(return_stats),
        )
        entry = self._table.get(key)
        if entry is None:
            with self._lock:
                entry = self._table.get(key)
                if entry is None:
                    entry = self._build(xi, si, hi, oi, bool(return_stats))
                    self._table[key] = entry
        elif oi is not None:  # _build checked it on the key's first call
            self._check_out_memory(xi, si, hi, oi)
        # Outputs that are Numba device arrays (for Numba, DLPack and other CUDA-array-interface inputs) are bound
        # to the launch stream: their __cuda_array_interface__ names it, so a consumer orders its reads after the
        # kernels. Not for JAX inputs: JAX's import rejects an array naming a stream it did not create
        # (GetStreamFromExternalStream, seen on the H200), so there the caller synchronizes (docs/interop.md).
        bind = launch() if xi.kind in ("numba", "other") and not _is_jax(x) else 0
        if oi is None:
            y = empty(xi, entry.out_shape, entry.out_strides, entry.out_dtype, bind)
            optr = describe(y, "out").ptr if xi.kind != "torch" else y.data_ptr()
        else:
            y, optr = out, oi.ptr
        mean = rstd = None
        if return_stats:
            dense = dense_like(entry.stat_shape, range(len(entry.stat_shape), 0, -1))
            mean = empty(xi, entry.stat_shape, dense, "float32", bind)
            rstd = empty(xi, entry.stat_shape, dense, "float32", bind)
        if xi.kind != "numpy" and math.prod(xi.shape) > 0:
            ws = empty(xi, (entry.ws,), (1,), "float32", bind) if entry.ws else None
            ptrs = (
                xi.ptr, optr, 0 if si is None else si.ptr, 0 if hi is None else hi.ptr,
                0 if mean is None else describe(mean, "mean").ptr,
                0 if rstd is None else describe(rstd, "rstd").ptr,
                0 if ws is None else describe(ws, "workspace").ptr,
            )
            from . import gpu

            gpu.set_device(xi.device)
            s = launch()  # the raw handle (Loaded.launcher looks up its cached CUstream)
            for k in entry.kernels:
                k.launcher(s, *ptrs)
            if fk is not None and fk[5] is not False and fk[6] is not False:
                self._fast[fk] = _torch_fast_path(entry, xi.device, return_stats, like=x)
        elif math.prod(xi.shape) > 0:
            from .simulate import run

            # the numpy arrays (views of host DLPack arrays); y is out itself, or a numpy array normc allocated
            run(entry, xi.obj, y if oi is None else oi.obj, None if si is None else si.obj,
                None if hi is None else hi.obj, mean, rstd)
        elif return_stats and math.prod(entry.stat_shape) > 0:
            mean[...] = float("nan")
            rstd[...] = float("nan")
        return (y, mean, rstd) if return_stats else y

    # ------------------------------------------------------------------------------------------------
    def backward(self, dy, x, mean, rstd, scale=None, *, need_dscale=True, need_dshift=True, stream=None):
        """Gradients of the normalization: ``(dx, dscale, dshift)``; see :mod:`normc.runtime.backward`.

        Args:
            dy: gradient of the output y, x's shape, float32/float16/bfloat16 (copied first when it is not in
                x's memory order).
            x: the forward's input (any strides, as in the forward call).
            mean, rstd: the float32 statistics the forward returned with ``return_stats=True`` (C-contiguous,
                one per kept index; ``mean`` may be ``None`` for ``rms``).
            scale: the forward's scale, required exactly when the spec has a scale step.
            need_dscale, need_dshift: skip a parameter gradient (returned as ``None``).
            stream: as for the forward call.

        Returns:
            ``dx`` (x's shape, dtype and memory order), ``dscale`` (scale's shape and dtype) and ``dshift`` (scale's
            shape when shift has scale's axes, else 1-D; scale's dtype, x's without a scale), each ``None`` when
            the spec has no such step or it was not asked for. float32 accumulation; dscale/dshift are
            deterministic (no atomics).

        Raises:
            ArgumentError: a shape, dtype, device or layout does not fit the spec or the forward's outputs.
            CompileError: a kernel could not be compiled or loaded.
        """
        from .backward import backward

        return backward(self, dy, x, mean, rstd, scale, need_dscale=need_dscale, need_dshift=need_dshift,
                        stream=stream)

    # ------------------------------------------------------------------------------------------------
    def _check(self, xi, si, hi, oi):
        spec = self.spec
        sizes, sim = check_x(spec, xi)
        for name, info in (("scale", si), ("shift", hi)):
            hint = (" (the second positional argument is scale: pass shift=...)"
                    if name == "scale" and spec.shift is not None else "")
            check_param(spec, sizes, name, name, None if info is None else info.shape, hint)
            if info is None:
                continue
            if info.dtype not in SUPPORTED:
                raise ArgumentError(f"{name} has dtype {info.dtype}; expected one of {', '.join(SUPPORTED)}")
            if info.device != xi.device:
                where = lambda d: "the host" if d is None else f"cuda:{d}"  # noqa: E731
                raise ArgumentError(f"{name} is on {where(info.device)}; expected x's device {where(xi.device)}")
            # C order (row-major) is required: the elements are read as the spec's axes in spec order.
            if not c_order(info):
                raise ArgumentError(
                    f"{name} must be C-contiguous (row-major; got element strides {info.strides} for shape "
                    f"{info.shape}): "
                    f"its elements are read in the order of the axes '{' '.join(getattr(spec, name))}'"
                )
        out_dtype = self.out_dtype or xi.dtype
        if oi is not None:
            if tuple(oi.shape) != tuple(xi.shape):
                raise ArgumentError(f"out has shape {oi.shape}; expected x's shape {xi.shape}")
            if self.out_dtype is not None and oi.dtype != out_dtype:
                raise ArgumentError(f"out has dtype {oi.dtype}; expected out_dtype {out_dtype}")
            if oi.dtype not in SUPPORTED:
                raise ArgumentError(f"out has dtype {oi.dtype}; expected one of {', '.join(SUPPORTED)} (the "
                                    f"output is written in out's dtype; without out it is {out_dtype})")
            if oi.device != xi.device:
                raise ArgumentError(f"out is on device {oi.device}; expected x's device {xi.device}")
            check_no_overlap(oi.shape, oi.strides, "out")
            self._check_out_memory(xi, si, hi, oi)
            out_dtype = oi.dtype
        return sizes, sim, out_dtype

    @staticmethod
    def _check_out_memory(xi, si, hi, oi):
        """What ``out`` (not None) may not be, by its memory and flags, which the specialization key does not
        hold: checked on every call that passes ``out``, not only on the first of its key.

        Raises:
            ArgumentError: out is read-only, aliases x with other strides or another itemsize, or overlaps x,
                scale or shift.
        """
        if oi.readonly:
            raise ArgumentError("out is read-only; expected a writeable array")
        if oi.ptr == xi.ptr and (tuple(oi.strides) != tuple(xi.strides) or _isz(oi.dtype) != _isz(xi.dtype)):
            # in place only element for element: with another itemsize, a CTA's stores would land on elements
            # of x that other CTAs have yet to read
            raise ArgumentError(f"out aliases x with different strides or itemsize (out {oi.dtype}, element strides "
                                f"{tuple(oi.strides)}; x {xi.dtype}, strides {tuple(xi.strides)}); expected x "
                                f"itself (same strides and element size) or a separate array")
        if oi.ptr != xi.ptr and _overlaps(xi, oi):
            raise ArgumentError("out overlaps x; expected x itself (in place) or a non-overlapping array")
        for name, pi in (("scale", si), ("shift", hi)):
            # the kernels read scale/shift while other CTAs write y: they must not share memory
            if pi is not None and _overlaps(pi, oi):
                raise ArgumentError(f"out overlaps {name}; expected an output that shares no memory with {name}")

    def _schedule_for(self, prob, arch, sms):
        """The forced schedule, else a tuned one recorded by :func:`normc.autotune`, else None (planner)."""
        if self.schedule is not None or not self.use_tuning:
            return self.schedule
        from .tune import lookup

        return lookup(prob, arch, sms)

    def _build(self, xi, si, hi, oi, stats):
        from ..planner import make_plan

        spec = self.spec
        sizes, sim, out_dtype = self._check(xi, si, hi, oi)
        out_strides = tuple(oi.strides) if oi is not None else dense_like(xi.shape, xi.strides)
        aligns = {
            "x": pointer_align(xi.ptr * _isz(xi.dtype) if sim else xi.ptr),
            "out": 16 if oi is None else pointer_align(oi.ptr),
            "scale": 16 if si is None else pointer_align(si.ptr),
            "shift": 16 if hi is None else pointer_align(hi.ptr),
        }
        if sim:
            aligns = {k: 16 for k in aligns}  # the simulator has no alignment rules
        prob = make_problem(
            spec, xi.shape, xi.strides, out_strides, x_dtype=xi.dtype, out_dtype=out_dtype,
            scale_dtype=None if si is None else si.dtype, shift_dtype=None if hi is None else hi.dtype,
            stats=stats, aligns=aligns,
        )
        stat_shape = tuple(sizes[a] for a in spec.kept)
        if math.prod(xi.shape) == 0:
            return _Entry(make_plan(prob, sms=4), [], xi.shape, out_strides, out_dtype, stat_shape, sim)
        if sim:
            _warn_sim()
            from ..lowering.codegen import generate
            from .simulate import load

            # small grids (sms=4): the simulator runs blocks one by one
            plan = make_plan(prob, arch="sm_90", sms=4, schedule=self._schedule_for(prob, "sm_90", 4))
            check_sim_arch(plan, self.arch)
            kernels = [load(ks) for ks in generate(plan)]
            return _Entry(plan, kernels, xi.shape, out_strides, out_dtype, stat_shape, True, prob)
        from . import gpu

        cc = gpu.device_cc(xi.device)
        if self.arch is not None:
            from ..lowering import arch_cc

            cc = arch_cc(self.arch)
        arch, sms = f"sm_{cc[0]}{cc[1]}", gpu.device_sms(xi.device)
        gpu.set_device(xi.device)
        plan, kernels = gpu.load_fitting_clusters(
            lambda mc: make_plan(prob, arch=arch, sms=sms, schedule=self._schedule_for(prob, arch, sms),
                                 max_cluster=mc),
            lambda plan: compiled_kernels(plan, cc), lambda plan: plan.cluster)
        # Cooperative kernels' CTAs wait for each other, so they must all be resident: the coop schedule walks
        # the rows with at least a row's CTAs, rows held over a co-resident grid need every planned CTA
        coop = plan.schedule == "coop"
        need = plan.splits if coop else plan.grid if plan.grid_persistent else 0
        if need and kernels[-1].grid < need:
            what = (f"the coop plan spreads a row over {plan.splits} CTAs" if coop else
                    f"the plan holds {plan.kept} rows over {plan.grid} co-resident CTAs")
            raise CompileError(f"{what} but only {kernels[-1].grid} fit this device at once; use another schedule")
        return _Entry(plan, kernels, xi.shape, out_strides, out_dtype, stat_shape, False, prob)


_tensor_type = None
_param_type = None  # torch.nn.Parameter, looked up with torch.Tensor


class _NoTensor:
    """Stands for torch.Tensor before torch is imported: no argument is ever of this type."""


def _torch_tensor_type():
    """``torch.Tensor`` if torch is already imported (never imports it), else a type nothing is."""
    global _tensor_type, _param_type
    if _tensor_type is None:
        import sys

        mod = sys.modules.get("torch")
        if mod is None:
            return _NoTensor  # torch not imported yet: no tensor can be passed; look again next call
        _param_type = getattr(getattr(mod, "nn", None), "Parameter", _NoTensor)
        _tensor_type = mod.Tensor
    return _tensor_type


def _tkey(t, tt):
    """Fast-path key part of an affine tensor; False when it is not a plain torch tensor or an
    ``nn.Parameter`` (a module's weight: other subclasses may override what the key reads), so no fast path.
    Parameters used to fall out here, which sent every normc.torch module call down the validating path."""
    if t is None:
        return None
    if type(t) is not tt and type(t) is not _param_type:
        return False
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)


def _torch_raw_stream():
    """``f(device) -> int``: the handle of torch's current stream on a device, by the cheapest call available."""
    import torch

    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw_stream is None:
        def raw_stream(d):
            return torch.cuda.current_stream(d).cuda_stream
    return raw_stream


def _torch_fast_path(entry, device, stats=False, like=None):
    """A closure ``fast(x, scale, shift)`` that allocates y (and, with ``stats``, the float32 mean and rstd of
    shape ``entry.stat_shape``) and launches ``entry``'s kernels for torch tensors, with nothing else; it
    returns what :meth:`Compiled.__call__` would (``y`` or ``(y, mean, rstd)``).

    ``like`` is the x of the call that built it (every x of the fast path's key has its shape, strides, dtype
    and device). When y's shape, strides and dtype are x's, y is ``torch.empty_like(x)``: for a dense x that
    keeps x's strides, and it costs 0.5-0.6 us less host time than ``torch.empty_strided`` (H200 host,
    ``tests/gpu_overhead.py`` twice, 2026-12-07: 1.91-2.02 us against 2.49-2.59)."""
    import torch

    from . import gpu

    shape, strides = tuple(entry.out_shape), tuple(entry.out_strides)
    dtype = getattr(torch, entry.out_dtype)
    dev = torch.device("cuda", device)
    raw_stream = _torch_raw_stream()
    empty_strided, empty_like = torch.empty_strided, torch.empty_like
    f32 = torch.float32
    nws = entry.ws
    launchers = [k.launcher for k in entry.kernels]  # (stream_handle: int, *pointers)
    set_device = gpu.set_device
    same_as_x = (like is not None and like.dtype == dtype and tuple(like.shape) == shape
                 and tuple(like.stride()) == strides)

    if len(launchers) == 1 and not nws and not stats:  # most plans: one kernel, no workspace
        (launch,) = launchers

        def fast(x, scale, shift):
            y = empty_like(x) if same_as_x else empty_strided(shape, strides, dtype=dtype, device=dev)
            set_device(device)
            launch(raw_stream(device), x.data_ptr(), y.data_ptr(), 0 if scale is None else scale.data_ptr(),
                   0 if shift is None else shift.data_ptr(), 0, 0, 0)
            return y

        return fast

    st_shape = tuple(entry.stat_shape)
    st_strides = dense_like(st_shape, range(len(st_shape), 0, -1))

    def fast(x, scale, shift):
        y = empty_like(x) if same_as_x else empty_strided(shape, strides, dtype=dtype, device=dev)
        ws = empty_strided((nws,), (1,), dtype=f32, device=dev).data_ptr() if nws else 0
        mean = rstd = None
        if stats:
            mean = empty_strided(st_shape, st_strides, dtype=f32, device=dev)
            rstd = empty_strided(st_shape, st_strides, dtype=f32, device=dev)
        set_device(device)
        s = raw_stream(device)
        ptrs = (x.data_ptr(), y.data_ptr(), 0 if scale is None else scale.data_ptr(),
                0 if shift is None else shift.data_ptr(), 0 if mean is None else mean.data_ptr(),
                0 if rstd is None else rstd.data_ptr(), ws)
        for launch in launchers:
            launch(s, *ptrs)
        return (y, mean, rstd) if stats else y

    return fast


def _isz(dtype):
    return 4 if dtype == "float32" else 2


# Work numpy's exact overlap solver may spend (np.shares_memory's max_work) on two arrays whose address ranges
# meet; past it, they are taken to overlap (conservative).
OVERLAP_MAX_WORK = 10_000


class _Addresses:
    """An array description numpy reads (``numpy.asarray``) as a view at ``info``'s address with its shape, strides
    and itemsize, for address arithmetic only: nothing is read or written through it (device pointers too)."""

    def __init__(self, info):
        isz = _isz(info.dtype)
        self.__array_interface__ = {"shape": tuple(info.shape), "typestr": f"|V{isz}", "data": (info.ptr, True),
                                    "strides": tuple(s * isz for s in info.strides), "version": 3}


def _overlaps(a, b):
    """Whether arrays ``a`` and ``b`` (ArrayInfo) share a byte. Arrays whose address ranges are apart do not;
    where the ranges meet (e.g. interleaved views of one buffer, x = buf[:, 0::2] and out = buf[:, 1::2]),
    numpy's exact solver decides from the addresses, strides and itemsizes (``np.shares_memory``), and past
    OVERLAP_MAX_WORK they are taken to overlap."""
    import numpy as np

    def span(i):
        isz = _isz(i.dtype)
        lo = i.ptr + sum((n - 1) * s * isz for n, s in zip(i.shape, i.strides) if s < 0 and n > 0)
        hi = i.ptr + sum((n - 1) * s * isz for n, s in zip(i.shape, i.strides) if s > 0 and n > 0) + isz
        return lo, hi

    (a0, a1), (b0, b1) = span(a), span(b)
    if not (a0 < b1 and b0 < a1):
        return False
    try:
        return bool(np.shares_memory(np.asarray(_Addresses(a)), np.asarray(_Addresses(b)),
                                     max_work=OVERLAP_MAX_WORK))
    except np.exceptions.TooHardError:
        return True


_kernel_memo = {}
_memo_lock = threading.Lock()


def _lowering_dir() -> str:
    """The folder of normc.lowering's sources (the code that turns a plan into kernel source)."""
    import os

    from .. import lowering

    return os.path.dirname(lowering.__file__)


_source_memo = {}


def source_digest() -> str:
    """First 16 hex digits of the SHA-256 of normc.lowering's ``*.py`` files, read once per process.

    The plan keys what the kernels must do; these sources key how they are written. An editable install or a
    patched tree keeps normc's version while the generated kernels change, and must miss the disk cache."""
    import hashlib
    import os

    d = _lowering_dir()
    hit = _source_memo.get(d)
    if hit is None:
        h = hashlib.sha256()
        for name in sorted(os.listdir(d)):
            if name.endswith(".py"):
                h.update(name.encode() + b"\0")
                with open(os.path.join(d, name), "rb") as f:
                    h.update(f.read())
        hit = _source_memo[d] = h.hexdigest()[:16]
    return hit


def versions() -> dict:
    """What keys the disk cache besides the plan and the target: normc's version, the digest of its kernel
    generator's sources (:func:`source_digest`), NVVM's and the driver's versions."""
    from .. import __version__
    from . import gpu

    nvvm = "?"
    try:  # cuda.bindings first: Numba's NVVM() asks the same library, after a 0.3 s import of numba.cuda
        from cuda.bindings import nvvm as nvvm_lib

        nvvm = ".".join(map(str, nvvm_lib.version()))
    except Exception:
        try:
            from numba.cuda.cudadrv.nvvm import NVVM

            nvvm = ".".join(map(str, NVVM().get_version()))
        except Exception:
            pass
    return {"normc": __version__, "source": source_digest(), "nvvm": nvvm, "driver": gpu.driver_version()}


def compiled_kernels(plan, cc) -> list:
    """PTX (and cubin when nvJitLink can make one) of ``plan`` for ``cc``: memory cache, disk cache, or NVVM.

    Returns a list of dicts with keys ptx, cubin, entry, grid, block, shared_bytes.
    """
    from . import cache, gpu

    key = cache.make_key({"plan": plan.to_dict(), "cc": list(cc), **versions()})
    with _memo_lock:
        hit = _kernel_memo.get(key)
    if hit is not None:
        return hit
    payload = cache.load(key)
    if payload is None:
        from ..lowering import lower

        kernels = []
        for k in lower(plan, arch=cc):
            kernels.append({"ptx": k.ptx, "cubin": k.cubin or gpu.link_cubin(k.ptx, cc), "entry": k.entry,
                            "grid": k.grid, "block": k.block, "shared_bytes": k.shared_bytes,
                            "cluster": k.cluster, "coop": k.coop, "pdl": k.pdl})
        summary = (f"{plan.strategy}/{plan.schedule} {plan.kept}x{plan.reduced} {plan.x_dtype} stat={plan.stat} "
                   f"vec={plan.vec} sm_{cc[0]}{cc[1]}")
        payload = {"kernels": kernels, "summary": summary}
        cache.store(key, payload)
    with _memo_lock:
        _kernel_memo[key] = payload["kernels"]
    return payload["kernels"]
