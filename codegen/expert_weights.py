"""The weights of an expert list cut over ranks: each expert's held by the ranks that run it alone.

Experts written as an ``nn.ModuleList`` of modules (``rules/moe.py``: ``expert_list``) are
separate parameters, one set per expert, so no DTensor placement cuts them the way ``Shard(0)``
cuts a stacked weight. Under expert parallelism a rank runs only the ``e / p`` experts of its
group rank (``experts.ExpertsCall``), so it keeps only theirs: the others' parameters stay
registered under their names (state dicts, optimizers and ``named_parameters`` see the model's
structure) as replicated DTensors whose storage is freed (size 0), as ZeRO-3 frees its
parameters between uses (``zero.py``). They get no gradient, take no part in the gradient sync
(the held ones sum theirs over the token axes only), and an optimizer keeps no state for them.

To read or save the whole model, ``gather`` brings every expert's weights to every rank (one
broadcast each, from its holder over the expert group: what ``CompiledModule.unshard`` and a
state dict do); the next forward frees them again (``release``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class HeldExpert:
    """One weight of a cut expert list: its qualified name, its expert group, and the group rank
    holding it (``here``: this rank)."""

    name: str
    group: dist.ProcessGroup
    owner: int
    here: bool


@dataclass
class ExpertWeights:
    """This rank's view of every cut expert list's weights (``held``: in one order on all ranks)."""

    held: list[HeldExpert] = field(default_factory=list)
    gathered: bool = True  # the others' weights allocated and current (before the first release)

    @property
    def foreign(self) -> set[str]:
        """The weights this rank does not hold."""
        return {h.name for h in self.held if not h.here}

    def release(self, module: torch.nn.Module) -> None:
        """Free the storage of the weights other ranks hold."""
        if not self.gathered:
            return
        for h in self.held:
            if not h.here:
                _local(module, h.name).untyped_storage().resize_(0)
        self.gathered = False

    @torch.no_grad()
    def gather(self, module: torch.nn.Module) -> None:
        """Every expert's weights whole on every rank: each broadcast from its holder (collective:
        every rank of every expert group calls it)."""
        if self.gathered:
            return
        for h in self.held:
            t = _local(module, h.name)
            if not h.here:
                t.untyped_storage().resize_(t.numel() * t.element_size())
            dist.broadcast(t, src=dist.get_global_rank(h.group, h.owner), group=h.group)
        self.gathered = True

    def bytes_held(self, module: torch.nn.Module) -> int:
        """Bytes this rank stores for the cut expert lists' weights."""
        return sum(_local(module, h.name).untyped_storage().nbytes() for h in self.held)


def _local(module: torch.nn.Module, name: str) -> torch.Tensor:
    owner, _, leaf = name.rpartition(".")
    t = getattr(module.get_submodule(owner) if owner else module, leaf)
    return t._local_tensor if isinstance(t, DTensor) else t
