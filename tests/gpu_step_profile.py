"""Where a normc.torch training step spends its time (on a GPU): cProfile of forward+backward steps of
normc.torch.LayerNorm next to torch.nn.LayerNorm, and each step's kernels from the torch profiler.

    python tests/gpu_step_profile.py [--shape 256,1024] [--steps 300]
"""

import argparse
import cProfile
import pstats
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="256,1024")
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    import normc.torch

    shape = tuple(int(s) for s in a.shape.split(","))
    x = torch.randn(*shape, device="cuda", requires_grad=True)
    dy = torch.randn(*shape, device="cuda")
    mods = {"normc": normc.torch.LayerNorm(shape[-1]).cuda(), "torch": torch.nn.LayerNorm(shape[-1]).cuda()}
    for name, m in mods.items():
        def step():
            m(x).backward(dy)

        for _ in range(20):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        print(f"{name}: {(t1 - t0) / a.steps * 1e6:.1f} us/step issued, {(t2 - t0) / a.steps * 1e6:.1f} us/step "
              f"with the final sync")
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
        if name == "normc":
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(a.steps):
                step()
            pr.disable()
            torch.cuda.synchronize()
            pstats.Stats(pr).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
