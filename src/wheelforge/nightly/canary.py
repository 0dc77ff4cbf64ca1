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
* **stack**: not run yet (the canary's wheel is not combined with its channel's).

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

from .._fs import TMP_PREFIX
from .._log import Reporter
from ..errors import PatchError, VerifyError, WheelforgeError
from ..maintain import outdated
from ..recipe.format import RecipeBook
from ..recipe.matrix import Canary, Matrix, cells
from .cells import Builder, CanaryResult, Settings
from .state import CellRunner

CANARY_DIR = "canary"  # under the cache: the scratch index and work of each canary
STACK_NOT_RUN = "not run: a canary's wheel is not yet checked in its channel's stack"


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
    cell = next(c for c in cells(matrix, {name: recipe.build.kind}) if c.recipe == name)
    settings.cache_dir.mkdir(parents=True, exist_ok=True)
    root = settings.cache_dir / CANARY_DIR
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=TMP_PREFIX + f"{name}-", dir=root) as tmp:
        scratch = dataclasses.replace(settings, index_dir=Path(tmp) / "index",
                                      work_dir=Path(tmp) / "work", stack_check=False)
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
            return dataclasses.replace(base, reason=f"{version} ({where}) has no sdist")
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
        return dataclasses.replace(base, state="passed", builds="yes", verifies="yes",
                                   reason=STACK_NOT_RUN, log=str(log) if log else None)

