"""The landing page: one table of every wheel, for people."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from . import pins
from ._markup import _e
from .health import StackStatus, summary_line
from .records import (
    FILES_DIR,
    NIGHTLY_REPORT,
    REPORTS_DIR,
    SIMPLE_DIR,
    WheelRecord,
    _is_pure,
    _parsed,
)


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


#: Names up to this long stay on one line; longer ones wrap at their hyphens.
_SHORT = 24
_WRAP = ' class="wrap"'


def _breakable_version(version: str) -> str:
    """The version, escaped, with line-break opportunities in its local label (after
    ``+``, before ``torch`` and each ``sm``): a long label wraps at its parts."""
    text = _e(version)
    if "+" not in text:
        return text
    public, local = text.split("+", 1)
    return f"{public}+<wbr>" + re.sub(r"(?<=.)(torch|sm)", r"<wbr>\1", local)


def _channel_cell(channel: str | None, *, pure: bool) -> str:
    """The channel a wheel belongs to, linked to its sub-index; a pure wheel without one
    is in every channel."""
    if channel is not None:
        return f'<a href="{_e(urllib.parse.quote(channel))}/simple/">{_e(channel)}</a>'
    return "every" if pure else "-"


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
        f'<td{_WRAP if len(r.project) > _SHORT else ""} title="{_e(r.summary or "")}">'
        f"{_e(r.project)}</td>"
        f'<td class="wrap"><a href="{_e(f"{FILES_DIR}/{href}")}" title="{_e(r.filename)}">'
        f"{_breakable_version(r.version)}</a>{yanked}</td>"
        f"<td>{_e(python)}</td>"
        f"<td>{_channel_cell(r.channel, pure=_is_pure(r.filename))}</td>"
        f"<td>{_e(r.torch or '-')}</td>"
        f"<td>{_e(r.cuda or '-')}</td>"
        f'<td class="wrap">{_e(" ".join(r.archs) or "-")}</td>'
        f'<td class="num" title="{r.size} bytes">{_human_size(r.size)}</td>'
        f'<td class="fixed" title="{_e(r.upload_time)}">'
        f'{_e(r.upload_time[:16].replace("T", " "))}</td>'
        f'<td class="fixed" title="{_e(r.sha256)}"><code>{_e(r.sha256[:12])}</code></td>'
        f'<td class="{tested_class} wrap" title="{_e(tested_title)}">{_e(label)}</td>'
        f'<td class="pin"><code>{_e(pins.pin(r.project, r.version))}</code></td>'
        "</tr>"
    )


_CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 90rem;
       padding: 0 1rem; color: #1b1b1b; background: #fff; }
h1 { font-size: 1.5rem; }
p { overflow-wrap: break-word; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: .3rem .6rem;
         border-bottom: 1px solid #ddd; white-space: nowrap; }
td.wrap { white-space: normal; overflow-wrap: break-word; }
td.pin code { white-space: normal; overflow-wrap: anywhere; }
th { background: #f3f3f3; position: sticky; top: 0; }
tbody:nth-of-type(even) { background: #fafafa; }
th.num, td.num { text-align: right; }
td { font-variant-numeric: tabular-nums; }
code { font-size: .9em; }
a { color: #0550ae; }
.yanked { color: #a40e26; font-size: .85em; font-weight: bold; }
tr.yanked-row td { color: #777; }
td.ok, .ok { color: #116329; } td.bad, .bad { color: #a40e26; }
td.none, .none { color: #777; }
ul.stacks { margin-top: 0; }
@media (prefers-color-scheme: dark) {
  body { color: #ddd; background: #161616; } th { background: #262626; }
  th, td { border-color: #333; } tbody:nth-of-type(even) { background: #1c1c1c; }
  a { color: #79b8ff; } tr.yanked-row td, td.none { color: #999; }
  td.ok { color: #56d364; } td.bad, .yanked { color: #f85149; }
}
"""


def _stack_items(stacks: Mapping[str | None, StackStatus], channels: Sequence[str]) -> str:
    """One line per channel: whether its wheels, installed together with their
    dependencies, import together (wheelforge stack check)."""
    items = []
    for channel in [*channels, *([None] if None in stacks else [])]:
        status = stacks.get(channel)
        state = status.state if status else "not checked"
        css = {"good": "ok", "broken": "bad"}.get(state, "none")
        when = f" ({status.checked_at[:16].replace('T', ' ')} UTC)" if status else ""
        items.append(f'<li><b>{_e(channel or "simple/")}</b>: <span class="{css}">'
                     f"{_e(summary_line(status))}</span>{_e(when)}</li>")
    return "<ul class=\"stacks\">" + "".join(items) + "</ul>\n" if items else ""


def _landing_page(rows: Mapping[str, str], channels: Sequence[str], wheels: int,
                  report: bool = False,
                  stacks: Mapping[str | None, StackStatus] | None = None) -> str:
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
        + ("<p>Stack check (each channel's wheels installed together with their "
           "dependencies, then imported together):</p>\n" + _stack_items(stacks or {}, channels)
           if channels or stacks else "")
        + "<p>Install the pins of the last column, from this index alone: <code>"
        + _e(pins.first_command("THIS-INDEX/CHANNEL/simple/", ["PIN..."],
                                    one_line=True))
        + "</code>. For the set-up that keeps them through later upgrades (pip and uv), "
        "run <code>wheelforge consumer-config</code>.</p>\n"
        "<table>\n<thead><tr><th>Project</th><th>Version</th><th>Python</th><th>Channel</th>"
        "<th>Torch</th>"
        '<th>CUDA</th><th>Archs</th><th class="num">Size</th><th>Built (UTC)</th>'
        "<th>SHA-256</th><th>Tested</th><th>Pin</th></tr></thead>\n"
        f"{bodies}</table>\n</body>\n</html>\n"
    )
