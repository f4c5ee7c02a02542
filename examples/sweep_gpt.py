"""A learning-rate x width sweep of 8 small GPTs, planned and trained together on 2 CPU processes.

    python examples/sweep_gpt.py [--steps 20]
    torchrun --standalone --nproc-per-node 2 examples/sweep_gpt.py [--steps 20]

``autopar.compile_many`` prices fusing each width's four models (one fused module, a learning
rate per model) against training them one by one, plans each job on one or both processes and
schedules the jobs; ``train()`` runs that schedule (starting the two processes itself, or as
this rank of torchrun's), and every model's final loss is printed beside the same model trained
alone: they must be equal.
"""

import argparse
import os
import sys

import torch.distributed as dist

import autopar
from autopar.cli.sweep import comparison
from autopar.cli.training import ADAM_EPS

LEARNING_RATES = (1e-3, 2e-3, 4e-3, 8e-3)
WIDTHS = (32, 64)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if "RANK" in os.environ:  # started by torchrun: this process is one of the two
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0

    models, names, hparams = [], [], []
    for width in WIDTHS:
        for lr in LEARNING_RATES:  # each width's four models start from the same weights
            model, inputs = autopar.zoo.get("gpt", layers=2, width=width, heads=2, seq=32, batch=8, vocab=128)
            models.append(model)
            names.append(f"gpt width={width} lr={lr:g}")
            hparams.append({"lr": lr, "eps": ADAM_EPS})  # AdamW, one learning rate per model

    many = autopar.compile_many(models, 2, inputs, steps=args.steps, hparams=hparams, names=names)
    losses = many.train()
    ok = True
    if rank == 0:
        print(many.report())
        print()
        text, ok = comparison(names, losses, many.solo())
        print(text)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
