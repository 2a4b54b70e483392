"""normc.torch without a GPU: CPU tensors take the float64/float32 torch reference through the same autograd
plumbing the CUDA kernels use (the eager autograd.Function, the custom ops under torch.compile, and the public
NormFunction). Skipped where torch is not installed (CI installs only the test extras)."""

import re

import pytest

torch = pytest.importorskip("torch")

import normc  # noqa: E402
import normc.torch as nt  # noqa: E402


def _args(d=8, t=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(t, d, dtype=torch.float64, generator=g, requires_grad=True)
    w = (1 + 0.1 * torch.randn(d, dtype=torch.float64, generator=g)).requires_grad_()
    b = torch.randn(d, dtype=torch.float64, generator=g, requires_grad=True)
    return x, w, b


@pytest.mark.parametrize("spec", [normc.layer_norm(), normc.rms_norm()], ids=["layer", "rms"])
def test_normalize_and_norm_function_gradcheck(spec):
    x, w, b = _args()
    b = b if spec.shift is not None else None
    params = (x, w) if b is None else (x, w, b)
    assert torch.autograd.gradcheck(lambda *a: nt.normalize(a[0], spec, *a[1:]), params)
    assert torch.autograd.gradcheck(lambda *a: nt.NormFunction.apply(a[0], a[1], b if len(a) == 2 else a[2], spec),
                                    params)


def test_modules_match_torch_eager_and_compiled():
    x, _, _ = _args(d=16, t=5)
    mine, ref = nt.LayerNorm(16, dtype=torch.float64), torch.nn.LayerNorm(16, dtype=torch.float64)
    dy = torch.randn(5, 16, dtype=torch.float64)
    y, y_ref = mine(x), ref(x)
    torch.testing.assert_close(y, y_ref)
    g = torch.autograd.grad(y, (x, mine.weight, mine.bias), dy)
    g_ref = torch.autograd.grad(y_ref, (x, ref.weight, ref.bias), dy)
    for a, r in zip(g, g_ref):
        torch.testing.assert_close(a, r)
    _, mean, rstd = nt.normalize(x, normc.layer_norm(), mine.weight, mine.bias, return_stats=True)
    assert not mean.requires_grad and not rstd.requires_grad
    compiled = torch.compile(lambda a: nt.normalize(a, normc.layer_norm(), mine.weight, mine.bias), fullgraph=True)
    torch.testing.assert_close(compiled(x), y_ref)


def test_fast_path_key_takes_parameters_not_other_subclasses():
    """The torch hot paths key on plain tensors and on nn.Parameter (a module's weight and bias); other
    Tensor subclasses may override what the key reads, so they get no key (the validating path)."""
    from normc.runtime import _tkey, _torch_tensor_type

    tt = _torch_tensor_type()
    assert tt is torch.Tensor
    w = torch.nn.Parameter(torch.ones(6, 2)[:, 0])
    assert _tkey(w, tt) == ((6,), (2,), torch.float32, w.device, w.data_ptr() & 15)
    assert _tkey(torch.ones(3), tt)[0] == (3,)

    class Sub(torch.Tensor):
        pass

    assert _tkey(torch.ones(3).as_subclass(Sub), tt) is False
    assert _tkey(None, tt) is None


def test_unused_statistics_get_no_materialized_gradients():
    """normalize(..., return_stats=True): a loss of y alone, or of y and a function of the (non-differentiable)
    statistics, gives the same gradients as the reference; the backward is not handed zero tensors for mean
    and rstd (set_materialize_grads(False))."""
    spec = normc.layer_norm()
    x, w, b = _args()
    y, mean, rstd = nt.normalize(x, spec, w, b, return_stats=True)
    (y * y).sum().backward()
    ref = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    xr = x.detach().clone().requires_grad_()
    wr, br = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    yr = torch.nn.functional.layer_norm(xr, (x.shape[-1],), wr, br, eps=spec.eps)
    (yr * yr).sum().backward()
    for got, want in zip(ref, (xr.grad, wr.grad, br.grad)):
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-9)
    assert not mean.requires_grad and not rstd.requires_grad


def test_simulator_takes_torch_cpu_params_and_out():
    """On the simulator (no GPU), torch CPU tensors as scale, shift and out are read as numpy views (they used
    to crash in the simulator with AttributeError); a torch CPU x is refused with a hint, bfloat16 params with
    an ArgumentError naming them."""
    import numpy as np

    from normc.runtime import gpu_available

    if gpu_available():
        pytest.skip("the simulator runs only without a GPU")
    f = normc.compile(normc.instance_norm())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 4, 4)).astype(np.float32)
    w, b = torch.rand(8) + 0.5, torch.randn(8)
    xd = x.astype(np.float64)
    m, v = xd.mean((2, 3), keepdims=True), xd.var((2, 3), keepdims=True)
    ref = (xd - m) / np.sqrt(v + 1e-5) * w.double().numpy()[:, None, None] + b.double().numpy()[:, None, None]
    y = f(x, w, b)
    assert np.abs(y - ref).max() < 1e-5
    out = torch.full((2, 8, 4, 4), float("nan"))
    f(x, w, b, out=out)
    assert np.abs(out.double().numpy() - ref).max() < 1e-5
    with pytest.raises(normc.ArgumentError, match=r"x is a host torch array.*x\.numpy\(\)"):
        f(torch.from_numpy(x), w, b)
    with pytest.raises(normc.ArgumentError, match="scale is a host array"):
        f(x, w.bfloat16(), b)


def test_simulator_backward_takes_a_torch_cpu_dy_in_any_layout():
    """A torch CPU dy (read as a numpy view) in x's layout or another one gives the same dx (the relayout copy
    used to call torch.empty_strided with a numpy dtype)."""
    import numpy as np

    from normc.runtime import gpu_available

    if gpu_available():
        pytest.skip("the simulator runs only without a GPU")
    f = normc.compile(normc.layer_norm())
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w, b = np.ones(8, np.float32), np.zeros(8, np.float32)
    _, m, r = f(x, w, b, return_stats=True)
    dy = rng.standard_normal((4, 8)).astype(np.float32)
    want = f.backward(dy, x, m, r, w)[0]
    for t in (torch.from_numpy(dy.copy()), torch.from_numpy(dy.T.copy()).t()):
        got = f.backward(t, x, m, r, w)[0]
        assert isinstance(got, np.ndarray) and np.array_equal(got, want)


# Break-test findings (2026-12-04): each of these gave a wrong number or a raw error before.

def test_layer_and_rms_norm_check_the_normalized_shape():
    """A LayerNorm(8) on (4, 16) normalized the last 16 values silently; torch refuses it."""
    for m in (nt.LayerNorm(8, elementwise_affine=False), nt.RMSNorm(8), nt.LayerNorm((16, 4))):
        with pytest.raises(normc.ArgumentError, match="normalized_shape"):
            m(torch.randn(4, 16))


@pytest.mark.parametrize("make, ref, shape", [
    (lambda: nt.LayerNorm(5, dtype=torch.float64), lambda: torch.nn.LayerNorm(5, dtype=torch.float64), (3, 5)),
    (lambda: nt.RMSNorm(5, dtype=torch.float64), lambda: torch.nn.RMSNorm(5, dtype=torch.float64), (3, 5)),
    (lambda: nt.BatchNorm2d(3, dtype=torch.float64), lambda: torch.nn.BatchNorm2d(3, dtype=torch.float64),
     (4, 3, 2, 2)),
    (lambda: nt.GroupNorm(2, 4, dtype=torch.float64), lambda: torch.nn.GroupNorm(2, 4, dtype=torch.float64),
     (2, 4, 3, 3)),
], ids=["layer", "rms", "batch", "group"])
def test_double_backward_matches_torch(make, ref, shape):
    """create_graph=True: second derivatives through mean and rstd (they were taken as constants: off by 10)."""
    a, t = make(), ref()
    with torch.no_grad():
        for p in t.parameters():
            p.uniform_(0.5, 1.5)
    a.load_state_dict(t.state_dict())
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    out = []
    for m in (a, t):
        params = [x] + list(m.parameters())
        gs = torch.autograd.grad((m(x) ** 3).sum(), params, create_graph=True)
        out.append(gs + torch.autograd.grad(sum(g.square().sum() for g in gs), params))
    for p, q in zip(*out):
        assert torch.allclose(p, q, rtol=1e-9, atol=1e-9)
    assert torch.autograd.gradgradcheck(lambda z: a(z), (torch.randn(*shape, dtype=torch.float64,
                                                                      requires_grad=True),))


def test_torch_compile_with_dynamic_shapes():
    """The fake implementations took symbolic sizes for a bad shape (a second batch size recompiles with
    dynamic shapes): TorchRuntimeError."""
    m = nt.LayerNorm(8)
    c = torch.compile(m, backend="aot_eager")
    for t in (4, 6, 7):
        x = torch.randn(t, 8)
        assert torch.allclose(c(x), torch.nn.functional.layer_norm(x, (8,), m.weight, m.bias), atol=1e-5)
    g = nt.GroupNorm(2, 4)
    x = torch.randn(3, 4, 5, 5)
    y = torch.compile(g, dynamic=True, backend="aot_eager")(x)
    assert torch.allclose(y, torch.nn.functional.group_norm(x, 2, g.weight, g.bias), atol=1e-5)


def test_degenerate_batches_as_torch():
    """An empty batch left NaN running statistics; one value per channel (batch norm) or per instance
    returned zeros and pulled running_var toward 0: torch refuses both."""
    m, t = nt.BatchNorm1d(4), torch.nn.BatchNorm1d(4)
    m(torch.randn(0, 4))
    t(torch.randn(0, 4))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(m, name), getattr(t, name)), name
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        nt.BatchNorm2d(4)(torch.randn(1, 4, 1, 1))
    with pytest.raises(ValueError, match="more than 1 spatial element"):
        nt.InstanceNorm1d(4)(torch.randn(2, 4, 1))


@pytest.mark.parametrize("make, ref, shape", [
    (lambda k: nt.BatchNorm2d(4, **k), lambda k: torch.nn.BatchNorm2d(4, **k), (3, 4, 2, 2)),
    (lambda k: nt.GroupNorm(2, 4, **k), lambda k: torch.nn.GroupNorm(2, 4, **k), (3, 4, 2, 2)),
    (lambda k: nt.InstanceNorm1d(4, affine=True, **k), lambda k: torch.nn.InstanceNorm1d(4, affine=True, **k),
     (3, 4, 6)),
], ids=["batch", "group", "instance"])
def test_channel_norms_without_bias(make, ref, shape):
    """bias=False (torch's keyword) gave the spec a shift anyway: AttributeError on None."""
    import inspect

    if "bias" not in inspect.signature(torch.nn.GroupNorm.__init__).parameters:
        pytest.skip("this torch's channel norms have no bias argument")
    a, t = make({"bias": False}), ref({"bias": False})
    with torch.no_grad():
        t.weight.uniform_(0.5, 1.5)
    a.load_state_dict(t.state_dict())
    x = torch.randn(*shape, requires_grad=True)
    ya, yt = a(x), t(x)
    assert torch.allclose(ya, yt, atol=1e-5)
    ga = torch.autograd.grad(ya.square().sum(), (x, a.weight))
    gt = torch.autograd.grad(yt.square().sum(), (x, t.weight))
    for p, q in zip(ga, gt):
        assert torch.allclose(p, q, atol=1e-4)


def test_normalize_names_bad_arguments():
    x = torch.randn(2, 8)
    ln = "t d : norm over d ; scale d ; shift d"
    cases = [
        (lambda: nt.normalize(x, ln), "weight is required"),
        (lambda: nt.normalize(x, "t d : norm over d ; scale d", torch.ones(7)), "weight has 7 elements"),
        (lambda: nt.normalize(x, "t d : norm over d", torch.ones(8)), "weight was given"),
        (lambda: nt.normalize(x, "t d : norm over d ; scale d", torch.ones(8, dtype=torch.int64)), "dtype"),
        (lambda: nt.normalize(torch.randint(0, 9, (2, 8)), "t d : norm over d"), "floating-point"),
        (lambda: nt.normalize(x.numpy(), "t d : norm over d"), "torch.Tensor"),
        (lambda: nt.normalize(x, None), "spec"),
        # a transposed 2-D weight: the same check as the kernels' path (it scaled the wrong elements, silently)
        (lambda: nt.normalize(torch.randn(2, 3, 4, 5), "n c h w : norm over h w ; scale h w", torch.ones(5, 4)),
         re.escape("weight has shape (5, 4); expected (4, 5)")),
    ]
    for call, words in cases:
        with pytest.raises(normc.ArgumentError, match=words):
            call()


def test_custom_ops_pass_opcheck():
    """The fake implementations agree with the real ones (shapes, dtypes; symbolic sizes under
    aot_dispatch_dynamic). norm_backward has no autograd formula of its own (no double backward under
    torch.compile), so its check leaves that test out; a gradient not asked for was typed differently by
    the fake (weight's dtype) and the real op (x's)."""
    x, w, b = _args()
    x, w, b = x.float().detach().requires_grad_(), w.float().detach().requires_grad_(), b.float().detach()
    args = nt._spec_args("t d : norm over d ; scale d ; shift d")
    torch.library.opcheck(torch.ops.normc.norm.default, (x, w, b.requires_grad_(), *args))
    _, m, r = torch.ops.normc.norm(x, w, b, *args)
    dy = torch.randn_like(x)
    for need in (True, False):
        torch.library.opcheck(torch.ops.normc.norm_backward.default,
                              (dy, x.detach(), m, r, w.detach().half(), *args, need, need, None),
                              test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_rms_norm_default_eps_is_torchs(dtype):
    """RMSNorm(eps=None): the machine epsilon of the type torch computes in (float32 for 16-bit x)."""
    x = torch.full((2, 8), 1e-3, dtype=dtype)
    want = torch.nn.RMSNorm(8, dtype=dtype)(x)
    got = nt.RMSNorm(8, dtype=dtype)(x)
    assert got.dtype == want.dtype
    assert torch.allclose(got.double(), want.double(), rtol=1e-2, atol=0)


def test_convert_refuses_a_non_module():
    with pytest.raises(normc.ArgumentError, match=r"model is a int; expected a torch.nn.Module"):
        nt.convert(5)
