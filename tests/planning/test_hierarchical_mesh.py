"""A hierarchical plan's per-node configs live on the plan's own mesh: the tensor group's layout,
solved on the group's mesh (``units.group_cluster``: in-node prime axes, one axis across nodes),
is mapped axis for axis onto the full mesh (``hierarchical.mesh_of``)."""

import autopar
from autopar.core.cluster import Cluster
from autopar.core.strategy import Degrees
from autopar.planning import plan_file
from autopar.planning.hierarchical import mesh_of
from autopar.planning.units import group_cluster


def test_the_tensor_axes_of_the_full_mesh_are_the_group_meshs_axes_in_order():
    cluster = Cluster.preset("64x8xH100")
    for tensor in ((8, 4), (8, 1), (4, 2), (2, 8), (1, 16), (8, 8)):
        deg = Degrees(tensor, (1, 2), (8 // tensor[0], 64 // (tensor[1] * 2)))
        shape, _, roles = mesh_of(deg)
        assert [shape[a] for a in roles["tensor"]] == list(group_cluster(cluster, tensor).mesh().shape), tensor


def test_a_plan_with_a_tensor_group_across_nodes_passes_its_own_mesh_check():
    model, inputs = autopar.zoo.get("gpt")
    plan = autopar.plan(model, inputs, "64x8xH100", pin="tensor=32,pipeline=2,data=8")
    pinned = plan.baselines["published"]  # the pin's plan, beside autopar's own
    assert pinned.strategy.degrees.tensor == (8, 4)
    plan_file.check(pinned, "plan")  # raised: a node split 32 ways on mesh axes holding 16 devices
    plan_file.check(plan, "plan")
