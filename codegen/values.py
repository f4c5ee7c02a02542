"""What a rank's program needs to know of the traced graph besides the IR: every node's traced
value (for sizes and output structures), which placeholders are parameters or constants, how a
node's split reads in words, and the small predicates the builder asks."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils import _pytree as pytree

from autopar.core.ir import Graph, Node
from autopar.core.meta import MetaProp, meta_like

from .placements import NodeLayout


def traced_values(graph: Graph, model: nn.Module) -> dict[fx.Node, Any]:
    """Every fx node's traced value (meta tensors, sizes), which both frontends keep in
    ``node.meta["val"]``; a graph that lost them (pickled to another process), or whose inputs
    have another batch than traced (``core.batch.with_batch``), is propagated again on meta
    tensors (user inputs from the IR's specs, state from ``model``'s shapes)."""
    gm = graph.fx_graph
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if all("val" in n.meta for n in placeholders):
        values = {n: n.meta.get("val") for n in nodes}
        if all(_as_traced(n, graph) for n in placeholders):
            return values
        at = _symbolic_batch(placeholders, graph)
        if at is not None:  # a dynamic-batch export: its sizes at the new batch, exactly
            return {n: pytree.tree_map(at, v) for n, v in values.items()}
    state = state_names(graph)
    constants = gm.meta.get("autopar_constants", {})  # non-tensor inputs: the traced Python values
    args = []
    for n in nodes:
        if n.op != "placeholder":
            continue
        if n.name in state:
            owner, _, leaf = state[n.name].rpartition(".")
            args.append(meta_like(getattr(model.get_submodule(owner) if owner else model, leaf)))
        else:
            spec = graph.inputs.get(n.name)
            args.append(torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device="meta")
                        if spec is not None else constants.get(n.name))
    interp = MetaProp(gm)
    with torch.no_grad(), torch.device("meta"):
        interp.run(*args)
    return interp.values


def _symbolic_batch(placeholders: list[fx.Node], graph: Graph):
    """Where the traced batch is a symbol (``torch.export`` with a dynamic batch): a function
    giving each traced value at the graph's batch (sizes as ints, tensors as meta tensors of
    that shape); None otherwise. Propagating the exported graph again on meta tensors is not
    exact (ops that export found contiguous need not be on the meta device)."""
    import sympy

    subs = {}
    for n in placeholders:
        spec, val = graph.inputs.get(n.name), n.meta.get("val")
        if spec is not None and isinstance(val, torch.Tensor) and val.dim() and isinstance(val.shape[0], torch.SymInt):
            subs[val.shape[0].node.expr] = sympy.Integer(spec.shape[0])
    if not subs:
        return None

    def size(v):
        expr = v.node.expr.xreplace(subs)
        return int(expr) if getattr(expr, "is_number", True) else concrete(v)

    def at(v):
        if isinstance(v, torch.SymInt):
            return size(v)
        if isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape):
            return torch.empty([size(d) if isinstance(d, torch.SymInt) else d for d in v.shape], dtype=v.dtype,
                               device="meta")
        return v

    return at


def _as_traced(n: fx.Node, graph: Graph) -> bool:
    """Whether a placeholder's traced value has the shape the graph's input spec says."""
    spec, val = graph.inputs.get(n.name), n.meta.get("val")
    return spec is None or not isinstance(val, torch.Tensor) or tuple(concrete(tuple(val.shape))) == spec.shape


def state_names(graph: Graph) -> dict[str, str]:
    """Placeholder name -> qualified parameter/buffer name, for graphs that pass state as inputs."""
    return dict(graph.fx_graph.meta.get("autopar_state", {}))


def local_groups(node: Node, layout: NodeLayout) -> int | None:
    """The groups this device convolves when a grouped conv's ``g`` is split, else None."""
    parts = layout.split_counts.get("g", 1)
    if not node.op.startswith("conv") or parts == 1:
        return None
    return int(node.attrs.get("groups", 1)) // parts


def concrete(value):
    """Sizes as the example had them: a dynamic-batch export traces them as SymInts, and the
    program is static (one batch shape), so each becomes the int it was in the example call."""
    from torch.fx.experimental.symbolic_shapes import guarding_hint_or_throw as hint_int

    def one(v):
        return hint_int(v) if isinstance(v, (torch.SymInt, torch.SymBool)) else v

    return pytree.tree_map(one, value) if isinstance(value, (list, tuple, dict)) else one(value)


def aliases(model: nn.Module) -> dict[str, str]:
    """Every parameter/buffer name -> the first name of its tensor (tied weights share one)."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for named in (model.named_parameters, model.named_buffers):
        for name, t in named(remove_duplicate=False):
            out[name] = first.setdefault(id(t), name)
    return out


def free_name(root: nn.Module, name: str) -> str:
    """A submodule name for a node: its own, unless ``root`` has an attribute of that name (an
    ATen node called ``to`` or ``float``)."""
    while hasattr(root, name):
        name += "_"
    return name


def is_pl(p) -> bool:
    return isinstance(p, tuple) and bool(p) and not isinstance(p[0], (tuple, list)) and p[0] is not None \
        and hasattr(p[0], "is_shard")


def has_tensor(v) -> bool:
    return any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(v))


def is_state(model: nn.Module, target: str) -> bool:
    try:
        model.get_parameter(target)
        return True
    except AttributeError:
        try:
            model.get_buffer(target)
            return True
        except AttributeError:
            return False


def describe(n: fx.Node) -> str:
    if n.op == "call_module":
        return f"module {n.target}"
    if n.op == "call_method":
        return f"method {n.target}"
    return f"{getattr(n.target, '__module__', '') or ''}.{getattr(n.target, '__name__', n.target)}".lstrip(".")


def split_words(node: Node, layout: NodeLayout) -> str:
    words = [f"{d}/{c}" for d, c in layout.split_counts.items() if c > 1]
    return ", ".join(words) if words else "none"

