"""What an index pins: the exact requirement of a published version, the newest version of
each project on a channel's pages, the constraints file written beside them, and the one
pip command that installs pins from the index alone.  The pages (:mod:`.pages`,
:mod:`.landing`) and the install instructions (:mod:`wheelforge.consume.install`) share
these, so the page and the printed commands never disagree.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from ..errors import ConfigError
from .records import CONSTRAINTS_FILE, WheelRecord

__all__ = ["CONSTRAINTS_FILE", "channels", "constraints_text", "first_command", "is_pure",
           "newest", "parse_constraints", "pin"]


def pin(project: str, version: str) -> str:
    """The exact requirement for one published version (landing page, pins, constraints)."""
    return f"{project}=={version}"


def constraints_text(newest: Iterable[tuple[str, str | None]], pages: str) -> str:
    """A pip/uv constraints file: ``newest`` is (project, newest non-yanked version or None
    when every version is yanked); ``pages`` names the pages it goes with."""
    lines = [f"# wheelforge: the exact versions {pages} serves, regenerated with its pages.",
             "# Use with pip's `constraint` setting or uv's --constraint (see docs/index.md)."]
    for project, version in newest:
        if version is None:
            lines.append(f"# {project}: not pinned, every version is yanked")
        else:
            lines.append(pin(project, version))
    return "\n".join(lines) + "\n"


def parse_constraints(text: str, where: str) -> tuple[Requirement, ...]:
    """The requirements of a constraints file an index serves (``where``: its URL), one
    per line; blank lines and ``#`` comments are allowed, nothing else.  ConfigError naming
    the line and its number for anything that is not a requirement by name: an option
    (``--log=...``, ``-r``, ``-c``, ``-e``, ``--index-url``), a URL or path requirement,
    a line continued with a backslash.  What :func:`constraints_text` writes passes."""
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        why = None
        if line.startswith("-"):
            why = "it is a pip option, which a constraints file from an index may not hold"
        else:
            try:
                req = Requirement(line)
            except InvalidRequirement as exc:
                why = f"it is not a requirement ({str(exc).splitlines()[0]})"
            else:
                if req.url:
                    why = "it installs from a URL; wheelforge's pins name versions only"
        if why:
            shown = raw if len(raw) <= 120 else raw[:117] + "..."
            raise ConfigError(f"{where}, line {number}: {shown!r} is refused", why=why,
                              fix="point --index at a wheelforge index (its constraints.txt "
                                  "holds NAME==VERSION lines only), or rebuild that index "
                                  "with wheelforge index rebuild")
        out.append(req)
    return tuple(out)


def is_pure(filename: str) -> bool:
    return all(t.abi == "none" and t.platform == "any" for t in parse_wheel_filename(filename)[3])


def channels(records: Sequence[WheelRecord]) -> list[str]:
    return sorted({r.channel for r in records if r.channel is not None})


def newest(records: Sequence[WheelRecord], channel: str | None
           ) -> tuple[list[WheelRecord], list[str]]:
    """The newest non-yanked wheel per project on the pages of ``channel`` (None: the
    top-level pages), and "project: why" for every other project of the index."""
    best: dict[str, WheelRecord] = {}
    seen: dict[str, list[WheelRecord]] = {}
    for rec in records:
        seen.setdefault(rec.project, []).append(rec)
        if channel is not None and rec.channel != channel and not (
            rec.channel is None and is_pure(rec.filename)
        ):
            continue  # not on the channel's pages: those hold its wheels and pure ones
        if rec.yanked is not None:
            continue
        cur = best.get(rec.project)
        if cur is None or Version(rec.version) > Version(cur.version):
            best[rec.project] = rec
    dropped = []
    for project in sorted(set(seen) - set(best)):
        listed = [r for r in seen[project] if channel is None or r.channel == channel
                  or (r.channel is None and is_pure(r.filename))]
        if listed:
            dropped.append(f"{project}: every version is yanked")
        else:
            where = sorted({r.channel or "no channel (simple/ only)" for r in seen[project]})
            dropped.append(f"{project}: not on channel {channel}'s pages (built for "
                           f"{', '.join(where)})")
    return [best[k] for k in sorted(best)], dropped


def first_command(index_url: str, pins: Sequence[str], *, one_line: bool = False) -> str:
    """The one pip command that installs ``pins`` from ``index_url`` alone, whatever pip's
    configuration files and PIP_* variables say; shell continuations unless ``one_line``
    (the landing page's)."""
    q = shlex.quote
    parts = ["PIP_CONFIG_FILE=/dev/null python -m pip install --isolated "
             "--disable-pip-version-check",
             f"--no-deps --only-binary :all: --index-url {q(index_url)}",
             " ".join(q(x) for x in pins)]
    return " ".join(parts) if one_line else " \\\n    ".join(parts)
