"""The one subprocess helper.

argv lists only (never a shell line), the command echoed to the log, output
streamed line by line to an optional callback and to the log file, and the
tail kept for error messages.  Children run in their own process group so an
interrupt can stop the whole tree (nvcc, cicc, ptxas, ninja).

Every child is also the leader of a session of its own, and the session is
registered with a watchdog: a small process that wheelforge starts once and
talks to through a pipe.  When wheelforge dies, even by SIGKILL (which no
handler sees), the pipe reaches end-of-file and the watchdog kills every
process still in a registered session.  A session survives re-parenting and
the process groups that ninja gives its jobs, so the backend, ninja, nvcc,
cicc and ptxas all die with wheelforge; only a process that leaves the session
itself (setsid, as daemons do) escapes.

Commands started from other threads (several builds at once) are stopped with
:func:`stop_all` when the main thread is interrupted: every running child tree is
killed, and :func:`run` raises KeyboardInterrupt in those threads, then and for any
command they would start after.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

TAIL_LINES = 40

_STOPPING = threading.Event()
_RUNNING: set[subprocess.Popen[str]] = set()
_RUNNING_LOCK = threading.Lock()


def stopping() -> bool:
    """Whether :func:`stop_all` has been called (and not yet :func:`resume`)."""
    return _STOPPING.is_set()


def stop_all() -> None:
    """Stop every command running in any thread; later :func:`run` calls raise
    KeyboardInterrupt at once, until :func:`resume`."""
    _STOPPING.set()
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        _kill_group(proc)


def pause(seconds: float) -> None:
    """Sleep ``seconds``; KeyboardInterrupt at once when :func:`stop_all` is called (or
    was already)."""
    if _STOPPING.wait(seconds):
        raise KeyboardInterrupt


def resume() -> None:
    """Commands may run again (the builds :func:`stop_all` stopped have ended)."""
    _STOPPING.clear()


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    output: str


def marked(output: str, mark: str) -> Any:
    """The JSON value on the last line of ``output`` that starts with ``mark``: a child
    interpreter's answer among whatever else it printed (warnings, a library's chatter).
    None when no line starts with ``mark`` or that line's rest is not JSON."""
    for line in reversed(output.splitlines()):
        if line.startswith(mark):
            try:
                return json.loads(line[len(mark):])
            except ValueError:
                return None
    return None


def signal_name(returncode: int) -> str | None:
    """The name of the signal that killed a process (``SIGSEGV`` for -11: subprocess's
    return code), or None: it exited, or the number names no signal."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return None


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
    stdin: Path | None = None,
) -> Completed:
    """Run ``argv``; return its exit status and (if ``keep_output``) its output.

    stdout and stderr are merged.  With ``log`` the command line and every
    output line are appended to that file.  ``stdin``: a file the command reads as its
    input (default: none, /dev/null).  Raises :class:`CommandFailed`
    when ``check`` and the exit status is non-zero.
    """
    args = [os.fspath(a) for a in argv]
    if _STOPPING.is_set():
        raise KeyboardInterrupt
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    kept: list[str] = []
    log_file: IO[str] | None = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
        log_file.write(f"$ {shlex.join(args)}\n")
        log_file.flush()
    source = open(stdin, "rb") if stdin is not None else None  # noqa: SIM115
    try:
        try:
            proc = subprocess.Popen(
                args,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=source if source is not None else subprocess.DEVNULL,
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
        _WATCHDOG.watch(proc.pid)
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        reading = threading.Event()
        threading.Thread(target=_end_orphans, args=(proc, reading), daemon=True).start()
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
            reading.set()
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
            _WATCHDOG.forget(proc.pid)
    finally:
        if log_file is not None:
            log_file.close()
        if source is not None:
            source.close()
    if _STOPPING.is_set():  # killed by stop_all: stopped, not failed
        raise KeyboardInterrupt
    name = signal_name(returncode)
    if name:  # killed by a signal: say so as a shell would (137 for SIGKILL)
        tail.append(f"{os.path.basename(args[0])} was killed by {name} "
                    f"(exit status {128 - returncode})\n")
    if check and returncode != 0:
        raise CommandFailed(args, returncode, "".join(tail))
    return Completed(tuple(args), returncode, "".join(kept))


#: How long the processes a command left behind may hold its output once it has ended.
ORPHAN_GRACE_S = 5.0


def _end_orphans(proc: subprocess.Popen[str], reading: threading.Event) -> None:
    """Once ``proc`` has ended, kill what is left of its session after
    :data:`ORPHAN_GRACE_S` if its output is still being read: processes it left behind
    (a ninja and its compilers when the kernel's OOM killer took the build backend)
    would otherwise hold the pipe, and the command, for as long as they run."""
    while proc.poll() is None:
        if reading.wait(0.2):
            return
    if reading.wait(ORPHAN_GRACE_S):
        return
    for pid in _session_members(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _session_members(sid: int) -> list[int]:
    """The live processes of session ``sid`` (from /proc)."""
    return [pid for pid, fields in _processes() if fields[0] != "Z" and int(fields[3]) == sid]


def _processes() -> Iterator[tuple[int, list[str]]]:
    """Every process's pid and the fields of its /proc/PID/stat after the command name
    (state, ppid, pgrp, session, ...)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        yield int(entry), fields


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children first found first."""
    children: dict[int, list[int]] = {}
    for child, fields in _processes():
        children.setdefault(int(fields[1]), []).append(child)
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


# --------------------------------------------------------------------------- the watchdog

_WATCHDOG_CODE = r"""
import os, signal, sys, time

def members(sessions):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z" and int(fields[3]) in sessions:
                found.append(int(entry))
    return found

signal.signal(signal.SIGINT, signal.SIG_IGN)
sessions = set()
for line in sys.stdin:  # +SID when a child starts, -SID when it is done; EOF: wheelforge is gone
    sid = int(line[1:])
    if line[0] == "+":
        sessions.add(sid)
    else:
        sessions.discard(sid)
for _ in range(250):  # at most 5 s
    pids = members(sessions)
    if not pids:
        break
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.02)
"""


class _Watchdog:
    """The process that kills this process's children's sessions when this process dies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = 0

    def _send(self, line: str) -> None:
        with self._lock:
            for _ in range(2):  # once more with a fresh watchdog if the old one is gone
                if self._proc is None or self._owner != os.getpid() or (
                        self._proc.poll() is not None):
                    self._start()
                assert self._proc is not None and self._proc.stdin is not None
                try:
                    self._proc.stdin.write(line.encode())
                    self._proc.stdin.flush()
                    return
                except OSError:
                    self._proc = None

    def _start(self) -> None:
        # its own session: a Ctrl-C at the terminal or a kill of wheelforge's process
        # group does not reach it; it ends when its stdin does
        self._proc = subprocess.Popen(
            [sys.executable, "-S", "-I", "-c", _WATCHDOG_CODE], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._owner = os.getpid()

    def watch(self, sid: int) -> None:
        self._send(f"+{sid}\n")

    def forget(self, sid: int) -> None:
        if self._proc is not None and self._owner == os.getpid():
            self._send(f"-{sid}\n")


_WATCHDOG = _Watchdog()
