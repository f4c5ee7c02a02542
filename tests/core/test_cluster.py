"""Cluster presets, their mesh (node-crossing axes first) and the flat default."""

import pytest

from autopar.core.cluster import Cluster, prime_factors
from autopar.core.tables import Mesh


def test_a100_preset_values():
    c = Cluster.preset("8xA100")
    assert c.devices == 8 and c.nodes == 1
    assert c.peak("bfloat16") == 312e12 and c.peak("float32") == 19.5e12
    assert c.memory_capacity == 80e9 and c.memory_bandwidth == 2039e9
    assert c.intra_bandwidth == 300e9  # 600 GB/s both directions, one way
    assert c.mesh() == Mesh((2, 2, 2), (0, 0, 0))


def test_h100_multi_node_mesh_puts_node_axes_first():
    c = Cluster.preset("2x8xH100")
    assert (c.devices, c.devices_per_node, c.nodes) == (16, 8, 2)
    assert c.mesh() == Mesh((2, 2, 2, 2), (1, 0, 0, 0))
    assert Cluster.preset("8x8xH100").mesh() == Mesh((2,) * 6, (1, 1, 1, 0, 0, 0))
    assert c.inter_bandwidth == 50e9  # 400 Gb/s NDR
    assert c.link(True) == (c.inter_bandwidth, c.inter_latency)
    assert c.link(False) == (c.intra_bandwidth, c.intra_latency)


def test_pase_clusters_and_overrides():
    c = Cluster.preset("1080ti")
    assert c.devices == 8 and c.peak("float32") == 11.3e12 and c.memory_capacity == 11e9
    assert c.intra_bandwidth == 15.75e9  # PCIe 3.0 x16
    big = Cluster.preset("1080ti", devices=32)
    assert (big.nodes, big.devices_per_node) == (4, 8)
    assert big.mesh().level == (1, 1, 0, 0, 0)
    assert Cluster.preset("4x8x2080ti").devices == 32
    assert Cluster.preset("2080ti").memory_bandwidth == 616e9
    assert Cluster.preset("16xH100").nodes == 2


def test_unknown_preset_lists_known_names():
    with pytest.raises(ValueError, match="8xA100"):
        Cluster.preset("tpu-v9")


def test_flat_cluster_and_bad_shapes():
    c = Cluster(devices=8)
    assert c.nodes == 1 and c.mesh() == Mesh((2, 2, 2), (0, 0, 0))
    assert Cluster(devices=12, devices_per_node=4).mesh() == Mesh((3, 2, 2), (1, 0, 0))
    assert Cluster(devices=6).mesh().shape == (2, 3)
    with pytest.raises(ValueError):
        Cluster(devices=12, devices_per_node=8)
    with pytest.raises(ValueError):
        Cluster(devices=0)


@pytest.mark.parametrize("field, value", [("intra_bandwidth", 0), ("inter_bandwidth", -1e9),
                                          ("memory_bandwidth", float("nan")), ("memory_capacity", -5),
                                          ("intra_latency", -1e-6), ("peak_flops", {"float32": 0}),
                                          ("peak_flops", {})])
def test_impossible_device_figures_are_refused(field, value):
    """A zero bandwidth used to end in ZeroDivisionError deep in the cost model, a zero peak in
    an InfeasibleError about infinite costs."""
    with pytest.raises(ValueError, match=f"Cluster: {field}"):
        Cluster(devices=4, **{field: value})


def test_prime_factors():
    assert prime_factors(1) == []
    assert prime_factors(64) == [2] * 6
    assert prime_factors(90) == [2, 3, 3, 5]
    assert prime_factors(97) == [97]


def test_peak_falls_back_to_fp32():
    c = Cluster.preset("1080ti")
    assert c.peak("bfloat16") == c.peak("float32")


def test_cpu_preset_measures_quickly():
    c = Cluster.preset("cpu", devices=2, measure=True)
    assert c.devices == 2 and c.peak("float32") > 1e8 and c.memory_bandwidth > 1e8
    assert Cluster.preset("cpu", devices=4).mesh().shape == (2, 2)
