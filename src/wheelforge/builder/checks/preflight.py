"""Checks before a compile that the build's results can be written: write access to the
index, the cache and the work directory, and free space for the wheel.

A build that cannot publish should say so before it compiles, not after.  The free
space needed is the size of the recipe's last published wheel (from the index records)
times a margin; a recipe never built before needs only a small floor.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ...errors import PublishError
from ..config import BuildConfig

#: Free space wanted beyond the expected wheel: pages, records, the copy into files/.
FLOOR_BYTES = 1 << 20
#: The wheel is written twice on the index's filesystem at worst (temp copy, then the
#: relabelled copy in the work directory when that shares the filesystem).
MARGIN = 2


def _existing(path: Path) -> Path:
    """``path``, or its nearest existing ancestor (what a mkdir -p would write into)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def writable_dir(path: Path, what: str) -> None:
    """PublishError unless ``path`` is (or can be made) a directory this process can
    write into."""
    found = _existing(path)
    if not found.is_dir():
        raise PublishError(
            f"the {what} {path} is not a directory",
            why=f"{found} is a file",
            fix=f"move the file away, or pass another {what} directory")
    if not os.access(found, os.W_OK | os.X_OK):
        cause = "read-only filesystem" if _read_only(found) else "permission denied"
        raise PublishError(
            f"cannot write to the {what} {path}",
            why=f"{found}: {cause}",
            fix=("remount it read-write, or pass another directory" if cause.startswith("read")
                 else f"give this user ({_user()}) write access to {found}, or pass another "
                      "directory"))
    if _read_only(found):
        raise PublishError(f"cannot write to the {what} {path}",
                           why=f"{found}: read-only filesystem",
                           fix="remount it read-write, or pass another directory")


def free_space(path: Path, needed: int, what: str) -> None:
    """PublishError unless the filesystem of ``path`` has ``needed`` bytes free."""
    found = _existing(path)
    try:
        free = shutil.disk_usage(found).free
    except OSError:
        return
    if free < needed:
        raise PublishError(
            f"not enough free space for the {what} {path}",
            why=f"{_mib(free)} free on the filesystem of {found}, {_mib(needed)} needed "
                "(the size of the last wheel of this recipe, twice, plus 1 MiB)",
            fix="free some space there, or pass another directory; nothing was compiled")


def expected_wheel_size(index_dir: Path, recipe: str) -> int:
    """The size of the largest published wheel of ``recipe``, 0 when none is published
    (file names and sizes only: no record is read)."""
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    wanted = canonicalize_name(recipe)
    largest = 0
    try:
        with os.scandir(Path(index_dir) / "files") as found:
            for entry in found:
                if not entry.name.endswith(".whl"):
                    continue
                try:
                    if parse_wheel_filename(entry.name)[0] == wanted:
                        largest = max(largest, entry.stat().st_size)
                except (InvalidWheelFilename, OSError):
                    continue
    except OSError:
        return 0
    return largest


def check_writable(config: BuildConfig, recipe: str) -> None:
    """Before the compile: the index, cache and work directory can be written, and the
    index and work directory have room for the wheel."""
    writable_dir(config.index_dir, "index")
    writable_dir(config.cache_dir, "cache")
    writable_dir(config.work_dir, "work directory")
    needed = MARGIN * expected_wheel_size(config.index_dir, recipe) + FLOOR_BYTES
    free_space(config.index_dir, needed, "index")
    free_space(config.work_dir, needed, "work directory")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
