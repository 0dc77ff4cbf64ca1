"""The stack gate after a night: every channel of the matrix's cells is installed whole,
with its dependencies, and imported (:mod:`wheelforge.consume.stack`); the statuses
go into the index and the night's report, with the dependencies that moved since the last
good check named when a stack broke."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from .. import index
from .._log import Reporter
from ..consume import stack, stackinputs
from ..errors import WheelforgeError
from ..index.health import StackStatus
from ..recipe.format import RecipeBook
from .cells import CellResult, Settings


def channels_of_night(index_dir: Path, results: Sequence[CellResult]) -> dict[str | None, str]:
    """Each channel of the night's cells, built or already published, with the interpreter
    of one of its cells (a pure wheel is on every channel's pages).  check_night skips a
    channel whose last passing check saw exactly what it would install now (issue 53); a
    new upstream release of a dependency, which could break a stack whose wheels did not
    change, is not seen then: the skip's line says so."""
    out: dict[str | None, str] = {}
    pure_python: str | None = None
    for r in results:
        if r.status not in ("built", "skipped"):
            continue
        if r.archs is None:  # a pure cell
            pure_python = pure_python or r.python
            continue
        with contextlib.suppress(WheelforgeError, ValueError):
            out.setdefault(index.channel_name(r.cuda, r.torch.split("==")[-1]), r.python)
    if pure_python is not None:
        known = {r.channel for r in index.load_records(index_dir) if r.channel}
        every: list[str | None] = [*sorted(known)] or [None]
        for channel in every:
            out.setdefault(channel, pure_python)
    return out


def check_night(settings: Settings, book: RecipeBook | None, results: Sequence[CellResult],
                reporter: Reporter) -> tuple[StackStatus, ...]:
    """Check and record the stack of every channel of the night's cells, unless its last
    check passed with exactly what the check would install and import now (a night that
    published nothing there: the recorded status stands, and a line says so), or
    ``settings.stack_recheck`` (WHEELFORGE_STACK_CHECK=always) asks for it anyway."""
    if not settings.stack_check:
        return ()
    statuses = []
    for channel, python in sorted(channels_of_night(settings.index_dir, results).items(),
                                  key=lambda kv: kv[0] or ""):
        options = stack.StackOptions(python=Path(python), work_dir=settings.cache_dir / "stack",
                                     log_dir=settings.cache_dir / "logs",
                                     deps_dir=settings.deps_dir, environ=settings.environ)
        passed = None if settings.stack_recheck else stack.unchanged(
            settings.index_dir, channel, book, options)
        if passed is not None:  # nothing the check would install or import has changed
            reporter.info(stackinputs.skip_line(passed, settings.deps_dir))
            statuses.append(passed)
            continue
        with reporter.step(f"stack check of {channel or 'simple/'}"):
            status = stack.check(settings.index_dir, channel, book, options,
                                 say=reporter.info)
            before = stack.record(settings.index_dir, status)
        moved = stack.changed_dependencies(before, status)
        if status.state == "broken" and before is not None and before.state == "good" and moved:
            status = _with_moves(status, before, moved)
        reporter.info(f"stack {channel or 'simple/'}: {status.label}")
        statuses.append(status)
    return tuple(statuses)


def _with_moves(status: StackStatus, before: StackStatus, moved: list[str]) -> StackStatus:
    return dataclasses.replace(status, reason=f"{status.reason}; was good at "
                               f"{before.checked_at}, since then {', '.join(moved)}")
