"""Host overhead of one eager normc call from Python, split into its parts (run on a GPU machine).

    python tests/gpu_overhead.py

Prints the median wall time per call (no synchronization) of: a full normc call on torch tensors (the cached
fast path: allocate y, launch), the same with return_stats and the backward (their own fast paths),
torch.empty_strided and torch.empty_like alone, the hot path's launcher alone (pointers prepared; normc's
cuLaunchKernel through cuda.bindings) against the bare cuLaunchKernel and cuda.core's launch of the same cubin,
the hot path's key and its parts, torch.nn.functional.layer_norm and torch.add (one torch op) for comparison,
and one forward+backward step of normc.torch.LayerNorm against torch.nn.LayerNorm (host time per training
step of one layer).
"""

import time


def per_call(fn, n=2000, reps=5):
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best.append((time.perf_counter() - t0) / n * 1e6)
    best.sort()
    return best[len(best) // 2]


def main():
    import torch

    import normc
    from normc.runtime import gpu

    x = torch.randn(256, 1024, device="cuda")
    w = torch.randn(1024, device="cuda")
    b = torch.randn(1024, device="cuda")
    f = normc.compile(normc.layer_norm())
    f(x, w, b)
    f(x, w, b)
    torch.cuda.synchronize()
    (entry,) = f._table.values()
    k = entry.kernels[0]
    from cuda.core import LaunchConfig, ObjectCode, Stream, launch

    from normc.runtime import compiled_kernels

    cc = gpu.device_cc(0)
    (kd,) = compiled_kernels(entry.plan, cc)
    core_kernel = ObjectCode.from_cubin(kd["cubin"]).get_kernel(kd["entry"])
    core_config = LaunchConfig(grid=k.grid, block=k.block)
    s = Stream.from_handle(torch.cuda.current_stream().cuda_stream)
    y = torch.empty_like(x)
    sh = torch.cuda.current_stream().cuda_stream
    xp, yp, wp, bp = x.data_ptr(), y.data_ptr(), w.data_ptr(), b.data_ptr()
    _, mean, rstd = f(x, w, b, return_stats=True)
    dy = torch.randn_like(x)
    f.backward(dy, x, mean, rstd, w)

    import normc.torch
    from normc.runtime import _tkey, _torch_raw_stream, _torch_tensor_type

    from cuda.bindings.driver import CUstream, cuLaunchKernel as bare

    tt = _torch_tensor_type()
    cs = CUstream(sh)
    raw_stream = _torch_raw_stream()

    xg = x.clone().requires_grad_(True)
    mods = {"normc": normc.torch.LayerNorm(1024).cuda(), "torch": torch.nn.LayerNorm(1024).cuda()}

    def step(m):
        m(xg).backward(dy)

    rows = {
        "normc call (torch in/out)": lambda: f(x, w, b),
        "normc call, return_stats": lambda: f(x, w, b, return_stats=True),
        "normc backward": lambda: f.backward(dy, x, mean, rstd, w),
        "torch.empty_strided": lambda: torch.empty_strided((256, 1024), (1024, 1), dtype=torch.float32, device="cuda"),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "cuda.core launch (same cubin)": lambda: launch(s, core_config, core_kernel, x.data_ptr(), y.data_ptr(),
                                                        w.data_ptr(), b.data_ptr(), 0, 0, 0),
        "launcher (raw stream int)": lambda: k.launcher(sh, xp, yp, wp, bp, 0, 0, 0),
        "bare cuLaunchKernel": lambda: bare(k.function, k.grid, 1, 1, k.block, 1, 1, 0, cs, k._params_ptr, 0),
        "hot-path key (3 tensors)": lambda: (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15,
                                             _tkey(w, tt), _tkey(b, tt), False),
        "x.device": lambda: x.device,
        "x.get_device()": lambda: x.get_device(),
        "x.shape, x.stride()": lambda: (x.shape, x.stride()),
        "torch current raw stream": lambda: raw_stream(0),
        "torch layer_norm": lambda: torch.nn.functional.layer_norm(x, (1024,), w, b),
        "torch add (one tiny op)": lambda: torch.add(w, b),
        "normc.torch LayerNorm fwd+bwd": lambda: step(mods["normc"]),
        "torch.nn.LayerNorm fwd+bwd": lambda: step(mods["torch"]),
    }
    for name, fn in rows.items():
        us = per_call(fn)
        torch.cuda.synchronize()
        print(f"{name:30s} {us:6.2f} us/call")


if __name__ == "__main__":
    main()
