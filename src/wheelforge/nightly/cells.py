"""The nightly's shared vocabulary: a cell's status and result, the settings every cell
shares, the report of a run, the builder a cell calls, and the matrix's interpreters.
Below every other module of the nightly."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .. import __version__, _proc
from .._log import Reporter
from ..builder import config, pipeline
from ..errors import ToolchainError
from ..index.health import StackStatus
from ..recipe.model import Recipe

CellStatus = Literal["built", "skipped", "failed", "interrupted", "not run"]
#: every status, in the order the summaries count them
CELL_STATUSES: tuple[CellStatus, ...] = ("built", "skipped", "failed", "interrupted", "not run")
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
    #: the stack gate after publishing (wheelforge stack check); its dependency wheels
    #: when they cannot come from pip's index
    stack_check: bool = True
    deps_dir: Path | None = None
    #: check every channel, even one whose last passing check saw the same inputs
    stack_recheck: bool = False


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
    subset: str = ""  # the kernel subset built (hdim=128 dtype=bf16); '' the full build
    duration_s: float = 0.0
    build_key: str | None = None
    wheel: str | None = None
    archs_found: tuple[str, ...] = ()
    log: str | None = None
    note: str = ""  # why skipped, or the compile cache summary of a build
    error: str | None = None
    log_tail: str | None = None  # the last lines of the log (None without a log)
    log_file: str | None = None  # the log's copy beside the report, relative to it


#: a canary's step: passed, failed, or not tried (an earlier step failed, or not checked)
StepOutcome = Literal["yes", "no", "not run"]
CanaryState = Literal["passed", "failed", "up to date", "not checked"]
CANARY_STEPS = ("applies", "builds", "verifies", "stack")


@dataclass(frozen=True, kw_only=True)
class CanaryResult:
    """The newest upstream release of a canary recipe, tried beside its pinned cell:
    the series applied, built, verified and stack-checked in scratch (never published);
    the first failing step stops the rest and ``reason`` says why it failed.

    ``state``: passed (every step that ran said yes), failed (a step said no), up to
    date (nothing after the pin), not checked (the release could not be looked up or
    fetched: offline, an unreachable index; ``reason`` says why)."""

    recipe: str
    pinned: str
    state: CanaryState
    version: str | None = None  # the release tried
    source: str = ""  # its identity (sdist:FILE@sha256:HEX, git:URL@COMMIT)
    cell: str = ""  # the cell it was built as (the recipe's first cell of the matrix)
    applies: StepOutcome = "not run"
    builds: StepOutcome = "not run"
    verifies: StepOutcome = "not run"
    stack: StepOutcome = "not run"
    failed_step: str | None = None  # the first step that said no
    reason: str = ""  # why that step failed, why not checked, or why the stack was not run
    duration_s: float = 0.0
    log: str | None = None  # the build's log (kept in the cache's logs/)

    def line(self) -> str:
        """``canary causal-conv1d 1.7.0 -> 1.8.0: applies yes / builds yes / ...``"""
        head = f"canary {self.recipe} {self.pinned}"
        if self.state in ("up to date", "not checked"):
            return f"{head}: {self.state}" + (f" ({self.reason})" if self.reason else "")
        steps = " / ".join(f"{name} {getattr(self, name)}" for name in CANARY_STEPS)
        why = f"{self.failed_step}: {self.reason}" if self.failed_step else self.reason
        return f"{head} -> {self.version}: {steps}" + (f" ({why})" if why else "")


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
    #: the stack check of each channel the night changed (empty when off or none changed)
    stacks: tuple[StackStatus, ...] = ()
    #: the matrix's canaries (empty without a canary: section); never part of ``failed``
    canaries: tuple[CanaryResult, ...] = ()

    def count(self, status: CellStatus) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def failed(self) -> bool:
        return (self.interrupted or self.count("failed") > 0
                or any(s.state == "broken" for s in self.stacks))

    def summary(self) -> str:
        counts = ", ".join(f"{self.count(s)} {s}" for s in CELL_STATUSES if self.count(s))
        broken = [s.channel or "simple/" for s in self.stacks if s.state == "broken"]
        return (f"{len(self.results)} cell(s): {counts or 'none'}"
                + (f"; stack broken: {', '.join(broken)}" if broken else "")
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


def log_tail(log: str | None) -> str | None:
    """The log's last lines; None when there is no log to read (the error says it all)."""
    if log:
        with contextlib.suppress(OSError):
            lines = Path(log).read_text(encoding="utf-8", errors="replace").splitlines()
            return "\n".join(lines[-LOG_TAIL_LINES:]) or None
    return None
