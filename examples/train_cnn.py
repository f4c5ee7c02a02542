"""Train a CNN (convolutions, batch norm, pooling) with the strategy autopar finds, on local CPU processes.

    torchrun --standalone --nproc-per-node 2 examples/train_cnn.py [--steps 3] [--plan plan.json]

With 256 channels and a batch of 4 its weights outweigh its activations, and on two CPU processes
(the ``cpu`` preset) autopar splits the convolutions' channels, Megatron-style: the first
convolution of each block splits its output channels, the second its input channels and sums
the partial results, so no weight gradient is all-reduced (data parallelism is priced 2x slower).

Every rank builds the same model (seeded), ``autopar.compile`` plans on rank 0 and hands every
rank its sharded module, and the loop below is an ordinary PyTorch training loop (``module.train_step`` is forward +
backward for every kind of plan, pipelined ones included). Rank 0 prints
the plan's report, then the loss of every step beside the loss of the same steps of the unsplit
model on one process: they must be equal.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

import autopar
from autopar.cli.training import ADAM_EPS, LossComparison, single_process_losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--plan", help="a saved plan (autopar plan ... --json OUT) to use without searching")
    args = parser.parse_args()
    if "RANK" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0

    model, (images, labels) = autopar.zoo.get("cnn", batch=4, channels=256, image=8, blocks=2, classes=10)
    module = autopar.compile(model, (images, labels), cluster="cpu", plan=args.plan)
    if rank == 0:
        print(module.plan.report())
        print()

    opt = module.optimizer(torch.optim.AdamW, lr=args.lr, eps=ADAM_EPS)  # foreach over its DTensors
    losses = []
    for _ in range(args.steps):
        opt.zero_grad()
        loss = module.train_step(images, labels)  # forward + backward; the loss, the same on every rank
        opt.step()
        losses.append(loss.item())

    ok = True
    if rank == 0:
        single = single_process_losses(model, (images, labels), args.steps, args.lr)
        devices = dist.get_world_size() if dist.is_initialized() else 1
        comparison = LossComparison(losses, single, devices)
        print(comparison.table())
        ok = comparison.equal
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
