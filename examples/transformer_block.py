"""RMSNorm and LayerNorm at hidden size 4096 in bfloat16: a pre-norm MLP block (RMSNorm -> Linear -> GELU ->
Linear, residual, then a final LayerNorm) with torch's modules vs normc.torch, forward and backward, plus the
normalization layers alone (forward + backward times).

    python examples/transformer_block.py       # needs a CUDA GPU and torch
"""

import argparse

from _compare import require  # before torch: one message for everything missing

require("transformer_block.py")
import torch  # noqa: E402
from torch import nn  # noqa: E402

import normc.torch as nt
from _compare import compare_models, max_rel, step_times


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm1 = nn.RMSNorm(d, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
        self.norm2 = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm2(x + self.mlp(self.norm1(x)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    args = ap.parse_args()
    torch.manual_seed(0)
    d = args.hidden
    x = torch.randn(args.tokens, d, device="cuda", dtype=torch.bfloat16)
    blk = Block(d).cuda().to(torch.bfloat16)
    with torch.no_grad():
        blk.norm1.weight.uniform_(0.5, 1.5)
        blk.norm2.weight.uniform_(0.5, 1.5)
        blk.norm2.bias.normal_(0, 0.1)
    print(f"tokens x hidden = {tuple(x.shape)} bfloat16")
    compare_models(blk, x, lambda y: y.float().pow(2).mean(), label="transformer block")
    for name, ref in (("RMSNorm", nn.RMSNorm(d, eps=1e-6)), ("LayerNorm", nn.LayerNorm(d))):
        ref = ref.cuda().to(torch.bfloat16)
        mine = nt.convert(nn.Sequential(type(ref)(d, eps=ref.eps).cuda().to(torch.bfloat16)))[0]
        mine.load_state_dict(ref.state_dict())
        xi = x.clone().requires_grad_(True)
        dy = torch.randn_like(x)

        def run(m):
            xi.grad = None
            m.zero_grad(set_to_none=True)
            y = m(xi)
            y.backward(dy)
            return y

        y1 = run(ref)
        g1 = (xi.grad.clone(), ref.weight.grad.clone())
        y2 = run(mine)
        g2 = (xi.grad.clone(), mine.weight.grad.clone())
        tr, tn = step_times([lambda: run(ref), lambda: run(mine)])
        print(f"{name:>9} alone: y {max_rel(y2, y1):.2e}  dx {max_rel(g2[0], g1[0]):.2e}  "
              f"dweight {max_rel(g2[1], g1[1]):.2e}   fwd+bwd torch {tr:.3f} ms  normc {tn:.3f} ms")


if __name__ == "__main__":
    main()
