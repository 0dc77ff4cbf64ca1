"""Reproducible bytes: one build key gives one wheel, wherever and whenever it is built.

What varies between two builds of one key, and what fixes it (docs/reproducible.md):

* **The build paths.**  The source tree is compiled at a fixed path,
  ``BUILD_ROOT/NAME-VERSION/src/TOP`` (a real directory: nvcc hashes the *resolved*
  absolute path of a unit into the names of anonymous-namespace kernels, so neither a
  symlink nor a prefix map can stand in for it), and the build environment is reached
  through the link ``BUILD_ROOT/NAME-VERSION/env``: Python takes ``sys.prefix`` from the
  path it was started by, so torch's include directories, and with them every path g++
  and nvcc record (``-g``, ``__FILE__`` in ``TORCH_CHECK``, ``-lineinfo``), are the same
  whatever the work directory and the cache root.  The path is per recipe and version,
  not per build key: a key that changes only ``setup.py`` (another patch) compiles its
  units with the same command lines, so the compile cache serves them, and what it
  serves is byte for byte what the compiler would write there (no base-directory
  rewriting).  The directory is held under a lock (two builds of one recipe version on
  one machine, or in one command, take turns) and removed at the end of the build;
  after a failure the tree is moved into the kept work directory first.
* **The date.**  ``SOURCE_DATE_EPOCH`` is the newest member date of the source archive
  (an sdist's files; a git archive's members carry the commit time), whatever the
  environment says; setuptools/wheel date the zip members from it, the SBOM too.
* **The file modes.**  The compile runs under umask 022: bdist_wheel records each file's
  permission bits, and the built ``.so`` and metadata files take them from the umask.
* **nvcc's temporary names.**  nvcc names a unit's intermediate files
  ``tmpxft_<pid>_...`` and the host object keeps that name (its ``FILE`` symbol, the
  ``_GLOBAL__sub_I_`` static initialiser); ``-objtemp`` (``--objdir-as-tempdir``) names
  them after the object file, in its directory.  It is added to torch's nvcc command
  (``PYTORCH_NVCC``, on the command line, where the compile cache hashes it) when the
  nvcc knows it.
* **nvcc's random numbers.**  The names nvcc makes for internal device symbols end in a
  number drawn from its process id (``cuda::std``'s ``begin`` in a kernel template:
  ``_ZN40_INTERNAL_3d44cd64_4_s_cu_86120bfa_315244cuda3std...``), in the cubin of the
  fatbin; ``--frandom-seed=1`` fixes it, on the same command line.
* **The order.**  wheel sorts the members; the relabel keeps the dist-info last and
  RECORD very last (``wheel.relabel``).

Pure data and small context managers; nothing here runs a compiler.
"""

from __future__ import annotations

import calendar
import contextlib
import os
import shutil
import stat
import tarfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ... import _proc
from ..._fs import owned_lock
from ...errors import SourceError, ToolchainError
from ..compiling.toolchain import nvcc_help

__all__ = ["BUILD_ROOT", "MIN_EPOCH", "NVCC_OBJTEMP", "NVCC_RANDOM_SEED", "SCHEME", "UMASK",
           "FixedPaths", "describe_epoch", "fixed_paths", "nvcc_flags", "source_date_epoch",
           "umask"]

#: How a wheel is made reproducible; part of the build key: wheels built before (at
#: per-run paths, dated at build time) are another binary, rebuilt once.
SCHEME = "fixed-paths-3"
#: Where every builder compiles: the same path on every machine, so the same bytes.
BUILD_ROOT = Path("/tmp/wheelforge-build")
#: The umask of the compile (bdist_wheel records the permission bits it leaves).
UMASK = 0o022
#: 1980-01-01: a zip member cannot be dated earlier.
MIN_EPOCH = 315532800
#: nvcc's option that names intermediate files after the object, not ``tmpxft_<pid>``.
NVCC_OBJTEMP = "--objdir-as-tempdir"
#: nvcc's option that seeds the number it puts in the names of internal device symbols
#: (``_INTERNAL_<path hash>_<len>_<file>_<hash>_<number>``, e.g. the customization point
#: objects of ``cuda::std`` a kernel template uses), else taken from its process id.
#: A number: nvcc reads a string seed as garbage (measured: ``7ffc7afe``).
NVCC_RANDOM_SEED = ("--frandom-seed", "1")


def nvcc_flags(nvcc: Path) -> tuple[str, ...]:
    """The options that make ``nvcc``'s output independent of its process id, those this
    nvcc lists in its help (CUDA 13.0 lists both): ``-objtemp`` and a fixed random seed."""
    text = nvcc_help(nvcc)
    seed, number = NVCC_RANDOM_SEED
    return ((NVCC_OBJTEMP,) if NVCC_OBJTEMP in text else ()) + \
        ((f"{seed}={number}",) if seed in text else ())


def source_date_epoch(archive: Path) -> int:
    """The newest member date of ``archive`` (tar or zip) as a Unix time, at least 1980.

    An sdist's members carry its files' dates; a ``git archive`` of a commit dates every
    member with the commit time.  The archive file's own date (when it was downloaded) is
    never used."""
    newest = 0
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                for zi in zf.infolist():  # zip dates carry no zone: read as UTC
                    newest = max(newest, calendar.timegm((*zi.date_time, 0, 0, 0)))
        else:
            with tarfile.open(archive, mode="r:*") as tf:
                for member in tf:
                    newest = max(newest, int(member.mtime))
    except (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile, ValueError) as exc:
        raise SourceError(f"cannot extract {archive.name} at member dates",
                          why=f"{type(exc).__name__}: {exc}",
                          fix="the archive is damaged or truncated: remove it from the "
                              "cache or sources directory and fetch it again") from None
    return max(newest, MIN_EPOCH)


def describe_epoch(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


_UMASK_LOCK = threading.Lock()
_UMASK_HELD: list[int] = []  # the caller's umask while builds run under ours


@contextlib.contextmanager
def umask(mask: int = UMASK) -> Iterator[None]:
    """Run the body (and the processes it starts) under ``mask``.  The umask is the
    process's: builds running at once in threads share it, and the caller's comes back
    when the last of them ends."""
    with _UMASK_LOCK:
        old = os.umask(mask)
        if not _UMASK_HELD:
            _UMASK_HELD.append(old)
        else:
            _UMASK_HELD.append(_UMASK_HELD[0])
    try:
        yield
    finally:
        with _UMASK_LOCK:
            caller = _UMASK_HELD.pop()
            if not _UMASK_HELD:
                os.umask(caller)


@dataclass(frozen=True)
class FixedPaths:
    """The fixed paths of one recipe version: ``src`` (the directory the source is extracted
    into) and ``env`` (the link to the build environment, made by :meth:`link_env`)."""

    root: Path

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def env(self) -> Path:
        return self.root / "env"

    @property
    def tmp(self) -> Path:
        """The build's TMPDIR (made by :func:`fixed_paths`): nvcc's temporary files, which a
        stopped nvcc leaves behind, go with the fixed path instead of into the user's
        TMPDIR, and under a path that is the same for every build."""
        return self.root / "tmp"

    def link_env(self, python: Path) -> Path:
        """The interpreter ``python`` of a venv, started through the fixed link to its
        venv; ``python`` itself when it is not in a venv (its paths are then its own)."""
        venv = python.parent.parent
        if not (venv / "pyvenv.cfg").is_file():
            return python
        with contextlib.suppress(FileNotFoundError):
            self.env.unlink()
        self.env.symlink_to(venv.resolve(), target_is_directory=True)
        return self.env / python.parent.name / python.name

    def keep(self, work: Path) -> None:
        """Move the source tree of a failed build into ``work/src`` (the work directory
        the failure message names); nothing when it is not there."""
        if self.src.is_dir() and not os.path.lexists(work / "src"):
            with contextlib.suppress(OSError):
                shutil.move(self.src, work / "src")


def _own_directory(path: Path, mode: int) -> None:
    """``path`` as a directory (made with ``mode`` if missing); a link or another user's
    directory there is refused: the build must not write where someone else points it."""
    try:
        os.mkdir(path, mode)
        os.chmod(path, mode)  # the umask took bits away
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or (mode != 0o1777 and st.st_uid != os.getuid()):
        raise ToolchainError(
            f"the fixed build path {path} is not a directory of this user",
            why="wheelforge compiles every recipe version at a fixed path, so that two builders "
                "produce the same bytes; something else is there",
            fix=f"remove {path} (or ask its owner to), then build again")


_TAKEN: set[Path] = set()  # the fixed paths that builds of this process hold
_TAKEN_CHANGED = threading.Condition()


@contextlib.contextmanager
def _in_this_process(path: Path, on_busy: Callable[[str], None] | None) -> Iterator[None]:
    """Hold ``path`` among the builds of this process (the nightly's cells at once; two of
    one recipe version take turns).  The file lock cannot tell them apart: it is
    re-entrant within a process, so that the nightly's key lock may be taken again by
    the build it runs."""
    with _TAKEN_CHANGED:
        if path in _TAKEN and on_busy is not None:
            on_busy(f"another build of this command (pid {os.getpid()})")
        while path in _TAKEN:
            if _proc.stopping():
                raise KeyboardInterrupt
            _TAKEN_CHANGED.wait(0.2)
        _TAKEN.add(path)
    try:
        yield
    finally:
        with _TAKEN_CHANGED:
            _TAKEN.discard(path)
            _TAKEN_CHANGED.notify_all()


@contextlib.contextmanager
def fixed_paths(slot: str, root: Path = BUILD_ROOT,
                on_busy: Callable[[str], None] | None = None) -> Iterator[FixedPaths]:
    """Hold ``ROOT/SLOT`` (``NAME-VERSION``) for this build: locked, emptied, removed at
    the end (:meth:`FixedPaths.keep` saves the tree of a failed build first)."""
    if not slot or "/" in slot or slot.startswith("."):
        raise ValueError(f"not a fixed build path name: {slot!r}")
    _own_directory(root, 0o1777)  # shared by the machine's users, like /tmp
    here = FixedPaths(root / slot)
    with _in_this_process(here.root, on_busy), owned_lock(root / f"{slot}.lock",
                                                          on_busy=on_busy):
        if os.path.lexists(here.root):
            _own_directory(here.root, 0o755)
            shutil.rmtree(here.root)
        _own_directory(here.root, 0o755)
        try:
            here.tmp.mkdir()
            yield here
        finally:
            shutil.rmtree(here.root, ignore_errors=True)
