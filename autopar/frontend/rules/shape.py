"""Metadata ops: view/reshape (and flatten, squeeze...), permute/transpose, identity, slicing.

view groups input and output axes whose sizes multiply to the same number. A split axis
``(b, s, h*d) -> (b, s, h, d)`` gives the input axis the merged dims ``("h", "d")``; a merge gives
the output axis the merged dims. Views, permutes and slices move no data (0 bytes); ``contiguous``
and ``clone`` (identity) copy theirs.
"""

from __future__ import annotations

from autopar.core.ir import Dim
from autopar.frontend.rules.base import Call, Result, Tensor, generic_names, names_axes, norm_axis, same_dims


def view(call: Call) -> Result:
    x, out = call.args["input"], call.outs[0]
    in_axes: list[tuple] = [()] * x.ndim
    out_axes: list[tuple] = [()] * out.ndim
    dims: list[Dim] = []
    for ins, outs in _groups(x.shape, out.shape):
        first = len(dims)
        if len(outs) == 1:  # kept or merged: one dim per input axis, the output axis holds them all
            names = generic_names(first + len(ins))[first:]
            dims += [Dim(n, x.shape[a]) for n, a in zip(names, ins)]
            for n, a in zip(names, ins):
                in_axes[a] = (n,)
            out_axes[outs[0]] = tuple(names)
        elif len(ins) == 1:  # split: one dim per output axis, the input axis holds them all
            names = generic_names(first + len(outs))[first:]
            dims += [Dim(n, out.shape[a]) for n, a in zip(names, outs)]
            for n, a in zip(names, outs):
                out_axes[a] = (n,)
            in_axes[ins[0]] = tuple(names)
        else:  # (6, 4) -> (4, 6): no dim survives the regrouping as a plain shard
            names = generic_names(first + len(ins))[first:]
            dims += [Dim(n, x.shape[a], splittable=False) for n, a in zip(names, ins)]
            for n, a in zip(names, ins):
                in_axes[a] = (n,)
    return Result("view", dims, [(x, tuple(in_axes))], [tuple(out_axes)], 0, {"shape": tuple(out.shape)},
                  bytes_read=0, bytes_written=0)


def _groups(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Pairs of (input axes, output axes) with equal products; size-1 axes belong to no group."""
    ia = [i for i, s in enumerate(a) if s != 1]
    ib = [j for j, s in enumerate(b) if s != 1]
    groups, i, j = [], 0, 0
    while i < len(ia) and j < len(ib):
        gi, gj = [ia[i]], [ib[j]]
        pa, pb = a[ia[i]], b[ib[j]]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(ia):
                gi.append(ia[i]); pa *= a[ia[i]]; i += 1
            elif pb < pa and j < len(ib):
                gj.append(ib[j]); pb *= b[ib[j]]; j += 1
            else:
                break
        groups.append((gi, gj))
    return groups


def permute(call: Call) -> Result:
    x = call.args["input"]
    n = x.ndim
    kind = call.fixed.get("kind", "permute")
    perm = list(range(n))
    if kind == "transpose":
        a, b = norm_axis(int(call.args["dim0"]), n), norm_axis(int(call.args["dim1"]), n)
        perm[a], perm[b] = perm[b], perm[a]
    elif kind == "permute":
        dims = call.args["dims"]
        if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
            dims = dims[0]
        perm = [norm_axis(int(d), n) for d in dims]
    elif kind in ("t", "T"):
        perm = perm[::-1]
    elif kind == "mT" and n >= 2:
        perm[-1], perm[-2] = perm[-2], perm[-1]
    names = generic_names(n)
    return Result("permute", same_dims(names, x.shape), [(x, names_axes(names))],
                  [names_axes([names[p] for p in perm])], 0, {"perm": tuple(perm)}, bytes_read=0, bytes_written=0)


def identity(call: Call) -> Result:
    """Pass-throughs and casts. A cast to another dtype reads and writes every element
    (elementwise ``to``); ``x.type_as(y)`` and ``x.to(y)`` read ``y`` for its dtype only, so ``y``
    is a metadata read (any layout will do) and ``x`` the one operand."""
    tensors = call.tensors()
    x = tensors[0]
    out = call.outs[0]
    names = generic_names(x.ndim)
    fn = call.fixed.get("fn", call.target.rsplit(".", 1)[-1])
    free = fn in ("alias", "detach", "to", "type_as", "type", "float", "identity")
    meta = tensors[1:] if fn in CASTS_LIKE else []
    if out.dtype != x.dtype:  # a cast reads and writes every element: elementwise, not identity
        return Result("elementwise", same_dims(names, x.shape), [(x, names_axes(names))], [names_axes(names)], 0,
                      {"fn": "to", "dtype": out.dtype}, metadata_reads=meta)
    return Result("identity", same_dims(names, x.shape), [(x, names_axes(names))], [names_axes(names)], 0,
                  {"fn": fn}, **({"bytes_read": 0, "bytes_written": 0} if free else {}), metadata_reads=meta)


CASTS_LIKE = ("type_as", "to")  # ops whose other tensor argument gives the dtype (and device) only


def slice_(call: Call) -> Result:
    """``x[idx]`` with ints, slices, None and ``...``; tensor (advanced) indices are opaque.

    An axis kept whole shares one dim between input and output; a partial slice gives the output
    a fresh dim and the input axis ``()`` (the input must be whole where the slice is taken).
    """
    x = call.args["input"]
    index = _index(call, x)
    if index is None:
        from autopar.frontend.rules.opaque import opaque

        call.fixed.setdefault("reason", "indexing with a tensor (gather/scatter) has no split rule")
        return opaque(call)
    in_axes: list[tuple] = []
    out_axes: list[tuple] = []
    dims: list[Dim] = []
    axis = 0
    for item in index:
        if item is None:
            out_axes.append(())
            continue
        if isinstance(item, int):
            in_axes.append(())
            axis += 1
            continue
        size = x.shape[axis]
        n = len(range(*item.indices(size)))
        name = f"d{len(dims)}"
        dims.append(Dim(name, n))
        in_axes.append((name,) if n == size and item.indices(size) == (0, size, 1) else ())
        out_axes.append((name,))
        axis += 1
    return Result("slice", dims, [(x, tuple(in_axes))], [tuple(out_axes)], 0, {"index": tuple(index)},
                  bytes_read=0, bytes_written=0)


def _index(call: Call, x: Tensor):
    """The index as a full tuple (ellipsis expanded, trailing axes as full slices), or None."""
    kind = call.fixed.get("kind", "getitem")
    if kind == "slice":  # aten.slice.Tensor(self, dim, start, end, step)
        d = norm_axis(int(call.args.get("dim", 0)), x.ndim)
        idx = [slice(None)] * x.ndim
        idx[d] = slice(call.args.get("start"), call.args.get("end"), call.args.get("step", 1))
        return idx
    if kind == "narrow":  # narrow(self, dim, start, length)
        d = norm_axis(int(call.args["dim"]), x.ndim)
        start = int(call.args["start"]) % x.shape[d] if x.shape[d] else 0
        idx = [slice(None)] * x.ndim
        idx[d] = slice(start, start + int(call.args["length"]))
        return idx
    if kind == "select":  # aten.select.int(self, dim, index)
        d = norm_axis(int(call.args["dim"]), x.ndim)
        idx = [slice(None)] * x.ndim
        i = int(call.args["index"])
        idx[d] = i + x.shape[d] if i < 0 else i
        return idx
    raw = call.args["index"]
    raw = list(raw) if isinstance(raw, tuple) else [raw]
    if any(not (r is None or r is Ellipsis or isinstance(r, (int, slice))) or isinstance(r, bool) for r in raw):
        return None
    used = sum(1 for r in raw if r is not None and r is not Ellipsis)
    out: list = []
    for r in raw:
        if r is Ellipsis:
            out += [slice(None)] * (x.ndim - used)
        else:
            out.append(r)
    consumed = sum(1 for r in out if r is not None)
    out += [slice(None)] * (x.ndim - consumed)
    axis = 0
    for k, r in enumerate(out):  # negative ints count from the end of their axis
        if r is None:
            continue
        if isinstance(r, int) and r < 0:
            out[k] = r + x.shape[axis]
        axis += 1
    return out
