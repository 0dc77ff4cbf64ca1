"""The wheelforge command run in the test's own process (click's ``CliRunner``), for tests
that check only its text and exit status: no interpreter to start, so they are unit tests.

It runs ``wheelforge.cli.main.main`` itself, the entry point's error handling included (a
``WheelforgeError`` becomes its message and exit status, a bug a traceback and 70), with
the streams captured; what ``main`` sets for the process (its SIGTERM and SIGALRM handlers,
the warnings' display) is put back after.  A test of signals, of a child process's
environment or of what a real process leaves behind runs ``python -m wheelforge`` instead.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from wheelforge.cli.main import main


@dataclass(frozen=True)
class Ran:
    """What the command printed and its exit status, as ``subprocess.run`` gives them."""

    returncode: int
    stdout: str
    stderr: str


def run_wheelforge(*args: str | Path, cwd: Path | None = None,
                   env: Mapping[str, str | None] | None = None) -> Ran:
    """``wheelforge ARGS`` in this process, in ``cwd`` when given, with ``env``'s variables
    set (``None``: unset) for the call."""
    argv = ["wheelforge", *map(str, args)]
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGALRM)}
    runner = CliRunner()
    with runner.isolation(env=env) as (out, err, _), warnings.catch_warnings(), \
            contextlib.chdir(cwd or Path.cwd()):
        saved_argv, sys.argv = sys.argv, argv
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.argv = saved_argv
            for s, handler in handlers.items():
                signal.signal(s, handler)
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    return Ran(returncode=code, stdout=stdout, stderr=stderr)
