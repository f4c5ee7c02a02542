"""The one place that turns what a caller says about the cluster into an ``autopar.Cluster``.

``autopar plan`` (the command line), ``autopar.plan``, ``autopar.compile`` and
``autopar.compile_many`` all call ``resolve_cluster``, so the same words give the same cluster
everywhere. The default (no cluster named) is the local machine: the ``cpu`` preset, because the
module ``compile`` returns runs on the local machine's processes, and a plan priced for other
hardware would be a plan for a run that is not the one about to happen. Name a preset
(``"8xA100"``) or pass an ``autopar.Cluster`` to plan for other hardware.

The default cluster's device count, when none is given: the size of the initialised process group
(the processes that will run the plan), else the local machine's CPU cores. A named preset keeps its
own count unless ``devices`` says otherwise.
"""

from __future__ import annotations

from autopar.core.cluster import Cluster

DEFAULT_PRESET = "cpu"


def default_devices() -> int | None:
    """The process group's size when one is initialised; None otherwise (the preset's own
    count: the ``cpu`` preset's is the local machine's cores)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return None


def resolve_cluster(cluster: Cluster | str | int | None = None, devices: int | None = None) -> Cluster:
    """An ``autopar.Cluster`` from what a user passes.

    ``cluster``: None (the default: ``DEFAULT_PRESET``, the local machine), a preset name
    (``autopar.Cluster.preset``), a device count (the default cluster with that many devices) or
    an ``autopar.Cluster`` (used as it is). ``devices``: the device count (default: the process
    group's size, else the preset's own); a Cluster or count that disagrees with it is a one-line
    ValueError, never silently re-sized.
    """
    if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int) or devices < 1):
        raise ValueError(f"devices must be a positive device count, not {devices!r}")
    if isinstance(cluster, int) and not isinstance(cluster, bool):
        if cluster < 1:
            raise ValueError(f"a cluster given as a device count must be at least 1, not {cluster}")
        if devices is not None and devices != cluster:
            raise ValueError(f"cluster={cluster} devices but devices={devices}: pass one of them")
        cluster, devices = None, cluster
    if isinstance(cluster, Cluster):
        if devices is not None and cluster.devices != devices:
            raise ValueError(f"cluster {cluster.name or ''} has {cluster.devices} devices, not devices={devices}: "
                             f"pass one of them, or cluster.with_devices({devices})")
        return cluster
    if cluster is not None and not isinstance(cluster, str):
        raise ValueError(f"cluster must be an autopar.Cluster, a preset name or a device count, not {cluster!r}")
    if cluster is None and devices is None:
        devices = default_devices()
    return Cluster.preset(cluster or DEFAULT_PRESET, devices=devices)
