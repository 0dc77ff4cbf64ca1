"""The landing page's coverage table: project x channel x archs, each cell built (its newest
version), failed in the latest nightly (its reason, linked to its log), or not in the
matrix.

What is built comes from the index (each project's channels and arch sets, pages.py's
summary); what the matrix holds and what failed come from the latest nightly report
(``reports/nightly-latest.json``, written by wheelforge.nightly), read here as plain JSON:
index/ imports nothing of nightly/.  The report is data in a directory others may write, so
it is read with a size cap, without following a link, and every value is checked and
escaped; a report that cannot be read is said on the page, never an error.
"""

from __future__ import annotations

import errno
import json
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ..arch import expected_sass, parse_arch_list
from ..errors import ConfigError, PublishError
from ._markup import _e
from .records import REPORTS_DIR, channel_name

__all__ = ["REPORT_JSON", "Built", "Planned", "Report", "coverage_section", "read_report"]

REPORT_JSON = "nightly-latest.json"
#: a larger report is not read (a night of 10,000 cells with their log tails is ~40 MB)
MAX_REPORT_BYTES = 64 << 20
#: a log's copy beside the report, as nightly/report.py names it
_LOG_FILE = re.compile(r"logs/[A-Za-z0-9][A-Za-z0-9._+-]{0,250}")
_REASON_CHARS = 200


@dataclass(frozen=True)
class Built:
    """A project's newest non-yanked wheel for one target: ``channel`` None for a pure
    wheel (on every channel), ``archs`` the SASS archs it holds (``sm_100 sm_120``)."""

    project: str
    channel: str | None
    archs: str
    version: str


@dataclass(frozen=True)
class Planned:
    """A cell of the latest night: its project, channel (None: pure, or a torch spec that
    names no one version), arch set (SASS, as Built's) and how it ended."""

    project: str
    channel: str | None
    archs: str
    status: str
    reason: str = ""
    log_href: str | None = None  # relative to the landing page


@dataclass(frozen=True)
class Report:
    """The latest night's cells; ``problem``: why the report could not be read."""

    cells: tuple[Planned, ...] = ()
    problem: str = ""
    #: extension cells whose torch spec names no one version (``torch>=2.14,<2.15``): their
    #: channel is known only once built, so the table says "not in the matrix" of nothing
    unplaced: int = 0


def _sass(archs: str) -> str:
    """``10.0;12.0`` -> ``sm_100 sm_120`` ('' when not an arch list)."""
    try:
        return " ".join(sorted(expected_sass(parse_arch_list(archs))))
    except ConfigError:
        return ""


def _channel(torch: str, cuda: str) -> str | None:
    """The channel a cell's wheels go to, when its torch spec names one version
    (``torch==2.14.1`` or ``torch==2.13.0,!=2.13.0+cpu``), else None."""
    try:
        req = Requirement(torch)
        pins = [s.version for s in req.specifier if s.operator == "==" and "*" not in s.version]
        if len(pins) != 1:
            return None
        Version(pins[0])
        return channel_name(cuda, pins[0])
    except (InvalidRequirement, InvalidVersion, PublishError):
        return None


def _log_href(reports: Path, log_file: Any) -> str | None:
    """The link to a cell's log copy, only for a plain name under ``reports/logs/`` that
    is there."""
    if not isinstance(log_file, str) or not _LOG_FILE.fullmatch(log_file) or ".." in log_file:
        return None
    if not (reports / log_file).is_file():
        return None
    return f"{REPORTS_DIR}/{urllib.parse.quote(log_file)}"


def _planned(reports: Path, cell: Mapping[str, Any]) -> Planned | None:
    fields = [cell.get(k) for k in ("recipe", "torch", "cuda", "status")]
    if not all(isinstance(f, str) and f for f in fields):
        return None
    recipe, torch, cuda, status = (str(f) for f in fields)
    archs = cell.get("archs")
    sass = _sass(archs) if isinstance(archs, str) else ""
    if isinstance(archs, str) and not sass:
        return None
    if isinstance(cell.get("subset"), str) and cell["subset"]:
        return None  # a kernel subset is not the recipe's build for that target
    error = cell.get("error")
    return Planned(project=canonicalize_name(recipe),
                   channel=_channel(torch, cuda) if archs is not None else None,
                   archs=sass, status=status[:40],
                   reason=error if isinstance(error, str) else "",
                   log_href=_log_href(reports, cell.get("log_file")))


def read_report(index_dir: Path) -> Report | None:
    """The latest night's cells, or None when the index has no nightly report."""
    reports = index_dir / REPORTS_DIR
    try:
        fd = os.open(reports / REPORT_JSON, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = "it is a link" if exc.errno == errno.ELOOP else exc.strerror
        return Report(problem=f"{REPORTS_DIR}/{REPORT_JSON} not read: {why}")
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_REPORT_BYTES + 1)
    except OSError as exc:
        return Report(problem=f"{REPORTS_DIR}/{REPORT_JSON} not read: {exc.strerror}")
    if len(data) > MAX_REPORT_BYTES:
        return Report(problem=f"{REPORTS_DIR}/{REPORT_JSON} not read: larger than "
                              f"{MAX_REPORT_BYTES >> 20} MiB")
    try:
        cells = json.loads(data)["cells"]
        if not isinstance(cells, list):
            raise TypeError("cells is not a list")
    except (ValueError, KeyError, TypeError) as exc:
        return Report(problem=f"{REPORTS_DIR}/{REPORT_JSON} not read: not a nightly report "
                              f"({type(exc).__name__})")
    found = [p for p in (_planned(reports, c) for c in cells if isinstance(c, dict)) if p]
    placed = tuple(p for p in found if p.channel is not None or not p.archs)
    return Report(cells=placed, unplaced=len(found) - len(placed))


# --------------------------------------------------------------------------- the table


def _channel_key(channel: str) -> tuple[int, tuple[int, ...], str]:
    """Newest torch first: ``cu130-torch2.14`` before ``cu130-torch2.9``."""
    m = re.fullmatch(r"cu(\d+)-torch(\d+)\.(\d+)", channel)
    if not m:
        return (1, (), channel)
    return (0, (-int(m[2]), -int(m[3]), -int(m[1])), channel)


def _public(version: str) -> str:
    """``1.7.0+cu130torch2.14sm120`` -> ``1.7.0``: the row and column say the rest."""
    return version.split("+", 1)[0]


def _built_cell(b: Built, planned: bool) -> str:
    note = "" if planned else ' <span class="note">(not in the matrix)</span>'
    return (f'<td class="ok" title="{_e(b.version)}">built <code>{_e(_public(b.version))}'
            f"</code>{note}</td>")


def _failed_cell(p: Planned, b: Built | None) -> str:
    first = (p.reason.strip().splitlines() or ["no reason recorded"])[0]
    short = first if len(first) <= _REASON_CHARS else first[:_REASON_CHARS - 3] + "..."
    log = f' <a href="{_e(p.log_href)}">log</a>' if p.log_href else ""
    served = (f' <span class="note">({_e(_public(b.version))} still served)</span>'
              if b is not None else "")
    return (f'<td class="bad wrap" title="{_e(p.reason[:2000])}">failed: {_e(short)}{log}'
            f"{served}</td>")


def _cell(b: Built | None, p: Planned | None, report: Report) -> str:
    if p is not None and p.status == "failed":
        return _failed_cell(p, b)
    unsure = bool(report.problem or report.unplaced)  # the matrix is not wholly known
    if b is not None:
        return _built_cell(b, p is not None or unsure)
    if p is not None:  # not run, interrupted, or built and since removed
        return f'<td class="none">{_e(p.status)}</td>'
    if unsure:
        return '<td class="none">not built</td>'
    return '<td class="none">not in the matrix</td>'


def _rows(built: Sequence[Built], planned: Sequence[Planned],
          channels: Sequence[str]) -> list[tuple[str, str]]:
    """(project, archs) of every row: pure projects have one row, archs ''."""
    keys = {(b.project, b.archs if b.channel is not None else "") for b in built}
    keys |= {(p.project, p.archs if p.channel is not None else "") for p in planned
             if p.channel is None or p.channel in channels}
    return sorted(keys, key=lambda k: (k[0], k[1].count(" "), k[1]))


def coverage_section(built: Iterable[Built], report: Report | None,
                     channels: Iterable[str]) -> str:
    """The "Coverage" section: one row per project and arch set, one column per channel;
    '' without a nightly report (the matrix is not known: the wheels table says what is
    built)."""
    if report is None:
        return ""
    built_list = list(built)
    planned = list(report.cells)
    columns = sorted({*channels, *(b.channel for b in built_list if b.channel),
                      *(p.channel for p in planned if p.channel)}, key=_channel_key)
    rows = _rows(built_list, planned, columns)
    if not rows or not columns:
        return ""
    have = {(b.project, b.channel, b.archs): b for b in built_list}
    plan = {(p.project, p.channel, p.archs): p for p in planned}
    head = "".join(f'<th><a href="{_e(urllib.parse.quote(c))}/simple/">{_e(c)}</a></th>'
                   for c in columns)
    body = []
    for project, archs in rows:
        cells = []
        for channel in columns:
            if archs:
                key: tuple[str, str | None, str] = (project, channel, archs)
            else:  # pure: one wheel on every channel
                key = (project, None, "")
            cells.append(_cell(have.get(key), plan.get(key), report))
        body.append(f"<tr><td>{_e(project)}</td><td>{_e(archs or 'pure Python')}</td>"
                    + "".join(cells) + "</tr>\n")
    source = report.problem or "the latest nightly report" + (
        f"; {report.unplaced} of its cells name a torch range, not one version, so their "
        "channel is not known unless built" if report.unplaced else "")
    return ("<h2>Coverage</h2>\n<p>Each project for each channel and arch set: built (the "
            "newest version served), failed in the latest night (why, and its log), or not "
            f'in the build matrix. <span class="note">From the index and {_e(source)}.'
            "</span></p>\n"
            '<table class="coverage">\n<thead><tr><th>Project</th><th>Archs</th>'
            f"{head}</tr></thead>\n<tbody>\n" + "".join(body) + "</tbody>\n</table>\n")
