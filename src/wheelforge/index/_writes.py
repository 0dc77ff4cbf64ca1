"""Atomic writes of many files at once (temp file, fsync, rename, directory fsync), and
an OSError of a write as the PublishError that names the path, the cause and the fix."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import TypeVar

from .._fs import discard, fsync_path, make_dirs, read_file, temp_file
from ..errors import PublishError
from .records import _CHUNKS_PER_THREAD, _WRITE_THREADS


class PartialWrite(OSError):
    """A batch write failed after some of its files were renamed into place (the cause is
    ``__cause__``); a failure that renamed nothing is raised as it is."""


#: What is written: the bytes, or a file whose contents are copied (a wheel).
Data = bytes | Path


def _write_all(items: Sequence[tuple[Path, Data]]) -> None:
    """Atomic writes of many files, skipping those whose bytes are unchanged.

    The atomic_write protocol, for many files at once: each file is written to a
    temp file in its directory and fsynced; only when every temp file is durable are
    they renamed over their targets, in ``items`` order, so that a reader never
    follows a link to a page that is not there yet (a crash before that leaves only
    temp files, which the next writer sweeps); then the directories are fsynced, and
    the parents of the directories made here, so that the renames are durable too.
    Everything that needs space is written before the first rename: a full disk, a
    quota or a read-only filesystem fails the batch with nothing renamed and no temp
    file left.  A failure after the first rename is raised as :class:`PartialWrite`.

    The writes run in threads, in chunks of consecutive items: an fsync mostly waits
    for the disk, and the threads overlap those waits (and share the kernel's work of
    creating files between the cores).  Each file is fsynced through its own
    descriptor right after it is written: on the ext4 of our machines, writing 3,500
    pages first and making them durable afterwards with one sync() measured two to
    four times slower, and a sync() would also flush everything else on the machine.
    """
    chunks = _chunked(items)
    if not chunks:
        return
    with ThreadPoolExecutor(max_workers=min(_WRITE_THREADS, len(chunks))) as pool:
        made: list[str] = []  # appended to by every thread
        futures = [pool.submit(_write_temps, chunk, made) for chunk in chunks]
        wait(futures)
        written: list[tuple[str, str]] = []  # (temp file, target), in items order
        errors = [e for e in (f.exception() for f in futures) if e is not None]
        for future in futures:
            if future.exception() is None:
                written += future.result()
        renamed = 0
        try:
            if errors:
                raise errors[0]
            for tmp, path in written:
                os.replace(tmp, path)
                renamed += 1
        except BaseException as exc:
            for tmp, _path in written[renamed:]:
                discard(tmp)
            if renamed and isinstance(exc, OSError):
                raise PartialWrite(exc.errno, exc.strerror, exc.filename) from exc
            for directory in sorted(made, reverse=True):  # nothing renamed: undo the mkdirs
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
            raise
        durable = {os.path.dirname(path) for _tmp, path in written}
        durable.update(os.path.dirname(d) for d in made)
        list(pool.map(_fsync_all, _chunked(sorted(durable))))


_T = TypeVar("_T")


def _chunked(items: Sequence[_T]) -> list[Sequence[_T]]:
    """``items`` cut into runs of consecutive items, a few per writer thread."""
    size = max(1, -(-len(items) // (_WRITE_THREADS * _CHUNKS_PER_THREAD)))
    return [items[i:i + size] for i in range(0, len(items), size)]


def _write_temps(items: Sequence[tuple[Path, Data]], made: list[str]) -> list[tuple[str, str]]:
    """Write each item whose bytes changed to a durable temp file beside its target,
    making the directory when needed (appended to ``made``); return the (temp file,
    target) pairs.  On failure, the temp files written so far are removed."""
    written: list[tuple[str, str]] = []
    ready: set[str] = set()
    try:
        for target, data in items:
            path = os.fspath(target)
            if _unchanged(path, data):
                continue  # no rewrite, no fsync, mtime kept for HTTP caches
            directory = os.path.dirname(path)
            if directory not in ready:
                make_dirs(directory, made)
                ready.add(directory)
            with temp_file(directory) as (f, tmp):
                if isinstance(data, Path):
                    with open(data, "rb") as source:
                        shutil.copyfileobj(source, f, 1 << 20)
                else:
                    f.write(data)
            written.append((tmp, path))
    except BaseException:
        for tmp, _path in written:
            discard(tmp)
        raise
    return written


def _unchanged(path: str, data: Data) -> bool:
    if isinstance(data, Path):
        return False
    try:
        return os.stat(path).st_size == len(data) and read_file(path) == data
    except OSError:
        return False


def _fsync_all(paths: Iterable[str]) -> None:
    for path in paths:
        fsync_path(path)


@contextlib.contextmanager
def _index_errors(index_dir: Path, doing: str) -> Iterator[None]:
    """An OSError (a full disk, a read-only filesystem, no permission, a file where a
    directory should be) as a PublishError naming the path, the cause and the fix."""
    try:
        yield
    except OSError as exc:
        raise disk_error(exc, f"cannot {doing} {index_dir}", index_dir) from None


def disk_error(exc: OSError, what: str, where: Path | None = None) -> PublishError:
    """``exc`` as a PublishError: ``what`` failed, the path (``where`` when the error
    names none) and the cause, and the fix."""
    import errno

    path = exc.filename or where or "?"
    cause = exc.strerror or str(exc)
    fixes = {
        errno.ENOSPC: f"free space on the filesystem of {path} (df -h), then run the "
                      "command again",
        errno.EDQUOT: f"free space within your disk quota for {path}, then run the command "
                      "again",
        errno.EROFS: "remount the filesystem read-write, or use another directory",
        errno.EACCES: f"give this user write access to {path}, or use another directory",
        errno.EPERM: f"give this user write access to {path}, or use another directory",
        errno.ENOTDIR: f"a file stands where a directory belongs on the path {path}: move "
                       "it away, or use another directory",
        errno.EEXIST: f"a file stands where a directory belongs: {path}; move it away",
        errno.EISDIR: f"a directory stands where a file belongs: {path}; move it away",
    }
    fix = fixes.get(exc.errno or 0, "check the path and its filesystem, then run the command "
                                    "again")
    return PublishError(what, why=f"{path}: {cause}; nothing was left half-written", fix=fix)
