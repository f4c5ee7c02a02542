"""The mesh config space: canonical, divisible, small; PaSE's space; mapping onto the mesh."""

import itertools
import math

from autopar.core.cluster import Cluster
from autopar.core.ir import Dim, Node, Operand, TensorSpec
from autopar.core.layout import to_mesh
from autopar.core.space import configs_for, mesh_configs, pase_configs
from autopar.core.tables import Config, Mesh


def linear(b=64, s=64, n=256, k=128, unsupported=""):
    x = Operand("prev", 0, TensorSpec((b, s, k), "float32", (("b",), ("s",), ("k",))))
    w = Operand("param:w", 0, TensorSpec((n, k), "float32", (("n",), ("k",))))
    return Node("fc", "linear", "torch.nn.Linear", "fc",
                (Dim("b", b), Dim("s", s), Dim("n", n), Dim("k", k, reduction=True)),
                (x,), (w,), (TensorSpec((b, s, n), "float32", (("b",), ("s",), ("n",))),),
                flops=2 * b * s * n * k, unsupported=unsupported)


def brute_canonical_count(node, mesh):
    """All (dims+1)^axes assignments, modulo permuting equal (size, level) axes."""
    level = mesh.level
    cands = [i for i, d in enumerate(node.dims) if d.splittable and d.size > 1]
    seen = set()
    for assign in itertools.product([None] + cands, repeat=len(mesh.shape)):
        splits = [1] * len(node.dims)
        for a, i in enumerate(assign):
            if i is not None:
                splits[i] *= mesh.shape[a]
        if any(d.size % s for d, s in zip(node.dims, splits)):
            continue
        # invariant under the symmetry: per dim, the multiset of (size, level) of its axes
        key = tuple(tuple(sorted((mesh.shape[a], level[a]) for a in range(len(assign)) if assign[a] == i))
                    for i in range(len(node.dims)))
        seen.add(key)
    return len(seen)


def test_gpt_linear_counts_at_8_16_64():
    node = linear()
    counts = {}
    for name in ("8xA100", "2x8xH100", "8x8xH100"):
        mesh = Cluster.preset(name).mesh()
        counts[name] = len(mesh_configs(node, mesh))
        assert counts[name] == brute_canonical_count(node, mesh)
    # 3 equal axes into 5 bins (4 dims + none): C(7,3) = 35; 16 adds one inter-node axis: 5 * 35
    assert counts == {"8xA100": 35, "2x8xH100": 175, "8x8xH100": 35 * 35}


def test_configs_are_well_formed():
    mesh = Mesh((2, 2, 2, 2), (1, 0, 0, 0))
    node = linear(b=4, s=2, n=8, k=6)
    cfgs = mesh_configs(node, mesh)
    assert cfgs[0] == Config((1, 1, 1, 1), ((), (), (), ()))
    assert len(set(cfgs)) == len(cfgs)
    for c in cfgs:
        used = [a for axes in c.mesh_axes for a in axes]
        assert len(used) == len(set(used))
        for d, s, axes in zip(node.dims, c.splits, c.mesh_axes):
            assert list(axes) == sorted(axes)
            assert s == math.prod(mesh.shape[a] for a in axes)
            assert d.size % s == 0
    # k = 6 takes at most one factor 2, s = 2 at most one
    assert max(c.splits[3] for c in cfgs) == 2 and max(c.splits[1] for c in cfgs) == 2
    assert len(cfgs) == brute_canonical_count(node, mesh)


def test_unsupported_and_unsplittable():
    mesh = Mesh((2, 2, 2), (0, 0, 0))
    assert mesh_configs(linear(unsupported="no rule"), mesh) == [Config((1, 1, 1, 1), ((), (), (), ()))]
    x = Operand("prev", 0, TensorSpec((8, 16), "float32", (("b",), ("c",))))
    ln = Node("ln", "layer_norm", "LayerNorm", "ln", (Dim("b", 8), Dim("c", 16, splittable=False)),
              (x,), (), (TensorSpec((8, 16), "float32", (("b",), ("c",))),))
    cfgs = mesh_configs(ln, mesh)
    assert all(c.splits[1] == 1 for c in cfgs) and len(cfgs) == 4  # 0..3 axes on b


def test_non_prime_power_mesh():
    mesh = Cluster(devices=12, devices_per_node=4).mesh()  # (3, 2, 2)
    node = linear(b=6, s=4, n=12, k=3)
    cfgs = mesh_configs(node, mesh)
    assert len(cfgs) == brute_canonical_count(node, mesh)
    assert any(c.splits[0] == 6 for c in cfgs)


def test_pase_space_and_to_mesh():
    node = linear(b=8, s=4, n=16, k=4)
    cfgs = pase_configs(node, 8, cutoff=2)
    assert all(math.prod(c.splits) <= 8 and c.mesh_axes == () for c in cfgs)
    assert all(d.size // s >= 2 for c in cfgs for d, s in zip(node.dims, c.splits) if s > 1)
    assert Config((1, 1, 1, 1)) in cfgs and Config((4, 1, 2, 1)) in cfgs
    assert Config((8, 1, 1, 1)) not in cfgs  # 8 / 8 = 1 element per part < cutoff 2
    assert configs_for(node, Mesh((2, 2, 2), (0, 0, 0)), "pase:2") == cfgs
    mesh = Mesh((2, 2, 2), (0, 0, 0))
    mapped = to_mesh(Config((4, 1, 2, 1)), mesh)
    assert mapped.splits == (4, 1, 2, 1)
    assert sorted(a for ax in mapped.mesh_axes for a in ax) == [0, 1, 2]
    assert to_mesh(Config((3, 1, 1, 1)), mesh) is None
    assert configs_for(node, mesh, lambda n, m: [Config((1, 1, 1, 1))]) == [Config((1, 1, 1, 1))]
