"""Scratch directories of runs (a build's source tree and wheel, a stack check's venv): each
run holds a lock inside its own directory for as long as it lives, so that
``wheelforge clean`` removes what failed or killed runs left and never a live run's.

A build keeps its directory when it fails (the message says where, for reading the
tree); a run killed with SIGKILL leaves its directory too.  The lock is an advisory
``flock`` that the kernel drops when the process dies, whatever killed it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ._fs import lock_holder, owned_lock

#: the lock file a run holds inside its scratch directory
RUN_LOCK = ".wheelforge-run.lock"
#: a directory without a lock (a wheelforge older than the lock, or one that had just
#: been made when the lock was taken) is removed only when untouched this long
UNLOCKED_GRACE_S = 3600


@contextlib.contextmanager
def claim(directory: Path) -> Iterator[None]:
    """Hold ``directory`` as this run's for the duration (its lock, inside it)."""
    with owned_lock(directory / RUN_LOCK):
        yield


@dataclass(frozen=True)
class Swept:
    removed: tuple[tuple[Path, int], ...]  # (directory, bytes)
    kept: tuple[tuple[Path, str], ...]  # (directory, why: in use by ..., too recent)


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def sweep(places: Iterable[tuple[Path, str]], *, dry_run: bool = False,
          now: float | None = None) -> Swept:
    """Remove every run directory in ``places`` (a parent directory, and the glob its run
    directories' names match) whose run is gone: its lock is free, or it has no lock and
    was not touched for :data:`UNLOCKED_GRACE_S`.  A directory whose lock another process
    holds is kept, with its holder."""
    removed: list[tuple[Path, int]] = []
    kept: list[tuple[Path, str]] = []
    now = time.time() if now is None else now
    for parent, match in places:
        try:
            children = sorted(p for p in parent.glob(match)
                              if p.is_dir() and not p.is_symlink())
        except OSError:
            continue
        for child in children:
            lock = child / RUN_LOCK
            if lock.is_file():
                with owned_lock(lock, wait=False) as mine:
                    if not mine:
                        kept.append((child, f"in use by {lock_holder(lock)}"))
                        continue
                    removed.append((child, _size(child)))
                    if not dry_run:
                        shutil.rmtree(child, ignore_errors=True)
                continue
            try:
                age = now - child.stat().st_mtime
            except OSError:
                continue
            if age < UNLOCKED_GRACE_S:
                kept.append((child, "no run lock, changed in the last hour: perhaps starting"))
                continue
            removed.append((child, _size(child)))
            if not dry_run:
                shutil.rmtree(child, ignore_errors=True)
    return Swept(removed=tuple(removed), kept=tuple(kept))
