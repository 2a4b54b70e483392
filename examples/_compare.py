"""Shared helpers of the backward examples: run a torch model and its normc conversion on the same input,
compare outputs and gradients, time training steps (CUDA events). Needs a CUDA GPU and torch."""

import copy
import time


def max_rel(a, b):
    """max|a - b| / max(max|b|, 1) in float64."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / max(float(b.abs().max()), 1.0))


def step_time(fn, iters=10):
    """Median milliseconds of ``fn()`` over ``iters`` runs after 3 warm-ups, timed with CUDA events."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def compare_models(ref, x, loss_fn, autocast_dtype=None, iters=10, label="model"):
    """Forward + backward of ``ref`` and of ``normc.torch.convert(deepcopy(ref))`` on ``x``; prints errors and
    step times and returns the dict of errors."""
    import torch

    import normc.torch as nt

    mod = nt.convert(copy.deepcopy(ref))
    swapped = sum(type(m).__module__ == "normc.torch" for m in mod.modules())

    def step(m, xin):
        m.zero_grad(set_to_none=True)
        xin.grad = None
        with torch.autocast("cuda", dtype=autocast_dtype, enabled=autocast_dtype is not None):
            y = m(xin)
            loss = loss_fn(y)
        loss.backward()
        return y, loss

    x1 = x.detach().clone().requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    t0 = time.time()
    y1, l1 = step(ref, x1)
    y2, l2 = step(mod, x2)
    torch.cuda.synchronize()
    errs = {"y": max_rel(y2, y1), "loss": abs(float(l2) - float(l1)) / max(abs(float(l1)), 1e-30),
            "dx": max_rel(x2.grad, x1.grad)}
    pe = [max_rel(p2.grad, p1.grad) for p1, p2 in zip(ref.parameters(), mod.parameters()) if p1.grad is not None]
    errs["param grads (max)"] = max(pe) if pe else 0.0
    print(f"{label}: {swapped} normalization modules replaced by normc.torch; first step {time.time() - t0:.1f} s "
          f"(includes compiling)")
    print(f"  y layout kept: torch {_layout(y1)}, normc {_layout(y2)}")
    for k, v in errs.items():
        print(f"  max rel error {k:>18}: {v:.3e}")
    tr = step_time(lambda: step(ref, x1), iters)
    tn = step_time(lambda: step(mod, x2), iters)
    print(f"  training step (fwd+bwd): torch {tr:.2f} ms   normc {tn:.2f} ms")
    return errs


def _layout(t):
    import torch

    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
        return "channels_last"
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d) and not t.is_contiguous():
        return "channels_last_3d"
    return "contiguous" if t.is_contiguous() else "strided"
