"""Who may change a managed build environment, and when.

A build uses its managed environment from its build environment step to its verify: its
setup.py and its import check import torch (and torch numpy) from it.  A second wheelforge
process that installs a missing requirement into the same environment meanwhile
(``wheelforge build mamba-ssm`` started beside ``wheelforge build causal-conv1d``) changes
files under those imports: a half-written numpy fails the other build's ``import torch``.

So each environment has a use lock (``envs/<key>.use``): a build holds it shared while it
uses the environment (:class:`Hold`), and a change (creating the environment again,
installing into it) needs it exclusive (:func:`changing`), which it gets only once no
other process uses the environment.  The builds of one process share one open file of the
lock (flock's locks belong to the open file), so they never wait for each other: one
command installs every build's requirements before any of them compiles
(``BuildConfig.shared_requirements``), and a build that waited for a companion's build in
its own process could wait forever.  Both are taken only under the environment's creation
lock (``envs/<key>.lock``), so a process that turns its shared hold into an exclusive one
and back is never overtaken, and a shared hold asked for there is granted at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path

from ..._fs import HOLDER_MAX, locked, open_lock, printable

__all__ = ["Hold", "changing", "others"]


class _Open:
    """This process's open file of one use lock, held shared while ``users`` > 0."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.users = 0


_OPEN: dict[str, _Open] = {}
_GUARD = threading.Lock()


def _open(path: Path) -> int:
    return open_lock(path)[0]  # never through a link (_fs.open_lock)


def _enter(path: Path) -> None:
    key = os.path.abspath(path)
    with _GUARD:
        held = _OPEN.get(key)
        if held is None:
            fd = _open(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
            except BaseException:
                os.close(fd)
                raise
            held = _OPEN[key] = _Open(fd)
        held.users += 1


def _leave(path: Path) -> None:
    key = os.path.abspath(path)
    with _GUARD:
        held = _OPEN[key]
        held.users -= 1
        if held.users == 0:
            del _OPEN[key]
            fcntl.flock(held.fd, fcntl.LOCK_UN)
            os.close(held.fd)


class Hold:
    """One build's hold on its managed environment's use lock: none until
    :meth:`take`, released when the build's exit stack closes it, and let go while the
    build waits for another build (:meth:`paused`).  Owns a lock, hence a class."""

    def __init__(self) -> None:
        self._use: Path | None = None
        self._lock: Path | None = None

    def take(self, lock: Path, use: Path) -> None:
        """Hold ``use`` shared, with the environment's creation lock ``lock`` held (so
        it is granted at once)."""
        self.release()
        _enter(use)
        self._use, self._lock = use, lock

    def release(self) -> None:
        if self._use is not None:
            _leave(self._use)
            self._use = None

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Let the environment go while the body waits (for a companion's build: a
        change that another process waits to make might be what that build waits for),
        and take it again after."""
        if self._use is None or self._lock is None:
            yield
            return
        use, lock = self._use, self._lock
        self.release()
        try:
            yield
        finally:
            with locked(lock):
                self.take(lock, use)


@contextlib.contextmanager
def changing(path: Path) -> Iterator[bool]:
    """With the environment's creation lock held: yield True with the use lock ``path``
    exclusive when no other process holds it (this process's own holds do not count), or
    False at once when another does; this process's shared hold is kept either way."""
    key = os.path.abspath(path)
    with _GUARD:
        held = _OPEN.get(key)
        if held is None:
            held = _OPEN[key] = _Open(_open(path))
        held.users += 1  # its file stays open while this runs
        try:
            fcntl.flock(held.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free = True
        except BlockingIOError:
            free = False
    try:
        yield free
    finally:
        with _GUARD:
            held.users -= 1
            if held.users == 0:
                del _OPEN[key]
                fcntl.flock(held.fd, fcntl.LOCK_UN)
                os.close(held.fd)
            else:  # back to this process's builds' shared hold (a failed conversion can
                fcntl.flock(held.fd, fcntl.LOCK_SH)  # have dropped it: flock(2))


def others(path: Path) -> list[str]:
    """The other processes that hold the lock ``path``, as "pid N (command)", read from
    /proc/locks (Linux); [] when that cannot be read."""
    try:
        inode = os.stat(path).st_ino
        table = Path("/proc/locks").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    pids = set()
    for line in table.splitlines():
        # "3: FLOCK  ADVISORY  READ  4242 00:2f:1234 0 EOF" ("->" after the number: waiting)
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4].isdigit() \
                and fields[5].rsplit(":", 1)[-1] == str(inode):
            pids.add(int(fields[4]))
    pids.discard(os.getpid())
    return [f"pid {pid} ({_command(pid)})" for pid in sorted(pids)]


def _command(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "ended"
    argv = [a for a in argv if a]
    at = next((i for i, a in enumerate(argv) if a == "wheelforge" or a.endswith("/wheelforge")),
              None)
    shown = ["wheelforge", *argv[at + 1:]] if at is not None else argv
    return printable(shlex.join(shown))[:HOLDER_MAX] or "unknown"  # the whole command
