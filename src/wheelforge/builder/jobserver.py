"""One pool of compile slots for every build of a command (GNU make jobservers).

A command that builds several recipes at once (``wheelforge build A B``, a recipe and
its companions) compiles them within one budget: the command's ``MAX_JOBS`` slots.

* **Lanes.**  Each compile whose ninja is a jobserver client (ninja 1.13+, one nvcc
  thread a job) gets a lane: a GNU make jobserver of its own, in fifo style (a named
  pipe holding one byte per slot it may take, announced in
  ``MAKEFLAGS=--jobserver-auth=fifo:PATH``).  The lane's first job runs on a slot taken
  from the pool when the lane opens (ninja's implicit slot); every further job takes a
  byte from the lane and gives it back when it ends.  torch's extension builder passes
  ``-j MAX_JOBS``, which turns ninja's client off; a ``ninja`` placed before the
  environment's on PATH drops that option and runs the environment's own.
* **The pool moves slots between lanes** (a thread, every :data:`TICK_S`).  ninja 1.13's
  client is passive: it reads its pipe when it starts and when one of its own jobs ends,
  never while it waits.  One pipe for all (how make shares) starved a compile that
  started while another held every slot: it ran one job until its first unit ended
  (mamba-ssm beside causal-conv1d on 16 cores: 3m12s against 1m41s alone,
  docs/performance.md).  So each lane is filled before its ninja starts, with an equal
  share of the pool (:func:`split`), which ninja takes at once (a lane waits until its
  share is free, rather than start on fewer slots); the share of a build
  the command still expects to compile (:meth:`Pool.expect`) is held for it for up to
  :data:`RESERVE_S`.  Slots still in a lane's pipe :data:`GRAB_S` after its ninja
  started (the shim touches a file) are more than it has jobs for, and go; so does a
  slot given back by a lane whose ninja has no unstarted job left (its progress line
  ``[done/total]`` against the jobs it runs).  The pool gives them to the lanes that
  still have work, whose ninja picks them up when its next job ends.  So the tail of
  one compile, its longest units running alone, is filled by the others.
* **Whole.**  Any other compile (nvcc threads > 1, or a ninja without the client) takes
  all its ``MAX_JOBS x NVCC_THREADS`` slots before it starts and passes ``-j`` as before.

The pool counts its free slots in memory; the lanes' pipes are the only bytes.  Slots a
ninja held when it was killed are lost to the pool, which lives only as long as the
command, in a directory of its own.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import termios
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .. import _proc

#: The first ninja that is a jobserver client (ninja-build/ninja, 1.13.0).
NINJA_JOBSERVER = Version("1.13")
#: How often the pool looks at its lanes, in seconds.
TICK_S = 0.2
#: How long the share of an expected compile is held for it after another lane opened.
RESERVE_S = 30.0
#: How long a ninja gets, once started, to take the slots of its pipe for its jobs.
GRAB_S = 1.0
#: The name a lane has in :meth:`Pool._opening` before it opens (no lane's name).
_OPENING = "\0opening"
#: The file the shim touches when it starts ninja (MAKEFLAGS' lane knows it started).
STARTED_ENV = "WHEELFORGE_NINJA_STARTED"

#: Runs the environment's ninja without -j N, so that it takes its jobs from MAKEFLAGS.
_NINJA_SHIM = """#!/bin/sh
# wheelforge: ninja as a client of this compile's jobserver (MAKEFLAGS); -j N would
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
if [ -n "${{WHEELFORGE_NINJA_STARTED:-}}" ]; then : > "$WHEELFORGE_NINJA_STARTED"; fi
exec {ninja} "$@"
"""


def ninja_joins(distributions: Mapping[str, str], at_least: Version = NINJA_JOBSERVER) -> bool:
    """Whether the environment's ninja (its ``ninja`` distribution) is at least
    ``at_least``: by default, a jobserver client."""
    found = distributions.get("ninja")
    if found is None:
        return False
    try:
        return Version(found).release[:2] >= at_least.release
    except InvalidVersion:
        return False


def split(total: int, wants: Sequence[tuple[str, int]]) -> dict[str, int]:
    """``total`` slots among ``wants`` (name, the most it can use): equal shares, none
    above what it can use, the rest of a share to the others (water-filling); a slot
    left over by the division goes to the first in ``wants``."""
    got = {name: 0 for name, _cap in wants}
    open_ = [(name, cap) for name, cap in wants if cap > 0]
    left = max(0, total)
    while left > 0 and open_:
        each = max(1, left // len(open_))
        still = []
        for name, cap in open_:
            give = min(each, cap - got[name], left)
            got[name] += give
            left -= give
            if got[name] < cap:
                still.append((name, cap))
            if left == 0:
                break
        open_ = still
    return got


class Lane:
    """One compile's jobserver: a fifo the pool fills (see the module's docstring)."""

    def __init__(self, name: str, directory: Path, jobs: int) -> None:
        self.name = name
        self.jobs = max(1, jobs)
        self.fifo = directory / f"lane-{abs(hash(name)):x}-{id(self):x}"
        os.mkfifo(self.fifo, 0o600)
        # read and write ends in one: the pipe never sees end-of-file while we live
        self._fd = os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK)
        self.started = self.fifo.with_name(self.fifo.name + ".started")
        self.given = 0  # slots in the pipe or in ninja's hands, beyond the first
        self.done: int | None = None
        self.total: int | None = None
        self._start_seen: float | None = None

    def environ(self) -> dict[str, str]:
        """What the compile's environment says for ninja to join this lane."""
        return {"MAKEFLAGS": f"-j{self.jobs} --jobserver-auth=fifo:{self.fifo}",
                STARTED_ENV: str(self.started)}

    def progress(self, done: int, total: int) -> None:
        """ninja's progress line ``[done/total]`` (its jobs ended, of all)."""
        self.done, self.total = done, total

    def sitting(self) -> int:
        """Slots in the pipe, not taken by ninja."""
        buf = array.array("i", [0])
        fcntl.ioctl(self._fd, termios.FIONREAD, buf)
        return int(buf[0])

    def can_use(self) -> int:
        """The most slots (beyond the first) this lane's compile can use now: all it may
        take until its ninja has started and had :data:`GRAB_S` to take them; then those
        in its hands, and as many more as its progress line says it has jobs to start."""
        try:
            started: float | None = self.started.stat().st_mtime
        except FileNotFoundError:
            started = None
        if started is None or time.time() - started < GRAB_S:
            return self.jobs - 1
        if started != self._start_seen:  # another ninja (the next extension): anew
            self._start_seen, self.done, self.total = started, None, None
        in_hands = self.given - self.sitting()
        if self.done is None or self.total is None:
            return in_hands  # it took what it could use when it started
        unstarted = max(0, self.total - self.done - (in_hands + 1))
        return max(in_hands, min(self.jobs - 1, in_hands + unstarted))

    def put(self, count: int) -> None:
        if count > 0:
            os.write(self._fd, b"+" * count)
            self.given += count

    def take(self, count: int) -> int:
        """Up to ``count`` slots out of the pipe (fewer if ninja took them first)."""
        if count <= 0:
            return 0
        try:
            got = len(os.read(self._fd, count))
        except BlockingIOError:
            got = 0
        self.given -= got
        return got

    def close(self) -> int:
        """The slots back out of the pipe; those ninja still held are lost (killed)."""
        back = self.take(self.given)
        self.given = 0
        with contextlib.suppress(OSError):
            os.close(self._fd)
        with contextlib.suppress(OSError):
            self.fifo.unlink()
        with contextlib.suppress(OSError):
            self.started.unlink()
        return back


class Pool:
    """``size`` compile slots shared by the builds of one command.  Holds a directory
    and a thread, hence a class; use as a context manager."""

    def __init__(self, size: int, directory: Path | None = None) -> None:
        self.size = max(1, size)
        self._dir = Path(tempfile.mkdtemp(prefix="wheelforge-jobs-", dir=directory))
        self._free = self.size
        self._cond = threading.Condition()
        self._lanes: dict[str, Lane] = {}
        self._expected: set[str] = set()
        self._reserve_until: float | None = None
        self._whole_waiting = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        shutil.rmtree(self._dir, ignore_errors=True)

    def free(self) -> int:
        """Slots in no lane and no compile's hands."""
        with self._cond:
            return self._free

    def shim(self, ninja: Path) -> Path:
        """A directory with a ``ninja`` that runs ``ninja`` without ``-j``."""
        bin_dir = self._dir / f"bin-{abs(hash(ninja)):x}"
        script = bin_dir / "ninja"
        with self._cond:
            if not script.exists():
                bin_dir.mkdir(exist_ok=True)
                tmp = bin_dir / ".ninja.tmp"
                tmp.write_text(_NINJA_SHIM.format(ninja=_sh_quote(str(ninja))))
                tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR)
                tmp.replace(script)
        return bin_dir

    def expect(self, name: str) -> None:
        """``name`` will compile: hold its share when another lane opens first."""
        with self._cond:
            self._expected.add(name)

    def withdraw(self, name: str) -> None:
        """``name`` will not compile (any more): its held share goes to the lanes."""
        with self._cond:
            self._expected.discard(name)
            self._rebalance()

    def _wait(self, enough: Callable[[], int], on_wait: Callable[[], None] | None) -> None:
        """Wait (the lock held) until ``enough()`` slots are free, telling ``on_wait``
        once if it must; Ctrl-C stops it."""
        while self._free < enough():
            if _proc.stopping():
                raise KeyboardInterrupt
            if on_wait is not None:
                on_wait()
                on_wait = None
            self._rebalance()
            self._cond.wait(TICK_S)

    @contextlib.contextmanager
    def slots(self, count: int, on_wait: Callable[[], None] | None = None) -> Iterator[int]:
        """Hold ``count`` slots (at most the pool's) for a compile; yield how many.
        ``on_wait`` hears it once if they are not free."""
        count = max(1, min(count, self.size))
        with self._cond:
            self._whole_waiting += 1
            try:
                self._wait(lambda: count, on_wait)
            finally:
                self._whole_waiting -= 1
            self._free -= count
        try:
            yield count
        finally:
            with self._cond:
                self._free += count
                self._rebalance()
                self._cond.notify_all()

    @contextlib.contextmanager
    def lane(self, name: str, jobs: int,
             on_wait: Callable[[], None] | None = None) -> Iterator[Lane]:
        """A lane of at most ``jobs`` jobs for ``name``'s compile, filled with its share
        before the compile starts: it waits until the share is free (``on_wait`` hears it
        once if it must)."""
        jobs = min(jobs, self.size)
        with self._cond:
            self._wait(lambda: self._opening(_OPENING, jobs), on_wait)
            key, n = name, 1
            while key in self._lanes:  # two builds of one recipe (a nightly's cells)
                n += 1
                key = f"{name}#{n}"
            self._free -= 1
            lane = Lane(key, self._dir, jobs)
            self._expected.discard(name)
            self._lanes[key] = lane
            if self._reserve_until is None:
                self._reserve_until = time.monotonic() + RESERVE_S
            self._rebalance()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="wheelforge-jobserver")
                self._thread.start()
        try:
            yield lane
        finally:
            with self._cond:
                del self._lanes[key]
                back = lane.close()
                self._free += back + 1
                self._rebalance()
                self._cond.notify_all()

    def _opening(self, name: str, jobs: int) -> int:
        """The slots a lane of ``jobs`` jobs waits for before its compile starts: its
        share beside the lanes open now (a ninja reads its pipe only when it starts and
        when one of its jobs ends, so one started on fewer would run on those until its
        first unit ends)."""
        if self._whole_waiting:
            return jobs + self.size  # after the whole compile that waits
        wants = [(name, jobs)] + [(lane.name, lane.can_use() + 1)
                                  for lane in self._lanes.values()]
        return max(1, split(self._total(), wants)[name])

    def _total(self) -> int:
        """The slots in no whole compile: free, or in a lane (its first one included)."""
        return self._free + sum(lane.given + 1 for lane in self._lanes.values())

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                self._rebalance()
                self._cond.wait(TICK_S)

    def _rebalance(self) -> None:
        """Move slots between the free count and the lanes' pipes (the lock held)."""
        lanes = list(self._lanes.values())
        if not lanes:
            return
        # shares counted with each lane's first slot, which stays with it
        wants = [(lane.name, lane.can_use() + 1) for lane in lanes]
        if self._whole_waiting:  # a whole compile waits: the lanes keep what they hold
            wants = [(lane.name, lane.given - lane.sitting() + 1) for lane in lanes]
        elif self._reserve_until is not None and time.monotonic() < self._reserve_until:
            wants += [(name, self.size) for name in self._expected if name not in self._lanes]
        target = {name: max(0, share - 1) for name, share in split(self._total(), wants).items()}
        for lane in lanes:
            if lane.given > target[lane.name]:
                self._free += lane.take(min(lane.sitting(), lane.given - target[lane.name]))
        for lane in lanes:
            if lane.given < target[lane.name]:
                give = min(self._free, target[lane.name] - lane.given)
                lane.put(give)
                self._free -= give


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
