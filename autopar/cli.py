"""The ``autopar`` command line (also ``python -m autopar``).

Every failure the user can fix ends in one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from autopar.errors import AutoparError


def _cmd_trace(args) -> int:
    import autopar
    from autopar import model_spec

    model, inputs, name = model_spec.load(args.model)
    graph = autopar.trace(model, inputs)
    graph.model_name = graph.model_name or name
    print(graph)
    return 0


def _cmd_demo(args) -> int:
    """The main job on an embedded default; grows as planning and codegen land."""
    import autopar

    model, inputs = autopar.zoo.get("gpt", layers=2)
    graph = autopar.trace(model, inputs)
    graph.model_name = "gpt (2 layers)"
    print(graph)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="autopar",
        description="Automatic parallelization-strategy search for PyTorch models.",
        epilog="MODEL is zoo:NAME[:key=value,...] (e.g. zoo:gpt:layers=4) or path/to/file.py:factory, "
        "where factory() returns (model, example_inputs).",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    t = sub.add_parser("trace", help="trace MODEL and print its operator graph")
    t.add_argument("model", metavar="MODEL", help="zoo:NAME[:key=value,...] or file.py:factory")
    t.set_defaults(func=_cmd_trace)
    d = sub.add_parser("demo", help="trace and show the default model (what `make demo` runs)")
    d.set_defaults(func=_cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (AutoparError, ValueError) as e:
        print(f"autopar: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
