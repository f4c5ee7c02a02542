"""Plans as JSON files: a schema version, the graph's fingerprint and the cluster travel along.

Loading checks all three, so a plan made for another model, another cluster or by an incompatible
autopar is refused with a clear error instead of producing a wrong module.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from autopar.core.errors import PlanMismatchError
from autopar.core.tables import Config, Mesh

SCHEMA = 1


def config_to_json(c: Config) -> dict:
    return {"splits": list(c.splits), "mesh_axes": [list(a) for a in c.mesh_axes]}


def config_from_json(d: dict) -> Config:
    return Config(tuple(d["splits"]), tuple(tuple(a) for a in d.get("mesh_axes", ())))


def write(path, doc: dict) -> None:
    """Write the plan document whole or not at all: into a temporary file beside ``path``, then
    renamed over it, so an interrupted write (Ctrl-C, a full disk) never leaves half a plan."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read(path) -> dict:
    """The raw plan document; PlanMismatchError (one line) if it is not a readable plan file."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PlanMismatchError(f"no plan file {str(path)!r}") from None
    except json.JSONDecodeError as e:
        raise PlanMismatchError(f"{path} is not a plan file: {_json_problem(e)}") from None
    except UnicodeDecodeError as e:
        raise PlanMismatchError(f"{path} is not a plan file: it is not text ({e.reason} at byte {e.start})") from None
    if not isinstance(doc, dict) or doc.get("format") != "autopar-plan":
        raise PlanMismatchError(f"{path} is not an autopar plan file")
    if doc.get("schema") != SCHEMA:
        raise PlanMismatchError(
            f"{path} has plan schema {doc.get('schema')!r}; this autopar reads schema {SCHEMA}: re-plan the model"
        )
    return doc


def _json_problem(e: json.JSONDecodeError) -> str:
    """What is wrong with the JSON, as a whole sentence: a document with brackets still open that
    fails in its last token (or an unterminated string) is a file cut short (an interrupted write);
    anything else gets the place and json's reason."""
    doc = e.doc
    if not doc.strip():
        return "it is empty; write it again (autopar plan MODEL --json FILE)"
    unclosed = doc.count("{") + doc.count("[") > doc.count("}") + doc.count("]")
    rest = doc[e.pos:].rstrip()
    last_token = re.fullmatch(r"[^\s{}\[\],:]*", rest) is not None or e.msg.startswith("Unterminated string")
    if unclosed and last_token:
        return (f"invalid JSON that ends after {len(doc)} bytes in the middle of the plan, so the file was cut "
                "short (an interrupted write?); write it again (autopar plan MODEL --json FILE)")
    return f"invalid JSON at line {e.lineno}, column {e.colno} ({e.msg})"


def mesh_to_json(m: Mesh) -> dict:
    return {"shape": list(m.shape), "level": list(m.level)}


def mesh_from_json(d: dict) -> Mesh:
    return Mesh(tuple(d["shape"]), tuple(d.get("level", ())))


def check(plan, what: str, graph=None, mode: str | None = None) -> None:
    """Refuse (PlanMismatchError, one line naming the first problem) a plan that cannot run as
    written: a mesh with another device count than its cluster, a split its mesh axes cannot make
    (a split of 3 on a 2-wide axis), a node of ``graph`` it has no config for, a config with the
    wrong number of dims, or a plan made for another ``mode`` (an inference plan used to train)."""
    devices = plan.cluster.get("devices") if isinstance(plan.cluster, dict) else None
    if devices is not None and plan.mesh.size != devices:
        raise PlanMismatchError(f"{what}: its mesh {tuple(plan.mesh.shape)} has {plan.mesh.size} devices but its "
                                f"cluster {plan.cluster.get('name', '?')} has {devices}: re-plan it")
    if mode is not None and plan.mode != mode:
        raise PlanMismatchError(f"{what} was made for {plan.mode}, not {mode} (it prices "
                                f"{'the forward only' if plan.mode == 'inference' else 'a training step'}): "
                                f"re-plan with --mode {mode}")
    mesh = tuple(plan.mesh.shape)  # pipelined plans too: stage configs are on the full mesh (stages.py)
    for name, cfg in plan.assignment.items():
        problem = _config_problem(cfg, mesh)
        if problem:
            raise PlanMismatchError(f"{what}: node {name!r} {problem}: re-plan it")
    if graph is None or plan.cost_model == "pase":  # PaSE plans name PaSE's nodes, not the graph's
        return
    for node in graph.nodes:
        cfg = plan.assignment.get(node.name)
        if cfg is None:
            raise PlanMismatchError(f"{what} has no config for node {node.name!r}: re-plan it")
        if len(cfg.splits) != len(node.dims):
            raise PlanMismatchError(f"{what}: node {node.name!r} has {len(cfg.splits)} splits for its "
                                    f"{len(node.dims)} dims: re-plan it")
    extra = set(plan.assignment) - {n.name for n in graph.nodes}
    if extra:
        raise PlanMismatchError(f"{what} has a config for {sorted(extra)[0]!r}, which this model has no node "
                                "named: re-plan it")


def _config_problem(cfg: Config, mesh: tuple[int, ...]) -> str:
    if any(not isinstance(s, int) or s < 1 for s in cfg.splits):
        return f"has splits {tuple(cfg.splits)}; splits are whole numbers >= 1"
    if not cfg.mesh_axes:  # a config without mesh axes (PaSE's space): its splits must fit the devices
        total = 1
        for s in cfg.splits:
            total *= s
        size = 1
        for k in mesh:
            size *= k
        return "" if size % total == 0 else f"splits {tuple(cfg.splits)} over {total} devices, not a divisor of {size}"
    if len(cfg.mesh_axes) != len(cfg.splits):
        return f"has {len(cfg.splits)} splits but mesh axes for {len(cfg.mesh_axes)} dims"
    used = [a for axes in cfg.mesh_axes for a in axes]
    if any(not isinstance(a, int) or not 0 <= a < len(mesh) for a in used):
        return f"uses mesh axes {used}; the mesh {mesh} has axes 0..{len(mesh) - 1}"
    if len(set(used)) != len(used):
        return f"uses mesh axes {used}, one of them twice"
    for d, (s, axes) in enumerate(zip(cfg.splits, cfg.mesh_axes)):
        size = 1
        for a in axes:
            size *= mesh[a]
        if size != s:
            return (f"splits dim {d} {s} ways on mesh axes {list(axes)} of mesh {mesh}, which have {size} "
                    "devices")
    return ""
