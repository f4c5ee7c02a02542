"""A ``moe_experts`` node on one rank: its local experts, and the token exchange expert
parallelism needs (``autopar/frontend/rules/moe.py`` says what the node is).

Unsplit by experts, the rank runs the experts module itself on its tokens. With the experts cut
over a group of ``p`` ranks (each holding ``e / p`` consecutive experts, as ``Shard(0)`` of the
stacked weights), every routed row (a token and one of its top-k experts) goes to the rank of its
expert and its result comes back:

1. the rows are sorted by destination rank and their counts exchanged (an all-to-all of ``p``
   integers), so each rank knows how many rows it receives from each other;
2. dispatch: an all-to-all of the rows' hidden vectors (and of their experts' local indices);
3. the module runs on what arrived, as if it had only its local experts (``num_experts = e / p``)
   and each row were a token routed to one expert with weight 1;
4. combine: the results travel back by the reverse all-to-all, return to their rows' order and are
   weighted by the router and summed over each token's k experts, as the module does.

An expert list (one module per expert) cut over the group runs only its own experts' modules and
is fed only their weights (``kept``): the others' stay off this rank (``expert_weights.py``).

Both all-to-alls are ``torch.distributed._functional_collectives.all_to_all_single_autograd``, whose backward is the
reverse exchange, so the gradients of the hidden states and of the expert weights are exact; the
router weights are applied on the token's own rank, where their gradient stays. Nothing is
dropped: no capacity factor, every row reaches its expert.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor
from torch.func import functional_call

from autopar.core.ir import Node

from .expert_weights import HeldExpert
from .moves import axes_group
from .placements import NodeLayout

EXPERTS = "experts"  # the node's expert dim (rules/moe.py)


class ExpertsCall(nn.Module):
    """One ``moe_experts`` node on this rank: ``forward(hidden, top_k_index, top_k_weights, *weights)``."""

    def __init__(self, owner: nn.Module, node: Node, layout: NodeLayout, mesh: DeviceMesh, path: str = ""):
        super().__init__()
        self.node = node
        self.axes = tuple(a for a, d in enumerate(layout.axis_dims) if d == EXPERTS)
        self.parts = layout.split_counts.get(EXPERTS, 1)
        self.local = int(node.attrs["experts"]) // self.parts
        self.group = axes_group(mesh, self.axes) if self.axes else None
        self.path = path
        self.names = [name for name, _ in owner.named_parameters()]
        self.listed = _expert_list(owner) if node.attrs.get("listed") else None  # one module per expert
        first = dist.get_rank(self.group) * self.local if self.group is not None and self.listed else 0
        self.first = first  # an expert list's first local expert (the group rank's chunk, as the dispatch sends)
        # the weights this rank runs and holds (an expert list cut over a group: its own experts'),
        # in call order, by their names in the shell (its local experts renumbered from 0)
        self.kept = [self._expert_of(name) is None or first <= self._expert_of(name) < first + self.local
                     for name in self.names]
        self.local_names = [self._local_name(name) for name, k in zip(self.names, self.kept) if k]
        self._shell = [_shell(owner, self.local, self.listed, first)]  # a list: not a submodule

    def _expert_of(self, name: str) -> int | None:
        """The expert whose weight ``name`` is, where an expert list is cut over ranks; else None."""
        if not self.listed or self.group is None:
            return None
        return int(name[len(self.listed) + 1:].split(".", 1)[0])

    def _local_name(self, name: str) -> str:
        e = self._expert_of(name)
        return name if e is None else f"{self.listed}.{e - self.first}.{name.split('.', 2)[2]}"

    def holding(self) -> list[HeldExpert]:
        """Per weight of a cut expert list: which rank of the expert group holds it ([] otherwise)."""
        if not self.listed or self.group is None:
            return []
        return [HeldExpert(f"{self.path}.{name}" if self.path else name, self.group,
                           self._expert_of(name) // self.local, kept) for name, kept in zip(self.names, self.kept)]

    def local_args(self, args: list) -> list:
        """The call's arguments (the three tensors, then every weight) less the weights not kept."""
        if all(self.kept):
            return args
        n = len(args) - len(self.kept)
        return args[:n] + [a for a, k in zip(args[n:], self.kept) if k]

    def forward(self, hidden, top_k_index, top_k_weights, *weights):
        """``weights``: the kept ones (``kept``), in the module's order."""
        state = dict(zip(self.local_names, weights))
        shell = self._shell[0]
        if self.group is None:
            return functional_call(shell, state, (hidden, top_k_index, top_k_weights))
        return self._exchanged(shell, state, hidden, top_k_index, top_k_weights)

    def _exchanged(self, shell, state, hidden, top_k_index, top_k_weights):
        tokens, k = top_k_index.shape
        flat = top_k_index.reshape(-1)
        dest = torch.div(flat, self.local, rounding_mode="floor")
        order = torch.argsort(dest, stable=True)
        send = torch.bincount(dest, minlength=self.parts)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        send_n, recv_n = send.tolist(), recv.tolist()
        rows = hidden.index_select(0, torch.div(order, k, rounding_mode="floor"))
        experts = (flat - dest * self.local).index_select(0, order)
        got = _exchange(rows, recv_n, send_n, self.group)
        got_experts = experts.new_empty(sum(recv_n))
        dist.all_to_all_single(got_experts, experts, recv_n, send_n, group=self.group)
        ones = torch.ones(len(got_experts), 1, dtype=top_k_weights.dtype, device=hidden.device)
        done = functional_call(shell, state, (got, got_experts.unsqueeze(1), ones))
        back = _exchange(done, send_n, recv_n, self.group)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order), device=order.device)
        per_slot = back.index_select(0, inverse).view(tokens, k, -1)
        return (per_slot * top_k_weights.unsqueeze(-1)).sum(dim=1).to(hidden.dtype)

    def extra_repr(self) -> str:
        where = f"experts/{self.parts} over mesh axes {list(self.axes)}: tokens exchanged by all-to-all" \
            if self.group is not None else "experts whole"
        return f"{self.node.name}: {self.local} local experts; {where}"


def _expert_list(owner: nn.Module) -> str:
    """The name of the experts module's list of expert modules (``rules/moe.py``: ``expert_list``)."""
    return next(n for n, c in owner.named_children()
                if isinstance(c, nn.ModuleList) and any(True for _ in c.parameters()))


def _exchange(rows: torch.Tensor, recv: list[int], send: list[int], group) -> torch.Tensor:
    """``rows`` split by ``send`` to the group's ranks, ``recv`` rows from each back; differentiable
    (its backward is the reverse exchange)."""
    return wait_tensor(all_to_all_single_autograd(rows.contiguous(), recv, send, group))


def _shell(module: nn.Module, experts: int, listed: str | None = None, first: int = 0) -> nn.Module:
    """A copy of the experts module that owns nothing: its own tables of tensors (which
    ``functional_call`` fills with the program's local weights at each call), ``experts`` of them;
    an expert list (``listed``: its name) cut to the ``experts`` modules from ``first`` on."""
    shell = copy.copy(module)
    shell._parameters = dict(module._parameters)
    shell._buffers = dict(module._buffers)
    shell._modules = dict(module._modules)
    shell.num_experts = experts
    if listed:
        shell._modules[listed] = nn.ModuleList(list(module._modules[listed])[first:first + experts])
    return shell


def own_weights(root: nn.Module, graph, state_nodes: dict, stored: dict, whole) -> tuple[dict, list[HeldExpert]]:
    """After a rank's program is built (``root``: its modules, ``graph``: its code): the layouts
    its parameters are stored in, a cut expert list's weights ``whole`` (each held entire, by its
    experts' ranks), and who holds each such weight; the others' placeholders (unused) dropped."""
    held = [h for m in root.modules() if isinstance(m, ExpertsCall) for h in m.holding()]
    for h in held:
        ph = state_nodes.get(h.name)
        if not h.here and ph is not None and ph.graph is graph and not ph.users:
            graph.erase_node(ph)
    return {**stored, **{h.name: whole for h in held}}, held


def runs_experts(node: Node) -> bool:
    """Whether the program runs ``node`` as an ``ExpertsCall`` (its own module, not a ``LocalCall``)."""
    return node.op == "moe_experts"


def experts_module(model: nn.Module, fx_node, node: Node, layout: NodeLayout, mesh: DeviceMesh) -> ExpertsCall:
    """The program's module for ``node`` (``fx_node``: its traced call, a leaf module or the
    export graph's ``experts_call``, whose ``module`` keyword names the experts module)."""
    path = fx_node.target if fx_node.op == "call_module" else fx_node.kwargs.get("module", node.module)
    if math.prod(layout.split_counts.get(d.name, 1) for d in node.dims if d.name == "h") > 1:
        raise ValueError(f"{node.name}: the experts' hidden dim cannot be split")
    return ExpertsCall(model.get_submodule(path), node, layout, mesh, path)
