"""Where a normc.torch training step spends its time (on a GPU): cProfile of forward+backward steps of
normc.torch.LayerNorm next to torch.nn.LayerNorm, and each step's kernels from the torch profiler; with
``--split``, instead, the host time of a step split with timers into normc's forward and backward calls, its
autograd.Function's methods, and the rest (torch's autograd machinery, measured alone as a bare Function that
only allocates its outputs).

    python tests/gpu_step_profile.py [--shape 256,1024] [--steps 300] [--dtype bfloat16] [--split]
"""

import argparse
import cProfile
import pstats
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="256,1024")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--split", action="store_true", help="split the host time with timers (see above)")
    a = ap.parse_args(argv)
    if a.split:
        return split_host_time(tuple(int(s) for s in a.shape.split(",")), a.dtype, a.steps)
    import torch
    from torch.profiler import ProfilerActivity, profile

    import normc.torch

    shape = tuple(int(s) for s in a.shape.split(","))
    dt = getattr(torch, a.dtype)
    x = torch.randn(*shape, device="cuda", dtype=dt, requires_grad=True)
    dy = torch.randn(*shape, device="cuda", dtype=dt)
    mods = {"normc": normc.torch.LayerNorm(shape[-1]).cuda().to(dt),
            "torch": torch.nn.LayerNorm(shape[-1]).cuda().to(dt)}
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


def split_host_time(shape, dtype, steps):
    """Print the host us per LayerNorm forward+backward step of torch and normc, normc's split into its
    runtime calls (``Compiled.__call__``, ``Compiled.backward``) and the normc.torch Function's methods that
    make them, and a bare ``autograd.Function`` step (torch's machinery for any Python Function)."""
    import collections

    import torch

    import normc.torch as nt
    from normc.runtime import Compiled

    spent = collections.defaultdict(float)

    def timed(name, fn):
        def wrapper(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                spent[name] += time.perf_counter() - t
        return wrapper

    eager = nt._EagerNorm
    saved = (eager.forward, eager.backward, Compiled.__call__, Compiled.backward)
    eager.forward = staticmethod(timed("Function.forward", eager.forward))
    eager.backward = staticmethod(timed("Function.backward", eager.backward))
    Compiled.__call__ = timed("Compiled.__call__", Compiled.__call__)
    Compiled.backward = timed("Compiled.backward", Compiled.backward)

    class Bare(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            ctx.save_for_backward(x, w)
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            return torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)

    try:
        dt = getattr(torch, dtype)
        x = torch.randn(*shape, device="cuda", dtype=dt, requires_grad=True)
        dy = torch.randn(*shape, device="cuda", dtype=dt)
        mods = {"torch": torch.nn.LayerNorm(shape[-1]).cuda().to(dt),
                "normc": nt.LayerNorm(shape[-1]).cuda().to(dt)}

        def step(m):
            x.grad = m.weight.grad = m.bias.grad = None
            m(x).backward(dy)

        def bare():
            x.grad = None
            Bare.apply(x, mods["normc"].weight, mods["normc"].bias).backward(dy)

        for rnd in range(2):  # the second round is the one to read: the first can include warm-up effects
            for name, fn in (("torch", lambda: step(mods["torch"])), ("normc", lambda: step(mods["normc"])),
                             ("bare Function", bare)):
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
                spent.clear()
                t0 = time.perf_counter()
                for _ in range(steps):
                    fn()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                parts = "  ".join(f"{k} {v / steps * 1e6:.1f}" for k, v in spent.items())
                print(f"round {rnd} {name:>13}: host {(t1 - t0) / steps * 1e6:6.1f} us/step, "
                      f"wall {(t2 - t0) / steps * 1e6:6.1f}  {parts}")
    finally:
        eager.forward, eager.backward = staticmethod(saved[0]), staticmethod(saved[1])
        Compiled.__call__, Compiled.backward = saved[2], saved[3]


if __name__ == "__main__":
    main()
