"""Filesystem primitives: atomic writes, locks, hashing."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import pwd
import secrets
import shlex
import shutil
import stat
import sys
import time
from collections.abc import Callable, Container, Iterator
from pathlib import Path
from typing import BinaryIO

from . import _proc
from .errors import ConfigError

TMP_PREFIX = ".wf-tmp-"

#: the oldest date a zip member can carry (1980-01-01T00:00:00Z): the date given to the
#: headers wheelforge installs (a managed environment's torch, a managed toolkit), so that
#: nvcc's line tables (which hold each source file's date) do not hold the install's
ZIP_EPOCH = 315532800


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_file(path: str | os.PathLike[str]) -> bytes:
    """A file's bytes.  For the small files an index reads by the thousand, a third of
    the cost of ``open().read()`` (no buffered reader, no isatty and seek calls)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 1 << 16)]
        while chunks[-1]:
            chunks.append(os.read(fd, 1 << 20))
    finally:
        os.close(fd)
    return b"".join(chunks)


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory (a directory: so that a rename in it is durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def temp_file(directory: str | os.PathLike[str]) -> Iterator[tuple[BinaryIO, str]]:
    """Yield a new temp file in ``directory``, open for writing, and its path.

    On success the file is flushed, fsynced and closed: ready to be renamed into place.
    On failure it is removed.  Like mkstemp, the name is random and the file is created
    with O_EXCL; unlike mkstemp (0600, which would keep a web server or pip running as
    another user from reading the index), the mode is the one a plain ``open()`` gives:
    0666 less the umask, applied by the kernel, so no chmod is needed.
    """
    while True:
        tmp = os.path.join(directory, TMP_PREFIX + secrets.token_hex(6))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            break
        except FileExistsError:  # a name already taken: draw another
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            yield f, tmp
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        discard(tmp)
        raise


def discard(path: str | os.PathLike[str]) -> None:
    """Remove a file if it is there (a temp file that will not be renamed)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def make_dirs(directory: str, created: list[str]) -> None:
    """``os.makedirs(directory, exist_ok=True)`` that appends the directories it made to
    ``created`` (their parents need an fsync for them to be durable).  Safe when other
    threads make the same directories."""
    try:
        os.mkdir(directory)
    except FileExistsError:
        return
    except FileNotFoundError:
        make_dirs(os.path.dirname(directory), created)
        try:
            os.mkdir(directory)
        except FileExistsError:
            return
    created.append(directory)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """Yield a temp file beside ``path``; on success it is fsynced and renamed to ``path``,
    so ``path`` is never seen half-written.  On failure the temp file is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with temp_file(path.parent) as (f, tmp):
        yield f
    try:
        os.replace(tmp, path)
    except BaseException:
        discard(tmp)
        raise
    fsync_path(path.parent)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` via a temp file, fsync and rename."""
    with atomic_file(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def write_script(path: Path, text: str) -> Path:
    """An executable script (mode 0755) at ``path`` holding ``text``: left as it is when it
    already does, else written whole, executable before it appears (a build beside this
    one may run it the moment it is there)."""
    try:
        if path.read_text() == text:
            return path
    except (OSError, UnicodeDecodeError):
        pass
    with atomic_file(path) as f:
        f.write(text.encode("utf-8"))
        os.fchmod(f.fileno(), 0o755)
    return path


def atomic_copy(src: Path, dest: Path) -> None:
    """Copy ``src`` to ``dest`` so that ``dest`` is never seen half-written."""
    with atomic_file(dest) as out, open(src, "rb") as inp:
        shutil.copyfileobj(inp, out, 1 << 20)


#: how often a process waiting for an :func:`owned_lock` says again whom it waits for
WAIT_REPORT_S = 30.0
#: the most of a holder's command line written into (and read back from) its lock file
HOLDER_MAX = 8192
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _refuse_lock(path: Path, why: str) -> ConfigError:
    return ConfigError(f"refusing the lock file {path}", why=why,
                       fix=f"remove {path} (it is not one wheelforge made: look at who put it "
                           "there), then run the command again")


def open_lock(path: Path, *, create: bool = True) -> tuple[int, bool]:
    """Open the lock file ``path`` without following a link, creating it (0644, with
    O_EXCL) when ``create`` and it is missing; return the descriptor and whether the file
    is this user's (only then may its holder text be written or trusted).

    A link, a FIFO, a device or a file with a second hard link at ``path`` is refused
    (:class:`ConfigError`): in a directory others can write, each is a way to make this
    process write where someone else points it.  Another user's lock file is opened
    read-only when writing it is refused: it can be waited for, never written."""
    fd = -1
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    try:
        if fd < 0:
            try:
                fd = os.open(path, os.O_RDWR | _NOFOLLOW)
            except PermissionError:
                fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse_lock(path, "it is a symbolic link: a lock is never opened through "
                                     "one") from None
        if isinstance(exc, PermissionError):
            raise ConfigError(f"cannot open the lock file {path}",
                              why=f"{exc.strerror}: another user's file, or in another user's "
                                  "directory",
                              fix="run as the user who owns it, or give this run a directory "
                                  "of its own (--cache-dir, --index)") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise _refuse_lock(path, "it is not a plain file with one name (a FIFO, a device or "
                                 "a hard link to another file)")
    return fd, st.st_uid == os.geteuid()


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if missing; never through a
    link, never written)."""
    fd, _mine = open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def try_locked(path: Path, *, wait: bool) -> Iterator[bool]:
    """:func:`locked`, or with ``wait=False`` yield False at once when it is held."""
    if wait:
        with locked(path):
            yield True
        return
    fd, _mine = open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


_HELD: dict[str, int] = {}  # the owned locks this process holds: real path -> depth


def _took(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    return f"{minutes}m{s:02d}s" if minutes else f"{s}s"


def _wait_for(fd: int, path: Path, on_busy: Callable[[str], None] | None) -> None:
    """Take the lock on ``fd`` once its holder lets go, saying whom it waits for at once
    and every :data:`WAIT_REPORT_S` seconds (the holder may change while it waits)."""
    start = time.monotonic()
    report = start
    while not _took(fd):
        now = time.monotonic()
        if on_busy is not None and now >= report:
            waited = now - start
            holder = lock_holder(path)
            on_busy(holder if waited < 1 else f"{holder}; waiting {_duration(waited)} so far")
            report = now + WAIT_REPORT_S
        _proc.pause(0.1)  # Ctrl-C, SIGTERM, --timeout: the wait ends with the command


def holder_text() -> str:
    """What this process writes about itself into a lock it holds: its pid, since when,
    and its whole command line (quoted as a shell would need it)."""
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    command = shlex.join(["wheelforge", *sys.argv[1:]])
    if len(command) > HOLDER_MAX:
        command = command[:HOLDER_MAX - 3] + "..."
    return f"pid {os.getpid()} ({command}) since {since}"


@contextlib.contextmanager
def owned_lock(path: Path, *, wait: bool = True,
               on_busy: Callable[[str], None] | None = None) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` that says who holds it; yield True once held.

    The holder writes its pid, start time and whole command line into the file (when the
    file is its own user's: another user's is never written), so that a process that has
    to wait can say whom it waits for: ``on_busy`` gets that text at once and again every
    :data:`WAIT_REPORT_S` seconds of the wait.  ``wait=False`` yields False at once when
    another process holds it.  The file is opened as :func:`open_lock` says (never
    through a link).  Re-entrant within a process (the nightly holds a build key's lock
    while the build it runs takes the same lock).
    """
    real = os.path.join(os.path.realpath(path.parent), path.name)
    if _HELD.get(real):
        _HELD[real] += 1
        try:
            yield True
        finally:
            _HELD[real] -= 1
        return
    fd, mine = open_lock(path)
    try:
        if not _took(fd):
            if not wait:
                yield False
                return
            _wait_for(fd, path, on_busy)
        if mine:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, holder_text().encode("utf-8", "replace"), 0)
        _HELD[real] = 1
        try:
            yield True
        finally:
            del _HELD[real]
            if mine:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def user_name(uid: int) -> str:
    """``uid`` as a person reads it: "alice (uid 1000)", or "uid 1000" without an account."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def printable(text: str) -> str:
    """``text`` with control characters (a terminal's escapes among them) shown as ``?``."""
    return "".join(c if c.isprintable() else "?" for c in text)


def lock_holder(path: Path) -> str:
    """Who holds an :func:`owned_lock`, as its holder wrote it: trusted only from a plain
    file of this user's (read without following a link); otherwise the holder is
    unknown, and the text says why."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError:
        return "an unknown process (its lock file cannot be read)"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "an unknown process (its lock file is not a plain file)"
        if st.st_uid != os.geteuid():
            return (f"an unknown process (its lock file belongs to uid {st.st_uid}, not to "
                    "you: what it says is not trusted)")
        data = os.read(fd, HOLDER_MAX + 256)
    except OSError:
        return "an unknown process (its lock file cannot be read)"
    finally:
        os.close(fd)
    text = printable(data.decode("utf-8", "replace").strip())
    return text or "another process (it has not written who it is yet)"


def date_tree(root: Path, epoch: int) -> int:
    """Date every file, link and directory under ``root`` (and ``root``) that is newer
    than ``epoch`` at ``epoch``; return how many were.  Links are dated themselves, never
    followed, so a link in the tree cannot date a file outside it; a tree that is not
    there dates nothing."""
    changed = 0
    for top, dirs, files in os.walk(root):  # os.walk never descends through a link
        for name in (*files, *dirs):
            changed += _date(os.path.join(top, name), epoch)
    return changed + (_date(str(root), epoch) if os.path.lexists(root) else 0)


def _date(path: str, epoch: int) -> int:
    if os.lstat(path).st_mtime <= epoch:
        return 0
    os.utime(path, (epoch, epoch), follow_symlinks=False)
    return 1


def sweep_temp_files(directory: Path, *, skip: Container[str] = ()) -> int:
    """Remove temp files left by an interrupted atomic write; return the count.

    ``skip`` names subdirectories of ``directory`` that are left out (a caller that
    sweeps them itself)."""
    removed = 0
    for parent, subdirectories, names in os.walk(directory):
        if skip and parent == os.fspath(directory):
            subdirectories[:] = [d for d in subdirectories if d not in skip]
        for name in names:
            if name.startswith(TMP_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(parent, name))
                    removed += 1
    return removed


def symlinks(root: Path) -> dict[str, str]:
    """Every symlink under ``root`` (not followed): its path relative to ``root`` and its
    target as stored."""
    out: dict[str, str] = {}
    for parent, subdirectories, names in os.walk(root):
        for name in (*subdirectories, *names):
            path = os.path.join(parent, name)
            if os.path.islink(path):
                out[os.path.relpath(path, root)] = os.readlink(path)
    return out


def escaping_links(root: Path) -> list[tuple[str, str]]:
    """The symlinks under ``root`` that resolve outside it, as (relative path, where it
    resolves).  Only a symlink can lead out of a tree whose other entries were created in
    it, so only symlinks are resolved."""
    base = os.path.realpath(root)
    out = []
    for rel in sorted(symlinks(root)):
        real = os.path.realpath(os.path.join(base, rel))
        if real != base and not real.startswith(base + os.sep):
            out.append((rel, real))
    return out
