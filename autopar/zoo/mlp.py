"""A plain multi-layer perceptron, the smallest model every rule and plan is tried on first."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, inputs: int, hidden: int, layers: int, classes: int):
        super().__init__()
        widths = [inputs] + [hidden] * layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x, labels=None):
        for layer in self.layers:
            x = F.relu(layer(x))
        return classify(self.head, x, labels)


def classify(head: nn.Module, x, labels=None):
    """The logits, or the cross-entropy loss when ``labels`` are given (training)."""
    logits = head(x)
    if labels is None:
        return logits
    return F.cross_entropy(logits, labels)


def classifier_call(make, batch: int, inputs: int, classes: int, device="cpu", seed=0):
    """``make()`` built under ``seed`` on ``device``, with a random batch and its labels."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = make()
        x = torch.randn(batch, inputs)
        labels = torch.randint(0, classes, (batch,))
    return model, (x, labels)


def mlp(batch=32, inputs=64, hidden=128, layers=2, classes=16, device="cpu", seed=0):
    return classifier_call(lambda: MLP(inputs, hidden, layers, classes), batch, inputs, classes, device, seed)
