"""Memory safety, numerics at scale, streams and bad input on a real GPU (issue 5, parts 1, 2, 3 and 5).

``pytest -m gpu tests/test_gpu_reliability.py`` on the H200 (skipped without a GPU). The large cases
allocate up to ~10 GB: tensors over 2**31 elements, 25M-element half-precision rows, more than 65,535
rows; then odd/prime extents with every vector width, views offset by one element, arbitrary strides,
zero-size tensors (no launch), the caller's stream (two streams, two specs), no implicit synchronization,
and arguments on the wrong device. References are float64 torch computations (tests/gpu_anchors.py).
"""

from __future__ import annotations

import math
import time

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import normc  # noqa: E402
from gpu_anchors import reference  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
LN = "t d : norm over d ; scale d ; shift d"
IN2 = "n c h w : norm over h w ; scale c ; shift c"
GN = "n (g k) h w : norm over k h w ; scale g k ; shift g k"


def _err(y, ref):
    ref = ref.double()
    return ((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1.0)).item()


def _params(spec, shape, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    sizes = spec.axis_sizes(tuple(shape))
    sc = sh = None
    if spec.scale is not None:
        n = math.prod(sizes[a] for a in spec.scale)
        sc = (1 + 0.5 * torch.randn(n, device="cuda", generator=g)).to(dtype)
    if spec.shift is not None:
        n = math.prod(sizes[a] for a in spec.shift)
        sh = torch.randn(n, device="cuda", generator=g).to(dtype)
    return sc, sh


def _check(spec, x, *, schedule=None, tol=None, stats=True):
    """Run spec on x (any strides), compare y/mean/rstd with the float64 reference; return the plan."""
    spec = normc.spec(spec) if isinstance(spec, str) else spec
    sc, sh = _params(spec, x.shape, x.dtype)
    f = normc.compile(spec, schedule=schedule)
    y, mean, rstd = f(x, sc, sh, return_stats=True)
    yr, mr, rr = reference(spec, x, sc, sh)
    assert y.shape == x.shape and y.dtype == x.dtype
    e = _err(y, yr)
    assert e <= (tol or TOL[x.dtype]), (e, x.shape, x.stride())
    if stats:
        assert _err(rstd.reshape(-1), rr.reshape(-1)) <= 1e-3
        if spec.stat == "norm":
            assert _err(mean.reshape(-1), mr.reshape(-1)) <= 1e-4
    return next(iter(f._table.values())).plan


@pytest.fixture(autouse=True)
def _free():
    yield
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------------
# Sizes: > 2**31 elements, > 65,535 rows, 25M-element rows


def test_layer_norm_over_2_31_elements_bf16():
    """(150000, 16384) bfloat16 = 2.46e9 elements (4.9 GB): rows on both sides of element 2**31 match a
    float64 reference computed on those rows."""
    T, D = 150_000, 16_384
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
    spec = normc.spec(LN)
    sc, sh = _params(spec, (T, D), torch.bfloat16)
    f = normc.compile(spec)
    y, mean, rstd = f(x, sc, sh, return_stats=True)
    edge = 2**31 // D  # first row past element 2**31
    rows = torch.tensor([0, 1, edge - 1, edge, edge + 1, 2**32 // D - 1, T - 2, T - 1]
                        + torch.randint(0, T, (24,)).tolist(), device="cuda").clamp_max(T - 1)
    ref = torch.nn.functional.layer_norm(x[rows].double(), (D,), sc.double(), sh.double(), 1e-5)
    assert _err(y[rows], ref) <= 1e-2
    xr = x[rows].double()
    assert ((mean[rows].double() - xr.mean(-1)).abs().max() / xr.abs().max()).item() <= 1e-4
    assert torch.isfinite(y[-1]).all() and torch.isfinite(rstd).all()


def test_instance_norm_nhwc_over_2_31_elements_bf16():
    """Outer strategy past 2**31: NHWC (66, 512, 256, 256) bfloat16 (2.2e9 elements); the reductions of
    the last images (offsets > 2**31) are checked."""
    shape = (66, 512, 256, 256)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    spec = normc.spec(IN2)
    sc, sh = _params(spec, shape, torch.bfloat16)
    y = normc.compile(spec)(x, sc, sh)
    for n in (0, 63, 64, 65):
        xs = x[n:n + 1].double()
        ref = torch.nn.functional.instance_norm(xs, weight=sc.double(), bias=sh.double(), eps=1e-5)
        assert _err(y[n:n + 1], ref) <= 1e-2, n


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("schedule", [None, "looped", "split"])
def test_25m_element_rows_half_precision(dtype, schedule):
    """2 rows x 25M half-precision elements with mean 100: float32 accumulation (a float32 running sum
    would lose ~8 bits at 2.5e9) matches the float64 reference."""
    x = (100 + torch.randn(2, 25_000_000, device="cuda")).to(dtype)
    plan = _check(LN, x, schedule=schedule)
    if schedule:
        assert plan.schedule == schedule


@pytest.mark.parametrize("case", ["inner", "outer", "mixed"])
def test_more_than_65535_rows(case):
    if case == "inner":
        x = torch.randn(1_000_003, 8, device="cuda")
        _check(LN, x)
    elif case == "outer":
        x = torch.randn(70_001, 4, 3, 3, device="cuda").to(memory_format=torch.channels_last)
        _check(IN2, x)
    else:
        x = torch.randn(40_000, 6, 4, 4, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        _check(normc.spec(GN, g=2), x)


# ----------------------------------------------------------------------------------------------------
# Extents, vector widths, views, strides


WIDTH_DTYPES = {torch.float32: (1, 2, 4), torch.float16: (1, 2, 4, 8), torch.bfloat16: (1, 2, 4, 8)}


@pytest.mark.parametrize("dtype", list(WIDTH_DTYPES), ids=str)
@pytest.mark.parametrize("strategy", ["inner", "outer"])
def test_odd_and_prime_extents_cover_every_vector_width(dtype, strategy):
    """Extents w x prime give vector width w; plain primes give 1: every width each dtype admits runs on
    odd/prime extents and matches the reference."""
    seen = set()
    for w in WIDTH_DTYPES[dtype]:
        for p in (1, 3, 13, 1009):
            n = w * p
            if strategy == "inner":
                x = torch.randn(37, n, device="cuda").to(dtype)
                plan = _check(LN, x)
            else:
                x = torch.randn(3, n, 5, 7, device="cuda").to(dtype).to(memory_format=torch.channels_last)
                plan = _check(IN2, x)
            seen.add(plan.vec)
    assert seen == set(WIDTH_DTYPES[dtype]), seen


@pytest.mark.parametrize("dtype", list(WIDTH_DTYPES), ids=str)
@pytest.mark.parametrize("layout", ["inner", "outer", "mixed"])
def test_views_offset_by_one_element(dtype, layout):
    if layout == "inner":
        base = torch.randn(64 * 1025 + 1, device="cuda").to(dtype)
        x = base[1:].view(64, 1025)[:, :1024]  # base pointer 1 element past alignment, row stride 1025
        _check(LN, x)
    else:
        shape = (2, 8, 6, 6) if layout == "outer" else (2, 12, 5, 5)
        n = math.prod(shape)
        base = torch.randn(n + 1, device="cuda").to(dtype)
        N, C, H, W = shape
        x = base[1:].as_strided(shape, (H * W * C, 1, W * C, C))  # NHWC view at offset 1
        spec = IN2 if layout == "outer" else normc.spec(GN, g=3)
        _check(spec, x)


@pytest.mark.parametrize("case", ["every-other", "transposed", "gaps", "broadcast-row", "permuted-3d"])
def test_arbitrary_strides(case):
    if case == "every-other":
        x = torch.randn(96, 2 * 300, device="cuda")[:, ::2]
        _check(LN, x)
    elif case == "transposed":
        x = torch.randn(515, 33, device="cuda").t()
        _check(LN, x)
    elif case == "gaps":
        x = torch.randn(20000, device="cuda").as_strided((7, 3, 9, 11), (2500, 7, 250, 20))
        _check(IN2, x)
    elif case == "broadcast-row":
        x = torch.randn(1, 777, device="cuda").expand(50, 777)
        _check(LN, x)
    else:
        x = torch.randn(9, 17, 31, device="cuda").permute(2, 0, 1)
        _check("a b c : norm over b c ; scale b c", x)


@pytest.mark.parametrize("shape,cl", [((0, 16), False), ((16, 0), False), ((0, 3, 4, 4), True), ((2, 3, 0, 4), True)])
def test_zero_size_tensors_do_not_launch(shape, cl, monkeypatch):
    from normc.runtime import gpu

    launches = []
    real = gpu.Loaded.launcher  # every launch goes through it (Loaded has no __call__ to count)
    monkeypatch.setattr(gpu.Loaded, "launcher", lambda self, *a: (launches.append(1), real(self, *a))[1])
    x = torch.empty(shape, device="cuda")
    if cl:
        x = x.to(memory_format=torch.channels_last)
        spec = normc.spec(IN2)
    else:
        spec = normc.spec(LN)
    sc, sh = _params(spec, shape, torch.float32)
    y, mean, rstd = normc.compile(spec)(x, sc, sh, return_stats=True)
    assert y.shape == x.shape and y.numel() == 0 and y.device == x.device
    assert launches == []
    if mean.numel():
        assert torch.isnan(mean).all()


# ----------------------------------------------------------------------------------------------------
# Streams: the caller's stream, no implicit synchronization


def _sleep_cycles(seconds):
    return int(seconds * torch.cuda.get_device_properties(0).clock_rate * 1e3)


def test_two_streams_run_different_specs_on_the_callers_streams():
    """Each stream first sleeps, then writes x; normc's kernels must follow on the same stream (else they
    would read x before it is written), while the two specs run concurrently."""
    ln, inn = normc.compile(normc.spec(LN)), normc.compile(normc.spec(IN2))
    x1 = torch.randn(4096, 1024, device="cuda")
    x2 = torch.randn(32, 64, 28, 28, device="cuda").to(memory_format=torch.channels_last)
    p1, p2 = _params(normc.spec(LN), x1.shape, x1.dtype), _params(normc.spec(IN2), x2.shape, x2.dtype)
    ln(x1, *p1), inn(x2, *p2)  # compile outside the timed part
    r1, r2 = reference(normc.spec(LN), x1, *p1)[0], reference(normc.spec(IN2), x2, *p2)[0]
    torch.cuda.synchronize()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    b1, b2 = torch.zeros_like(x1), torch.zeros_like(x2)
    for s, b, x in ((s1, b1, x1), (s2, b2, x2)):
        b.record_stream(s)
    with torch.cuda.stream(s1):
        torch.cuda._sleep(_sleep_cycles(0.2))
        b1.copy_(x1)
        y1 = ln(b1, *p1)
    with torch.cuda.stream(s2):
        torch.cuda._sleep(_sleep_cycles(0.2))
        b2.copy_(x2)
        y2, m2, _ = inn(b2, *p2, return_stats=True)
    torch.cuda.synchronize()
    assert _err(y1, r1) <= 1e-5 and _err(y2, r2) <= 1e-5
    assert y2.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("what", ["plain", "stats", "out", "split-workspace", "explicit-stream"])
def test_call_does_not_synchronize(what):
    """After a 0.5 s sleep is queued on the stream, a normc call (already compiled) returns at once and the
    stream is still busy; the result is right once the stream is done."""
    x = torch.randn(8, 4096, device="cuda")
    spec = normc.spec(LN)
    sc, sh = _params(spec, x.shape, x.dtype)
    f = normc.compile(spec, schedule="split" if what == "split-workspace" else None)
    out = torch.empty_like(x)
    s = torch.cuda.Stream()
    kw = {"stats": {"return_stats": True}, "out": {"out": out}, "explicit-stream": {"stream": s}}.get(what, {})
    f(x, sc, sh, **kw)  # compile
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(_sleep_cycles(0.5))
        t0 = time.perf_counter()
        res = f(x, sc, sh, **kw)
        dt = time.perf_counter() - t0
        busy = not s.query()
    s.synchronize()
    assert dt < 0.1 and busy, (dt, busy)
    y = res[0] if isinstance(res, tuple) else res
    assert _err(y, reference(spec, x, sc, sh)[0]) <= 1e-5


def test_cuda_graph_replay_and_torch_compile():
    """normc inside a captured CUDA graph (out= preallocated) and next to torch.compile'd code."""
    spec = normc.spec(LN)
    f = normc.compile(spec)
    x = torch.randn(256, 1024, device="cuda")
    sc, sh = _params(spec, x.shape, x.dtype)
    ref = reference(spec, x, sc, sh)[0]
    out = torch.empty_like(x)
    f(x, sc, sh, out=out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        f(x, sc, sh, out=out)
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert _err(out, ref) <= 1e-5

    @torch.compile
    def block(t):
        return torch.relu(f(t * 2, sc, sh)) + 1  # normc is opaque to dynamo: a graph break around it

    y = block(x)
    r = torch.relu(reference(spec, x * 2, sc, sh)[0]) + 1
    assert _err(y, r) <= 1e-5


# ----------------------------------------------------------------------------------------------------
# Bad input on the GPU


def test_host_and_device_arguments_mixed_are_named():
    f = normc.compile(normc.spec(LN))
    x = torch.randn(4, 8, device="cuda")
    w, b = torch.ones(8, device="cuda"), torch.zeros(8, device="cuda")
    with pytest.raises(normc.ArgumentError, match="^x "):
        f(x.cpu(), w, b)
    with pytest.raises(normc.ArgumentError, match="^scale "):
        f(x, w.cpu(), b)
    with pytest.raises(normc.ArgumentError, match="^shift "):
        f(x, w, b.cpu())
    with pytest.raises(normc.ArgumentError, match="^out "):
        f(x, w, b, out=torch.empty(4, 8))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_arguments_on_another_device_are_named():
    f = normc.compile(normc.spec(LN))
    x = torch.randn(4, 8, device="cuda:0")
    w1 = torch.ones(8, device="cuda:1")
    with pytest.raises(normc.ArgumentError, match="scale"):
        f(x, w1, torch.zeros(8, device="cuda:0"))


def test_array_from_another_context_is_rejected():
    """Memory allocated in a non-primary context is not mapped in the primary context normc launches in."""
    from cuda.bindings import driver as drv

    torch.cuda.init()
    err, dev = drv.cuDeviceGet(0)
    err, ctx = drv.cuCtxCreate(None, 0, dev) if _ctx_create_takes_params(drv) else drv.cuCtxCreate(0, dev)
    assert err == drv.CUresult.CUDA_SUCCESS
    try:
        err, ptr = drv.cuMemAlloc(4 * 8 * 4)
        assert err == drv.CUresult.CUDA_SUCCESS

        class Foreign:
            __cuda_array_interface__ = {"shape": (4, 8), "typestr": "<f4", "data": (int(ptr), False),
                                        "version": 3, "strides": None}

        drv.cuCtxPopCurrent()
        f = normc.compile(normc.spec("t d : norm over d"))
        with pytest.raises(normc.ArgumentError, match="context"):
            f(Foreign())
    finally:
        drv.cuCtxDestroy(ctx)


class _Cai:
    """A float32 CUDA array interface over a raw pointer (``stream``: the producer's stream, or None)."""

    def __init__(self, ptr, shape, stream=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (int(ptr), False),
                                         "version": 3, "strides": None, "stream": stream}


def _ok(err):
    from cuda.bindings import driver as drv

    assert err == drv.CUresult.CUDA_SUCCESS, err


def test_scale_from_another_context_is_named():
    from cuda.bindings import driver as drv

    torch.cuda.init()
    err, dev = drv.cuDeviceGet(0)
    err, ctx = drv.cuCtxCreate(None, 0, dev) if _ctx_create_takes_params(drv) else drv.cuCtxCreate(0, dev)
    _ok(err)
    try:
        err, ptr = drv.cuMemAlloc(8 * 4)
        _ok(err)
        drv.cuCtxPopCurrent()
        f = normc.compile(normc.spec(LN))
        x = torch.randn(4, 8, device="cuda")
        with pytest.raises(normc.ArgumentError, match="^scale is device memory of a CUDA context other than"):
            f(x, _Cai(ptr, (8,)), torch.zeros(8, device="cuda"))
    finally:
        drv.cuCtxDestroy(ctx)


@pytest.mark.parametrize("kind", ["managed", "pinned-host", "stream-ordered-pool", "vmm", "numba"])
def test_memory_outside_cudamalloc_is_accepted(kind):
    """The context check rejects only plain device memory of another context: managed memory, pinned host
    memory, pool (cuMemAllocAsync) and VMM allocations, and Numba's arrays (primary context) all run."""
    import ctypes

    import numpy as np
    from cuda.bindings import driver as drv
    from cuda.core import Device

    torch.cuda.init()
    torch.cuda.synchronize()
    Device(0).set_current()  # the driver allocation calls below need a current context: the primary one
    T, D = 4, 8
    host = np.random.default_rng(0).standard_normal((T, D)).astype(np.float32)
    nbytes = host.nbytes
    keep, free = None, lambda: None
    if kind in ("managed", "pinned-host"):
        if kind == "managed":
            err, ptr = drv.cuMemAllocManaged(nbytes, drv.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value)
            free = lambda: drv.cuMemFree(ptr)  # noqa: E731
        else:
            err, ptr = drv.cuMemAllocHost(nbytes)
            free = lambda: drv.cuMemFreeHost(ptr)  # noqa: E731
        _ok(err)
        view = np.ctypeslib.as_array(ctypes.cast(int(ptr), ctypes.POINTER(ctypes.c_float)), shape=(T * D,))
        view[:] = host.reshape(-1)
    elif kind == "stream-ordered-pool":
        err, ptr = drv.cuMemAllocAsync(nbytes, drv.CUstream(0))
        _ok(err)
        free = lambda: drv.cuMemFreeAsync(ptr, drv.CUstream(0))  # noqa: E731
        _ok(drv.cuMemcpyHtoD(ptr, host.ctypes.data, nbytes)[0])
    elif kind == "vmm":
        from cuda.core import VirtualMemoryResource

        keep = VirtualMemoryResource(0).allocate(nbytes)
        ptr = int(keep.handle)
        _ok(drv.cuMemcpyHtoD(ptr, host.ctypes.data, nbytes)[0])
    else:
        from numba import cuda

        keep = cuda.to_device(host)
        ptr = keep.__cuda_array_interface__["data"][0]
    try:
        torch.cuda.synchronize()
        y = normc.compile(normc.spec("t d : norm over d"))(_Cai(ptr, (T, D)))
        torch.cuda.synchronize()
        ref = (host - host.mean(-1, keepdims=True)) / np.sqrt(host.var(-1, keepdims=True) + 1e-5)
        assert np.abs(y.copy_to_host() - ref).max() < 1e-5
    finally:
        torch.cuda.synchronize()
        free()
        torch.cuda.synchronize()


class _DLPackOnly:
    """Exposes only a torch tensor's DLPack methods, so normc reads it through cuda.core's DLPack path and
    torch (the producer) orders its *current* stream before the stream normc passes."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, **kw):
        return self.t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


@pytest.mark.parametrize("protocol", ["dlpack", "cai"])
def test_producer_work_is_ordered_before_the_launch_stream(protocol):
    """x is written on a busy side stream; normc launches on another stream without any event from the
    caller: the DLPack handshake (``__dlpack__(stream=launch)``) or the CUDA array interface's ``stream``
    (an event on it) must make the launch wait, or the kernel reads the zeros x held before."""
    f = normc.compile(normc.spec("t d : norm over d"))
    side, launch = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.zeros(64, 1024, device="cuda")
    src = torch.randn(64, 1024, device="cuda")

    def wrap(t):
        if protocol == "dlpack":
            return _DLPackOnly(t)
        producer = torch.cuda.current_stream().cuda_stream
        return _Cai(t.data_ptr(), tuple(t.shape), stream=producer or 1)  # CAI: 1 is the legacy default stream

    f(wrap(x), stream=launch)  # compile outside the timed part
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(500_000_000)  # keep the side stream busy (~0.3 s)
        x.copy_(src)
        y = f(wrap(x), stream=launch)  # the caller orders nothing itself
    assert y.__cuda_array_interface__["stream"] == launch.cuda_stream  # y names the stream it is written on
    torch.cuda.synchronize()
    ref = torch.nn.functional.layer_norm(src.double(), (1024,), eps=1e-5)
    assert _err(torch.as_tensor(y.copy_to_host(), device="cuda"), ref) <= 1e-5


def test_jax_arrays_directly():
    """JAX GPU arrays go to normc without torch: DLPack with the stream handshake in, a Numba device array out
    (not bound to a stream: JAX's import rejects streams it did not create), back into JAX with jnp.asarray
    (zero-copy) once normc's stream has been synchronized."""
    import os

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax sees no GPU")
    from numba import cuda

    import numpy as np

    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (256, 1000), dtype=jnp.float32) * 3 + 1
    w = 1 + 0.1 * jax.random.normal(k2, (1000,), dtype=jnp.float32)
    b = jnp.linspace(-1, 1, 1000, dtype=jnp.float32)
    s = cuda.stream()
    y, mean, rstd = normc.compile(normc.spec(LN))(x, w, b, return_stats=True, stream=s)
    assert y.__cuda_array_interface__.get("stream") is None
    s.synchronize()
    yj = jnp.asarray(y)
    assert yj.shape == (256, 1000) and yj.dtype == jnp.float32
    xn = np.asarray(x, np.float64)
    ref = (xn - xn.mean(-1, keepdims=True)) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5) * np.asarray(w) \
        + np.asarray(b)
    assert float(np.abs(np.asarray(yj) - ref).max()) < 1e-4
    # bfloat16 x: normc cannot allocate a bfloat16 Numba array; out_dtype="float32" is the JAX route
    xb = x.astype(jnp.bfloat16)
    with pytest.raises(normc.ArgumentError, match="bfloat16"):
        normc.compile(normc.spec(LN))(xb, w, b)
    y32 = normc.compile(normc.spec(LN), out_dtype="float32")(xb, w, b, stream=s)
    s.synchronize()
    assert jnp.asarray(y32).dtype == jnp.float32
    with pytest.raises(normc.ArgumentError, match="^out is read-only"):  # JAX arrays are immutable
        normc.compile(normc.spec(LN))(x, w, b, out=x)


def _ctx_create_takes_params(drv):
    import inspect

    try:
        return len(inspect.signature(drv.cuCtxCreate).parameters) == 3
    except (TypeError, ValueError):
        return True
