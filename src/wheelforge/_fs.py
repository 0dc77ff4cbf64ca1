"""Filesystem primitives: atomic writes, locks, hashing."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

TMP_PREFIX = ".wf-tmp-"


@functools.cache
def file_mode() -> int:
    """The mode a plain ``open()`` would give a new file (0666 less the umask).

    mkstemp creates 0600, which would keep a web server or pip running as another user
    from reading the index."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory (a directory: so that a rename in it is durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """Yield a temp file beside ``path``; on success it is fsynced and renamed to ``path``,
    so ``path`` is never seen half-written.  On failure the temp file is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_path(path.parent)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` via a temp file, fsync and rename."""
    with atomic_file(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def atomic_copy(src: Path, dest: Path) -> None:
    """Copy ``src`` to ``dest`` so that ``dest`` is never seen half-written."""
    with atomic_file(dest) as out, open(src, "rb") as inp:
        shutil.copyfileobj(inp, out, 1 << 20)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def sweep_temp_files(directory: Path) -> int:
    """Remove temp files left by an interrupted atomic write; return the count."""
    removed = 0
    if not directory.is_dir():
        return 0
    for p in directory.rglob(TMP_PREFIX + "*"):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            removed += 1
    return removed
