"""The index's writers and readers: publish, rebuild, remove, yank, record test results.
Every writer holds the index lock and marks its change with a journal first (the journal
and the recovery of an interrupted change are in :mod:`.recovery`)."""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from .._fs import fsync_path, locked, sha256_file
from ..errors import IndexWarning, PublishError
from ..wheel import check_wheel, retag
from . import health
from ._writes import Data, _index_errors
from ._writes import disk_error as disk_error  # index.store.disk_error: the callers' name
from .records import (
    _ARCH_RE,
    _CHANNEL_RE,
    _RESERVED_CHANNELS,
    FILES_DIR,
    LOCK_FILE,
    METADATA_SUFFIX,
    SIDECAR_SUFFIX,
    PublishResult,
    WheelRecord,
    _derive,
    _inspect_wheel,
    _Listing,
    _load_record,
    _metadata_file,
    _now,
    _parse_version,
    _parsed,
    _read_sidecar,
    _scan,
    _sidecar,
    _sort_key,
    _sweep_and_scan,
    _WheelInfo,
    to_json,
)
from .recovery import _changing, _recover, _sync_checked

# --------------------------------------------------------------------------- public operations


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _guarded(doing: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Turn an OSError of the decorated writer (whose first argument is the index) into
    a PublishError that names the path, the cause and the fix."""
    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(fn)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with _index_errors(Path(str(args[0])), doing):
                return fn(*args, **kwargs)
        return wrapper
    return decorate


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


@_guarded("publish into")
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
    info, sha256 = _prepare(wheel)
    with locked(index_dir / LOCK_FILE):
        _recover(index_dir)
        return _publish_locked(index_dir, wheel, info, sha256, (channel, cuda, torch, arch_list,
                                                                 build_key))


def _prepare(wheel: Path) -> tuple[_WheelInfo, str]:
    """The wheel's name and METADATA checked, then verified again as a file (RECORD
    hashes and sizes, WHEEL tags, METADATA name and version: VerifyError), and its sha256
    (before the lock is taken).  The index trusts no caller: a wheel changed between its
    build's verification and its publish is refused here."""
    if wheel.is_symlink() or not wheel.is_file():
        raise PublishError(f"{wheel} does not exist or is not a plain file",
                           why="a symlink or a special file is never published (its target "
                               "could change after the check)",
                           fix="publish the wheel the build produced")
    info = _inspect_wheel(wheel)
    check_wheel(wheel)
    return info, sha256_file(wheel)


_Target = tuple[str | None, str | None, str | None, tuple[str, ...], str | None]


def _publish_locked(index_dir: Path, wheel: Path, info: _WheelInfo, sha256: str,
                    target: _Target) -> PublishResult:
    """publish(), the caller holding the index lock (and having recovered the index)."""
    channel, cuda, torch, arch_list, build_key = target
    files = index_dir / FILES_DIR
    dest = files / wheel.name
    existing: WheelRecord | None = None
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
    record_text = to_json(record)
    _check_room(index_dir, wheel if not dest.is_file() else None)
    with _changing(index_dir, {"op": "publish", "filename": dest.name,
                               "record": record_text}) as change:
        # one batch: the wheel, its .metadata, its sidecar (the record commits it), then
        # the pages; nothing is renamed before everything is durable in temp files
        first: list[tuple[Path, Data]] = [] if dest.is_file() else [(dest, wheel)]
        first += [(_metadata_file(dest), info.metadata), (_sidecar(dest), record_text.encode())]
        names = listing.groups.setdefault(info.project, [])
        if dest.name not in names:
            names.append(dest.name)
        listing = _Listing(listing.groups, listing.names | {
            dest.name, _metadata_file(dest).name, _sidecar(dest).name})
        _sync_checked(index_dir, listing, {info.project: {dest.name: record}}, full=False,
                      change=change, first=first)
    return PublishResult(path=dest, record=record, noop=False)


def _check_room(index_dir: Path, wheel: Path | None) -> None:
    """PublishError (nothing written) when the index's filesystem cannot hold the wheel
    and a rewrite of the pages a publish changes (a few times the landing page)."""
    where = index_dir
    while not where.exists() and where != where.parent:
        where = where.parent  # a new index: the filesystem it will be made on
    try:
        st = os.statvfs(where)
        free = st.f_bavail * st.f_frsize
        landing = index_dir / "index.html"
        pages = 4 * landing.stat().st_size if landing.is_file() else 0
    except OSError:
        return
    needed = (wheel.stat().st_size if wheel is not None else 0) + pages + (256 << 10)
    if free < needed:
        raise PublishError(
            f"not enough free space in {index_dir} to publish",
            why=f"{free >> 10} KiB free, about {needed >> 10} KiB needed (the wheel and the "
                "pages it changes); nothing was written",
            fix=f"free space on the filesystem of {index_dir} (df -h {index_dir}), then run "
                "the command again")


@dataclass(frozen=True, kw_only=True)
class BuildPublishResult:
    """What :func:`publish_build` did.

    ``published`` is False when the build key was found already published (by another
    run, or by an earlier build): nothing was written and ``path``/``record`` describe
    that earlier wheel; ``reproduced`` when a forced rebuild of that key gave the same
    bytes under that wheel's name.  Else ``path`` is the wheel now in ``files/`` (``noop``
    when the same bytes with the same target were there already); ``differs_from``: the
    wheel of the same build key that a forced rebuild did not reproduce byte for byte.
    """

    path: Path
    record: WheelRecord
    published: bool
    noop: bool = False
    reproduced: bool = False
    differs_from: str | None = None


Relabel = Callable[[str | None], Path]


@_guarded("publish into")
def publish_build(
    index_dir: Path,
    wheel: Path,
    *,
    build_key: str,
    channel: str | None,
    cuda: str | None,
    torch: str | None,
    archs: Sequence[str],
    relabel: Relabel | None = None,
    force: bool = False,
) -> BuildPublishResult:
    """Publish the wheel of one build, every decision taken under the index lock.

    In one critical section of the index lock: an interrupted change is finished; the
    records of the wheel's project are searched for ``build_key`` (found: nothing is
    written, ``published=False``); the build number is chosen (none when no published
    wheel has this name, version and tags, else one more than the highest, PEP 427);
    the wheel is published under that name.  ``wheel`` is the verified wheel as built,
    with any build number; when the number chosen is another, ``relabel(build_tag)``
    must return the same wheel under that build number (default:
    :func:`wheelforge.wheel.retag` into a directory beside ``wheel``).  ``force`` (a
    ``wheelforge build --force``) builds even when the key is published: the rebuild,
    under the published wheel's build number, holding the same bytes is that wheel
    (``reproduced``, nothing written); else it is published under the next build number
    (``differs_from`` names the one it did not reproduce).

    N concurrent calls with one build key publish one file; calls with different keys
    for the same version publish distinct build numbers.
    """
    index_dir, wheel = Path(index_dir), Path(wheel)
    arch_list = _validate_target(channel, cuda, torch, archs)
    info, sha256 = _prepare(wheel)
    target: _Target = (channel, cuda, torch, arch_list, build_key)
    files = index_dir / FILES_DIR
    with locked(index_dir / LOCK_FILE):
        _recover(index_dir)
        listing = _scan(files, strict=False, sweep=False)
        found = _find_build_key(files, listing.groups.get(info.project, []), build_key)
        differs_from = None
        if found is not None and force:
            if _same_build(files / found.filename, wheel, relabel):
                return BuildPublishResult(path=files / found.filename, record=found,
                                          published=False, reproduced=True)
            differs_from, found = found.filename, None
        if found is not None:
            return BuildPublishResult(path=files / found.filename, record=found, published=False)
        tag = _build_tag(files, listing.groups.get(info.project, []), wheel, sha256)
        if tag != _tag_of(wheel.name):
            wheel = (relabel or _default_relabel(wheel))(tag)
            if _tag_of(wheel.name) != tag:
                raise PublishError(
                    f"relabel gave {wheel.name}, not a wheel with build number {tag}",
                    fix="make the relabel callable apply the build tag it is given")
            info, sha256 = _prepare(wheel)
        result = _publish_locked(index_dir, wheel, info, sha256, target)
    return BuildPublishResult(path=result.path, record=result.record, published=True,
                              noop=result.noop, differs_from=differs_from)


def _same_build(published: Path, wheel: Path, relabel: Relabel | None) -> bool:
    """Whether ``wheel``, under ``published``'s build number, is ``published`` byte for
    byte (a rebuild of the same build key that reproduced it)."""
    try:
        tag = _tag_of(published.name)
        if tag != _tag_of(wheel.name):
            wheel = (relabel or _default_relabel(wheel))(tag)
        return wheel.name == published.name and sha256_file(wheel) == sha256_file(published)
    except (OSError, InvalidWheelFilename):
        return False


def _tag_of(filename: str) -> str | None:
    build = parse_wheel_filename(filename)[2]
    return f"{build[0]}{build[1]}" if build else None


def _find_build_key(files: Path, names: Iterable[str], build_key: str) -> WheelRecord | None:
    """The record among ``names`` (wheels of one project) with ``build_key``, read-only."""
    for name in sorted(names):
        with contextlib.suppress(OSError, PublishError):
            record = _read_sidecar(_sidecar(files / name))
            if record.build_key == build_key and record.filename == name:
                return record
    return None


def _build_tag(files: Path, names: Iterable[str], wheel: Path, sha256: str) -> str | None:
    """The build number under which ``wheel`` is published: its own when a file of that
    name holds the same bytes under a record without a build target (publish completes
    it), else none when no wheel of this name, version and tags is published, else the
    highest number plus one (also for the same bytes under another build key: a
    reproducible build of other inputs)."""
    try:
        project, version, _build, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise PublishError(f"{wheel.name} is not a valid wheel file name", why=str(exc)) from None
    same = files / wheel.name
    if same.is_file() and sha256_file(same) == sha256 and not _targeted(same):
        return _tag_of(wheel.name)  # publish completes a record derived without a target
    taken = []
    for name in names:
        try:
            other = parse_wheel_filename(name)
        except InvalidWheelFilename:
            continue
        if (other[0], other[1], other[3]) == (project, version, tags):
            taken.append(other[2][0] if other[2] else 0)
    return str(max(taken) + 1) if taken else None


def _targeted(wheel: Path) -> bool:
    try:
        return _has_target(_read_sidecar(_sidecar(wheel)))
    except (OSError, PublishError):
        return False


def _default_relabel(wheel: Path) -> Relabel:
    def relabel(tag: str | None) -> Path:
        return retag(wheel, wheel.parent / f"build-{tag}", tag)

    return relabel


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


@_guarded("rebuild")
def rebuild(index_dir: Path) -> int:
    """Regenerate every page from files/*.whl and the sidecars; return the wheel count."""
    index_dir = Path(index_dir)
    with locked(index_dir / LOCK_FILE), _no_cycle_collection():
        _recover(index_dir)
        with _changing(index_dir, {"op": "rebuild"}) as change:
            listing = _sweep_and_scan(index_dir)
            _sync_checked(index_dir, listing, {}, full=True, change=change)
            listing = _scan(index_dir / FILES_DIR, strict=False, sweep=False)
    return sum(len(names) for names in listing.groups.values())


@_guarded("record the stack status in")
def record_stack(index_dir: Path, status: health.StackStatus) -> health.StackStatus | None:
    """Record a channel's stack status and refresh the landing page that shows it, in one
    change under the index lock; return the status it replaces (None: there was none).
    Only the pages whose bytes change are written (the landing page): no wheel is read."""
    index_dir = Path(index_dir)
    with locked(index_dir / LOCK_FILE):
        _recover(index_dir)
        before = health.read_status(index_dir, status.channel)
        with _changing(index_dir, {"op": "stack", "channel": status.channel}) as change:
            health.write_status(index_dir, status)
            listing = _scan(index_dir / FILES_DIR, strict=False, sweep=True)
            _sync_checked(index_dir, listing, {}, full=False, change=change)
    return before


@_guarded("refresh the landing page of")
def refresh(index_dir: Path) -> None:
    """Render the pages again from what the index holds, writing only those whose bytes
    change: after a nightly report (the landing page's coverage table reads it).  No
    wheel is read."""
    index_dir = Path(index_dir)
    with locked(index_dir / LOCK_FILE):
        _recover(index_dir)
        with _changing(index_dir, {"op": "refresh"}) as change:
            listing = _scan(index_dir / FILES_DIR, strict=False, sweep=True)
            _sync_checked(index_dir, listing, {}, full=False, change=change)


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


@_guarded("remove wheels from")
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
        with _changing(index_dir, {"op": "remove", "names": sorted(doomed)}) as change:
            _sync_checked(index_dir, _Listing(groups, listing.names - gone), {}, full=True,
                          change=change)
            change.dirty = True
            for name in sorted(doomed):
                for suffix in ("", METADATA_SUFFIX, SIDECAR_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        (files / (name + suffix)).unlink()
            fsync_path(files)
    return sorted(doomed)


@_guarded("update records in")
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
        first: list[tuple[Path, Data]] = []
        for name in matches:
            record = _load_record(files, name, check_size=False)
            new = replace(record, **change)
            if new != record:
                first.append((_sidecar(files / name), to_json(new).encode()))
            updated[name] = new
        journal = {"op": "update", "records": {p.name.removesuffix(SIDECAR_SUFFIX):
                                               data.decode() for p, data in first
                                               if isinstance(data, bytes)}}
        with _changing(index_dir, journal) as state:
            _sync_checked(index_dir, listing, {normalized: updated}, full=False,
                          change=state, first=first)
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

    A wheel without a sidecar is described as :func:`rebuild` would derive it.  A wheel
    whose record cannot be read or derived is left out with an :class:`IndexWarning`
    (the next rebuild quarantines it).
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
                _warn_unlisted(files, name, "not a valid wheel file name")
                continue
            except FileNotFoundError:
                pass  # removed since the listing, or a publish is finishing
            except PublishError as exc:
                _warn_unlisted(files, name, exc.what.replace(f"{files}{os.sep}", ""))
                continue
            try:
                out.append(_derive(wheel, write=False))
            except FileNotFoundError:
                pass
            except PublishError as exc:
                _warn_unlisted(files, name, exc.what)
    return sorted(out, key=lambda r: (r.project, *_sort_key(r)))


def _warn_unlisted(files: Path, name: str, why: str) -> None:
    warnings.warn(IndexWarning(
        f"{files / name} is left out: {why}; `wheelforge index rebuild --index "
        f"{files.parent}` quarantines it"), stacklevel=3)
