"""The in-process nightly: build every out-of-date cell of the matrix, one after another,
and report.

:func:`run` walks the cells of the ``matrix:`` in wheelforge.yaml.  A cell whose
build key is already published is skipped before any environment is created or
anything is compiled; the others are built one after another by
:func:`scheduler.build_with_companions` (a recipe's companions built or reused first),
each into a stage and published from it by the parts of :mod:`fanout` (``nightly run``
and ``nightly publish``), and a failure is recorded and the run goes on.  Each build
holds a lock per build key (``CACHE/locks/KEY.lock``) and checks the index again once
it holds it, so two nightly runs on one index never build a cell twice: a cell that
another run is building is put back and taken up last, when that run has published it.

With a ``canary:`` in the matrix, the newest upstream release of each canary recipe is
then tried in scratch (:mod:`.canary`): reported beside the cells, never published, and
never part of the night's status.

Every run writes ``nightly-<UTC time>.json`` and ``.html`` to the report directory
(``<index>/reports/`` unless told otherwise), and ``nightly-latest.json``/``.html``.

Retention (``wheelforge prune``) is :mod:`.prune`'s.
"""

from __future__ import annotations

import contextlib
import os
import time
from datetime import datetime, timezone
from pathlib import Path

from .. import index
from .._fs import locked, owned_lock
from .._log import Reporter
from ..builder import pipeline
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
    found = pipeline.published_with_key(state.settings.index_dir, plan.key)
    if found is not None:
        state.published[plan.key] = found
        return state.skipped(plan, "published by another run meanwhile")
    return run_and_publish(state, plan)


def run(matrix: Matrix, book: RecipeBook, settings: Settings, *, reporter: Reporter,
        report_dir: Path | None = None, build: Builder | None = None) -> NightlyReport:
    """Build every out-of-date cell; write the report (also when interrupted).

    ``report_dir`` defaults to ``<index>/reports``.  ``build`` is the builder
    (:func:`scheduler.build_with_companions`, a recipe's companions built or reused first; tests
    pass their own).
    """
    started_wall, started = datetime.now(timezone.utc), time.monotonic()
    index.repair(settings.index_dir)  # a change a killed writer left: finished first
    state = CellRunner(matrix, book, settings, reporter, build or with_companions(book))
    state.check_companions()
    todo = state.companions_first(cells(matrix, state.kinds()))
    results: dict[int, CellResult] = {}
    deferred: list[tuple[int, CellPlan]] = []
    interrupted = False
    stacks: tuple[StackStatus, ...] = ()
    canaries: tuple[CanaryResult, ...] = ()
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
            with owned_lock(lock_path(settings.cache_dir, plan.key), wait=False) as mine:
                if not mine:
                    reporter.info(f"{where}: another run is building it; taken up last")
                    deferred.append((i, plan))
                    continue
                reporter.header(f"{where}: building")
                results[i] = _build_cell(state, plan)
        for i, plan in deferred:
            assert plan.key is not None
            reporter.info(f"[{i + 1}/{len(todo)}] {plan.cell.label}: waiting for the other run")
            with owned_lock(lock_path(settings.cache_dir, plan.key)):
                results[i] = _build_cell(state, plan)
        stacks = check_night(settings, book, list(results.values()), reporter)
        # last, never publishing: a canary's failure is reported, the night's status stays
        canaries = run_canaries(matrix, book, settings, reporter=reporter, build=state.build)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        for i, cell in enumerate(todo):
            if i not in results:
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
