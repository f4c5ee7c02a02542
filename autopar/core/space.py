"""Which configurations a node may take: the strategy space the searches choose from.

``mesh`` (the default): every assignment of the mesh's axes to the node's splittable dims, or to
no dim (the axis then replicates the node), such that each dim's split divides its size. Mesh axes
of equal size and equal level are interchangeable (the same links, the same sizes), so of all the
assignments that differ only by permuting such axes one canonical representative is kept: within
each class of equal axes, axes are handed out in ascending order to dims in ascending order.
That turns ``(dims + 1) ** axes`` assignments into a product over classes of multisets.

``pase:K`` reproduces PaSE's space: any split factors whose product is at most p, each dividing
its dim's size and leaving at least K elements per part. Its configs have no mesh axes;
``autopar.core.layout.to_mesh`` maps one onto the mesh where that is possible.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable

import numpy as np

from autopar.core.ir import Node
from autopar.core.tables import Config, Mesh


def replicated(node: Node) -> Config:
    """The config that runs the whole node on every device."""
    n = len(node.dims)
    return Config(splits=(1,) * n, mesh_axes=((),) * n)


def axis_classes(mesh: Mesh) -> list[list[int]]:
    """Mesh axes grouped by (size, level), each group ascending, groups in order of first axis."""
    level = mesh.level or (0,) * len(mesh.shape)
    groups: dict[tuple[int, int], list[int]] = {}
    for a, (size, lev) in enumerate(zip(mesh.shape, level)):
        groups.setdefault((size, lev), []).append(a)
    return list(groups.values())


def mesh_configs(node: Node, mesh: Mesh) -> list[Config]:
    """The default space; ``[0]`` is always the replicated config."""
    if node.unsupported or not node.dims:
        return [replicated(node)]
    # A function of the dims' sizes and splittability and of the mesh only: memoised, so the
    # many nodes (and graphs: the pipeline's microbatch sizes) of one shape enumerate it once.
    return list(_mesh_configs(tuple((d.size, d.splittable) for d in node.dims), mesh))


@functools.lru_cache(maxsize=4096)
def _mesh_configs(dims: tuple[tuple[int, bool], ...], mesh: Mesh) -> tuple[Config, ...]:
    n = len(dims)
    cands = [i for i, (size, splittable) in enumerate(dims) if splittable and size > 1]
    bins = len(cands) + 1  # bin 0 = no dim (replicate), bin j > 0 = dim cands[j - 1]

    def divides(splits) -> bool:
        return all(size % s == 0 for (size, _), s in zip(dims, splits))

    # Each class's assignments, as (axes per dim, split per dim); one whose partial splits do not
    # divide a dim cannot be completed by the other classes (splits only multiply), so it is
    # dropped before the product: the same configs in the same order, fewer combinations.
    per_class = []
    for axes in axis_classes(mesh):
        options = []
        for combo in itertools.combinations_with_replacement(range(bins), len(axes)):
            assigned: list[list[int]] = [[] for _ in dims]
            for a, b in zip(axes, combo):  # both ascending: the canonical representative
                if b:
                    assigned[cands[b - 1]].append(a)
            splits = tuple(math.prod(mesh.shape[a] for a in ax) for ax in assigned)
            if divides(splits):
                options.append((tuple(map(tuple, assigned)), splits))
        per_class.append(options)
    # The product over classes in numpy (row-major: the last class varies fastest, as in
    # itertools.product), then Configs only for the combinations whose splits divide every dim.
    if not per_class:  # a mesh of one device: the one assignment of no axes
        return (Config(splits=(1,) * n, mesh_axes=((),) * n),)
    counts = tuple(len(options) for options in per_class)
    total = np.ones((1, n), dtype=np.int64)
    for options in per_class:
        part = np.array([o[1] for o in options], dtype=np.int64).reshape(len(options), n)
        total = (total[:, None, :] * part[None, :, :]).reshape(-1, n)
    sizes = np.array([size for size, _ in dims], dtype=np.int64)
    ok = np.flatnonzero(np.all(sizes % total == 0, axis=1))
    out: list[Config] = []
    for flat, combo in zip(ok.tolist(), zip(*np.unravel_index(ok, counts))):
        choice = [per_class[c][k][0] for c, k in enumerate(combo)]
        mesh_axes = tuple(tuple(sorted(itertools.chain.from_iterable(ch[i] for ch in choice)))
                          for i in range(n))
        out.append(Config(splits=tuple(int(x) for x in total[flat]), mesh_axes=mesh_axes))
    return tuple(out)


def pase_configs(node: Node, devices: int, cutoff: int = 1) -> list[Config]:
    """PaSE's space: split factors with product <= devices, each dividing its dim, >= cutoff each."""
    if node.unsupported or not node.dims:
        return [Config(splits=(1,) * len(node.dims))]
    options = []
    for d in node.dims:
        if not d.splittable:
            options.append([1])
            continue
        options.append([k for k in range(1, min(d.size, devices) + 1)
                        if d.size % k == 0 and (k == 1 or d.size // k >= cutoff)])
    return [Config(splits=s) for s in itertools.product(*options) if math.prod(s) <= devices]


Space = str | Callable[[Node, Mesh], list[Config]]


def configs_for(node: Node, mesh: Mesh, space: Space = "mesh") -> list[Config]:
    """Configs of ``node`` in ``space``: "mesh", "pase" / "pase:K", or a callable(node, mesh)."""
    if callable(space):
        return space(node, mesh)
    if space == "mesh":
        return mesh_configs(node, mesh)
    if space.startswith("pase"):
        cutoff = int(space.split(":", 1)[1]) if ":" in space else 1
        return pase_configs(node, mesh.size, cutoff)
    raise ValueError(f"unknown space {space!r}; known: 'mesh', 'pase', 'pase:K', or a callable")
