"""A compiled module called with another batch size than it was traced with.

The program's sizes are the traced constants, so a batch of another size (the last, smaller
batch of an epoch) runs a program built for that size: the same graph and plan, every batch dim
scaled to the new size (``core.batch.with_batch``), its sizes propagated again through the traced
graph on meta tensors, built once and kept per size. Where the plan's data-parallel degree does not
divide the new batch, the ranks hold uneven rows of it (``uneven.py``), and the loss and gradients
are still the single-device ones.

``inputs="global"``: every rank passes the whole batch, of any size. ``inputs="local"``: each
rank passes its own slice, and the whole batch is taken to be that slice's size times the
data-parallel degree, so every rank must pass a slice of the same size (``DistributedSampler``
gives each rank as many samples, padding the last batch's if needed), and no larger than the
compiled one (a larger slice is taken for the whole batch passed by mistake, and refused); slices
of different sizes on different ranks are not detected. A graph ``torch.export`` captured with a fixed batch (the
model pins it) runs only that batch.
"""

from __future__ import annotations

import torch

from autopar.core.batch import with_batch

from .placements import LayoutError


def batch_of(module, inputs: list) -> int:
    """The whole batch size the call's inputs carry; a one-line ValueError where an input's shape
    differs from the traced one other than in its batch (first) axis, where the batched inputs
    disagree, or where this module cannot run another batch size."""
    program = module.program
    sizes: dict[str, int] = {}
    for name, v in zip(program.inputs, inputs):
        if not isinstance(v, torch.Tensor) or name not in module._input_specs or name in program.boundary.inputs:
            continue  # a pipeline stage's received shard is no batch the caller chose
        expected, parts, batched = _expected(module, name)
        if v.shape == expected:
            if batched:
                sizes[name] = module._batch
            continue
        local = name in program.input_placements  # a larger slice is most likely the whole batch: refused
        if not batched or tuple(v.shape[1:]) != tuple(expected[1:]) or not _rebuildable(module) \
                or (local and v.shape[0] > expected[0]):
            what = "this rank's slice of" if local else "the whole"
            raise ValueError(f"input {name!r} has shape {tuple(v.shape)}; this module was compiled for {what} batch "
                             f"of shape {tuple(expected)}: compile it again with inputs of the new shape (drop_last=True "
                             "in the DataLoader keeps every batch the same size)")
        sizes[name] = int(v.shape[0]) * parts
    if len(set(sizes.values())) > 1:
        raise ValueError(f"the batched inputs disagree on the batch size: {sizes}")
    size = next(iter(sizes.values()), module._batch)
    if size < 1:
        raise ValueError("an empty batch: pass at least one sample")
    return size


def _expected(module, name: str) -> tuple[torch.Size, int, bool]:
    """(the shape the traced program takes for input ``name``, the parts its batch is cut into
    with ``inputs="local"``, whether its first axis is the batch), found once per input."""
    cache = module.__dict__.setdefault("_expected_inputs", {})
    if name not in cache:
        spec = module._input_specs[name]
        parts = module._parts(name)
        shape = list(spec.shape)
        call = module._call  # the front end's list of batched inputs, else those led by the batch's size
        batched = bool(shape) and (name in call.batched if call is not None and call.batched
                                   else shape[0] == module._batch)
        if shape and parts > 1:
            shape[0] //= parts
        cache[name] = (torch.Size(shape), parts, batched)
    return cache[name]


def _rebuildable(module) -> bool:
    """Whether the module can build a program for another batch size."""
    call = module._call
    static = module._export and call is not None and not call.dynamic_batch
    return module._rebuild is not None and module._batch is not None and not static


def program_for_batch(graph, assignment, mesh, outputs, inputs, training, model, size: int):
    """The rank's program for ``graph`` at batch ``size`` (``compile_module`` binds the rest)."""
    from .program import build

    return build(with_batch(graph, size), assignment, mesh, model, outputs, inputs, training)


def rebuilt(module, size: int):
    """(program, state tensors) for batch ``size``: the same parameters, the same gradient sums."""
    program = module._rebuild(module, size)
    first = module.program
    if program.reduce_axes != first.reduce_axes or program.sync_bn != first.sync_bn \
            or not set(program.state) <= set(module._locals):
        raise LayoutError(f"the program for a batch of {size} reads or syncs the parameters otherwise than the "
                          f"one for {module._batch}: use batches of {module._batch} (DataLoader(drop_last=True))")
    uneven = any(getattr(getattr(m, "spec", None), "shape", None) is not None for m in program.module.modules())
    if uneven and module._outputs == "dtensor":  # DTensor.from_local would take the shards for even ones
        raise LayoutError(f"outputs='dtensor' with a batch of {size}, which the data-parallel degree does not "
                          "divide: use outputs='replicate' or 'local' for it, or batches the degree divides")
    return program, [module._locals[name] for name in program.state]
