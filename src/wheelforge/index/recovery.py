"""The index's change journal and its recovery: every writer marks its change with a
journal (``.records/_writing``) before it writes, and the next writer (or :func:`repair`)
finishes or rolls back a change that a killed writer left, sweeps its temp files,
rebuilds every page and quarantines wheels whose record cannot be read."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.utils import NormalizedName

from .._fs import TMP_PREFIX, atomic_write, discard, fsync_path, read_file, sha256_file, try_locked
from ..errors import IndexWarning, PublishError
from ._writes import Data, PartialWrite, _index_errors
from .pages import _sync
from .records import (
    _WRITING,
    CACHE_DIR,
    FILES_DIR,
    LOCK_FILE,
    METADATA_SUFFIX,
    REPORTS_DIR,
    SIDECAR_SUFFIX,
    BadRecords,
    WheelRecord,
    _inspect_wheel,
    _Listing,
    _metadata_file,
    _now,
    _sidecar,
    _sweep_and_scan,
    from_json,
)

QUARANTINE_DIR = ".quarantine"


def _marker(index_dir: Path) -> Path:
    return index_dir / CACHE_DIR / _WRITING


class _Change:
    """The state of one change: ``dirty`` once anything under a final name has changed
    (a rollback by simply dropping the marker is then no longer possible)."""

    def __init__(self) -> None:
        self.dirty = False


@contextlib.contextmanager
def _changing(index_dir: Path, journal: Mapping[str, Any]) -> Iterator[_Change]:
    """Mark the index as being changed for the duration, with a journal of the change.

    The marker ``.records/_writing`` holds ``journal`` (what the change is: enough to
    finish it) and who made it; it is made durable before anything else is written.
    It is removed when the change is done, and also when it failed before anything
    under a final name changed (a full disk fails a batch before its first rename).
    Any other failure, or a kill, leaves it: the next change (or :func:`repair`)
    finishes the change from the journal and rebuilds every page.
    """
    marker = _marker(index_dir)
    marker.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({**journal, "pid": os.getpid(), "started": _now()}, sort_keys=True)
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            data = memoryview(text.encode())
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_path(marker.parent)
    except OSError:
        discard(marker)
        raise
    change = _Change()
    try:
        yield change
    except PartialWrite:
        raise
    except OSError:
        if not change.dirty:
            discard(marker)  # nothing changed: the change is rolled back
        raise
    marker.unlink()
    fsync_path(marker.parent)


def _recover(index_dir: Path) -> bool:
    """After an interrupted change (the marker is there): finish it from its journal,
    sweep every temp file and rebuild every page; True when there was one.  The caller
    holds the lock."""
    marker = _marker(index_dir)
    try:
        text = read_file(marker)
    except FileNotFoundError:
        return False
    try:
        journal = json.loads(text)
        if not isinstance(journal, dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError):
        journal = {}  # killed while writing the marker: nothing else was written yet
    files = index_dir / FILES_DIR
    who = f"pid {journal.get('pid', '?')}, started {journal.get('started', '?')}"
    done = "finished"
    op = journal.get("op")
    if op == "publish":
        done = _finish_publish(files, journal)
    elif op == "update":
        for name, record_text in journal.get("records", {}).items():
            if (files / name).is_file() and _sidecar_text(files / name) != record_text:
                atomic_write(_sidecar(files / name), record_text)
    elif op == "remove":
        for name in journal.get("names", []):
            for suffix in ("", METADATA_SUFFIX, SIDECAR_SUFFIX):
                discard(files / (name + suffix))
    listing = _sweep_and_scan(index_dir)
    _sync_checked(index_dir, listing, {}, full=True, change=_Change())
    marker.unlink()
    fsync_path(marker.parent)
    what = {"publish": f"publish of {journal.get('filename')}", "update": "record update",
            "remove": f"removal of {', '.join(journal.get('names', []))}",
            "rebuild": "rebuild", "stack": "stack status record",
            "refresh": "refresh of the pages"}.get(str(op), "change")
    warnings.warn(IndexWarning(
        f"{index_dir}: {done} an interrupted {what} ({who}); every page was rebuilt "
        "from files/"), stacklevel=2)
    return True


def _finish_publish(files: Path, journal: Mapping[str, Any]) -> str:
    """Roll an interrupted publish forward when its wheel is in place, else back."""
    try:
        record = from_json(journal["record"])
    except (KeyError, TypeError, PublishError):
        return "rolled back"
    dest = files / record.filename
    if not dest.is_file() or os.stat(dest).st_size != record.size or \
            sha256_file(dest) != record.sha256:
        return "rolled back"  # the wheel never reached files/; its temp files are swept
    metadata = _inspect_wheel(dest).metadata
    meta = _metadata_file(dest)
    if not meta.is_file() or read_file(meta) != metadata:
        atomic_write(meta, metadata)
    if _sidecar_text(dest) != journal["record"]:
        atomic_write(_sidecar(dest), journal["record"])
    return "finished"


def _sidecar_text(wheel: Path) -> str | None:
    try:
        return read_file(_sidecar(wheel)).decode("utf-8", "replace")
    except FileNotFoundError:
        return None


def _sync_checked(index_dir: Path, listing: _Listing,
                  updated: Mapping[NormalizedName, Mapping[str, WheelRecord]], *, full: bool,
                  change: _Change, first: Sequence[tuple[Path, Data]] = ()) -> None:
    """:func:`_sync`, quarantining the wheels whose record cannot be read or derived."""
    if listing.invalid:
        _quarantine(index_dir, {n: "not a valid wheel file name" for n in listing.invalid},
                    change)
        listing = _Listing(listing.groups, listing.names)
    for _attempt in range(3):
        try:
            _sync(index_dir, listing, updated, full=full, first=first)
        except BadRecords as exc:
            _quarantine(index_dir, exc.bad, change)
            listing = _without(listing, exc.bad)
            continue
        except PartialWrite:
            change.dirty = True
            raise
        return
    raise PublishError(f"the records in {index_dir / FILES_DIR} keep changing",
                       why="wheels turned unreadable while the pages were generated",
                       fix="stop whatever is writing into files/, then run `wheelforge index "
                           "rebuild`")


def _without(listing: _Listing, names: Iterable[str]) -> _Listing:
    gone = set(names)
    groups = {p: kept for p, ns in listing.groups.items() if (kept := [n for n in ns
                                                                       if n not in gone])}
    every = {n + suffix for n in gone for suffix in ("", METADATA_SUFFIX, SIDECAR_SUFFIX)}
    return _Listing(groups, listing.names - every)


def _quarantine(index_dir: Path, bad: Mapping[str, str], change: _Change) -> None:
    """Move each wheel named in ``bad`` (with its .metadata and sidecar) out of files/
    into .quarantine/, with a ``.why`` file, and warn: never served, never hidden
    without a word."""
    files, shelf = index_dir / FILES_DIR, index_dir / QUARANTINE_DIR
    shelf.mkdir(exist_ok=True)
    for name, why in sorted(bad.items()):
        kept, n = name, 0
        while any(os.path.lexists(shelf / (kept + s))
                  for s in ("", METADATA_SUFFIX, SIDECAR_SUFFIX, ".why")):
            n += 1
            kept = f"{name}.{n}"
        atomic_write(shelf / f"{kept}.why", f"{name}: {why}\n")
        moved = []
        for suffix in ("", METADATA_SUFFIX, SIDECAR_SUFFIX):
            if os.path.lexists(files / (name + suffix)):
                change.dirty = True
                os.replace(files / (name + suffix), shelf / (kept + suffix))
                moved.append(name + suffix)
        warnings.warn(IndexWarning(
            f"quarantined {', '.join(moved) or name} from {files} to {shelf}: {why}. No page "
            f"lists it. Repair or delete it there (a sound wheel moved back into files/ is "
            f"listed again by `wheelforge index rebuild`)"), stacklevel=2)
    fsync_path(files)
    fsync_path(shelf)


def repair(index_dir: Path, *, wait: bool = True) -> bool:
    """Finish or roll back a change that a killed writer left in ``index_dir`` (see
    :func:`_recover`); True when there was one.  Cheap when there is none (one stat).

    ``wait=False`` gives up at once (False) when a writer holds the lock: that writer is
    alive and finishes its own change.  PublishError when the index cannot be written
    (a read-only copy): its pages are then the ones before the interrupted change,
    which are valid, but may lag behind files/.
    """
    index_dir = Path(index_dir)
    if not _marker(index_dir).exists() and not _report_temps(index_dir):
        return False
    with _index_errors(index_dir, "finish the interrupted change in"), \
            try_locked(index_dir / LOCK_FILE, wait=wait) as mine:
        if not mine:
            return False
        swept = False
        for temp in _report_temps(index_dir):  # a nightly killed writing its report
            discard(temp)
            swept = True
        return _recover(index_dir) or swept


def _report_temps(index_dir: Path) -> list[Path]:
    """Temp files in ``reports/`` (the nightly writes its reports there under the index
    lock, outside any change)."""
    try:
        with os.scandir(index_dir / REPORTS_DIR) as found:
            return [Path(e.path) for e in found if e.name.startswith(TMP_PREFIX)]
    except OSError:
        return []
