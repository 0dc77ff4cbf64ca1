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
import time
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


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children first found first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal_all(pgid: int, pids: list[int], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for pid in pids:  # ninja starts each job in a process group of its own
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Stop the child and everything below it: TERM, then KILL after 5 s.

    The tree is collected before any signal, since orphans are re-parented.
    """
    tree = descendants(proc.pid)
    _signal_all(proc.pid, tree, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if proc.poll() is not None and not any(_alive(p) for p in tree):
            return
        time.sleep(0.1)
    _signal_all(proc.pid, tree + descendants(proc.pid), signal.SIGKILL)
    proc.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
