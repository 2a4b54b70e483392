"""A 3D U-Net block (conv3d + InstanceNorm3d + LeakyReLU, twice) in channels_last_3d (NDHWC) under float16
autocast, 2 x 32 x 128^3: one training step with torch's InstanceNorm3d vs normc.torch; prints the loss and
gradient errors and the step times.

    python examples/unet3d_block.py            # needs a CUDA GPU and torch
"""

import argparse

from _compare import require  # before torch: one message for everything missing

require("unet3d_block.py")
import torch  # noqa: E402
from torch import nn  # noqa: E402

from _compare import compare_models


def block(c):
    return nn.Sequential(nn.Conv3d(c, c, 3, padding=1), nn.InstanceNorm3d(c, affine=True), nn.LeakyReLU(0.01),
                         nn.Conv3d(c, c, 3, padding=1), nn.InstanceNorm3d(c, affine=True), nn.LeakyReLU(0.01))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--channels", type=int, default=32)
    args = ap.parse_args()
    torch.manual_seed(0)
    c, s = args.channels, args.size
    x = torch.randn(args.batch, c, s, s, s, device="cuda").to(memory_format=torch.channels_last_3d)
    net = block(c).cuda().to(memory_format=torch.channels_last_3d)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.InstanceNorm3d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    print(f"input {tuple(x.shape)} channels_last_3d, float16 autocast")
    compare_models(net, x, lambda y: y.float().pow(2).mean(), autocast_dtype=torch.float16, iters=5,
                   label="unet3d block")


if __name__ == "__main__":
    main()
