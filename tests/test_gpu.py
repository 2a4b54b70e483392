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
