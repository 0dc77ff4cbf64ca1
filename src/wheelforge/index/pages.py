"""PEP 503 / PEP 691 pages and their derived caches, generated from the records, and the
sync that brings them in line with ``files/``."""

from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import json
import os
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
)
from packaging.version import Version

from . import coverage, health, pins
from ._markup import _JSON, _e, _json_text, _quote
from ._writes import Data, _write_all
from .landing import ChannelInstall, _landing_page, _landing_row, archs_in_rows, row_archs
from .records import (
    _CACHE_SCHEMA,
    _RESERVED_CHANNELS,
    _SUMMARY_FILE,
    API_VERSION,
    CACHE_DIR,
    CONSTRAINTS_FILE,
    FILES_DIR,
    NIGHTLY_REPORT,
    REPORTS_DIR,
    SIMPLE_DIR,
    BadRecord,
    BadRecords,
    WheelRecord,
    _is_pure,
    _Listing,
    _load_record,
    _parsed,
)

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
    #: (member, its SASS archs space-separated, the newest non-yanked version) of every
    #: channel and arch set built ("*", "": pure), for the coverage table
    cells: tuple[tuple[str, str, str], ...] = ()


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
                                        tuple((str(m), str(v)) for m, v in s["pins"]),
                                        tuple((str(m), str(a), str(v)) for m, a, v in s["cells"]))
            for p, s in data["projects"].items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _summary_bytes(summary: Mapping[NormalizedName, _Summary]) -> bytes:
    payload = {
        "schema": _CACHE_SCHEMA,
        "projects": {
            p: {"names": s.names, "channels": list(s.channels), "pure": s.pure,
                "pins": [list(pin) for pin in s.pins], "cells": [list(c) for c in s.cells]}
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
    bad: dict[str, str] | None = None,
) -> tuple[list[_Entry], bool]:
    """The project's entries, sorted, and whether they differ from the cache.

    Records come from ``updated``, else the cache, else the sidecar; ``full``
    ignores the cache.  A wheel whose record cannot be read or derived (a corrupt
    sidecar, a file that is not a wheel) is left out and named in ``bad``, with why.
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
            except InvalidWheelFilename as exc:
                if bad is None:
                    continue
                bad[name] = f"not a valid wheel file name ({exc})"
                continue
            try:
                record = _load_record(files, name, check_size=full, present=listing.names)
            except BadRecord as exc:
                if bad is None:
                    raise
                bad[name] = exc.reason
                continue
        fresh.append(_entry(record))
    if full:
        return sorted(fresh, key=_entry_key), True
    for entry in fresh:
        bisect.insort(entries, entry, key=_entry_key)
    return entries, entries != cached


def _summarize(entries: Sequence[_Entry], names: str) -> _Summary:
    members = {e.member for e in entries}
    newest: dict[str, str] = {}
    cells: dict[tuple[str, str], str] = {}
    for e in entries:  # sorted oldest first: the last non-yanked one per member wins
        if not e.yanked:
            newest[e.member] = e.version
            if e.member:
                sass = sorted(a for a in row_archs(e.row) if a.startswith("sm_"))
                cells[(e.member, " ".join(sass) if e.member != "*" else "")] = e.version
    return _Summary(names, tuple(sorted(members - {"", "*"})), "*" in members,
                    tuple(sorted(newest.items())),
                    tuple((m, a, v) for (m, a), v in sorted(cells.items())))



# --------------------------------------------------------------------------- pages



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
        with contextlib.suppress(FileNotFoundError):
            (directory.parent / health.STACK_FILE).unlink()  # and its stack status
        with contextlib.suppress(OSError):
            directory.parent.rmdir()  # a channel directory left empty


def _sync(
    index_dir: Path,
    listing: _Listing,
    updated: Mapping[NormalizedName, Mapping[str, WheelRecord]],
    *,
    full: bool,
    first: Sequence[tuple[Path, Data]] = (),
) -> None:
    """Bring caches and pages in line with ``listing`` (the wheels in files/).

    Incremental (``full=False``): reload the projects in ``updated`` and those
    whose set of wheel names differs from the summary; rewrite their pages;
    regenerate the root pages and the landing page (each written only when its
    bytes change).  ``full``: reload every project from the sidecars and
    remove pages that no wheel supports any more.

    ``first`` (a publish's wheel, ``.metadata`` and sidecar) is written in the same
    batch, renamed before every page: a full disk fails the whole change before
    anything is renamed.  Raises :class:`BadRecords`, before writing anything, when
    wheels in the listing have a record that cannot be read or derived.
    """
    groups = listing.groups
    old = {} if full else _load_summary(index_dir)
    summary: dict[NormalizedName, _Summary] = {}
    entries: dict[NormalizedName, list[_Entry]] = {}
    caches: list[tuple[Path, bytes]] = []

    bad: dict[str, str] = {}

    def load(project: NormalizedName) -> list[_Entry]:
        found, changed = _project_entries(
            index_dir, project, groups[project], updated.get(project, {}), listing, full=full,
            bad=bad,
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
    stacks = health.read_statuses(index_dir, sorted(new_channels))
    installs = _installs(index_dir, summary, groups, sorted(new_channels))
    archs = archs_in_rows(rows.values())
    table = coverage.coverage_section(_built(summary), coverage.read_report(index_dir),
                                      new_channels)
    landing = _landing_page(rows, sorted(new_channels), wheels, report, stacks, installs,
                            archs, table).encode()
    if bad:
        raise BadRecords(bad)
    # the published files, caches, then project pages, then the roots that link to them,
    # the landing page, and last the summary (an interrupted batch leaves the marker, and
    # the next change rebuilds everything)
    _write_all([*first, *caches, *pages, *roots, (index_dir / "index.html", landing),
                (index_dir / CACHE_DIR / _SUMMARY_FILE, _summary_bytes(summary))])
    for directory in removals:
        _remove_pages(directory)


def _built(summary: Mapping[NormalizedName, _Summary]) -> list[coverage.Built]:
    """What the coverage table shows as built: each project's newest wheel per target."""
    return [coverage.Built(project=p, channel=None if m == "*" else m, archs=a, version=v)
            for p, s in sorted(summary.items()) for m, a, v in s.cells]


def _installs(index_dir: Path, summary: Mapping[NormalizedName, _Summary],
              groups: Mapping[NormalizedName, Sequence[str]], channels: Sequence[str]
              ) -> list[ChannelInstall]:
    """The landing page's install blocks: per channel (the top-level pages when there is
    none) its projects that have an installable version, the Python of its compiled wheels
    and which of them needs another (from the newest wheels' METADATA)."""
    out = []
    every: list[str | None] = [*channels] or [None]
    for channel in every:
        members = _members(summary, channel) if channel else sorted(summary)
        chosen: dict[str, str] = {}  # project: the newest wheel's file name on these pages
        for project in members:
            newest = _newest(summary[project], None if channel is None else {channel, "*"})
            if newest is None:
                continue
            for name in groups.get(project, ()):
                parsed = _parsed(name)
                if str(parsed.version) == newest:
                    chosen[str(project)] = name
                    break
        if not chosen:
            continue
        tags = {t.interpreter for name in chosen.values() if not _is_pure(name)
                for t in _parsed(name).tags}
        python = None
        if len(tags) == 1 and (tag := next(iter(tags))).startswith("cp") and tag[2:].isdigit():
            python = f"{tag[2]}.{tag[3:]}"
        needs = []
        for wanted, name in chosen.items():
            others = sorted(_local_requirements(index_dir / FILES_DIR / f"{name}.metadata",
                                                set(chosen) - {wanted}))
            if others:
                needs.append(f"{wanted} needs {', '.join(others)}: installed with it")
        out.append(ChannelInstall(channel=channel, projects=tuple(chosen), python=python,
                                  companions=tuple(needs)))
    return out


def _local_requirements(metadata: Path, local: set[str]) -> set[str]:
    """The projects of ``local`` that a wheel's METADATA requires (extras left out)."""
    try:
        text = metadata.read_bytes().decode("utf-8", "replace")
    except OSError:
        return set()
    found = set()
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Requirement(line.split(":", 1)[1].strip())
        except InvalidRequirement:
            continue
        if req.marker is not None and "extra" in str(req.marker):
            continue
        if canonicalize_name(req.name) in local:
            found.add(str(canonicalize_name(req.name)))
    return found


def _newest(summary: _Summary, members: Container[str] | None) -> str | None:
    """The newest non-yanked version among ``members`` (None: all); None when none is."""
    found = [v for m, v in summary.pins if members is None or m in members]
    return max(found, key=Version) if found else None


def _constraints_files(index_dir: Path, summary: Mapping[NormalizedName, _Summary],
                       channels: Iterable[str]) -> list[tuple[Path, bytes]]:
    """``constraints.txt`` for the whole index and for each channel: the newest non-yanked
    version of every project their pages list (see pins.constraints_text)."""
    out = []
    for channel in [None, *sorted(channels)]:
        if channel is None:
            where, title = index_dir, SIMPLE_DIR + "/"
            newest = [(p, _newest(s, None)) for p, s in sorted(summary.items())]
        else:
            where, title = index_dir / channel, f"{channel}/{SIMPLE_DIR}/"
            newest = [(p, _newest(summary[p], (channel, "*"))) for p in _members(summary, channel)]
        out.append((where / CONSTRAINTS_FILE, pins.constraints_text(newest, title).encode()))
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
