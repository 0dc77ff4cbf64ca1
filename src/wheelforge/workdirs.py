"""Scratch directories of runs (a build's source tree and wheel, a stack check's venv): each
run holds a lock inside its own directory for as long as it lives, so that
``wheelforge clean`` removes what failed or killed runs left and never a live run's.

A build keeps its directory when it fails (the message says where, for reading the
tree); a run killed with SIGKILL leaves its directory too.  The lock is an advisory
``flock`` that the kernel drops when the process dies, whatever killed it.

The lock file is also the mark that wheelforge made the directory: ``clean`` removes a
directory only when it is this user's and holds this user's lock file, a plain file (a
directory without one, or another user's, is kept and named).  Nothing is opened through
a link, the lock is only read (``--dry-run`` writes nothing), and a parent directory that
others may rearrange (writable by them and not sticky, or another user's) is left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ._fs import lock_holder, open_lock, owned_lock, user_name
from .errors import ConfigError

#: the lock file a run holds inside its scratch directory (and the mark that wheelforge
#: made the directory)
RUN_LOCK = ".wheelforge-run.lock"


@contextlib.contextmanager
def claim(directory: Path) -> Iterator[None]:
    """Hold ``directory`` as this run's for the duration (its lock, inside it)."""
    with owned_lock(directory / RUN_LOCK):
        yield


@dataclass(frozen=True)
class Swept:
    removed: tuple[tuple[Path, int], ...]  # (directory, bytes)
    kept: tuple[tuple[Path, str], ...]  # (directory, why: in use by ..., not yours)


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def unsafe_parent(parent: Path) -> str | None:
    """Why ``parent`` is no place to remove directories from (another user may swap its
    entries between the check and the removal), or None."""
    try:
        st = os.stat(parent)
    except OSError:
        return None  # nothing there: nothing to sweep
    if st.st_uid not in (0, os.geteuid()):
        return f"it belongs to {user_name(st.st_uid)}, not you"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return (f"other users may write it and it is not sticky (mode "
                f"{stat.S_IMODE(st.st_mode):04o})")
    return None


def _not_ours(child: Path) -> str | None:
    """Why ``child`` is not a run directory of this user's that wheelforge made, or None."""
    st = os.lstat(child)
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory (a link is never followed)"
    if st.st_uid != os.geteuid():
        return f"it belongs to {user_name(st.st_uid)}: wheelforge removes only your own"
    try:
        lock = os.lstat(child / RUN_LOCK)
    except FileNotFoundError:
        return ("no run lock in it: not made by wheelforge, or by one older than the "
                "lock (remove it yourself if it is yours to remove)")
    if not stat.S_ISREG(lock.st_mode) or lock.st_uid != os.geteuid():
        return f"its {RUN_LOCK} is not a plain file of yours: not made by wheelforge"
    return None


def _remove_if_free(child: Path, dry_run: bool) -> tuple[str | None, int]:
    """Remove ``child`` when no process holds its lock (the lock read, never written nor
    created): (None, its size), else (why it was kept, 0)."""
    lock = child / RUN_LOCK
    try:
        fd, mine = open_lock(lock, create=False)
    except ConfigError as exc:
        return f"{exc.what}: {exc.why}", 0
    try:
        if not mine:
            return f"its {RUN_LOCK} is not a plain file of yours: not made by wheelforge", 0
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return f"in use by {lock_holder(lock)}", 0
        size = _size(child)
        if not dry_run:  # under the lock: no run can claim it while it goes
            shutil.rmtree(child, ignore_errors=True)
        return None, size
    finally:
        os.close(fd)


def sweep(places: Iterable[tuple[Path, str]], *, dry_run: bool = False) -> Swept:
    """Remove every run directory in ``places`` (a parent directory, and the glob its run
    directories' names match) whose run is gone: a directory of this user's, marked by
    this user's run lock, which no process holds.  A directory whose lock another process
    holds is kept, with its holder; so is one wheelforge cannot prove it made, with why,
    and every directory of a parent :func:`unsafe_parent` refuses."""
    removed: list[tuple[Path, int]] = []
    kept: list[tuple[Path, str]] = []
    for parent, match in places:
        try:
            children = sorted(parent.glob(match))
        except OSError:
            continue
        refused = unsafe_parent(parent) if children else None
        for child in children:
            size = 0
            try:
                why = refused and f"wheelforge removes nothing under {parent}: {refused}"
                why = why or _not_ours(child)
                if why is None:
                    why, size = _remove_if_free(child, dry_run)
            except OSError as exc:
                why = f"cannot be examined: {exc.strerror or exc}"
            if why is None:
                removed.append((child, size))
            else:
                kept.append((child, why))
    return Swept(removed=tuple(removed), kept=tuple(kept))
