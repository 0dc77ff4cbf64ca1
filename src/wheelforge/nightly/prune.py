"""Retention: keep the newest builds per project and channel and remove the rest, never
a wheel that the newest entry of a channel requires; pages are rewritten without the
wheels before their files go, so that no page ever links a missing file."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import InvalidVersion, Version

from .. import index
from ..errors import WheelforgeError
from ..wheel import read_metadata


@dataclass(frozen=True)
class PruneResult:
    removed: tuple[str, ...]
    protected: tuple[tuple[str, str], ...]  # (wheel kept beyond N, the wheel requiring it)


def _newest_first(records: Sequence[index.WheelRecord]) -> list[index.WheelRecord]:
    def key(r: index.WheelRecord) -> tuple[str, Version, str]:
        try:
            version = Version(r.version)
        except InvalidVersion:
            version = Version("0")
        return (r.upload_time, version, r.filename)

    return sorted(records, key=key, reverse=True)


def _requirements(metadata: bytes) -> list[Requirement]:
    from email.parser import BytesParser

    out = []
    for text in BytesParser().parsebytes(metadata).get_all("Requires-Dist") or []:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and "extra" in str(req.marker):
            continue  # needed only with an extra
        out.append(req)
    return out


def plan_prune(records: Sequence[index.WheelRecord], keep: int,
               metadata: Callable[[index.WheelRecord], bytes]) -> PruneResult:
    """Which wheels to remove: all but the ``keep`` newest per (project, channel), except
    those that the newest wheel of a channel requires (``metadata`` reads a wheel's
    core metadata).  Of the wheels satisfying such a requirement, one kept already is
    enough; else the newest is kept.  Channel-less wheels serve every channel."""
    groups: dict[tuple[NormalizedName, str | None], list[index.WheelRecord]] = {}
    for r in records:
        groups.setdefault((r.project, r.channel), []).append(r)
    kept: set[str] = set()
    newest: list[index.WheelRecord] = []
    for members in groups.values():
        ordered = _newest_first(members)
        kept.update(r.filename for r in ordered[:keep])
        newest.append(ordered[0])
    by_project: dict[NormalizedName, list[index.WheelRecord]] = {}
    for r in records:
        by_project.setdefault(r.project, []).append(r)
    protected: list[tuple[str, str]] = []
    todo, seen = list(newest), set()
    while todo:
        wanting = todo.pop()
        if wanting.filename in seen:
            continue
        seen.add(wanting.filename)
        for req in _requirements(metadata(wanting)):
            candidates = [
                r for r in _newest_first(by_project.get(canonicalize_name(req.name), []))
                if r.channel in (None, wanting.channel)
                and req.specifier.contains(r.version, prereleases=True)]
            if not candidates or any(r.filename in kept for r in candidates):
                todo.extend(r for r in candidates if r.filename in kept)
                continue
            kept.add(candidates[0].filename)
            protected.append((candidates[0].filename, wanting.filename))
            todo.append(candidates[0])
    removed = tuple(sorted(r.filename for r in records if r.filename not in kept))
    return PruneResult(removed=removed, protected=tuple(protected))


def prune(index_dir: Path, keep: int, *, dry_run: bool = False) -> PruneResult:
    """Remove all but the newest ``keep`` builds per project and channel (see plan_prune).

    :func:`index.remove` rewrites the pages without the wheels first, under the index
    lock, and only then deletes each wheel, its ``.metadata`` and its sidecar; a crash in
    between leaves files that no page links (the next run removes them) and never a page
    that links a missing file.  The pages are then regenerated with :func:`index.rebuild`.
    """
    if keep < 1:
        raise WheelforgeError(f"--keep must be at least 1, got {keep}")
    files = index_dir / index.FILES_DIR
    index.repair(index_dir)
    records = index.load_records(index_dir)

    def metadata(r: index.WheelRecord) -> bytes:
        try:
            return (files / (r.filename + index.METADATA_SUFFIX)).read_bytes()
        except FileNotFoundError:
            return read_metadata(files / r.filename)

    result = plan_prune(records, keep, metadata)
    if result.removed and not dry_run:
        index.remove(index_dir, result.removed)
        index.rebuild(index_dir)
    return result
