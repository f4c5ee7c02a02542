"""nn.GRU and nn.RNN as ONE node for all their layers (and directions): leaves for the fx tracer,
whose walk into their forward branches on tensors.

Dims as for the LSTM (``lstm.py``): ``b`` batch, ``t`` time steps, ``l`` layers, ``g`` the gates
(3 for a GRU, 1 for an Elman RNN), ``h`` hidden units, ``dir`` when bidirectional. Only the batch
splits here: cutting the hidden units would need every step's whole hidden state (the LSTM's
``h`` split is run whole by codegen); these are data-parallel or replicated. FLOPs count the gate
matmuls as ``torch.utils.flop_counter`` does on meta tensors: 2 * b * t * (in + hidden) * gates *
hidden per layer and direction.
"""

from __future__ import annotations

from autopar.core.ir import Dim
from autopar.frontend.rules.base import Call, Result
from autopar.frontend.rules.lstm import gate_flops, weight_reads


def gru(call: Call) -> Result:
    return recurrent(call, "gru", 3)


def rnn(call: Call) -> Result:
    return recurrent(call, "rnn", 1)


def recurrent(call: Call, op: str, gates: int) -> Result:
    x = call.args["input"]
    cfg = call.fixed
    H, L = int(cfg["hidden"]), int(cfg["layers"])
    bidir, batch_first = bool(cfg["bidirectional"]), bool(cfg["batch_first"])
    dirs = 2 if bidir else 1
    if x.ndim != 3:
        raise ValueError(f"an unbatched {op.upper()} input is not described")
    B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    dims = [Dim("b", B), Dim("t", T, splittable=False), Dim("l", L, splittable=False)]
    if bidir:
        dims.append(Dim("dir", 2, splittable=False))
    dims += [Dim("g", gates, splittable=False), Dim("h", H, splittable=False)]
    feat = ("dir", "h") if bidir else ("h",)
    x_axes = (("b",), ("t",), ()) if batch_first else (("t",), ("b",), ())
    out_axes = (("b",), ("t",), feat) if batch_first else (("t",), ("b",), feat)
    state_axes = ((), ("b",), ("h",))
    reads = [(x, x_axes)]
    hx = call.args.get("hx")
    if hx is not None and hasattr(hx, "shape"):
        reads.append((hx, state_axes))
    reads += weight_reads(call)
    I = x.shape[-1]
    flops = gate_flops(B, T, I, H, L, dirs, gates)
    attrs = {"hidden": H, "layers": L, "batch_first": batch_first, "bidirectional": bidir, "input_size": I,
             "bias": bool(cfg.get("bias", True))}
    if op == "rnn":
        attrs["nonlinearity"] = cfg.get("nonlinearity", "tanh")
    return Result(op, dims, reads, [out_axes, state_axes][: len(call.outs)], flops, attrs)
