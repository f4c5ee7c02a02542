"""Why a front end gave up, and the one line a user reads about it.

Each front end raises ``Failure`` located in the user's code where it can; ``message`` joins the
failures of the front ends tried into one actionable ``TraceError`` line.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass

import torch
import torch.nn as nn

from autopar.frontend.cycles import release_frames

_TORCH_DIR = os.path.dirname(torch.__file__)
_FRONTEND_DIR = os.path.dirname(os.path.abspath(__file__))

DATA_DEPENDENT = ("symbolically traced variables cannot be used as inputs to control flow",
                  "data-dependent", "GuardOnDataDependentSymNode", "Could not guard on data-dependent",
                  "Could not extract specialized integer from data-dependent", ".item()")


@dataclass
class Failure(Exception):
    """Why one front end gave up, located in the user's code where we can."""

    frontend: str
    cause: BaseException
    module: str = ""
    where: str = ""  # "file.py:12 (`code`)"
    stage: str = "trace"  # "trace" (building the graph) or "shapes" (running it on meta tensors)

    def __post_init__(self) -> None:
        # what the failed trace held (tracer, model, frames in torch's own cycles) goes with the
        # failure, not at the next full garbage collection; ``where`` was read from them already
        release_frames(self.cause)

    @property
    def reason(self) -> str:
        text = str(self.cause).strip().splitlines()
        first = next((line.strip() for line in text if line.strip()), type(self.cause).__name__)
        return first[:240]


def _advice(failures: list[Failure]) -> str:
    text = " ".join(str(f.cause) for f in failures)
    if any(key in text for key in DATA_DEPENDENT):
        return ("forward() branches on tensor values: express the branch with torch.where or torch.cond, "
                "or compute the condition outside the model")
    if any(f.stage == "outputs" for f in failures):
        return "return the tensors to train on (a tensor, a tuple or dict of tensors, a ModelOutput)"
    if any(f.stage == "shapes" for f in failures):
        return "check that example_inputs (and example_kwargs) have the shapes and dtypes model.forward expects"
    return ("make that line traceable (no Python control flow on tensors or shapes), or move it into a "
            "submodule autopar treats as a leaf")


def message(model: nn.Module, described_inputs: str, failures: list[Failure]) -> str:
    first = failures[0]
    where = f" at {first.where}" if first.where else ""
    module = f" in module '{first.module}'" if first.module else ""
    tried = " and ".join(f.frontend for f in failures)
    parts = [f"cannot trace {type(model).__name__} (inputs {described_inputs}) with {tried}{module}{where}: "
             f"{first.reason}"]
    if len(failures) > 1 and failures[1].reason != first.reason:
        parts.append(f"{failures[1].frontend}: {failures[1].reason}")
    parts.append(_advice(failures))
    return "; ".join(p.replace("\n", " ") for p in parts)


def user_frame(exc: BaseException, model: nn.Module) -> tuple[str, str]:
    """(module path, "file:line (`code`)") of the innermost frame of the user's code in ``exc``."""
    paths = {id(m): name for name, m in model.named_modules()}
    found = ("", "")
    tb = exc.__traceback__
    while tb is not None:
        frame, filename = tb.tb_frame, tb.tb_frame.f_code.co_filename
        ours = filename.startswith(_TORCH_DIR) or filename.startswith(_FRONTEND_DIR + os.sep)
        if not ours and "<" not in filename:
            owner = frame.f_locals.get("self")
            module = paths.get(id(owner), "") if isinstance(owner, nn.Module) else ""
            summary = traceback.extract_tb(tb, limit=1)[0]
            where = f"{os.path.basename(filename)}:{tb.tb_lineno}"
            if summary.line:
                where += f" (`{summary.line.strip()}`)"
            found = (module or found[0], where)
        tb = tb.tb_next
    return found


def stack_line(node) -> str:
    """"file.py:12 (`code`)" from the stack trace fx recorded for ``node``."""
    if node is None or not node.stack_trace:
        return ""
    lines = [ln.strip() for ln in node.stack_trace.strip().splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File ") and _TORCH_DIR not in lines[i]:
            parts = lines[i].split('"')
            file = os.path.basename(parts[1]) if len(parts) > 1 else "?"
            line = lines[i].split("line ")[-1].split(",")[0]
            code = lines[i + 1] if i + 1 < len(lines) else ""
            return f"{file}:{line}" + (f" (`{code}`)" if code else "")
    return ""
