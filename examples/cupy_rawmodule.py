"""Load normc's PTX with CuPy's RawModule and launch it by hand (no normc runtime involved).

normc plans and compiles a layer norm for one shape; the PTX is written to a file, loaded by
``cupy.RawModule(path=...)``, and each kernel is launched with the seven pointer arguments every normc kernel
takes (x, out, scale, shift, mean, rstd, workspace; null where unused), on a 1-D grid, in launch order.
(A plan that uses thread-block clusters, ``LoweredKernel.cluster > 1``, needs a cluster launch, which
RawKernel does not offer.)

    python examples/cupy_rawmodule.py          # needs a CUDA GPU and CuPy
"""

import os
import tempfile

import numpy as np

import normc
from normc.lowering import lower


def main():
    import cupy

    T, D = 4096, 1000
    spec = normc.spec("t d : norm over d ; scale d ; shift d")
    cc = cupy.cuda.Device().compute_capability  # e.g. "90"
    plan = normc.plan(spec, (T, D), "float32", stats=True, arch=f"sm_{cc}")
    kernels = lower(plan)
    if any(k.cluster > 1 for k in kernels):  # not for this shape; plans of very long reductions use clusters
        raise SystemExit("this plan launches thread-block clusters, which cupy.RawKernel cannot do: use the "
                         "driver API (examples/ptx_driver_api) or normc.compile")
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((T, D), dtype=np.float32) * 2 + 0.5)
    w = cupy.asarray(rng.random(D, dtype=np.float32) + 0.5)
    b = cupy.asarray(rng.standard_normal(D, dtype=np.float32))
    y = cupy.empty_like(x)
    mean = cupy.empty(T, cupy.float32)
    rstd = cupy.empty(T, cupy.float32)
    ws = cupy.empty(max(plan.workspace_floats, 1), cupy.float32)
    with tempfile.TemporaryDirectory() as d:
        for i, k in enumerate(kernels):
            path = os.path.join(d, f"k{i}.ptx")
            with open(path, "w") as f:
                f.write(k.ptx)
            fn = cupy.RawModule(path=path).get_function(k.entry)
            fn((k.grid,), (k.block,), (x, y, w, b, mean, rstd, ws))
    cupy.cuda.Device().synchronize()
    xd = cupy.asnumpy(x).astype(np.float64)
    mu = xd.mean(1, keepdims=True)
    ref = (xd - mu) / np.sqrt(xd.var(1, keepdims=True) + 1e-5) * cupy.asnumpy(w) + cupy.asnumpy(b)
    err = np.abs(cupy.asnumpy(y) - ref).max() / np.abs(ref).max()
    print(f"plan: {plan.strategy}/{plan.schedule}, {len(kernels)} kernel(s), grid {kernels[0].grid} x block "
          f"{kernels[0].block}, sm_{cc}")
    print(f"CuPy RawModule launch: max|y - ref|/max|ref| = {err:.1e}; "
          f"max|mean - ref| = {np.abs(cupy.asnumpy(mean) - mu[:, 0]).max():.1e}")


if __name__ == "__main__":
    main()
