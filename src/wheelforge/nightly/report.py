"""The nightly report: JSON and an HTML page per run (``nightly-<time>``) and the
``nightly-latest`` pair, with copies of the failed cells' logs; linked from the landing page."""

from __future__ import annotations

import contextlib
import dataclasses
import html
import json
import os
import re
import urllib.parse
from datetime import datetime
from pathlib import Path

from .. import index
from .._fs import atomic_copy, atomic_write
from ..errors import WheelforgeError
from ..index.health import summary_line
from .cells import (
    CANARY_STEPS,
    CELL_STATUSES,
    LOGS_DIR,
    REPORT_SCHEMA,
    REPORTS_DIR,
    CellResult,
    NightlyReport,
)


def link_from_landing_page(index_dir: Path, report_dir: Path) -> None:
    """The landing page links ``reports/nightly-latest.html`` and shows the night's
    coverage (index/coverage.py reads ``nightly-latest.json``): pages are rendered when
    wheels are published, so each report refreshes them (only changed bytes written)."""
    landing = index_dir / "index.html"
    if report_dir.resolve() != (index_dir / REPORTS_DIR).resolve() or not landing.is_file():
        return
    with contextlib.suppress(OSError, WheelforgeError):
        index.refresh(index_dir)


# --------------------------------------------------------------------------- reports


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def to_json(report: NightlyReport) -> str:
    data = dataclasses.asdict(report)
    data = {"schema": REPORT_SCHEMA, **data,
            "summary": {s: report.count(s) for s in CELL_STATUSES}}
    data["cells"] = data.pop("results")
    return json.dumps(data, indent=2) + "\n"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #1f2328; }
p, h3 { overflow-wrap: anywhere; }
table { border-collapse: collapse; font-size: 0.9em; width: 100%; }
th, td { border-bottom: 1px solid #d0d7de; padding: 0.3em 0.6em; text-align: left;
         vertical-align: top; overflow-wrap: break-word; }
td code, td a { overflow-wrap: anywhere; }  /* paths and links break anywhere, words never */
td a.wheel { overflow-wrap: normal; }  /* a wheel's name: only at its <wbr>s, after - + _ */
td code.req { overflow-wrap: normal; }  /* torch==2.14.1: only after its == */
th, td.n { white-space: nowrap; }
code, pre { font-family: ui-monospace, monospace; font-size: 0.9em; }
pre { background: #f6f8fa; padding: 0.6em; white-space: pre-wrap; overflow-wrap: anywhere; }
.built { color: #1a7f37; } .skipped { color: #57606a; }
.failed, .not, .interrupted { color: #cf222e; }
@media (prefers-color-scheme: dark) {
  body { background: #0d1117; color: #e6edf3; } pre { background: #161b22; }
  th, td { border-color: #30363d; } .built { color: #56d364; } .skipped { color: #9198a1; }
  .failed, .not, .interrupted { color: #f85149; } a { color: #79b8ff; }
}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _breakable_wheel(name: str) -> str:
    """A wheel's file name, escaped, with line-break opportunities after each ``-``,
    ``+`` and ``_``: a narrow column wraps it between its parts, never inside one."""
    return re.sub(r"([-+_])", r"\1<wbr>", _e(name))


def _log_link(r: CellResult, *, short: bool = False) -> str:
    """A link to the log's copy beside the report (it works wherever the report is
    served from), else the log's path on the build machine."""
    if r.log_file:
        href = "/".join(urllib.parse.quote(p) for p in r.log_file.split("/"))
        return f'<a href="{_e(href)}">{"log" if short else _e(r.log_file)}</a>'
    return f"<code>{_e(r.log or '')}</code>"


def _copy_logs(report: NightlyReport, report_dir: Path) -> NightlyReport:
    """Copy every cell's log to ``report_dir/logs/`` (so the report links it relatively,
    also when the index is served over HTTP); the copies are named after the logs."""
    results = []
    for r in report.results:
        if r.log and not r.log_file and Path(r.log).is_file():
            dest = report_dir / LOGS_DIR / Path(r.log).name
            with contextlib.suppress(OSError):
                if not (dest.is_file() and dest.stat().st_size == Path(r.log).stat().st_size):
                    atomic_copy(Path(r.log), dest)
                r = dataclasses.replace(r, log_file=f"{LOGS_DIR}/{dest.name}")
        results.append(r)
    return dataclasses.replace(report, results=tuple(results))


def _stacks_html(report: NightlyReport) -> str:
    """The stack check of each channel the night changed: its wheels installed together
    with their dependencies, then imported together."""
    if not report.stacks:
        return ""
    items = []
    for s in report.stacks:
        css = {"good": "built", "broken": "failed"}.get(s.state, "skipped")
        items.append(f"<li><b>{_e(s.channel or 'simple/')}</b>: "
                     f'<span class="{css}">{_e(summary_line(s))}</span></li>\n')
    return ("<h2>Stack check</h2>\n<p>Each channel's wheels installed together, with their "
            "dependencies, into one fresh venv, then imported together:</p>\n<ul>\n"
            + "".join(items) + "</ul>\n")


def _canaries_html(report: NightlyReport) -> str:
    """Each canary recipe's newest upstream release, tried in scratch: one row per canary,
    its steps in order (the first "no" stopped the rest), never published."""
    if not report.canaries:
        return ""
    css = {"yes": "built", "no": "failed", "not run": "skipped"}
    rows = []
    for c in report.canaries:
        steps = "".join(f'<td class="{css[getattr(c, s)]}">{_e(getattr(c, s))}</td>'
                        for s in CANARY_STEPS)
        state = {"passed": "built", "failed": "failed"}.get(c.state, "skipped")
        why = f"{c.failed_step}: {c.reason}" if c.failed_step else c.reason
        rows.append(f"<tr><td>{_e(c.recipe)}</td><td>{_e(c.pinned)}</td>"
                    f"<td>{_e(c.version or '-')}</td>"
                    f'<td class="{state}">{_e(c.state)}</td>{steps}'
                    f"<td>{_e(why)}</td>"
                    f"<td><code>{_e(c.source or '-')}</code></td></tr>\n")
    return ("<h2>Canaries</h2>\n<p>The newest upstream release of each canary recipe, "
            "patched, built and verified in scratch beside the pinned cells; never "
            "published, and not part of the night's status:</p>\n"
            "<table>\n<thead><tr><th>Recipe</th><th>Pinned</th><th>Newest</th><th>State</th>"
            "<th>Applies</th><th>Builds</th><th>Verifies</th><th>Stack</th><th>Reason</th>"
            "<th>Source</th></tr></thead>\n<tbody>\n" + "".join(rows) + "</tbody>\n</table>\n")


def render_html(report: NightlyReport, report_dir: Path) -> str:
    """One table of the cells; failures follow with their error and log tail."""
    files = Path(report.index) / index.FILES_DIR
    rows, failures = [], []
    for n, r in enumerate(report.results, 1):
        wheel = "-"
        if r.wheel:
            href = os.path.relpath(files / r.wheel, report_dir)
            wheel = f'<a class="wheel" href="{_e(href)}">{_breakable_wheel(r.wheel)}</a>'
        status = f'<span class="{r.status.split()[0]}">{_e(r.status)}</span>'
        if r.status == "interrupted":  # how far it came, and where its log is
            status = f'<span class="interrupted">{_e(r.note or r.status)}</span>'
        if r.status == "failed":
            status = f'<a class="failed" href="#cell-{n}">failed</a>'
            failures.append(
                f'<h3 id="cell-{n}">{n}. {_e(r.recipe)} ({_e(r.archs or "pure")})'
                + (f" [{_e(r.subset)}]" if r.subset else "") + "</h3>\n"
                f"<pre>{_e(r.error or '')}</pre>\n"
                + (f"<p>log: {_log_link(r)}</p>\n" if r.log else "")
                + (f"<details open><summary>last lines of the log</summary>"
                   f"<pre>{_e(r.log_tail)}</pre></details>\n" if r.log_tail else ""))
        torch = (f'<code class="req">{_e(r.torch).replace("==", "==<wbr>")}</code>'
                 + (f" <code>{_e(' '.join(r.pip_args))}</code>" if r.pip_args else ""))
        rows.append(
            f"<tr><td>{n}</td><td>{_e(r.recipe)} {_e(r.version or '')}"
            + (f" <code>[{_e(r.subset)}]</code>" if r.subset else "") + "</td>"
            f"<td class=n><code>{_e(os.path.basename(r.python))}</code></td>"
            f"<td>{torch} (CUDA {_e(r.cuda)})</td>"
            f"<td>{_e(r.archs or 'pure')}</td><td>{status}</td>"
            f"<td class=n>{r.duration_s:.1f} s</td>"
            f"<td>{wheel}</td><td>{_e(', '.join(r.archs_found) or '-')}</td>"
            f"<td class=n><code>{_e((r.build_key or '-')[:16])}</code></td>"
            f"<td>{_e(r.note)}</td>"
            f"<td>{_log_link(r, short=True) if r.log else '-'}</td></tr>\n")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>wheelforge nightly {_e(report.started)}</title>\n<style>{_CSS}</style>\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        "</head>\n<body>\n"
        f"<h1>wheelforge nightly, {_e(report.started)}</h1>\n"
        f"<p>{_e(report.summary())} in {report.duration_s:.0f} s. Matrix "
        f"<code>{_e(report.config)}</code>, index <code>{_e(report.index)}</code>, "
        f"wheelforge {_e(report.wheelforge)}.</p>\n"
        "<table>\n<thead><tr><th>#</th><th>Recipe</th><th>Python</th><th>Torch</th>"
        "<th>Archs</th><th>Status</th><th>Time</th><th>Wheel</th><th>Archs found</th>"
        "<th>Build key</th><th>Note</th><th>Log</th></tr></thead>\n<tbody>\n"
        + "".join(rows) + "</tbody>\n</table>\n"
        + _stacks_html(report)
        + _canaries_html(report)
        + (("<h2>Failures</h2>\n" + "".join(failures)) if failures else "")
        + "</body>\n</html>\n")


def write_report(report: NightlyReport, report_dir: Path) -> tuple[Path, Path]:
    """Write ``nightly-<time>.json``/``.html`` and the ``nightly-latest`` pair; return the
    timestamped paths."""
    stamp = report.started.replace("-", "").replace(":", "")
    base = f"nightly-{stamp}"
    n = 1
    while (report_dir / f"{base}.json").exists():
        n += 1
        base = f"nightly-{stamp}-{n}"
    report = _copy_logs(report, report_dir)
    text, page = to_json(report), render_html(report, report_dir)
    paths = (report_dir / f"{base}.json", report_dir / f"{base}.html")
    atomic_write(paths[0], text)
    atomic_write(paths[1], page)
    atomic_write(report_dir / "nightly-latest.json", text)
    atomic_write(report_dir / "nightly-latest.html", page)
    return paths
