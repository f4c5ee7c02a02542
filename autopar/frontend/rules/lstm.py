"""nn.LSTM as ONE node for all its layers (and directions), as PaSE models a recurrent layer.

Dims: ``b`` batch, ``t`` time steps (unsplittable: step t needs step t-1), ``l`` layers
(unsplittable: layer i needs layer i-1), ``g`` the four gates (unsplittable: a cell needs all
four), ``h`` hidden units, and ``dir`` when bidirectional. Splitting ``h`` cuts every gate matrix
by rows (``("g", "h")``); each step then needs the whole previous hidden state, which the cost
model prices. FLOPs count the gate matmuls as ``torch.utils.flop_counter`` does where it can see
them (on meta tensors, where LSTM decomposes into ``addmm``): 2 * b * t * (in + hidden) * 4 * hidden
per layer and direction. On CPU flop_counter counts 0: the fused ``mkldnn_rnn_layer`` kernel has no
FLOP formula, which would price an LSTM as free.
"""

from __future__ import annotations

from autopar.core.ir import Dim
from autopar.frontend.rules.base import Call, Result, Tensor


def lstm(call: Call) -> Result:
    x = call.args["input"]
    cfg = call.fixed if "hidden" in call.fixed else _aten_config(call)
    H, L = int(cfg["hidden"]), int(cfg["layers"])
    bidir = bool(cfg.get("bidirectional", False))
    batch_first = bool(cfg.get("batch_first", False))
    dirs = 2 if bidir else 1
    batched = x.ndim == 3
    if batched:
        B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    else:
        B, T = 1, x.shape[0]
    dims = ([Dim("b", B)] if batched else []) + [Dim("t", T, splittable=False), Dim("l", L, splittable=False)]
    if bidir:
        dims.append(Dim("dir", 2))
    dims += [Dim("g", 4, splittable=False), Dim("h", H)]
    feat = ("dir", "h") if bidir else ("h",)
    if batched:
        x_axes = (("b",), ("t",), ()) if batch_first else (("t",), ("b",), ())
        out_axes = (("b",), ("t",), feat) if batch_first else (("t",), ("b",), feat)
        state_axes = ((), ("b",), ("h",))
    else:
        x_axes, out_axes, state_axes = (("t",), ()), (("t",), feat), ((), ("h",))
    reads = [(x, x_axes)]
    hx = call.args.get("hx")
    for t in (hx if isinstance(hx, (list, tuple)) else [hx] if isinstance(hx, Tensor) else []):
        reads.append((t, state_axes))
    reads += weight_reads(call)
    I = x.shape[-1]
    flops = gate_flops(B, T, I, H, L, dirs, gates=4)
    attrs = {"hidden": H, "layers": L, "batch_first": batch_first, "bidirectional": bidir, "input_size": I,
             "bias": bool(cfg.get("bias", True)), "dropout": float(cfg.get("dropout", 0.0))}
    return Result("lstm", dims, reads, [out_axes, state_axes, state_axes][: len(call.outs)], flops, attrs)


def weight_reads(call: Call) -> list:
    """weight_ih/hh (gates * H, in) and biases: rows are (gate, unit); columns are the whole
    input, never split. Shared by every recurrent rule."""
    return [(w, (("g", "h"),) + ((),) * (w.ndim - 1)) for w in call.args.get("weights", ())]


def gate_flops(B: int, T: int, I: int, H: int, L: int, dirs: int, gates: int) -> int:
    """The gate matmuls of a stacked recurrent layer: 2 B T (in + H) gates H per layer and
    direction, the first layer's input of width I, the others' of H * dirs."""
    return sum(dirs * 2 * B * T * ((I if layer == 0 else H * dirs) + H) * gates * H for layer in range(L))


def _aten_config(call: Call) -> dict:
    """aten.lstm.input(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)."""
    a = call.args
    hidden = a["hx"][0].shape[-1] if a.get("hx") else a["weights"][1].shape[1]
    return {"hidden": hidden, "layers": a["num_layers"], "bidirectional": a["bidirectional"],
            "batch_first": a["batch_first"], "bias": a["has_biases"], "dropout": a["dropout"]}
