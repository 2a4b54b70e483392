"""Shared helpers of the backward examples: run a torch model and its normc conversion on the same input,
compare outputs and gradients, time training steps (CUDA events). Needs a CUDA GPU and torch."""

import copy
import importlib.util
import sys
import time


def require(script, skimage=False):
    """Exit with one message naming everything ``script`` lacks (torch with a CUDA GPU; scikit-image if
    ``skimage``) before it imports any of them, instead of failing on the first missing import."""
    needs = [("torch", "torch")] + ([("scikit-image", "skimage")] if skimage else [])  # (pip name, module)
    missing = [name for name, module in needs if importlib.util.find_spec(module) is None]
    if missing:
        sys.exit(f"{script} needs {' and '.join(missing)}: pip install {' '.join(missing)} (and a CUDA GPU)")
    import torch

    if not torch.cuda.is_available():
        sys.exit(f"{script} needs a CUDA GPU; torch sees none")


def max_rel(a, b):
    """max|a - b| / max(max|b|, 1) in float64."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / max(float(b.abs().max()), 1.0))


def step_times(fns, iters=20):
    """Median milliseconds of each of ``fns`` (one training step each) over ``iters`` rounds, timed with CUDA
    events after 3 warm-ups. The functions take turns within each round, so clock and thermal drift during
    the measurement falls on all of them alike."""
    import torch

    for _ in range(3):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    for _ in range(iters):
        for fn, t in zip(fns, times):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            t.append(a.elapsed_time(b))
    return [sorted(t)[len(t) // 2] for t in times]


def compare_models(ref, x, loss_fn, autocast_dtype=None, iters=30, label="model"):
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
    tr, tn = step_times([lambda: step(ref, x1), lambda: step(mod, x2)], iters)
    print(f"  training step (fwd+bwd), median of {iters} alternating: torch {tr:.2f} ms   normc {tn:.2f} ms "
          f"({tr / tn:.2f}x)")
    kr, kn = kernel_ms(lambda: step(ref, x1)), kernel_ms(lambda: step(mod, x2))
    print(f"  GPU kernel time per step (torch.profiler): torch {kr:.2f} ms   normc {kn:.2f} ms")
    return errs


def kernel_ms(fn, steps=3):
    """Milliseconds per ``fn()`` that the GPU spends in kernels, memcpys and memsets (torch.profiler's CUDA
    activity; launch gaps and host time excluded), averaged over ``steps`` calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    us = sum(e.device_time_total for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return us / steps / 1000


def _layout(t):
    import torch

    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
        return "channels_last"
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d) and not t.is_contiguous():
        return "channels_last_3d"
    return "contiguous" if t.is_contiguous() else "strided"
