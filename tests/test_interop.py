"""Array interchange without a GPU (issue 5: foreign CUDA contexts; issue 6: DLPack and JAX).

- DLPack producers are asked to order their work before the stream normc launches on
  (``__dlpack__(stream=...)``, as the Python array API standard defines it for CUDA), checked with fake
  producers that record the ``stream`` they are given;
- host DLPack arrays (JAX CPU arrays, or any kDLCPU producer) run on the simulator as numpy views, and are
  rejected with an ArgumentError on the GPU path;
- the CUDA-context check compares CU_POINTER_ATTRIBUTE_CONTEXT with the device's primary context, run here
  against a fake driver (the real one is exercised by tests/test_gpu_reliability.py on a GPU).
"""

from __future__ import annotations

import numpy as np
import pytest

import normc
from normc import ArgumentError
from normc.runtime import arrays, gpu, gpu_available

LN = "t d : norm over d ; scale d ; shift d"


def _ref_ln(x, w, b, eps=1e-5):
    x = np.asarray(x, np.float64)
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b


class _Producer:
    """A DLPack producer exporting a numpy array's memory, claiming DLPack device ``dev``; records the
    ``stream`` each ``__dlpack__`` call was given (missing: the key was not passed)."""

    def __init__(self, a, dev=(arrays.KDL_CUDA, 0)):
        self.a = a
        self.dev = dev
        self.streams = []

    def __dlpack_device__(self):
        return self.dev

    def __dlpack__(self, *, stream="missing", max_version=None, dl_device=None, copy=None):
        self.streams.append(stream)
        kw = {} if max_version is None else {"max_version": max_version}
        return self.a.__dlpack__(**kw)


no_gpu = pytest.mark.skipif(gpu_available(), reason="fake CUDA producers point at host memory: no launch may happen")


# ----------------------------------------------------------------------------------------------------
# The DLPack stream handshake


def test_dlpack_stream_values(monkeypatch):
    monkeypatch.delenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", raising=False)
    assert arrays.dlpack_stream(0) == 1  # normc's handle 0 = the legacy default stream; DLPack forbids 0
    assert arrays.dlpack_stream(1) == 1 and arrays.dlpack_stream(2) == 2
    assert arrays.dlpack_stream(0x7F00DEADBEEF) == 0x7F00DEADBEEF
    monkeypatch.setenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    assert arrays.dlpack_stream(0) == 2  # handle 0 is the per-thread default stream in that mode


@no_gpu
@pytest.mark.parametrize("stream, expect", [(None, 1), (0, 1), (0x5EED, 0x5EED), (2, 2)])
def test_dlpack_producers_get_the_launch_stream(stream, expect):
    """Every DLPack argument (x, scale, shift, out) is asked to order its work before the launch stream:
    stream=1 (legacy default) when normc launches on the default stream, else the stream's handle."""
    x = _Producer(np.ones((3, 8), np.float32))
    w = _Producer(np.ones(8, np.float32))
    b = _Producer(np.zeros(8, np.float32))
    o = _Producer(np.zeros((3, 8), np.float32))
    f = normc.compile(LN)
    with pytest.raises(ArgumentError, match="^x is a CUDA array .*no CUDA GPU"):
        f(x, w, b, out=o, stream=stream)
    for p in (x, w, b, o):
        assert p.streams == [expect]


@no_gpu
def test_dlpack_stream_handshake_backward():
    x = _Producer(np.ones((3, 8), np.float32))
    dy = _Producer(np.ones((3, 8), np.float32))
    m, r = _Producer(np.zeros(3, np.float32)), _Producer(np.ones(3, np.float32))
    w = _Producer(np.ones(8, np.float32))
    with pytest.raises(ArgumentError, match="^x is a CUDA array"):
        normc.compile(LN).backward(dy, x, m, r, w, stream=0x5EED)
    assert all(p.streams == [0x5EED] for p in (x, dy, m, r, w))


@no_gpu
def test_unsupported_dlpack_device_is_named():
    x = _Producer(np.ones((3, 8), np.float32), dev=(14, 0))  # kDLOneAPI
    with pytest.raises(ArgumentError, match="^x is on DLPack device type 14"):
        normc.compile("t d : norm over d")(x)
    assert x.streams == []  # rejected before any export


def test_broken_dlpack_device_is_an_argument_error():
    class Broken:
        def __dlpack__(self, **kw):
            raise AssertionError("never exported")

        def __dlpack_device__(self):
            raise RuntimeError("deleted array")

    with pytest.raises(ArgumentError, match="^x could not be read through DLPack"):
        normc.compile("t d : norm over d")(Broken())


# ----------------------------------------------------------------------------------------------------
# Host DLPack arrays: the simulator reads them as numpy; the GPU path rejects them


@no_gpu
def test_host_dlpack_arrays_run_on_the_simulator():
    rng = np.random.default_rng(0)
    xa = rng.standard_normal((4, 16)).astype(np.float32)
    wa = (1 + 0.1 * rng.standard_normal(16)).astype(np.float32)
    ba = rng.standard_normal(16).astype(np.float32)
    cpu = (arrays.KDL_CPU, 0)
    out = np.zeros((4, 16), np.float32)
    op = _Producer(out, cpu)
    y = normc.compile(LN)(_Producer(xa, cpu), _Producer(wa, cpu), _Producer(ba, cpu), out=op)
    assert y is op  # out is returned as given, and was written in place
    assert np.abs(out - _ref_ln(xa, wa, ba)).max() < 1e-5
    y2 = normc.compile(LN)(_Producer(xa, cpu), wa, ba)
    assert isinstance(y2, np.ndarray) and np.abs(y2 - out).max() == 0


@no_gpu
def test_read_only_host_dlpack_out_is_rejected():
    ro = np.zeros((3, 8), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ArgumentError, match="^out is read-only"):
        normc.compile("t d : norm over d")(np.ones((3, 8), np.float32), out=_Producer(ro, (arrays.KDL_CPU, 0)))


@no_gpu
def test_host_dlpack_bfloat16_is_read_through_array():
    """numpy's DLPack import has no bfloat16: such arrays are read with numpy.asarray (maybe a copy, so never
    written: read-only)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")

    class Bf16:
        def __init__(self, a):
            self.a = a.astype(ml_dtypes.bfloat16)

        def __dlpack_device__(self):
            return (arrays.KDL_CPU, 0)

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)  # numpy refuses: bfloat16 is not a DLPack dtype it exports

        def __array__(self, dtype=None, copy=None):
            return self.a

    xa = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    y = normc.compile("t d : norm over d")(Bf16(xa))
    assert y.dtype.name == "bfloat16"
    assert np.abs(y.astype(np.float32) - _ref_ln(xa, 1, 0)).max() < 2e-2
    info = arrays.describe(Bf16(xa), "out")
    assert info.kind == "numpy" and info.readonly


def test_host_arrays_rejected_on_the_gpu_path(monkeypatch):
    """With a GPU present, numpy and host DLPack arrays are rejected, naming the argument (nothing runs)."""
    import normc.runtime as rt

    monkeypatch.setattr(rt, "_gpu", True)
    monkeypatch.setattr(gpu, "set_device", lambda ordinal: None)
    monkeypatch.setattr(gpu, "check_context", lambda ptr, ordinal, name: None)
    f = normc.compile(LN)
    w, b = np.ones(8, np.float32), np.zeros(8, np.float32)
    cpu = (arrays.KDL_CPU, 0)
    with pytest.raises(ArgumentError, match="^x is a host array; expected a CUDA array on the GPU"):
        f(np.ones((3, 8), np.float32), w, b)
    with pytest.raises(ArgumentError, match="^x is a host array; expected a CUDA array on the GPU"):
        f(_Producer(np.ones((3, 8), np.float32), cpu), w, b)
    x = _Producer(np.ones((3, 8), np.float32))  # claims cuda:0
    with pytest.raises(ArgumentError, match="^scale is on the host; expected x's device cuda:0"):
        f(x, _Producer(w, cpu), _Producer(b))


# ----------------------------------------------------------------------------------------------------
# JAX arrays (CPU; the GPU path is tested by tests/test_gpu_reliability.py)


def test_jax_cpu_arrays_on_the_simulator():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    if gpu_available() or any(d.platform != "cpu" for d in jax.devices()):
        pytest.skip("simulator test: needs JAX on the CPU and no GPU")
    x = jax.random.normal(jax.random.key(0), (4, 16), dtype=jnp.float32)
    w, b = 1 + 0.1 * jnp.arange(16, dtype=jnp.float32), jnp.linspace(-1, 1, 16, dtype=jnp.float32)
    y, mean, rstd = normc.compile(LN)(x, w, b, return_stats=True)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    assert np.abs(y - _ref_ln(x, np.asarray(w), np.asarray(b))).max() < 1e-5
    assert np.abs(mean - np.asarray(x).mean(-1)).max() < 1e-5
    assert float(jnp.abs(jnp.asarray(y)).max()) > 0  # numpy out, and back into JAX
    with pytest.raises(ArgumentError, match="^out is read-only"):  # JAX arrays are immutable
        normc.compile(LN)(x, w, b, out=jnp.zeros_like(x))


# ----------------------------------------------------------------------------------------------------
# The CUDA-context check, against a fake driver

PRIMARY, OTHER = 0x1000, 0x2000
DEVICE, HOST, UNIFIED = 2, 1, 4  # CUmemorytype


@pytest.mark.parametrize(
    "ctx, memory_type, managed, foreign",
    [
        (PRIMARY, DEVICE, False, False),  # cudaMalloc'd in the primary context (torch, CuPy, Numba, JAX)
        (OTHER, DEVICE, False, True),  # cuMemAlloc'd with another context current
        (OTHER, DEVICE, True, False),  # managed memory: every context can reach it
        (OTHER, UNIFIED, True, False),
        (OTHER, HOST, False, False),  # pinned/registered host memory: reachable from every context (UVA)
        (0, DEVICE, False, False),  # no context: stream-ordered pool allocations, VMM mappings
        (0, 0, False, False),  # a pointer the driver does not know
    ],
)
def test_in_foreign_context(ctx, memory_type, managed, foreign):
    assert gpu.in_foreign_context(ctx, memory_type, managed, PRIMARY) is foreign


class _FakeDriver:
    """Stands in for cuda.bindings.driver's pointer/context calls: pointers map to (ctx, memory type, managed)."""

    def __init__(self, driver, pointers, primary=PRIMARY, fail=False):
        self.d = driver
        self.pointers = pointers
        self.primary = primary
        self.fail = fail
        self.calls = []

    def install(self, monkeypatch):
        d = self.d
        ok = d.CUresult.CUDA_SUCCESS

        def cuPointerGetAttributes(n, attrs, ptr):  # noqa: N802
            self.calls.append(("cuPointerGetAttributes", int(ptr)))
            a = d.CUpointer_attribute
            assert n == 3 and list(attrs) == [a.CU_POINTER_ATTRIBUTE_CONTEXT, a.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                              a.CU_POINTER_ATTRIBUTE_IS_MANAGED]
            if self.fail:
                return d.CUresult.CUDA_ERROR_INVALID_VALUE, None
            ctx, mt, managed = self.pointers.get(int(ptr), (0, 0, False))
            return ok, [d.CUcontext(ctx), mt, managed]

        def cuDevicePrimaryCtxRetain(dev):  # noqa: N802
            self.calls.append(("cuDevicePrimaryCtxRetain", int(dev)))
            return ok, d.CUcontext(self.primary)

        monkeypatch.setattr(d, "cuInit", lambda flags: (ok,))
        monkeypatch.setattr(d, "cuDeviceGet", lambda ordinal: (ok, d.CUdevice(ordinal)))
        monkeypatch.setattr(d, "cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain)
        monkeypatch.setattr(d, "cuPointerGetAttributes", cuPointerGetAttributes)
        return self


@pytest.fixture
def fake_driver(monkeypatch):
    driver = pytest.importorskip("cuda.bindings.driver")
    gpu.primary_context.cache_clear()  # the real primary context must not leak in, nor the fake one out
    yield lambda pointers, **kw: _FakeDriver(driver, pointers, **kw).install(monkeypatch)
    gpu.primary_context.cache_clear()


def test_check_context_with_fake_driver(fake_driver):
    drv = fake_driver({0xA0: (PRIMARY, DEVICE, False), 0xB0: (OTHER, DEVICE, False), 0xC0: (OTHER, DEVICE, True),
                       0xD0: (OTHER, HOST, False), 0xE0: (0, DEVICE, False)})
    for ptr in (0xA0, 0xC0, 0xD0, 0xE0, 0xF0):
        gpu.check_context(ptr, 0, "x")
    with pytest.raises(ArgumentError, match="^scale is device memory of a CUDA context other than the primary "
                                            "context of cuda:0"):
        gpu.check_context(0xB0, 0, "scale")
    # one attribute query per pointer; the primary context is retained once per device
    assert [c for c in drv.calls if c[0] == "cuPointerGetAttributes"] == [
        ("cuPointerGetAttributes", p) for p in (0xA0, 0xC0, 0xD0, 0xE0, 0xF0, 0xB0)]
    assert [c for c in drv.calls if c[0] == "cuDevicePrimaryCtxRetain"] == [("cuDevicePrimaryCtxRetain", 0)]


def test_check_context_passes_when_the_driver_cannot_tell(fake_driver):
    fake_driver({0xB0: (OTHER, DEVICE, False)}, fail=True)
    gpu.check_context(0xB0, 0, "x")


class _Cai:
    """A CUDA array interface object at a given address (never dereferenced: nothing launches)."""

    def __init__(self, ptr, shape, stream=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": stream}


@pytest.mark.parametrize("which", ["x", "scale", "shift", "out"])
def test_foreign_context_argument_is_named_before_compiling(fake_driver, monkeypatch, which):
    """Through normc.compile: the argument in another context is named, before planning or compiling; each
    non-torch CUDA argument costs one attribute query."""
    import normc.runtime as rt

    monkeypatch.setattr(rt, "_gpu", True)
    monkeypatch.setattr(gpu, "set_device", lambda ordinal: None)
    ptrs = {"x": 0x10000, "scale": 0x20000, "shift": 0x30000, "out": 0x40000}
    table = {p: (PRIMARY, DEVICE, False) for p in ptrs.values()}
    table[ptrs[which]] = (OTHER, DEVICE, False)
    drv = fake_driver(table)
    # cuda.core reads a CUDA array interface's device with the driver too: fake DLPack producers instead
    args = {k: _Producer(np.zeros((3, 8) if k in ("x", "out") else 8, np.float32)) for k in ptrs}
    real_describe = arrays.describe

    def describe(obj, name, stream=None):  # report the fake addresses instead of the host memory
        info = real_describe(obj, name, stream)
        if name in ptrs and isinstance(obj, _Producer):
            info.ptr = ptrs[name]
        return info

    monkeypatch.setattr(rt, "describe", describe)
    f = normc.compile(LN)
    with pytest.raises(ArgumentError, match=f"^{which} is device memory of a CUDA context other than"):
        f(args["x"], args["scale"], args["shift"], out=args["out"])
    assert f._table == {}  # rejected before anything was planned or compiled
    queried = [c[1] for c in drv.calls if c[0] == "cuPointerGetAttributes"]
    order = ["x", "scale", "shift", "out"]
    assert queried == [ptrs[k] for k in order[: order.index(which) + 1]]


def test_foreign_context_in_backward_is_named(fake_driver, monkeypatch):
    import normc.runtime as rt
    from normc.runtime import backward as bw

    monkeypatch.setattr(rt, "_gpu", True)
    monkeypatch.setattr(gpu, "set_device", lambda ordinal: None)
    fake_driver({0x10000: (PRIMARY, DEVICE, False), 0x20000: (OTHER, DEVICE, False)})
    real_describe = arrays.describe
    addr = {"x": 0x10000, "dy": 0x20000}

    def describe(obj, name, stream=None):
        info = real_describe(obj, name, stream)
        info.ptr = addr.get(name, 0x10000)
        return info

    monkeypatch.setattr(bw, "describe", describe)
    p = lambda shape: _Producer(np.zeros(shape, np.float32))  # noqa: E731
    with pytest.raises(ArgumentError, match="^dy is device memory of a CUDA context other than"):
        normc.compile(LN).backward(p((3, 8)), p((3, 8)), p(3), p(3), p(8))
