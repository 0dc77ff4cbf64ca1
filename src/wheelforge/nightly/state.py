"""One run's state over the matrix: each cell's recipe, configuration and build key
(planned once, failures remembered), the companion checks, and the result records.
Shared by the in-process nightly (:mod:`.inprocess`) and the fan-out parts (:mod:`.fanout`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .. import index
from .._log import Reporter
from ..builder import config, scheduler
from ..builder.artifact import identity
from ..builder.compiling import jobserver, toolchain, torchtoolkit
from ..builder.env import buildenv
from ..builder.env.toolkit import requirement as toolkit_requirement
from ..errors import ConfigError, ToolchainError, WheelforgeError, attached_log
from ..recipe.format import RecipeBook
from ..recipe.matrix import Cell, Matrix
from ..recipe.model import Recipe
from .cells import (
    Builder,
    CellResult,
    CellStatus,
    Settings,
    log_tail,
    resolve_python,
)


@dataclass
class CellPlan:
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


class CellRunner:
    """The state of one nightly run (it owns the locks it takes while building)."""

    def __init__(self, matrix: Matrix, book: RecipeBook, settings: Settings,
                 reporter: Reporter, build: Builder):
        self.matrix, self.book, self.settings = matrix, book, settings
        self.reporter, self.build = reporter, build
        self.published = {r.build_key: r for r in index.load_records(settings.index_dir)
                          if r.build_key}
        self.recipes: dict[str, Recipe | WheelforgeError] = {}
        #: the toolkit of each (mode, managed requirement), found once per run
        self.cuda: dict[tuple[str, str, str, str], toolchain.Cuda | WheelforgeError] = {}
        self.default_python = Path(getattr(sys, "_base_executable", sys.executable))
        self.pythons: dict[str | None, Path | WheelforgeError] = {}

    def recipe(self, name: str) -> Recipe:
        return _once(self.recipes, name, lambda: self.book.load(name))

    def companions_first(self, todo: list[Cell]) -> list[Cell]:
        """The cells, a recipe's companions before it (a stable sort): each cell then finds
        the companions of its target published by their own cells."""
        def depth(cell: Cell) -> int:
            try:
                return identity.companion_depth(self.recipe(cell.recipe), self.book)
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
                out[name] = self.recipe(name).build.cell_kind
        return out

    def find_cuda(self, cfg: config.BuildConfig | None = None,
                  cell: Cell | None = None) -> toolchain.Cuda:
        """The toolkit the builds of ``cfg`` compile with (its ``toolkit`` setting and
        its channel's managed requirement); without ``cfg``, the system toolkit."""
        mode, req = (cfg.toolkit, cfg.cuda_toolkit) if cfg is not None else ("system", "")
        home = cfg.cuda_home if cfg is not None else None
        torch_cuda = cell.torch.cuda if cell is not None else None
        return _once(self.cuda, (mode, req, str(home or ""), torch_cuda or ""),
                     lambda: torchtoolkit.find(
            torchtoolkit.Choice(mode, req), cache_dir=self.settings.cache_dir,
            cuda_home=home, torch_cuda=torch_cuda, torch=_pin_text(cell) if cell else "",
            say=self.reporter.info,
            environ=os.environ if self.settings.environ is None else self.settings.environ))

    def python(self, entry: str | None) -> Path:
        def find() -> Path:
            found = resolve_python(entry, self.matrix.path.parent, self.default_python)
            if entry is not None:  # say what a name (python3.11) or a path resolved to
                self.reporter.info(f"matrix python {entry}: {found}")
            return found
        return _once(self.pythons, entry, find)

    def plan(self, cell: Cell) -> CellPlan:
        """The cell's recipe, configuration and build key; nothing is created."""
        plan = CellPlan(cell=cell, python=cell.python or str(self.default_python))
        try:
            plan.recipe = self.recipe(cell.recipe)
            python = self.python(cell.python)
            plan.python = str(python)
            s = self.settings
            cfg = config.resolve(arch=cell.archs, torch=cell.torch.spec, jobs=s.jobs,
                                 index_dir=s.index_dir, cache_dir=s.cache_dir,
                                 work_dir=s.work_dir, sources_dirs=s.sources_dirs,
                                 project_file=s.project_file, environ=s.environ)
            plan.config = _pin_toolkit(dataclasses.replace(
                cfg, python=None, base_python=python, torch_pip_args=cell.torch.pip_args,
                subset=cell.subset), cell)
            cuda = (self.find_cuda(plan.config, cell) if plan.recipe.build.kind == "extension"
                    else None)
            plan.key = identity.planned_key(plan.recipe, plan.config, self.book, cuda)
        except WheelforgeError as exc:
            plan.error = exc
        return plan

    def result(self, plan: CellPlan, status: CellStatus, **kw: Any) -> CellResult:
        pin = plan.cell.torch
        return CellResult(
            recipe=plan.cell.recipe,
            version=str(plan.recipe.version) if plan.recipe else None,
            python=plan.python, torch=pin.spec, cuda=pin.cuda, pip_args=pin.pip_args,
            archs=plan.cell.archs, subset=plan.cell.subset_text, status=status,
            build_key=plan.key,
            duration_s=round(time.monotonic() - plan.started, 3), **kw)

    def failed(self, plan: CellPlan, exc: WheelforgeError) -> CellResult:
        self.reporter.info(f"FAILED {plan.cell.label}: {exc.what}")
        return self.result(plan, "failed", error=exc.render(), log=exc.log,
                           log_tail=log_tail(exc.log))

    def interrupted(self, plan: CellPlan, exc: BaseException | None,
                    seconds: float) -> CellResult:
        """A cell whose build Ctrl-C (SIGTERM, --timeout) stopped after ``seconds``: how
        long it ran, and its log when the build named it (on ``exc``)."""
        log = attached_log(exc) if exc is not None else None
        return dataclasses.replace(
            self.result(plan, "interrupted", log=log, log_tail=log_tail(log),
                        note=f"interrupted after {seconds:.0f} s"),
            duration_s=round(seconds, 3))

    def skipped(self, plan: CellPlan, why: str) -> CellResult:
        assert plan.key is not None
        found = self.published.get(plan.key)
        return self.result(plan, "skipped", note=why,
                           wheel=found.filename if found else None,
                           archs_found=tuple(found.archs) if found else ())

    def check_torch_cuda(self, plan: CellPlan) -> None:
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


def _pin_text(cell: Cell) -> str:
    return f"the matrix pin {cell.torch.spec} (CUDA {cell.torch.cuda})"


def _pin_toolkit(cfg: config.BuildConfig, cell: Cell) -> config.BuildConfig:
    """The cell's toolkit: its pin's ``toolkit: {cuda-home: PATH}``, else the managed one
    of its CUDA (PyPI's), else (a CUDA 12 pin: none on PyPI) the system one; a
    ToolchainError for a CUDA 12 pin with ``toolkit: managed``."""
    pin = cell.torch
    home = Path(pin.cuda_home) if pin.cuda_home else cfg.cuda_home  # else defaults'
    req = (toolkit_requirement(pin.cuda) if torchtoolkit.has_managed(pin.cuda)
           else cfg.cuda_toolkit)
    try:
        choice = torchtoolkit.for_torch(cfg.toolkit, req, pin.cuda, _pin_text(cell), home)
    except ToolchainError as exc:
        exc.fix = (f"add toolkit: {{cuda-home: /usr/local/cuda-{pin.cuda}}} to that pin in "
                   f"matrix.torch, for builders that have that toolkit (its cells go only to "
                   f"them: docs/nightly.md); {exc.fix}")
        raise
    return dataclasses.replace(cfg, toolkit=choice.mode, cuda_toolkit=choice.requirement,
                               cuda_home=home)


def with_companions(book: RecipeBook, pool: jobserver.Pool | None = None) -> Builder:
    """The cells' builder: :func:`scheduler.build_with_companions` for one recipe (its
    companions reused when published for the target, else built first).  ``pool``: the
    compile slots that the cells built at once share; interpreters are inspected once
    for all the cells.  A managed environment gets the requirements of every recipe of
    the book when a cell first prepares it, so that no cell installs into it while
    another cell compiles (scheduler.build_with_companions)."""
    inspections = buildenv.Inspections()
    wanted = scheduler.requirements_of(_loadable(book))
    return lambda r, c, rep: scheduler.build_with_companions(
        [r], book, c, rep, pool=pool, inspections=inspections,
        shared_requirements=wanted)[-1]


def _loadable(book: RecipeBook) -> list[Recipe]:
    """The book's recipes that load (one that does not fails its own cells, as before)."""
    found = []
    for name in book.names():
        with contextlib.suppress(WheelforgeError):
            found.append(book.load(name))
    return found


def lock_path(cache_dir: Path, key: str) -> Path:
    return identity.key_lock_path(cache_dir, key)
