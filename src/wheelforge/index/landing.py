"""The landing page: one table of every wheel, for people."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..arch import gpus_of
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


def _breakable_pin(pin: str) -> str:
    """The pin, escaped, with line-break opportunities at its parts (after ``==`` and
    ``+``, before ``torch`` and each ``sm``): on a crowded page a long pin wraps there,
    never inside a word; on an ordinary one it stays on one line."""
    text = _e(pin).replace("==", "==<wbr>")
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


def _arch_cell(archs: Sequence[str]) -> str:
    """The archs, each titled with the GPUs it runs on."""
    if not archs:
        return "-"
    out = []
    for name in archs:
        gpus = gpus_of(name)
        title = f' title="{_e(gpus)}"' if gpus else ""
        out.append(f'<span class="arch"{title}>{_e(name)}</span>')
    return " ".join(out)


_ARCH_SPAN = re.compile(r'<span class="arch"[^>]*>((?:sm|compute)_\d+a?)</span>')


def row_archs(row: str) -> tuple[str, ...]:
    """The archs one landing-page row shows, in its order."""
    return tuple(_ARCH_SPAN.findall(row))


def archs_in_rows(rows: Iterable[str]) -> list[str]:
    """The archs the rows show (for the legend), without reading any record again."""
    return sorted({m for text in rows for m in _ARCH_SPAN.findall(text)})


def _landing_row(r: WheelRecord, href: str) -> str:
    """One line per wheel: its pin (copied whole by the button, and wrapping only at its
    parts when a page is very crowded), Python, channel (torch and CUDA on its title),
    archs, the file (its size, linked), when built, the test result and the hash."""
    python = ".".join(sorted({t.interpreter for t in _parsed(r.filename).tags}))
    status = _tested_label(r.tested).lower()
    label = status
    if r.tested is not None and isinstance(r.tested.get("gpu"), str):
        gpu = re.sub(r"^NVIDIA ", "", r.tested["gpu"])
        label += f" on {gpu}"  # e.g. "passed on H200"
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
    pin = pins.pin(r.project, r.version)
    target = (f"torch {r.torch or '?'}, CUDA {r.cuda or '?'}" if r.channel is not None
              else "pure Python: on every channel's pages" if _is_pure(r.filename) else "")
    return (
        f"<tr{row_class}>"
        f'<td class="pin" title="{_e(r.summary or "")}"><code>{_breakable_pin(pin)}</code> '
        f'<button type="button" class="copy" data-copy="{_e(pin)}" title="copy {_e(pin)}">'
        f"copy</button>{yanked}</td>"
        f"<td>{_e(python)}</td>"
        f'<td title="{_e(target)}">{_channel_cell(r.channel, pure=_is_pure(r.filename))}</td>'
        f"<td class=\"wrap\">{_arch_cell(r.archs)}</td>"
        f'<td class="num"><a href="{_e(f"{FILES_DIR}/{href}")}" title="{_e(r.filename)}, '
        f'{r.size} bytes">{_human_size(r.size)}</a></td>'
        f'<td title="{_e(r.upload_time)}">{_e(r.upload_time[:10])}</td>'
        f'<td class="{tested_class} wrap" title="{_e(tested_title)}">{_e(label)}</td>'
        f'<td title="{_e(r.sha256)}"><code>{_e(r.sha256[:12])}</code></td>'
        "</tr>"
    )


@dataclass(frozen=True)
class ChannelInstall:
    """What the install section says of one channel (None: the top-level pages)."""

    channel: str | None
    projects: tuple[str, ...]
    python: str | None  # "3.11" when its compiled wheels are all cp311
    companions: tuple[str, ...] = ()  # "mamba-ssm needs causal-conv1d"


_CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 90rem;
       padding: 0 1rem; color: #1b1b1b; background: #fff; }
h1 { font-size: 1.5rem; margin-bottom: .3rem; } h2 { font-size: 1.15rem; margin: 1.4rem 0 .4rem; }
p { overflow-wrap: break-word; margin: .4rem 0; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: .3rem .5rem;
         border-bottom: 1px solid #ddd; white-space: nowrap; }
td.wrap { white-space: normal; overflow-wrap: break-word; }
td.pin { white-space: normal; }
td.pin code { overflow-wrap: normal; word-break: normal; }
th { background: #f3f3f3; position: sticky; top: 0; }
tbody:nth-of-type(even) { background: #fafafa; }
th.num, td.num { text-align: right; }
td { font-variant-numeric: tabular-nums; }
code { font-size: .9em; }
a { color: #0550ae; }
button.copy { font: 12px system-ui, sans-serif; margin-left: .5rem; padding: 0 .4rem;
              border: 1px solid #bbb; border-radius: 3px; background: #f6f6f6; color: #333;
              cursor: pointer; vertical-align: 1px; user-select: none; }
.cmd { display: flex; align-items: flex-start; gap: .4rem; background: #f6f8fa;
       border: 1px solid #ddd; border-radius: 4px; padding: .35rem .6rem; margin: .3rem 0; }
.cmd code { flex: 1; white-space: pre-wrap; overflow-wrap: anywhere; }
.yanked { color: #a40e26; font-size: .85em; font-weight: bold; margin-left: .4rem; }
tr.yanked-row td { color: #6a6a6a; }
td.ok, .ok { color: #116329; } td.bad, .bad { color: #a40e26; }
td.none, .none { color: #6a6a6a; }
ul.stacks { margin-top: 0; } .note { color: #555; }
table.coverage { width: auto; } table.coverage td, table.coverage th { white-space: normal; }
table.coverage td.wrap { max-width: 24rem; } table.coverage code { overflow-wrap: anywhere; }
@media (prefers-color-scheme: dark) {
  body { color: #ddd; background: #161616; } th { background: #262626; }
  th, td { border-color: #333; } tbody:nth-of-type(even) { background: #1c1c1c; }
  a { color: #79b8ff; } tr.yanked-row td, td.none, .none, .note { color: #999; }
  td.ok, .ok { color: #56d364; } td.bad, .bad, .yanked { color: #f85149; }
  .cmd { background: #1f1f1f; border-color: #333; }
  button.copy { background: #262626; color: #ddd; border-color: #444; }
}
"""

#: The page's script: the install lines name the index where the page is read from (its
#: directory when opened as a file, its URL when served); the copy buttons copy a pin or
#: a whole command.  Without it the lines name the directory the index was written in.
_SCRIPT = """
const dir = location.href.replace(/[?#].*$/, "").replace(/[^/]*$/, "").replace(/\\/$/, "");
const path = location.protocol === "file:" ? decodeURIComponent(location.pathname)
  .replace(/[^/]*$/, "").replace(/\\/$/, "") : dir;
for (const e of document.querySelectorAll("[data-here]")) e.textContent = path;
for (const e of document.querySelectorAll("[data-here-url]")) e.textContent = dir;
function copied(button, ok) {
  button.textContent = ok ? "copied" : "select and copy";
  setTimeout(() => { button.textContent = "copy"; }, 1500);
}
document.addEventListener("click", (event) => {
  const button = event.target.closest("button.copy");
  if (!button) return;
  const text = button.dataset.copy || button.previousElementSibling.textContent;
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(() => copied(button, true),
                                             () => copied(button, false));
  } else {
    const area = document.createElement("textarea");
    area.value = text; document.body.appendChild(area); area.select();
    let ok = false; try { ok = document.execCommand("copy"); } catch (e) {}
    area.remove(); copied(button, ok);
  }
});
"""


def _install_section(installs: Sequence[ChannelInstall]) -> str:
    """Per channel, the one-command install (wheelforge's, then uv's alone), pasteable as
    shown, naming this index; what the archs mean comes after the table."""
    if not installs:
        return ""
    # the page holds no path of its own (a copy of the index gives the same bytes): the
    # script puts in where it is read from; without it, INDEX stands for that
    here = '<span data-here="">INDEX</span>'
    here_url = '<span data-here-url="">INDEX-URL</span>'
    venv = "~/venvs/stack"
    out = ["<h2>Install</h2>\n<p>Every wheel of a channel with its dependencies into a venv "
           "(made if missing), from any directory. The wheels come from this index alone, "
           "pinned to their exact versions; torch and the other dependencies come from your "
           "usual index.</p>\n"
           "<p>What keeps them later: <code>wheelforge install</code> (pip) also writes the "
           "venv's <code>pip.conf</code>, so later <code>pip install -U</code> runs in that "
           "venv keep these wheels. uv keeps no settings in a venv: a later <code>uv pip "
           "install</code> there needs the same <code>--index</code> and "
           "<code>--constraint</code>, or it takes the public wheels of the same names "
           "(<code>wheelforge consumer-config --format uv</code> prints them for a "
           "<code>uv.toml</code> or a uv project's <code>pyproject.toml</code>).</p>\n"
           '<p class="note">Where the commands are: <code>wheelforge</code> is '
           "<code>.venv/bin/wheelforge</code> in a wheelforge checkout after <code>make "
           "build</code> (type its path, or put that directory on PATH); <code>uv</code> is "
           "<code>.venv/bin/uv</code> there, or <code>pip install uv</code>.</p>\n"
           "<noscript><p>INDEX: this index's directory; INDEX-URL: its URL "
           "(file:// and the directory, or the server's).</p></noscript>\n"]
    for block in installs:
        sub = f"/{_e(block.channel)}/" if block.channel else "/"
        names = " ".join(_e(n) for n in block.projects)
        uv_python = f" --python {_e(block.python)}" if block.python else ""
        out.append(
            f"<p><b>{_e(block.channel or 'simple/')}</b>: {names}"
            + (f' <span class="note">({_e("; ".join(block.companions))})</span>'
               if block.companions else "") + "</p>\n"
            f'<div class="cmd"><code>wheelforge install --index {here}{sub} --python '
            f'{venv}</code><button type="button" class="copy" title="copy the command">copy'
            "</button></div>\n"
            f'<div class="cmd"><code>test -d {venv} || uv venv{uv_python} {venv} &amp;&amp; '
            "uv pip install "
            f"--python {venv} --index wheelforge={here_url}{sub}simple/ --constraint "
            f"{here_url}{sub}constraints.txt {names}</code>"
            '<button type="button" class="copy" title="copy the command">copy</button></div>\n')
    return "".join(out)


def _arch_legend(archs: Sequence[str]) -> str:
    """What the archs on the page mean."""
    seen: dict[str, str] = {}
    for name in archs:
        gpus = gpus_of(name)
        if gpus and name.startswith("sm_"):
            seen.setdefault(name, gpus)
    if not seen:
        return ""
    items = "; ".join(f"<b>{_e(n)}</b>: {_e(g)}" for n, g in sorted(
        seen.items(), key=lambda kv: -int("".join(ch for ch in kv[0] if ch.isdigit()))))
    return (f'<p class="note">Archs (SASS in the wheel; a GPU runs a wheel built for its own '
            f"arch): {items}.</p>\n")


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
                  stacks: Mapping[str | None, StackStatus] | None = None,
                  installs: Sequence[ChannelInstall] = (), archs: Sequence[str] = (),
                  coverage: str = "") -> str:
    """The landing page: the install lines, the stack check, the coverage table
    (index/coverage.py), then one table, a <tbody> per project (``rows``, by project
    name), and what the archs mean."""
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
        + _install_section(installs)
        + ("<h2>Stack check</h2>\n<p>Each channel's wheels installed together with their "
           "dependencies, then imported together:</p>\n" + _stack_items(stacks or {}, channels)
           if channels or stacks else "")
        + coverage
        + "<h2>Wheels</h2>\n"
        "<table>\n<thead><tr><th>Pin</th><th>Python</th><th>Channel</th><th>Archs</th>"
        '<th class="num">File</th><th>Built</th><th>Tested</th><th>SHA-256</th>'
        "</tr></thead>\n"
        f"{bodies}</table>\n"
        + _arch_legend(archs)
        + f"<script>{_SCRIPT}</script>\n</body>\n</html>\n"
    )
