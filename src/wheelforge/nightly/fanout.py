"""The nightly in three parts, for engines that run one job per cell.

``plan``
    The cells whose build key is not published, longest first (from the durations
    recorded in ``CACHE/stats/durations.json``; a cell never timed goes first), as a
    plan file, and as the ``strategy.matrix`` of a GitHub Actions job (through
    ``fromJSON``).  A matrix holds at most 256 jobs: above that, the cells are packed
    into 256 batches of about equal estimated time (longest first onto the least loaded
    batch), each job building its batch one cell after another.
``run`` one cell
    On a builder, without touching the index: the build key is computed again from the
    builder's recipe, patches and toolchain and must equal the plan's (else the cell is
    refused: a wheel from another toolchain would be published under the plan's key);
    the cell is built and verified into a private index inside its stage directory,
    and the stage keeps the verified wheel (version and local label final, no build
    number), its record ``cell.json`` (build key, toolchain, archs, channel, the compile
    cache line, the builder) and the build log.  A failed cell leaves a record too.
``publish``
    The single writer: :mod:`.publishing`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .. import __version__, index
from .._fs import atomic_write
from .._log import Reporter
from ..builder.artifact import identity
from ..builder.config import BuildConfig, recorded_gib_per_job
from ..errors import ConfigError, PublishError, ToolchainError, VerifyError, WheelforgeError
from ..recipe.format import RecipeBook
from ..recipe.matrix import Cell, Matrix, TorchPin, cells
from ..recipe.model import Choice, Recipe
from .cells import Builder, CellResult, Settings, log_tail
from .durations import estimate, read_durations, record_durations
from .stagecheck import refuse_links, stage_file
from .state import CellRunner, with_companions

__all__ = [
    "GITHUB_MATRIX_LIMIT",
    "Plan",
    "PlannedCell",
    "StageRecord",
    "estimate",
    "github_matrix",
    "load_plan",
    "load_stage",
    "make_plan",
    "now",
    "plan_to_json",
    "record_durations",
    "run_cell",
    "select",
    "write_plan",
]

PLAN_SCHEMA = 1
STAGE_SCHEMA = 1
#: GitHub Actions runs at most 256 jobs per matrix.
GITHUB_MATRIX_LIMIT = 256
RECORD = "cell.json"
LOG = "build.log"
_KEY = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, kw_only=True)
class PlannedCell:
    """One cell to build: the matrix entries it comes from and the key it must have."""

    id: int  # its position in the matrix's cells: stable from night to night
    recipe: str
    version: str
    python: str | None  # the matrix entry (None: the interpreter wheelforge runs on)
    torch: str
    cuda: str
    pip_args: tuple[str, ...]
    archs: str | None
    build_key: str
    toolchain: Mapping[str, str]
    estimate_s: float | None = None
    peak_gib: float | None = None  # memory of one compile job in the last build
    # the recipe's content rules (verify.top-level, verify.excluded), re-checked by the
    # publisher on the staged wheel: the plan's word, not the builder's
    top_level: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()  # verify.allow: the .pth files and commands it may ship
    #: the kernel subset to build (matrix.subsets); () the full build (and in older plans)
    subset: Choice = ()
    #: the pin's system toolkit (``toolkit: {cuda-home: PATH}``): only builders that
    #: declare ``builder_label`` (a Ray resource, an Actions runner label) or run ``image`` build it
    cuda_home: str | None = None
    builder_label: str | None = None
    image: str | None = None

    @property
    def cell(self) -> Cell:
        return Cell(recipe=self.recipe, python=self.python,
                    torch=TorchPin(spec=self.torch, cuda=self.cuda, pip_args=self.pip_args,
                                   cuda_home=self.cuda_home, label=self.builder_label,
                                   image=self.image),
                    archs=self.archs, subset=self.subset)

    @property
    def label(self) -> str:
        return self.cell.label


@dataclass(frozen=True, kw_only=True)
class Plan:
    created: str
    config: str
    index: str
    cells: tuple[PlannedCell, ...]  # longest first
    done: tuple[CellResult, ...] = ()  # up to date (skipped) or failed while planning
    wheelforge: str = __version__


@dataclass(frozen=True, kw_only=True)
class StageRecord:
    """``cell.json`` of a stage directory."""

    cell: PlannedCell
    status: str  # "built" or "failed"
    host: str
    duration_s: float
    wheel: str | None = None
    sha256: str | None = None
    channel: str | None = None
    cuda: str | None = None
    torch: str | None = None  # the torch version installed in the build environment
    archs: tuple[str, ...] = ()
    note: str = ""
    error: str | None = None
    log_tail: str | None = None
    #: the build log's copy: a file name inside the stage (build.log), never a path
    #: outside it (the publisher refuses any other, :func:`.stagecheck.stage_file`)
    log: str | None = None
    #: where the builder keeps the log: shown, never opened by the publisher
    builder_log: str | None = None
    wheelforge: str = __version__


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- plan


def make_plan(matrix: Matrix, book: RecipeBook, settings: Settings, *,
              reporter: Reporter) -> Plan:
    """The cells of the matrix whose build key is not published, longest first."""
    state = CellRunner(matrix, book, settings, reporter, with_companions(book))
    state.check_companions()
    durations = read_durations(settings.cache_dir)
    todo: list[PlannedCell] = []
    done: list[CellResult] = []
    for i, cell in enumerate(cells(matrix, state.kinds())):
        p = state.plan(cell)
        if p.error is not None:
            done.append(state.failed(p, p.error))
            continue
        assert p.key is not None and p.recipe is not None and p.config is not None
        if p.key in state.published:
            done.append(state.skipped(p, "published"))
            continue
        cuda = state.find_cuda(p.config, cell) if p.recipe.build.kind == "extension" else None
        todo.append(PlannedCell(
            id=i, recipe=cell.recipe, version=str(p.recipe.version), python=cell.python,
            torch=cell.torch.spec, cuda=cell.torch.cuda, pip_args=cell.torch.pip_args,
            archs=cell.archs, build_key=p.key,
            toolchain=identity.toolchain_identity(p.recipe, p.config, cuda),
            estimate_s=estimate(durations, cell),
            peak_gib=_peak(settings.cache_dir, cell.recipe),
            top_level=p.recipe.verify.top_level, excluded=p.recipe.verify.excluded,
            allow=p.recipe.verify.allow, subset=cell.subset, cuda_home=cell.torch.cuda_home,
            builder_label=cell.torch.label, image=cell.torch.image))
    todo.sort(key=lambda c: (c.estimate_s is not None, -(c.estimate_s or 0.0), c.id))
    return Plan(created=now(), config=str(matrix.path), index=str(settings.index_dir),
                cells=tuple(todo), done=tuple(done))


def _peak(cache_dir: Path, recipe: str) -> float | None:
    return recorded_gib_per_job(cache_dir, recipe)


def plan_to_json(plan: Plan) -> str:
    data = dataclasses.asdict(plan)
    data = {"schema": PLAN_SCHEMA, **data}
    return json.dumps(data, indent=2) + "\n"


def write_plan(plan: Plan, path: Path) -> None:
    atomic_write(path, plan_to_json(plan))


#: What converting a malformed plan or record can raise: a key missing, a type wrong, a value
#: out of range (``int(inf)``, ``float(10**400)``, ``str()`` of a 5000-digit int), a value
#: nested so deep that walking it recurses
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)


def _read_json(path: Path) -> Any:
    """The JSON value in ``path``, or the plan's error naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise _bad(path, "its JSON is nested too deep (a plan or a stage record nests a "
                         "few levels)") from None
    except (OSError, ValueError) as exc:
        raise _bad(path, str(exc)) from exc


def _bad(path: Path | str, why: str) -> ConfigError:
    return ConfigError(f"{path} is not a wheelforge plan or stage record", why=why,
                       fix="pass the plan.json that `wheelforge nightly plan` wrote and the "
                           "stage directories that `wheelforge nightly run` filled")


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{value!r} is not a list")
    return tuple(str(v) for v in value)


def _planned(data: Any, where: str) -> PlannedCell:
    if not isinstance(data, dict):
        raise _bad(where, "a cell is not a mapping")
    try:
        cell = PlannedCell(
            id=int(data["id"]), recipe=str(data["recipe"]), version=str(data["version"]),
            python=None if data["python"] is None else str(data["python"]),
            torch=str(data["torch"]), cuda=str(data["cuda"]),
            pip_args=tuple(str(a) for a in data["pip_args"]),
            archs=None if data["archs"] is None else str(data["archs"]),
            build_key=str(data["build_key"]),
            toolchain={str(k): str(v) for k, v in dict(data["toolchain"]).items()},
            estimate_s=None if data.get("estimate_s") is None else float(data["estimate_s"]),
            peak_gib=None if data.get("peak_gib") is None else float(data["peak_gib"]),
            top_level=_strings(data.get("top_level", ())),
            excluded=_strings(data.get("excluded", ())),
            allow=_strings(data.get("allow", ())),
            subset=tuple((str(k), _strings(v)) for k, v in data.get("subset") or ()),
            cuda_home=_optional(data.get("cuda_home")),
            builder_label=_optional(data.get("builder_label")),
            image=_optional(data.get("image")))
    except _MALFORMED as exc:
        raise _bad(where, f"a cell lacks or mistypes {exc}") from exc
    if not _KEY.match(cell.build_key):
        raise _bad(where, f"cell {cell.id}: {cell.build_key!r} is not a build key")
    return cell


def _optional(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


def load_plan(path: Path) -> Plan:
    data = _read_json(path)
    if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
        raise _bad(path, f"expected a mapping with schema {PLAN_SCHEMA}")
    try:
        return _plan_of(data, path)
    except _MALFORMED as exc:
        raise _bad(path, f"it lacks or mistypes {exc}") from None


def _plan_of(data: dict[str, Any], path: Path) -> Plan:
    planned = tuple(_planned(c, str(path)) for c in data.get("cells") or [])
    ids = [c.id for c in planned]
    if len(set(ids)) != len(ids):
        raise _bad(path, "two cells have the same id")
    done = []
    for r in data.get("done") or []:
        try:
            done.append(CellResult(**{**r, "pip_args": tuple(r.get("pip_args") or ()),
                                      "subset": str(r.get("subset") or ""),
                                      "archs_found": tuple(r.get("archs_found") or ())}))
        except TypeError as exc:
            raise _bad(path, f"a planned result is malformed: {exc}") from exc
        wrong = _mistyped(done[-1])
        if wrong:
            raise _bad(path, f"a planned result's {wrong}")
    return Plan(created=str(data.get("created", "")), config=str(data.get("config", "")),
                index=str(data.get("index", "")), cells=planned, done=tuple(done),
                wheelforge=str(data.get("wheelforge", "")))


#: What each field of a planned result (CellResult) may hold, by its annotation
_RESULT_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,), "str | None": (str, type(None)), "float": (int, float),
    "tuple[str, ...]": (tuple,), "CellStatus": (str,)}


def _mistyped(result: CellResult) -> str | None:
    """The first field of ``result`` whose value its annotation does not allow, said."""
    for field in dataclasses.fields(result):
        value = getattr(result, field.name)
        allowed = _RESULT_TYPES.get(str(field.type), (object,))
        if not isinstance(value, allowed) or isinstance(value, bool) or (
                isinstance(value, tuple) and not all(isinstance(v, str) for v in value)):
            return f"{field.name} is {type(value).__name__}, not {field.type}"
        if str(field.type) == "float" and not _finite(value):
            return f"{field.name} is {str(value)[:40]}, not a number of seconds"
    if result.status not in ("built", "skipped", "failed", "not run"):
        return f"status is {result.status!r}"
    return None


def _finite(value: object) -> bool:
    if not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int past a float's range
        return False


#: the runner labels of a builder job (examples/github-actions/nightly-fanout.yml); a cell
#: whose pin names a system toolkit adds the pin's label (``cuda-toolkit-12.8``)
RUNNER_LABELS = ("self-hosted", "linux", "x64", "wheelforge-builder")


def _route(c: PlannedCell) -> tuple[str, str]:
    return (c.builder_label or "", c.image or "")


def _job(route: tuple[str, str], cells: str, name: str) -> dict[str, Any]:
    """One entry of the GitHub matrix: its cells, its runner labels (``runs-on``) and its
    container image ("" none)."""
    label, image = route
    return {"cells": cells, "name": name,
            "runs-on": [*RUNNER_LABELS, *([label] if label else [])], "container": image}


def github_matrix(plan: Plan, limit: int = GITHUB_MATRIX_LIMIT) -> dict[str, Any]:
    """``{"include": [{"cells": "ID ...", "name": ..., "runs-on": [...], "container":
    IMAGE}]}`` for ``strategy.matrix``.

    One job per cell up to ``limit`` cells; above, ``limit`` jobs, each a batch of cells
    balanced by estimated time (a cell never timed counts as the longest timed one).  A
    batch holds the cells of one route only (the pin's builder label and image): a cell
    that needs a system toolkit runs only where it is."""
    if limit < 1:
        raise ConfigError(f"the matrix limit must be at least 1, got {limit}")
    if len(plan.cells) <= limit:
        return {"include": [_job(_route(c), str(c.id), _short(c)) for c in plan.cells]}
    routes: dict[tuple[str, str], list[PlannedCell]] = {}
    for c in plan.cells:
        routes.setdefault(_route(c), []).append(c)
    if len(routes) > limit:
        raise ConfigError(f"the plan's cells need {len(routes)} kinds of builder, more than "
                          f"the {limit} jobs of the matrix", fix="raise --max-jobs")
    known = [c.estimate_s for c in plan.cells if c.estimate_s is not None]
    unknown = max(known, default=1.0)
    jobs = _share(limit, {r: len(cs) for r, cs in routes.items()})
    out = []
    for route, members_of in routes.items():
        batches: list[tuple[float, list[PlannedCell]]] = [(0.0, []) for _ in range(jobs[route])]
        for c in members_of:  # longest first already: LPT onto the least loaded batch
            i = min(range(len(batches)), key=lambda j: (batches[j][0], j))
            load, members = batches[i]
            members.append(c)
            batches[i] = (load + (c.estimate_s if c.estimate_s is not None else unknown),
                          members)
        out += [(route, load, members) for load, members in batches if members]
    return {"include": [
        _job(route, " ".join(str(c.id) for c in members),
             f"batch {n} of {len(out)}: {len(members)} cells, ~{load / 60:.0f} min"
             + (f" [{route[0]}]" if route[0] else ""))
        for n, (route, load, members) in enumerate(out, 1)]}


def _share(limit: int, sizes: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """``limit`` jobs shared among routes by their cell counts, each at least one."""
    total = sum(sizes.values())
    jobs = {r: max(1, limit * n // total) for r, n in sizes.items()}
    while sum(jobs.values()) > limit:
        biggest = max(jobs, key=lambda r: jobs[r])
        jobs[biggest] -= 1
    for r in sorted(sizes, key=lambda r: -sizes[r]):
        if sum(jobs.values()) >= limit:
            break
        jobs[r] += min(limit - sum(jobs.values()), sizes[r] - jobs[r])
    return jobs


def _short(c: PlannedCell) -> str:
    if c.archs is None:
        return f"{c.recipe} (pure)"
    subset = f" [{c.cell.subset_text}]" if c.subset else ""
    return f"{c.recipe} {c.python or 'python'} {c.torch} cu{c.cuda} sm {c.archs}{subset}"


def select(plan: Plan, ids: Sequence[str]) -> list[PlannedCell]:
    """The plan's cells named by ``ids`` (each value may hold several, space or comma
    separated, as a batch of the GitHub matrix does)."""
    by_id = {c.id: c for c in plan.cells}
    out = []
    for value in ids:
        for part in re.split(r"[\s,]+", value.strip()):
            if not part:
                continue
            if not part.isdigit() or int(part) not in by_id:
                raise ConfigError(f"the plan has no cell {part!r} to build",
                                  why=f"its cells are {', '.join(map(str, sorted(by_id)))}"
                                  if by_id else "it has no cells (all are up to date)",
                                  fix="pass a cell id from the plan's matrix")
            out.append(by_id[int(part)])
    return out


# --------------------------------------------------------------------------- run a cell


def _identity_difference(mine: Mapping[str, str], planned: Mapping[str, str]) -> str:
    diffs = [f"{k} {mine.get(k, '(none)')!r} here, {planned.get(k, '(none)')!r} in the plan"
             for k in sorted({*mine, *planned}) if mine.get(k) != planned.get(k)]
    return "; ".join(diffs)


def run_cell(planned: PlannedCell, matrix: Matrix, book: RecipeBook, settings: Settings,
             stage: Path, *, reporter: Reporter, build: Builder | None = None,
             share: CellRunner | None = None) -> StageRecord:
    """Build and verify one planned cell into the stage directory ``stage`` (created,
    must be empty); the index is never touched.  Returns the record written; a failure
    is a record with status failed (and an error), not an exception."""
    started = time.monotonic()
    if stage.exists() and any(stage.iterdir()):
        raise ConfigError(f"the stage directory {stage} is not empty",
                          fix="give each cell a fresh stage directory")
    stage.mkdir(parents=True, exist_ok=True)
    private = stage / ".index"
    local = dataclasses.replace(settings, index_dir=private)
    state = CellRunner(matrix, book, local, reporter, build or with_companions(book))
    if share is not None:  # the in-process nightly's: interpreters and CUDA found once
        state.pythons, state.cuda, state.recipes = share.pythons, share.cuda, share.recipes
    p = state.plan(planned.cell)
    host = f"{socket.gethostname()}:{settings.cache_dir}"  # the builder: host and cache

    def failed(exc: WheelforgeError, log: str | None = None) -> StageRecord:
        shutil.rmtree(private, ignore_errors=True)
        return _write_stage(stage, StageRecord(
            cell=planned, status="failed", host=host,
            duration_s=round(time.monotonic() - started, 3), error=exc.render(),
            log_tail=log_tail(log)), log)

    if p.error is None and planned.cell.torch not in matrix.torches:
        p.error = ConfigError(
            f"refusing to build {planned.label}: the plan's torch pin is not one of this "
            f"builder's matrix ({matrix.path})",
            why=f"the plan says {planned.cell.torch}; the matrix pins "
                + "; ".join(map(str, matrix.torches)),
            fix="run the cell with the project file the plan was made from, or plan again")
    if p.error is not None:
        return failed(p.error)
    assert p.recipe is not None and p.config is not None and p.key is not None
    if p.key != planned.build_key:
        cuda = (state.find_cuda(p.config, planned.cell) if p.recipe.build.kind == "extension"
                else None)
        mine = identity.toolchain_identity(p.recipe, p.config, cuda)
        diff = _identity_difference(mine, planned.toolchain)
        return failed(ToolchainError(
            f"refusing to build {planned.label}: this builder's build key "
            f"{p.key[:16]} is not the plan's {planned.build_key[:16]}",
            why=(f"the builder's toolchain differs from the planner's: {diff}" if diff else
                 "the recipe, its patches or the wheelforge version differ from the "
                 "planner's checkout"),
            fix="run the cell on a builder with the plan's toolchain (same nvcc, Python and "
                "torch pin) and the same checkout, or plan again"))
    try:
        if p.recipe.build.kind == "extension":
            state.check_torch_cuda(p)
        seed_companions(state, p.recipe, p.config, settings.index_dir, private)
        res = state.build(p.recipe, p.config, reporter)
    except WheelforgeError as exc:
        return failed(exc, exc.log)
    record = next((r for r in index.load_records(private) if r.build_key == p.key), None)
    if record is None:
        return failed(WheelforgeError(f"the build of {planned.label} published nothing",
                                      why="no wheel with its build key in the stage's index"))
    wheel = private / index.FILES_DIR / record.filename
    shutil.move(wheel, stage / record.filename)
    log = getattr(res, "log", None)
    cache = getattr(res, "cache", None)
    out = StageRecord(
        cell=planned, status="built", host=host,
        duration_s=round(time.monotonic() - started, 3), wheel=record.filename,
        sha256=record.sha256, channel=record.channel, cuda=record.cuda, torch=record.torch,
        archs=tuple(record.archs), note=str(cache) if cache else "")
    shutil.rmtree(private, ignore_errors=True)
    return _write_stage(stage, out, str(log) if log else None)


def seed_companions(state: CellRunner, recipe: Recipe, config: BuildConfig,
                     real_index: Path, private: Path) -> None:
    """Copy the recipe's companions that the real index already holds for this target
    (same build key) into the stage's private index, so that the cell reuses them
    instead of building them again.  A builder that cannot see the index builds them in
    the stage; they are published by their own cells (the matrix must list them:
    :meth:`CellRunner.check_companions`)."""
    for name in recipe.companions:
        companion = state.book.load(name)
        cuda = state.find_cuda(config) if companion.build.kind == "extension" else None
        key = identity.planned_key(companion, config, state.book, cuda)
        found = identity.published_with_key(real_index, key)
        if found is not None and identity.published_with_key(private, key) is None:
            index.publish(private, real_index / index.FILES_DIR / found.filename,
                          channel=found.channel, cuda=found.cuda, torch=found.torch,
                          archs=found.archs, build_key=found.build_key)
        seed_companions(state, companion, config, real_index, private)


def _write_stage(stage: Path, record: StageRecord, log: str | None) -> StageRecord:
    """Write the record, and a copy of the build log ``log`` beside it (the record names
    the copy, inside the stage, and the builder's own path for display)."""
    copied = bool(log) and Path(str(log)).is_file()
    if copied:
        shutil.copyfile(str(log), stage / LOG)
    record = dataclasses.replace(record, log=LOG if copied else None, builder_log=log or None)
    data = {"schema": STAGE_SCHEMA, **dataclasses.asdict(record)}
    atomic_write(stage / RECORD, json.dumps(data, indent=2) + "\n")
    return record


def load_stage(stage: Path) -> StageRecord:
    """A stage directory's record, checked: the stage holds no link or special file, its
    wheel is there, is a plain file name and has the recorded sha256."""
    refuse_links(stage)
    path = stage / RECORD
    data = _read_json(path)
    if not isinstance(data, dict) or data.get("schema") != STAGE_SCHEMA:
        raise _bad(path, f"expected a mapping with schema {STAGE_SCHEMA}")
    def text(key: str) -> str | None:
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise _bad(path, f"{key} must be a string, got {type(value).__name__}")
        return value

    try:
        record = StageRecord(
            cell=_planned(data["cell"], str(path)), status=str(data["status"]),
            host=str(data["host"]), duration_s=float(data["duration_s"]),
            wheel=text("wheel"), sha256=text("sha256"), channel=text("channel"),
            cuda=text("cuda"), torch=text("torch"),
            archs=tuple(str(a) for a in data.get("archs") or ()),
            note=str(data.get("note") or ""), error=text("error"),
            log_tail=text("log_tail"), log=text("log"), builder_log=text("builder_log"),
            wheelforge=str(data.get("wheelforge", "")))
    except _MALFORMED as exc:
        raise _bad(path, f"it lacks or mistypes {exc}") from None
    if record.status not in ("built", "failed"):
        raise _bad(path, f"status {record.status!r} is neither built nor failed")
    if record.log is not None:
        stage_file(stage, "log", record.log)  # inside the stage, or the stage is refused
    if record.status == "built":
        name = record.wheel
        if not isinstance(name, str) or os.path.basename(name) != name or \
                not name.endswith(".whl") or name.startswith("."):
            raise _bad(path, f"its wheel {name!r} is not a wheel file name")
        try:
            project, version, _build, _tags = parse_wheel_filename(name)
        except (InvalidWheelFilename, InvalidVersion) as exc:
            raise VerifyError(f"the stage {stage} holds {name!r}, not a valid wheel file "
                              "name; nothing was published", why=str(exc),
                              fix="a wheel is NAME-VERSION(-BUILD)-PYTHON-ABI-PLATFORM.whl: "
                                  "run the cell again") from None
        try:
            own = Version(record.cell.version).public
        except InvalidVersion:
            raise _bad(path, f"its cell's version {record.cell.version!r} is not a "
                             "version") from None
        if project != canonicalize_name(record.cell.recipe) or version.public != own:
            raise PublishError(
                f"the stage {stage} holds {name}, not a wheel of {record.cell.recipe} "
                f"{record.cell.version}",
                why="a stage may only publish the wheel of its own cell",
                fix="run the cell again; never edit a stage by hand")
        wheel = stage / name
        if not wheel.is_file():
            raise PublishError(f"the stage {stage} lacks its wheel {name}",
                               why="the artifact is incomplete",
                               fix="run the cell again (its job), then publish")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != record.sha256:
            raise PublishError(f"{wheel} is not the wheel its record describes",
                               why=f"sha256 {digest[:16]}, the record says "
                                   f"{str(record.sha256)[:16]}",
                               fix="run the cell again; never edit a stage by hand")
    return record
