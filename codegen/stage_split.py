"""The traced graph cut into one fx submodule per pipeline stage (what each stage computes, what
it receives from earlier stages and sends on), checked and built; ``pipeline.py`` runs them.

The design notes are in docs/codegen.md, "Pipeline stages".
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx as fx
import torch.nn as nn

from autopar.core.meta import MetaProp, to_meta

@dataclass
class StageGraph:
    """One stage's fx graph: what it receives from the previous stage and what it passes on."""

    graph: fx.Graph
    carried_in: list[str]  # tensors received from the previous stage, in order (fx node names)
    carried_out: list[str]  # tensors sent to the next stage (empty for the last stage)
    nodes: list[str]  # the fx nodes it runs (recomputed shape arithmetic included)


# -- checks ------------------------------------------------------------------------------------


def check_stages(stages: Sequence[Any], node_names: Sequence[str], world_size: int | None = None
                 ) -> list[list[str]]:
    """The plan's stages as lists of node names, after checking that they can be run.

    Each stage must be a contiguous run of the graph's nodes (in topological order), the stages in
    order and covering every node once, all on the same number of devices, and (when
    ``world_size`` is given) the stages' devices must add up to the process count. Raises a
    one-line ``ValueError``.
    """
    if not stages:
        raise ValueError("the plan has no pipeline stages; use codegen.module.shard_module")
    names = [list(getattr(s, "nodes", s)) for s in stages]
    devices = [int(getattr(s, "devices", 1)) for s in stages]
    if world_size is not None and sum(devices) != world_size:
        raise ValueError(f"the plan's {len(stages)} stages need {sum(devices)} processes "
                         f"(devices per stage: {devices}), but the process group has {world_size}")
    position = {n: i for i, n in enumerate(node_names)}
    start = 0
    for k, stage in enumerate(names):
        unknown = [n for n in stage if n not in position]
        if unknown:
            raise ValueError(f"stage {k} names nodes the graph does not have: {unknown[:3]}")
        if not stage:
            raise ValueError(f"stage {k} has no nodes")
        expected = list(node_names[start:start + len(stage)])
        if sorted(stage, key=position.__getitem__) != expected:
            wrong = next(n for n in sorted(stage, key=position.__getitem__) if n not in expected)
            raise ValueError(f"stage {k}'s nodes are not contiguous in topological order: "
                             f"{wrong!r} is not among nodes {start}..{start + len(stage) - 1} "
                             f"({expected[0]!r} .. {expected[-1]!r})")
        start += len(stage)
    if start != len(node_names):
        raise ValueError(f"the stages cover {start} of the graph's {len(node_names)} nodes; "
                         f"first left out: {node_names[start]!r}")
    if len(set(devices)) > 1:
        raise ValueError(f"stages on different device counts {devices} are not supported: every "
                         f"stage needs the same sub-mesh")
    if devices[0] < 1:
        raise ValueError(f"a stage needs at least one device, not {devices[0]}")
    return names


# -- splitting the graph -----------------------------------------------------------------------


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(_holds_tensor(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    return False


class HoldsTensor(MetaProp):
    """Runs the graph on meta tensors and records, per node, whether its value holds a tensor."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.tensor: dict[str, bool] = {}  # the value holds a tensor (a tensor, a tuple of them)
        self.is_tensor: dict[str, bool] = {}  # the value is one tensor (can be sent as it is)

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        self.tensor[n.name] = _holds_tensor(value)
        self.is_tensor[n.name] = isinstance(value, torch.Tensor)
        return value

    def placeholder(self, target, args, kwargs):
        return to_meta(super().placeholder(target, args, kwargs))


def split_stages(gm: fx.GraphModule, stages: list[list[str]], example_inputs: Sequence[Any]
                 ) -> list[StageGraph]:
    """Cut ``gm``'s graph into one fx graph per stage (see the module docstring for the rules).

    ``stages`` come from ``check_stages``; ``example_inputs`` are only run on meta tensors, to
    tell tensors from shape arithmetic.
    """
    probe = HoldsTensor(gm)
    probe.run(*example_inputs)
    last = len(stages) - 1
    fx_nodes = list(gm.graph.nodes)
    stage_of: dict[str, int] = {n: k for k, names in enumerate(stages) for n in names}
    recompute: set[str] = set()  # shape arithmetic: emitted wherever it is read
    for n in fx_nodes:
        if n.op in ("placeholder", "get_attr", "output") or n.name in stage_of:
            continue
        if probe.tensor[n.name]:
            stage_of[n.name] = max([_ready(m, stage_of, recompute) for m in n.all_input_nodes],
                                   default=0)
        else:
            recompute.add(n.name)
    # which nodes each stage emits, and the tensors it needs from earlier stages
    emit: list[set[str]] = [set() for _ in stages]
    needs: list[set[str]] = [set() for _ in stages]

    def need(node: fx.Node, k: int) -> None:
        for m in node.all_input_nodes:
            if m.op == "placeholder":
                continue
            if m.op == "get_attr" or m.name in recompute:
                if m.name not in emit[k]:
                    emit[k].add(m.name)
                    need(m, k)
                continue
            s = stage_of[m.name]
            if s > k:
                raise ValueError(f"node {node.name!r} in stage {k} reads {m.name!r} of a later "
                                 f"stage {s}: the stages are not in topological order")
            if s < k:
                if not probe.is_tensor[m.name]:
                    raise ValueError(f"stage {k} reads {m.name!r} of stage {s}, which is not one "
                                     f"tensor (a stage can only send tensors): move the cut")
                needs[k].add(m.name)

    for n in fx_nodes:
        if n.op == "output":
            need(n, last)
        elif n.name in stage_of:
            emit[stage_of[n.name]].add(n.name)
            need(n, stage_of[n.name])
    # a tensor read by stage k and made in stage s < k passes through every stage in between
    carried: list[set[str]] = [set() for _ in stages]  # carried[k]: received by stage k
    for k, names in enumerate(needs):
        for v in names:
            for j in range(stage_of[v] + 1, k + 1):
                carried[j].add(v)
    order = {n.name: i for i, n in enumerate(fx_nodes)}
    carried_in = [sorted(c, key=order.__getitem__) for c in carried]
    out = []
    for k in range(len(stages)):
        out.append(_stage_graph(fx_nodes, emit[k], carried_in[k],
                                carried_in[k + 1] if k < last else None))
    return out


def _ready(m: fx.Node, stage_of: dict[str, int], recompute: set[str]) -> int:
    """The earliest stage where ``m``'s value is available (inputs and attributes: anywhere)."""
    if m.op in ("placeholder", "get_attr"):
        return 0
    if m.name in recompute:
        return max([_ready(a, stage_of, recompute) for a in m.all_input_nodes], default=0)
    return stage_of[m.name]


def _stage_graph(fx_nodes: list[fx.Node], emit: set[str], carried_in: list[str],
                 carried_out: list[str] | None) -> StageGraph:
    """Placeholders: the carried tensors, then the model's inputs (keywords after the first
    stage); then the emitted nodes in their original order; out: the carried tensors or the loss."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    by_name = {n.name: n for n in fx_nodes}
    for name in carried_in:
        env[by_name[name]] = g.placeholder(name)
    for n in fx_nodes:
        if n.op == "placeholder":
            env[n] = g.node_copy(n, lambda a: env[a])
    for n in fx_nodes:
        if n.name in emit and n.op != "placeholder":
            env[n] = g.node_copy(n, lambda a: env[a])
    if carried_out is None:
        output = next(n for n in fx_nodes if n.op == "output")
        g.output(fx.map_arg(output.args[0], lambda a: env[a]))
    else:
        g.output(tuple(env[by_name[v]] for v in carried_out))
    g.lint()
    return StageGraph(g, list(carried_in), list(carried_out or []),
                      [n.name for n in fx_nodes if n.name in emit])


def stage_ir(graph, names: list[str], part: StageGraph, gm: fx.GraphModule,
             module: fx.GraphModule):
    """The IR of one stage: its nodes, with what earlier stages made read as graph inputs.

    ``graph``: the model's IR (at microbatch size); ``gm``: the fx graph it was traced from;
    ``module``: the stage's GraphModule (``split_stages``' ``part``), which becomes its fx_graph.
    """
    import dataclasses

    from autopar.core.ir import Graph, Operand, TensorSpec

    fx_nodes = {n.name: n for n in gm.graph.nodes}
    ir_names = {n.name for n in graph.nodes}
    renamed: dict[tuple[str, int], str] = {}
    inputs = {}
    for v in part.carried_in:
        source = _ir_source(fx_nodes[v], ir_names)
        if source is None:
            raise ValueError(f"stage input {v!r} is no IR node output: cannot shard the stage")
        renamed[source] = f"input:{v}"
        spec = graph.node(source[0]).outputs[source[1]]
        inputs[v] = TensorSpec(spec.shape, spec.dtype, tuple(() for _ in spec.shape))
    inputs.update(graph.inputs)
    nodes = []
    for name in names:
        node = graph.node(name)
        ops = tuple(Operand(renamed[(o.source, o.output)], 0, o.spec)
                    if (o.source, o.output) in renamed else o for o in node.inputs)
        nodes.append(dataclasses.replace(node, inputs=ops))
    outputs = []
    for v in part.carried_out:
        source = _ir_source(fx_nodes[v], ir_names)
        outputs.append((renamed.get(source, source[0]), 0 if source in renamed else source[1]))
    for n in module.graph.nodes:  # traced at full batch: codegen propagates the microbatch again
        n.meta.pop("val", None)
    return Graph(nodes, inputs, outputs or list(graph.outputs), graph.model_name, module)


def stage_boundary(graph, assignment: dict, mesh_shape: tuple[int, ...], part: StageGraph, gm: fx.GraphModule,
                   last: bool):
    """What a stage of several devices receives and sends (``built.Boundary``): each tensor in its
    producer's output layout under the plan (``assignment``: every node's config on the stage's
    sub-mesh ``mesh_shape``; ``graph``: the model's IR at microbatch size), so that the rank at one
    place of a stage's sub-mesh sends its shard to the rank at the same place of the next one, as
    the plan prices the cut; a tensor passed through a stage leaves as it came. The last stage
    sends nothing (its loss leaves whole)."""
    from .built import Boundary
    from .placements import node_layout

    fx_nodes = {n.name: n for n in gm.graph.nodes}
    ir_names = {n.name for n in graph.nodes}

    def layout(v: str):
        source = _ir_source(fx_nodes[v], ir_names)
        if source is None:
            raise ValueError(f"stage input {v!r} is no IR node output: cannot shard the stage")
        node = graph.node(source[0])
        return node_layout(node, assignment.get(source[0]), tuple(mesh_shape)).outputs[source[1]]

    return Boundary({v: layout(v) for v in part.carried_in},
                    None if last else [layout(v) for v in part.carried_out])


def _ir_source(n: fx.Node, ir_names: set[str]) -> tuple[str, int] | None:
    """The IR (node, output) an fx value is: the node itself or ``getitem`` of its tuple."""
    if n.name in ir_names:
        return (n.name, 0)
    if n.op == "call_function" and getattr(n.target, "__name__", "") == "getitem":
        src, idx = n.args
        if isinstance(src, fx.Node) and src.name in ir_names and isinstance(idx, int):
            return (src.name, idx)
    return None


def stage_modules(model: nn.Module, gm: fx.GraphModule, stages: list[list[str]],
                  example_inputs: Sequence[Any]) -> list[fx.GraphModule]:
    """One GraphModule per stage over a copy of ``model`` (parameters keep their names).

    ``gm`` is the fx graph traced from ``model`` (its targets are looked up in ``model``).
    Raises ``ValueError`` when a parameter would be in two stages.
    """
    return build_stage_modules(model, split_stages(gm, stages, example_inputs))


def build_stage_modules(model: nn.Module, parts: list[StageGraph]) -> list[fx.GraphModule]:
    root = copy.deepcopy(model)
    modules = [fx.GraphModule(root, p.graph, class_name=f"Stage{k}") for k, p in enumerate(parts)]
    _check_disjoint(modules)
    return modules


def _check_disjoint(modules: list[fx.GraphModule]) -> None:
    """Every parameter in one stage only: a tied weight read by two stages would diverge."""
    owner: dict[int, tuple[int, str]] = {}
    for k, m in enumerate(modules):
        for name, p in m.named_parameters():
            if id(p) in owner and owner[id(p)][0] != k:
                j, first = owner[id(p)]
                raise ValueError(f"parameter {first!r} is used by stages {j} and {k} (tied weights); "
                                 f"a pipeline needs each parameter in one stage: move the cut")
            owner.setdefault(id(p), (k, name))
