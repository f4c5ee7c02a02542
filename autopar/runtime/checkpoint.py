"""Checkpoints of a compiled module and its optimizer, written and read with
``torch.distributed.checkpoint`` (DCP): every rank writes only its own shards, in parallel.

Because a compiled module keeps the model's parameter names (DTensors, or on a pipeline stage the
stage's own tensors), a checkpoint is keyed like the model's own state dict, and DCP reshards on
load: one saved under any plan loads into a module compiled with another plan or another device
count, and into the plain single-device model without a process group (full tensors), e.g. to
evaluate or export it. The optimizer's state goes through ``torch.distributed.checkpoint.state_dict``
(keyed by parameter name, not by position), so it reshards the same way; the step counter and the
random-number state ride along, so a resumed run continues exactly where the saved one stopped.
Under ZeRO the module saves and loads as any other (its state-dict hooks gather ZeRO-3's freed
parameters and reseed the optimizer's master slices from what was loaded); the sliced optimizer
state itself is refused for now (one line).

A checkpoint folder holds one sub-folder per saved step, ``step-00000006``. A save writes into a
hidden ``.step-00000006.partial`` and renames it when every rank has written and the metadata is
down; a run killed mid-save therefore leaves only a partial folder, which loading ignores (and
the next save replaces), and the previous step stays the one that loads. ``keep`` older steps
are kept, the rest removed.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

PREFIX = "step-"
_STEP = re.compile(r"^step-(\d+)$")


def steps(path) -> list[int]:
    """The complete checkpoints in folder ``path``, oldest first (partial saves excluded)."""
    folder = Path(path)
    if not folder.is_dir():
        return []
    found = [int(m[1]) for p in folder.iterdir() if p.is_dir() and (m := _STEP.match(p.name))
             and (p / ".metadata").is_file()]
    return sorted(found)


def latest(path) -> Path | None:
    """The newest complete checkpoint under ``path`` (``path`` itself if it is one), or None."""
    folder = Path(path)
    if (folder / ".metadata").is_file():
        return folder
    done = steps(folder)
    return folder / f"{PREFIX}{done[-1]:08d}" if done else None


def _options():
    """The optimizer's state and hyper-parameters keyed per parameter name ("state.fc1.weight.exp_avg",
    "param_groups.fc1.weight.lr"), not per group: pipeline stages hold different parameters, and
    a list of groups saved from each would be deduplicated into one stage's."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _state(module: nn.Module, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(module, options=_options())}
    from autopar.codegen.zero import ShardedOptimizer

    if isinstance(optimizer, ShardedOptimizer):
        raise ValueError("checkpoints of a ZeRO optimizer's sliced state are not written yet: save the module "
                         "alone (autopar.save_checkpoint(path, module, step=...)), or compile with zero=0")
    model_sd, optim_sd = get_state_dict(module, optimizer, options=_options())
    return {"model": model_sd, "optim": optim_sd}


def save(path, module: nn.Module, optimizer=None, *, step: int, keep: int = 2) -> Path:
    """Write ``module`` (and ``optimizer``'s state) as step ``step`` under folder ``path``; every
    rank calls it. Returns the checkpoint's folder. ``keep``: how many complete steps to keep."""
    import torch.distributed.checkpoint as dcp

    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, not {step!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be a positive int, not {keep!r}")
    folder = Path(path)
    final = folder / f"{PREFIX}{step:08d}"
    partial = folder / f".{PREFIX}{step:08d}.partial"
    distributed = dist.is_available() and dist.is_initialized()
    first = not distributed or dist.get_rank() == 0
    if first:
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"checkpoint folder {str(folder)!r} is a file")
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # left by a run killed mid-save
    if distributed:
        dist.barrier()
    state = _state(module, optimizer)
    state["step"] = step
    state["rng"] = torch.get_rng_state()  # the same on every rank (replicated dropout masks)
    dcp.save(state, checkpoint_id=partial, no_dist=not distributed)  # returns on every rank once the metadata is written
    if first:
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        for old in steps(folder)[:-keep]:
            shutil.rmtree(folder / f"{PREFIX}{old:08d}", ignore_errors=True)
    if distributed:
        dist.barrier()
    return final


def load(path, module: nn.Module, optimizer=None) -> int:
    """Read the newest checkpoint under ``path`` into ``module`` (and ``optimizer``); returns its step.

    ``module``: a compiled module (every rank calls this, under any plan or device count) or the
    plain model (no process group needed: full tensors). ValueError (one line) when there is no
    checkpoint or it does not hold what ``module`` needs.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    where = latest(path)
    if where is None:
        raise ValueError(f"no checkpoint in {str(path)!r}: save one first (autopar run --checkpoint DIR)")
    state = _state(module, optimizer)
    _check(where, state)
    state["step"] = -1
    state["rng"] = torch.get_rng_state()
    dcp.load(state, checkpoint_id=where, no_dist=not (dist.is_available() and dist.is_initialized()))
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(module, state["model"], options=_options())
    else:
        set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=_options())
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def _check(where: Path, state: dict) -> None:
    """Every tensor the module needs is in the checkpoint, with its whole (global) shape."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    try:
        saved = dcp.FileSystemReader(str(where)).read_metadata().state_dict_metadata
    except Exception as e:  # noqa: BLE001 - a damaged folder, whatever the reader says
        raise ValueError(f"{where} is not a readable checkpoint ({type(e).__name__}: {e})") from None
    flat, _ = flatten_state_dict({k: v for k, v in state.items() if k in ("model", "optim")})
    for key, value in flat.items():
        if key not in saved:
            if key.startswith("optim."):
                raise ValueError(f"{where} holds no optimizer state for {key[6:]!r}: it was saved without "
                                 "an optimizer, or for another model; load it without the optimizer")
            raise ValueError(f"{where} holds no {key[6:]!r}: it was saved from another model")
        meta = saved[key]
        if isinstance(value, torch.Tensor) and isinstance(meta, TensorStorageMetadata):
            if tuple(meta.size) != tuple(value.shape):
                raise ValueError(f"{where} holds {key.split('.', 1)[1]!r} of shape {tuple(meta.size)}, this "
                                 f"module's is {tuple(value.shape)}: it was saved from a model of other sizes")


def describe(path) -> str:
    """One line: which steps a checkpoint folder holds."""
    done = steps(path)
    if not done:
        return f"{path}: no checkpoint"
    return f"{path}: steps {', '.join(map(str, done))} (newest {done[-1]})"


__all__ = ["describe", "latest", "load", "save", "steps"]
