"""normc.torch on a CUDA GPU: modules vs torch (forward, backward, running stats, layouts), float64 gradcheck
(reference path), torch.compile without graph breaks, CUDA-graph capture, and Compiled.backward on torch
tensors. Run with ``python -m pytest -m gpu tests/test_torch_gpu.py``."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

import normc  # noqa: E402


def _ntorch():
    import normc.torch as nt

    return nt


TOL = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}


def _err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / max(float(b.abs().max()), 1.0))


def _compare(ref_mod, x, dtype, train=True):
    """Forward + backward of ref_mod and its normc conversion on the same input; returns the errors."""
    nt = _ntorch()
    import copy

    mod = nt.convert(copy.deepcopy(ref_mod))
    assert type(mod) is not type(ref_mod)
    ref_mod.train(train)
    mod.train(train)
    x1 = x.detach().clone().requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    y1 = ref_mod(x1)
    y2 = mod(x2)
    assert y2.dtype == y1.dtype and y2.shape == y1.shape
    # normc keeps x's memory order (torch's instance norm returns a contiguous y for channels-last x)
    assert y2.stride() == torch.empty_like(x, memory_format=torch.preserve_format).stride()
    dy = torch.randn_like(y1)
    y1.backward(dy)
    y2.backward(dy)
    tol = TOL[dtype]
    assert _err(y2, y1) <= tol, ("y", _err(y2, y1))
    assert _err(x2.grad, x1.grad) <= tol, ("dx", _err(x2.grad, x1.grad))
    for (n, p1), (_, p2) in zip(ref_mod.named_parameters(), mod.named_parameters()):
        assert _err(p2.grad, p1.grad) <= tol * 4, (n, _err(p2.grad, p1.grad))
    for (n, b1), (_, b2) in zip(ref_mod.named_buffers(), mod.named_buffers()):
        if b1.dtype.is_floating_point:
            assert _err(b2, b1) <= max(1e-4, tol), (n, _err(b2, b1))  # one ulp of a half buffer
        else:
            assert torch.equal(b1, b2), n


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_rms_norm(dtype):
    x = torch.randn(64, 1024, device="cuda", dtype=dtype)
    nn = torch.nn
    _compare(nn.LayerNorm(1024, device="cuda", dtype=dtype), x, dtype)
    _compare(nn.RMSNorm(1024, eps=1e-6, device="cuda", dtype=dtype), x, dtype)
    _compare(nn.LayerNorm((8, 128), device="cuda", dtype=dtype), x.view(64, 8, 128), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_default_eps(dtype):
    """RMSNorm(eps=None) takes the eps torch takes: float32's machine epsilon for 16-bit x (the type it computes
    in), not float16's 9.8e-4 or bfloat16's 7.8e-3, which moved y of activations near 1e-3 from 0.945 to 0.03
    (a new-user report, 2026-12-07)."""
    nt = _ntorch()
    x = torch.full((2, 8), 1e-3, device="cuda", dtype=dtype)
    x[1] = torch.randn(8, device="cuda", dtype=dtype)
    ref = torch.nn.RMSNorm(8, device="cuda", dtype=dtype)
    got = nt.RMSNorm(8, device="cuda", dtype=dtype)
    assert ref.eps is None and got.eps is None
    assert _err(got(x), ref(x)) <= TOL[dtype]
    assert abs(float(got(x)[0, 0]) - float(ref(x)[0, 0])) <= 1e-2


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_instance_group_batch_2d(cl, dtype):
    nn = torch.nn
    x = torch.randn(4, 32, 20, 20, device="cuda", dtype=dtype)
    if cl:
        x = x.to(memory_format=torch.channels_last)
    for m in (nn.InstanceNorm2d(32, affine=True), nn.InstanceNorm2d(32),
              nn.InstanceNorm2d(32, affine=True, track_running_stats=True),
              nn.GroupNorm(8, 32), nn.BatchNorm2d(32)):
        m = m.to(device="cuda", dtype=dtype)
        with torch.no_grad():
            for p in m.parameters():
                p.uniform_(0.5, 1.5)
        _compare(m, x, dtype)
    _compare(nn.BatchNorm2d(32).to("cuda", dtype), x, dtype, train=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_1d_3d(dtype):
    nn = torch.nn
    x1 = torch.randn(8, 16, 50, device="cuda", dtype=dtype)
    _compare(nn.InstanceNorm1d(16, affine=True).to("cuda", dtype), x1, dtype)
    _compare(nn.BatchNorm1d(16).to("cuda", dtype), x1, dtype)
    _compare(nn.BatchNorm1d(16, momentum=None).to("cuda", dtype), x1[:, :, 0].contiguous(), dtype)
    x3 = torch.randn(2, 8, 6, 10, 12, device="cuda", dtype=dtype).to(memory_format=torch.channels_last_3d)
    _compare(nn.InstanceNorm3d(8, affine=True).to("cuda", dtype), x3, dtype)
    _compare(nn.BatchNorm3d(8).to("cuda", dtype), x3, dtype)


def test_channels_last_output_and_grad_layout():
    nt = _ntorch()
    m = nt.InstanceNorm2d(16, affine=True).cuda()
    x = torch.randn(2, 16, 9, 9, device="cuda").to(memory_format=torch.channels_last).requires_grad_(True)
    y = m(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    y.sum().backward()
    assert x.grad.is_contiguous(memory_format=torch.channels_last)


def test_gradcheck_float64():
    nt = _ntorch()
    for spec, shape, pshape in (
        ("t d : norm over d ; scale d ; shift d", (3, 5), (5,)),
        (normc.spec("t d : rms over d ; scale d", eps=1e-6), (3, 6), (6,)),
        ("n c h w : norm over h w ; scale c ; shift c", (2, 3, 2, 3), (3,)),
        (normc.spec("n (g k) h w : norm over k h w ; scale g k ; shift g k", g=2), (2, 4, 2, 2), (4,)),
        ("n c h w : norm over n h w ; scale c ; shift c", (3, 2, 2, 2), (2,)),
    ):
        for dev in ("cpu", "cuda"):
            x = torch.randn(*shape, dtype=torch.float64, device=dev, requires_grad=True)
            w = torch.randn(*pshape, dtype=torch.float64, device=dev, requires_grad=True)
            sp = normc.spec(spec) if isinstance(spec, str) else spec
            b = torch.randn(*pshape, dtype=torch.float64, device=dev, requires_grad=True) if sp.shift else None
            args = (x, w) if b is None else (x, w, b)
            assert torch.autograd.gradcheck(lambda *a: nt.normalize(a[0], sp, *a[1:]), args)


def test_kernels_match_float64_reference():
    nt = _ntorch()
    sp = normc.spec("n (g k) h w : norm over k h w ; scale g k ; shift g k", g=4)
    x = torch.randn(2, 16, 7, 7, device="cuda").to(memory_format=torch.channels_last)
    w = torch.rand(16, device="cuda") + 0.5
    b = torch.randn(16, device="cuda")
    f = normc.compile(sp)
    y, mean, rstd = f(x, w, b, return_stats=True)
    dy = torch.randn_like(y)
    dx, dw, db = f.backward(dy, x, mean, rstd, w)
    rdx, rdw, rdb = nt.reference_backward(sp, dy.double(), x.double(), mean.double(), rstd.double(), w.double())
    assert _err(dx, rdx) < 1e-5 and _err(dw, rdw) < 1e-5 and _err(db, rdb) < 1e-5
    assert dx.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("text,shape,dtype", [
    ("t d : norm over d ; scale d ; shift d", (4, 400001), torch.float32),  # one group, rows per thread
    ("t d : norm over d ; scale d ; shift d", (300, 70001), torch.float32),  # row groups, partials
    ("t d : rms over d ; scale d", (64, 16384), torch.bfloat16),
    ("t d : norm over d ; shift d", (100, 9001), torch.float16),
])
def test_column_pass_matches_float64_reference(text, shape, dtype):
    """Rows too long for the fused backward take the column pass (row sums, then dx with the parameter
    gradients accumulated down the columns): against the float64 formulas on the same statistics."""
    nt = _ntorch()
    from normc.runtime.backward import plan_backward

    sp = normc.spec(text, eps=1e-5)
    assert plan_backward(sp, shape, str(dtype).split(".")[1]).cols is not None
    torch.manual_seed(3)
    x = (torch.randn(*shape, device="cuda") * 2 + 0.5).to(dtype)
    w = (torch.rand(shape[1], device="cuda") + 0.5).to(dtype) if sp.scale else None
    b = torch.randn(shape[1], device="cuda").to(dtype) if sp.shift else None
    f = normc.compile(sp)
    y, mean, rstd = f(x, w, b, return_stats=True)
    dy = torch.randn_like(y)
    got = f.backward(dy, x, mean, rstd, w)
    ref = nt.reference_backward(sp, dy.double(), x.double(), None if mean is None else mean.double(),
                                rstd.double(), None if w is None else w.double())
    tol = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 1.6e-2}[dtype]
    for name, g, r in zip(("dx", "dscale", "dshift"), got, ref):
        assert (g is None) == (r is None), name
        if g is not None:
            assert _err(g, r) < tol, f"{name}: {_err(g, r):.2e}"


@pytest.mark.parametrize("text,shape,cluster", [
    ("n c d h w : norm over d h w ; scale c ; shift c", (2, 16, 32, 32, 32), 2),  # row route
    ("n c h w : norm over h w ; scale c ; shift c", (2, 3, 101, 103), 2),  # odd rows: scalar, masked lanes
    ("n c h w : norm over h w ; scale c ; shift c", (1, 8, 320, 320), 8),
    ("t d : norm over d ; scale d ; shift d", (50, 10000), 2),  # lane route: per-cluster partials
    ("t d : rms over d ; scale d", (7, 30000), 4),
])
def test_fused_cluster_matches_float64_reference(text, shape, cluster):
    """float32 rows longer than one CTA holds take the fused backward over a thread-block cluster (row sums
    added through distributed shared memory): against the float64 formulas on the same statistics."""
    nt = _ntorch()
    from normc.runtime.backward import plan_backward

    sp = normc.spec(text, eps=1e-5)
    assert plan_backward(sp, shape, "float32").fused.cluster == cluster
    torch.manual_seed(4)
    x = torch.randn(*shape, device="cuda") * 2 + 0.5
    n = x.shape[1] if text.startswith("n") else x.shape[-1]
    w = torch.rand(n, device="cuda") + 0.5
    b = torch.randn(n, device="cuda") if sp.shift else None
    f = normc.compile(sp)
    y, mean, rstd = f(x, w, b, return_stats=True)
    dy = torch.randn_like(y)
    got = f.backward(dy, x, mean, rstd, w)
    assert next(iter(f._normc_backward.values())).plan.fused.cluster == cluster
    ref = nt.reference_backward(sp, dy.double(), x.double(), None if mean is None else mean.double(),
                                rstd.double(), w.double())
    for name, g, r in zip(("dx", "dscale", "dshift"), got, ref):
        assert (g is None) == (r is None), name
        if g is not None:
            assert _err(g, r) < 2e-5, f"{name}: {_err(g, r):.2e}"


def test_tall_layer_norm_deterministic():
    nt = _ntorch()
    m = nt.LayerNorm(128, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 1048576, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    grads = []
    for _ in range(2):
        m.zero_grad()
        x.grad = None
        m(x).backward(dy)
        grads.append((x.grad.clone(), m.weight.grad.clone(), m.bias.grad.clone()))
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    ref = torch.nn.LayerNorm(128, device="cuda", dtype=torch.float32)
    xr = x.detach().float().requires_grad_(True)
    ref(xr).backward(dy.float())
    assert _err(m.weight.grad, ref.weight.grad) < 2e-2
    assert _err(m.bias.grad, ref.bias.grad) < 2e-2


def test_torch_compile_no_graph_break():
    nt = _ntorch()
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), nt.LayerNorm(64), torch.nn.GELU()).cuda()
    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    import torch._dynamo as dynamo

    explain = dynamo.explain(m)(x)
    assert explain.graph_break_count == 0, explain.break_reasons
    cm = torch.compile(m, fullgraph=True)
    y = cm(x)
    y.sum().backward()
    assert torch.allclose(y, m(x), atol=1e-5)


def test_cuda_graph_capture():
    nt = _ntorch()
    m = nt.LayerNorm(256).cuda()
    x = torch.randn(128, 256, device="cuda", requires_grad=True)
    dy = torch.randn(128, 256, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm up: compile the kernels outside the capture
            m(x).backward(dy)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    x.grad = None
    m.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        y = m(x)
        y.backward(dy)
    g.replay()
    torch.cuda.synchronize()
    ref = torch.nn.functional.layer_norm(x, (256,), m.weight, m.bias)
    assert _err(y, ref) < 1e-4


@pytest.mark.gpu
def test_modules_take_the_torch_fast_paths():
    """A normc.torch module's weight and bias are nn.Parameters: from the second step on, its forward
    (with statistics) and backward take the hot paths (they used to fall to the validating path: a LayerNorm
    step cost 571 us of host time against torch's 198 on the H200), with the same results as the first step.
    The compiled spec is shared with other tests in this process, so the hot paths are counted by wrapping
    the ones the first step installed."""
    import normc.torch as nt

    m = nt.LayerNorm(257).cuda()
    x = torch.randn(33, 257, device="cuda", requires_grad=True)
    dy = torch.randn(33, 257, device="cuda")
    f = nt._compiled(*nt._spec_args(nt._layer_norm_spec(2, 1, eps=m.eps, elementwise_affine=True, bias=True)))

    def step():
        x.grad = m.weight.grad = m.bias.grad = None
        y = m(x)
        y.backward(dy)
        return y.detach(), x.grad, m.weight.grad, m.bias.grad

    before = (set(f._fast), set(f._bfast))
    first = step()
    new_fwd, new_bwd = set(f._fast) - before[0], set(f._bfast) - before[1]
    assert len(new_fwd) == 1 and len(new_bwd) == 1  # this shape's keys, installed by the validated first step
    calls = []

    def counted(table, key, tag):
        fast = table[key]

        def wrapper(*a):
            calls.append(tag)
            return fast(*a)

        table[key] = wrapper

    counted(f._fast, new_fwd.pop(), "forward")
    counted(f._bfast, new_bwd.pop(), "backward")
    second = step()
    assert calls == ["forward", "backward"]
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    ref = torch.nn.functional.layer_norm(x.double(), (257,), m.weight.double(), m.bias.double(), m.eps)
    assert (second[0].double() - ref).abs().max().item() < 1e-5
