"""PaSE's names for its nodes' iteration-space dims (pase.md section 4), for reports and pictures."""

from __future__ import annotations

_DIMS = {
    "Conv": ("b", "c_in", "h", "w", "r", "s", "n"),
    "Pool": ("b", "c", "h", "w"),
    "LSTM": ("layers", "seq", "b", "n", "k"),
}
_REDUCTIONS = {"Conv": {"c_in", "r", "s"}, "FC": {"k"}, "LSTM": {"k"}}


def pase_dim_names(node) -> tuple[str, ...]:
    """Names of a PaSE node's dims, in PaSE's order."""
    if node.op in _DIMS:
        return _DIMS[node.op]
    if node.op in ("Einsum", "Embedding"):
        return tuple(node.attrs["letters"])
    if node.op == "FC":
        lead = len(node.domain) - 2
        return tuple("b" if i == node.batch_axis else f"x{i}" for i in range(lead)) + ("n", "k")
    return tuple("b" if i == node.batch_axis else f"d{i}" for i in range(len(node.domain)))


def pase_reduction_dims(node) -> set[str]:
    if node.op in _REDUCTIONS:
        return _REDUCTIONS[node.op]
    if node.op in ("Einsum", "Embedding"):
        _, out = node.attrs["eq"].split("->")
        return {ch for ch in node.attrs["letters"] if ch not in out}
    return set()


def pase_split_words(node, config) -> str:
    words = [f"{d}/{s}" for d, s in zip(pase_dim_names(node), config.splits) if s > 1]
    return ", ".join(words) if words else "replicated"


def pase_split_kind(node, config) -> str:
    names = pase_dim_names(node)
    split = [names[i] for i, s in enumerate(config.splits) if s > 1]
    if not split:
        return "replicated"
    red = pase_reduction_dims(node)
    batch = names[node.batch_axis]
    kinds = {"reduction" if d in red else "data" if d == batch else "tensor" for d in split}
    return kinds.pop() if len(kinds) == 1 else "mixed"
