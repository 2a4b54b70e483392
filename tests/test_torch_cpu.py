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
