"""nn.GRU as ONE node for all its layers (and directions): a leaf for the fx tracer, whose walk
into ``nn.GRU.forward`` branches on tensors.

Dims as for the LSTM (``lstm.py``): ``b`` batch, ``t`` time steps, ``l`` layers, ``g`` the three
gates, ``h`` hidden units, ``dir`` when bidirectional. Only the batch splits here: cutting the
hidden units would need every step's whole hidden state (the LSTM's ``h`` split is run whole by
codegen); a GRU is data-parallel or replicated. FLOPs count the gate matmuls as
``torch.utils.flop_counter`` does on meta tensors: 2 * b * t * (in + hidden) * 3 * hidden per
layer and direction.
"""

from __future__ import annotations

from autopar.ir import Dim
from autopar.rules.base import Call, Result


def gru(call: Call) -> Result:
    x = call.args["input"]
    cfg = call.fixed
    H, L = int(cfg["hidden"]), int(cfg["layers"])
    bidir, batch_first = bool(cfg["bidirectional"]), bool(cfg["batch_first"])
    dirs = 2 if bidir else 1
    if x.ndim != 3:
        raise ValueError("an unbatched GRU input is not described")
    B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    dims = [Dim("b", B), Dim("t", T, splittable=False), Dim("l", L, splittable=False)]
    if bidir:
        dims.append(Dim("dir", 2, splittable=False))
    dims += [Dim("g", 3, splittable=False), Dim("h", H, splittable=False)]
    feat = ("dir", "h") if bidir else ("h",)
    x_axes = (("b",), ("t",), ()) if batch_first else (("t",), ("b",), ())
    out_axes = (("b",), ("t",), feat) if batch_first else (("t",), ("b",), feat)
    state_axes = ((), ("b",), ("h",))
    reads = [(x, x_axes)]
    hx = call.args.get("hx")
    if hx is not None and hasattr(hx, "shape"):
        reads.append((hx, state_axes))
    for w in call.args.get("weights", ()):
        reads.append((w, (("g", "h"),) + ((),) * (w.ndim - 1)))
    flops = 0
    I = x.shape[-1]
    for layer in range(L):
        width = I if layer == 0 else H * dirs
        flops += dirs * 2 * B * T * (width + H) * 3 * H
    attrs = {"hidden": H, "layers": L, "batch_first": batch_first, "bidirectional": bidir, "input_size": I,
             "bias": bool(cfg.get("bias", True))}
    return Result("gru", dims, reads, [out_axes, state_axes][: len(call.outs)], flops, attrs)
