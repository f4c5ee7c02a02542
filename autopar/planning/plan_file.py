"""Plans as JSON files: a schema version, the graph's fingerprint and the cluster travel along.

Loading checks all three, so a plan made for another model, another cluster or by an incompatible
autopar is refused with a clear error instead of producing a wrong module.
"""

from __future__ import annotations

import json
from pathlib import Path

from autopar.core.errors import PlanMismatchError
from autopar.core.tables import Config, Mesh

SCHEMA = 1


def config_to_json(c: Config) -> dict:
    return {"splits": list(c.splits), "mesh_axes": [list(a) for a in c.mesh_axes]}


def config_from_json(d: dict) -> Config:
    return Config(tuple(d["splits"]), tuple(tuple(a) for a in d.get("mesh_axes", ())))


def read(path) -> dict:
    """The raw plan document; PlanMismatchError (one line) if it is not a readable plan file."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PlanMismatchError(f"no plan file {str(path)!r}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PlanMismatchError(f"{path} is not a plan file (invalid JSON: {e.msg if hasattr(e, 'msg') else e})") from None
    if not isinstance(doc, dict) or doc.get("format") != "autopar-plan":
        raise PlanMismatchError(f"{path} is not an autopar plan file")
    if doc.get("schema") != SCHEMA:
        raise PlanMismatchError(
            f"{path} has plan schema {doc.get('schema')!r}; this autopar reads schema {SCHEMA}: re-plan the model"
        )
    return doc


def mesh_to_json(m: Mesh) -> dict:
    return {"shape": list(m.shape), "level": list(m.level)}


def mesh_from_json(d: dict) -> Mesh:
    return Mesh(tuple(d["shape"]), tuple(d.get("level", ())))
