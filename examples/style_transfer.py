"""Fast neural style network (Johnson et al. 2016) with torch's InstanceNorm2d vs normc.torch, forward and
backward, on a real photograph.

The network: a 9x9 conv encoder and two stride-2 convs, five residual blocks, two nearest-upsampling convs and
a 9x9 output conv, with instance norm (affine) after every conv but the last. Input: scikit-image's astronaut
(or --image chelsea) resized to 640x640, float32, channels_last. Prints the max relative errors of the output,
the input gradient and the parameter gradients, and the training-step times.

    pip install scikit-image && python examples/style_transfer.py        # needs a CUDA GPU and torch
"""

import argparse
import sys

import numpy as np
from _compare import require  # before torch: one message for everything missing

require("style_transfer.py", skimage=True)
import torch  # noqa: E402
from torch import nn  # noqa: E402

from _compare import compare_models


class ConvLayer(nn.Sequential):
    def __init__(self, cin, cout, k, stride=1, upsample=False):
        layers = [nn.Upsample(scale_factor=2, mode="nearest")] if upsample else []
        layers += [nn.ReflectionPad2d(k // 2), nn.Conv2d(cin, cout, k, stride)]
        super().__init__(*layers)


class Residual(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(ConvLayer(c, c, 3), nn.InstanceNorm2d(c, affine=True), nn.ReLU(),
                                  ConvLayer(c, c, 3), nn.InstanceNorm2d(c, affine=True))

    def forward(self, x):
        return x + self.body(x)


def transformer_net():
    def cbr(cin, cout, k, stride=1, up=False):
        return [ConvLayer(cin, cout, k, stride, up), nn.InstanceNorm2d(cout, affine=True), nn.ReLU()]

    return nn.Sequential(*cbr(3, 32, 9), *cbr(32, 64, 3, 2), *cbr(64, 128, 3, 2),
                         *[Residual(128) for _ in range(5)],
                         *cbr(128, 64, 3, up=True), *cbr(64, 32, 3, up=True), ConvLayer(32, 3, 9))


def load_image(name, size):
    try:
        from skimage import data, transform
    except ImportError:
        sys.exit(f"style_transfer.py reads scikit-image's bundled {name} photograph: pip install scikit-image")

    img = getattr(data, name)().astype(np.float32) / 255.0
    img = transform.resize(img, (size, size), anti_aliasing=True).astype(np.float32)
    return torch.from_numpy(img.transpose(2, 0, 1).copy())[None]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default="astronaut", choices=["astronaut", "chelsea"])
    ap.add_argument("--size", type=int, default=640)
    args = ap.parse_args()
    torch.manual_seed(0)
    x = load_image(args.image, args.size).cuda().to(memory_format=torch.channels_last)
    net = transformer_net().cuda().to(memory_format=torch.channels_last)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.InstanceNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    print(f"image: {args.image} {tuple(x.shape)} float32 channels_last")
    compare_models(net, x, lambda y: ((y.float() - 0.5) ** 2).mean(), label="style transfer net")


if __name__ == "__main__":
    main()
