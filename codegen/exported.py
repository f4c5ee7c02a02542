"""An exported program's graph in the form pipeline stages are cut from: parameters read by name.

torch.export's training IR passes every parameter and buffer into the graph as a placeholder (the
program's graph signature maps each to its qualified name), where an fx symbolic trace reads them
with ``get_attr``. The pipeline's stage split (``stage_split.py``) gives each stage the graph's
placeholders as its inputs and the attributes it reads as its own parameters, so a stage cut
from the exported graph as it is would take every stage's weights as inputs and own none. This
rewrites a copy of the graph so that each state placeholder becomes a ``get_attr`` of the
parameter's (buffer's) qualified name, over the model itself: the same computing nodes, in the
same order, under the same names (the IR's node names are the graph's), with the model's inputs
the only placeholders. A model that returns its loss alone has it as a one-tensor output tuple in the
program (the export front end flattens outputs): it is returned as the tensor, as the schedule's
last stage hands it on.
"""

from __future__ import annotations

import copy
import dataclasses

import torch.fx as fx
import torch.nn as nn

# what the front end recorded of the graph that still holds for the copy: the axes traced at the
# batch's size (``core.batch``) and the non-tensor inputs' values; not the state's names (its
# placeholders are gone) nor the front end's name (the copy is read as an fx graph)
KEPT_META = ("autopar_batch_axes", "autopar_constants")


def is_exported(graph) -> bool:
    """Whether ``graph`` (an IR Graph) comes from torch.export (its parameters are placeholders)."""
    gm = getattr(graph, "fx_graph", None)
    return gm is not None and gm.meta.get("autopar_frontend") == "export"


def fx_form(graph, model: nn.Module):
    """``graph`` itself for a symbolic trace; for an exported one, a copy of the IR Graph whose
    ``fx_graph`` reads the state with ``get_attr`` over ``model`` (see the module docstring)."""
    if not is_exported(graph):
        return graph
    gm = graph.fx_graph
    state = dict(gm.meta.get("autopar_state", {}))
    g = copy.deepcopy(gm.graph)
    first = next((n for n in g.nodes if n.op != "placeholder"), None)
    for n in [n for n in g.nodes if n.op == "placeholder" and n.name in state]:
        with g.inserting_before(first):
            attr = g.get_attr(state[n.name])
        attr.meta = dict(n.meta)
        n.replace_all_uses_with(attr)
        g.erase_node(n)
    out = next(n for n in g.nodes if n.op == "output")
    result = out.args[0]
    if isinstance(result, (tuple, list)) and len(result) == 1 and isinstance(result[0], fx.Node):
        out.args = (result[0],)
    g.lint()
    module = fx.GraphModule(model, g, class_name=type(model).__name__)
    # a causal mask built from the batch's size alone then scales with a microbatch (``scale_batch``)
    # as with a data rank's shard
    module.meta.update({k: gm.meta[k] for k in KEPT_META if k in gm.meta})
    return dataclasses.replace(graph, fx_graph=module)
