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
  rewriting).  The directory is held under a lock (two builds of one recipe version by
  one user, or in one command, take turns) and removed at the end of the build;
  after a failure the tree is moved into the kept work directory first.  ``BUILD_ROOT``
  is ``/tmp/wheelforge-build-UID``: the user's own (0700, under parents no other user may
  rearrange), so no other user can enter, block or read a build; the price is that
  builders agree byte for byte only when they run under the same user id.
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
* **The source files' dates.**  nvcc's ``-lineinfo`` writes each source file's
  modification time into the device code's line table, so a file a patch rewrote was
  dated by the build.  After the patches, every file of the tree newer than
  ``SOURCE_DATE_EPOCH`` is dated at it (``_fs.date_tree``).  The headers wheelforge
  installs (torch's in a managed environment, a managed toolkit's) are dated at
  ``_fs.ZIP_EPOCH``; a system toolkit's and a ``--python`` environment's keep their own
  dates (docs/reproducible.md: remaining differences).
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

from ... import _fs, _proc
from ..._fs import owned_lock, user_name
from ...errors import SourceError, ToolchainError
from ..compiling.toolchain import nvcc_help

__all__ = ["BUILD_ROOT", "BUILD_ROOT_PREFIX", "MIN_EPOCH", "NVCC_OBJTEMP", "NVCC_RANDOM_SEED",
           "SCHEME", "UMASK", "FixedPaths", "build_root", "describe_epoch", "fixed_paths",
           "nvcc_flags", "private_root", "source_date_epoch", "umask"]

#: How a wheel is made reproducible; part of the build key: wheels built before (at
#: per-run paths, dated at build time; at the shared /tmp/wheelforge-build before
#: fixed-paths-4; with patched sources and installed headers dated when they were written,
#: which ``-lineinfo`` puts in the device code, before fixed-paths-5) are another binary,
#: rebuilt once.
SCHEME = "fixed-paths-5"
#: Where builders compile, ``/tmp/wheelforge-build-UID``: the same path on every machine
#: for one user id, so the same bytes; a directory of that user's alone (mode 0700), so
#: that no other user of the machine can enter, block or read a build.
BUILD_ROOT_PREFIX = "/tmp/wheelforge-build-"


def build_root(uid: int | None = None) -> Path:
    """The build root of user ``uid`` (this process's effective one by default)."""
    return Path(f"{BUILD_ROOT_PREFIX}{os.geteuid() if uid is None else uid}")


#: This process's build root (:func:`build_root`).
BUILD_ROOT = build_root()
#: The umask of the compile (bdist_wheel records the permission bits it leaves).
UMASK = 0o022
#: 1980-01-01: a zip member cannot be dated earlier.
MIN_EPOCH = _fs.ZIP_EPOCH
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


def _refuse(path: Path, what: str, why: str, fix: str) -> ToolchainError:
    return ToolchainError(f"the build root {path} {what}", why=why, fix=fix)


def _check_parents(root: Path) -> None:
    """Every directory above ``root`` is root's or this user's, and one that others may
    write is sticky (as /tmp is): else another user could swap ``root`` under the build."""
    real = Path(os.path.realpath(root.parent))
    for directory in (*reversed(real.parents), real):
        st = os.lstat(directory)
        if st.st_uid not in (0, os.geteuid()):
            raise _refuse(root, f"is under {directory}, which belongs to {user_name(st.st_uid)}",
                          why="its owner could replace the build root, and with it the "
                              "source that is compiled and published",
                          fix=f"build where every directory above the build root is root's "
                              f"or yours (the default is {build_root()})")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise _refuse(root, f"is under {directory}, which other users may write and "
                                f"which is not sticky (mode {stat.S_IMODE(st.st_mode):04o})",
                          why="any user could rename the build root away and put their own "
                              "in its place",
                          fix=f"make {directory} sticky (chmod +t {directory}) or not "
                              "writable by others")


def private_root(root: Path) -> None:
    """``root`` as a directory of this user's that no other user may enter (made 0700 when
    missing), under parents that no other user may rearrange; a link there, another
    user's directory, or one others may write is refused with what to do (one of this
    user's that others may only read is made 0700)."""
    _check_parents(root)
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    st = os.lstat(root)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise _refuse(root, "is not a directory (a link or a file is there)",
                      why="wheelforge compiles in a private directory it makes there; it "
                          "never follows a link someone else may have put in its place",
                      fix=f"remove {root}, then build again")
    if st.st_uid != os.geteuid():
        raise _refuse(root, f"belongs to {user_name(st.st_uid)}, not to you",
                      why="another user made it first: they could change the source under "
                          "your build (your build would run and publish their code) or hold "
                          "its locks",
                      fix=f"have it removed (as root: rm -rf {root}); wheelforge makes it "
                          "again, mode 0700")
    if st.st_mode & 0o022:
        raise _refuse(root, f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})",
                      why="other users could have put their own files in it, or change the "
                          "source being built",
                      fix=f"remove {root} (it is made again, mode 0700), then build again")
    if st.st_mode & 0o077:
        os.chmod(root, 0o700)  # readable by others: no longer (nothing can be in it of theirs)


def _own_directory(path: Path, mode: int) -> None:
    """``path`` as a directory (made with ``mode`` if missing); a link or another user's
    directory there is refused: the build must not write where someone else points it."""
    try:
        os.mkdir(path, mode)
        os.chmod(path, mode)  # the umask took bits away
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ToolchainError(
            f"the fixed build path {path} is not a directory of this user",
            why="wheelforge compiles every recipe version at a fixed path, so that two builders "
                "produce the same bytes; something else is there",
            fix=f"remove {path}, then build again")


_TAKEN: set[Path] = set()  # the fixed paths that builds of this process hold
_TAKEN_CHANGED = threading.Condition()


@contextlib.contextmanager
def _in_this_process(path: Path, on_busy: Callable[[str], None] | None) -> Iterator[None]:
    """Hold ``path`` among the builds of this process (the nightly's cells at once; two of
    one recipe version take turns).  The file lock cannot tell them apart: it is
    re-entrant within a process, so that the nightly's key lock may be taken again by
    the build it runs."""
    holder = f"another build of this command (pid {os.getpid()})"
    start = report = time.monotonic()
    with _TAKEN_CHANGED:
        while path in _TAKEN:
            if _proc.stopping():
                raise KeyboardInterrupt
            if on_busy is not None and time.monotonic() >= report:  # at once, then again
                waited = time.monotonic() - start
                on_busy(holder + (f"; waiting {waited:.0f}s so far" if waited >= 1 else ""))
                report = time.monotonic() + _fs.WAIT_REPORT_S
            _TAKEN_CHANGED.wait(0.2)
        _TAKEN.add(path)
    try:
        yield
    finally:
        with _TAKEN_CHANGED:
            _TAKEN.discard(path)
            _TAKEN_CHANGED.notify_all()


@contextlib.contextmanager
def fixed_paths(slot: str, root: Path | None = None,
                on_busy: Callable[[str], None] | None = None) -> Iterator[FixedPaths]:
    """Hold ``ROOT/SLOT`` (``NAME-VERSION``) for this build: locked, emptied, removed at
    the end (:meth:`FixedPaths.keep` saves the tree of a failed build first).  ``ROOT``
    (:func:`build_root` unless given) is this user's alone: :func:`private_root`."""
    if not slot or "/" in slot or slot.startswith("."):
        raise ValueError(f"not a fixed build path name: {slot!r}")
    root = build_root() if root is None else root
    private_root(root)  # no other user can enter, block or read it
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
