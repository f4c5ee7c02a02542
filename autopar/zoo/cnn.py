"""A small residual CNN: convolutions, batch norm, residual adds, pooling and a classifier."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(x + y)


class CNN(nn.Module):
    def __init__(self, in_channels: int, channels: int, blocks: int, classes: int):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.pool = nn.MaxPool2d(2)
        self.blocks = nn.Sequential(*[Block(channels) for _ in range(blocks)])
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x, labels=None):
        x = self.pool(F.relu(self.bn(self.stem(x))))
        x = self.blocks(x)
        x = torch.flatten(self.avgpool(x), 1)
        logits = self.fc(x)
        if labels is None:
            return logits
        return F.cross_entropy(logits, labels)


def cnn(batch=8, in_channels=3, channels=16, image=32, blocks=2, classes=10, device="cpu", seed=0):
    torch.manual_seed(seed)
    with torch.device(device):
        model = CNN(in_channels, channels, blocks, classes)
        x = torch.randn(batch, in_channels, image, image)
        labels = torch.randint(0, classes, (batch,))
    return model, (x, labels)
