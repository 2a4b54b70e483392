"""Where the time of a normc forward+backward goes, kernel by kernel (run on a GPU machine).

    python tests/gpu_profile_backward.py [--shape 8192,4096] [--dtype bfloat16] [--family layer|rms]

Runs the normc.torch module and torch's own (LayerNorm / RMSNorm) forward+backward under torch.profiler and
prints each GPU kernel's total time per step, then the wall time of one step with and without a CUDA graph,
and the kernel-only time of ``Compiled.backward`` (CUDA-graph replay).
"""

from __future__ import annotations

import argparse
import time


def kernel_table(prof, steps):
    rows = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            rows.setdefault(e.name[:90], [0.0, 0])
            rows[e.name[:90]][0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            rows[e.name[:90]][1] += 1
    total = 0.0
    for name, (us, n) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
        total += us
        print(f"    {us / steps:9.1f} us/step  x{n // steps:<3d} {name}")
    print(f"    {total / steps:9.1f} us/step  total GPU")


def main():
    import torch

    import normc
    import normc.torch as nt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8192,4096")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--family", default="layer", choices=["layer", "rms"])
    ap.add_argument("--cprofile", action="store_true", help="also profile normc's host side (cProfile)")
    a = ap.parse_args()
    T, D = (int(v) for v in a.shape.split(","))
    dt = getattr(torch, a.dtype)
    x = torch.randn(T, D, device="cuda", dtype=dt, requires_grad=True)
    dy = torch.randn(T, D, device="cuda", dtype=dt)
    if a.family == "layer":
        ref = torch.nn.LayerNorm(D, device="cuda", dtype=dt)
        mine = nt.LayerNorm(D, device="cuda", dtype=dt)
    else:
        ref = torch.nn.RMSNorm(D, device="cuda", dtype=dt)
        mine = nt.RMSNorm(D, device="cuda", dtype=dt)
    floor_bytes = T * D * x.element_size() * 5  # fwd: read x, write y; bwd: read x, dy, write dx
    for name, m in (("torch", ref), ("normc", mine)):
        def step():
            y = m(x)
            y.backward(dy)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        print(f"{name}: {a.family} {T}x{D} {a.dtype} forward+backward, kernels per step:")
        kernel_table(prof, 5)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 20 * 1e6
        print(f"    {wall:9.1f} us/step  wall (eager, synchronized at the end); floor {floor_bytes / 4.27e6:.1f} us")

    if a.cprofile:  # where the host time of normc's step goes
        import cProfile
        import pstats

        def steps():
            for _ in range(50):
                mine(x).backward(dy)
            torch.cuda.synchronize()

        pr = cProfile.Profile()
        pr.runcall(steps)
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)

    # Compiled.backward alone, CUDA-graph replay
    spec = normc.layer_norm() if a.family == "layer" else normc.rms_norm()
    f = normc.compile(spec)
    xd = x.detach()
    w = torch.ones(D, device="cuda", dtype=dt)
    b = torch.zeros(D, device="cuda", dtype=dt) if a.family == "layer" else None
    y, mean, rstd = f(xd, w, b, return_stats=True)
    f.backward(dy, xd, mean, rstd, w)
    torch.cuda.synchronize()
    import triton.testing as tt

    us_b = tt.do_bench_cudagraph(lambda: f.backward(dy, xd, mean, rstd, w)) * 1e3
    us_f = tt.do_bench_cudagraph(lambda: f(xd, w, b, return_stats=True)) * 1e3
    print(f"Compiled.backward alone (graph): {us_b:.1f} us; forward with stats (graph): {us_f:.1f} us; "
          f"backward floor {T * D * x.element_size() * 3 / 4.27e6:.1f} us")


if __name__ == "__main__":
    main()
