"""normc.torch without a GPU: CPU tensors take the float64/float32 torch reference through the same autograd
plumbing the CUDA kernels use (the eager autograd.Function, the custom ops under torch.compile, and the public
NormFunction). Skipped where torch is not installed (CI installs only the test extras)."""

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
