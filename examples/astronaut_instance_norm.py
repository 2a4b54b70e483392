"""Instance-normalize real image features with normc, in NCHW and NHWC, against PyTorch.

A real photograph (scikit-image's bundled ``astronaut``, 512 x 512 RGB) goes through a randomly initialised
3x3 convolution to 32 channels; the result is instance-normalized by normc in both memory layouts and
compared with ``torch.nn.functional.instance_norm`` (float64 reference), with timings.

    pip install scikit-image                              # its photograph (the script says so without it)
    python examples/astronaut_instance_norm.py            # on a GPU: full size, torch tensors
    python examples/astronaut_instance_norm.py --size 16  # no GPU: downscaled, numpy on the simulator

Without a GPU (or without torch) the convolution and the reference are computed with numpy, and normc runs
its kernels on Numba's CUDA simulator (slow: keep --size small).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import normc

SPEC = normc.spec("n c h w : norm over h w ; scale c ; shift c", eps=1e-5)


def load_image(size):
    try:
        from skimage import data, transform
    except ImportError:
        sys.exit("astronaut_instance_norm.py reads scikit-image's bundled astronaut photograph: "
                 "pip install scikit-image")

    img = data.astronaut().astype(np.float32) / 255.0  # (512, 512, 3)
    if size and size != img.shape[0]:
        img = transform.resize(img, (size, size), anti_aliasing=True).astype(np.float32)
    return img.transpose(2, 0, 1)[None]  # (1, 3, H, W)


def conv3x3_numpy(x, w):
    """(1, 3, H, W) * (32, 3, 3, 3) -> (1, 32, H, W), zero padding 1, float32."""
    _, c, h, wd = x.shape
    xp = np.pad(x[0], ((0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, i:i + h, j:j + wd] for i in range(3) for j in range(3)], axis=1)  # (3, 9, H, W)
    return np.einsum("ock,ckhw->ohw", w.reshape(w.shape[0], c, 9), cols, optimize=True)[None].astype(np.float32)


def reference_numpy(x, g, b, eps=1e-5):
    x = x.astype(np.float64)
    m = x.mean(axis=(2, 3), keepdims=True)
    v = x.var(axis=(2, 3), keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g[None, :, None, None] + b[None, :, None, None]


def run_gpu(size):
    import torch
    from triton.testing import do_bench

    torch.manual_seed(0)
    x = torch.from_numpy(load_image(size)).cuda()
    conv = torch.nn.Conv2d(3, 32, 3, padding=1).cuda()
    with torch.no_grad():
        feat = conv(x)  # (1, 32, H, W), NCHW
    gamma = torch.rand(32, device="cuda") + 0.5
    beta = torch.randn(32, device="cuda") * 0.1
    ref = torch.nn.functional.instance_norm(feat.double(), weight=gamma.double(), bias=beta.double(), eps=1e-5)
    f = normc.compile(SPEC)
    print(f"image: astronaut {tuple(x.shape)} -> conv3x3 -> features {tuple(feat.shape)} float32")
    for name, t in (("NCHW", feat.contiguous()), ("NHWC", feat.contiguous(memory_format=torch.channels_last))):
        y = f(t, gamma, beta)
        err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
        us = do_bench(lambda: f(t, gamma, beta), return_mode="median") * 1e3
        tus = do_bench(lambda: torch.nn.functional.instance_norm(t, weight=gamma, bias=beta, eps=1e-5),
                       return_mode="median") * 1e3
        plan = f._table[next(k for k in f._table if k[2] == tuple(t.stride()))].plan
        print(f"{name}: normc {plan.strategy}/{plan.schedule}  max|err|/max|ref| = {err:.2e}  "
              f"normc {us:7.1f} us   torch.instance_norm {tus:7.1f} us   "
              f"y keeps layout: {y.stride() == t.stride()}")


def run_sim(size):
    rng = np.random.default_rng(0)
    x = load_image(size)
    w = (rng.standard_normal((32, 3, 3, 3)) / np.sqrt(27)).astype(np.float32)
    feat = conv3x3_numpy(x, w)
    gamma = (rng.random(32) + 0.5).astype(np.float32)
    beta = (rng.standard_normal(32) * 0.1).astype(np.float32)
    ref = reference_numpy(feat, gamma, beta)
    f = normc.compile(SPEC)
    print(f"image: astronaut {x.shape} (downscaled) -> conv3x3 -> features {feat.shape} float32, simulator")
    nhwc = np.ascontiguousarray(feat.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    for name, t in (("NCHW", np.ascontiguousarray(feat)), ("NHWC", nhwc)):
        t0 = time.perf_counter()
        y = f(t, gamma, beta)
        dt = time.perf_counter() - t0
        err = np.abs(y - ref).max() / np.abs(ref).max()
        print(f"{name}: max|err|/max|ref| = {err:.2e}   simulator time {dt:.1f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=None, help="resize the image to SIZE x SIZE (default: 512 on a "
                                                            "GPU, 16 on the simulator)")
    a = ap.parse_args()
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if gpu:
        run_gpu(a.size or 512)
    else:
        run_sim(a.size or 16)


if __name__ == "__main__":
    main()
