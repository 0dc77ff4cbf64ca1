"""One pool of compile slots for every build of a command, taken one unit at a time.

A command that builds several recipes at once (``wheelforge build A B``, a recipe and
its companions, the cells of a nightly) compiles them within one budget: the command's
``MAX_JOBS x NVCC_THREADS`` slots.

* **The pool** is a thread of the command that holds the free slots and hands them out
  through a Unix socket in a directory of its own (mode 0700), which lives as long as
  the command.
* **Gates.**  torch's extension builder runs every nvcc of its ninja file as
  ``$PYTORCH_NVCC``.  A build puts the pool's gate in front of it (:meth:`Pool.gate`):
  before each unit's nvcc starts, the gate asks the pool for that unit's slots (its nvcc
  threads) and waits for them; they are free again when the gate's connection closes,
  as it ends, whether it ended or was killed.  The build's ninja keeps torch's
  ``-j MAX_JOBS``, its own bound (memory); the pool bounds the command.  A slot goes to
  a waiting unit of any build the moment another unit ends: the units of the build with
  the highest priority first (the seconds its compile took last time, from its recorded
  unit costs: the longest compile starts its units first), then the first to ask.
  Slots are held, up to :data:`RESERVE_S`, for an expected compile of a higher priority
  that has not started its units yet (:meth:`Pool.expect`), and until its ninja has asked
  for the first of them (its units have not asked for :data:`SETTLE_S`): a companion's
  compile often starts a few seconds after a shorter one.
  (ninja 1.13's own jobserver client reads its pipe only when it starts and when one of
  its jobs ends, never while it waits; a compile started while another held every slot
  ran one unit at a time: docs/performance.md.)  The first waiting request waits for all
  it asks for and nothing passes it, so a unit of several nvcc threads is not starved.
* **Whole.**  A compile without ninja in its environment (setuptools then runs nvcc
  itself, not through ``$PYTORCH_NVCC``) asks for all its slots in the same queue before
  it starts (:meth:`Pool.slots`).
* **The units' own seconds.**  ninja's log counts a unit's wait at the gate as part of
  it; the gate writes the seconds its unit ran beside the unit's object
  (:data:`SECONDS_SUFFIX`), which builder/compiling/unitcosts.py records instead: its wall, or, if
  more, its CPU seconds over its slots (ptxas's threads on lent slots shorten a unit's
  wall, not its work, and the next build packs its units by these seconds).
* **ptxas's threads (opt-in: ``WHEELFORGE_JOBSERVER=1``, :func:`lends`; by default nvcc
  runs as the toolkit runs it and the pool lends nothing: side by side the lending did
  not pay in wall time, docs/performance.md).**  ptxas can cut one unit's functions into
  parts compiled on several threads (``--split-compile``) and take a GNU make jobserver
  token for every thread past its first (``--jobserver``).  Where nvcc lists both (CUDA
  13.0 does), the pool is also a jobserver (a named pipe, ``MAKEFLAGS=
  --jobserver-auth=fifo:PATH``, set by each gate for its own nvcc and the ptxas it runs,
  never for ninja, which would join it too) and torch's nvcc command gets
  ``--ptxas-options=--split-compile=8,--jobserver`` (:func:`nvcc_flags`).  The pool puts
  its free slots in the pipe once no gate has asked for :data:`LEND_AFTER_S` nor ended
  for :data:`LEND_AFTER_END_S` and none is waiting (:meth:`Pool._lend_idle`), and takes
  them back, as the threads give them back, when a gate waits (:meth:`Pool._reclaim`).
  So the cores a build's last units leave free compile the ptxas phase of the units
  still running, and a busy machine compiles each unit as before.  A unit's gate still
  takes its ``NVCC_THREADS`` slots (nvcc's ``--threads`` are not the jobserver's). Why
  ptxas's split only: nvcc's own ``--split-compile`` also splits cicc, whose PTX then
  differs (nvcc 13.0, torch's argument order: the CUDA fixture's kernel computes its
  thread's index twice; not in ccache's order, so a cached object would differ), while
  ptxas's gives the same machine code as no split, whatever the tokens (mamba-ssm's
  costliest unit: all 96 ``.text`` sections the same bytes; only ``.note.nv.tkinfo``,
  which records ptxas's options, differs from a build without it).  The part count is
  fixed (:data:`SPLIT_COMPILE`), so the object's bytes never depend on the machine or on
  the tokens (tests/test_scheduler.py compiles with and without free slots and
  compares). Not under sccache: its server runs ptxas without the build's ``MAKEFLAGS``
  (ptxas warns that it found no jobserver and runs every part at once), and sccache 0.16
  mis-parses nvcc's own ``--jobserver`` (fatbinary: "Could not open input file").

Host C++ units (``$cxx`` in the ninja file, one or two per recipe here) are not gated:
they run within their build's ``MAX_JOBS``.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import hashlib
import os
import selectors
import shlex
import shutil
import socket
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from ... import _proc, workdirs
from ..._fs import write_script
from . import _gate, nvccsteps
from .toolchain import nvcc_help

#: How often a whole compile that waits for its slots looks for Ctrl-C, in seconds.
TICK_S = 0.2
#: How long slots are held for an expected compile of a higher priority, in seconds.
RESERVE_S = 30.0
#: An expected compile has started its units once none of them has asked for this long.
SETTLE_S = 1.5
#: A free slot goes into the jobserver's pipe once no gate has asked for slots for this
#: long and none waits, in seconds (ninja starts a compile's units one after another, a
#: few milliseconds apart: their slots go to them, not to the first units' threads).
LEND_AFTER_S = 1.0
#: ... and once no gate has ended for this long: ninja starts its next unit, if it has
#: one, within milliseconds of one ending (that unit's slot goes to it); a build's last
#: units end one after another, often less than a second apart, and each slot they free
#: goes to the threads of the units still running a quarter of a second later.
LEND_AFTER_END_S = 0.25
#: ptxas's ``--split-compile``: the most threads one architecture of one unit can use.
#: Recorded in the cubin (``.note.nv.tkinfo``), so a constant, never the machine's cores.
SPLIT_COMPILE = 8
#: The options (as nvcc's help lists them) that make ptxas a client of the jobserver.
NVCC_JOBSERVER = ("--split-compile", "--jobserver")
#: ``WHEELFORGE_JOBSERVER=1``: the pool lends its free slots to ptxas's threads (nvcc gets
#: :func:`nvcc_flags`); off by default: nvcc runs as the toolkit runs it (docs/performance.md:
#: the side-by-side runs did not rank the walls on 16 cores, nor on 2).
JOBSERVER_ENV = "WHEELFORGE_JOBSERVER"
#: ``WHEELFORGE_NVCC_STEPS=1``: builder/compiling/nvccsteps.py in front of each unit's nvcc
#: (:func:`steps_in_front`), its host compile beside its ptxas on a lent slot; it turns
#: the lending on too (unless ``WHEELFORGE_JOBSERVER=0``).  Off by default.
NVCC_STEPS_ENV = "WHEELFORGE_NVCC_STEPS"
#: The jobserver's token (GNU make's protocol: a client gives back the byte it took).
_TOKEN = b"+"
#: Where the pool's socket goes when the directory given is too deep for one (108 bytes).
_SHORT_DIR = "/tmp"
#: The pool's directory (socket, jobserver pipe, gate), made in the temporary directory.
DIR_PREFIX = "wheelforge-jobs-"

#: The file beside a unit's object where its gate wrote the seconds the unit ran.
SECONDS_SUFFIX = _gate.SECONDS_SUFFIX
#: The gate, run as ``python -I -S _gate.py SOCKET SLOTS PRIORITY MAKEFLAGS COMMAND...``
#: by its file path (stdlib only: the build environment's interpreter runs it).
GATE = os.path.abspath(_gate.__file__)


def nvcc_flags(nvcc: Path) -> tuple[str, ...]:
    """The option that makes ``nvcc``'s ptxas split each unit into :data:`SPLIT_COMPILE`
    parts, run on as many threads as the pool's jobserver lends it: when this nvcc lists
    both options in its help (CUDA 13.0 does), else none."""
    text = nvcc_help(nvcc)
    split, server = NVCC_JOBSERVER
    if split not in text or server not in text:
        return ()
    return (f"--ptxas-options={split}={SPLIT_COMPILE},{server}",)


def runs_steps(environ: Mapping[str, str] | None = None) -> bool:
    """Whether builds put the nvcc step runner in front of nvcc (:data:`NVCC_STEPS_ENV`)."""
    env = os.environ if environ is None else environ
    return env.get(NVCC_STEPS_ENV) == "1" and env.get(JOBSERVER_ENV) != "0"


def lends(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the command's pool lends its free slots to ptxas's threads
    (:data:`JOBSERVER_ENV`, or the step runner's :data:`NVCC_STEPS_ENV`)."""
    env = os.environ if environ is None else environ
    return env.get(JOBSERVER_ENV) == "1" or runs_steps(env)


def lent_flags(nvcc: Path, backend: str | None,
               environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The options a build gives ``nvcc`` for the pool's lending: :func:`nvcc_flags` when
    the pool lends and the compile cache is not sccache's (see above), else none.  They
    are recorded in the cubin (``.note.nv.tkinfo``), so the build key holds them
    (builder/artifact/identity.py)."""
    if not lends(environ) or backend == "sccache":
        return ()
    return nvcc_flags(nvcc)


def steps_in_front(command: str, environ: dict[str, str], directory: Path) -> str:
    """``command`` (shell words: nvcc, or ccache and nvcc) with builder/compiling/nvccsteps.py in
    front of nvcc, so that each unit's host compile takes a free slot of the jobserver
    beside its ptxas: as ccache's ``CCACHE_PREFIX`` (ccache runs it with nvcc and its
    arguments when it compiles, and does not hash it; a prefix is one word, so not where
    its path holds a space, nor where the user has a prefix of their own, such as
    distcc), or before the command.  ``environ`` gets the prefix.  The launcher is a
    script in ``directory`` (ccache's prefix must be one program), which also holds
    nvccsteps.py's marks."""
    words = shlex.split(command)
    cached = bool(words) and os.path.basename(words[0]) == "ccache"
    if cached and environ.get("CCACHE_PREFIX"):  # the user's: nvcc runs its steps itself
        return command
    body = (f"exec {shlex.quote(sys.executable)} -I -S "
            f"{shlex.quote(os.path.abspath(nvccsteps.__file__))} \"$@\"\n")
    folder = directory / hashlib.sha256(body.encode()).hexdigest()[:16]
    script = str(write_script(folder / "nvcc-steps", f"#!/bin/sh\n{nvccsteps.STATE_ENV}="
                              f"{shlex.quote(str(folder))} {body}"))
    if not cached:
        return f"{shlex.quote(script)} {command}"
    if " " not in script:
        environ["CCACHE_PREFIX"] = script
    return command


class _Expected:
    """A compile to come: its priority; when its units last asked (None: not yet)."""

    def __init__(self, priority: float) -> None:
        self.priority = priority
        self.asked: float | None = None


class _Request:
    """A compile's (or one unit's) wait for ``count`` slots."""

    def __init__(self, count: int, priority: float, seq: int,
                 conn: socket.socket | None) -> None:
        self.count, self.priority, self.seq, self.conn = count, priority, seq, conn
        self.granted = threading.Event()

    def rank(self) -> tuple[float, int]:
        return (self.priority, -self.seq)


def pools_dir(directory: Path | None = None) -> Path:
    """Where a pool's directory is made: ``directory`` (default: the temporary directory),
    or :data:`_SHORT_DIR` where that is too deep for the pool's socket (sun_path: 108
    bytes); `wheelforge clean` looks there for the pools of killed commands."""
    parent = Path(directory if directory is not None else tempfile.gettempdir())
    probe = parent / f"{DIR_PREFIX}{'x' * 8}" / "slots.sock"  # mkdtemp adds 8 characters
    return parent if len(os.fsencode(probe)) <= 100 else Path(_SHORT_DIR)


class Pool:
    """``size`` compile slots shared by the builds of one command.  Holds a directory,
    a socket and a thread, hence a class; use as a context manager."""

    def __init__(self, size: int, directory: Path | None = None, *, lend: bool = True) -> None:
        self.size = max(1, size)
        self.lend = lend  # free slots into the jobserver's pipe (:func:`lends`)
        self._dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=pools_dir(directory)))
        self._address = self._dir / "slots.sock"
        # what the pool holds, let go in reverse when it closes or cannot start (a full
        # /tmp): its directory's run lock (`wheelforge clean` removes the directory of a
        # command that was killed, SIGKILL: nothing ran to remove it; never a live one),
        # the directory, its socket and its jobserver's pipe
        self._owned = contextlib.ExitStack()
        self._owned.enter_context(workdirs.claim(self._dir))
        self._owned.callback(shutil.rmtree, self._dir, ignore_errors=True)
        self._fifo = self._dir / "jobs.fifo"  # the jobserver: tokens for ptxas's threads
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._owned.callback(self._server.close)  # (its thread closes it first)
        try:
            os.mkfifo(self._fifo, 0o600)
            self._tokens = os.open(self._fifo, os.O_RDWR | os.O_NONBLOCK)
            self._owned.callback(os.close, self._tokens)
            self._server.bind(str(self._address))
            self._server.listen(1024)
        except BaseException:
            self._owned.close()
            raise
        self._wake_r, self._wake_w = os.pipe()
        self._lock = threading.Lock()
        self._free = self.size
        self._waiting: list[_Request] = []
        self._held: dict[socket.socket, int] = {}
        self._seq = 0
        self._expected: dict[str, _Expected] = {}  # compiles to come
        self._holding_since: float | None = None
        self._lent = 0  # slots given to the jobserver's pipe: there, or with ptxas threads
        self._asked_at = self._ended_at = time.monotonic()  # a gate's last request, end
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name="wheelforge-jobserver")
        self._thread.start()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._owned.close()

    @property
    def directory(self) -> Path:
        """The pool's directory (its socket, jobserver pipe and gate): gone once closed."""
        return self._dir

    def free(self) -> int:
        """Slots in no unit's, no compile's and no ptxas thread's hands (the pool's own and
        the tokens waiting in its jobserver's pipe)."""
        with self._lock:
            return self._free + self._in_pipe()

    def makeflags(self) -> str:
        """``MAKEFLAGS`` for a client of the pool's jobserver (GNU make 4.4's named pipe)."""
        return f" -j{self.size} --jobserver-auth=fifo:{self._fifo}"

    def gate(self, command: str, threads: int = 1, priority: float = 0.0) -> str:
        """``command`` (shell words: an nvcc, or a compile cache and nvcc) behind the
        pool's gate, which takes ``threads`` slots for each unit it compiles; a unit of
        a higher ``priority`` goes first."""
        count = max(1, min(threads, self.size))
        return " ".join([shlex.quote(sys.executable), "-I", "-S", shlex.quote(GATE),
                         shlex.quote(str(self._address)), str(count), repr(float(priority)),
                         shlex.quote(self.makeflags() if self.lend else ""), command])

    @contextlib.contextmanager
    def slots(self, count: int, on_wait: Callable[[], None] | None = None,
              priority: float = 0.0) -> Iterator[int]:
        """Hold ``count`` slots (at most the pool's) for a whole compile; yield how
        many.  ``on_wait`` hears it once if they are not free; Ctrl-C stops the wait."""
        count = max(1, min(count, self.size))
        with self._lock:
            self._asked_at = time.monotonic()
            request = self._queue(count, priority, None)
            self._grant()
        while not request.granted.wait(TICK_S):
            if _proc.stopping():
                with self._lock:
                    if not request.granted.is_set():
                        self._waiting.remove(request)
                        self._grant()
                        raise KeyboardInterrupt
                break
            if on_wait is not None:
                on_wait()
                on_wait = None
        try:
            yield count
        finally:
            with self._lock:
                self._ended_at = time.monotonic()
                self._free += count
                self._grant()

    def expect(self, name: str, priority: float) -> None:
        """``name`` will compile, its units at ``priority``: until its units have asked
        (requests of that priority, then none for :data:`SETTLE_S`), or :meth:`withdraw`,
        units of a lower priority wait for it, at most :data:`RESERVE_S` (the longest
        compile starts its units first even when a shorter one reaches its compile a few
        seconds before it)."""
        with self._lock:
            if priority > 0:
                self._expected[name] = _Expected(priority)

    def withdraw(self, name: str) -> None:
        """``name`` will not compile (any more): nothing waits for it now."""
        with self._lock:
            if self._expected.pop(name, None) is not None:
                self._grant()

    def _queue(self, count: int, priority: float, conn: socket.socket | None) -> _Request:
        self._seq += 1
        now = time.monotonic()
        for expected in self._expected.values():
            if expected.priority <= priority:
                expected.asked = now  # its units (or some as long) are coming
        request = _Request(min(max(1, count), self.size), priority, self._seq, conn)
        self._waiting.append(request)
        return request

    def _grant(self) -> None:
        """Hand free slots to the waiting requests, the highest priority first, then the
        first to ask (the lock held).  The first in that order waits for all it asks
        for: nothing smaller passes it, so a request of many slots is never starved.
        Slots lent to the jobserver come back for it as ptxas's threads give them back."""
        while self._waiting:
            first = max(self._waiting, key=_Request.rank)
            self._reclaim(first.count - self._free)
            if first.count > self._free or self._held_for_expected(first):
                return
            self._waiting.remove(first)
            self._free -= first.count
            if first.conn is None:
                first.granted.set()
                continue
            try:
                first.conn.send(b"+")
            except OSError:  # the gate is gone (stopped): its slots are free again
                self._free += first.count
                continue
            self._held[first.conn] = first.count

    def _in_pipe(self) -> int:
        """Tokens waiting in the jobserver's pipe (the lock held)."""
        if not self._lent:
            return 0
        count = array.array("i", [0])
        fcntl.ioctl(self._tokens, termios.FIONREAD, count)
        return count[0]

    def _reclaim(self, wanted: int) -> None:
        """Take up to ``wanted`` lent slots back from the jobserver's pipe: those no nvcc
        thread holds (the lock held)."""
        if wanted <= 0 or not self._lent:
            return
        try:
            got = len(os.read(self._tokens, min(wanted, self._lent)))
        except BlockingIOError:
            got = 0
        self._lent -= got
        self._free += got

    def _lend_idle(self) -> None:
        """Put the free slots in the jobserver's pipe, for the threads of the ptxas that
        run, once no gate has asked for :data:`LEND_AFTER_S` and none has ended for
        :data:`LEND_AFTER_END_S`, none waits and no compile is expected (the lock held)."""
        now = time.monotonic()
        if (not self.lend or not self._free or self._waiting or self._expected or self._closed
                or now - self._asked_at < LEND_AFTER_S
                or now - self._ended_at < LEND_AFTER_END_S):
            return
        try:
            lent = os.write(self._tokens, _TOKEN * self._free)
        except BlockingIOError:  # the pipe is full (64 KiB of tokens): keep them
            return
        self._free -= lent
        self._lent += lent

    def _held_for_expected(self, first: _Request) -> bool:
        """Whether ``first`` waits for an expected compile of a higher priority (the
        lock held): one that has not asked yet, or whose units asked less than
        :data:`SETTLE_S` ago (its ninja starts them all at once, one gate after another).
        The hold ends :data:`RESERVE_S` after it began."""
        now = time.monotonic()
        for name, e in list(self._expected.items()):
            if e.asked is not None and now - e.asked >= SETTLE_S:
                del self._expected[name]  # its units have asked: the queue orders them
        if not any(e.priority > first.priority for e in self._expected.values()):
            self._holding_since = None
            return False
        if self._holding_since is None:
            self._holding_since = now
        if now - self._holding_since < RESERVE_S:
            return True
        for name in [n for n, e in self._expected.items() if e.priority > first.priority]:
            del self._expected[name]  # it did not come in time: no more holding for it
        self._holding_since = None
        return False

    def _serve(self) -> None:
        """Accept the gates, read their requests, take back the slots of those that end
        (a gate's connection closes when it ends, killed or not).  However this thread
        ends, every connection closes: a waiting gate then fails, it never hangs."""
        with selectors.DefaultSelector() as sel:
            sel.register(self._server, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            try:
                self._serve_in(sel)
            finally:
                for key in list(sel.get_map().values()):
                    if isinstance(key.fileobj, socket.socket):
                        key.fileobj.close()

    def _serve_in(self, sel: selectors.BaseSelector) -> None:
        pending: dict[socket.socket, bytes] = {}
        while True:
            for key, _events in sel.select(TICK_S):
                if key.fileobj is self._server:
                    with contextlib.suppress(OSError):  # out of descriptors: it retries
                        conn, _ = self._server.accept()
                        pending[conn] = b""
                        sel.register(conn, selectors.EVENT_READ)
                    continue
                if key.fileobj == self._wake_r:
                    os.read(self._wake_r, 64)
                    continue
                conn = key.fileobj  # type: ignore[assignment]
                try:
                    data = conn.recv(64)
                except OSError:
                    data = b""
                with self._lock:
                    if data and conn in pending:
                        self._asked_at = time.monotonic()
                        pending[conn] += data
                        if b"\n" in pending[conn]:
                            self._request(conn, pending.pop(conn))
                    elif not data:  # the gate ended
                        self._ended_at = time.monotonic()
                        sel.unregister(conn)
                        pending.pop(conn, None)
                        self._free += self._held.pop(conn, 0)
                        self._waiting = [r for r in self._waiting if r.conn is not conn]
                        conn.close()
                    self._grant()
            with self._lock:
                if self._closed:
                    return
                self._grant()  # a hold for an expected compile may have ended, a token
                self._lend_idle()  # come back; or the pool is quiet: lend what is free

    def _request(self, conn: socket.socket, line: bytes) -> None:
        """A gate's request, ``SLOTS PRIORITY``; a malformed one is closed unanswered."""
        try:
            count, priority = line.split()[:2]
            self._queue(int(count), float(priority), conn)
        except ValueError:
            conn.shutdown(socket.SHUT_RDWR)
