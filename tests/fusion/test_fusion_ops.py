"""The fusion rules one by one: models made of many kinds of ops, fused, against the K models run
alone (forward and gradients); the per-model optimizers against torch.optim; clear refusals."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.core.errors import TraceError
from autopar.fusion import FusedAdamW, FusedSGD, fuse


class Assorted(nn.Module):
    """Dims, shapes, indexing, reductions, raw parameters and both norm kinds in one forward."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8, padding_idx=0)
        self.conv = nn.Conv1d(8, 8, 3, padding=1, padding_mode="circular")
        self.gn = nn.GroupNorm(2, 8)
        self.scale = nn.Parameter(torch.randn(8))
        self.proj = nn.Parameter(torch.randn(8, 4))
        self.register_buffer("shift", torch.randn(4))
        self.soft = nn.Softmax(dim=-1)
        self.flat = nn.Flatten()

    def forward(self, idx, target):
        x = self.emb(idx)                           # (B, S, 8)
        y = self.gn(self.conv(x.permute(0, 2, 1)))  # (B, 8, S)
        y = y.transpose(1, 2) * self.scale          # (B, S, 8)
        z = torch.einsum("bsc,cd->bsd", y, self.proj) + self.shift
        a, b = z.chunk(2, dim=-1)
        z = (torch.cat([a, b], dim=-1) + x[..., :4]).unsqueeze(1).squeeze(1)
        w = self.soft(z) @ self.proj.t()             # (B, S, 8)
        w = F.layer_norm(w, (8,)) + y[:, :1].mean(dim=1, keepdim=True)
        v = w @ self.scale                            # a matrix times a vector: (B, S)
        pooled = self.flat(w[:, 0:2]).sum(-1) + v.amax(dim=-1) + w.mean() + w.max()
        return F.mse_loss(pooled, target) + z.std()


def _check(models, inputs, rtol=1e-5):
    fused = fuse([copy.deepcopy(m) for m in models], inputs)
    out = fused(*inputs)
    out.sum().backward()
    want = []
    for i, m in enumerate(models):
        m = copy.deepcopy(m)
        loss = m(*inputs)
        loss.backward()
        want.append(loss.detach())
        grads = dict(fused.named_parameters())
        # a gradient that cancels to ~0 (a bias before a norm) is rounding noise at the model's scale
        scale = max(float(p.grad.abs().max()) for p in m.parameters())
        for name, p in m.named_parameters():
            got = grads[name].grad.view(len(models), *p.shape)[i]  # the fused layout is model-major
            torch.testing.assert_close(got, p.grad, rtol=rtol, atol=rtol * scale,
                                       msg=f"model {i} {name}")
    torch.testing.assert_close(out.detach(), torch.stack(want), rtol=rtol, atol=1e-6)
    return fused


@pytest.mark.parametrize("k", [1, 2, 4])
def test_assorted_ops(k):
    torch.manual_seed(0)
    models = [Assorted() for _ in range(k)]
    idx = torch.randint(0, 20, (3, 5))
    idx[0, 0] = 0  # a padding index: no gradient to that row
    _check(models, (idx, torch.randn(3)))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, stride=2, bias=True)
        self.c2 = nn.Conv2d(4, 4, 3, padding=1, groups=2)
        self.bn = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x, y):
        h = F.max_pool2d(F.relu(self.c2(self.c1(x))), 2)
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return F.cross_entropy(self.head(self.bn(h)), y, label_smoothing=0.1, ignore_index=2)


def test_conv_pool_and_functional_pieces():
    torch.manual_seed(1)
    models = [ConvNet() for _ in range(3)]
    _check(models, (torch.randn(4, 3, 12, 12), torch.tensor([0, 1, 2, 1])))


def _optimizer_runs(make_torch, make_fused, k=3, steps=4):
    torch.manual_seed(0)
    start = torch.randn(k, 6, 5)
    grads = [torch.randn(k, 6, 5) for _ in range(steps)]
    fp = nn.Parameter(start.clone())
    opt = make_fused([fp])
    for g in grads:
        fp.grad = g.clone()
        opt.step()
    for i in range(k):
        p = nn.Parameter(start[i].clone())
        o = make_torch([p], i)
        for g in grads:
            p.grad = g[i].clone()
            o.step()
        torch.testing.assert_close(fp[i].detach(), p.detach(), rtol=1e-5, atol=1e-6)


def test_fused_sgd_matches_torch_sgd_per_model():
    lrs, moms, wds, damps = [0.1, 0.05, 0.2], [0.0, 0.9, 0.5], [0.0, 1e-2, 1e-3], [0.0, 0.1, 0.0]
    _optimizer_runs(lambda p, i: torch.optim.SGD(p, lr=lrs[i], momentum=moms[i], weight_decay=wds[i], dampening=damps[i]),
                    lambda p: FusedSGD(p, 3, lr=lrs, momentum=moms, weight_decay=wds, dampening=damps))
    _optimizer_runs(lambda p, i: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
                    lambda p: FusedSGD(p, 3, lr=0.1, momentum=0.9, nesterov=True))


def test_fused_adam_matches_torch_adam_and_adamw_per_model():
    lrs, betas, wds = [1e-3, 1e-2, 3e-3], [(0.9, 0.999), (0.8, 0.99), (0.95, 0.9)], [0.0, 0.1, 1e-2]
    _optimizer_runs(lambda p, i: torch.optim.AdamW(p, lr=lrs[i], betas=betas[i], weight_decay=wds[i]),
                    lambda p: FusedAdamW(p, 3, lr=lrs, betas=betas, weight_decay=wds))
    _optimizer_runs(lambda p, i: torch.optim.Adam(p, lr=lrs[i], betas=betas[i], weight_decay=wds[i]),
                    lambda p: FusedAdamW(p, 3, lr=lrs, betas=betas, weight_decay=wds, decoupled=False))
    with pytest.raises(ValueError, match="one per model"):
        FusedAdamW([nn.Parameter(torch.zeros(3, 2))], 3, lr=[1e-3, 1e-3])


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x)).sum()


class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.fft.fft(self.lin(x)).real.sum()


def test_refusals_name_what_to_change():
    x = torch.randn(2, 4)
    with pytest.raises(TraceError, match="tied"):
        fuse([Tied(), Tied()], (x,))
    with pytest.raises(TraceError, match="fft has no fusion rule"):
        fuse([Unsupported(), Unsupported()], (x,))
    with pytest.raises(TraceError, match="no fused form of PReLU"):
        fuse([nn.Sequential(nn.Linear(4, 4), nn.PReLU()) for _ in range(2)], (x,))
