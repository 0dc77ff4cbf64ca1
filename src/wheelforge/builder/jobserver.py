"""One pool of compile slots for every build of a command (a GNU make jobserver).

A command that builds several recipes at once (``wheelforge build A B``, a recipe and
its companions) compiles them within one budget: the command's ``MAX_JOBS`` slots.  The
pool is a jobserver in GNU make's fifo style: a named pipe holding one byte per free
slot, announced to the compiles in ``MAKEFLAGS=--jobserver-auth=fifo:PATH``.

* A ninja that watches the pipe takes a byte for every job beyond its first and gives
  it back when the job ends, so a build whose tail runs one long unit leaves the other
  slots to the builds beside it.  torch's extension builder passes ``-j MAX_JOBS``,
  which turns ninja's jobserver client off; a ``ninja`` placed before the environment's
  on PATH drops that option and runs the environment's own.
* Every compile takes one slot before it starts (ninja's first job runs on it), so the
  jobs running at once never exceed the pool.
* Otherwise a compile takes all its ``MAX_JOBS`` slots before it starts and passes
  ``-j`` as before: a build that must not take more (memory per job, set or recorded),
  and, today, every build.  ninja 1.13 is a jobserver client, but a passive one: it
  asks the pipe for slots when it starts and when one of its own jobs ends, never while
  it waits.  A compile started while another held every slot ran on one job until its
  first unit ended: on 16 cores mamba-ssm beside causal-conv1d compiled in 3m12s
  against 1m41s alone (docs/performance.md).  ninja's main branch also waits on the
  pipe (``WaitForCommandOrJobserverToken``); :data:`NINJA_SHARES` names the first
  release that will share, and is raised when one does.

The slots a compile takes whole are given back when it ends, killed or not; slots a
sharing ninja held when it was killed are lost to the pool, which lives only as long as
the command, in a directory of its own.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .. import _proc

#: The first ninja that is a jobserver client (ninja-build/ninja, 1.13.0).
NINJA_JOBSERVER = Version("1.13")
#: The first ninja whose client shares well (it waits on the pipe, not only on its own
#: jobs): none is released yet (1.13.2 is the newest), so no compile shares today.
NINJA_SHARES = Version("1.14")

#: Runs the environment's ninja without -j N, so that it takes its jobs from MAKEFLAGS.
_NINJA_SHIM = """#!/bin/sh
# wheelforge: ninja as a client of this command's jobserver (MAKEFLAGS); -j N would
# turn the client off, so it is dropped.
skip=
for arg do
  shift
  if [ -n "$skip" ]; then skip=; continue; fi
  case $arg in
    -j) skip=1; continue ;;
    -j*) continue ;;
  esac
  set -- "$@" "$arg"
done
exec {ninja} "$@"
"""


def ninja_joins(distributions: Mapping[str, str], at_least: Version = NINJA_SHARES) -> bool:
    """Whether the environment's ninja (its ``ninja`` distribution) is at least
    ``at_least``: by default, one that shares the pool well."""
    found = distributions.get("ninja")
    if found is None:
        return False
    try:
        return Version(found).release[:2] >= at_least.release
    except InvalidVersion:
        return False


class Pool:
    """``size`` compile slots shared by the builds of one command (the jobserver's
    owner).  Holds a pipe and a directory, hence a class; use as a context manager."""

    def __init__(self, size: int, directory: Path | None = None) -> None:
        self.size = max(1, size)
        self._dir = Path(tempfile.mkdtemp(prefix="wheelforge-jobs-", dir=directory))
        self.fifo = self._dir / "fifo"
        os.mkfifo(self.fifo, 0o600)
        # read and write ends in one: the pipe never sees end-of-file while we live
        self._fd = os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK)
        os.write(self._fd, b"+" * self.size)
        self._reserve = threading.Lock()  # one build takes several slots at a time

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        shutil.rmtree(self._dir, ignore_errors=True)

    def environ(self) -> dict[str, str]:
        """What a compile's environment says for ninja to join the pool."""
        return {"MAKEFLAGS": f"-j{self.size} --jobserver-auth=fifo:{self.fifo}"}

    def shim(self, ninja: Path) -> Path:
        """A directory with a ``ninja`` that runs ``ninja`` without ``-j``."""
        bin_dir = self._dir / f"bin-{abs(hash(ninja)):x}"
        script = bin_dir / "ninja"
        if not script.exists():
            bin_dir.mkdir(exist_ok=True)
            tmp = bin_dir / ".ninja.tmp"
            tmp.write_text(_NINJA_SHIM.format(ninja=_sh_quote(str(ninja))))
            tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR)
            tmp.replace(script)
        return bin_dir

    def _take(self) -> bytes:
        """One slot: a byte from the pipe, waiting for one (interruptible by
        _proc.stop_all)."""
        while True:
            if _proc.stopping():
                raise KeyboardInterrupt
            try:
                token = os.read(self._fd, 1)
                if token:
                    return token
            except BlockingIOError:
                pass
            select.select([self._fd], [], [], 0.5)

    def _give(self, tokens: bytes) -> None:
        if tokens:
            os.write(self._fd, tokens)

    @contextlib.contextmanager
    def slots(self, count: int) -> Iterator[int]:
        """Hold ``count`` slots (at most the pool's) for a compile; yield how many."""
        count = max(1, min(count, self.size))
        held = b""
        try:
            with self._reserve:  # two builds taking slots one by one never deadlock
                while len(held) < count:
                    held += self._take()
            yield count
        finally:
            self._give(held)

    def free(self) -> int:
        """Slots nobody holds now (for tests and progress)."""
        n = 0
        taken = b""
        try:
            while True:
                byte = os.read(self._fd, 1)
                if not byte:
                    break
                taken += byte
                n += 1
        except BlockingIOError:
            pass
        finally:
            self._give(taken)
        return n


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
