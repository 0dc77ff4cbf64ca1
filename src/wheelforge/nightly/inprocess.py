"""The in-process nightly: build every out-of-date cell of the matrix, several at once,
and report.

:func:`run` walks the cells of the ``matrix:`` in wheelforge.yaml.  A cell whose
build key is already published is skipped before any environment is created or
anything is compiled; the others are built by :func:`scheduler.build_with_companions`
(a recipe's companions built or reused first), each into a stage and published from it
by the parts of :mod:`fanout` (``nightly run`` and ``nightly publish``), and a failure is
recorded and the run goes on.

Up to :data:`CELLS_AT_ONCE` cells build at once, in threads, within one pool of compile
slots (builder/compiling/jobserver.py), as the recipes of ``wheelforge build A B`` do: one cell's
fixed steps (environment, verify imports, publish) overlap another's compile, and each
compile unit takes its slot as it starts, so a compile's tail leaves its slots to the
others.  A cell starts once the cells of its
recipe's companions have ended (it finds their wheels published).  Each cell's lines
start with ``[N/M]``, its place in the run.  ``WHEELFORGE_BUILDS_AT_ONCE=off`` builds
them one after another.

Each build holds a lock per build key (``CACHE/locks/KEY.lock``) and checks the index
again once it holds it, so two nightly runs on one index never build a cell twice: a
cell that another run is building is put back and taken up last, when that run has
published it.

With a ``canary:`` in the matrix, the newest upstream release of each canary recipe is
then tried in scratch (:mod:`.canary`): reported beside the cells, never published, and
never part of the night's status.

Every run writes ``nightly-<UTC time>.json`` and ``.html`` to the report directory
(``<index>/reports/`` unless told otherwise), and ``nightly-latest.json``/``.html``.

Retention (``wheelforge prune``) is :mod:`.prune`'s.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from .. import _proc, index
from .._fs import locked, owned_lock
from .._log import Reporter
from ..builder import scheduler
from ..builder.artifact import identity
from ..errors import WheelforgeError
from ..index.health import StackStatus
from ..recipe.format import RecipeBook
from ..recipe.matrix import Matrix, cells
from .canary import run_canaries
from .cells import REPORTS_DIR, Builder, CanaryResult, CellResult, NightlyReport, Settings
from .durations import record_durations
from .gate import check_night
from .publishing import run_and_publish
from .report import iso, link_from_landing_page, write_report
from .state import CellPlan, CellRunner, lock_path, with_companions


def _build_cell(state: CellRunner, plan: CellPlan) -> CellResult:
    """Build one cell; the caller holds its lock."""
    assert plan.recipe is not None and plan.config is not None and plan.key is not None
    found = identity.published_with_key(state.settings.index_dir, plan.key)
    if found is not None:
        state.published[plan.key] = found
        return state.skipped(plan, "published by another run meanwhile")
    return run_and_publish(state, plan)


#: The most cells built at once: each holds a build backend with torch imported and
#: runs its own verify imports, and past four the fixed steps have little left to overlap.
CELLS_AT_ONCE = 4


def run(matrix: Matrix, book: RecipeBook, settings: Settings, *, reporter: Reporter,
        report_dir: Path | None = None, build: Builder | None = None,
        together: bool | None = None) -> NightlyReport:
    """Build every out-of-date cell; write the report (also when interrupted).

    ``report_dir`` defaults to ``<index>/reports``.  ``build`` is the builder
    (:func:`scheduler.build_with_companions`, a recipe's companions built or reused first; tests
    pass their own).  ``together``: build the cells at once (by default, unless
    WHEELFORGE_BUILDS_AT_ONCE=off).
    """
    started_wall, started = datetime.now(timezone.utc), time.monotonic()
    index.repair(settings.index_dir)  # a change a killed writer left: finished first
    state = CellRunner(matrix, book, settings, reporter, build or with_companions(book))
    state.check_companions()
    todo = state.companions_first(cells(matrix, state.kinds()))
    results: dict[int, CellResult] = {}
    began: Began = {}  # the cells whose build started, and when
    interrupted = False
    stacks: tuple[StackStatus, ...] = ()
    canaries: tuple[CanaryResult, ...] = ()
    try:
        queue: list[tuple[int, CellPlan]] = []
        for i, cell in enumerate(todo):
            plan = state.plan(cell)
            if plan.error is not None:
                results[i] = state.failed(plan, plan.error)
                continue
            assert plan.key is not None
            if plan.key in state.published:
                results[i] = state.skipped(plan, "published")
                reporter.info(f"[{i + 1}/{len(todo)}] {cell.label}: up to date "
                              f"(build key {plan.key[:16]})")
                continue
            queue.append((i, plan))
        if together is None:
            together = scheduler.at_once(settings.environ)
        if together and len(queue) > 1:
            deferred = _at_once(state, queue, len(todo), (results, began),
                                own_builder=build is None)
        else:
            deferred = [item for item in queue
                        if not _try_cell(state, *item, (results, began),
                                         f"[{item[0] + 1}/{len(todo)}] {item[1].cell.label}")]
        for i, plan in deferred:
            assert plan.key is not None
            where = f"[{i + 1}/{len(todo)}] {plan.cell.label}"
            reporter.info(f"{where}: waiting for the other run")
            with owned_lock(lock_path(settings.cache_dir, plan.key),  # says whom, and again
                            on_busy=functools.partial(_other_run, reporter, where)):
                _build_and_record(state, i, plan, (results, began))
        stacks = check_night(settings, book, list(results.values()), reporter)
        # last, never publishing: a canary's failure is reported, the night's status stays
        canaries = run_canaries(matrix, book, settings, reporter=reporter, build=state.build)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        for i, cell in enumerate(todo):
            if i in results:
                continue
            if interrupted and i in began:  # it ended in another error while being stopped
                results[i] = state.interrupted(began[i][0], None, time.monotonic() - began[i][1])
            else:
                results[i] = state.result(CellPlan(cell=cell), "not run")
        report = NightlyReport(
            started=iso(started_wall), finished=iso(datetime.now(timezone.utc)),
            duration_s=round(time.monotonic() - started, 3), config=str(matrix.path),
            index=str(settings.index_dir), interrupted=interrupted,
            results=tuple(results[i] for i in range(len(todo))), stacks=stacks,
            canaries=canaries)
        reports = report_dir or settings.index_dir / REPORTS_DIR
        inside = os.path.abspath(reports).startswith(os.path.abspath(settings.index_dir) + os.sep)
        try:
            # in the index, under its lock: a rebuild sweeps temp files there
            with locked(settings.index_dir / ".lock") if inside else contextlib.nullcontext():
                write_report(report, reports)
        except OSError as exc:
            raise index.store.disk_error(exc, f"cannot write the nightly report to {reports}"
                                         ) from None
        link_from_landing_page(settings.index_dir, reports)
        record_durations(settings.cache_dir, [(todo[i], r.duration_s) for i, r in
                                              results.items() if r.status == "built"])
    return report


def _other_run(reporter: Reporter, where: str, holder: str) -> None:
    reporter.info(f"{where}: the other run is {holder}")


#: the results of a run's cells, and the cells that began building (their plan, when)
Began = dict[int, tuple[CellPlan, float]]
Outcomes = tuple[dict[int, CellResult], Began]


def _build_and_record(state: CellRunner, i: int, plan: CellPlan, out: Outcomes) -> None:
    """Build cell ``i`` (the caller holds its lock) into ``out``; a Ctrl-C records it as
    interrupted, with how long it ran and its log."""
    results, began = out
    began[i] = (plan, time.monotonic())
    try:
        results[i] = _build_cell(state, plan)
    except KeyboardInterrupt as exc:  # the report says how far it came, with its log
        results[i] = state.interrupted(plan, exc, time.monotonic() - began[i][1])
        raise


def _try_cell(state: CellRunner, i: int, plan: CellPlan, out: Outcomes, where: str) -> bool:
    """Build cell ``i`` unless another run holds its lock; False when it does (the cell
    is then taken up last)."""
    assert plan.key is not None
    with owned_lock(lock_path(state.settings.cache_dir, plan.key), wait=False) as mine:
        if not mine:
            state.reporter.info(f"{where}: another run is building it; taken up last")
            return False
        state.reporter.header(f"{where}: building")
        _build_and_record(state, i, plan, out)
        return True


def _at_once(state: CellRunner, queue: list[tuple[int, CellPlan]], total: int,
             out: Outcomes, *, own_builder: bool) -> list[tuple[int, CellPlan]]:
    """Build the cells of ``queue`` at once (at most :data:`CELLS_AT_ONCE`), each after
    the cells of its recipe's companions; returns the cells another run holds.  With
    wheelforge's own builder the cells share one pool of compile slots."""
    first = queue[0][1]
    assert first.config is not None
    shared = state
    with contextlib.ExitStack() as stack:
        if own_builder:  # the pool lives as long as these cells (not for the deferred ones)
            pool = stack.enter_context(scheduler.pool_for(first.config))
            shared = copy.copy(state)
            shared.build = with_companions(state.book, pool)
            state.reporter.info(f"{len(queue)} cells to build, up to {CELLS_AT_ONCE} at once, "
                                f"sharing {pool.size} compile slot(s)")
        ended = {i: threading.Event() for i, _ in queue}
        needs = {i: [j for j, other in queue if j != i and other.cell.recipe in
                     _companions(state, plan)] for i, plan in queue}
        turns = threading.Semaphore(CELLS_AT_ONCE)
        deferred: list[tuple[int, CellPlan]] = []
        raised: list[BaseException] = []

        def work(i: int, plan: CellPlan) -> None:
            view = state.reporter.view(f"{i + 1}/{total}")
            try:
                for j in needs[i]:
                    _wait(ended[j].wait)
                _wait(lambda timeout: turns.acquire(timeout=timeout))
                try:
                    mine = copy.copy(shared)  # the run's state, reporting through the view
                    mine.reporter = view
                    if not _try_cell(mine, i, plan, out, plan.cell.label):  # [N/M]: the view
                        deferred.append((i, plan))
                finally:
                    turns.release()
            except BaseException as exc:  # raised again by the caller, in its thread
                raised.append(exc)
            finally:
                view.done()
                ended[i].set()

        scheduler.run_all([threading.Thread(target=work, args=item, daemon=True,
                                            name=f"wheelforge-cell-{item[0] + 1}")
                           for item in queue])
        if raised:
            raise next((e for e in raised if isinstance(e, KeyboardInterrupt)), raised[0])
    return sorted(deferred, key=lambda item: item[0])


def _companions(state: CellRunner, plan: CellPlan) -> set[str]:
    """The recipes ``plan``'s recipe needs published first: its companions, theirs..."""
    out: set[str] = set()
    todo = [str(c) for c in plan.recipe.companions] if plan.recipe else []
    while todo:
        name = todo.pop()
        if name not in out:
            out.add(name)
            with contextlib.suppress(WheelforgeError):
                todo.extend(str(c) for c in state.recipe(name).companions)
    return out


def _wait(wait: Callable[[float], bool]) -> None:
    """``wait(timeout)`` until it says True; Ctrl-C (the command stopping) ends it."""
    while not wait(0.2):
        if _proc.stopping():
            raise KeyboardInterrupt
