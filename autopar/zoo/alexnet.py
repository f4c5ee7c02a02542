"""AlexNet as PaSE benchmarks it (docs/pase.md §7.1): no LRN, no dropout, FC8 of 1024 outputs.

ReLUs follow conv1-5 and FC6-7 (PaSE folds them into those layers as one pointwise op each).
The ``image`` and ``fc`` sizes can shrink the model for tests; PaSE's sizes are the defaults.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def _out(size: int, kernel: int, stride: int, pad: int = 0) -> int:
    return (size - kernel + 2 * pad) // stride + 1


class AlexNet(nn.Module):
    def __init__(self, image: int, fc: int, classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 96, 11, stride=4)
        self.conv2 = nn.Conv2d(96, 256, 5, padding=2)
        self.conv3 = nn.Conv2d(256, 384, 3, padding=1)
        self.conv4 = nn.Conv2d(384, 384, 3, padding=1)
        self.conv5 = nn.Conv2d(384, 256, 3, padding=1)
        s = _out(_out(_out(_out(image, 11, 4), 3, 2), 3, 2), 3, 2)
        if s < 1:
            raise ValueError(f"image {image} is too small for AlexNet (needs >= 67)")
        self.fc6 = nn.Linear(256 * s * s, fc)
        self.fc7 = nn.Linear(fc, fc)
        self.fc8 = nn.Linear(fc, classes)

    def forward(self, x, labels=None):
        x = F.max_pool2d(F.relu(self.conv1(x)), 3, 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 3, 2)
        x = F.relu(self.conv3(x))
        x = F.relu(self.conv4(x))
        x = F.max_pool2d(F.relu(self.conv5(x)), 3, 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc6(x))
        x = F.relu(self.fc7(x))
        logits = self.fc8(x)
        if labels is None:
            return logits
        return F.cross_entropy(logits, labels)


def alexnet(batch=128, image=227, fc=4096, classes=1024, device="cpu", seed=0):
    torch.manual_seed(seed)
    with torch.device(device):
        model = AlexNet(image, fc, classes)
        x = torch.randn(batch, 3, image, image)
        labels = torch.randint(0, classes, (batch,))
    return model, (x, labels)
