"""Fused training equals one-by-one training on a device (a GPU): 3 AdamW steps, K = 8, per-model
learning rates, mlp, cnn and gpt, TF32 off (it rounds matmuls and convolutions to 10-bit mantissas).

    python -m benchmarks.fusion_check_device [--device cuda]

The same comparison as tests/fusion/test_fusion.py (which runs on the CPU), printed per model family.
"""

import argparse
import copy

import torch

import autopar
from autopar.fusion import FusedAdamW, fuse
from autopar.cli.training import ADAM_EPS


def worst(name: str, k: int, device: str) -> tuple[float, float]:
    models = [autopar.zoo.get(name, seed=s)[0].to(device) for s in range(k)]
    inputs = tuple(x.to(device) for x in autopar.zoo.get(name)[1])
    lrs = [1e-3 * (1 + i / k) for i in range(k)]
    fused = fuse([copy.deepcopy(m) for m in models], inputs)
    opt = FusedAdamW(fused.parameters(), k, lr=lrs, eps=ADAM_EPS)
    got = []
    for _ in range(3):
        opt.zero_grad()
        loss = fused(*inputs)
        loss.sum().backward()
        opt.step()
        got.append(loss.detach())
    got = torch.stack(got).T
    loss_err = param_err = 0.0
    for i, m in enumerate(models):
        m = copy.deepcopy(m)
        o = torch.optim.AdamW(m.parameters(), lr=lrs[i], eps=ADAM_EPS)
        want = []
        for _ in range(3):
            o.zero_grad()
            loss = m(*inputs)
            loss.backward()
            o.step()
            want.append(loss.detach())
        loss_err = max(loss_err, float(((got[i] - torch.stack(want)).abs() / torch.stack(want).abs()).max()))
        state = fused.model_state_dict(i)
        for key, v in m.state_dict().items():
            if v.is_floating_point():
                param_err = max(param_err, float((((state[key] - v).abs() - 1e-6).clamp(min=0) / v.abs().clamp(min=1e-12)).max()))
    return loss_err, param_err


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for name in ("mlp", "cnn", "gpt"):
        loss_err, param_err = worst(name, 8, args.device)
        print(f"{name} K=8 on {args.device}: largest relative loss difference {loss_err:.1e}, "
              f"parameters beyond atol 1e-6 {param_err:.1e} (rtol 1e-5: {'equal' if max(loss_err, param_err) <= 1e-5 else 'DIFFERENT'})")


if __name__ == "__main__":
    main()
