"""Train a small Hugging Face GPT-2 with the strategy autopar finds, on local CPU processes.

    torchrun --standalone --nproc-per-node 2 examples/train_hf_gpt2.py [--steps 3] [--plan plan.json]

The model is ``transformers.GPT2LMHeadModel`` built from its config (default config apart from its
sizes: ``use_cache=True``, so its output holds a key/value cache), called as Hugging Face models
are, with keyword inputs, and it returns its ``CausalLMOutputWithCrossAttentions``. autopar traces
it with torch.export, plans on rank 0 and hands every rank its sharded module; the loop is an
ordinary training loop. Rank 0 prints the plan's report, then every step's loss beside the same
steps of the unsplit model on one process: they must be equal. Needs ``transformers`` (the test
extra: ``pip install -e '.[test]'``); nothing is downloaded.
"""

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import autopar  # noqa: E402
from autopar.cli.training import ADAM_EPS, LossComparison, single_process_losses  # noqa: E402


def model_and_batch(batch: int = 8, seq: int = 32):
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--plan", help="a saved plan (autopar plan ... --json OUT) to use without searching")
    args = parser.parse_args()
    if "RANK" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0

    model, batch = model_and_batch()
    module = autopar.compile(model, batch, plan=args.plan)  # keyword inputs, as the model takes them
    if rank == 0:
        print(module.plan.report())
        print()

    opt = module.optimizer(torch.optim.AdamW, lr=args.lr, eps=ADAM_EPS)  # foreach over its DTensors
    losses = []
    for _ in range(args.steps):
        opt.zero_grad()
        loss = module.train_step(**batch)  # forward + backward of output.loss
        opt.step()
        losses.append(loss.item())

    ok = True
    if rank == 0:
        single = single_process_losses(model, (), args.steps, args.lr, kwargs=batch)
        devices = dist.get_world_size() if dist.is_initialized() else 1
        comparison = LossComparison(losses, single, devices)
        print(comparison.table())
        ok = comparison.equal
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
