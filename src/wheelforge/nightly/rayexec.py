"""The cells of a plan as tasks on a Ray cluster; the driver stages and publishes.

Each planned cell is one Ray task (:func:`_build_task`, run on whichever node Ray
picks) that asks for

* ``num_cpus``: the compile jobs of the cell (``--jobs``, else 1 for a pure recipe and
  the node's share for an extension: ``WHEELFORGE_RAY_CPUS``, default 2), passed to the
  build as ``MAX_JOBS`` so that it uses what it reserved;
* ``memory``: the recorded peak of one compile job (``CACHE/stats``) x 1.25 x the jobs,
  when a peak was recorded;
* one unit of the custom resource ``wheelforge-builder``: only nodes started with
  ``ray start --resources '{"wheelforge-builder": 1}'`` build (the number is how many
  cells a node builds at once), the head and other nodes are left alone;
* for a cell whose torch pin names a system toolkit (``toolkit: {cuda-home: PATH}``, a
  CUDA 12 torch: no CUDA 12 nvcc on PyPI), one unit of the pin's label as a custom
  resource too (default ``cuda-toolkit-<cuda>``, e.g. ``cuda-toolkit-12.8``): only nodes
  started with ``--resources '{"wheelforge-builder": 1, "cuda-toolkit-12.8": 1}'``, which
  have that toolkit at that path, build it.

On the node the task runs :func:`fanout.run_cell` with that node's own wheelforge cache
(``WHEELFORGE_CACHE`` of the ``ray start`` that started it, else ~/.cache/wheelforge):
its managed environments, compile cache and sources.  The recipes directory, the
project file and any ``--sources`` must be readable on every node at the same path (a
shared checkout, or the same checkout on every node).  The task returns the stage (its
record, wheel and log, as bytes) to the driver, which writes it into a stage directory
of its own and publishes every stage with :func:`publishing.publish`: the driver is the
single writer, and nodes never see the index.

A build failure is a result, not an exception (a failed stage record): Ray does not
retry it, since the same inputs fail the same way.  A task whose node dies or whose
worker process crashes is retried by Ray (``max_retries``, default 2, on another node
when one is free); a cell that still has no result is reported "not run".
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._log import Reporter
from ..builder.config import default_cache_dir
from ..errors import ConfigError, WheelforgeError
from ..recipe import matrix as matrix_mod
from ..recipe.format import RecipeBook
from ..recipe.matrix import Matrix
from . import fanout, publishing
from .cells import NightlyReport, Settings

__all__ = ["BUILDER_RESOURCE", "resources_for", "run_night"]

BUILDER_RESOURCE = "wheelforge-builder"
DEFAULT_EXTENSION_CPUS = 2
MAX_RETRIES = 2
_GIB = 1024 ** 3


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("the Ray executor needs Ray, which is not installed",
                          why=str(exc),
                          fix="pip install 'wheelforge[ray]' (on the driver and every node)"
                          ) from exc
    return ray


def resources_for(cell: fanout.PlannedCell, jobs: int | None) -> dict[str, Any]:
    """The Ray task options of one cell (see the module docstring)."""
    if cell.archs is None:
        cpus = 1
    else:
        cpus = jobs or int(os.environ.get("WHEELFORGE_RAY_CPUS", DEFAULT_EXTENSION_CPUS))
    wanted = {BUILDER_RESOURCE: 1, **({cell.builder_label: 1} if cell.builder_label else {})}
    out: dict[str, Any] = {"num_cpus": cpus, "resources": wanted,
                           "max_retries": MAX_RETRIES, "retry_exceptions": False}
    if cell.peak_gib is not None and cell.archs is not None:
        out["memory"] = int(max(1.0, cell.peak_gib * 1.25) * cpus * _GIB)
    return out


def _build_task(cell: dict[str, Any], project_file: str, recipes_dir: str,
                sources_dirs: list[str], jobs: int) -> dict[str, Any]:
    """On a node: build one cell into a temporary stage; return the stage's files."""
    planned = fanout._planned(cell, "the driver's plan")
    rdir = Path(recipes_dir)
    book = RecipeBook(rdir, rdir.parent / "patches")
    matrix = matrix_mod.load_matrix(Path(project_file), known_recipes=book.names(),
                                    recipes=book.load)
    cache = default_cache_dir()
    settings = Settings(index_dir=cache / "unused-index", cache_dir=cache,
                        sources_dirs=tuple(Path(s) for s in sources_dirs), jobs=jobs,
                        project_file=Path(project_file))
    (cache / "stage").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"cell-{planned.id}-", dir=cache / "stage") as tmp:
        stage = Path(tmp) / "stage"
        fanout.run_cell(planned, matrix, book, settings, stage,
                        reporter=Reporter(io.StringIO()))  # the build log is in the stage
        return {"files": {p.name: p.read_bytes() for p in stage.iterdir() if p.is_file()}}


def _write_stage(files: dict[str, bytes], stage: Path) -> None:
    stage.mkdir(parents=True)
    for name, data in files.items():
        if os.path.basename(name) != name or name.startswith("."):
            raise WheelforgeError(f"a Ray task returned the file name {name!r}",
                                  why="stage files are plain names")
        (stage / name).write_bytes(data)


@contextlib.contextmanager
def _connected(address: str | None, reporter: Reporter) -> Iterator[Any]:
    ray = _ray()
    where = address or os.environ.get("RAY_ADDRESS") or "auto"
    _probe(where)
    try:
        ray.init(address=where, log_to_driver=False, logging_level="warning")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"cannot connect to the Ray cluster at {where}",
                          why=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                          fix="start it (ray start --head ...) or pass --ray-address "
                              "HOST:PORT") from exc
    try:
        yield ray
    finally:
        ray.shutdown()


def _probe(address: str) -> None:
    """A HOST:PORT that does not answer is refused at once: ray.init would retry it for
    many minutes without a word."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "auto", or a ray:// client address: Ray's own checks answer quickly
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), 5).close()
    except OSError as exc:
        raise ConfigError(f"no Ray cluster answers at {address}",
                          why=f"connecting to its head's port: {exc.strerror or exc}",
                          fix="start the head (ray start --head --port PORT) or pass the "
                              "right --ray-address HOST:PORT") from exc


def _check_capacity(ray: Any, plan: fanout.Plan, jobs: int | None) -> None:
    """Refuse a plan the cluster could never run (Ray would wait for ever)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    builders = [n["Resources"] for n in nodes if n["Resources"].get(BUILDER_RESOURCE, 0) > 0]
    if not builders:
        raise ConfigError(
            f"no node of the Ray cluster offers the {BUILDER_RESOURCE!r} resource",
            why=f"{len(nodes)} node(s) are up, none started as a wheelforge builder",
            fix=f"start builder nodes with ray start --address HEAD:PORT --resources "
                f"'{{\"{BUILDER_RESOURCE}\": 1}}'")
    for c in plan.cells:
        need = resources_for(c, jobs)["num_cpus"]
        able = [b for b in builders if not c.builder_label or b.get(c.builder_label, 0) > 0]
        if not able:
            raise ConfigError(
                f"cell {c.id} ({c.label}) needs a builder with the CUDA toolkit at "
                f"{c.cuda_home}, and no builder node declares {c.builder_label!r}",
                why="its torch pin names that system toolkit (toolkit: {cuda-home: PATH}), "
                    "which only nodes declaring the label have; Ray would wait for such a "
                    "node for ever",
                fix=f"start a node that has the toolkit at {c.cuda_home} with ray start "
                    f"--address HEAD:PORT --resources '{{\"{BUILDER_RESOURCE}\": 1, "
                    f"\"{c.builder_label}\": 1}}'")
        most = max(b.get("CPU", 0) for b in able)
        if need > most:
            raise ConfigError(
                f"cell {c.id} ({c.label}) needs {need} CPUs, the largest builder node has "
                f"{most:g}",
                fix="pass --jobs (or WHEELFORGE_RAY_CPUS) at most the builder nodes' CPUs")


def run_night(plan: fanout.Plan, matrix: Matrix, settings: Settings, *, recipes_dir: Path,
              address: str | None, reporter: Reporter, report_dir: Path,
              stage_root: Path | None = None) -> NightlyReport:
    """Build the plan's cells on the Ray cluster at ``address``; publish from here."""
    started = time.monotonic()
    root = stage_root or settings.cache_dir / "stage"
    root.mkdir(parents=True, exist_ok=True)
    stages: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="ray-night-", dir=root) as tmp, \
            _connected(address, reporter) as ray:
        _check_capacity(ray, plan, settings.jobs)
        task = ray.remote(_build_task)
        pending: dict[Any, fanout.PlannedCell] = {}
        for c in plan.cells:  # longest first: Ray starts them in this order
            opts = resources_for(c, settings.jobs)
            ref = task.options(**opts, name=f"wheelforge cell {c.id}").remote(
                _cell_data(c), str(matrix.path.absolute()), str(recipes_dir.absolute()),
                [str(d) for d in settings.sources_dirs], opts["num_cpus"])
            pending[ref] = c
        reporter.info(f"{len(pending)} task(s) submitted to the Ray cluster")
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            c = pending.pop(ready[0])
            try:
                got = ray.get(ready[0])
            except Exception as exc:  # a task Ray gave up on (node lost after retries)
                reporter.info(f"cell {c.id} ({c.label}): no result from Ray: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                continue
            stage = Path(tmp) / f"cell-{c.id}"
            _write_stage(got["files"], stage)
            rec = fanout.load_stage(stage)
            reporter.info(f"cell {c.id} ({c.label}): {rec.status} on {rec.host} in "
                          f"{rec.duration_s:.1f} s")
            stages.append(stage)
        return publishing.publish(plan, stages, settings, reporter=reporter,
                              report_dir=report_dir, started=started)


def _cell_data(c: fanout.PlannedCell) -> dict[str, Any]:
    import dataclasses

    data = dataclasses.asdict(c)
    data["toolchain"] = dict(c.toolchain)
    return data
