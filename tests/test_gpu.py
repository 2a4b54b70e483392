"""GPU tests (``pytest -m gpu``): every anchor row on torch CUDA tensors, and array interchange.

Skipped without a GPU (see conftest.py).
"""

import pytest

from gpu_anchors import TOL, anchors, run_row

pytestmark = pytest.mark.gpu

ROWS = anchors()


@pytest.mark.parametrize("i", range(len(ROWS)), ids=[f"{r['family']}-{'x'.join(map(str, r['shape']))}-{r['dtype']}-{r['memory_order'].replace(' ', '')}" for r in ROWS])
def test_anchor_row(i):
    r = run_row(i, ROWS[i], bw=None, timing=False)
    assert r["err"] <= TOL[ROWS[i]["dtype"]], r
    assert r["ok"], r


def _layer_norm_case(torch, dtype=None):
    import normc

    dtype = dtype or torch.float32
    x = torch.randn(37, 129, device="cuda", dtype=dtype)
    w = torch.randn(129, device="cuda", dtype=dtype)
    b = torch.randn(129, device="cuda", dtype=dtype)
    f = normc.compile(normc.layer_norm())
    ref = torch.nn.functional.layer_norm(x.double(), (129,), w.double(), b.double(), 1e-5)
    return f, x, w, b, ref


def test_misaligned_view_and_odd_extent():
    torch = pytest.importorskip("torch")
    import normc

    base = torch.randn(64, 1001, device="cuda")
    x = base[:, 1:]  # base pointer 4 bytes past a 16-byte boundary, odd row length
    w = torch.randn(1000, device="cuda")
    f = normc.compile(normc.layer_norm(elementwise_affine=True, bias=False))
    y = f(x, w)
    ref = torch.nn.functional.layer_norm(x.double(), (1000,), w.double(), None, 1e-5)
    assert (y.double() - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("rows,length,dtype,schedule", [
    (4, 400001, "float32", None),  # anchor row 43's shape: the planner's grid
    (1, 3000001, "float32", None),
    (2, 1000003, "bfloat16", None),
    (3, 65536, "float16", "grid"),
    (7, 40000, "float32", "grid"),
])
def test_grid_persistent_rows(rows, length, dtype, schedule):
    """Layer norm rows held over a co-resident grid (the planner's choice for few long rows, or forced), with
    mean and rstd, against float64; repeated calls agree bit for bit (the counters are zeroed per launch)."""
    torch = pytest.importorskip("torch")
    import normc

    dt = getattr(torch, dtype)
    x = (torch.randn(rows, length, device="cuda") * 3 + 100).to(dt)
    w = torch.randn(length, device="cuda").to(dt)
    b = torch.randn(length, device="cuda").to(dt)
    f = normc.compile(normc.layer_norm(), schedule=schedule)
    y, mean, rstd = f(x, w, b, return_stats=True)
    (entry,) = f._table.values()
    assert entry.plan.splits > 1 and entry.plan.cluster == 1, entry.plan.describe()
    xd = x.double()
    ref = torch.nn.functional.layer_norm(xd, (length,), w.double(), b.double(), 1e-5)
    tol = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}[dtype]
    assert (y.double() - ref).abs().max().item() <= tol * ref.abs().max().item()
    assert (mean.double().flatten() - xd.mean(-1)).abs().max().item() <= 1e-5 * 100
    want = torch.rsqrt(xd.var(-1, unbiased=False) + 1e-5)
    assert ((rstd.double().flatten() - want).abs() / want).max().item() <= 1e-4
    for _ in range(3):
        assert torch.equal(f(x, w, b), y)


def test_many_rows_beyond_grid_y_limit():
    torch = pytest.importorskip("torch")
    import normc

    x = torch.randn(70000, 64, device="cuda", dtype=torch.bfloat16)
    f = normc.compile(normc.rms_norm(elementwise_affine=False))
    y = f(x)
    ref = x.double() * torch.rsqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-6)
    assert (y.double() - ref).abs().max().item() < 2e-2


def test_cupy_and_numba_arrays():
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    from numba import cuda

    f, x, w, b, ref = _layer_norm_case(torch)
    xc, wc, bc = (cupy.asarray(t.cpu().numpy()) for t in (x, w, b))
    yc = f(xc, wc, bc)
    assert isinstance(yc, cupy.ndarray)
    assert abs(cupy.asnumpy(yc) - ref.cpu().numpy()).max() < 1e-4
    xn, wn, bn = (cuda.to_device(t.cpu().numpy()) for t in (x, w, b))
    yn = f(xn, wn, bn)
    assert abs(yn.copy_to_host() - ref.cpu().numpy()).max() < 1e-4


def test_runs_on_callers_stream_and_graph_capture():
    torch = pytest.importorskip("torch")
    f, x, w, b, ref = _layer_norm_case(torch)
    f(x, w, b)  # compile outside the capture
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = f(x, w, b)
    s.synchronize()
    assert (y.double() - ref).abs().max().item() < 1e-4
    out = torch.empty_like(x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        f(x, w, b, out=out)
    g.replay()
    torch.cuda.synchronize()
    assert (out.double() - ref).abs().max().item() < 1e-4


def test_host_array_rejected_on_gpu_machine():
    import numpy as np

    import normc

    f = normc.compile(normc.layer_norm(elementwise_affine=False))
    with pytest.raises(normc.ArgumentError, match="x is a host array"):
        f(np.ones((2, 3), np.float32))


@pytest.mark.parametrize("case", ["layer-f32", "rms-bf16", "instance-nhwc-f16-split"])
def test_fast_paths_match_the_validating_path(case):
    """The torch hot paths (forward with and without statistics, backward) take over from the second call
    with the same key: their outputs equal the first (validating) call's bit for bit, on fresh tensors of
    the same layout, and a new dtype or layout takes the validating path again."""
    torch = pytest.importorskip("torch")
    import math

    import normc
    import normc.torch

    g = torch.Generator(device="cuda").manual_seed(0)
    if case == "layer-f32":
        spec, shape, dt, cl = normc.layer_norm(), (37, 129), torch.float32, False
    elif case == "rms-bf16":
        spec, shape, dt, cl = normc.rms_norm(), (300, 4096), torch.bfloat16, False
    else:
        spec, shape, dt, cl = normc.instance_norm(2), (2, 32, 256, 256), torch.float16, True
    f = normc.compile(spec)
    sizes = spec.axis_sizes(shape)
    npar = math.prod(sizes[a] for a in spec.scale)

    def fresh(dt):
        def t(n):
            v = torch.randn(n, device="cuda", generator=g).to(dt)
            return v.to(memory_format=torch.channels_last) if cl and v.dim() == 4 else v

        return t(shape), t(npar), None if spec.shift is None else t(npar), t(shape)

    def run(x, w, b, dy):
        args = (x, w) if b is None else (x, w, b)
        y1 = f(*args)
        y, mean, rstd = f(*args, return_stats=True)
        grads = f.backward(dy, x, mean if spec.stat == "norm" else None, rstd, w)
        return (y1, y, mean, rstd) + tuple(t for t in grads if t is not None)

    x, w, b, dy = fresh(dt)
    first = run(x, w, b, dy)  # validating path: builds the entries and installs the fast paths
    assert len(f._fast) == 2 and len(f._bfast) == 1
    again = run(x.clone(memory_format=torch.preserve_format), w.clone(), None if b is None else b.clone(),
                dy.clone(memory_format=torch.preserve_format))
    torch.cuda.synchronize()
    for a, c in zip(first, again):
        assert a.shape == c.shape and a.stride() == c.stride() and a.dtype == c.dtype
        assert torch.equal(a, c)
    # and they are right: y against float64 torch, with the statistics' layout
    ref = normc.torch.reference_forward(spec, x.double(), w.double(), None if b is None else b.double())
    assert (again[1].double() - ref[0]).abs().max().item() <= 2e-2 * ref[0].abs().max().item()
    assert (again[3].double() - ref[2]).abs().max().item() <= 1e-3 * ref[2].abs().max().item()
    run(*fresh(torch.bfloat16 if dt == torch.float32 else torch.float32))  # another key: validated again
    assert len(f._fast) == 4 and len(f._bfast) == 2


@pytest.mark.parametrize("out_dtype", [None, "float32"])
def test_fast_path_allocates_y_in_its_own_dtype_and_layout(out_dtype):
    """The forward fast path allocates y by ``torch.empty_like(x)`` only where y has x's dtype and strides
    (out_dtype None); with ``out_dtype="float32"`` on float16 x it allocates y itself. Either way the fast
    call's y (channels-last x, float16) has the validating call's dtype and strides and equals it bit for bit,
    and both match the numpy float64 reference."""
    torch = pytest.importorskip("torch")
    from conftest import check_y, reference

    import normc

    g = torch.Generator(device="cuda").manual_seed(1)
    spec = normc.instance_norm(2)
    x = torch.randn(3, 24, 17, 19, device="cuda", generator=g).half().to(memory_format=torch.channels_last)
    w, b = torch.randn(24, device="cuda", generator=g), torch.randn(24, device="cuda", generator=g)
    f = normc.compile(spec, out_dtype=out_dtype)
    first = f(x, w, b)  # the validating call installs the fast path
    assert len(f._fast) == 1
    again = f(x.clone(memory_format=torch.preserve_format), w, b)
    torch.cuda.synchronize()
    want = torch.float16 if out_dtype is None else torch.float32
    assert first.dtype == again.dtype == want
    assert first.stride() == again.stride() == x.stride()
    assert torch.equal(first, again)
    ref = reference(spec, x.float().cpu().numpy(), w.cpu().numpy(), b.cpu().numpy())[0]
    check_y(again.float().cpu().numpy(), ref, "float16" if out_dtype is None else "float32")
