"""Extract a source archive (an sdist's tar or zip, a git source's tar), safely and bounded.

wheelforge writes every member itself instead of trusting ``extractall``:

* bounds (:class:`~wheelforge.recipe.model.ExtractLimits`, raised per recipe with ``extract:``)
  on the bytes written in all, the member count and the bytes of one member, enforced
  while writing: the bytes actually written are counted, the sizes an archive declares
  are not trusted (they only make an archive that declares too much fail at once, from
  a first pass over the headers, before anything is written);
* every member lies inside the archive's single top-level directory (an sdist's
  ``NAME-VERSION/``); absolute names, ``..``, backslashes and members given twice are
  refused, and nothing is written through a symlink (each directory on the way is
  checked, the file itself is opened with O_NOFOLLOW | O_EXCL);
* links stay inside the tree (checked when made, and every link resolved once more
  at the end); devices, FIFOs and other special files are refused; modes are reduced
  to ``rwxr-xr-x`` at most.

Every problem, a truncated or corrupt archive included, is a SourceError naming the
archive and the member; on failure nothing extracted is left behind.
"""

from __future__ import annotations

import lzma
import os
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ..._fs import escaping_links
from ...errors import SourceError
from ...recipe.model import ExtractLimits

_CHUNK = 1 << 20
#: What reading a broken tar, gzip, bzip2, xz or zip stream raises, besides OSError.
_BROKEN = (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError,
           ValueError, NotImplementedError, RuntimeError, UnicodeDecodeError)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


class _Refused(Exception):
    """A member wheelforge will not extract; becomes a SourceError naming it."""

    def __init__(self, member: str, why: str, fix: str = ""):
        super().__init__(why)
        self.member = member
        self.why = why
        self.fix = fix


class _Writer:
    """Writes members under ``root``, keeping the counts and the top-level directory."""

    def __init__(self, root: Path, limits: ExtractLimits):
        self.root = root
        self.limits = limits
        self.members = 0
        self.written = 0
        self.top: str | None = None
        self.current = ""
        self.files: set[str] = set()  # regular files and links written, by relative path
        self.links: set[str] = set()  # the symlinks among them
        self.dirs: set[str] = set()  # directories known to be real (not links)

    # -- names ------------------------------------------------------------------------
    def parts(self, name: str) -> list[str] | None:
        """The checked components of a member name; None for the archive root itself."""
        self.current = name
        self.members += 1
        if self.members > self.limits.max_members:
            self.too_many(name)
        if "\\" in name:
            raise _Refused(name, "the name holds a backslash (a Windows path)")
        if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
            raise _Refused(name, "the name is an absolute path")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise _Refused(name, "the name has a '..' component")
        if not parts:
            return None
        return parts

    def too_many(self, name: str) -> None:
        raise _Refused(name, f"the archive holds more than {self.limits.max_members:,} members "
                             "(extract.max-members)",
                       "if the source really is this large, raise extract.max-members in the "
                       "recipe")

    def place(self, parts: list[str], *, is_dir: bool) -> str:
        """Check ``parts`` against the single top-level directory; the relative path."""
        name = self.current
        if len(parts) == 1 and not is_dir:
            raise _Refused(name, "a file at the top level: an sdist holds exactly one "
                                 "top-level directory (NAME-VERSION/) and everything in it")
        if self.top is None:
            self.top = parts[0]
        elif parts[0] != self.top:
            raise _Refused(name, f"a second top-level directory beside {self.top}/: an sdist "
                                 "holds exactly one")
        rel = "/".join(parts)
        if rel in self.files or (not is_dir and rel in self.dirs):
            raise _Refused(name, "the archive holds this name twice")
        return rel

    def declared(self, name: str, size: int, total: int) -> None:
        """Refuse at once what the archive itself declares too large (before anything is
        written); the bytes actually written are counted again while extracting."""
        self.current = name
        self.grow(size, total)

    def grow(self, member: int, total: int) -> None:
        limit = self.limits
        if member > limit.max_member_bytes:
            raise _Refused(self.current, f"the member is larger than "
                                         f"{_size(limit.max_member_bytes)} "
                                         "(extract.max-member-bytes)",
                           "if the source really holds a file this large, raise "
                           "extract.max-member-bytes in the recipe")
        if total > limit.max_bytes:
            raise _Refused(self.current, f"the archive unpacks to more than "
                                         f"{_size(limit.max_bytes)} (extract.max-bytes)",
                           "if the source really is this large, raise extract.max-bytes in "
                           "the recipe")

    # -- writing ----------------------------------------------------------------------
    def directory(self, rel: str) -> str:
        """Make ``rel`` and its parents as real directories; the absolute path."""
        path = ""
        for part in rel.split("/"):
            path = f"{path}/{part}" if path else part
            if path in self.dirs:
                continue
            full = os.path.join(self.root, path)
            try:
                os.mkdir(full, 0o755)
            except FileExistsError:
                st = os.lstat(full)
                if stat.S_ISLNK(st.st_mode):
                    raise _Refused(self.current, f"it would be written through the link "
                                                 f"{path}") from None
                if not stat.S_ISDIR(st.st_mode):
                    raise _Refused(self.current, f"{path} is a file, not a directory") from None
            self.dirs.add(path)
        return os.path.join(self.root, rel)

    def file(self, rel: str, source: IO[bytes], mode: int) -> None:
        parent, _, base = rel.rpartition("/")
        full = os.path.join(self.directory(parent), base)
        self.files.add(rel)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        size = 0
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(_CHUNK):
                size += len(chunk)
                self.written += len(chunk)
                self.grow(size, self.written)
                out.write(chunk)
            os.fchmod(out.fileno(), (mode & 0o755) | 0o600)

    def symlink(self, rel: str, target: str) -> None:
        parent, _, base = rel.rpartition("/")
        if not target or target.startswith("/") or "\\" in target or "\0" in target:
            raise _Refused(self.current, f"a link to {target!r}: links must be relative and "
                                         "stay inside the tree")
        resolved = os.path.normpath(os.path.join(parent, target))
        if resolved == ".." or resolved.startswith("../") or \
                resolved.split("/", 1)[0] != self.top:
            raise _Refused(self.current, f"a link to {target!r}, which leaves the tree")
        full = os.path.join(self.directory(parent), base)
        self.files.add(rel)
        self.links.add(rel)
        os.symlink(target, full)

    def hardlink(self, rel: str, target: str) -> None:
        """A hard link is written as a copy of the file it names (extracted before it)."""
        parts = [p for p in target.split("/") if p not in ("", ".")]
        link = "/".join(parts)
        if target.startswith("/") or ".." in parts or link not in self.files or \
                link in self.links:
            raise _Refused(self.current, f"a hard link to {target!r}, which is not a file "
                                         "extracted before it")
        src = os.path.join(self.root, link)
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as inp:
            self.file(rel, inp, os.fstat(inp.fileno()).st_mode)


def _tar_declared(archive: Path, w: _Writer) -> None:
    """A first pass over the headers only (cheap: nothing is written), so that an archive
    declaring too many members or bytes fails before anything is written."""
    total = 0
    with tarfile.open(archive, mode="r:*") as tf:
        for count, m in enumerate(tf, start=1):
            w.current = m.name
            if count > w.limits.max_members:
                w.too_many(m.name)
            total += m.size
            w.declared(m.name, m.size, total)


def _tar(archive: Path, w: _Writer) -> None:
    _tar_declared(archive, w)
    with tarfile.open(archive, mode="r:*") as tf:
        for m in tf:
            parts = w.parts(m.name)
            if parts is None:
                continue
            if m.isdir():
                w.directory(w.place(parts, is_dir=True))
            elif m.isreg():
                rel = w.place(parts, is_dir=False)
                src = tf.extractfile(m)
                assert src is not None
                with src:
                    w.file(rel, src, m.mode)
            elif m.issym():
                w.symlink(w.place(parts, is_dir=False), m.linkname)
            elif m.islnk():
                w.hardlink(w.place(parts, is_dir=False), m.linkname)
            else:
                kind = ("a character device" if m.ischr() else "a block device" if m.isblk()
                        else "a FIFO" if m.isfifo() else f"a special member (type {m.type!r})")
                raise _Refused(m.name, f"{kind}: an sdist holds files, directories and links")
        # read the compressed stream to its end, so that its checksum (gzip's CRC, xz's
        # check) is verified: tarfile stops at the end-of-archive marker
        stream = tf.fileobj
        left = w.limits.max_bytes
        while stream is not None and left > 0 and (chunk := stream.read(_CHUNK)):
            left -= len(chunk)


def _zip(archive: Path, w: _Writer) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        if len(infos) > w.limits.max_members:  # the central directory says so: stop now
            w.too_many(infos[w.limits.max_members].filename)
        total = 0
        for info in infos:
            total += info.file_size
            w.declared(info.filename, info.file_size, total)
        for info in infos:
            parts = w.parts(info.filename)
            if parts is None:
                continue
            mode = info.external_attr >> 16
            kind = stat.S_IFMT(mode)
            if info.is_dir() or kind == stat.S_IFDIR:
                w.directory(w.place(parts, is_dir=True))
            elif kind == stat.S_IFLNK:
                with zf.open(info) as src:
                    target = src.read(4097)
                if len(target) > 4096:
                    raise _Refused(info.filename, "a link with a target longer than 4096 bytes")
                w.symlink(w.place(parts, is_dir=False), target.decode("utf-8"))
            elif kind in (0, stat.S_IFREG):
                rel = w.place(parts, is_dir=False)
                with zf.open(info) as src:
                    w.file(rel, src, stat.S_IMODE(mode) or 0o644)
            else:
                raise _Refused(info.filename, "a device, FIFO or socket: an sdist holds files, "
                                              "directories and links")


def extract(archive: Path, dest: Path, limits: ExtractLimits | None = None) -> Path:
    """Extract ``archive`` into the new or empty directory ``dest``; return the project root,
    the archive's single top-level directory."""
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ValueError(f"{dest} is not empty")
    root = dest.resolve()
    w = _Writer(root, limits or ExtractLimits())
    fix = ("the archive is broken or malicious: do not build it; check the file and the "
           "recipe's pin against upstream")
    try:
        reader: Callable[[Path, _Writer], None] = _zip if zipfile.is_zipfile(archive) else _tar
        reader(archive, w)
        if w.top is None:
            raise _Refused("", "the archive is empty")
        out = escaping_links(root)
        if out:
            raise _Refused(out[0][0], f"a link that resolves outside the tree ({out[0][1]})")
    except _Refused as exc:
        _clear(dest)
        member = f" member {exc.member!r}" if exc.member else ""
        raise SourceError(f"{archive.name}: refused{member}", why=exc.why,
                          fix=exc.fix or fix) from None
    except (OSError, *_BROKEN) as exc:
        _clear(dest)
        at = f" at member {w.current!r}" if w.current else ""
        raise SourceError(f"cannot extract {archive.name}{at}",
                          why=f"{type(exc).__name__}: {exc} (truncated or corrupt archive?)",
                          fix=f"{fix}; to fetch it again, delete {archive}") from None
    except BaseException:
        _clear(dest)
        raise
    return dest / w.top


def _clear(dest: Path) -> None:
    for entry in list(dest.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


__all__ = ["extract"]
