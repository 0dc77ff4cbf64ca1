"""The one subprocess helper.

argv lists only (never a shell line), the command echoed to the log, output
streamed line by line to an optional callback and to the log file, and the
tail kept for error messages.  Children run in their own process group so an
interrupt can stop the whole tree (nvcc, cicc, ptxas, ninja).  A timeout holds while the
command runs, whether it writes, stays silent or closes its output: the output is read
with select() against the deadline, never by a blocking read.  Process trees are
psutil's (children, session members, a pid checked before it is signalled).

Every child is also the leader of a session of its own, and the session is
registered with a watchdog (:mod:`wheelforge._watchdog`, run by its file path): a small
process that wheelforge starts once and talks to through a pipe.  When wheelforge dies,
even by SIGKILL (which no handler sees), the pipe reaches end-of-file and the watchdog
kills every process still in a registered session.  A session survives re-parenting and
the process groups that ninja gives its jobs, so the backend, ninja, nvcc,
cicc and ptxas all die with wheelforge; only a process that leaves the session
itself (setsid, as daemons do) escapes.

Commands started from other threads (several builds at once) are stopped with
:func:`stop_all` when the main thread is interrupted: every running child tree is
killed, and :func:`run` raises KeyboardInterrupt in those threads, then and for any
command they would start after.
"""

from __future__ import annotations

import codecs
import collections
import contextlib
import io
import json
import math
import os
import selectors
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil

from . import _watchdog
from .errors import INTERRUPT_EXIT_CODES, WheelforgeError

TAIL_LINES = 40

_STOPPING = threading.Event()
_RUNNING: set[subprocess.Popen[bytes]] = set()
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
    timed_out: bool = False  # stopped at its timeout (returncode 124)


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


#: The exit status :func:`run` gives a command it stopped at its timeout (timeout(1)'s).
TIMED_OUT = INTERRUPT_EXIT_CODES["timeout"]


class CommandTimedOut(CommandFailed, WheelforgeError):
    """A command ran past its timeout and was stopped, with everything it started.

    A :class:`CommandFailed` (callers that handle a failed command handle this one) and a
    :class:`WheelforgeError` (one that reaches the command line is a message, exit 124)."""

    exit_code = TIMED_OUT
    label = "timed out"

    def __init__(self, argv: Sequence[str], timeout: float, tail: str):
        CommandFailed.__init__(self, argv, TIMED_OUT, tail)
        self.args = (f"{shlex.join(argv)} timed out",)
        self.what = f"{shlex.join(argv)[:300]} did not finish"
        self.why = timed_out_note(argv, timeout).rstrip("\n")
        self.fix = TIMEOUT_FIX
        self.log = None
        self.timeout = timeout


TIMEOUT_FIX = ("run the command by hand to see what it waits for (a stalled download, a lock "
               "another process holds, a module that blocks at import), then try again")


def timed_out_note(argv: Sequence[str], timeout: float) -> str:
    """The line :func:`run` adds to a stopped command's output."""
    return (f"{os.path.basename(argv[0])} timed out after {timeout:g} s: stopped with every "
            f"process it started (SIGTERM, SIGKILL {TIMEOUT_GRACE_S:g} s later)\n")


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

    ``timeout`` (seconds) holds while the command runs, whether or not it writes or closes
    its output: then its process group and session are stopped (SIGTERM, SIGKILL
    :data:`TIMEOUT_GRACE_S` later) and reaped, and :class:`CommandTimedOut` is raised; with
    ``check=False`` the result has ``timed_out`` set, exit status 124, and the output read
    so far ends with a line that says so.
    """
    args = [os.fspath(a) for a in argv]
    if _STOPPING.is_set():
        raise KeyboardInterrupt
    if timeout is not None and not math.isfinite(timeout):  # inf (or NaN): no limit
        timeout = None
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    kept: list[str] = []
    log_file: IO[str] | None = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
        log_file.write(f"$ {shlex.join(args)}\n")
        log_file.flush()

    def take(line: str) -> None:
        tail.append(line)
        if keep_output:
            kept.append(line)
        if log_file is not None:
            log_file.write(line)
        if on_line is not None:
            on_line(line.rstrip("\n"))

    source = open(stdin, "rb") if stdin is not None else None  # noqa: SIM115
    try:
        try:
            proc = subprocess.Popen(
                args, cwd=cwd, env=dict(env) if env is not None else None,
                stdin=source if source is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            if check:
                raise CommandFailed(args, 127, f"cannot run {args[0]}: {exc}") from exc
            return Completed(tuple(args), 127, str(exc))
        returncode = _supervise(proc, take, timeout)
        if returncode is None and timeout is not None and not _STOPPING.is_set():
            take(timed_out_note(args, timeout))  # the log says so too
    finally:
        if log_file is not None:
            log_file.close()
        if source is not None:
            source.close()
    if _STOPPING.is_set():  # killed by stop_all: stopped, not failed
        raise KeyboardInterrupt
    if returncode is None:
        assert timeout is not None
        if check:
            raise CommandTimedOut(args, timeout, "".join(tail))
        return Completed(tuple(args), TIMED_OUT, "".join(kept), timed_out=True)
    name = signal_name(returncode)
    if name:  # killed by a signal: say so as a shell would (137 for SIGKILL)
        tail.append(f"{os.path.basename(args[0])} was killed by {name} "
                    f"(exit status {128 - returncode})\n")
    if check and returncode != 0:
        raise CommandFailed(args, returncode, "".join(tail))
    return Completed(tuple(args), returncode, "".join(kept))


def _supervise(proc: subprocess.Popen[bytes], take: Callable[[str], None],
               timeout: float | None) -> int | None:
    """Feed ``proc``'s output to ``take`` line by line until it has ended; its exit status,
    or None when it ran past ``timeout`` and was stopped (reaped, its processes gone)."""
    _WATCHDOG.watch(proc.pid)
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    try:
        finished = _pump(proc, take, None if timeout is None else
                         time.monotonic() + timeout)
        if not finished:
            _kill_group(proc, TIMEOUT_GRACE_S)
            return None
        return proc.wait()
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)
        _WATCHDOG.forget(proc.pid)


#: How long the processes a command left behind may hold its output once it has ended.
ORPHAN_GRACE_S = 5.0
#: Between SIGTERM and SIGKILL for a command stopped at its timeout.
TIMEOUT_GRACE_S = 2.0
#: Between SIGTERM and SIGKILL for commands stopped by an interrupt.
INTERRUPT_GRACE_S = 5.0


def _pump(proc: subprocess.Popen[bytes], take: Callable[[str], None],
          deadline: float | None) -> bool:
    """Read ``proc``'s output (decoded as text mode would: UTF-8, bad bytes replaced,
    universal newlines) and hand each line to ``take``, until the output ends and ``proc``
    has ended: True; False at ``deadline``.

    The output may end long after ``proc`` does, or never: processes it left behind (a
    ninja and its compilers when the kernel's OOM killer took the build backend) would hold
    the pipe, and the command, for as long as they run.  They are killed after
    :data:`ORPHAN_GRACE_S`, and the output is left one second after that."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    decoder = io.IncrementalNewlineDecoder(
        codecs.getincrementaldecoder("utf-8")(errors="replace"), translate=True)
    pending, ended, orphans_killed = "", None, False
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if ended is None and proc.poll() is not None:
                ended = now
            if deadline is not None and now >= deadline:
                if ended is None:
                    return False
                # it ended in time: what it left behind holds the output
                _signal_all(proc.pid, _session_members(proc.pid), signal.SIGKILL)
                break
            if ended is not None and now - ended >= ORPHAN_GRACE_S:
                if orphans_killed:
                    break  # held by a process outside the session: stop reading
                orphans_killed = True
                ended = now - ORPHAN_GRACE_S + 1.0
                _signal_all(proc.pid, _session_members(proc.pid), signal.SIGKILL)
            wait = 0.2 if deadline is None else max(0.0, min(0.2, deadline - now))
            if not sel.select(wait):
                continue
            data = os.read(fd, 1 << 16)
            pending += decoder.decode(data, final=not data)
            *lines, pending = pending.split("\n")
            for line in lines:
                take(line + "\n")
            if not data:
                break
    if pending:
        take(pending)
    if deadline is None:
        return True
    return _wait_until(proc, deadline)


def _wait_until(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


def _session_members(sid: int) -> list[psutil.Process]:
    """The live processes of session ``sid``."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getsid(proc.pid) == sid and _alive(proc):
                found.append(proc)
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, children first found first."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _tree(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The processes below ``proc`` and the rest of its session, ``proc`` itself left out:
    ninja starts each job in a process group of its own, and orphans are re-parented."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        found.update((p.pid, p) for p in psutil.Process(proc.pid).children(recursive=True))
    found.update((p.pid, p) for p in _session_members(proc.pid))
    found.pop(proc.pid, None)
    return list(found.values())


def _signal_all(pgid: int, procs: list[psutil.Process], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for proc in procs:  # psutil checks that the pid is still the process it was
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def _kill_group(proc: subprocess.Popen[bytes], grace: float = INTERRUPT_GRACE_S) -> None:
    """Stop the child and everything below it and in its session: TERM, then KILL after
    ``grace`` seconds; the child is reaped.

    The tree is collected before any signal, since orphans are re-parented.
    """
    tree = _tree(proc)
    _signal_all(proc.pid, tree, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.poll() is not None and not any(_alive(p) for p in tree):
            return
        time.sleep(0.05)
    _signal_all(proc.pid, tree + _tree(proc), signal.SIGKILL)
    proc.wait()
    psutil.wait_procs([p for p in tree if _alive(p)], timeout=1)


def _alive(proc: psutil.Process) -> bool:
    """Running, and not a zombie (whose parent has not reaped it yet)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# --------------------------------------------------------------------------- the watchdog

#: The watchdog program, run by its file path (only the standard library: ``-S -I``).
WATCHDOG = os.path.abspath(_watchdog.__file__)


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
            [sys.executable, "-S", "-I", WATCHDOG], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._owner = os.getpid()

    def watch(self, sid: int) -> None:
        self._send(f"+{sid}\n")

    def forget(self, sid: int) -> None:
        if self._proc is not None and self._owner == os.getpid():
            self._send(f"-{sid}\n")


_WATCHDOG = _Watchdog()
