"""moe_experts: a mixture of experts' routed experts, one node for the whole computation.

What the experts module computes, ``out[t] = sum_j w[t, j] * expert_{i[t, j]}(x[t])`` over a
token's top-k experts ``i`` and router weights ``w``, is one op here (whatever ops its code runs:
transformers' ``grouped_mm`` over sorted tokens, a loop over experts), because its useful split is
one no op inside it has: the experts' stacked weights cut along the expert axis, each token sent to
its experts' ranks and back (an all-to-all each way). Its iteration space:

* ``tokens``: the tokens (rows of ``x``, ``i``, ``w`` and the output), splittable like a batch;
* ``experts``: the experts (axis 0 of every weight), splittable: expert parallelism. ``experts``
  *carries* ``tokens`` (``core.ir.CARRIES``): a mesh axis that cuts the experts leaves the tokens cut as they
  came, so the operands keep their token shards and the node exchanges them itself;
* ``h``: the hidden features, whole (tensor parallelism inside an expert is not offered).

FLOPs are the routed work: every token runs ``k`` experts, each a matmul per weight, so
``2 * t * k * (weight elements of one expert)``, not every expert on every token. Routing is
assumed uniform (each expert receives ``t * k / e`` tokens), which is what a split by experts
divides evenly; a skewed router makes the busiest rank slower than priced.

An experts module (``is_experts``): ``num_experts`` experts, every direct parameter stacked along
axis 0 (``[num_experts, ...]``, some of them matrices), called as ``(hidden [t, h], top_k_index [t, k], top_k_weights
[t, k])`` and returning ``[t, h]``: transformers' experts classes (Mixtral, Qwen2-MoE, ...) and
``autopar.zoo.moe``'s. Or, as most hand-written MoE code has it, an ``nn.ModuleList`` of
``num_experts`` expert modules of the same weights (``expert_list``; ``moe(listed=True)``): its
weights stack logically along the expert axis, so each is read as a slice of that stack (its
axis 0 indexed by ``experts``): a cut of the experts divides their bytes, gradients and optimizer
state by its degree, as it divides stacked weights', and sums their gradients over the token axes
only. The program holds each expert's weights on the ranks that run it alone
(``codegen/experts.py``). Its call reaches the rule as ``experts_call`` (the torch.export front
end folds the module's ops into one such call) or as a leaf module (torch.fx).
"""

from __future__ import annotations

import torch
from torch import nn

from autopar.core.ir import CARRIES, Dim
from autopar.frontend.rules.base import Call, Result

TOKENS, EXPERTS = "tokens", "experts"  # dim names, as the report writes a split ("experts/8")
SITES: dict = {}  # reached through ``sites.FUNCTIONS[experts_call]`` and the leaf-module table


def is_experts(module: nn.Module) -> bool:
    """Whether ``module`` is a stack of routed experts this rule understands (see the docstring):
    its weights stacked (``[num_experts, ...]``) or one expert module each (``expert_list``)."""
    e = getattr(module, "num_experts", None)
    params = list(module.named_parameters(recurse=False))
    if not isinstance(e, int) or e < 1:
        return False
    if not params:
        return expert_list(module) is not None
    if any(p.dim() < 2 or p.shape[0] != e for _, p in params) or not any(p.dim() >= 3 for _, p in params):
        return False  # a router's [e, h] weight is no stack of matrices
    return not any(True for c in module.children() for _ in c.parameters())  # activations only


def expert_list(module: nn.Module) -> str | None:
    """The name of ``module``'s ``nn.ModuleList`` of ``num_experts`` experts, one module each with
    the same parameters (names and shapes: the list's weights stack logically along the expert
    axis), when that list holds all its parameters; None otherwise. Its forward runs each expert
    on its routed tokens (``(hidden, top_k_index, top_k_weights)``, as the stacked form)."""
    e = getattr(module, "num_experts", None)
    if list(module.parameters(recurse=False)) or not isinstance(e, int) or e < 1:
        return None
    holders = [(n, c) for n, c in module.named_children() if any(True for _ in c.parameters())]
    if len(holders) != 1 or not isinstance(holders[0][1], nn.ModuleList) or len(holders[0][1]) != e:
        return None
    shapes = [[(n, tuple(p.shape)) for n, p in expert.named_parameters()] for expert in holders[0][1]]
    if not shapes[0] or any(s != shapes[0] for s in shapes):
        return None
    return holders[0][0]


def experts_call(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, *weights,
                 module: str = "", experts: int = 0) -> torch.Tensor:
    """The torch.export graph's stand-in for an experts module's ops (``frontend/experts.py``):
    on meta or fake tensors its result's shape; the compiled program runs the module itself.
    ``experts``: how many, where the module holds one module per expert (0: stacked weights)."""
    if hidden.device.type == "meta" or type(hidden).__name__ == "FakeTensor":
        return torch.empty_like(hidden)
    raise RuntimeError(f"the experts of {module or 'a mixture of experts'} are run by autopar.compile's "
                       "program, not by the traced graph: compile the model to run it")


def moe_experts(call: Call) -> Result:
    x, index, weights = call.args["hidden"], call.args["top_k_index"], call.args["top_k_weights"]
    params = list(call.args["weights"])
    if x.ndim != 2 or index.ndim != 2 or weights.shape != index.shape or index.shape[0] != x.shape[0]:
        raise ValueError(f"experts take hidden [t, h] and top-k [t, k], got {x.shape}, {index.shape}, "
                         f"{weights.shape}")
    listed = call.args.get("experts")  # one module per expert: that many, each its own weights
    experts = listed or params[0].shape[0]
    if not listed and any(p.shape[0] != experts for p in params):
        raise ValueError("expert weights must all be stacked along axis 0")
    if listed and len(params) % listed:
        raise ValueError(f"{len(params)} weights for {listed} experts: each expert must hold the same weights")
    tokens, hidden = x.shape
    k = index.shape[1]
    dims = [Dim(TOKENS, tokens), Dim(EXPERTS, experts), Dim("h", hidden, splittable=False)]
    reads = [(x, ((TOKENS,), ("h",))), (index, ((TOKENS,), ())), (weights, ((TOKENS,), ()))]
    # an expert list's weights are separate tensors, each one expert's slice of the logical stack:
    # read as indexed by ``experts`` along axis 0, so the layouts a cut of the experts gives them
    # count 1/p of the list on each rank (a stacked weight's shard) and no partial sum over the
    # expert axes; the program keeps each expert whole on its own ranks (``codegen/experts.py``)
    reads += [(p, ((EXPERTS,),) + ((),) * (p.ndim - 1) if p.ndim else ()) for p in params]
    per_token = sum(p.numel for p in params) // experts  # weight elements of one expert
    attrs = {"experts": experts, "top_k": k, CARRIES: {EXPERTS: TOKENS}, "module": call.args.get("module", ""),
             "listed": bool(listed)}
    return Result("moe_experts", dims, reads, [((TOKENS,), ("h",))], 2 * tokens * k * per_token, attrs)

