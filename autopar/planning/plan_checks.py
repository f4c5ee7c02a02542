"""The shape of a plan document, checked before it is read (found by tests/cli/test_fuzz_cli.py).

A field of the wrong type (``"cluster": null``), a malformed mesh or split, an unknown mode: each
is one ``PlanMismatchError`` naming the first problem, instead of an AttributeError deep in a
report. Whether the plan can run as written (splits its mesh axes make, the mesh against the
cluster, every node present) is ``plan_file.check``'s, on the plan read from this document.
"""

from __future__ import annotations

import math

from autopar.core.errors import PlanMismatchError


def _fail(what: str) -> None:
    raise PlanMismatchError(f"corrupt plan file: {what}; re-plan it (autopar plan ... --json)")


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def check_document(doc) -> None:
    """PlanMismatchError (one line) for the first field of ``doc`` that no plan can have."""
    if not isinstance(doc, dict):
        _fail(f"a plan is a JSON object, not {type(doc).__name__}")
    for key, kind in (("model_name", str), ("fingerprint", str), ("cost_model", str), ("space", str),
                      ("units", str), ("cluster", dict), ("mesh", dict), ("assignment", dict), ("search", dict)):
        if key in doc and not isinstance(doc[key], kind):
            _fail(f"{key!r} must be a {kind.__name__}, not {type(doc[key]).__name__}")
    for key in ("cost", "memory_per_device"):
        v = doc.get(key)
        if key in doc and (isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v)):
            _fail(f"{key!r} must be a number, not {v!r}")
    if "microbatches" in doc and not _count(doc["microbatches"]):
        _fail(f"microbatches must be a positive int, not {doc['microbatches']!r}")
    if "mode" in doc and doc["mode"] not in ("train", "training", "inference"):
        _fail(f"mode must be 'train' or 'inference', not {doc['mode']!r}")
    for key in ("stages", "rows", "stage_rows", "explanation"):
        if key in doc and not isinstance(doc[key], list):
            _fail(f"{key!r} must be a list, not {type(doc[key]).__name__}")
    for key in ("baselines", "unsupported"):
        if key in doc and not isinstance(doc[key], dict):
            _fail(f"{key!r} must be an object, not {type(doc[key]).__name__}")
    if doc.get("space", "mesh") != "mesh" or doc.get("cost_model") == "pase":
        return  # PaSE's plans split over its own view of the devices
    staged = bool(doc.get("stages"))
    shape = _mesh(doc.get("mesh"), doc.get("cluster"), staged)
    for name, config in (doc.get("assignment") or {}).items():
        _config(name, config, None if staged else shape)  # a stage's splits are over its own devices


def _mesh(mesh, cluster, staged: bool) -> list[int] | None:
    if mesh is None:
        return None
    shape, level = mesh.get("shape"), mesh.get("level", [])
    if not (isinstance(shape, list) and all(_count(s) for s in shape)):  # [] is one device
        _fail(f"the mesh shape must be a list of positive ints, not {shape!r}")
    if not (isinstance(level, list) and len(level) in (0, len(shape))):
        _fail(f"the mesh levels {level!r} do not match its shape {shape}")
    devices = (cluster or {}).get("devices")
    if devices is not None and not _count(devices):
        _fail(f"the cluster's devices must be a positive int, not {devices!r}")
    return shape


def _config(name: str, config, shape: list[int] | None) -> None:
    if not isinstance(config, dict):
        _fail(f"node {name!r} has no split (got {config!r})")
    splits, axes = config.get("splits"), config.get("mesh_axes")
    if not (isinstance(splits, list) and all(_count(s) for s in splits)):
        _fail(f"node {name!r}: splits must be positive ints, not {splits!r}")
    if not (isinstance(axes, list) and len(axes) == len(splits) and all(isinstance(a, list) for a in axes)):
        _fail(f"node {name!r}: mesh_axes {axes!r} must be one list of mesh axes per split {splits}")
