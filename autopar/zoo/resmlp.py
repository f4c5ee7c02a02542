"""A residual MLP: blocks of ``x + fc2(relu(fc1(x)))``, the Megatron MLP pattern without attention.

The runtime benchmark's first model: every block is one tensor-parallel pair
(column-parallel fc1, row-parallel fc2), so data, tensor and sharded-data parallelism all apply.
"""

import torch.nn as nn
import torch.nn.functional as F

from autopar.zoo.mlp import classifier_call, classify


class Block(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.fc2(F.relu(self.fc1(x)))


class ResMLP(nn.Module):
    def __init__(self, width: int, hidden: int, blocks: int, classes: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, hidden) for _ in range(blocks))
        self.head = nn.Linear(width, classes)

    def forward(self, x, labels=None):
        for block in self.blocks:
            x = block(x)
        return classify(self.head, x, labels)


def resmlp(batch=64, width=512, hidden=2048, blocks=4, classes=16, device="cpu", seed=0):
    return classifier_call(lambda: ResMLP(width, hidden, blocks, classes), batch, width, classes, device, seed)
