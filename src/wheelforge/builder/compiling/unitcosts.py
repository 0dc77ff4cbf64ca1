"""The recorded cost of each translation unit of a build, from ninja's log.

torch's ``cpp_extension`` compiles through ninja, and ninja logs when each output started
and ended (``.ninja_log`` beside the ``build.ninja`` it writes under ``build/temp.*``).
After a cold compile (nothing served by the compile cache) wheelforge records, per
recipe and arch list, every unit's source, seconds (ninja's, or what the unit's gate in
the command's pool wrote: its wall, or its CPU seconds over its slots where ptxas ran
threads on lent ones: builder/compiling/jobserver.py) and, for a generated unit that
only ``#include``\\ s other files (the split patches' ``unit_*.cu``), those files:
``CACHE/stats/NAME.units.json``, with the units of up to :data:`KEEP` - 1 builds before
it (``earlier``, newest first; those of the same source tree, arch list, jobs and
threads).

A later command that builds the recipe from the same source tree (``identity.tree_id``)
and arch list reads the record's total for one thing: the order of its compiles in the
command's pool (builder/scheduler.py: the longest compile last time starts its units
first; builder/pipeline.py: the priority of its gate).  The record never reaches the
build: which kernel files share a translation unit is the split patches' function of the
source and ``WHEELFORGE_UNIT_JOBS`` alone (the jobs the user chose, else the cores:
builder/config.py ``unit_jobs``; never the automatic MAX_JOBS, which follows the memory
and the peak an earlier build recorded), so one build key gives one set of bytes whatever
this machine built before (issue 53).  Until then the split patches (causal-conv1d 0008,
mamba-ssm 0010, dropped) repacked the units by the record (``WHEELFORGE_UNIT_COSTS``):
a second build of one key gave another ``.so`` and missed the compile cache, for no
measured gain in wall time (docs/performance.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..._fs import atomic_write
from .jobserver import SECONDS_SUFFIX

__all__ = ["KEEP", "UnitCost", "read_ninja_costs", "record", "recorded", "total_seconds"]

#: The builds a record holds: the latest and up to KEEP - 1 before it.
KEEP = 4
_BUILD_LINE = re.compile(r"^build (?P<out>\S+): \S+ (?P<src>\S+)")
_INCLUDE = re.compile(r'^#include "(?P<name>[^"]+)"$')


@dataclass(frozen=True)
class UnitCost:
    """One ninja output: its source (relative to the tree), seconds, the files it
    includes when it is a generated unit, else ()."""

    source: str
    seconds: float
    members: tuple[str, ...] = ()


def _members(path: Path) -> tuple[str, ...]:
    """The included files of a generated unit (comments and #include lines only)."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()]
    except OSError:
        return ()
    names = []
    for line in lines:
        m = _INCLUDE.match(line)
        if m:
            names.append(m["name"])
        elif line and not line.startswith("//"):
            return ()
    return tuple(names)


def read_ninja_costs(tree: Path) -> list[UnitCost]:
    """The units ninja compiled under ``tree`` (every ``.ninja_log`` of the build),
    longest first; [] when there is none (a build without ninja)."""
    costs: list[UnitCost] = []
    for log in sorted(tree.glob("build/*/.ninja_log")):
        sources: dict[str, str] = {}
        try:
            manifest = (log.parent / "build.ninja").read_text(errors="replace")
            entries = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in manifest.splitlines():
            m = _BUILD_LINE.match(line)
            if m:
                sources[m["out"].replace("$:", ":")] = m["src"].replace("$:", ":")
        spans: dict[str, float] = {}
        for entry in entries:
            fields = entry.split("\t")
            if entry.startswith("#") or len(fields) < 4 or fields[3] not in sources:
                continue
            try:
                spans[fields[3]] = (int(fields[1]) - int(fields[0])) / 1000.0
            except ValueError:
                continue  # the last entry of a log wins: a rerun's
        for out, seconds in spans.items():
            seconds = _own_seconds(log.parent, out, seconds)
            src = Path(sources[out])
            try:
                rel = src.relative_to(tree).as_posix()
            except ValueError:
                rel = src.as_posix()
            costs.append(UnitCost(rel, round(seconds, 2), _members(src)))
    return sorted(costs, key=lambda c: (-c.seconds, c.source))


def _own_seconds(build_dir: Path, out: str, logged: float) -> float:
    """The seconds a unit ran: what its gate wrote (builder/compiling/jobserver.py; ninja's log
    also counts the unit's wait for a slot of the command's pool), else ninja's."""
    try:
        return float((build_dir / (out + SECONDS_SUFFIX)).read_text())
    except (OSError, ValueError):
        return logged


def total_seconds(path: Path) -> float:
    """The seconds of every unit in the record at ``path`` (0 when unreadable)."""
    try:
        data = json.loads(path.read_text())
        return float(sum(float(u["seconds"]) for u in data["units"]))
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def _path(cache_dir: Path, name: str) -> Path:
    return cache_dir / "stats" / f"{name}.units.json"


def _earlier(path: Path, same: Mapping[str, object]) -> list[list[object]]:
    """The builds a new record keeps from the one at ``path``: its latest and earlier
    units, newest first, when it was recorded for the same source tree, arch list, jobs
    and threads (a unit's seconds depend on them), at most :data:`KEEP` - 1; else none."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or any(data.get(k) != v for k, v in same.items()):
            return []
        earlier = data.get("earlier", [])
        builds = [data["units"], *(earlier if isinstance(earlier, list) else [])]
    except (OSError, ValueError, KeyError):
        return []
    return [b for b in builds if isinstance(b, list) and b][:KEEP - 1]


def record(cache_dir: Path, name: str, *, tree: str, arch_list: str, jobs: int,
           threads: int, costs: list[UnitCost]) -> Path | None:
    """Record ``costs`` of a build of source tree ``tree`` (``identity.tree_id``) as the
    recipe's latest (nothing when empty), keeping the units of the builds before it under
    ``earlier`` (:func:`_earlier`); returns the file."""
    if not costs:
        return None
    path = _path(cache_dir, name)
    same = {"tree": tree, "arch_list": arch_list, "jobs": jobs, "nvcc_threads": threads}
    atomic_write(path, json.dumps({
        **same,
        "units": [{"source": c.source, "seconds": c.seconds, "members": list(c.members)}
                  for c in costs],
        "earlier": _earlier(path, same)}, indent=1))
    return path


def recorded(cache_dir: Path, name: str, arch_list: str, tree: str) -> Path | None:
    """The record of an earlier build of ``name`` from the same source tree (``tree``: a
    record of other files would misprice these) for the same arch list (the cost of a
    unit grows with its archs), else None: its total orders the command's compiles."""
    path = _path(cache_dir, name)
    try:
        data: Mapping[str, object] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    same = data.get("arch_list") == arch_list and data.get("tree") == tree
    return path if same and data.get("units") else None
