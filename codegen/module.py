"""The module ``autopar.compile`` returns on each rank: the model's parameters as DTensors, run
by the rank's generated program (``program.py``), gradients synced by ``runtime.GradReducer``.

Parameters keep their names (the model's children are its children) and are DTensors laid out as
their first reader wants them (``p.full_tensor()`` is the whole value), so optimizers, state
dicts and checkpoints see the model's structure. ``forward`` feeds the program this rank's local
shards and the inputs; ``module.code`` is what this rank runs. One training interface for every
plan: ``loss = module.train_step(*inputs)`` runs forward and backward (``loss.backward()`` on the
forward's output works too, except for pipelined plans), then ``optimizer.step()``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect

import torch
from torch import fx, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

from autopar.core.batch import traced_batch
from autopar.core.ir import Graph
from autopar.core.tables import Config

from .batch_check import check_same_batch
from .batches import batch_of, program_for_batch, rebuilt
from .built import Boundary
from .expert_weights import ExpertWeights
from .local_step import local_stepping
from .placements import LayoutError
from .program import Program, build
from .runtime import GradReducer, finish_loss
from .training import PLAIN, ProgramTraining
from .zero_units import ZeroUnits, instrument, recast_hooks, unit_of


class CompiledModule(nn.Module):
    """This rank's module: the model's children with DTensor parameters, run by ``program``."""

    def __init__(self, model: nn.Module, program: Program, mesh: DeviceMesh, graph: Graph, signature,
                 outputs: str = "replicate", training: ProgramTraining = PLAIN, check_batch: bool = False):
        super().__init__()
        self._outputs = outputs
        for name, child in model.named_children():
            self.add_module(name, child)
        for name, p in model.named_parameters(recurse=False):
            self.register_parameter(name, p)
        for name, b in model.named_buffers(recurse=False):
            self.register_buffer(name, b)
        object.__setattr__(self, "program", program)  # not a child: its state is ours already
        self.mesh = mesh
        self._signature = signature
        try:
            self._model_signature = inspect.signature(model.forward)
        except (TypeError, ValueError):
            self._model_signature = None
        self._input_specs = dict(program.input_specs)
        self._batch_checked = not check_batch  # the user's global batch: the same on every rank?
        self._device = torch.device(mesh.device_type, torch.cuda.current_device()) \
            if mesh.device_type == "cuda" else torch.device("cpu")
        self._call = getattr(graph, "call", None)  # how the model is called and what it returns
        self._export = graph.fx_graph.meta.get("autopar_frontend") == "export"
        # the program reads every parameter's and buffer's local tensor directly; a trainable
        # parameter's local tensor is made a leaf of autograd (``GradReducer``)
        self._expert_weights = ExpertWeights(list(program.held_experts))  # a cut expert list's: own experts' only
        self._expert_weights.release(self)
        self._state = []
        leaves = []
        self._locals = {}
        for name in program.state:
            t = _tensor(self, name)
            local = t._local_tensor if isinstance(t, DTensor) else t
            if isinstance(t, nn.Parameter) and t.requires_grad and name not in program.sync_bn:
                local.requires_grad_(True)
                leaves.append((t, local, program.reduce_axes.get(name, ())))
            self._state.append(local)
            self._locals[name] = local
        self._batch = traced_batch(graph)
        self._programs = {self._batch: (program, self._state)}  # per global batch size (``batches.py``)
        self._rebuild = None  # batch size -> Program, set by compile_module
        self.training = training
        self.loss_reduction = "mean"  # with gradient accumulation: "mean" or "sum" over the batch
        names = {id(local): name for name, local in self._locals.items()}
        self.reducer = GradReducer(mesh, leaves, zero=training.zero, zero_axes=training.zero_axes,
                                   units=[unit_of(names[id(local)]) for _, local, _ in leaves],
                                   compute=training.dtype if training.zero == 3 else None)
        swap = self.reducer.compute_leaves  # ZeRO-3 under mixed precision: the program reads those
        if swap:
            self._locals = {n: swap.get(id(t), t) for n, t in self._locals.items()}
            self._state[:] = [swap.get(id(t), t) for t in self._state]
            names = {id(local): name for name, local in self._locals.items()}
        self._units = ZeroUnits(self.reducer, names) if training.zero == 3 else None  # per block (``zero_units.py``)
        self.reducer.gated = self._units is not None
        if training.zero or self._expert_weights.held:  # state dicts read and write whole parameters
            self.register_state_dict_pre_hook(lambda module, prefix, keep_vars: module.unshard())
            self.register_load_state_dict_pre_hook(lambda module, *args: module.unshard())
            self.register_load_state_dict_post_hook(lambda module, incompatible: module._loaded())

    def unshard(self) -> None:
        """Gather the parameters this rank stores in part, to read them whole (``p.full_tensor()``):
        ZeRO-3's (the next backward or optimizer step frees them again) and other ranks' experts
        of a cut expert list (``expert_weights.py``: the next forward frees them). A no-op under
        other plans."""
        self.reducer.gather_params()
        self._expert_weights.gather(self)

    @property
    def held_elsewhere(self) -> set[str]:
        """Names of the parameters other ranks hold and this rank does not (a cut expert list's
        other experts: no gradient, no optimizer state here; ``unshard`` reads them whole)."""
        return self._expert_weights.foreign

    def _loaded(self) -> None:
        """After a state dict was loaded into the whole parameters: ZeRO's master slices from
        them; other ranks' experts freed again."""
        self.reducer.refresh_masters()
        self._expert_weights.release(self)

    @property
    def code(self) -> str:
        """The Python code of this rank's program (``torch.fx`` generated)."""
        return self.program.module.code

    def forward(self, *args, **kwargs):
        inputs = self._bind(args, kwargs)
        if not self._batch_checked and not self.program.input_placements:  # inputs="global"
            check_same_batch([(n, v) for n, v in zip(self.program.inputs, inputs) if isinstance(v, torch.Tensor)],
                             self.mesh)
            self._batch_checked = True  # once: the first call (batch_check.py says what it costs)
        program, state = self._program_for(inputs)
        self._expert_weights.release(self)  # other ranks' experts, gathered to be read: freed again
        self.reducer.sync_zeroed()
        if self._units is not None:  # ZeRO-3: each block gathered around its forward and its backward
            instrument(program.module, program.state, self._units)
            self._units.begin()
            with recast_hooks():
                out = program.module(*state, *inputs)
        else:
            out = program.module(*state, *inputs)
        if not torch.is_grad_enabled():
            self.reducer.release_params()  # no backward will: free them now
        if self._export and self._call is not None:  # flat graph outputs: nest them as the model does
            out = self._call.unflatten(list(out) if isinstance(out, (tuple, list)) else [out])
        if torch.is_grad_enabled():
            self.reducer.watch(out)
        if self._outputs == "dtensor":
            leaves = iter(program.output_placements)
            out = fx.node.map_aggregate(out, lambda v: _as_dtensor(v, next(leaves), self.mesh))
        return out

    def optimizer(self, cls=torch.optim.AdamW, **kwargs) -> torch.optim.Optimizer:
        """The optimizer this module's plan trains with: ``cls(self.parameters(), **kwargs)``, or
        under ZeRO one that steps only this rank's slice of the optimizer state and gathers the
        updated parameters (ZeRO-3: the next forward gathers them; ``zero.ShardedOptimizer``; one
        parameter group). ``foreach`` defaults to True where ``cls`` takes it: the parameters are
        DTensors, and torch's per-parameter loop (its CPU default) pays DTensor's dispatch on every
        op of every parameter (gpt, 2 ranks: AdamW 9.9 ms a step, 6.1 ms with foreach, DDP's 5.9);
        an element-wise optimizer (Adam, AdamW, SGD, ...) steps on the local tensors
        (``local_step.py``: 7.0 ms a step over DTensors, 6.2 on local tensors, as DDP's)."""
        if not self.training.zero:
            if "foreach" in inspect.signature(cls).parameters:
                kwargs = {"foreach": True, **kwargs}
            foreign = self._expert_weights.foreign  # other ranks' experts: no state here
            return local_stepping(cls)([p for n, p in self.named_parameters() if n not in foreign], **kwargs)
        from .zero import ShardedOptimizer

        return ShardedOptimizer(self.reducer, cls, **kwargs)

    def train_step(self, *args, **kwargs) -> torch.Tensor:
        """Forward and backward of one batch; returns the (detached) whole loss. Then
        optimizer.step(). The program's outputs are left as this rank holds them: the loss's
        all-reduce runs beside the backward (``runtime.finish_loss``), the outputs other than the
        loss are not made whole (the step drops them). With gradient accumulation
        (``training.accumulate`` k > 1) the batch runs as k microbatches, the gradients reduced
        once (``accumulate.py``; ``loss_reduction``: how the loss is made of its batch's)."""
        if self.training.accumulate > 1:
            from .accumulate import accumulated_step

            return accumulated_step(self, args, kwargs, self.training.accumulate, self.loss_reduction)
        return self.one_step(args, kwargs)

    def one_step(self, args: tuple, kwargs: dict, scale: float = 1.0) -> torch.Tensor:
        """One forward and a backward of ``scale`` times the loss; the (detached, unscaled) loss."""
        with contextlib.ExitStack() as stack:  # a program built in this call returns its outputs whole
            lists = [stack.enter_context(p.outputs_deferred()) for p, _ in self._programs.values()]
            out = self(*args, **kwargs)
        undone = [u for undone in lists for u in undone]
        loss = training_loss(out)
        spec = next((s for _, t, s in undone if t is loss), None)
        if spec is None and undone:  # a forward hook may return new tensors: find the loss's leaf
            leaves = []
            fx.node.map_aggregate(out, leaves.append)
            at = next((i for i, t in enumerate(leaves) if t is loss), None)
            spec = next((s for i, _, s in undone if i == at), None)
        if spec is None:  # the loss needed no reshard: whole already
            (loss * scale if scale != 1.0 else loss).backward()
            return loss.detach()
        return finish_loss(loss, spec, scale)

    def _bind(self, args: tuple, kwargs: dict) -> list:
        names = self.program.inputs
        if self._call is not None:  # the call as traced: positional and keyword, one-line errors
            args, kwargs = self._as_traced(args, kwargs)
            leaves = [leaf.placeholder for leaf in self._call.inputs if leaf.placeholder]
            for name, v in zip(leaves, self._call.flatten(args, kwargs)):
                self._check_kind(name, v)  # rank and dtype first: a wrong one is no batch-size matter
            tensors = self._call.flatten(args, kwargs)  # the batch is checked by _program_for
            leaves = [leaf.placeholder for leaf in self._call.inputs if leaf.placeholder]
            bound = dict(zip(leaves, tensors))
            for name in names:
                bound.setdefault(name, None)  # a traced constant (fx keeps it as a placeholder)
        elif self._signature is not None:
            bound = self._signature.bind_partial(*args, **kwargs).arguments
        else:
            bound = dict(zip(names, args))
            bound.update(kwargs)
        out = []
        for name in names:
            if name not in bound:
                raise TypeError(f"missing input {name!r}: this module was compiled for the inputs {names}")
            v = bound[name]
            self._check_kind(name, v)
            if isinstance(v, torch.Tensor) and v.device.type != self.mesh.device_type:
                v = v.to(self._device)  # inputs follow the module onto this rank's device
            out.append(v)
        return out

    def _as_traced(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The call with each argument where the traced call had it (positional or keyword), so
        ``module(x, labels=y)`` runs a module traced as ``model(x, y)``."""
        spec = self._call.in_spec
        n = spec.child(0).num_children
        keys = list(spec.child(1).context or [])
        if (len(args) == n and set(kwargs) == set(keys)) or self._model_signature is None:
            return args, kwargs
        try:
            bound = self._model_signature.bind(*args, **kwargs)
        except TypeError:
            return args, kwargs  # let flatten say what does not match, in one line
        bound.apply_defaults()
        params = list(self._model_signature.parameters)
        if any(p not in bound.arguments for p in params[:n]) or any(k not in bound.arguments for k in keys):
            return args, kwargs
        return tuple(bound.arguments[p] for p in params[:n]), {k: bound.arguments[k] for k in keys}

    def _check_kind(self, name: str, v) -> None:
        """One-line ValueError for an input of another rank or dtype than the traced one."""
        spec = self._input_specs.get(name)
        if spec is None or not isinstance(v, torch.Tensor):
            return
        if v.dim() != len(spec.shape):
            raise ValueError(f"input {name!r} has {v.dim()} dims (shape {tuple(v.shape)}); this module was "
                             f"compiled for {len(spec.shape)} (shape {tuple(spec.shape)}): pass inputs shaped "
                             "like the example inputs, or compile again with the new ones")
        if str(v.dtype).removeprefix("torch.") != spec.dtype:
            raise ValueError(f"input {name!r} is {str(v.dtype).removeprefix('torch.')}; this module was compiled "
                             f"for {spec.dtype}: convert it (x.to(torch.{spec.dtype})), or compile again with "
                             "example inputs of that dtype")

    def _program_for(self, inputs: list):
        """The program (and its state tensors) for the batch these inputs carry: the traced
        one's, or one built (once, then cached) for another batch size (``batches.py``)."""
        size = batch_of(self, inputs)
        if size not in self._programs:
            self._programs[size] = rebuilt(self, size)
        return self._programs[size]

    def _parts(self, name: str) -> int:
        pl = self.program.input_placements.get(name)
        if pl is None:
            return 1
        out = 1
        for a, p in enumerate(pl):
            if p.is_shard():
                out *= self.mesh.shape[a]
        return out

    @property
    def data_parallel(self) -> tuple[int, int]:
        """(replicas, this rank's index) of the batch slices with ``inputs="local"``: what a
        ``DistributedSampler(num_replicas=..., rank=...)`` needs. Rank r's slice is chunk ``index``
        of ``torch.chunk(whole_batch, replicas)``: its coordinates on the mesh axes that shard the
        batch, the lowest axis major (DTensor's order). When inputs are sliced over different axes
        (a plan may read the labels otherwise than the data), ``local_batch`` cuts each its way."""
        found = {self._slice_of(name) for name in self.program.input_placements}
        if len(found) > 1:
            raise ValueError("the inputs are sliced over different mesh axes: use module.local_batch(*batch)")
        return found.pop() if found else (1, 0)

    def _slice_of(self, name: str) -> tuple[int, int]:
        pl = self.program.input_placements.get(name)
        if pl is None:
            return 1, 0
        coord = self.mesh.get_coordinate() or [0] * self.mesh.ndim
        replicas, index = 1, 0
        for a, p in enumerate(pl):
            if p.is_shard():
                replicas *= self.mesh.shape[a]
                index = index * self.mesh.shape[a] + coord[a]
        return replicas, index

    def local_batch(self, *args, **kwargs):
        """This rank's slices of a whole batch, as ``forward`` takes them with ``inputs="local"``
        (positional arguments in the traced order; for tests and small runs: a real loader hands
        each rank its own slice, see ``data_parallel``)."""
        names = self.program.inputs

        def cut(name, t):
            replicas, index = self._slice_of(name)
            return t.chunk(replicas)[index] if isinstance(t, torch.Tensor) and t.dim() and replicas > 1 else t

        return (tuple(cut(names[i] if i < len(names) else "", a) for i, a in enumerate(args)),
                {k: cut(k, v) for k, v in kwargs.items()})


def _as_dtensor(v, placements, mesh: DeviceMesh):
    if placements is None or not isinstance(v, torch.Tensor):
        return v
    return DTensor.from_local(v, mesh, placements, run_check=False)


def _tensor(module: nn.Module, name: str) -> torch.Tensor:
    owner, _, leaf = name.rpartition(".")
    m = module.get_submodule(owner) if owner else module
    return getattr(m, leaf)


def compile_module(model: nn.Module, graph: Graph, assignment: dict[str, Config], mesh: DeviceMesh,
                   outputs: str = "replicate", inputs: str = "global",
                   training: ProgramTraining = PLAIN, keep: dict[str, nn.Parameter] | None = None,
                   check_batch: bool = False, boundary: Boundary | None = None) -> CompiledModule:
    """This rank's module for ``graph`` under ``assignment`` on ``mesh`` (``model`` is copied);
    ``training``: mixed precision, recomputation and ZeRO (``training.py``). ``keep``: parameter
    objects by name that become the module's parameters (their values swapped for the DTensors,
    ``torch.utils.swap_tensors``), so that an optimizer built on them before compiling steps
    this module's parameters (``autopar.compile`` without example inputs plans at the first call).
    ``check_batch``: at the first call, check that every rank passed the same global batch
    (``batch_check.py``; what ``autopar.compile`` asks for: the user's batch, not a pipeline
    stage's activations). ``boundary``: a pipeline stage's received and sent tensors, taken and
    left as this rank's shards (``built.Boundary``); such a module runs its traced batch only (a
    stage's microbatch), and does not keep ``graph`` (whose GraphModule holds the unsharded weights).
    """
    if graph.fx_graph is None:
        raise LayoutError("compile needs graph.fx_graph, the traced GraphModule the IR came from")
    from autopar.core.meta import exclusive

    with exclusive():  # another rank's thread may be propagating shapes through the same modules
        model = copy.deepcopy(model)
    if mesh.device_type != "cpu":  # this rank's shards live on its device (cuda:LOCAL_RANK)
        from .mesh import device_type, local_device

        model = model.to(local_device("nccl") if device_type() == "cuda" else torch.device("cuda"))
    program = build(graph, assignment, mesh, model, outputs, inputs, training, boundary)  # on the plain copy: reads shapes
    _distribute_state(model, mesh, program.stored, keep or {})
    try:
        signature = inspect.signature(model.forward) if graph.fx_graph.meta.get("autopar_frontend") != "export" \
            else None
    except (TypeError, ValueError):
        signature = None
    if signature is not None and any(p.kind == p.VAR_POSITIONAL for p in signature.parameters.values()):
        signature = None
    module = CompiledModule(model, program, mesh, graph, signature, outputs, training, check_batch)
    if boundary is None:
        module._rebuild = functools.partial(program_for_batch, graph, assignment, mesh, outputs, inputs, training)
    return module


def _distribute_state(model: nn.Module, mesh: DeviceMesh, stored, keep: dict[str, nn.Parameter]) -> None:
    """Every parameter and buffer as a DTensor; a tied one (one tensor, several names) once; a
    parameter named in ``keep`` keeps that object (its value becomes the DTensor)."""
    replicate = tuple(Replicate() for _ in range(mesh.ndim))
    for named, make in ((model.named_parameters, _parameter), (model.named_buffers, _buffer)):
        aliases: dict[int, list[str]] = {}
        tensors: dict[int, torch.Tensor] = {}
        for name, t in named(remove_duplicate=False):
            aliases.setdefault(id(t), []).append(name)
            tensors[id(t)] = t
        for key, names in aliases.items():
            placements = next((stored[n] for n in names if n in stored), replicate)
            new = make(tensors[key], mesh, placements)
            old = next((keep[n] for n in names if n in keep), None) if make is _parameter else None
            if old is not None:
                torch.utils.swap_tensors(old, new)
                new = old
            for name in names:
                path, _, leaf = name.rpartition(".")
                owner = model.get_submodule(path) if path else model
                (owner._parameters if make is _parameter else owner._buffers)[leaf] = new


def _parameter(p: torch.Tensor, mesh: DeviceMesh, placements) -> nn.Parameter:
    return nn.Parameter(distribute_tensor(p.detach(), mesh, placements), requires_grad=p.requires_grad)


def _buffer(b: torch.Tensor, mesh: DeviceMesh, placements) -> torch.Tensor:
    return distribute_tensor(b, mesh, placements)


def shard_module(model: nn.Module, graph: Graph, assignment: dict[str, Config], mesh_shape: tuple[int, ...],
                 device_mesh: DeviceMesh | None = None, outputs: str = "replicate",
                 boundary: Boundary | None = None, training: ProgramTraining = PLAIN) -> CompiledModule:
    """``compile_module`` on a mesh of ``mesh_shape`` (built on the process group's devices) or on
    ``device_mesh`` (a caller's, e.g. one pipeline stage's sub-mesh, with its ``boundary``)."""
    from .mesh import device_mesh as make_mesh

    mesh = device_mesh if device_mesh is not None else make_mesh(tuple(mesh_shape))
    if tuple(mesh.shape) != tuple(mesh_shape):
        raise LayoutError(f"device mesh {tuple(mesh.shape)} is not the plan's mesh {tuple(mesh_shape)}")
    return compile_module(model, graph, assignment, mesh, outputs, boundary=boundary, training=training)


__all__ = ["CompiledModule", "compile_module", "shard_module"]


def training_loss(out) -> torch.Tensor:
    """The loss in what a model returns: a scalar tensor, or an output (dict or object) with a
    scalar ``loss``; else a one-line ValueError saying what was returned and what to do."""
    if isinstance(out, dict):
        loss = out.get("loss")
        what = f"a dict with keys {sorted(map(str, out))}" if loss is None else None
    else:
        loss = getattr(out, "loss", out)
        what = None
    if what is None and not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
        what = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
                else f"a {type(loss).__name__}")
    if what is not None:
        raise ValueError(f"training needs a forward that returns the loss (a scalar tensor, or an output "
                         f"with a scalar 'loss'), but it returned {what}: return the loss (e.g. add a loss "
                         "such as F.cross_entropy to forward), or call the module and backward yourself")
    return loss
