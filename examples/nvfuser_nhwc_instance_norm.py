"""The nvFuser NHWC instance-norm case: (256, 128, 28, 28) in NCHW and NHWC, normc against PyTorch.

nvFuser's channels-last instance norm (NVIDIA/Fuser issue 443) is the classic case where the memory layout
decides the kernel: in NCHW each (n, c) plane is contiguous (lanes along the reduction: normc's *inner*
strategy); in NHWC the channels are contiguous and the reduction strides over them (lanes along the
channels, rows over y-threads: normc's *outer* strategy). This prints, for float32 and float16 and both
layouts, the plan normc picked, its error against a float64 reference, and the time of normc and of
``torch.nn.functional.instance_norm`` (median of ``triton.testing.do_bench`` when triton is installed,
else CUDA events), with the copy-bandwidth floor (bytes read + written at the measured copy bandwidth).

    python examples/nvfuser_nhwc_instance_norm.py                 # on a GPU
    python examples/nvfuser_nhwc_instance_norm.py --shape 2,8,6,6 # without a GPU: tiny, on the simulator
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import normc

SPEC = normc.spec("n c h w : norm over h w ; scale c ; shift c", eps=1e-5)


def bench(fn, reps=100):
    """Median milliseconds of ``fn()`` on the GPU (triton's do_bench, else CUDA events)."""
    try:
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=reps, return_mode="median")
    except ImportError:
        from _compare import step_times  # examples/_compare.py: CUDA-event medians

        return step_times([fn], iters=reps)[0]


def copy_bandwidth():
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus written."""
    import torch

    src = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3)


def run_gpu(shape):
    import torch

    torch.manual_seed(0)
    N, C, H, W = shape
    bw = copy_bandwidth()
    print(f"x: {shape} (N, C, H, W); copy bandwidth {bw / 1e12:.2f} TB/s (read + write)")
    print(f"{'dtype':8s} {'layout':6s} {'normc plan':18s} {'err':>8s} {'normc us':>9s} {'torch us':>9s} "
          f"{'floor us':>9s} {'speedup':>8s}")
    for dtype in (torch.float32, torch.float16):
        w = (torch.rand(C, device="cuda") + 0.5).to(dtype)
        b = (torch.randn(C, device="cuda") * 0.1).to(dtype)
        base = torch.randn(shape, device="cuda").to(dtype)
        for layout, x in (("NCHW", base.contiguous()), ("NHWC", base.to(memory_format=torch.channels_last))):
            f = normc.compile(SPEC)  # one specialization per callable: its plan is the only entry
            y = f(x, w, b)
            ref = torch.nn.functional.instance_norm(x.double(), weight=w.double(), bias=b.double(), eps=1e-5)
            err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
            plan = next(iter(f._table.values())).plan
            t_normc = bench(lambda: f(x, w, b)) * 1e3
            t_torch = bench(lambda: torch.nn.functional.instance_norm(x, weight=w, bias=b, eps=1e-5)) * 1e3
            floor = 2 * x.numel() * x.element_size() / bw * 1e6
            same = y.stride() == x.stride()
            print(f"{str(dtype).replace('torch.', ''):8s} {layout:6s} {plan.strategy + '/' + plan.schedule:18s} "
                  f"{err:8.1e} {t_normc:9.1f} {t_torch:9.1f} {floor:9.1f} {t_torch / t_normc:7.2f}x"
                  + ("" if same else "  (y layout differs!)"))
            del y, ref
        torch.cuda.empty_cache()


def run_sim(shape):
    N, C, H, W = shape
    rng = np.random.default_rng(0)
    w = (rng.random(C) + 0.5).astype(np.float32)
    b = (rng.standard_normal(C) * 0.1).astype(np.float32)
    base = rng.standard_normal(shape).astype(np.float32)
    print(f"x: {shape} (N, C, H, W) float32 on Numba's CUDA simulator (no GPU: no timings against torch)")
    for layout, x in (("NCHW", base), ("NHWC", np.ascontiguousarray(base.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2))):
        f = normc.compile(SPEC)
        t0 = time.perf_counter()
        y = f(x, w, b)
        dt = time.perf_counter() - t0
        xd = x.astype(np.float64)
        ref = (xd - xd.mean((2, 3), keepdims=True)) / np.sqrt(xd.var((2, 3), keepdims=True) + 1e-5)
        ref = ref * w[None, :, None, None] + b[None, :, None, None]
        plan = next(iter(f._table.values())).plan
        print(f"{layout}: normc {plan.strategy}/{plan.schedule}  max|err|/max|ref| = "
              f"{np.abs(y - ref).max() / np.abs(ref).max():.1e}  simulator time {dt:.1f} s  "
              f"y keeps layout: {y.strides == x.strides}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default=None, help="N,C,H,W (default 256,128,28,28 on a GPU, 2,8,6,6 without)")
    a = ap.parse_args()
    from normc.runtime import gpu_available

    try:
        import torch

        gpu = gpu_available() and torch.cuda.is_available()
    except ImportError:
        gpu = False
    if gpu:
        run_gpu(tuple(int(s) for s in (a.shape or "256,128,28,28").split(",")))
    else:
        run_sim(tuple(int(s) for s in (a.shape or "2,8,6,6").split(",")))


if __name__ == "__main__":
    main()
