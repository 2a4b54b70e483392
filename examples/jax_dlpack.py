"""normc on JAX arrays, passed directly (DLPack), with no copies and no host synchronization.

JAX arrays are immutable and produced asynchronously on JAX's own streams. normc reads them through DLPack
and does the protocol's stream handshake: ``x.__dlpack__(stream=s)`` makes normc's stream ``s`` wait for the
work that produces x. The result is a Numba device array naming no stream (JAX's import rejects arrays that
name a stream JAX did not create): after ``s.synchronize()``, ``jnp.asarray(y)`` wraps it without a copy.
Prints the plan, the error against a float64 reference computed with numpy, and whether memory was shared.

With no GPU (and JAX on the CPU), the same call runs on Numba's CUDA simulator: normc reads the JAX CPU
arrays as numpy views (DLPack again) and returns numpy arrays; the shapes are shrunk so that it stays quick.

    python examples/jax_dlpack.py            # a GPU with jax[cuda], or the simulator with jax on the CPU
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with normc's allocations


def main():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print("jax is not installed: nothing to show (pip install jax; 'jax[cuda13]' on a machine with a GPU)")
        return 0
    import numpy as np

    import normc
    from normc.runtime import gpu_available

    jax_gpu = any(d.platform == "gpu" for d in jax.devices())
    on_gpu = gpu_available()
    if on_gpu and not jax_gpu:
        print(f"a GPU is present but jax sees none (devices: {jax.devices()}): normc needs JAX's arrays on the "
              f"GPU there (pip install 'jax[cuda13]'); nothing to show")
        return 0

    T, D = (4096, 1000) if on_gpu else (8, 100)
    spec = normc.spec("t d : norm over d ; scale d ; shift d")
    # normc allocates bfloat16 outputs only for torch and numpy: a bfloat16 JAX x gets a float32 y
    f = normc.compile(spec, out_dtype="float32")
    k1, k2 = jax.random.split(jax.random.key(0))
    x = (3.0 + jax.random.normal(k1, (T, D), dtype=jnp.float32)).astype(jnp.bfloat16)
    w = 1.0 + 0.1 * jax.random.normal(k2, (D,), dtype=jnp.float32)
    b = jnp.linspace(-1.0, 1.0, D, dtype=jnp.float32)

    if on_gpu:
        from numba import cuda

        s = cuda.stream()  # normc's stream
        y_nc, mean_nc, rstd_nc = f(x, w, b, return_stats=True, stream=s)  # JAX's pending work on x, w, b first
        s.synchronize()  # JAX cannot be told to wait for a stream it did not create
        y, mean = jnp.asarray(y_nc), jnp.asarray(mean_nc)  # zero-copy jax.Arrays
        cai = y_nc.__cuda_array_interface__
        where = f"GPU, normc stream {int(s.handle):#x}"
        how = f"jnp.asarray(y) shares its memory (no copy): {cai['data'][0] == y.unsafe_buffer_pointer()}"
    else:
        y_nc, mean_nc, rstd_nc = f(x, w, b, return_stats=True)  # simulator: numpy in (from DLPack), numpy out
        y, mean = jnp.asarray(y_nc), jnp.asarray(mean_nc)
        where = "simulator"
        how = "jnp.asarray(y) copies it into JAX (host memory)"

    xn = np.asarray(x.astype(jnp.float32), dtype=np.float64)
    m = xn.mean(-1, keepdims=True)
    ref = (xn - m) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5) * np.asarray(w) + np.asarray(b)
    err = float(np.abs(np.asarray(y) - ref).max() / np.abs(ref).max())
    plan = next(iter(f._table.values())).plan
    print(f"x: jax {x.dtype} {x.shape} on {x.devices()}; scale/shift float32 ({where})")
    print(f"normc plan: {plan.strategy}/{plan.schedule} vec={plan.vec}; normc returned a "
          f"{type(y_nc).__module__}.{type(y_nc).__name__}; {how}")
    print(f"y: {type(y).__module__}.{type(y).__name__} {y.dtype} {y.shape}; max|y - ref|/max|ref| = {err:.1e}; "
          f"mean err = {float(np.abs(np.asarray(mean) - m[:, 0]).max()):.1e}")
    # the same y flows on through jitted JAX code
    loss = jax.jit(lambda t: (t.astype(jnp.float32) ** 2).mean())(y)
    print(f"jax.jit on normc's output: mean(y^2) = {float(loss):.4f}")
    return 0 if err < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
