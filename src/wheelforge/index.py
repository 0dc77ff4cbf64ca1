"""The local package index: publish wheels atomically and immutably, and
generate PEP 503 / PEP 691 simple pages from what is on disk.

Layout of an index directory::

    <index>/files/<wheel>               the wheels; immutable once published
    <index>/files/<wheel>.metadata      PEP 658 core metadata: the wheel's METADATA bytes, exactly
    <index>/files/<wheel>.wf.json       sidecar record (WheelRecord): the truth the pages are
                                        generated from, together with the files
    <index>/simple/index.html           PEP 503 root page (every project)
    <index>/simple/index.json           PEP 691 JSON root
    <index>/simple/<project>/index.html, index.json
                                        one project (name normalized per PEP 503), every wheel
    <index>/<channel>/simple/...        one build target ("channel", e.g. cu130-torch2.14): the
                                        same pages, holding only that channel's wheels plus the
                                        channel-less pure wheels; links are relative
                                        (../../../files/<wheel>), so file:// and any web server work
    <index>/index.html                  landing page: one table of every wheel, for people
    <index>/.records/<project>.cache    derived cache: the project's rendered page fragments and
                                        landing-page rows
    <index>/.records/_summary.json      derived cache: each project's channels and file-set digest
    <index>/.records/_writing           present while a change is in progress
    <index>/.lock                       held by every writer (the HTTP server takes no lock)

Everything under ``.records`` is derived and may be deleted at any time.

Point pip or uv at ``<index>/<channel>/simple/`` (or ``<index>/simple/`` for
everything) as ``--index-url``, either as a ``file://`` URL or served by any
static web server or by :func:`make_server`.

Rules:

* A published file never changes.  Publishing the same bytes again is a no-op;
  different bytes under a published name are refused.
* Writes are atomic (temp file in the same directory, fsync, rename), in the
  order wheel, ``.metadata``, sidecar, caches, project pages, root pages,
  landing page.  A crash at any point leaves the old pages valid.  Every
  change holds ``.records/_writing`` while it writes; when the next writer
  finds it left behind, it sweeps the temp files (``.wf-tmp-*``) and rebuilds
  every page from the files before doing its own work.  A wheel without a
  sidecar (a publish killed before its sidecar, or a file copied in by hand)
  gets a record derived from the wheel itself, without a build target;
  publishing the same bytes with a target completes that record.
* A publish lists ``files/`` once (no wheel is re-read or re-hashed), loads
  only the published project's cache (of the other caches it reads only the
  landing-page rows), re-renders only the new wheel's fragments and rewrites
  only the pages whose bytes change: that project's pages, its channel pages,
  the root pages when the project is new, and the landing page.  The caches
  are checked against the file names in ``files/``; a project whose names
  disagree is reloaded from its sidecars.
* :func:`rebuild` regenerates every page from ``files/`` and the sidecars, and
  removes pages no file supports any more.  It trusts each sidecar's sha256
  (only the size is checked against the file) instead of re-hashing every
  wheel; a wheel without a sidecar is hashed and gets one.
* Channel pages list the wheels published with that channel plus the
  channel-less *pure* wheels (ABI ``none``, platform ``any``).  A channel-less
  platform wheel appears only in the top-level ``simple/``.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import hashlib
import html
import http.server
import json
import os
import re
import shutil
import socket
import urllib.parse
import zipfile
import zlib
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from email.utils import formatdate
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from packaging.metadata import parse_email
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag
from packaging.utils import (
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from . import consumer
from ._fs import (
    TMP_PREFIX,
    atomic_copy,
    atomic_write,
    discard,
    fsync_path,
    locked,
    make_dirs,
    read_file,
    sha256_file,
    sweep_temp_files,
    temp_file,
)
from .errors import PublishError

__all__ = [
    "PublishResult",
    "WheelRecord",
    "channel_name",
    "from_json",
    "load_records",
    "make_server",
    "publish",
    "rebuild",
    "remove",
    "set_tested",
    "to_json",
    "unyank",
    "yank",
]

API_VERSION = "1.1"
FILES_DIR = "files"
SIMPLE_DIR = "simple"
CACHE_DIR = ".records"
LOCK_FILE = ".lock"
SIDECAR_SUFFIX = ".wf.json"
METADATA_SUFFIX = ".metadata"
JSON_CONTENT_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_CONTENT_TYPE = "application/vnd.pypi.simple.v1+html"

_SCHEMA = 1  # of the sidecar
_CACHE_SCHEMA = 4  # of the .records caches; bump whenever the page templates change
_WRITE_THREADS = 16  # _write_all: an fsync mostly waits for the disk (8, 16, 32, 64 measured)
_CHUNKS_PER_THREAD = 4
_SUMMARY_FILE = "_summary.json"  # '_' cannot start a normalized project name
_WRITING = "_writing"  # present while a change is in progress
CONSTRAINTS_FILE = consumer.CONSTRAINTS_FILE  # beside simple/: consumer.constraints_text
REPORTS_DIR = "reports"  # nightly build reports (wheelforge.nightly); linked from the landing page
NIGHTLY_REPORT = "nightly-latest.html"
_RESERVED_CHANNELS = frozenset({FILES_DIR, SIMPLE_DIR, REPORTS_DIR, "index.html", "index.json"})
_CHANNEL_RE = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")
_ARCH_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\Z")
_SHA256_RE = re.compile(r"[0-9a-f]{64}\Z")
_REBUILD_FIX = "delete the sidecar (files/<wheel>.wf.json) and rebuild the index to re-derive it"


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, kw_only=True)
class WheelRecord:
    """One published wheel, as stored in its sidecar ``files/<wheel>.wf.json``.

    ``yanked`` is None when the file is not yanked, else the reason ("" for
    none given).  ``tested`` is a free-form test result.  ``metadata_sha256``
    (the hash of ``files/<wheel>.metadata``) and ``summary`` (from METADATA)
    are kept so that pages never have to open the wheel or its metadata.
    """

    filename: str
    project: NormalizedName
    version: str
    sha256: str
    size: int
    requires_python: str | None
    upload_time: str
    channel: str | None
    cuda: str | None
    torch: str | None
    archs: tuple[str, ...]
    build_key: str | None
    yanked: str | None = None
    tested: dict[str, Any] | None = None
    metadata_sha256: str | None = None
    summary: str | None = None


@dataclass(frozen=True, kw_only=True)
class PublishResult:
    path: Path
    record: WheelRecord
    noop: bool


def to_json(record: WheelRecord) -> str:
    """The sidecar text for ``record`` (stable key order, trailing newline)."""
    return json.dumps(_record_dict(record), indent=2, sort_keys=True) + "\n"


def from_json(text: str | bytes) -> WheelRecord:
    """Parse a sidecar; PublishError names every field that is wrong."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PublishError(
            "sidecar record is not valid JSON", why=str(exc), fix=_REBUILD_FIX
        ) from None
    return _record_from_dict(data)


def _record_dict(r: WheelRecord) -> dict[str, Any]:
    return {
        "schema": _SCHEMA,
        "filename": r.filename,
        "project": r.project,
        "version": r.version,
        "sha256": r.sha256,
        "size": r.size,
        "requires_python": r.requires_python,
        "upload_time": r.upload_time,
        "channel": r.channel,
        "cuda": r.cuda,
        "torch": r.torch,
        "archs": list(r.archs),
        "build_key": r.build_key,
        "yanked": r.yanked,
        "tested": r.tested,
        "metadata_sha256": r.metadata_sha256,
        "summary": r.summary,
    }


_TEXT_FIELDS = ("filename", "project", "version", "sha256", "upload_time")
_OPTIONAL_TEXT_FIELDS = ("requires_python", "channel", "cuda", "torch", "build_key", "yanked",
                         "metadata_sha256", "summary")


def _record_from_dict(data: Any) -> WheelRecord:
    if not isinstance(data, dict):
        raise PublishError("sidecar record is not a JSON object", fix=_REBUILD_FIX)
    # every check first, then the record straight from the checked values: a rebuild
    # comes here for every wheel
    problems = [
        f"{key}: expected a string, got {data.get(key)!r}"
        for key in _TEXT_FIELDS if not isinstance(data.get(key), str)
    ]
    problems += [
        f"{key}: expected a string, got {data[key]!r}"
        for key in _OPTIONAL_TEXT_FIELDS if not isinstance(data.get(key), (str, type(None)))
    ]
    if data.get("schema", _SCHEMA) != _SCHEMA:
        problems.append(f"schema: expected {_SCHEMA}, got {data.get('schema')!r}")
    project, sha, channel = data.get("project"), data.get("sha256"), data.get("channel")
    meta_sha = data.get("metadata_sha256")
    if isinstance(project, str) and project and canonicalize_name(project) != project:
        problems.append(f"project: {project!r} is not a normalized name")
    if isinstance(sha, str) and sha and not _SHA256_RE.match(sha):
        problems.append(f"sha256: {sha!r} is not a lowercase hex sha256")
    if isinstance(meta_sha, str) and meta_sha and not _SHA256_RE.match(meta_sha):
        problems.append(f"metadata_sha256: {meta_sha!r} is not a lowercase hex sha256")
    if isinstance(channel, str) and (
        not _CHANNEL_RE.match(channel) or channel in _RESERVED_CHANNELS
    ):
        problems.append(f"channel: {channel!r} is not a valid channel name")
    size = data.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        problems.append(f"size: expected a non-negative integer, got {size!r}")
    archs = data.get("archs", [])
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        problems.append(f"archs: expected a list of strings, got {archs!r}")
    tested = data.get("tested")
    if tested is not None and not isinstance(tested, dict):
        problems.append(f"tested: expected an object or null, got {tested!r}")
    if problems:
        raise PublishError("sidecar record is malformed", why="; ".join(problems), fix=_REBUILD_FIX)
    return WheelRecord(
        filename=data["filename"],
        project=NormalizedName(data["project"]),
        version=data["version"],
        sha256=data["sha256"],
        size=data["size"],
        requires_python=data.get("requires_python"),
        upload_time=data["upload_time"],
        channel=channel,
        cuda=data.get("cuda"),
        torch=data.get("torch"),
        archs=tuple(archs),
        build_key=data.get("build_key"),
        yanked=data.get("yanked"),
        tested=tested,
        metadata_sha256=meta_sha or None,
        summary=data.get("summary"),
    )


def channel_name(cuda: str, torch: str) -> str:
    """``("13.0", "2.14.1")`` -> ``"cu130-torch2.14"``."""
    c = _parse_version(cuda, "CUDA version").release + (0,)
    t = _parse_version(torch, "torch version").release + (0,)
    return f"cu{c[0]}{c[1]}-torch{t[0]}.{t[1]}"


def _parse_version(value: str, what: str) -> Version:
    try:
        return Version(value)
    except InvalidVersion:
        raise PublishError(
            f"{what} {value!r} is not a valid version",
            why="versions must follow PEP 440, e.g. 13.0 or 2.14.1",
            fix=f"pass the {what} as a dotted number",
        ) from None


def _now() -> str:
    return _iso(datetime.now(timezone.utc))


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --------------------------------------------------------------------------- wheels


class _WheelName(NamedTuple):
    project: NormalizedName
    version: Version
    tags: frozenset[Tag]
    version_text: str  # str(version), as a record holds it


@functools.lru_cache(maxsize=1 << 16)
def _parsed(filename: str) -> _WheelName:
    """parse_wheel_filename, memoized: a rebuild asks about each name several times."""
    name, version, _build, tags = parse_wheel_filename(filename)
    return _WheelName(name, version, tags, str(version))


def _sort_key(record: WheelRecord) -> tuple[Version, str]:
    return (_parsed(record.filename).version, record.filename)


def _is_pure(filename: str) -> bool:
    return all(t.abi == "none" and t.platform == "any" for t in _parsed(filename).tags)


@dataclass(frozen=True)
class _WheelInfo:
    project: NormalizedName
    version: Version
    metadata: bytes
    requires_python: str | None
    summary: str | None


def _inspect_wheel(path: Path) -> _WheelInfo:
    """Validate the file name and read METADATA; PublishError on any problem."""
    try:
        name, version, _tags, _text = _parsed(path.name)
    except InvalidWheelFilename as exc:
        raise PublishError(
            f"{path.name} is not a valid wheel file name",
            why=str(exc),
            fix="publish the file the build produced, under its original name",
        ) from None
    try:
        with zipfile.ZipFile(path) as zf:
            found = [
                n for n in zf.namelist()
                if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
            ]
            if len(found) != 1:
                raise PublishError(
                    f"{path.name} has {len(found)} .dist-info/METADATA files",
                    why="a wheel holds exactly one .dist-info directory with METADATA",
                    fix="rebuild the wheel; it is not a valid wheel",
                )
            metadata = zf.read(found[0])
    except (OSError, zipfile.BadZipFile, NotImplementedError, zlib.error) as exc:
        raise PublishError(
            f"cannot read {path}", why=str(exc), fix="check that the file is a complete wheel"
        ) from None
    raw, _unparsed = parse_email(metadata)
    problems = []
    meta_name = raw.get("name")
    if meta_name is None or canonicalize_name(meta_name) != name:
        problems.append(f"METADATA Name is {meta_name!r}, the file name says {name!r}")
    meta_version = raw.get("version")
    try:
        if meta_version is None or Version(meta_version) != version:
            problems.append(f"METADATA Version is {meta_version!r}, the file name says {version}")
    except InvalidVersion:
        problems.append(f"METADATA Version {meta_version!r} is not a valid version")
    requires_python = raw.get("requires_python")
    if requires_python is not None:
        try:
            SpecifierSet(requires_python)
        except InvalidSpecifier:
            problems.append(f"Requires-Python {requires_python!r} is not a valid specifier")
    if problems:
        raise PublishError(
            f"{path.name} has inconsistent metadata",
            why="; ".join(problems),
            fix="fix the wheel's METADATA (or its file name) and rebuild it",
        )
    return _WheelInfo(
        project=name,
        version=version,
        metadata=metadata,
        requires_python=requires_python,
        summary=raw.get("summary"),
    )


def _sidecar(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + SIDECAR_SUFFIX)


def _metadata_file(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + METADATA_SUFFIX)


def _read_sidecar(path: str | Path) -> WheelRecord:
    try:
        return from_json(read_file(path))
    except PublishError as exc:
        raise PublishError(f"{path}: {exc.what}", why=exc.why, fix=exc.fix) from None


def _derive(wheel: Path, *, write: bool) -> WheelRecord:
    """A channel-less record for a wheel that has no sidecar (and its files)."""
    info = _inspect_wheel(wheel)
    st = wheel.stat()
    record = WheelRecord(
        filename=wheel.name,
        project=info.project,
        version=str(info.version),
        sha256=sha256_file(wheel),
        size=st.st_size,
        requires_python=info.requires_python,
        upload_time=_iso(datetime.fromtimestamp(st.st_mtime, timezone.utc)),
        channel=None,
        cuda=None,
        torch=None,
        archs=(),
        build_key=None,
        metadata_sha256=hashlib.sha256(info.metadata).hexdigest(),
        summary=info.summary,
    )
    if write:
        atomic_write(_metadata_file(wheel), info.metadata)
        atomic_write(_sidecar(wheel), to_json(record))
    return record


def _load_record(files: Path, name: str, *, check_size: bool,
                 present: Container[str] | None = None) -> WheelRecord:
    """The sidecar record of the wheel ``files/name``, repaired or derived (the caller
    holds the lock).

    ``present``, the names in files/ when the caller has listed it, saves a
    stat per file.
    """
    # plain strings; a Path only where something is repaired: a rebuild comes here
    # for every wheel
    wheel = os.path.join(files, name)
    sidecar = wheel + SIDECAR_SUFFIX
    if present is not None and name + SIDECAR_SUFFIX not in present:
        return _derive(files / name, write=True)
    try:
        record = _read_sidecar(sidecar)
    except FileNotFoundError:
        return _derive(files / name, write=True)
    parsed = _parsed(name)
    if (record.filename, record.project, record.version) != (
        name, parsed.project, parsed.version_text
    ):
        raise PublishError(
            f"{sidecar} does not describe {name}",
            why=f"it names {record.filename!r}, project {record.project!r}, "
                f"version {record.version!r}; it was copied or edited by hand",
            fix=_REBUILD_FIX,
        )
    if check_size and (size := os.stat(wheel).st_size) != record.size:
        raise PublishError(
            f"{wheel} is {size} bytes, its sidecar says {record.size}",
            why="a published wheel was modified in place; published files are immutable",
            fix="restore the original file, or delete the wheel and its sidecar and publish "
                "again under a new build number",
        )
    if present is not None:
        has_metadata = name + METADATA_SUFFIX in present
    else:
        has_metadata = os.path.isfile(wheel + METADATA_SUFFIX)
    if not has_metadata:
        atomic_write(_metadata_file(files / name), _inspect_wheel(files / name).metadata)
        record = replace(record, metadata_sha256=None)
    if record.metadata_sha256 is None:
        record = replace(record, metadata_sha256=sha256_file(_metadata_file(files / name)))
        atomic_write(_sidecar(files / name), to_json(record))
    return record


@dataclass(frozen=True)
class _Listing:
    groups: dict[NormalizedName, list[str]]  # wheel names by project
    names: frozenset[str]  # every name in files/


def _scan(files: Path, *, strict: bool, sweep: bool) -> _Listing:
    """List ``files/``: wheel names grouped by project; sweeps temp files.

    The fast mode takes the project from the text before the first '-' (the
    wheel spec escapes '-' inside names), normalized once per distinct prefix;
    ``strict`` parses every name and reports those that are not wheels.  Every
    change lists files/ (three files per wheel), hence the comprehensions.
    """
    try:
        with os.scandir(files) as found:
            entries = list(found)
    except FileNotFoundError:
        return _Listing({}, frozenset())
    names = frozenset(e.name for e in entries if not e.name.startswith(TMP_PREFIX))
    if sweep and len(names) < len(entries):
        for entry in entries:
            if entry.name.startswith(TMP_PREFIX):
                discard(entry.path)
    wheels = [e.name for e in entries if e.name.endswith(".whl") and e.name in names
              and e.is_file()]
    groups: dict[NormalizedName, list[str]] = {}
    bad: list[str] = []
    if strict:
        for name in wheels:
            try:
                groups.setdefault(_parsed(name).project, []).append(name)
            except InvalidWheelFilename:
                bad.append(name)
    else:
        by_prefix: dict[str, list[str]] = {}
        for name in wheels:
            by_prefix.setdefault(name.partition("-")[0], []).append(name)
        for prefix, group in by_prefix.items():
            groups.setdefault(canonicalize_name(prefix), []).extend(group)
    if bad:
        raise PublishError(
            f"{len(bad)} file(s) in {files} are not valid wheel names: {', '.join(sorted(bad))}",
            why="every .whl in files/ is published; these cannot be parsed",
            fix="remove or rename them, then rebuild the index",
        )
    return _Listing(groups, names)


def _sweep_and_scan(index_dir: Path) -> _Listing:
    """Remove every temp file in the index, and list files/ strictly.  The walk leaves
    out files/, most of the index, because _scan sweeps it."""
    sweep_temp_files(index_dir, skip={FILES_DIR})
    return _scan(index_dir / FILES_DIR, strict=True, sweep=True)


def _marker(index_dir: Path) -> Path:
    return index_dir / CACHE_DIR / _WRITING


@contextlib.contextmanager
def _changing(index_dir: Path) -> Iterator[None]:
    """Mark the index as being changed for the duration (removed only on success).

    A marker left behind means a writer died half-way: temp files may lie
    anywhere and pages may lag behind the sidecars; _recover repairs both.
    """
    marker = _marker(index_dir)
    marker.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(marker, os.O_WRONLY | os.O_CREAT, 0o644))
    fsync_path(marker.parent)
    yield
    marker.unlink()


def _recover(index_dir: Path) -> None:
    """After an interrupted change (the marker is there): sweep and rebuild everything."""
    if not _marker(index_dir).exists():
        return
    _sync(index_dir, _sweep_and_scan(index_dir), {}, full=True)
    _marker(index_dir).unlink()


def _write_all(items: Sequence[tuple[Path, bytes]]) -> None:
    """Atomic writes of many files, skipping those whose bytes are unchanged.

    The atomic_write protocol, for many files at once: each file is written to a
    temp file in its directory and fsynced; only when every temp file is durable are
    they renamed over their targets, in ``items`` order, so that a reader never
    follows a link to a page that is not there yet (a crash before that leaves only
    temp files, which the next writer sweeps); then the directories are fsynced, and
    the parents of the directories made here, so that the renames are durable too.

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
        futures = [pool.submit(_write_temps, chunk) for chunk in chunks]
        wait(futures)
        written: list[tuple[str, str]] = []  # (temp file, target), in items order
        made: list[str] = []
        errors = [e for e in (f.exception() for f in futures) if e is not None]
        for future in futures:
            if future.exception() is None:
                temps, directories = future.result()
                written += temps
                made += directories
        renamed = 0
        try:
            if errors:
                raise errors[0]
            for tmp, path in written:
                os.replace(tmp, path)
                renamed += 1
        except BaseException:
            for tmp, _path in written[renamed:]:
                discard(tmp)
            raise
        durable = {os.path.dirname(path) for _tmp, path in written}
        durable.update(os.path.dirname(d) for d in made)
        list(pool.map(_fsync_all, _chunked(sorted(durable))))


_T = TypeVar("_T")


def _chunked(items: Sequence[_T]) -> list[Sequence[_T]]:
    """``items`` cut into runs of consecutive items, a few per writer thread."""
    size = max(1, -(-len(items) // (_WRITE_THREADS * _CHUNKS_PER_THREAD)))
    return [items[i:i + size] for i in range(0, len(items), size)]


def _write_temps(items: Sequence[tuple[Path, bytes]]) -> tuple[list[tuple[str, str]], list[str]]:
    """Write each item whose bytes changed to a durable temp file beside its target,
    making the directory when needed; return the (temp file, target) pairs and the
    directories made.  On failure, the temp files written so far are removed."""
    written: list[tuple[str, str]] = []
    made: list[str] = []
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
                f.write(data)
            written.append((tmp, path))
    except BaseException:
        for tmp, _path in written:
            discard(tmp)
        raise
    return written, made


def _unchanged(path: str, data: bytes) -> bool:
    try:
        return os.stat(path).st_size == len(data) and read_file(path) == data
    except OSError:
        return False


def _fsync_all(paths: Iterable[str]) -> None:
    for path in paths:
        fsync_path(path)


# --------------------------------------------------------------------------- caches
#
# .records/<project>.cache holds the project's rendered fragments, one per line:
#
#     wheelforge-index-cache <schema> <project> <number of wheels N> <bytes of the rows>
#     N landing-page rows, newest wheel first (the text the landing page shows)
#     for each wheel, sorted by version, then file name:
#         file name | version | channel membership | PEP 503 anchor | PEP 691 file
#
# so that a publish re-renders only the new wheel, assembles the project's pages
# by joining strings, and reads no more than the rows of every other project (the
# header gives their size).  Membership is the channel, "*" for a channel-less
# pure wheel (listed in every channel) or "" for a channel-less platform wheel
# (listed in simple/ only).  No fragment holds a raw newline (_e escapes them,
# json.dumps escapes them).  .records/_summary.json holds each project's channels
# and a digest of its wheel names.  Both are derived: rebuild ignores them, and a
# damaged or outdated one (another _CACHE_SCHEMA) is simply regenerated.

_CACHE_MAGIC = "wheelforge-index-cache"
_FIELDS = 6  # the lines of one wheel after the rows


class _Entry(NamedTuple):
    """One wheel's rendered fragments (a NamedTuple: 10,000 of them load in milliseconds)."""

    filename: str
    version: str
    member: str  # channel name, "*" (pure, every channel) or "" (simple/ only)
    anchor: str  # the PEP 503 <a> element after '<a href="' + prefix
    file: str  # the PEP 691 file object after '{"url":"' + prefix
    row: str  # the landing-page <tr>
    yanked: str  # "yanked" or "": a yanked version is never a consumer's pin


@dataclass(frozen=True)
class _Summary:
    names: str  # digest of the project's wheel names
    channels: tuple[str, ...]
    pure: bool  # has channel-less pure wheels (those appear in every channel)
    pins: tuple[tuple[str, str], ...] = ()  # (member, its newest non-yanked version)


def _entry(record: WheelRecord) -> _Entry:
    if record.channel is not None:
        member = record.channel
    else:
        member = "*" if _is_pure(record.filename) else ""
    href = _quote(record.filename)  # the file's URL, relative to files/, in all three fragments
    return _Entry(
        record.filename, record.version, member, _anchor(record, href), _file_json(record, href),
        _landing_row(record, href), "" if record.yanked is None else "yanked",
    )


def _entry_key(entry: _Entry) -> tuple[Version, str]:
    return (_parsed(entry.filename).version, entry.filename)


def _names_digest(names: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()


def _cache_file(index_dir: Path, project: str) -> Path:
    return index_dir / CACHE_DIR / f"{project}.cache"


def _read_cache(index_dir: Path, project: str, *, rows_only: bool) -> tuple[int, str] | None:
    """The project cache's wheel count and its text after the header line, or with
    ``rows_only`` just the landing-page rows at its start: a publish reads the rows of
    every project, and no more of each file.  None when the cache is missing, damaged
    or from another schema."""
    try:
        fd = os.open(_cache_file(index_dir, project), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        header, newline, _ = os.read(fd, 512).partition(b"\n")  # 512: any header line
        fields = header.decode("ascii", "replace").split(" ")
        if (not newline or fields[:3] != [_CACHE_MAGIC, str(_CACHE_SCHEMA), project]
                or len(fields) != 5 or not (fields[3].isdigit() and fields[4].isdigit())):
            return None
        start, count, rows_size = len(header) + 1, int(fields[3]), int(fields[4])
        size = rows_size if rows_only else os.fstat(fd).st_size - start
        data = os.pread(fd, size, start)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)
    if len(data) != size or (text and not text.endswith("\n")):
        return None
    return count, text


def _load_cache(index_dir: Path, project: str) -> list[_Entry]:
    """The project cache, sorted; [] when missing, damaged or from another schema."""
    found = _read_cache(index_dir, project, rows_only=False)
    if found is None:
        return []
    count, text = found
    lines = text.split("\n")[:-1]
    if len(lines) != count * (1 + _FIELDS):
        return []
    entries = []
    for i, row in enumerate(reversed(lines[:count])):  # the rows are newest first
        at = count + i * _FIELDS
        filename, version, member, anchor, file, yanked = lines[at:at + _FIELDS]
        entries.append(_Entry(filename, version, member, anchor, file, row, yanked))
    return entries


def _load_rows(index_dir: Path, project: str) -> str | None:
    """The project's landing-page rows (``_rows`` of its entries) from its cache; None
    when the cache is missing, damaged or from another schema."""
    found = _read_cache(index_dir, project, rows_only=True)
    if found is None or found[1].count("\n") != found[0]:
        return None
    return found[1]


def _cache_bytes(project: str, entries: Sequence[_Entry]) -> bytes:
    rows = _rows(entries).encode()
    fragments = "".join(f"{field}\n" for entry in entries  # the row is stored above
                        for field in (*entry[:_FIELDS - 1], entry.yanked))
    header = f"{_CACHE_MAGIC} {_CACHE_SCHEMA} {project} {len(entries)} {len(rows)}\n"
    return header.encode() + rows + fragments.encode()


def _rows(entries: Sequence[_Entry]) -> str:
    return "".join(f"{e.row}\n" for e in reversed(entries))  # newest first


def _load_summary(index_dir: Path) -> dict[NormalizedName, _Summary]:
    try:
        data = json.loads((index_dir / CACHE_DIR / _SUMMARY_FILE).read_bytes())
        if data["schema"] != _CACHE_SCHEMA:
            return {}
        return {
            NormalizedName(p): _Summary(s["names"], tuple(s["channels"]), bool(s["pure"]),
                                        tuple((str(m), str(v)) for m, v in s["pins"]))
            for p, s in data["projects"].items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _summary_bytes(summary: Mapping[NormalizedName, _Summary]) -> bytes:
    payload = {
        "schema": _CACHE_SCHEMA,
        "projects": {
            p: {"names": s.names, "channels": list(s.channels), "pure": s.pure,
                "pins": [list(pin) for pin in s.pins]}
            for p, s in sorted(summary.items())
        },
    }
    return json.dumps(payload, separators=(",", ":")).encode()


def _project_entries(
    index_dir: Path,
    project: NormalizedName,
    names: Sequence[str],
    updated: Mapping[str, WheelRecord],
    listing: _Listing,
    *,
    full: bool,
) -> tuple[list[_Entry], bool]:
    """The project's entries, sorted, and whether they differ from the cache.

    Records come from ``updated``, else the cache, else the sidecar; ``full``
    ignores the cache.
    """
    cached = [] if full else _load_cache(index_dir, project)
    wanted = set(names)
    entries = [e for e in cached if e.filename in wanted and e.filename not in updated]
    have = {e.filename for e in entries}
    fresh = []
    files = index_dir / FILES_DIR
    for name in names:
        if name in have:
            continue
        record = updated.get(name)
        if record is None:
            try:
                _parsed(name)  # the fast scan may have let a stray name through
            except InvalidWheelFilename:
                continue
            record = _load_record(files, name, check_size=full, present=listing.names)
        fresh.append(_entry(record))
    if full:
        return sorted(fresh, key=_entry_key), True
    for entry in fresh:
        bisect.insort(entries, entry, key=_entry_key)
    return entries, entries != cached


def _summarize(entries: Sequence[_Entry], names: str) -> _Summary:
    members = {e.member for e in entries}
    newest: dict[str, str] = {}
    for e in entries:  # sorted oldest first: the last non-yanked one per member wins
        if not e.yanked:
            newest[e.member] = e.version
    return _Summary(names, tuple(sorted(members - {"", "*"})), "*" in members,
                    tuple(sorted(newest.items())))



# --------------------------------------------------------------------------- pages


_NEEDS_ESCAPE = re.compile("[&<>\"'\n\r]").search


def _e(text: str) -> str:
    """html.escape(quote=True), and line breaks as references: a fragment is one line.

    Most text on the pages (file names, versions, hashes, times) holds none of the
    characters that change; one regex search is cheaper than html.escape's five
    replacements and the two here, and the text is returned as it is.
    """
    if _NEEDS_ESCAPE(text) is None:
        return text
    return html.escape(text, quote=True).replace("\n", "&#10;").replace("\r", "&#13;")


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_QUOTE_TABLE = {c: chr(c) if c in _UNRESERVED else f"%{c:02X}" for c in range(128)}


def _quote(name: str) -> str:
    """urllib.parse.quote(name, safe=""), an order of magnitude faster for ASCII names."""
    if name.isascii():
        return name.translate(_QUOTE_TABLE)
    return urllib.parse.quote(name, safe="")


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # one, not one per page


def _json_text(payload: Any) -> str:
    return _JSON.encode(payload) + "\n"


def _simple_html(title: str, links: str) -> str:
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        f'    <meta name="pypi:repository-version" content="{API_VERSION}">\n'
        f"    <title>{_e(title)}</title>\n  </head>\n  <body>\n"
        f"    <h1>{_e(title)}</h1>\n{links}  </body>\n</html>\n"
    )


@functools.lru_cache(maxsize=1 << 16)
def _root_link(project: str) -> str:
    return f'    <a href="{_e(_quote(project))}/">{_e(project)}</a><br>\n'


def _root_pages(projects: Sequence[str], title: str) -> tuple[str, str]:
    links = "".join(_root_link(p) for p in projects)
    payload = {"meta": {"api-version": API_VERSION}, "projects": [{"name": p} for p in projects]}
    return _simple_html(title, links), _json_text(payload)


def _anchor(r: WheelRecord, href: str) -> str:
    attrs = ""
    if r.requires_python is not None:
        attrs += f' data-requires-python="{_e(r.requires_python)}"'
    if r.metadata_sha256:
        meta = _e(f"sha256={r.metadata_sha256}")
        attrs += f' data-dist-info-metadata="{meta}" data-core-metadata="{meta}"'
    if r.yanked is not None:
        attrs += f' data-yanked="{_e(r.yanked)}"'
    return f'{_e(f"{href}#sha256={r.sha256}")}"{attrs}>{_e(r.filename)}</a>'


def _file_json(r: WheelRecord, href: str) -> str:
    """The PEP 691 file object, as the text after '{"url":"' + prefix.

    The same text as _json_text of the object, formatted here with only the strings
    encoded (``_JSON.encode`` of a str is one call into C): json.dumps of a small
    dict per wheel was a tenth of a rebuild.
    """
    text = _JSON.encode
    meta = f'{{"sha256":{text(r.metadata_sha256)}}}' if r.metadata_sha256 else "false"
    yanked = "false" if r.yanked is None else text(r.yanked) if r.yanked else "true"
    requires = "" if r.requires_python is None else f',"requires-python":{text(r.requires_python)}'
    return (
        f'{href}","filename":{text(r.filename)},"hashes":{{"sha256":{text(r.sha256)}}}'
        f'{requires},"core-metadata":{meta},"dist-info-metadata":{meta},"yanked":{yanked}'
        f',"size":{r.size},"upload-time":{text(r.upload_time)}}}'
    )


def _project_pages(project: str, entries: Sequence[_Entry], prefix: str) -> tuple[str, str]:
    """PEP 503 HTML and PEP 691 JSON for one project; ``prefix`` leads to files/."""
    # prefix is one of two constants, safe in HTML and in JSON strings
    links = "".join(f'    <a href="{prefix}{e.anchor}<br>\n' for e in entries)
    files = ",\n".join(f'{{"url":"{prefix}{e.file}' for e in entries)
    head = {"meta": {"api-version": API_VERSION}, "name": project}
    versions = _json_text(list(dict.fromkeys(e.version for e in entries))).rstrip("\n")
    json_text = f'{_json_text(head).rstrip()[:-1]},"versions":{versions},"files":[\n{files}]}}\n'
    return _simple_html(f"Links for {project}", links), json_text


def _human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _tested_label(tested: Mapping[str, Any] | None) -> str:
    """A short label for a free-form test result: its status, result or outcome,
    else passed/failed from a boolean ``passed``, else "recorded"."""
    if tested is None:
        return "untested"
    for key in ("status", "result", "outcome"):
        value = tested.get(key)
        if isinstance(value, str) and value:
            return value
    passed = tested.get("passed")
    if isinstance(passed, bool):
        return "passed" if passed else "failed"
    return "recorded"


def _landing_row(r: WheelRecord, href: str) -> str:
    python = ".".join(sorted({t.interpreter for t in _parsed(r.filename).tags}))
    status = _tested_label(r.tested).lower()
    label = status
    if r.tested is not None and isinstance(r.tested.get("gpu"), str):
        label += f" on {r.tested['gpu']}"  # e.g. "passed on NVIDIA H200"
        if isinstance(r.tested.get("capability"), str):
            label += f" (sm {r.tested['capability']})"
    tested_class = (
        "ok" if status in ("passed", "pass", "ok", "success")
        else "bad" if status in ("failed", "fail", "error", "failure")
        else "none"
    )
    tested_title = json.dumps(r.tested, sort_keys=True) if r.tested is not None else ""
    yanked = row_class = ""
    if r.yanked is not None:
        yanked = f' <span class="yanked" title="{_e(r.yanked)}">yanked</span>'
        row_class = ' class="yanked-row"'
    return (
        f"<tr{row_class}>"
        f'<td title="{_e(r.summary or "")}">{_e(r.project)}</td>'
        f'<td><a href="{_e(f"{FILES_DIR}/{href}")}" title="{_e(r.filename)}">'
        f"{_e(r.version)}</a>{yanked}</td>"
        f"<td>{_e(python)}</td>"
        f"<td>{_e(r.torch or '-')}</td>"
        f"<td>{_e(r.cuda or '-')}</td>"
        f"<td>{_e(' '.join(r.archs) or '-')}</td>"
        f'<td class="num" title="{r.size} bytes">{_human_size(r.size)}</td>'
        f'<td title="{_e(r.upload_time)}">{_e(r.upload_time[:16].replace("T", " "))}</td>'
        f'<td title="{_e(r.sha256)}"><code>{_e(r.sha256[:12])}</code></td>'
        f'<td class="{tested_class}" title="{_e(tested_title)}">{_e(label)}</td>'
        f'<td><code class="pin">{_e(consumer.pin(r.project, r.version))}</code></td>'
        "</tr>"
    )


_CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 90rem;
       padding: 0 1rem; color: #1b1b1b; background: #fff; }
h1 { font-size: 1.5rem; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .3rem .6rem; border-bottom: 1px solid #ddd;
         white-space: nowrap; }
th { background: #f3f3f3; position: sticky; top: 0; }
tbody:nth-of-type(even) { background: #fafafa; }
th.num, td.num { text-align: right; }
td { font-variant-numeric: tabular-nums; }
code { font-size: .9em; }
a { color: #0550ae; }
.yanked { color: #a40e26; font-size: .85em; font-weight: bold; }
tr.yanked-row td { color: #777; }
td.ok { color: #116329; } td.bad { color: #a40e26; } td.none { color: #777; }
@media (prefers-color-scheme: dark) {
  body { color: #ddd; background: #161616; } th { background: #262626; }
  th, td { border-color: #333; } tbody:nth-of-type(even) { background: #1c1c1c; }
  a { color: #79b8ff; } tr.yanked-row td, td.none { color: #999; }
  td.ok { color: #56d364; } td.bad, .yanked { color: #f85149; }
}
"""


def _landing_page(rows: Mapping[str, str], channels: Sequence[str], wheels: int,
                  report: bool = False) -> str:
    """The landing page: one table, a <tbody> per project (``rows``, by project name)."""
    channel_links = ", ".join(
        f'<a href="{_e(urllib.parse.quote(c))}/simple/">{_e(c)}</a>' for c in channels
    ) or "none"
    bodies = "".join(f"<tbody>\n{rows[p]}</tbody>\n" for p in sorted(rows) if rows[p])
    plural = "" if wheels == 1 else "s"
    projects = f"{len(rows)} project{'' if len(rows) == 1 else 's'}"
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>wheelforge index</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        "<h1>wheelforge index</h1>\n"
        f"<p>{wheels} wheel{plural} of {projects}. "
        f'Everything: <a href="{SIMPLE_DIR}/">{SIMPLE_DIR}/</a>. '
        f"Channels: {channel_links}."
        + (f' Nightly build: <a href="{REPORTS_DIR}/{NIGHTLY_REPORT}">latest report</a>.'
           if report else "")
        + "</p>\n"
        "<p>Install the pins of the last column, from this index alone: <code>"
        + _e(consumer.first_command("THIS-INDEX/CHANNEL/simple/", ["PIN..."],
                                        one_line=True))
        + "</code>. For the set-up that keeps them through later upgrades (pip and uv), "
        "run <code>wheelforge consumer-config</code>.</p>\n"
        "<table>\n<thead><tr><th>Project</th><th>Version</th><th>Python</th><th>Torch</th>"
        '<th>CUDA</th><th>Archs</th><th class="num">Size</th><th>Built (UTC)</th>'
        "<th>SHA-256</th><th>Tested</th><th>Pin</th></tr></thead>\n"
        f"{bodies}</table>\n</body>\n</html>\n"
    )


def _channels(summary: Mapping[NormalizedName, _Summary]) -> set[str]:
    return {c for s in summary.values() for c in s.channels}


def _members(summary: Mapping[NormalizedName, _Summary], channel: str) -> list[NormalizedName]:
    return sorted(p for p, s in summary.items() if s.pure or channel in s.channels)


def _pair(out: list[tuple[Path, bytes]], directory: Path, pages: tuple[str, str]) -> None:
    out.append((directory / "index.html", pages[0].encode()))
    out.append((directory / "index.json", pages[1].encode()))


def _remove_pages(directory: Path) -> None:
    """Remove generated pages under ``directory`` and the directories they leave empty."""
    if directory.is_symlink():
        return
    if directory.is_dir():
        for sub in sorted(directory.iterdir()):
            if sub.is_dir() and not sub.is_symlink():
                _remove_pages(sub)
        for name in ("index.html", "index.json"):
            with contextlib.suppress(FileNotFoundError):
                (directory / name).unlink()
        with contextlib.suppress(OSError):
            directory.rmdir()
    if directory.name == SIMPLE_DIR and directory.parent.name not in _RESERVED_CHANNELS:
        with contextlib.suppress(FileNotFoundError):
            (directory.parent / CONSTRAINTS_FILE).unlink()  # a channel's, when it goes
        with contextlib.suppress(OSError):
            directory.parent.rmdir()  # a channel directory left empty


def _sync(
    index_dir: Path,
    listing: _Listing,
    updated: Mapping[NormalizedName, Mapping[str, WheelRecord]],
    *,
    full: bool,
) -> None:
    """Bring caches and pages in line with ``listing`` (the wheels in files/).

    Incremental (``full=False``): reload the projects in ``updated`` and those
    whose set of wheel names differs from the summary; rewrite their pages;
    regenerate the root pages and the landing page (each written only when its
    bytes change).  ``full``: reload every project from the sidecars and
    remove pages that no wheel supports any more.
    """
    groups = listing.groups
    old = {} if full else _load_summary(index_dir)
    summary: dict[NormalizedName, _Summary] = {}
    entries: dict[NormalizedName, list[_Entry]] = {}
    caches: list[tuple[Path, bytes]] = []

    def load(project: NormalizedName) -> list[_Entry]:
        found, changed = _project_entries(
            index_dir, project, groups[project], updated.get(project, {}), listing, full=full
        )
        if changed:
            caches.append((_cache_file(index_dir, project), _cache_bytes(project, found)))
        entries[project] = found
        return found

    for project in sorted(groups):
        digest = _names_digest(groups[project])
        previous = old.get(project)
        if full or project in updated or previous is None or previous.names != digest:
            summary[project] = _summarize(load(project), digest)
        else:
            summary[project] = previous
    changed = set(entries)
    removed = set(old) - set(groups)

    pages: list[tuple[Path, bytes]] = []
    roots: list[tuple[Path, bytes]] = []
    removals: list[Path] = []
    simple = index_dir / SIMPLE_DIR
    for project in sorted(changed):
        _pair(pages, simple / project, _project_pages(project, entries[project], "../../files/"))
    _pair(roots, simple, _root_pages(sorted(groups), "Simple index"))
    removals.extend(simple / p for p in sorted(removed))

    old_channels, new_channels = _channels(old), _channels(summary)
    for channel in sorted(new_channels):
        base = index_dir / channel / SIMPLE_DIR
        members = _members(summary, channel)
        fresh = full or channel not in old_channels or not (base / "index.json").is_file()
        for project in members if fresh else [p for p in members if p in changed]:
            found = entries[project] if project in entries else load(project)
            in_channel = [e for e in found if e.member == channel or e.member == "*"]
            _pair(pages, base / project, _project_pages(project, in_channel, "../../../files/"))
        if not fresh:
            removals.extend(base / p for p in sorted((changed - set(members)) | removed))
        _pair(roots, base, _root_pages(members, f"Simple index: {channel}"))
    removals.extend(index_dir / c / SIMPLE_DIR for c in sorted(old_channels - new_channels))
    roots += _constraints_files(index_dir, summary, new_channels)
    if full:
        removals.extend(_stale_pages(index_dir, summary, new_channels))

    rows: dict[str, str] = {}
    for project in sorted(groups):
        if project not in entries and (cached := _load_rows(index_dir, project)) is not None:
            rows[project] = cached
        else:  # loading a project whose cache is damaged queues the cache's rewrite
            rows[project] = _rows(entries[project] if project in entries else load(project))
    wheels = sum(len(names) for names in groups.values())
    report = (index_dir / REPORTS_DIR / NIGHTLY_REPORT).is_file()
    landing = _landing_page(rows, sorted(new_channels), wheels, report).encode()
    # caches, then project pages, then the roots that link to them, then the landing page
    _write_all([*caches, *pages, *roots, (index_dir / "index.html", landing)])
    for directory in removals:
        _remove_pages(directory)
    # last: if anything above was interrupted, the next run sees stale digests and redoes it
    _write_all([(index_dir / CACHE_DIR / _SUMMARY_FILE, _summary_bytes(summary))])


def _newest(summary: _Summary, members: Container[str] | None) -> str | None:
    """The newest non-yanked version among ``members`` (None: all); None when none is."""
    found = [v for m, v in summary.pins if members is None or m in members]
    return max(found, key=Version) if found else None


def _constraints_files(index_dir: Path, summary: Mapping[NormalizedName, _Summary],
                       channels: Iterable[str]) -> list[tuple[Path, bytes]]:
    """``constraints.txt`` for the whole index and for each channel: the newest non-yanked
    version of every project their pages list (see consumer.constraints_text)."""
    out = []
    for channel in [None, *sorted(channels)]:
        if channel is None:
            where, title = index_dir, SIMPLE_DIR + "/"
            newest = [(p, _newest(s, None)) for p, s in sorted(summary.items())]
        else:
            where, title = index_dir / channel, f"{channel}/{SIMPLE_DIR}/"
            newest = [(p, _newest(summary[p], (channel, "*"))) for p in _members(summary, channel)]
        out.append((where / CONSTRAINTS_FILE, consumer.constraints_text(newest, title).encode()))
    return out


def _stale_pages(
    index_dir: Path, summary: Mapping[NormalizedName, _Summary], channels: set[str]
) -> list[Path]:
    """Page directories (and caches, removed here) that no published wheel supports."""
    simple = index_dir / SIMPLE_DIR
    stale = [simple / d for d in _directories(simple) if d not in summary]
    for top in _directories(index_dir):
        base = index_dir / top / SIMPLE_DIR
        if top in _RESERVED_CHANNELS or top.startswith("."):
            continue
        if not base.is_dir():
            if top not in channels and os.listdir(index_dir / top) == [CONSTRAINTS_FILE]:
                stale.append(base)  # a gone channel's constraints, left by a crash
            continue
        if top not in channels:
            stale.append(base)
            continue
        members = set(_members(summary, top))
        stale.extend(base / d for d in _directories(base) if d not in members)
    with contextlib.suppress(FileNotFoundError), os.scandir(index_dir / CACHE_DIR) as found:
        for f in found:
            current = f.name.endswith(".cache") and f.name.removesuffix(".cache") in summary
            if not (f.name.startswith("_") or current) and f.is_file():
                os.unlink(f.path)  # the cache of a project gone, or a file of another schema
    return stale


def _directories(directory: Path) -> list[str]:
    """The sorted names of the directories in ``directory`` (a scan, no stat per name)."""
    try:
        with os.scandir(directory) as found:
            return sorted(f.name for f in found if f.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []


# --------------------------------------------------------------------------- public operations


def _validate_target(channel: str | None, cuda: str | None, torch: str | None,
                     archs: Sequence[str]) -> tuple[str, ...]:
    problems = []
    if channel is not None and (not _CHANNEL_RE.match(channel) or channel in _RESERVED_CHANNELS):
        problems.append(
            f"channel {channel!r} must be lowercase letters, digits, '.', '_' or '-' "
            f"and not one of {', '.join(sorted(_RESERVED_CHANNELS))}"
        )
    for what, value in (("CUDA version", cuda), ("torch version", torch)):
        if value is not None:
            try:
                Version(value)
            except InvalidVersion:
                problems.append(f"{what} {value!r} is not a valid version")
    if isinstance(archs, str):
        problems.append(f"archs must be a sequence of names such as ('sm_120',), not {archs!r}")
        archs = ()
    bad = [a for a in archs if not _ARCH_RE.match(a)]
    if bad:
        problems.append(f"arch names {bad!r} are not valid (expected names such as sm_120)")
    if problems:
        raise PublishError(
            "cannot publish: invalid build target",
            why="; ".join(problems),
            fix="pass the values the build used (see `channel_name(cuda, torch)`)",
        )
    return tuple(sorted(set(archs), key=lambda a: [int(t) if t.isdigit() else t
                                                   for t in re.split(r"(\d+)", a)]))


def publish(
    index_dir: Path,
    wheel: Path,
    *,
    channel: str | None,
    cuda: str | None,
    torch: str | None,
    archs: Sequence[str],
    build_key: str | None,
) -> PublishResult:
    """Publish ``wheel`` into the index at ``index_dir`` and update the affected pages.

    The same bytes under a published name are a no-op (``noop=True``) when the
    build target matches; different bytes, or the same bytes for another
    target, raise PublishError.  The one exception: a record without any build
    target (rebuild derives those for wheels that have no sidecar, such as one
    whose publish was killed) is completed by publishing the same bytes with a
    target.
    """
    index_dir, wheel = Path(index_dir), Path(wheel)
    arch_list = _validate_target(channel, cuda, torch, archs)
    if not wheel.is_file():
        raise PublishError(f"{wheel} does not exist", fix="publish the wheel the build produced")
    info = _inspect_wheel(wheel)
    sha256 = sha256_file(wheel)
    files = index_dir / FILES_DIR
    dest = files / wheel.name
    existing: WheelRecord | None = None
    with locked(index_dir / LOCK_FILE):
        _recover(index_dir)
        listing = _scan(files, strict=False, sweep=True)
        if dest.is_file():
            if sha256_file(dest) != sha256:
                raise PublishError(
                    f"{wheel.name} is already published with different contents",
                    why="a different file with that name is already published; "
                        "published files are immutable",
                    fix="bump the build (version or build tag) and publish the new file, "
                        "or yank the published version",
                )
            if _sidecar(dest).is_file():
                existing = _load_record(files, dest.name, check_size=False)
                target = (channel, cuda, torch, arch_list, build_key)
                if _has_target(existing) or target == (None, None, None, (), None):
                    _check_same_target(existing, *target)
                    return PublishResult(path=dest, record=existing, noop=True)
                # a record without a build target, as rebuild derives it for a wheel whose
                # publish was interrupted before its sidecar: complete it below
            # else the wheel is there without its sidecar: finish that interrupted publish
        record = WheelRecord(
            filename=wheel.name,
            project=info.project,
            version=str(info.version),
            sha256=sha256,
            size=wheel.stat().st_size,
            requires_python=info.requires_python,
            upload_time=_now(),
            channel=channel,
            cuda=cuda,
            torch=torch,
            archs=arch_list,
            build_key=build_key,
            metadata_sha256=hashlib.sha256(info.metadata).hexdigest(),
            summary=info.summary,
        )
        if existing is not None:  # keep its upload time, yank and test result
            record = replace(existing, channel=channel, cuda=cuda, torch=torch, archs=arch_list,
                             build_key=build_key)
        with _changing(index_dir):
            if not dest.is_file():
                atomic_copy(wheel, dest)
            atomic_write(_metadata_file(dest), info.metadata)
            atomic_write(_sidecar(dest), to_json(record))  # the record last: it commits
            names = listing.groups.setdefault(info.project, [])
            if dest.name not in names:
                names.append(dest.name)
            _sync(index_dir, listing, {info.project: {dest.name: record}}, full=False)
    return PublishResult(path=dest, record=record, noop=False)


def _has_target(record: WheelRecord) -> bool:
    return (record.channel, record.cuda, record.torch, record.archs, record.build_key) != (
        None, None, None, (), None
    )


def _check_same_target(record: WheelRecord, channel: str | None, cuda: str | None,
                       torch: str | None, archs: tuple[str, ...], build_key: str | None) -> None:
    differences = [
        f"{what}: published {old!r}, now {new!r}"
        for what, old, new in (
            ("channel", record.channel, channel),
            ("cuda", record.cuda, cuda),
            ("torch", record.torch, torch),
            ("archs", record.archs, archs),
            ("build_key", record.build_key, build_key),
        )
        if old != new
    ]
    if differences:
        raise PublishError(
            f"{record.filename} is already published for another build target",
            why="; ".join(differences),
            fix="a wheel file belongs to one channel; build a separately named wheel "
                "(e.g. a different local version) for the other target",
        )


def rebuild(index_dir: Path) -> int:
    """Regenerate every page from files/*.whl and the sidecars; return the wheel count."""
    index_dir = Path(index_dir)
    with locked(index_dir / LOCK_FILE), _changing(index_dir), _no_cycle_collection():
        listing = _sweep_and_scan(index_dir)
        _sync(index_dir, listing, {}, full=True)
    return sum(len(names) for names in listing.groups.values())


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Pause Python's cyclic garbage collector during a pass over every wheel.

    Such a pass keeps several objects per wheel until it ends (parsed names,
    versions, tags, fragments) and makes no reference cycles; the collector's
    passes over that growing set took a tenth of a rebuild's CPU time.  At the end
    the memo of parsed names is cleared, so that reference counting frees all that
    the pass made: the collector resumes with no backlog (else the next publish in
    the same process paid for a full collection) and the memory is returned.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        _parsed.cache_clear()
        if enabled:
            gc.enable()


def remove(index_dir: Path, filenames: Iterable[str]) -> list[str]:
    """Unpublish wheels; return the names removed (those not published are ignored).

    Under the index lock, the pages are rewritten without the wheels first, and only
    then are the files deleted: each wheel, then its ``.metadata``, then its sidecar
    (a wheel without a sidecar would be re-derived as channel-less; a sidecar without
    its wheel is ignored).  A page never links a missing file; a crash in between leaves
    files that the next writer lists again, so run the removal again.
    """
    index_dir = Path(index_dir)
    files = index_dir / FILES_DIR
    with locked(index_dir / LOCK_FILE):
        _recover(index_dir)
        listing = _scan(files, strict=True, sweep=True)
        doomed = set(filenames) & listing.names
        doomed = {n for n in doomed if n.endswith(".whl")}
        if not doomed:
            return []
        groups = {p: kept for p, names in listing.groups.items()
                  if (kept := [n for n in names if n not in doomed])}
        gone = {n + suffix for n in doomed for suffix in ("", METADATA_SUFFIX, SIDECAR_SUFFIX)}
        with _changing(index_dir):
            _sync(index_dir, _Listing(groups, listing.names - gone), {}, full=True)
            for name in sorted(doomed):
                for suffix in ("", METADATA_SUFFIX, SIDECAR_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        (files / (name + suffix)).unlink()
            fsync_path(files)
    return sorted(doomed)


def _update_records(
    index_dir: Path, project: str, version: str | None, filename: str | None, change: dict[str, Any]
) -> list[WheelRecord]:
    """Apply ``change`` to the sidecars of one project's version (or one file)."""
    index_dir = Path(index_dir)
    normalized = canonicalize_name(project)
    wanted = _parse_version(version, f"{normalized} version") if version is not None else None
    files = index_dir / FILES_DIR
    with locked(index_dir / LOCK_FILE):
        _recover(index_dir)
        listing = _scan(files, strict=False, sweep=True)
        matches = []
        for name in sorted(listing.groups.get(normalized, [])):
            try:
                file_version = _parsed(name).version
            except InvalidWheelFilename:
                continue
            if (wanted is None or file_version == wanted) and (filename in (None, name)):
                matches.append(name)
        if not matches:
            target = filename or f"{normalized} {version}"
            raise PublishError(
                f"no published file matches {target}",
                why=f"files/ holds no wheel of {target}",
                fix="check the project name and version against the index's landing page",
            )
        updated = {}
        with _changing(index_dir):
            for name in matches:
                record = _load_record(files, name, check_size=False)
                new = replace(record, **change)
                if new != record:
                    atomic_write(_sidecar(files / name), to_json(new))
                updated[name] = new
            _sync(index_dir, listing, {normalized: updated}, full=False)
    return [updated[n] for n in matches]


def yank(index_dir: Path, project: str, version: str, reason: str) -> list[str]:
    """Mark every file of ``project`` ``version`` yanked (PEP 592); return their names."""
    records = _update_records(index_dir, project, version, None, {"yanked": reason})
    return [r.filename for r in records]


def unyank(index_dir: Path, project: str, version: str) -> list[str]:
    """Clear the yank of every file of ``project`` ``version``; return their names."""
    records = _update_records(index_dir, project, version, None, {"yanked": None})
    return [r.filename for r in records]


def set_tested(index_dir: Path, filename: str, tested: Mapping[str, Any] | None) -> WheelRecord:
    """Record a free-form test result for one published wheel; shown on the landing page."""
    try:
        project = parse_wheel_filename(filename)[0]
    except InvalidWheelFilename as exc:
        raise PublishError(f"{filename} is not a wheel file name", why=str(exc)) from None
    value = dict(tested) if tested is not None else None
    (record,) = _update_records(index_dir, project, None, filename, {"tested": value})
    return record


def load_records(index_dir: Path) -> list[WheelRecord]:
    """Every published wheel's record (read-only: no lock, nothing written).

    A wheel without a sidecar is described as :func:`rebuild` would derive it.
    """
    files = Path(index_dir) / FILES_DIR
    listing = _scan(files, strict=False, sweep=False)
    out = []
    for names in listing.groups.values():
        for name in names:
            wheel = files / name
            try:
                _parsed(name)
                if _sidecar(wheel).name in listing.names:
                    out.append(_read_sidecar(_sidecar(wheel)))
                    continue
            except InvalidWheelFilename:
                continue
            except FileNotFoundError:
                pass  # removed since the listing, or a publish is finishing
            with contextlib.suppress(FileNotFoundError):
                out.append(_derive(wheel, write=False))
    return sorted(out, key=lambda r: (r.project, *_sort_key(r)))


# --------------------------------------------------------------------------- HTTP server

_NEGOTIABLE = {
    JSON_CONTENT_TYPE: JSON_CONTENT_TYPE,
    "application/vnd.pypi.simple.latest+json": JSON_CONTENT_TYPE,
    HTML_CONTENT_TYPE: HTML_CONTENT_TYPE,
    "application/vnd.pypi.simple.latest+html": HTML_CONTENT_TYPE,
    "text/html": "text/html; charset=utf-8",
    "text/*": "text/html; charset=utf-8",
    "*/*": "text/html; charset=utf-8",
}
_FILE_TYPES = {
    ".whl": "application/octet-stream",
    METADATA_SUFFIX: "application/octet-stream",
    ".html": "text/html; charset=utf-8",
    ".json": "application/json",
    ".txt": "text/plain; charset=utf-8",
}


def _negotiate(accept: str | None) -> str | None:
    """The Content-Type to answer with for a simple page, or None (406)."""
    if accept is None or not accept.strip():
        return "text/html; charset=utf-8"
    best, best_q = None, 0.0
    for item in accept.split(","):
        media, *params = item.split(";")
        content_type = _NEGOTIABLE.get(media.strip().lower())
        if content_type is None:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
        if q > best_q:
            best, best_q = content_type, q
    return best


@dataclass(frozen=True)
class _Route:
    status: int
    file: str | None = None
    content_type: str | None = None
    location: str | None = None
    vary: bool = False


def _inside(root: str, real: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _hidden(root: str, real: str) -> bool:
    rel = os.path.relpath(real, root)
    parts = [] if rel == "." else rel.split(os.sep)
    return any(p.startswith(".") or p.endswith(SIDECAR_SUFFIX) for p in parts)


def _route(root: str, raw: str, accept: str | None) -> _Route:
    """Map a request target to a file under ``root`` (a real path), or an error.

    Refuses '.' and '..' segments (also percent-encoded), encoded '/' or '\\',
    NUL bytes, empty segments, hidden names (.lock, .records, temp files),
    sidecars, and anything whose real path leaves the root.
    """
    if not raw.startswith("/") or "\x00" in raw:
        return _Route(404)
    path, _, query = raw.partition("#")[0].partition("?")
    trailing = path.endswith("/")
    segments = path[1:].split("/")
    if trailing:
        segments.pop()
    parts: list[str] = []
    for segment in segments:
        try:
            part = urllib.parse.unquote(segment, errors="strict")
        except UnicodeDecodeError:
            return _Route(404)
        if part in ("", ".", "..") or any(c in part for c in "/\\\x00") or part.startswith("."):
            return _Route(404)
        parts.append(part)
    if parts and parts[-1].endswith(SIDECAR_SUFFIX):
        return _Route(404)
    project_url = (len(parts) == 2 and parts[0] == SIMPLE_DIR) or (
        len(parts) == 3 and parts[1] == SIMPLE_DIR
    )
    if project_url and parts[-1] not in ("index.html", "index.json"):
        normalized = canonicalize_name(parts[-1])
        if normalized != parts[-1] or not trailing:
            location = "/" + "/".join(urllib.parse.quote(p) for p in [*parts[:-1], normalized])
            location += "/"
            return _Route(301, location=location + ("?" + query if query else ""))
    real = os.path.realpath(os.path.join(root, *parts))
    if not _inside(root, real):
        return _Route(403)
    if _hidden(root, real):
        return _Route(404)
    if os.path.isdir(real):
        if not trailing and parts:
            location = "/" + "/".join(urllib.parse.quote(p) for p in parts) + "/"
            return _Route(301, location=location + ("?" + query if query else ""))
        html_page, json_page = os.path.join(real, "index.html"), os.path.join(real, "index.json")
        if os.path.isfile(json_page):
            content_type = _negotiate(accept)
            if content_type is None:
                return _Route(406, vary=True)
            chosen = json_page if content_type == JSON_CONTENT_TYPE else html_page
            vary = True
        else:
            content_type, chosen, vary = "text/html; charset=utf-8", html_page, False
        chosen = os.path.realpath(chosen)
        if not _inside(root, chosen):
            return _Route(403)
        if not os.path.isfile(chosen) or _hidden(root, chosen):
            return _Route(404)
        return _Route(200, file=chosen, content_type=content_type, vary=vary)
    if trailing or not os.path.isfile(real):
        return _Route(404)
    suffix = os.path.splitext(real)[1]
    return _Route(200, file=real, content_type=_FILE_TYPES.get(suffix, "application/octet-stream"))


class _IndexServer(http.server.ThreadingHTTPServer):
    def __init__(self, address: tuple[str, int], root: str, quiet: bool) -> None:
        self.root = root
        self.quiet = quiet
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _IndexHandler)


class _IndexHandler(http.server.BaseHTTPRequestHandler):
    server: _IndexServer
    server_version = "wheelforge-index"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._respond(head=False)

    def do_HEAD(self) -> None:
        self._respond(head=True)

    def _not_allowed(self) -> None:
        self.close_connection = True  # the request body, if any, is left unread
        self.send_response(405)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed
    do_PROPFIND = do_PROPPATCH = do_MKCOL = do_COPY = do_MOVE = do_LOCK = do_UNLOCK = _not_allowed

    def log_message(self, format: str, *args: Any) -> None:
        if not self.server.quiet:
            super().log_message(format, *args)

    def _respond(self, *, head: bool) -> None:
        route = _route(self.server.root, self.path, self.headers.get("Accept"))
        if route.status == 301 and route.location is not None:
            self.send_response(301)
            self.send_header("Location", route.location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if route.status != 200 or route.file is None:
            self.send_error(route.status)
            return
        try:
            f = open(route.file, "rb")  # noqa: SIM115 (closed below, after the headers)
        except OSError:
            self.send_error(404)
            return
        with f:
            st = os.fstat(f.fileno())
            self.send_response(200)
            self.send_header("Content-Type", route.content_type or "application/octet-stream")
            self.send_header("Content-Length", str(st.st_size))
            self.send_header("Last-Modified", formatdate(st.st_mtime, usegmt=True))
            if route.vary:
                self.send_header("Vary", "Accept")
            self.end_headers()
            if not head:
                shutil.copyfileobj(f, self.wfile)


def make_server(
    index_dir: Path, host: str = "127.0.0.1", port: int = 0, *, quiet: bool = True
) -> http.server.ThreadingHTTPServer:
    """A read-only HTTP server for the index (bound, not yet serving).

    Call ``serve_forever()``; ``server_address`` has the bound port.  Simple
    pages are negotiated on ``Accept`` (PEP 691); nothing outside the index
    root, hidden files or sidecars are served.  Requests are logged to stderr
    only when ``quiet`` is false.
    """
    root = os.path.realpath(index_dir)
    if not os.path.isdir(root):
        raise PublishError(
            f"{index_dir} is not an index directory",
            fix="publish a wheel into it or rebuild it first",
        )
    try:
        return _IndexServer((host, port), root, quiet)
    except OSError as exc:  # address in use, not this machine's, no permission
        raise PublishError(
            f"cannot serve {index_dir} on {host} port {port}",
            why=exc.strerror or str(exc),
            fix="choose another --port (--port 0 takes a free one) or another --host",
        ) from None
