"""The safety margin between a plan's predicted memory per device and what the device holds.

A plan predicts the bytes its model needs per device (parameters, gradients, optimizer state,
activations kept for the backward, the buffers of redistributions). A device runs more than that,
and a prediction is a prediction, so a plan may use a device's capacity less a margin:

* ``MARGIN_FRACTION`` (10%) of the capacity: the caching allocator's fragmentation (blocks
  rounded up and split, freed blocks too small to reuse: 5-10% of the peak in PyTorch's own memory
  snapshots of transformer training) and the cost model's own error (published planners report
  2-16% on memory: Mist 2.1%, Aceso 12-16%);
* ``FRAMEWORK_BYTES`` (512 MiB): what the framework allocates beside the model and no plan counts:
  NCCL's communicator buffers, cuBLAS and cuDNN workspaces and the kernels' own scratch on a GPU
  (the CUDA context itself is already gone from ``torch.cuda.mem_get_info``'s free figure), the
  interpreter and torch's libraries of each process on a CPU.

The device's memory is the cluster's stated capacity (what the plan was priced for) and, on a GPU,
also what ``torch.cuda.mem_get_info`` says is free when the module is built: another process on
the GPU takes its share. On a CPU the stated capacity is used (the ``cpu`` preset's is the host's
memory over its processes); ``autopar run`` also checks the host's available memory before it
starts any process. ``autopar.compile`` and ``autopar run`` refuse a plan over the limit, and the
plan report states the margin.

The planner plans against the same limit (``usable_memory``): every memory check of a search
(the flat search's capacity, pipeline stages, the hierarchical search, ZeRO and recomputation
choices, the baselines' "fits") uses the capacity less the margin, so a plan the planner calls
fitting is one compile accepts. An explicit ``memory_capacity`` is the device's memory, like the
cluster's: the margin applies to it too (``device_memory_for`` gives the capacity whose usable
part is a given number of bytes).
"""

from __future__ import annotations

MARGIN_FRACTION = 0.10
FRAMEWORK_BYTES = 512 * 2**20
# The searches accept a plan whose summed bytes exceed their capacity by this relative amount
# (float64 sums in another order differ by ulps); the check here grants the same, so a plan
# the planner calls fitting is never refused for rounding.
SUM_RTOL = 1e-12


def memory_margin(capacity: float) -> float:
    """Bytes of a device of ``capacity`` bytes that a plan may not use."""
    return MARGIN_FRACTION * float(capacity) + FRAMEWORK_BYTES


def margin_words() -> str:
    return f"{MARGIN_FRACTION:.0%} of capacity + {FRAMEWORK_BYTES / 2**20:.0f} MiB for the framework's own buffers"


def size(nbytes: float) -> str:
    """Bytes in GiB, or MiB below one GiB (core cannot use the report's formatter)."""
    return f"{nbytes / 2**30:.3g} GiB" if abs(nbytes) >= 2**30 else f"{nbytes / 2**20:.3g} MiB"


def usable_memory(capacity: float, free: float | None = None) -> float:
    """What a plan may use: the capacity (or the device's free memory, if less) less its margin."""
    have = float(capacity) if free is None else min(float(capacity), float(free))
    return have - memory_margin(have)


def device_memory_for(usable: float) -> float:
    """The device capacity whose ``usable_memory`` is ``usable`` bytes (the inverse of the margin)."""
    return (float(usable) + FRAMEWORK_BYTES) / (1.0 - MARGIN_FRACTION)


def capacity_words(capacity: float) -> str:
    """'the device's 24 GiB less a margin of 2.9 GiB': where a usable figure comes from."""
    return f"the device's {size(capacity)} less a margin of {size(memory_margin(capacity))}"


def over_margin(predicted: float, capacity: float | None, free: float | None = None) -> str | None:
    """None when ``predicted`` bytes per device fit the device less the margin; else the one-line
    reason, with the numbers and what to do."""
    if not capacity or not predicted > 0:
        return None
    limit = usable_memory(capacity, free)
    if predicted <= limit + abs(limit) * SUM_RTOL:
        return None
    have = float(capacity) if free is None else min(float(capacity), float(free))
    now = "" if free is None else f" ({size(free)} free now)"
    # the planner keeps the margin itself: plan again for the memory the device has (``have``)
    todo = (f"plan again for the {size(have)} the device has (memory_capacity={have:.4g} bytes, or --memory "
            f"{have / 2**30:.4g} GiB) or on more devices" if limit > 0 and have < float(capacity) else
            "plan again (the planner keeps within the margin) or on more devices" if limit > 0 else
            "use more devices, or devices with more memory")
    return (f"the plan predicts {size(predicted)} per device, more than the {size(max(limit, 0.0))} it may use: "
            f"the device's {size(capacity)}{now} less a margin of {size(memory_margin(have))} ({margin_words()}); "
            + todo)
