"""The node table of a plan made under PaSE's cost model: PaSE's nodes, dims and units."""

from __future__ import annotations

from autopar.report.format import table

PASE_UNITS = "pase-flop"


def fmt_pase(v: float) -> str:
    return "0" if v == 0 else f"{v:.4g}"


def pase_lines(plan) -> list[str]:
    u = PASE_UNITS
    header = ["node", "from (traced nodes)", "iteration space", "split", f"compute ({u})", f"comm ({u})",
              f"total ({u})"]
    rows = [[r.name, r.sources, r.space, r.split, fmt_pase(r.compute), fmt_pase(r.comm),
             fmt_pase(r.compute + r.comm)] for r in plan.rows]
    lines = table(rows, header)
    lines.append(f"costs in PaSE's FLOP-equivalent units ({u}), not seconds: compute is the layer's "
                 "arithmetic (PaSE's count, forward and backward), comm is r x the 8-byte words it moves "
                 "(all-reduces, halos) plus the edges into it; dims as in PaSE: b batch, c_in/k reduced "
                 "inputs, n outputs, r/s kernel, h/w spatial, d<i> other tensor axes")
    return lines
