"""The nightly wheel cache: the matrix's cells built on one machine or fanned out.

:mod:`.cells` holds what every part shares (a cell's result, the settings, the report of a
run); :mod:`.state` one run's plans of its cells; :mod:`.fanout` the plan and run parts (a
cell built into a stage) and the GitHub Actions matrix; :mod:`.publishing` the publish
part (stages published under the index lock; :mod:`.stagecheck` its checks of a stage,
:mod:`.signing` the builders' SSH signatures); :mod:`.inprocess` the nightly on one
machine, through the same parts;
:mod:`.rayexec` the Ray executor; :mod:`.gate` the stack check of the channels a night
changed; :mod:`.report` the JSON and HTML report;
:mod:`.prune` the retention; :mod:`.canary` the opt-in trial of each canary recipe's newest
upstream release (never published).

May import: :mod:`wheelforge.consume`, :mod:`wheelforge.maintain`,
:mod:`wheelforge.builder`, :mod:`wheelforge.index`, :mod:`wheelforge.recipe` and the
primitives; never the CLI.  The names below are the
nightly's API.
"""

from .cells import (
    REPORTS_DIR,
    Builder,
    CanaryResult,
    CellResult,
    CellStatus,
    NightlyReport,
    Settings,
    resolve_python,
)
from .inprocess import run
from .prune import PruneResult, plan_prune, prune
from .report import render_html, to_json, write_report
from .state import CellPlan, CellRunner, with_companions

__all__ = [
    "REPORTS_DIR",
    "Builder",
    "CanaryResult",
    "CellPlan",
    "CellResult",
    "CellRunner",
    "CellStatus",
    "NightlyReport",
    "PruneResult",
    "Settings",
    "plan_prune",
    "prune",
    "render_html",
    "resolve_python",
    "run",
    "to_json",
    "with_companions",
    "write_report",
]
