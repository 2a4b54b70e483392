"""Instance norm is group norm with one group per channel: normc compiles both to the same kernel.

normc plans from the canonical problem (axes, strides, roles), not from the family's name, so
``instance_norm()`` and ``group_norm(groups=C)`` on the same tensor give the same plan and the same kernel
source, and the same numbers.

    python examples/instance_as_group_norm.py            # GPU: torch tensors (C=64, 56x56, channels-last)
    python examples/instance_as_group_norm.py --small    # no GPU: numpy on the simulator (C=8, 6x6)
"""

import argparse
import hashlib

import numpy as np

import normc
from normc.lowering.codegen import generate


def kernel_hash(f):
    (entry,) = f._table.values()
    return entry.plan, hashlib.sha256("".join(k.source for k in generate(entry.plan)).encode()).hexdigest()[:12]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="small shape on the simulator (no GPU)")
    a = ap.parse_args()
    try:
        import torch

        gpu = torch.cuda.is_available() and not a.small
    except ImportError:
        gpu = False
    n, c, h, w = (8, 64, 56, 56) if gpu else (2, 8, 6, 6)
    rng = np.random.default_rng(0)
    x = np.ascontiguousarray(rng.standard_normal((n, h, w, c), dtype=np.float32)).transpose(0, 3, 1, 2)  # NHWC
    gamma = (rng.random(c) + 0.5).astype(np.float32)
    beta = rng.standard_normal(c).astype(np.float32)
    if gpu:
        x_, g_, b_ = (torch.from_numpy(np.ascontiguousarray(v)).cuda() for v in (x, gamma, beta))
        x_ = x_.to(memory_format=torch.channels_last)
    else:
        x_, g_, b_ = x, gamma, beta
    inst = normc.compile(normc.instance_norm(2))
    grp = normc.compile(normc.group_norm(c))  # "n (g k) h w : norm over k h w ; scale g k ; shift g k", g=C
    y1, y2 = inst(x_, g_, b_), grp(x_, g_, b_)
    if gpu:
        y1, y2 = y1.cpu().numpy(), y2.cpu().numpy()
    (p1, h1), (p2, h2) = kernel_hash(inst), kernel_hash(grp)
    xd = x.astype(np.float64)
    ref = (xd - xd.mean((2, 3), keepdims=True)) / np.sqrt(xd.var((2, 3), keepdims=True) + 1e-5)
    ref = ref * gamma[:, None, None] + beta[:, None, None]
    print(f"x: {(n, c, h, w)} float32, channels-last, {'GPU' if gpu else 'simulator'}")
    print(f"instance_norm(2):   {p1.strategy}/{p1.schedule}, kernel source {h1}")
    print(f"group_norm({c}):     {p2.strategy}/{p2.schedule}, kernel source {h2}")
    print(f"same plan: {p1 == p2}; same kernel: {h1 == h2}; outputs identical: {np.array_equal(y1, y2)}; "
          f"max|y - ref| = {np.abs(y1 - ref).max():.1e}")


if __name__ == "__main__":
    main()
