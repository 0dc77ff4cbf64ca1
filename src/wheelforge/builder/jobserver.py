"""One pool of compile slots for every build of a command, taken one unit at a time.

A command that builds several recipes at once (``wheelforge build A B``, a recipe and
its companions, the cells of a nightly) compiles them within one budget: the command's
``MAX_JOBS x NVCC_THREADS`` slots.

* **The pool** is a GNU make jobserver in fifo style: a named pipe holding one byte per
  free slot, in a directory of its own that lives as long as the command.
* **Gates.**  torch's extension builder runs every nvcc of its ninja file as
  ``$PYTORCH_NVCC``.  A build puts the pool's gate in front of it (:meth:`Pool.gate`):
  before each unit's nvcc starts, the gate takes that unit's slots (its nvcc threads)
  from the pipe, waiting for them if it must, and gives them back when nvcc ends.  The
  build's ninja keeps torch's ``-j MAX_JOBS``, its own bound (memory); the pool bounds
  the command.  A slot goes to a waiting unit of any build the moment another unit ends:
  the gates wait in the pipe, and the kernel hands a byte to the reader that began to
  wait first.  (ninja 1.13's own jobserver client reads its pipe only when it starts and
  when one of its jobs ends, never while it waits; a compile started while another held
  every slot ran one unit at a time: docs/performance.md.)  A gate that takes more than
  one slot takes them under the pool's lock, so no two gates each hold part of what
  they need.
* **Whole.**  A compile without ninja in its environment (setuptools then runs nvcc
  itself, not through ``$PYTORCH_NVCC``) takes all its slots before it starts
  (:meth:`Pool.slots`), as the same lock's holder.
* **Slots of killed gates.**  A gate holding slots leaves a file named by its process
  id; a gate killed with SIGKILL cannot give them back, and :meth:`Pool.reclaim` (after
  each compile) puts back the slots of gates that are gone.

Host C++ units (``$cxx`` in the ninja file, one or two per recipe here) are not gated:
they run within their build's ``MAX_JOBS``.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import select
import shlex
import shutil
import sys
import tempfile
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .. import _proc

#: How often a whole compile that waits for its slots looks again, in seconds.
TICK_S = 0.2

#: The gate, run as ``python -I -S gate POOL_DIR SLOTS COMMAND...`` (stdlib only).
_GATE = '''\
"""wheelforge: a compile unit's slots from the command's pool (builder/jobserver.py)."""
import fcntl, os, signal, sys

pool, count, command = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
pipe = os.open(os.path.join(pool, "slots"), os.O_RDWR)
got = b""
child = 0


def forward(signum, _frame):
    if child:
        os.kill(child, signum)
    else:  # still waiting for slots: give back those taken, and end as killed by it
        if got:
            os.write(pipe, got)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, forward)
lock = os.open(os.path.join(pool, "lock"), os.O_RDWR) if count > 1 else None
if lock is not None:
    fcntl.flock(lock, fcntl.LOCK_EX)
while len(got) < count:
    got += os.read(pipe, count - len(got))
if lock is not None:
    os.close(lock)
held = os.path.join(pool, "held", "%d.%d" % (os.getpid(), count))
open(held, "w").close()
try:
    try:
        child = os.posix_spawnp(command[0], command, os.environ)
    except OSError as exc:
        sys.stderr.write("wheelforge gate: cannot run %s: %s\\n" % (command[0], exc))
        status = 127 << 8
    else:
        status = os.waitpid(child, 0)[1]
finally:
    os.write(pipe, got)
    os.unlink(held)
if os.WIFSIGNALED(status):
    sys.exit(128 + os.WTERMSIG(status))
sys.exit(os.WEXITSTATUS(status))
'''


class Pool:
    """``size`` compile slots shared by the builds of one command.  Holds a directory
    and an open pipe, hence a class; use as a context manager."""

    def __init__(self, size: int, directory: Path | None = None) -> None:
        self.size = max(1, size)
        self._dir = Path(tempfile.mkdtemp(prefix="wheelforge-jobs-", dir=directory))
        (self._dir / "held").mkdir()
        (self._dir / "lock").touch()
        self._gate = self._dir / "gate.py"
        self._gate.write_text(_GATE)
        os.mkfifo(self._dir / "slots", 0o600)
        # read and write ends in one: the pipe never sees end-of-file while we live
        self._fd = os.open(self._dir / "slots", os.O_RDWR | os.O_NONBLOCK)
        os.write(self._fd, b"+" * self.size)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        shutil.rmtree(self._dir, ignore_errors=True)

    def free(self) -> int:
        """Slots in the pipe: in no unit's and no compile's hands."""
        buf = array.array("i", [0])
        fcntl.ioctl(self._fd, termios.FIONREAD, buf)
        return int(buf[0])

    def gate(self, command: str, threads: int = 1) -> str:
        """``command`` (shell words: an nvcc, or a compile cache and nvcc) behind the
        pool's gate, which takes ``threads`` slots for each unit it compiles."""
        count = max(1, min(threads, self.size))
        return " ".join([shlex.quote(sys.executable), "-I", "-S",
                         shlex.quote(str(self._gate)), shlex.quote(str(self._dir)),
                         str(count), command])

    def reclaim(self) -> int:
        """Put back the slots of gates that are gone without giving them back (killed);
        how many."""
        back = 0
        for held in (self._dir / "held").iterdir():
            pid, _, count = held.name.partition(".")
            if _alive(int(pid)):
                continue
            with contextlib.suppress(FileNotFoundError):
                held.unlink()  # gone: nobody else removes it now
                os.write(self._fd, b"+" * int(count))
                back += int(count)
        return back

    @contextlib.contextmanager
    def slots(self, count: int, on_wait: Callable[[], None] | None = None) -> Iterator[int]:
        """Hold ``count`` slots (at most the pool's) for a whole compile; yield how
        many.  ``on_wait`` hears it once if they are not free; Ctrl-C stops the wait."""
        count = max(1, min(count, self.size))
        got = 0
        lock = os.open(self._dir / "lock", os.O_RDWR)
        try:
            while True:  # the lock first: no gate of many slots holds part of ours
                with contextlib.suppress(BlockingIOError):
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                _waited(on_wait)
                on_wait = None
                time.sleep(TICK_S)
            while got < count:
                with contextlib.suppress(BlockingIOError):
                    got += len(os.read(self._fd, count - got))
                if got < count:
                    _waited(on_wait)
                    on_wait = None
                    select.select([self._fd], [], [], TICK_S)
        except BaseException:
            if got:
                os.write(self._fd, b"+" * got)
            raise
        finally:
            os.close(lock)
        try:
            yield count
        finally:
            os.write(self._fd, b"+" * count)


def _waited(on_wait: Callable[[], None] | None) -> None:
    """One turn of a wait: Ctrl-C stops it; ``on_wait`` (the first turn's) hears it."""
    if _proc.stopping():
        raise KeyboardInterrupt
    if on_wait is not None:
        on_wait()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")
