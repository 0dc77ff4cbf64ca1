"""Read and rewrite wheels: local version label, torch pin, dropped requirements, RECORD.

A wheel is rewritten into a new file; the input is never modified.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import os
import stat
import time
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, parse_tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import _zip
from ._fs import TMP_PREFIX
from .errors import VerifyError


@dataclass(frozen=True)
class WheelInfo:
    path: Path
    name: str
    version: Version
    tags: tuple[str, ...]
    dist_info: str

    @property
    def pure(self) -> bool:
        return all(t.endswith("-none-any") for t in self.tags)


def tag_runs_on(tag: Tag, python_tag: str) -> bool:
    """Whether the CPython of ``python_tag`` (``cp311``) runs a wheel of ``tag``: a tag for
    it or for ``py3``, or a ``cpXY-abi3`` tag with X.Y no newer than it (the stable ABI:
    one wheel for CPython X.Y and every later one)."""
    if tag.interpreter in (python_tag, "py3"):
        return True
    have, need = _cpython_minor(python_tag), _cpython_minor(tag.interpreter)
    return tag.abi == "abi3" and have is not None and need is not None and need <= have


def interpreter_fits(filename: str, python_tag: str) -> bool:
    """Whether the wheel ``filename`` installs into the CPython of ``python_tag``
    (:func:`tag_runs_on` for one of its tags)."""
    return any(tag_runs_on(t, python_tag) for t in parse_wheel_filename(filename)[3])


def _cpython_minor(tag: str) -> int | None:
    return int(tag[3:]) if tag.startswith("cp3") and tag[3:].isdigit() else None


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


#: Errors that reading a broken zip raises, besides OSError.
_BROKEN_ZIP = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError,
               UnicodeDecodeError, KeyError, ValueError)


@contextlib.contextmanager
def reading(path: Path) -> Iterator[zipfile.ZipFile]:
    """Open a wheel's zip; any read failure (not a zip, truncated, a bad CRC, an unknown
    compression) is a VerifyError naming the wheel."""
    try:
        with zipfile.ZipFile(path) as zf:
            yield zf
    except VerifyError:
        raise
    except (OSError, *_BROKEN_ZIP) as exc:
        raise VerifyError(f"cannot read {path.name}", why=f"{type(exc).__name__}: {exc}",
                          fix="the file is not a complete wheel (a zip): rebuild it") from None


def member_problems(infos: Iterable[zipfile.ZipInfo]) -> list[str]:
    """What makes a wheel's member list unsafe to install, one line per member: absolute
    names, ``..``, backslashes, empty or control-character names, names given twice,
    symlinks and other special files (by the zip's Unix mode bits)."""
    problems: list[str] = []
    seen: set[str] = set()
    for zi in infos:
        name = zi.filename
        parts = name.rstrip("/").split("/")
        if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
            problems.append(f"{name!r}: an absolute path")
        elif "\\" in name:
            problems.append(f"{name!r}: a backslash in the name (a Windows path)")
        elif ".." in parts:
            problems.append(f"{name!r}: a '..' component")
        elif any(p in ("", ".") for p in parts):
            problems.append(f"{name!r}: an empty or '.' path component")
        elif any(ord(c) < 0x20 or c == "\x7f" for c in name):
            problems.append(f"{name!r}: a control character in the name")
        if name in seen:
            problems.append(f"{name!r}: the wheel holds this name twice")
        seen.add(name)
        kind = stat.S_IFMT(zi.external_attr >> 16)
        if kind == stat.S_IFLNK:
            problems.append(f"{name!r}: a symlink (installers would write its target as a "
                            "file, or follow it)")
        elif kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            problems.append(f"{name!r}: a special file (mode {oct(zi.external_attr >> 16)})")
    return problems


def inspect_wheel(path: Path) -> WheelInfo:
    """Parse the file name, check every member name and find the one .dist-info directory;
    a VerifyError naming the member for anything malformed."""
    fix = "the wheel is malformed or hostile: do not publish it; read the build log"
    try:
        name, version, _build, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise VerifyError(f"{path.name} is not a valid wheel file name", why=str(exc),
                          fix="a wheel is NAME-VERSION(-BUILD)-PYTHON-ABI-PLATFORM.whl") from None
    with reading(path) as zf:
        infos = zf.infolist()
        problems = member_problems(infos)
        names = {zi.filename for zi in infos}
        texts = {zi.filename: zf.read(zi) for zi in infos if zi.filename.count("/") == 1
                 and zi.filename.endswith((".dist-info/METADATA", ".dist-info/WHEEL"))
                 and zi.file_size <= 16 << 20}  # bounded: metadata is small
    for member, data in sorted(texts.items()):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(f"{member} is not UTF-8 (byte offset {exc.start})")
    dist_infos = sorted({n.split("/", 1)[0] for n in names
                         if n.split("/", 1)[0].endswith(".dist-info")})
    if len(dist_infos) != 1:
        found = ", ".join(dist_infos) or "none"
        problems.append(f"{len(dist_infos)} .dist-info directories ({found}), expected exactly 1")
    else:
        dist_info = dist_infos[0]
        di_name, _, di_version = dist_info[: -len(".dist-info")].rpartition("-")
        try:
            same = canonicalize_name(di_name) == name and Version(di_version) == version
        except InvalidVersion:
            same = False
        if not same:
            problems.append(f"{dist_info!r}: does not match the file name's {name} {version}")
        for required in ("METADATA", "WHEEL", "RECORD"):
            if f"{dist_info}/{required}" not in names:
                problems.append(f"{dist_info}/{required} is missing")
    if problems:
        raise VerifyError(f"{path.name} is not a valid wheel ({len(problems)} problem(s))",
                          why="\n    " + "\n    ".join(problems), fix=fix)
    return WheelInfo(path, str(name), version, tuple(sorted(str(t) for t in tags)),
                     dist_infos[0])


def read_metadata(path: Path) -> bytes:
    info = inspect_wheel(path)
    with reading(path) as zf:
        return zf.read(f"{info.dist_info}/METADATA")


def _hash_member(zf: zipfile.ZipFile, name: str) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with zf.open(name) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode(), size


def record_problems(path: Path) -> list[str]:
    """Every file must be in RECORD with the right hash and size, and vice versa."""
    info = inspect_wheel(path)
    problems: list[str] = []
    record_name = f"{info.dist_info}/RECORD"
    with reading(path) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        try:
            rows = list(csv.reader(io.StringIO(zf.read(record_name).decode("utf-8"))))
        except (UnicodeDecodeError, csv.Error) as exc:
            return [f"{record_name} is not a UTF-8 CSV file: {exc}"]
        listed: dict[str, tuple[str, str]] = {}
        for row in rows:
            if not row:
                continue
            if len(row) != 3:
                problems.append(f"RECORD row {row!r} does not have 3 fields")
                continue
            if row[0] in listed:
                problems.append(f"RECORD lists {row[0]!r} twice")
            listed[row[0]] = (row[1], row[2])
        for name in names:
            if name == record_name:
                continue
            if name not in listed:
                problems.append(f"{name} is not listed in RECORD")
                continue
            actual_hash, actual_size = _hash_member(zf, name)
            want_hash, want_size = listed[name]
            if want_hash != actual_hash:
                problems.append(f"{name}: hash in RECORD does not match the file")
            if want_size and (not want_size.isdigit() or int(want_size) != actual_size):
                problems.append(f"{name}: size in RECORD ({want_size}) is not {actual_size}")
        for name in listed:
            if name not in names:
                problems.append(f"RECORD lists {name}, which the wheel does not contain")
    return problems


def _header_fields(text: str) -> dict[str, list[str]]:
    """The ``Key: value`` lines of an email-header file (WHEEL, METADATA's head)."""
    fields: dict[str, list[str]] = {}
    for line in text.partition("\n\n")[0].splitlines():
        key, sep, value = line.partition(":")
        if sep and not line[:1].isspace():
            fields.setdefault(key.strip().lower(), []).append(value.strip())
    return fields


def integrity_problems(path: Path) -> list[str]:
    """What a publisher refuses in a wheel it did not build itself, one line each (the
    zip and its member names are checked first: :func:`inspect_wheel` raises on those):
    RECORD hashes and sizes, the WHEEL file's tags against the file name's, METADATA's
    Name and Version against the file name's, a ``*.libs/`` directory of grafted
    libraries (wheelforge never grafts: torch and CUDA provide them)."""
    info = inspect_wheel(path)
    problems = record_problems(path)
    with reading(path) as zf:
        wheel_text = zf.read(f"{info.dist_info}/WHEEL").decode("utf-8", "replace")
        meta_text = zf.read(f"{info.dist_info}/METADATA").decode("utf-8", "replace")
        tops = sorted({n.split("/", 1)[0] for n in zf.namelist() if "/" in n})
    wheel_fields = _header_fields(wheel_text)
    declared = sorted(wheel_fields.get("tag", []))
    try:
        expanded = sorted(str(t) for d in declared for t in parse_tag(d))
    except ValueError as exc:
        problems.append(f"{info.dist_info}/WHEEL: a Tag is not parseable: {exc}")
        expanded = declared
    if not declared:
        problems.append(f"{info.dist_info}/WHEEL has no Tag line")
    elif expanded != list(info.tags):
        problems.append(f"{info.dist_info}/WHEEL says Tag {', '.join(declared)}, the file "
                        f"name says {', '.join(info.tags)}")
    meta = _header_fields(meta_text)
    meta_name = (meta.get("name") or [""])[0]
    if canonicalize_name(meta_name) != canonicalize_name(info.name):
        problems.append(f"METADATA Name is {meta_name!r}, the file name says {info.name!r}")
    meta_version = (meta.get("version") or [""])[0]
    try:
        same_version = Version(meta_version) == info.version
    except InvalidVersion:
        same_version = False
    if not same_version:
        problems.append(f"METADATA Version is {meta_version!r}, the file name says "
                        f"{info.version}")
    problems.extend(f"{top}/: a directory of grafted libraries (auditwheel repair's "
                    "*.libs): torch and CUDA provide them, none may be vendored"
                    for top in tops if top.endswith(".libs"))
    return problems


def check_wheel(path: Path) -> WheelInfo:
    """:func:`integrity_problems`, all of them in one VerifyError; the wheel's info."""
    info = inspect_wheel(path)
    problems = integrity_problems(path)
    if problems:
        raise VerifyError(f"{path.name} failed verification ({len(problems)} problem(s)); "
                          "it was not published",
                          why="\n    " + "\n    ".join(problems),
                          fix="the file is not the wheel that was built (changed, truncated "
                              "or malformed): rebuild it; never edit a wheel by hand")
    return info


def _text(path: Path, member: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VerifyError(f"{path.name}: {member} is not UTF-8", why=str(exc),
                          fix="the build backend wrote broken metadata; read the build log"
                          ) from None


def _rewrite_metadata(text: str, version: str, torch_pin: str | None,
                      drop: Iterable[str], pins: Mapping[str, str] | None = None) -> str:
    head, sep, body = text.partition("\n\n")
    drop_set = {str(canonicalize_name(d)) for d in drop}
    pin_map = {str(canonicalize_name(n)): v for n, v in (pins or {}).items()}
    pinned_always: set[str] = set()
    out: list[str] = []
    saw_torch = False
    for line in head.split("\n"):
        if line.startswith("Version:"):
            out.append(f"Version: {version}")
            continue
        if line.startswith("Requires-Dist:"):
            value = line.split(":", 1)[1].strip()
            try:
                req = Requirement(value)
            except InvalidRequirement:
                out.append(line)
                continue
            cname = canonicalize_name(req.name)
            if cname in drop_set:
                continue
            if cname in pin_map:
                # a companion: exactly the build published beside this one (under its extra
                # too); PyPI refuses local versions, so only the index can satisfy the pin
                marker = f"; {req.marker}" if req.marker else ""
                if req.marker is None:
                    pinned_always.add(cname)
                out.append(f"Requires-Dist: {cname}=={pin_map[cname]}{marker}")
                continue
            if cname == "torch" and torch_pin is not None:
                saw_torch = True
                marker = f"; {req.marker}" if req.marker else ""
                out.append(f"Requires-Dist: torch{''.join(f'[{e}]' for e in sorted(req.extras))}"
                           f"{torch_pin}{marker}")
                continue
        out.append(line)
    if torch_pin is not None and not saw_torch:
        out.append(f"Requires-Dist: torch{torch_pin}")
    for pname, pinned in sorted(pin_map.items()):
        if pname not in pinned_always:
            out.append(f"Requires-Dist: {pname}=={pinned}")
    return "\n".join(out) + sep + body


def _rewrite_build(text: str, build_tag: str | None, platform: str | None = None) -> str:
    """The WHEEL file with its ``Build`` field set to ``build_tag`` (None: no field) and,
    with ``platform``, the platform part of each ``Tag`` replaced."""
    lines = [line for line in text.splitlines() if not line.startswith("Build:")]
    if platform:
        lines = [f"Tag: {line.split(':', 1)[1].strip().rsplit('-', 1)[0]}-{platform}"
                 if line.startswith("Tag:") else line for line in lines]
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join([*lines, *([f"Build: {build_tag}"] if build_tag else [])]) + "\n"


def labeled_version(public: str, local: str) -> str:
    """The version :func:`relabel` gives a wheel of version ``public``: ``public+local``."""
    return f"{public}+{local}" if local else public


def wheel_version(wheel: Path) -> str:
    """The version in a wheel's file name, normalized (local label included)."""
    return str(parse_wheel_filename(wheel.name)[1])


def relabeled_name(wheel_name: str, local: str, build_tag: str | None = None,
                   platform: str | None = None) -> str:
    """The file name :func:`relabel` gives a wheel, without writing anything."""
    _name, version, _build, _tags = parse_wheel_filename(wheel_name)
    new_version = labeled_version(version.public, local)
    tags = wheel_name[:-4].split("-")[-3:]
    if platform:
        tags[-1] = platform
    build = [build_tag] if build_tag else []
    return f"{wheel_name.split('-', 1)[0]}-{'-'.join([new_version, *build, *tags])}.whl"


def relabel(
    path: Path,
    out_dir: Path,
    *,
    local: str,
    torch_pin: str | None,
    drop_requires: Iterable[str] = (),
    build_tag: str | None = None,
    pins: Mapping[str, str] | None = None,
    platform: str | None = None,
    files: Mapping[str, bytes] | None = None,
    epoch: int = 0,
) -> Path:
    """Write a copy of the wheel with version ``V+local``, pins and a fresh RECORD.

    ``build_tag`` (PEP 427, e.g. ``"1"``) goes into the file name and the WHEEL file's
    ``Build`` field: it tells a rebuild of the same version and tags from the first
    build, and installers prefer the highest.  ``pins`` (name -> exact version) become
    ``Requires-Dist: name==version``: the companions built for the same target.
    ``platform`` (e.g. ``manylinux_2_34_x86_64``) replaces the platform tag of the file
    name and of the WHEEL file's ``Tag`` lines; None keeps the wheel's.  ``files`` (paths
    relative to the .dist-info directory: the SBOM) are added as :func:`add_files` adds
    them, dated ``epoch``, in the same pass: the bytes are those of the relabel followed
    by :func:`add_files`, with every member written once (a large extension's deflating
    is seconds of one core; :mod:`wheelforge._zip` deflates it on every core).
    """
    info = inspect_wheel(path)
    new_version = labeled_version(info.version.public, local)
    dist_name = info.dist_info[: -len(".dist-info")].rsplit("-", 1)[0]
    new_dist_info = f"{dist_name}-{new_version}.dist-info"
    old_prefix = info.dist_info + "/"
    entries: list[tuple[zipfile.ZipInfo, bytes]] = []
    with reading(path) as zf:
        for zi in zf.infolist():
            if zi.is_dir():
                continue
            data = zf.read(zi)
            name = zi.filename
            if name.startswith(old_prefix):
                rel = name[len(old_prefix):]
                if rel == "RECORD":
                    continue
                name = f"{new_dist_info}/{rel}"
                if rel == "METADATA":
                    data = _rewrite_metadata(_text(path, name, data), new_version, torch_pin,
                                             drop_requires, pins).encode("utf-8")
                elif rel == "WHEEL" and (build_tag or platform or b"\nBuild:" in data):
                    data = _rewrite_build(_text(path, name, data), build_tag,
                                          platform).encode("utf-8")
            new = zipfile.ZipInfo(name, date_time=zi.date_time)
            new.external_attr = zi.external_attr
            new.compress_type = zipfile.ZIP_DEFLATED
            entries.append((new, data))
    # dist-info last, RECORD very last (the conventional order installers expect)
    entries.sort(key=lambda e: (e[0].filename.startswith(new_dist_info + "/"), e[0].filename))
    record_name = f"{new_dist_info}/RECORD"
    record_date = entries[0][0].date_time if entries else (1980, 1, 1, 0, 0, 0)
    if files:
        entries = [e for e in entries if e[0].filename[len(new_dist_info) + 1:] not in files]
        entries.extend(_added(files, new_dist_info, record_name, path.name, epoch))
        record_date = zip_date(epoch)
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for zi, data in entries:
        writer.writerow([zi.filename, record_hash(data), len(data)])
    writer.writerow([record_name, "", ""])
    out_name = relabeled_name(path.name, local, build_tag, platform)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / out_name
    tmp = out_dir / f"{TMP_PREFIX}{out_name}"
    rzi = zipfile.ZipInfo(record_name, date_time=record_date)
    rzi.external_attr = 0o644 << 16
    rzi.compress_type = zipfile.ZIP_DEFLATED
    _zip.write(tmp, [*entries, (rzi, record.getvalue().encode("utf-8"))])
    os.replace(tmp, final)
    return final


def zip_date(epoch: int) -> tuple[int, int, int, int, int, int]:
    """A zip member's date_time for a SOURCE_DATE_EPOCH (UTC; zip cannot go before 1980)."""
    moment = time.gmtime(max(epoch, 315532800))
    return (moment.tm_year, moment.tm_mon, moment.tm_mday, moment.tm_hour, moment.tm_min,
            moment.tm_sec)


def _added(files: Mapping[str, bytes], dist_info: str, record_name: str, wheel: str,
           epoch: int) -> list[tuple[zipfile.ZipInfo, bytes]]:
    """The members :func:`add_files` and :func:`relabel` add: ``files`` (relative to
    ``dist_info``) dated ``epoch``, in name order; a name that is unsafe or RECORD is a
    VerifyError."""
    out = []
    for rel, data in sorted(files.items()):
        name = f"{dist_info}/{rel}"
        problems = member_problems([zipfile.ZipInfo(name)])
        if problems or name == record_name:
            raise VerifyError(f"cannot add {name} to {wheel}",
                              why="; ".join(problems) or "RECORD is written, not added",
                              fix="name a file inside the .dist-info directory")
        zi = zipfile.ZipInfo(name, date_time=zip_date(epoch))
        zi.external_attr = 0o644 << 16
        zi.compress_type = zipfile.ZIP_DEFLATED
        out.append((zi, data))
    return out


def add_files(path: Path, files: Mapping[str, bytes], *, epoch: int) -> Path:
    """Add (or replace) ``files`` (paths relative to the .dist-info directory, e.g.
    ``sboms/wheelforge.cdx.json``) to the wheel at ``path``, in place and atomically.

    The other members keep their order, dates, modes and bytes; the new ones go after
    them, before RECORD, dated ``epoch``; RECORD gets a hash and size line for each.  The
    same input gives the same bytes."""
    info = inspect_wheel(path)
    record_name = f"{info.dist_info}/RECORD"
    added = _added(files, info.dist_info, record_name, path.name, epoch)
    names = {zi.filename for zi, _ in added}
    entries: list[tuple[zipfile.ZipInfo, bytes]] = []
    with reading(path) as zf:
        rows = [row for row in csv.reader(io.StringIO(zf.read(record_name).decode("utf-8")))
                if row and row[0] not in names and row[0] != record_name]
        for zi in zf.infolist():
            if zi.filename != record_name and zi.filename not in names:
                entries.append((zi, zf.read(zi)))
    date = zip_date(epoch)
    for zi, data in added:
        entries.append((zi, data))
        rows.append([zi.filename, record_hash(data), str(len(data))])
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    writer.writerows([*rows, [record_name, "", ""]])
    rzi = zipfile.ZipInfo(record_name, date_time=date)
    rzi.external_attr = 0o644 << 16
    rzi.compress_type = zipfile.ZIP_DEFLATED
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}")
    _zip.write(tmp, [*entries, (rzi, record.getvalue().encode("utf-8"))])
    os.replace(tmp, path)
    return path


def read_dist_info_file(path: Path, rel: str) -> bytes | None:
    """A file of the wheel's .dist-info directory (``rel`` relative to it), or None."""
    info = inspect_wheel(path)
    with reading(path) as zf:
        try:
            return zf.read(f"{info.dist_info}/{rel}")
        except KeyError:
            return None


def retag(path: Path, out_dir: Path, build_tag: str | None) -> Path:
    """A copy of a wheel with another build number (PEP 427 build tag), its version and
    requirements unchanged: the file name, the WHEEL file's ``Build`` field and RECORD."""
    info = inspect_wheel(path)
    return relabel(path, out_dir, local=info.version.local or "", torch_pin=None,
                   build_tag=build_tag)
