"""normc on JAX arrays through DLPack: JAX -> torch (zero-copy) -> normc -> JAX (zero-copy).

JAX arrays are immutable and produced asynchronously on JAX's streams; DLPack's stream handshake orders
them: ``torch.from_dlpack(x)`` makes torch's current stream wait for JAX's work on x, normc launches on
torch's current stream, and ``jax.dlpack.from_dlpack(y)`` makes JAX wait for that stream. Nothing is copied.
Prints the plan, the error against a float64 reference computed with numpy and whether memory was shared.

    python examples/jax_dlpack.py            # needs a GPU, jax with CUDA, and torch
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch


def main():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print("jax is not installed: nothing to show (pip install 'jax[cuda13]' on a machine with a GPU)")
        return 0
    if not any(d.platform == "gpu" for d in jax.devices()):
        print(f"jax sees no GPU (devices: {jax.devices()}): normc needs CUDA arrays; nothing to show")
        return 0
    try:
        import torch
    except ImportError:
        print("this example bridges through torch's DLPack (torch.from_dlpack); torch is not installed")
        return 0
    import numpy as np

    import normc

    T, D = 4096, 1000
    spec = normc.spec("t d : norm over d ; scale d ; shift d")
    f = normc.compile(spec)
    k1, k2 = jax.random.split(jax.random.key(0))
    x = (3.0 + jax.random.normal(k1, (T, D), dtype=jnp.float32)).astype(jnp.bfloat16)
    w = 1.0 + 0.1 * jax.random.normal(k2, (D,), dtype=jnp.float32)
    b = jnp.linspace(-1.0, 1.0, D, dtype=jnp.float32)

    xt, wt, bt = (torch.from_dlpack(a) for a in (x, w, b))        # zero-copy views, ordered after JAX
    yt, mean_t, rstd_t = f(xt, wt, bt, return_stats=True)        # launched on torch's current stream
    y, mean = jax.dlpack.from_dlpack(yt), jax.dlpack.from_dlpack(mean_t)  # JAX waits for that stream
    shared = xt.data_ptr() == x.unsafe_buffer_pointer()

    xn = np.asarray(x.astype(jnp.float32), dtype=np.float64)
    m = xn.mean(-1, keepdims=True)
    ref = (xn - m) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5) * np.asarray(w) + np.asarray(b)
    err = float(np.abs(np.asarray(y.astype(jnp.float32)) - ref).max() / np.abs(ref).max())
    plan = next(iter(f._table.values())).plan
    print(f"x: jax {x.dtype} {x.shape} on {x.devices()}; scale/shift float32")
    print(f"normc plan: {plan.strategy}/{plan.schedule} vec={plan.vec}; x shared with torch (no copy): {shared}")
    print(f"y: {type(y).__module__}.{type(y).__name__} {y.dtype} {y.shape}; max|y - ref|/max|ref| = {err:.1e}; "
          f"mean err = {float(np.abs(np.asarray(mean) - m[:, 0]).max()):.1e}")
    # the same y flows on through jitted JAX code
    loss = jax.jit(lambda t: (t.astype(jnp.float32) ** 2).mean())(y)
    print(f"jax.jit on normc's output: mean(y^2) = {float(loss):.4f}")
    return 0 if err < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
