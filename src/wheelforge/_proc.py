"""The one subprocess helper.

argv lists only (never a shell line), the command echoed to the log, output
streamed line by line to an optional callback and to the log file, and the
tail kept for error messages.  Children run in their own process group so an
interrupt can stop the whole tree (nvcc, cicc, ptxas, ninja).
"""

from __future__ import annotations

import collections
import contextlib
import os
import shlex
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

TAIL_LINES = 40


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    output: str


class CommandFailed(Exception):
    """A command exited non-zero (or could not start)."""

    def __init__(self, argv: Sequence[str], returncode: int, tail: str):
        super().__init__(f"{shlex.join(argv)} exited with {returncode}")
        self.argv = tuple(argv)
        self.returncode = returncode
        self.tail = tail


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    on_line: Callable[[str], None] | None = None,
    check: bool = True,
    keep_output: bool = True,
    timeout: float | None = None,
) -> Completed:
    """Run ``argv``; return its exit status and (if ``keep_output``) its output.

    stdout and stderr are merged.  With ``log`` the command line and every
    output line are appended to that file.  Raises :class:`CommandFailed`
    when ``check`` and the exit status is non-zero.
    """
    args = [os.fspath(a) for a in argv]
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    kept: list[str] = []
    log_file: IO[str] | None = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
        log_file.write(f"$ {shlex.join(args)}\n")
        log_file.flush()
    try:
        try:
            proc = subprocess.Popen(
                args,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                start_new_session=True,
            )
        except OSError as exc:
            if check:
                raise CommandFailed(args, 127, f"cannot run {args[0]}: {exc}") from exc
            return Completed(tuple(args), 127, str(exc))
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                tail.append(line)
                if keep_output:
                    kept.append(line)
                if log_file is not None:
                    log_file.write(line)
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            returncode = proc.wait(timeout=timeout)
        except BaseException:
            _kill_group(proc)
            raise
    finally:
        if log_file is not None:
            log_file.close()
    if check and returncode != 0:
        raise CommandFailed(args, returncode, "".join(tail))
    return Completed(tuple(args), returncode, "".join(kept))


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Stop the child's whole process group: TERM, then KILL after 5 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
