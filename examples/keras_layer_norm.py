"""Layer norm over several trailing axes, like Keras ``LayerNormalization(axis=(1, 2, 3))``.

Keras normalizes an (N, H, W, C) tensor over every axis but the batch and learns gamma/beta of shape
(H, W, C). In normc that is one spec: ``"n h w c : norm over h w c ; scale h w c ; shift h w c"``; the three
reduced axes are contiguous in memory, so the canonical form merges them into one reduction of H*W*C
elements and the planner picks the same kernel as a plain (N, H*W*C) layer norm.

    python examples/keras_layer_norm.py            # GPU: (32, 28, 28, 64)
    python examples/keras_layer_norm.py --small    # no GPU: (2, 3, 4, 5) on the simulator
"""

import argparse

import numpy as np

import normc

SPEC = normc.spec("n h w c : norm over h w c ; scale h w c ; shift h w c", eps=1e-3)  # Keras' default eps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="small shape on the simulator (no GPU)")
    a = ap.parse_args()
    try:
        import torch

        gpu = torch.cuda.is_available() and not a.small
    except ImportError:
        gpu = False
    shape = (32, 28, 28, 64) if gpu else (2, 3, 4, 5)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32) * 3 + 1
    gamma = (rng.random(shape[1:]) + 0.5).astype(np.float32)  # Keras keeps gamma/beta as (H, W, C)
    beta = rng.standard_normal(shape[1:]).astype(np.float32)
    f = normc.compile(SPEC)
    if gpu:
        y = f(*(torch.from_numpy(v).cuda() for v in (x, gamma, beta))).cpu().numpy()
    else:
        y = f(x, gamma, beta)
    (entry,) = f._table.values()
    flat = normc.plan("t d : norm over d ; scale d ; shift d", (shape[0], int(np.prod(shape[1:]))), "float32")
    xd = x.astype(np.float64)
    axes = (1, 2, 3)
    ref = (xd - xd.mean(axes, keepdims=True)) / np.sqrt(xd.var(axes, keepdims=True) + 1e-3) * gamma + beta
    print(f"x: {shape} float32 on the {'GPU' if gpu else 'simulator'}; spec: {SPEC}")
    print(f"canonical axes: {[(ax.size, 'R' if ax.reduced else 'K') for ax in entry.plan.axes]}  "
          f"plan: {entry.plan.strategy}/{entry.plan.schedule}, tiling as (N, H*W*C) layer norm: "
          f"{(entry.plan.vec, entry.plan.tpr, entry.plan.per_thread) == (flat.vec, flat.tpr, flat.per_thread)}")
    print(f"max|y - ref| / max|ref| = {np.abs(y - ref).max() / np.abs(ref).max():.1e}")


if __name__ == "__main__":
    main()
