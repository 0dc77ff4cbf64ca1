"""The nightly tries what is coming: the opt-in ``canary:`` of the matrix.

For each canary recipe, after the pinned cells (and their stack check) are done, the newest
upstream release after the pin is looked up through :mod:`wheelforge.maintain.outdated`
(the canary's index, with its deadline; a git source's tags), a recipe for that release is
derived in memory (the index's sdist and its sha256, or the tag's commit) and tried in
order:

* **applies**: the patch series onto the new source, in a scratch directory;
* **builds**: the recipe's first cell of the matrix, built into a scratch index under
  ``CACHE/canary/`` that is removed afterwards: never the real index, its pages, channels
  or pins;
* **verifies**: the build's normal verification (a :class:`~wheelforge.errors.VerifyError`
  is "verifies: no", any other build failure "builds: no");
* **stack**: the channel's published wheels copied into the scratch index beside the
  canary's, then its stack checked there (:func:`wheelforge.consume.stack.check`: the
  channel's newest wheels, the canary's among them, installed together and imported);
  nothing is recorded in the real index.  Off when the night's stack check is off.

The first failing step stops the rest and is named with its reason.  A canary that cannot
look up or fetch its release (offline, an unreachable index) is "not checked", with why.
Nothing here fails the night: the results go into the report beside the pinned cells, and
the exit status is the pinned cells' (docs/nightly.md).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

from .. import index
from .._fs import TMP_PREFIX
from .._log import Reporter
from ..consume import stack
from ..errors import PatchError, VerifyError, WheelforgeError
from ..index.health import StackStatus, summary_line
from ..index.pins import channels, is_pure
from ..maintain import outdated
from ..recipe.format import RecipeBook
from ..recipe.matrix import Canary, Matrix, cells
from .cells import Builder, CanaryResult, Settings
from .fanout import seed_companions
from .state import CellRunner

CANARY_DIR = "canary"  # under the cache: the scratch index and work of each canary
STACK_OFF = "stack: the night's stack check is off"


def run_canaries(matrix: Matrix, book: RecipeBook, settings: Settings, *,
                 reporter: Reporter, build: Builder) -> tuple[CanaryResult, ...]:
    """Try the newest release of every canary recipe; () without a canary: section.

    ``build`` is the builder of the night's cells (a recipe's companions first)."""
    if matrix.canary is None:
        return ()
    out = []
    for name in matrix.canary.recipes:
        reporter.header(f"canary {name}: the newest upstream release")
        started = time.monotonic()
        try:
            result = _one(name, matrix, matrix.canary, book, settings, reporter, build)
        except (WheelforgeError, OSError) as exc:  # never fails the night
            what = exc.what if isinstance(exc, WheelforgeError) else str(exc)
            result = CanaryResult(recipe=name, pinned="?", state="not checked", reason=what)
        result = dataclasses.replace(result, duration_s=round(time.monotonic() - started, 3))
        reporter.info(result.line())
        out.append(result)
    return tuple(out)


def _one(name: str, matrix: Matrix, canary: Canary, book: RecipeBook, settings: Settings,
         reporter: Reporter, build: Builder) -> CanaryResult:
    recipe = book.load(name)
    base = CanaryResult(recipe=name, pinned=str(recipe.version), state="not checked")
    cell = next(c for c in cells(matrix, {name: recipe.build.cell_kind}) if c.recipe == name)
    settings.cache_dir.mkdir(parents=True, exist_ok=True)
    root = settings.cache_dir / CANARY_DIR
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=TMP_PREFIX + f"{name}-", dir=root) as tmp:
        scratch = dataclasses.replace(settings, index_dir=Path(tmp) / "index",
                                      work_dir=Path(tmp) / "work")
        state = CellRunner(matrix, book, scratch, reporter, build)
        planned = state.plan(cell)  # the pinned cell's configuration (and git mirrors)
        if planned.error is not None or planned.config is None:
            why = planned.error.what if planned.error else "no configuration"
            return dataclasses.replace(base, reason=f"the cell could not be planned: {why}")
        mirrors = dict(planned.config.git_mirrors)
        found, _head, _ahead, problems = outdated.releases(
            recipe, index_url=canary.index_url, timeout=canary.timeout, git_mirrors=mirrors,
            say=reporter.info)
        if not found:
            if problems:
                return dataclasses.replace(base, reason="; ".join(problems))
            return dataclasses.replace(base, state="up to date",
                                       reason=f"no release after {recipe.version}")
        version, where, source = found[-1]
        base = dataclasses.replace(base, version=str(version), cell=cell.label)
        if source is None:
            refused = [x for x in problems if x.startswith(f"{version}: ")]
            return dataclasses.replace(base, reason=f"{version} ({where}) has no sdist"
                                       + (f" wheelforge accepts ({'; '.join(refused)})"
                                          if refused else ""))
        base = dataclasses.replace(base, source=source.identity)
        reporter.info(f"{name} {recipe.version} -> {version} ({where}): {source.identity}")
        series, detail = outdated.try_series(recipe, version, source, mirrors, canary.timeout)
        if series == "fetch failed":
            return dataclasses.replace(base, reason=f"the source of {version}: {detail}")
        if series != "applies":
            return dataclasses.replace(base, state="failed", applies="no",
                                       failed_step="applies", reason=detail)
        base = dataclasses.replace(base, applies="yes")
        state.recipes[name] = dataclasses.replace(recipe, version=version, sources=(source,))
        plan = state.plan(cell)  # the new release's build key, in the scratch index
        try:
            if plan.error is not None:
                raise plan.error
            assert plan.recipe is not None and plan.config is not None
            if plan.recipe.build.kind == "extension":
                state.check_torch_cuda(plan)
            # the companions the real index holds for this target are reused, not rebuilt
            seed_companions(state, plan.recipe, plan.config, settings.index_dir,
                            scratch.index_dir)
            res = build(plan.recipe, plan.config, reporter)
        except VerifyError as exc:
            return dataclasses.replace(base, state="failed", builds="yes", verifies="no",
                                       failed_step="verifies", reason=exc.what, log=exc.log)
        except PatchError as exc:  # the series applied above; the build's own copy did not
            return dataclasses.replace(base, state="failed", applies="no",
                                       failed_step="applies", reason=exc.what, log=exc.log)
        except WheelforgeError as exc:
            return dataclasses.replace(base, state="failed", builds="no",
                                       failed_step="builds", reason=exc.what, log=exc.log)
        finally:
            shutil.rmtree(Path(tmp) / "work", ignore_errors=True)
        log = getattr(res, "log", None)
        base = dataclasses.replace(base, builds="yes", verifies="yes",
                                   log=str(log) if log else None)
        if not settings.stack_check:
            return dataclasses.replace(base, state="passed", reason=STACK_OFF)
        try:
            status = _stack(settings, book, scratch.index_dir, res.channel, plan.python,
                            reporter)
        except (WheelforgeError, OSError) as exc:
            what = exc.what if isinstance(exc, WheelforgeError) else str(exc)
            return dataclasses.replace(base, state="passed", reason=f"stack: {what}")
        if status.state == "good":
            return dataclasses.replace(base, state="passed", stack="yes")
        if status.state == "broken":
            return dataclasses.replace(base, state="failed", stack="no", failed_step="stack",
                                       reason=summary_line(status))
        return dataclasses.replace(base, state="passed", reason=f"stack: {status.reason}")


def _stack(settings: Settings, book: RecipeBook, scratch: Path, channel: str | None,
           python: str, reporter: Reporter) -> StackStatus:
    """The stack of the canary's channel (a pure canary: the first channel of the real
    index) in the scratch index: the real index's wheels of that channel are copied in
    beside the canary's, whose newer version is then the one installed; not recorded."""
    real = index.load_records(settings.index_dir)
    if channel is None:
        channel = next(iter(channels(real)), None)
    have = {r.build_key for r in index.load_records(scratch) if r.build_key}
    names = {p.name for p in (scratch / index.FILES_DIR).iterdir()}
    for r in real:
        if r.yanked is not None or r.build_key in have or r.filename in names or not (
                r.channel == channel or (r.channel is None and is_pure(r.filename))):
            continue
        index.publish(scratch, settings.index_dir / index.FILES_DIR / r.filename,
                      channel=r.channel, cuda=r.cuda, torch=r.torch, archs=r.archs,
                      build_key=r.build_key)
    options = stack.StackOptions(python=Path(python), work_dir=settings.cache_dir / "stack",
                                 log_dir=settings.cache_dir / "logs",
                                 deps_dir=settings.deps_dir, environ=settings.environ)
    with reporter.step(f"canary stack check of {channel or 'simple/'}"):
        return stack.check(scratch, channel, book, options, say=reporter.info)

