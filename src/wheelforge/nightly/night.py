"""The nightly job: build every out-of-date cell of the matrix, report, prune.

:func:`run` walks the cells of the ``matrix:`` in wheelforge.yaml.  A cell whose
build key is already published is skipped before any environment is created or
anything is compiled; the others are built one after another by
:func:`pipeline.build_with_companions` (a recipe's companions built or reused first),
each into a stage and published from it by the parts of :mod:`fanout` (``nightly run``
and ``nightly publish``), and a failure is recorded and the run goes on.  Each build
holds a lock per build key (``CACHE/locks/KEY.lock``) and checks the index again once
it holds it, so two nightly runs on one index never build a cell twice: a cell that
another run is building is put back and taken up last, when that run has published it.

Every run writes ``nightly-<UTC time>.json`` and ``.html`` to the report directory
(``<index>/reports/`` unless told otherwise), and ``nightly-latest.json``/``.html``.

:func:`prune` keeps the newest builds per project and channel and removes the rest,
never a wheel that the newest entry of a channel requires; pages are rewritten without
the wheels before their files go, so that no page ever links a missing file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import json
import os
import shutil
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TypeVar

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import InvalidVersion, Version

from .. import __version__, _proc, index
from .._fs import atomic_copy, atomic_write, locked, owned_lock
from .._log import Reporter
from ..build import buildenv, config, pipeline, toolchain
from ..errors import ConfigError, ToolchainError, WheelforgeError
from ..recipe.format import Recipe, RecipeBook
from ..recipe.matrix import Cell, Matrix, cells

__all__ = [
    "CellResult",
    "CellStatus",
    "NightlyReport",
    "PruneResult",
    "Settings",
    "plan_prune",
    "prune",
    "render_html",
    "resolve_python",
    "run",
    "write_report",
]

CellStatus = Literal["built", "skipped", "failed", "not run"]
REPORT_SCHEMA = 1
REPORTS_DIR = "reports"
LOGS_DIR = "logs"  # beside the reports: copies of the cells' build logs, linked relatively
LOG_TAIL_LINES = 40

Builder = Callable[[Recipe, config.BuildConfig, Reporter], pipeline.BuildResult]


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What every cell shares: the directories, the job count and the project file."""

    index_dir: Path
    cache_dir: Path
    work_dir: Path | None = None
    sources_dirs: tuple[Path, ...] = ()
    jobs: int | None = None
    project_file: Path | None = None
    environ: Mapping[str, str] | None = None


@dataclass(frozen=True, kw_only=True)
class CellResult:
    recipe: str
    version: str | None
    python: str
    torch: str
    cuda: str
    pip_args: tuple[str, ...]
    archs: str | None  # requested; None for a pure recipe
    status: CellStatus
    duration_s: float = 0.0
    build_key: str | None = None
    wheel: str | None = None
    archs_found: tuple[str, ...] = ()
    log: str | None = None
    note: str = ""  # why skipped, or the compile cache summary of a build
    error: str | None = None
    log_tail: str | None = None  # the last lines of the log (None without a log)
    log_file: str | None = None  # the log's copy beside the report, relative to it


@dataclass(frozen=True, kw_only=True)
class NightlyReport:
    started: str
    finished: str
    duration_s: float
    config: str
    index: str
    results: tuple[CellResult, ...]
    interrupted: bool = False
    wheelforge: str = __version__

    def count(self, status: CellStatus) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def failed(self) -> bool:
        return self.interrupted or self.count("failed") > 0

    def summary(self) -> str:
        counts = ", ".join(f"{self.count(s)} {s}" for s in ("built", "skipped", "failed",
                                                             "not run") if self.count(s))
        return (f"{len(self.results)} cell(s): {counts or 'none'}"
                + (" (interrupted)" if self.interrupted else ""))


_BASE_EXECUTABLE = "import sys; print(getattr(sys, '_base_executable', sys.executable))"


def resolve_python(entry: str | None, relative_to: Path, default: Path) -> Path:
    """A matrix ``python`` entry: a path (relative to the project file) or a command name,
    resolved to the interpreter itself: a launcher on PATH (a pyenv shim, a venv's python)
    would otherwise key a managed environment of its own and cost a launch per cell."""
    if entry is None:
        return default
    found: str | None = None
    if os.sep in entry or entry.startswith("."):
        path = Path(os.path.expanduser(entry))
        path = path if path.is_absolute() else relative_to / path
        if path.is_file() and os.access(path, os.X_OK):
            found = str(path)
    else:
        found = shutil.which(entry)
    if found is None:
        raise ToolchainError(f"the matrix interpreter {entry!r} was not found",
                             why=f"searched {'the path' if os.sep in entry else 'PATH'}",
                             fix="install it, or remove it from matrix.python in wheelforge.yaml")
    try:
        real = _proc.run([found, "-c", _BASE_EXECUTABLE], timeout=60).output.strip()
    except _proc.CommandFailed as exc:
        raise ToolchainError(f"the matrix interpreter {entry!r} ({found}) does not run",
                             why=exc.tail.strip()[-300:],
                             fix="repair it, or remove it from matrix.python") from exc
    return Path(real.splitlines()[-1]) if real else Path(found)


# --------------------------------------------------------------------------- running


def _tail(log: str | None) -> str | None:
    """The log's last lines; None when there is no log to read (the error says it all)."""
    if log:
        with contextlib.suppress(OSError):
            lines = Path(log).read_text(encoding="utf-8", errors="replace").splitlines()
            return "\n".join(lines[-LOG_TAIL_LINES:]) or None
    return None


@dataclass
class _Plan:
    cell: Cell
    recipe: Recipe | None = None
    config: config.BuildConfig | None = None
    python: str = ""
    key: str | None = None
    error: WheelforgeError | None = None
    started: float = field(default_factory=time.monotonic)


_K = TypeVar("_K")
_V = TypeVar("_V")


def _once(memo: dict[_K, _V | WheelforgeError], key: _K, compute: Callable[[], _V]) -> _V:
    """``compute()`` once per key for the whole run; a failure is remembered and raised
    again, so every cell that needs it reports the same error without retrying."""
    if key not in memo:
        try:
            memo[key] = compute()
        except WheelforgeError as exc:
            memo[key] = exc
    found = memo[key]
    if isinstance(found, WheelforgeError):
        raise found
    return found


class _Run:
    """The state of one nightly run (it owns the locks it takes while building)."""

    def __init__(self, matrix: Matrix, book: RecipeBook, settings: Settings,
                 reporter: Reporter, build: Builder):
        self.matrix, self.book, self.settings = matrix, book, settings
        self.reporter, self.build = reporter, build
        self.published = {r.build_key: r for r in index.load_records(settings.index_dir)
                          if r.build_key}
        self.recipes: dict[str, Recipe | WheelforgeError] = {}
        self.cuda: dict[None, toolchain.Cuda | WheelforgeError] = {}
        self.default_python = Path(getattr(sys, "_base_executable", sys.executable))
        self.pythons: dict[str | None, Path | WheelforgeError] = {}

    def recipe(self, name: str) -> Recipe:
        return _once(self.recipes, name, lambda: self.book.load(name))

    def companions_first(self, todo: list[Cell]) -> list[Cell]:
        """The cells, a recipe's companions before it (a stable sort): each cell then finds
        the companions of its target published by their own cells."""
        def depth(cell: Cell) -> int:
            try:
                return pipeline.companion_depth(self.recipe(cell.recipe), self.book)
            except WheelforgeError:
                return 0  # the cell's plan reports the error
        return sorted(todo, key=depth)

    def check_companions(self) -> None:
        """Every companion of a matrix recipe is a matrix recipe too: a cell is built in a
        stage, and only the cell's own wheel leaves it, so a companion is published by its
        own cells (built first, :meth:`companions_first`)."""
        missing: dict[str, set[str]] = {}

        def visit(name: str, chain: tuple[str, ...]) -> None:
            if name in chain:
                return  # a cycle: the cell's plan reports it
            try:
                recipe = self.recipe(name)
            except WheelforgeError:
                return  # the cell's plan reports it
            for c in recipe.companions:
                if c not in self.matrix.recipes:
                    missing.setdefault(str(c), set()).add(chain[0] if chain else name)
                visit(str(c), (*chain, name))

        for name in self.matrix.recipes:
            visit(name, ())
        if missing:
            listed = "; ".join(f"{c} (a companion of {', '.join(sorted(n))})"
                               for c, n in sorted(missing.items()))
            raise ConfigError(
                f"the matrix of {self.matrix.path} lacks companion recipe(s): {listed}",
                why="a recipe's wheel pins its companions' exact builds, and only the "
                    "companions' own cells publish them",
                fix=f"add {', '.join(sorted(missing))} to matrix.recipes")

    def kinds(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name in self.matrix.recipes:
            with contextlib.suppress(WheelforgeError):
                out[name] = self.recipe(name).build.kind
        return out

    def find_cuda(self) -> toolchain.Cuda:
        return _once(self.cuda, None, lambda: toolchain.find_cuda(self.settings.environ))

    def python(self, entry: str | None) -> Path:
        def find() -> Path:
            found = resolve_python(entry, self.matrix.path.parent, self.default_python)
            if entry is not None:  # say what a name (python3.11) or a path resolved to
                self.reporter.info(f"matrix python {entry}: {found}")
            return found
        return _once(self.pythons, entry, find)

    def plan(self, cell: Cell) -> _Plan:
        """The cell's recipe, configuration and build key; nothing is created."""
        plan = _Plan(cell=cell, python=cell.python or str(self.default_python))
        try:
            plan.recipe = self.recipe(cell.recipe)
            python = self.python(cell.python)
            plan.python = str(python)
            s = self.settings
            cfg = config.resolve(arch=cell.archs, torch=cell.torch.spec, jobs=s.jobs,
                                 index_dir=s.index_dir, cache_dir=s.cache_dir,
                                 work_dir=s.work_dir, sources_dirs=s.sources_dirs,
                                 project_file=s.project_file, environ=s.environ)
            plan.config = dataclasses.replace(cfg, python=None, base_python=python,
                                              torch_pip_args=cell.torch.pip_args)
            cuda = self.find_cuda() if plan.recipe.build.kind == "extension" else None
            plan.key = pipeline.planned_key(plan.recipe, plan.config, self.book, cuda)
        except WheelforgeError as exc:
            plan.error = exc
        return plan

    def result(self, plan: _Plan, status: CellStatus, **kw: Any) -> CellResult:
        pin = plan.cell.torch
        return CellResult(
            recipe=plan.cell.recipe,
            version=str(plan.recipe.version) if plan.recipe else None,
            python=plan.python, torch=pin.spec, cuda=pin.cuda, pip_args=pin.pip_args,
            archs=plan.cell.archs, status=status, build_key=plan.key,
            duration_s=round(time.monotonic() - plan.started, 3), **kw)

    def failed(self, plan: _Plan, exc: WheelforgeError) -> CellResult:
        self.reporter.info(f"FAILED {plan.cell.label}: {exc.what}")
        return self.result(plan, "failed", error=exc.render(), log=exc.log,
                           log_tail=_tail(exc.log))

    def skipped(self, plan: _Plan, why: str) -> CellResult:
        assert plan.key is not None
        found = self.published.get(plan.key)
        return self.result(plan, "skipped", note=why,
                           wheel=found.filename if found else None,
                           archs_found=tuple(found.archs) if found else ())

    def check_torch_cuda(self, plan: _Plan) -> None:
        """The managed env's torch must be the CUDA flavour the matrix names."""
        assert plan.recipe is not None and plan.config is not None
        cfg, recipe = plan.config, plan.recipe
        env = buildenv.managed_env(
            cfg.cache_dir, base_python=cfg.base_python, torch_req=cfg.torch,
            requirements=(*recipe.build.requires, *recipe.verify.requires),
            pip_args=cfg.torch_pip_args, progress=self.reporter.info)
        if env.torch_cuda != plan.cell.torch.cuda:
            raise ToolchainError(
                f"{cfg.torch} in the build environment is torch {env.torch_version} for "
                f"CUDA {env.torch_cuda or 'none (a CPU build)'}, the matrix says CUDA "
                f"{plan.cell.torch.cuda}",
                why="the pip arguments of the matrix entry select a different torch build",
                fix="correct matrix.torch[].cuda, or its pip-args (e.g. the index URL of the "
                    "torch build for that CUDA)")

    def build_cell(self, plan: _Plan) -> CellResult:
        """Build one cell; the caller holds its lock."""
        assert plan.recipe is not None and plan.config is not None and plan.key is not None
        found = pipeline.published_with_key(self.settings.index_dir, plan.key)
        if found is not None:
            self.published[plan.key] = found
            return self.skipped(plan, "published by another run meanwhile")
        from .fanout import run_and_publish  # the parts of `nightly run` and `publish`

        return run_and_publish(self, plan)


def with_companions(book: RecipeBook) -> Builder:
    """The cells' builder: :func:`pipeline.build_with_companions` for one recipe (its
    companions reused when published for the target, else built first)."""
    return lambda r, c, rep: pipeline.build_with_companions([r], book, c, rep)[-1]


def _lock_path(cache_dir: Path, key: str) -> Path:
    return pipeline.key_lock_path(cache_dir, key)


def run(matrix: Matrix, book: RecipeBook, settings: Settings, *, reporter: Reporter,
        report_dir: Path | None = None, build: Builder | None = None) -> NightlyReport:
    """Build every out-of-date cell; write the report (also when interrupted).

    ``report_dir`` defaults to ``<index>/reports``.  ``build`` is the builder
    (:func:`pipeline.build_with_companions`, a recipe's companions built or reused first; tests
    pass their own).
    """
    started_wall, started = datetime.now(timezone.utc), time.monotonic()
    index.repair(settings.index_dir)  # a change a killed writer left: finished first
    state = _Run(matrix, book, settings, reporter, build or with_companions(book))
    state.check_companions()
    todo = state.companions_first(cells(matrix, state.kinds()))
    results: dict[int, CellResult] = {}
    deferred: list[tuple[int, _Plan]] = []
    interrupted = False
    try:
        for i, cell in enumerate(todo):
            plan = state.plan(cell)
            where = f"[{i + 1}/{len(todo)}] {cell.label}"
            if plan.error is not None:
                results[i] = state.failed(plan, plan.error)
                continue
            assert plan.key is not None
            if plan.key in state.published:
                results[i] = state.skipped(plan, "published")
                reporter.info(f"{where}: up to date (build key {plan.key[:16]})")
                continue
            with owned_lock(_lock_path(settings.cache_dir, plan.key), wait=False) as mine:
                if not mine:
                    reporter.info(f"{where}: another run is building it; taken up last")
                    deferred.append((i, plan))
                    continue
                reporter.header(f"{where}: building")
                results[i] = state.build_cell(plan)
        for i, plan in deferred:
            assert plan.key is not None
            reporter.info(f"[{i + 1}/{len(todo)}] {plan.cell.label}: waiting for the other run")
            with owned_lock(_lock_path(settings.cache_dir, plan.key)):
                results[i] = state.build_cell(plan)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        for i, cell in enumerate(todo):
            if i not in results:
                results[i] = state.result(_Plan(cell=cell), "not run")
        report = NightlyReport(
            started=_iso(started_wall), finished=_iso(datetime.now(timezone.utc)),
            duration_s=round(time.monotonic() - started, 3), config=str(matrix.path),
            index=str(settings.index_dir), interrupted=interrupted,
            results=tuple(results[i] for i in range(len(todo))))
        reports = report_dir or settings.index_dir / REPORTS_DIR
        inside = os.path.abspath(reports).startswith(os.path.abspath(settings.index_dir) + os.sep)
        try:
            # in the index, under its lock: a rebuild sweeps temp files there
            with locked(settings.index_dir / ".lock") if inside else contextlib.nullcontext():
                write_report(report, reports)
        except OSError as exc:
            raise index.store.disk_error(exc, f"cannot write the nightly report to {reports}"
                                         ) from None
        _link_from_landing_page(settings.index_dir, reports)
        from .fanout import record_durations  # the plan orders cells by these

        record_durations(settings.cache_dir, [(todo[i], r.duration_s) for i, r in
                                              results.items() if r.status == "built"])
    return report


def _link_from_landing_page(index_dir: Path, report_dir: Path) -> None:
    """The landing page links ``reports/nightly-latest.html`` once that exists; pages are
    rendered when wheels are published, so the first report needs a rebuild."""
    landing = index_dir / "index.html"
    if report_dir.resolve() != (index_dir / REPORTS_DIR).resolve() or not landing.is_file():
        return
    with contextlib.suppress(OSError, WheelforgeError):
        if f"{REPORTS_DIR}/nightly-latest.html" not in landing.read_text(encoding="utf-8"):
            index.rebuild(index_dir)


# --------------------------------------------------------------------------- reports


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def to_json(report: NightlyReport) -> str:
    data = dataclasses.asdict(report)
    data = {"schema": REPORT_SCHEMA, **data,
            "summary": {s: report.count(s) for s in ("built", "skipped", "failed", "not run")}}
    data["cells"] = data.pop("results")
    return json.dumps(data, indent=2) + "\n"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #1f2328; }
p, h3 { overflow-wrap: anywhere; }
table { border-collapse: collapse; font-size: 0.9em; width: 100%; }
th, td { border-bottom: 1px solid #d0d7de; padding: 0.3em 0.6em; text-align: left;
         vertical-align: top; overflow-wrap: anywhere; }
th, td.n { white-space: nowrap; }
code, pre { font-family: ui-monospace, monospace; font-size: 0.9em; }
pre { background: #f6f8fa; padding: 0.6em; white-space: pre-wrap; overflow-wrap: anywhere; }
.built { color: #1a7f37; } .skipped { color: #57606a; } .failed, .not { color: #cf222e; }
@media (prefers-color-scheme: dark) {
  body { background: #0d1117; color: #e6edf3; } pre { background: #161b22; }
  th, td { border-color: #30363d; } .built { color: #56d364; } .failed { color: #f85149; }
  a { color: #79b8ff; }
}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


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


def render_html(report: NightlyReport, report_dir: Path) -> str:
    """One table of the cells; failures follow with their error and log tail."""
    files = Path(report.index) / index.FILES_DIR
    rows, failures = [], []
    for n, r in enumerate(report.results, 1):
        wheel = "-"
        if r.wheel:
            href = os.path.relpath(files / r.wheel, report_dir)
            wheel = f'<a href="{_e(href)}">{_e(r.wheel)}</a>'
        status = f'<span class="{r.status.split()[0]}">{_e(r.status)}</span>'
        if r.status == "failed":
            status = f'<a class="failed" href="#cell-{n}">failed</a>'
            failures.append(
                f'<h3 id="cell-{n}">{n}. {_e(r.recipe)} ({_e(r.archs or "pure")})</h3>\n'
                f"<pre>{_e(r.error or '')}</pre>\n"
                + (f"<p>log: {_log_link(r)}</p>\n" if r.log else "")
                + (f"<details open><summary>last lines of the log</summary>"
                   f"<pre>{_e(r.log_tail)}</pre></details>\n" if r.log_tail else ""))
        torch = r.torch + (f" {' '.join(r.pip_args)}" if r.pip_args else "")
        rows.append(
            f"<tr><td>{n}</td><td>{_e(r.recipe)} {_e(r.version or '')}</td>"
            f"<td class=n><code>{_e(os.path.basename(r.python))}</code></td>"
            f"<td><code>{_e(torch)}</code> (CUDA {_e(r.cuda)})</td>"
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


# --------------------------------------------------------------------------- retention


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
            from ..wheel import read_metadata

            return read_metadata(files / r.filename)

    result = plan_prune(records, keep, metadata)
    if result.removed and not dry_run:
        index.remove(index_dir, result.removed)
        index.rebuild(index_dir)
    return result
