"""Fold each experts module's ops in a torch.export graph into one ``experts_call`` node.

torch.export inlines a mixture of experts' routed experts into dozens of ATen ops (transformers'
``grouped_mm`` path: sort, gather, histc, cumsum, two grouped matmuls, an inverse permutation) whose
split is none of theirs: expert parallelism cuts the stacked weights by expert and exchanges tokens
between ranks. So the ops under an experts module (``rules.moe.is_experts``), found by the module
path torch.export records on every node, become one call ``experts_call(hidden, top_k_index,
top_k_weights, *weights)`` with the module's call as its meaning, which the ``moe_experts`` rule
reads and codegen runs (the module itself on its local experts). A region whose inputs are not
exactly the three tensors and the module's weights, or with more than one result, is left as
traced (its ops then run replicated), with a note that says why.
"""

from __future__ import annotations

import torch
from torch import fx, nn

from autopar.frontend.rules.moe import expert_list, experts_call, is_experts


def fold_experts(gm: fx.GraphModule, model: nn.Module, state: dict[str, str]) -> list[str]:
    """Rewrite ``gm`` in place; ``state``: placeholder -> parameter name. Returns notes."""
    notes = []
    for path, module in model.named_modules():
        if path and is_experts(module):
            note = _fold(gm, path, module, state)
            if note:
                notes.append(note)
    gm.graph.lint()
    gm.recompile()
    return notes


def _in_module(node: fx.Node, path: str) -> bool:
    stack = node.meta.get("nn_module_stack") or {}
    for v in stack.values():
        p = v[0] if isinstance(v, tuple) else str(v)
        if p == path or p.startswith(path + "."):
            return True
    return False


def _fold(gm: fx.GraphModule, path: str, module: nn.Module, state: dict[str, str]) -> str:
    # sizes (a symbolic batch times the sequence) stay: torch.export shares them between layers
    region = [n for n in gm.graph.nodes if n.op == "call_function" and _in_module(n, path) and not _is_size(n)]
    if not region:
        return ""
    inside = set(region)
    # sizes of the region's own tensors used only inside it (a loop over experts: how many tokens
    # each receives, checked by torch.export's asserts) go with it
    own = {n for n in gm.graph.nodes if _is_size(n) and _in_module(n, path) and n.all_input_nodes}
    while True:  # the sizes whose inputs and uses all stay among the region and such sizes
        keep = {n for n in own if all(a in inside or a in own for a in n.all_input_nodes)
                and all(u in inside or u in own for u in n.users)}
        if keep == own:
            break
        own = keep
    region = [n for n in gm.graph.nodes if n in inside or n in own]
    inside = set(region)
    weights = {f"{path}.{name}": name for name, _ in module.named_parameters()}  # an expert list's too
    placeholders = {state.get(n.name): n for n in gm.graph.nodes if n.op == "placeholder"}
    params = [placeholders.get(q) for q in weights]
    tensors: list[fx.Node] = []
    for n in region:
        for a in n.all_input_nodes:
            if a not in inside and a not in params and a not in tensors and _is_tensor(a):
                tensors.append(a)
    outs = [n for n in region if any(u not in inside for u in n.users)]
    why = ""
    sizes = [n for n in gm.graph.nodes if _is_size(n) and _in_module(n, path) and n not in inside]
    if any(p is None for p in params):
        why = "its weights are not all graph inputs"
    elif len(outs) != 1 or not _is_tensor(outs[0]):
        why = f"{len(outs)} results leave it ({', '.join(o.name for o in outs)}), not one tensor"
    elif any(a in inside for n in sizes for a in n.all_input_nodes):
        why = "a size computed from its tensors is used outside it"
    elif len(tensors) != 3:
        why = f"it reads {len(tensors)} tensors besides its weights, not (hidden, top_k_index, top_k_weights)"
    if why:
        return f"experts {path}: left as traced ({why}); its ops run replicated"
    hidden, index, weights_ = _roles(tensors)
    if hidden is None:
        return f"experts {path}: left as traced (its inputs are not hidden [t, h], top-k [t, k]); replicated"
    out = outs[0]
    with gm.graph.inserting_before(out):
        listed = {"experts": module.num_experts} if expert_list(module) is not None else {}
        new = gm.graph.call_function(experts_call, (hidden, index, weights_, *params), {"module": path, **listed})
    new.meta = {k: v for k, v in out.meta.items() if k in ("val", "tensor_meta", "stack_trace")}
    new.meta["nn_module_stack"] = _stack_to(region[0], path)
    out.replace_all_uses_with(new)
    for n in reversed(region):
        gm.graph.erase_node(n)
    return ""


def _is_tensor(n: fx.Node) -> bool:
    return isinstance(n.meta.get("val"), torch.Tensor)


def _is_size(n: fx.Node) -> bool:
    return isinstance(n.meta.get("val"), (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


def _roles(tensors: list[fx.Node]):
    """(hidden, top_k_index, top_k_weights) of the region's three tensor inputs, by dtype and shape."""
    vals = [t.meta["val"] for t in tensors]
    ints = [t for t, v in zip(tensors, vals) if not v.is_floating_point()]
    floats = [t for t, v in zip(tensors, vals) if v.is_floating_point()]
    if len(ints) != 1 or len(floats) != 2:
        return None, None, None
    k_shape = tuple(ints[0].meta["val"].shape)
    same = [f for f in floats if tuple(f.meta["val"].shape) == k_shape]
    other = [f for f in floats if f not in same]
    if len(same) != 1 or len(other) != 1 or other[0].meta["val"].dim() != 2:
        return None, None, None
    return other[0], ints[0], same[0]


def _stack_to(node: fx.Node, path: str) -> dict:
    """The node's module stack cut at the experts module (the IR node's ``module``)."""
    out = {}
    for k, v in (node.meta.get("nn_module_stack") or {}).items():
        out[k] = v
        if (v[0] if isinstance(v, tuple) else str(v)) == path:
            break
    return out
