"""Records of published wheels: the sidecar format, wheel inspection and the listing of
``files/``.  The index layout's names are defined here."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import warnings
import zipfile
import zlib
from collections.abc import Container
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

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

from .._fs import TMP_PREFIX, atomic_write, discard, read_file, sha256_file, sweep_temp_files
from ..errors import IndexWarning, PublishError
from ..wheel import member_problems

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
_CACHE_SCHEMA = 6  # of the .records caches; bump whenever the page templates change
_WRITE_THREADS = 16  # _write_all: an fsync mostly waits for the disk (8, 16, 32, 64 measured)
_CHUNKS_PER_THREAD = 4
_SUMMARY_FILE = "_summary.json"  # '_' cannot start a normalized project name
_WRITING = "_writing"  # present while a change is in progress
CONSTRAINTS_FILE = "constraints.txt"  # beside each simple/: pins.constraints_text
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


def stable_channel_name(cuda: str) -> str:
    """``"13.0"`` -> ``"cu13-stable"``: the channel of the stable-ABI wheels of one CUDA
    major, which serve every torch of that major from the one they require on."""
    return f"cu{_parse_version(cuda, 'CUDA version').release[0]}-stable"


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
            unsafe = member_problems(zf.infolist())  # what verify refuses, refused here too
            if unsafe:
                raise PublishError(f"{path.name} holds unsafe members",
                                   why="; ".join(unsafe[:10]),
                                   fix="do not publish it; build it with `wheelforge build`")
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
        warnings.warn(IndexWarning(
            f"{wheel} had no record (a file copied in by hand?): published it with a record "
            "derived from the wheel, without a build target (no channel, no build key)"),
            stacklevel=2)
    return record


class BadRecord(PublishError):
    """The record of a wheel in files/ cannot be read or derived: a corrupt or foreign
    sidecar, or a file that is not a readable wheel.  ``reason`` says why."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"files/{name}: {reason}",
                         fix="`wheelforge index rebuild` moves it to .quarantine/ and lists "
                             "every other wheel")
        self.name = name
        self.reason = reason


class BadRecords(Exception):
    """Raised by a page sync, before it writes anything: these wheels (name -> why) have
    records that cannot be read or derived."""

    def __init__(self, bad: dict[str, str]):
        super().__init__(", ".join(sorted(bad)))
        self.bad = bad


def _load_record(files: Path, name: str, *, check_size: bool,
                 present: Container[str] | None = None) -> WheelRecord:
    """:func:`_load_record_or_raise`; BadRecord when the record is corrupt or the wheel
    cannot be read."""
    try:
        return _load_record_or_raise(files, name, check_size=check_size, present=present)
    except (BadRecord, ModifiedWheel):
        raise
    except PublishError as exc:
        reason = exc.what.replace(f"{files}{os.sep}", "").replace(f"{name}{SIDECAR_SUFFIX}: ", "")
        raise BadRecord(name, reason + (f" ({exc.why})" if exc.why else "")) from None


class ModifiedWheel(PublishError):
    """A published wheel whose size is not its record's: refused, not quarantined (the
    record is sound; the file was changed)."""


def _load_record_or_raise(files: Path, name: str, *, check_size: bool,
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
        raise ModifiedWheel(
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
    invalid: tuple[str, ...] = ()  # .whl names that do not parse (a strict scan that keeps them)


def _scan(files: Path, *, strict: bool, sweep: bool, keep_invalid: bool = False) -> _Listing:
    """List ``files/``: wheel names grouped by project; sweeps temp files.

    The fast mode takes the project from the text before the first '-' (the
    wheel spec escapes '-' inside names), normalized once per distinct prefix;
    ``strict`` parses every name and reports those that are not wheels (or, with
    ``keep_invalid``, returns them in ``invalid``, for quarantine).  Every
    change lists files/ (three files per wheel), hence the comprehensions.
    """
    try:
        with os.scandir(files) as found:
            entries = list(found)
    except FileNotFoundError:
        return _Listing({}, frozenset())
    except OSError as exc:  # a file where files/ should be, no permission
        raise PublishError(f"cannot list the index's {files}", why=exc.strerror or str(exc),
                           fix=f"{files} must be the directory of the wheels; move what is "
                               "there away, or point --index at the index directory"
                           ) from None
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
    if bad and keep_invalid:
        return _Listing(groups, names, tuple(sorted(bad)))
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
    return _scan(index_dir / FILES_DIR, strict=True, sweep=True, keep_invalid=True)
