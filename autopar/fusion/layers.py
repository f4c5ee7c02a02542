"""The fused leaf modules: K copies of one layer as one layer, HFTA-style.

Each holds its K models' parameters and buffers in one tensor under the layer's own names,
model-major (model k's ``weight`` is ``fused.weight.view(K, *shape)[k]``), laid out as the fused
kernel reads them: a linear's (K, out, in) for bmm, a conv's (K*C_out, C_in/g, *kernel) for the
grouped conv, a norm's (K*C), an embedding's (K*V, D). So the fused kernels read parameters, not
views made at every step, and the cost model times them as the kernels they are. The layers:

* Linear -> one batched matmul (bmm) over the K models (one GEMM with the weights side by side when the
  K models read the same input);
* ConvNd -> one grouped convolution over K*C channels (groups x K);
* BatchNorm / GroupNorm -> one norm over K*C channels (the statistics stay per channel, so per
  model); LayerNorm -> one normalization, then each model's affine;
* Embedding -> one lookup in the K tables laid end to end (indices offset by k * V).

The graph around them keeps every per-model value with a leading K dim; the channel-folded
layout a conv or norm needs, (B, K*C, ...), is a view of that whenever the producer left it so,
which a chain of conv -> norm -> pointwise -> conv does. ``stacked=False`` says the K models read
one shared input (no leading K dim): the first layer then reads it once.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.core.errors import TraceError


def stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([t.detach() for t in tensors]).clone()


def _param(tensors: list[torch.Tensor], flat: bool = False) -> nn.Parameter:
    """The K tensors stacked (flat: the first two dims merged, (K*C, ...), model-major)."""
    t = stack(tensors)
    return nn.Parameter(t.flatten(0, 1) if flat and t.dim() > 1 else t, requires_grad=tensors[0].requires_grad)


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    t = stack(tensors)
    return t.flatten(0, 1) if t.dim() > 1 else t


def fold(x: torch.Tensor) -> torch.Tensor:
    """(K, B, C, *sp) -> (B, K*C, *sp): the K models' channels side by side."""
    return x.transpose(0, 1).flatten(1, 2)


def unfold(y: torch.Tensor, k: int) -> torch.Tensor:
    """(B, K*C, *sp) -> (K, B, C, *sp), a view."""
    return y.unflatten(1, (k, -1)).transpose(0, 1)


def linear(x, weight, bias, stacked: bool):
    """K linears: (K, ..., in) -> (K, ..., out) by one bmm; a shared x by one GEMM."""
    k, out_features, in_features = weight.shape
    if not stacked:  # the K weights side by side, then K to the front
        b = bias.reshape(-1) if bias is not None else None
        return F.linear(x, weight.reshape(k * out_features, in_features), b).unflatten(-1, (k, out_features)).movedim(-2, 0)
    # bmm then the bias: baddbmm with a transposed weight runs at half bmm's speed on CPU
    y = torch.bmm(x.reshape(k, -1, in_features), weight.transpose(1, 2))
    if bias is not None:
        y = y + bias.unsqueeze(1)
    return y.reshape(x.shape[:-1] + (out_features,))


def conv(x, weight, bias, stride, padding, dilation, groups: int, stacked: bool, k: int,
         padding_mode: str = "zeros", pad: tuple = ()):
    """K convolutions as one with K x groups groups over the K models' channels side by side;
    ``weight`` is (K*C_out, C_in/groups, *kernel), ``bias`` (K*C_out)."""
    nd = weight.dim() - 2
    fn = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    w, b = weight, bias
    if stacked:
        x, groups = fold(x), groups * k
    elif groups > 1:
        x, groups = x.repeat((1, k) + (1,) * nd), groups * k
    # (a shared input and groups == 1: one plain conv against all K models' filters)
    if padding_mode != "zeros":  # nn.Conv's own order: pad the spatial dims, then convolve unpadded
        x, padding = F.pad(x, pad, mode=padding_mode), 0
    return unfold(fn(x, w, b, stride, padding, dilation, groups), k)


def batch_norm(x, running_mean, running_var, weight, bias, training: bool, momentum: float, eps: float,
               stacked: bool, k: int):
    """Batch norm over the K*C channels (statistics and affine all (K*C)): each channel's
    statistics are its own model's."""
    x = fold(x) if stacked else x.repeat((1, k) + (1,) * (x.dim() - 2))
    return unfold(F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps), k)


def layer_norm(x, normalized_shape, weight, bias, eps: float, stacked: bool, k: int):
    """One normalization of all K models' values, then each model's own affine."""
    y = F.layer_norm(x, normalized_shape, None, None, eps)
    if weight is None and bias is None:
        return y if stacked else y.unsqueeze(0).expand((k,) + y.shape)
    lead = x.dim() - len(normalized_shape) - (1 if stacked else 0)
    view = (k,) + (1,) * lead + tuple(normalized_shape)
    w = weight.reshape(view) if weight is not None else None
    b = bias.reshape(view) if bias is not None else None
    if w is None:
        return y + b
    if b is None:
        return y * w
    return torch.addcmul(b, y, w)


def embedding(idx, weight, offsets, padding_idx, stacked: bool):
    """K lookups as one in the K tables laid end to end, ``weight`` (K*V, D): model k's indices
    are offset by ``offsets[k]`` = k * V."""
    rank = idx.dim() - (1 if stacked else 0)
    y = F.embedding(idx + offsets.reshape(offsets.shape + (1,) * rank), weight)
    if padding_idx is not None:  # the padding row gets no gradient, as in nn.Embedding
        y = torch.where((idx == padding_idx).unsqueeze(-1), y.detach(), y)
    return y


def channels(fn, x, k: int, *args, **kwargs):
    """An op on (N, C, ...) that treats channels alike (pooling, resizing) on the K models at once."""
    return unfold(fn(fold(x), *args, **kwargs), k)


class FusedLinear(nn.Module):
    def __init__(self, layers: list[nn.Linear]):
        super().__init__()
        self.k, self.in_features, self.out_features = len(layers), layers[0].in_features, layers[0].out_features
        self.weight = _param([m.weight for m in layers])
        self.bias = _param([m.bias for m in layers]) if layers[0].bias is not None else None

    def forward(self, x, stacked: bool = True):
        return linear(x, self.weight, self.bias, stacked)


class FusedConv(nn.Module):
    def __init__(self, layers: list[nn.modules.conv._ConvNd]):
        super().__init__()
        m = layers[0]
        if m.transposed:
            raise TraceError(f"fuse: {type(m).__name__} is not supported (transposed convolutions); "
                             "fuse models built from Conv1d/2d/3d")
        self.k, self.groups, self.nd = len(layers), m.groups, len(m.kernel_size)
        self.stride, self.padding, self.dilation = m.stride, m.padding, m.dilation
        self.padding_mode = m.padding_mode
        self._pad = m._reversed_padding_repeated_twice
        self.weight = _param([x.weight for x in layers], flat=True)
        self.bias = _param([x.bias for x in layers], flat=True) if m.bias is not None else None

    def forward(self, x, stacked: bool = True):
        return conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups, stacked,
                    self.k, self.padding_mode, self._pad)


class FusedBatchNorm(nn.Module):
    def __init__(self, layers: list[nn.modules.batchnorm._BatchNorm]):
        super().__init__()
        m = layers[0]
        if m.momentum is None and m.track_running_stats:
            raise TraceError("fuse: BatchNorm with momentum=None (a cumulative average) is not supported; "
                             "give it a momentum")
        self.k, self.eps, self.momentum = len(layers), m.eps, m.momentum
        self.track_running_stats = m.track_running_stats
        self.weight = _param([x.weight for x in layers], flat=True) if m.affine else None
        self.bias = _param([x.bias for x in layers], flat=True) if m.affine else None
        if m.track_running_stats:
            self.register_buffer("running_mean", _flat([x.running_mean for x in layers]))
            self.register_buffer("running_var", _flat([x.running_var for x in layers]))
            self.register_buffer("num_batches_tracked", stack([x.num_batches_tracked for x in layers]))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def forward(self, x, stacked: bool = True):
        use_batch = self.training or not self.track_running_stats
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, use_batch,
                          self.momentum if self.momentum is not None else 0.0, self.eps, stacked, self.k)


class FusedGroupNorm(nn.Module):
    def __init__(self, layers: list[nn.GroupNorm]):
        super().__init__()
        m = layers[0]
        self.k, self.num_groups, self.eps = len(layers), m.num_groups, m.eps
        self.weight = _param([x.weight for x in layers], flat=True) if m.affine else None
        self.bias = _param([x.bias for x in layers], flat=True) if m.affine else None

    def forward(self, x, stacked: bool = True):
        x = fold(x) if stacked else x.repeat((1, self.k) + (1,) * (x.dim() - 2))
        return unfold(F.group_norm(x, self.num_groups * self.k, self.weight, self.bias, self.eps), self.k)


class FusedLayerNorm(nn.Module):
    def __init__(self, layers: list[nn.LayerNorm]):
        super().__init__()
        m = layers[0]
        self.k, self.normalized_shape, self.eps = len(layers), tuple(m.normalized_shape), m.eps
        self.weight = _param([x.weight for x in layers]) if m.weight is not None else None
        self.bias = _param([x.bias for x in layers]) if m.bias is not None else None

    def forward(self, x, stacked: bool = True):
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, stacked, self.k)


class FusedEmbedding(nn.Module):
    def __init__(self, layers: list[nn.Embedding]):
        super().__init__()
        m = layers[0]
        if m.max_norm is not None or m.sparse or m.scale_grad_by_freq:
            raise TraceError("fuse: Embedding with max_norm, sparse or scale_grad_by_freq is not supported; "
                             "fuse embeddings without them")
        self.k, self.num_embeddings, self.padding_idx = len(layers), m.num_embeddings, m.padding_idx
        self.weight = _param([x.weight for x in layers], flat=True)
        self.register_buffer("offsets", torch.arange(self.k, device=self.weight.device) * self.num_embeddings,
                             persistent=False)

    def forward(self, idx, stacked: bool = True):
        return embedding(idx, self.weight, self.offsets, self.padding_idx, stacked)


FUSED = {nn.Linear: FusedLinear, nn.Conv1d: FusedConv, nn.Conv2d: FusedConv, nn.Conv3d: FusedConv,
         nn.BatchNorm1d: FusedBatchNorm, nn.BatchNorm2d: FusedBatchNorm, nn.BatchNorm3d: FusedBatchNorm,
         nn.GroupNorm: FusedGroupNorm, nn.LayerNorm: FusedLayerNorm, nn.Embedding: FusedEmbedding}


def fused_layer(layers: list[nn.Module]) -> nn.Module:
    """One fused module for K layers of one type (exact type: subclasses may compute otherwise)."""
    cls = FUSED.get(type(layers[0]))
    if cls is None:
        raise TraceError(f"fuse: no fused form of {type(layers[0]).__name__} (a layer with parameters); "
                         f"fusable layers: {', '.join(sorted({c.__name__ for c in FUSED}))}")
    return cls(layers)
