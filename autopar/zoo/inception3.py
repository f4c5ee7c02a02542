"""Inception-v3 as PaSE benchmarks it (docs/pase.md §7.3): no aux head, no dropout.

Written like torchvision's (BasicConv2d = conv without bias + batch norm + ReLU; branches are
computed in torchvision's order), with a plain ``mean`` over H, W as the global pool, so that the
PaSE view sees PaSE's 219 nodes in PaSE's order.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicConv2d(nn.Module):
    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _avg3(x):
    return F.avg_pool2d(x, 3, stride=1, padding=1)


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int):
        super().__init__()
        self.b1 = BasicConv2d(cin, 64, 1)
        self.b5_1 = BasicConv2d(cin, 48, 1)
        self.b5_2 = BasicConv2d(48, 64, 5, padding=2)
        self.b3_1 = BasicConv2d(cin, 64, 1)
        self.b3_2 = BasicConv2d(64, 96, 3, padding=1)
        self.b3_3 = BasicConv2d(96, 96, 3, padding=1)
        self.bp = BasicConv2d(cin, pool_features, 1)

    def forward(self, x):
        b1 = self.b1(x)
        b5 = self.b5_2(self.b5_1(x))
        b3 = self.b3_3(self.b3_2(self.b3_1(x)))
        bp = self.bp(_avg3(x))
        return torch.cat([b1, b5, b3, bp], 1)


class InceptionB(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        self.b3 = BasicConv2d(cin, 384, 3, stride=2)
        self.bd_1 = BasicConv2d(cin, 64, 1)
        self.bd_2 = BasicConv2d(64, 96, 3, padding=1)
        self.bd_3 = BasicConv2d(96, 96, 3, stride=2)

    def forward(self, x):
        b3 = self.b3(x)
        bd = self.bd_3(self.bd_2(self.bd_1(x)))
        return torch.cat([b3, bd, F.max_pool2d(x, 3, stride=2)], 1)


class InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int):
        super().__init__()
        self.b1 = BasicConv2d(cin, 192, 1)
        self.b7 = nn.Sequential(BasicConv2d(cin, c7, 1), BasicConv2d(c7, c7, (1, 7), padding=(0, 3)),
                                BasicConv2d(c7, 192, (7, 1), padding=(3, 0)))
        self.b7d = nn.Sequential(
            BasicConv2d(cin, c7, 1), BasicConv2d(c7, c7, (7, 1), padding=(3, 0)),
            BasicConv2d(c7, c7, (1, 7), padding=(0, 3)), BasicConv2d(c7, c7, (7, 1), padding=(3, 0)),
            BasicConv2d(c7, 192, (1, 7), padding=(0, 3)))
        self.bp = BasicConv2d(cin, 192, 1)

    def forward(self, x):
        return torch.cat([self.b1(x), self.b7(x), self.b7d(x), self.bp(_avg3(x))], 1)


class InceptionD(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        self.b3 = nn.Sequential(BasicConv2d(cin, 192, 1), BasicConv2d(192, 320, 3, stride=2))
        self.b7 = nn.Sequential(
            BasicConv2d(cin, 192, 1), BasicConv2d(192, 192, (1, 7), padding=(0, 3)),
            BasicConv2d(192, 192, (7, 1), padding=(3, 0)), BasicConv2d(192, 192, 3, stride=2))

    def forward(self, x):
        return torch.cat([self.b3(x), self.b7(x), F.max_pool2d(x, 3, stride=2)], 1)


class InceptionE(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        self.b1 = BasicConv2d(cin, 320, 1)
        self.b3_1 = BasicConv2d(cin, 384, 1)
        self.b3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.b3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.bd_1 = BasicConv2d(cin, 448, 1)
        self.bd_2 = BasicConv2d(448, 384, 3, padding=1)
        self.bd_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.bd_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.bp = BasicConv2d(cin, 192, 1)

    def forward(self, x):
        b1 = self.b1(x)
        t = self.b3_1(x)
        b3 = torch.cat([self.b3_2a(t), self.b3_2b(t)], 1)
        t = self.bd_2(self.bd_1(x))
        bd = torch.cat([self.bd_3a(t), self.bd_3b(t)], 1)
        return torch.cat([b1, b3, bd, self.bp(_avg3(x))], 1)


class Inception3(nn.Module):
    def __init__(self, classes: int):
        super().__init__()
        self.stem1 = nn.Sequential(BasicConv2d(3, 32, 3, stride=2), BasicConv2d(32, 32, 3),
                                   BasicConv2d(32, 64, 3, padding=1))
        self.stem2 = nn.Sequential(BasicConv2d(64, 80, 1), BasicConv2d(80, 192, 3))
        self.mixed = nn.Sequential(
            InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64), InceptionB(288),
            InceptionC(768, 128), InceptionC(768, 160), InceptionC(768, 160), InceptionC(768, 192),
            InceptionD(768), InceptionE(1280), InceptionE(2048))
        self.fc = nn.Linear(2048, classes)

    def forward(self, x, labels=None):
        x = F.max_pool2d(self.stem1(x), 3, stride=2)
        x = F.max_pool2d(self.stem2(x), 3, stride=2)
        x = self.mixed(x).mean(dim=(2, 3))
        logits = self.fc(x)
        if labels is None:
            return logits
        return F.cross_entropy(logits, labels)


def inception3(batch=128, image=299, classes=1000, device="cpu", seed=0):
    if image < 75:
        raise ValueError(f"image {image} is too small for Inception-v3 (needs >= 75)")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Inception3(classes)
        x = torch.randn(batch, 3, image, image)
        labels = torch.randint(0, classes, (batch,))
    return model, (x, labels)
