"""The command line called in this process, as a user would see it (exit code, stdout, stderr)."""

from __future__ import annotations

import contextlib
import io
from types import SimpleNamespace

from autopar.cli import main


def cli(*args: str) -> SimpleNamespace:
    """``autopar ARGS`` in this process: same parser and error handling, no interpreter start-up.
    Exceptions that escape ``main`` (a traceback for the user) are not caught here."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's own exits (--help, bad choices)
            code = e.code
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def one_line_error(r: SimpleNamespace) -> bool:
    """Exit code 2 and exactly one line on stderr, no traceback."""
    lines = r.stderr.strip().splitlines()
    return r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr
