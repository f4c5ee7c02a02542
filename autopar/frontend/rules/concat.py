"""cat, and split/chunk/unbind (one node with several outputs).

The joined axis of a cat is unsplittable: its pieces have different sizes, so a shard of the whole
is not a shard of each piece. Empty pieces do not count: ``cat([empty_cache, k], -2)`` (a
transformers key/value cache in a training step) is ``k``, and its axis splits. The cut axis of
a split stays whole too; each piece splits again downstream (GPT-2's ``qkv.split(64, dim=2)``
pieces split by heads in the ``view(b, s, h, d)`` that follows). Every other axis is a free dim
shared by all the tensors.
"""

from __future__ import annotations

from autopar.frontend.rules.base import Call, Result, generic_names, names_axes, norm_axis, same_dims


def cat(call: Call) -> Result:
    tensors = [t for t in call.tensors()]
    out = call.outs[0]
    axis = norm_axis(int(call.args.get("dim", 0)), out.ndim)
    names = generic_names(out.ndim)
    full = [t for t in tensors if t.ndim == out.ndim and t.shape[axis] > 0]
    whole = len(full) == 1  # every other piece is empty: the cat is its one full piece
    reads = []
    for t in tensors:
        if t.ndim != out.ndim or (whole and t is not full[0]):  # empty pieces (and legacy empty 1-D tensors)
            reads.append((t, ((),) * t.ndim))
            continue
        reads.append((t, tuple(() if i == axis and not whole else (n,) for i, n in enumerate(names))))
    return Result("cat", same_dims(names, out.shape, unsplittable=set() if whole else {names[axis]}), reads,
                  [names_axes(names)], 0,
                  {"axis": axis, "sizes": tuple(t.shape[axis] for t in tensors if t.ndim == out.ndim)})


def split(call: Call) -> Result:
    x = call.args["input"]
    axis = norm_axis(int(call.args.get("dim", 0)), x.ndim)
    squeeze = call.fixed.get("kind") == "unbind"
    names = generic_names(x.ndim)
    outs = []
    for _ in call.outs:
        axes = [(n,) for n in names]
        if squeeze:
            del axes[axis]
        else:
            axes[axis] = ()
        outs.append(tuple(axes))
    sizes = tuple(1 if squeeze else o.shape[axis] for o in call.outs)
    return Result("split", same_dims(names, x.shape, unsplittable={names[axis]}), [(x, names_axes(names))], outs, 0,
                  {"axis": axis, "sizes": sizes, "squeeze": squeeze}, bytes_read=0, bytes_written=0)


def stack(call: Call) -> Result:
    """``torch.stack``: a cat along a new axis of size len(tensors); op "cat" with ``new_axis``."""
    tensors = call.tensors()
    out = call.outs[0]
    axis = norm_axis(int(call.args.get("dim", 0)), out.ndim)
    names = generic_names(out.ndim)
    in_axes = tuple((n,) for i, n in enumerate(names) if i != axis)
    return Result("cat", same_dims(names, out.shape, unsplittable={names[axis]}), [(t, in_axes) for t in tensors],
                  [names_axes(names)], 0, {"axis": axis, "sizes": (1,) * len(tensors), "new_axis": True})
