"""Several builds of one command at once, within one pool of compile slots.

``wheelforge build A B`` and a recipe with companions (mamba-ssm: causal-conv1d) plan
one build per recipe, companions first.  Each build runs :func:`pipeline.build_one` in a
thread of its own, so the fixed steps of one (fetch, environment, verify imports,
publish) overlap the compiles of the others, and every compile takes its jobs from the
command's pool (builder/compiling/jobserver.py) one unit at a time: a slot one compile's unit
gives back goes to the next waiting unit of any build, so the cores stay busy as long
as any build has work (and, through the pool's jobserver, ptxas's threads take the
slots no unit asks for).  ``WHEELFORGE_BUILDS_AT_ONCE=off`` builds them one after another
instead, in the same pool.
A build waits for a companion only where it needs it: for the companion's build
key in its preflight, for its exact version (which the wheel pins; known once the
companion's build environment is) after its own compile, and for its published wheel
before its own publish, so that a build post-processes and verifies its wheel while its
companion still compiles, and never publishes a wheel that pins an unpublished one.

Each build reports through a view of the command's reporter (its lines prefixed with
the recipe's name, one live line per running build).  A failed build does not stop the
others; the builds that need it are not built, and the command raises the first failure
once the rest have ended.  The command's builds share its warm interpreters
(builder/artifact/importcheck.py): torch is imported once per interpreter for every extension's
import check, while the compiles run.  Ctrl-C (or SIGTERM, --timeout) stops every build's commands
(``_proc.stop_all``) and raises KeyboardInterrupt in the caller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

from .. import _proc
from .._log import Reporter
from ..errors import BuildError, ConfigError, RecipeError
from ..recipe.format import RecipeBook
from ..recipe.model import Recipe
from ..wheel import wheel_version
from .artifact import importcheck
from .artifact.identity import tree_id, without_subset
from .compiling import jobserver, unitcosts
from .config import BuildConfig
from .env import buildenv
from .pipeline import BuildResult, Pending, build_one

T = TypeVar("T")

#: ``off``: a command's builds run one after another.
ENV = "WHEELFORGE_BUILDS_AT_ONCE"

#: How long the builds get to stop after Ctrl-C before the command leaves them.
STOP_GRACE_S = 15.0


@dataclass(frozen=True)
class Planned:
    """One build of a command: the recipe, its configuration, the companions it needs."""
    recipe: Recipe
    config: BuildConfig
    companions: tuple[str, ...]


def plan(recipes: list[Recipe], book: RecipeBook, config: BuildConfig) -> list[Planned]:
    """``recipes`` and the companions each one names, once each, companions first.  A
    companion is built whole (without ``--subset``) unless it is named itself."""
    order: dict[str, Planned] = {}
    names = {r.name for r in recipes}

    def visit(recipe: Recipe, chain: tuple[str, ...]) -> None:
        if recipe.name in chain:
            raise RecipeError(f"companions of {recipe.name} form a cycle",
                              why=" -> ".join([*chain, recipe.name]),
                              fix="a companion cannot (indirectly) name the recipe itself")
        if recipe.name in order:
            return
        for c in recipe.companions:
            visit(book.load(c), (*chain, recipe.name))
        named = recipe.name in names and not chain
        order[recipe.name] = Planned(recipe, config if named else without_subset(config),
                                     tuple(str(c) for c in recipe.companions))

    for r in recipes:
        visit(r, ())
    return list(order.values())


def build_with_companions(recipes: list[Recipe], book: RecipeBook, config: BuildConfig,
                          reporter: Reporter, pool: jobserver.Pool | None = None,
                          inspections: buildenv.Inspections | None = None,
                          shared_requirements: tuple[str, ...] = ()
                          ) -> list[BuildResult]:
    """Build ``recipes`` and the companions each one names (reused when published); every
    wheel pins the companion builds it was made with.  The results come companions first.
    Interpreters are inspected once for all of them (buildenv.Inspections).  One build
    runs here; several run at once (see the module's docstring).  ``pool``: compile
    slots shared with builds of the caller's (the nightly's cells at once), else the
    command's own (one build that compiles too: the pool's jobserver lends ptxas's
    threads the slots its units leave free).  The builds share a managed environment,
    and every one of them asks it for the requirements of all (theirs and
    ``shared_requirements``, the caller's other builds'): the first to prepare it
    installs them all, before any compile, where a
    later build's install would change it under a running compile (a setup.py that
    imports torch, and with it a numpy half-installed, fails)."""
    planned = shared(plan(recipes, book, config), shared_requirements)
    inspections = inspections or buildenv.Inspections()
    with importcheck.WarmImports() as warm, contextlib.ExitStack() as stack:
        # the command's pool, also for one build that compiles: its jobserver serves
        # ptxas's threads (none for pure builds: a killed command leaves its directory)
        if pool is None and any(p.recipe.build.kind == "extension" for p in planned):
            pool = stack.enter_context(pool_for(config))
        if len(planned) == 1 or not at_once():
            done: dict[str, BuildResult] = {}
            for p in planned:  # one after another, in the caller's thread
                done[p.recipe.name] = build_one(
                    p.recipe, p.config, reporter, {c: done[c] for c in p.companions},
                    inspections, pool=pool, warm=warm)
            return list(done.values())
        if pool is None:  # pure builds at once: the pool only orders their (no) compiles
            pool = stack.enter_context(pool_for(config))
        return _together(planned, reporter, inspections, pool, warm)


def requirements_of(recipes: Iterable[Recipe]) -> tuple[str, ...]:
    """What the builds of ``recipes`` install into a managed environment beside torch:
    each recipe's build and verify requirements, once each, in order."""
    return tuple(dict.fromkeys(r for recipe in recipes
                               for r in (*recipe.build.requires, *recipe.verify.requires)))


def shared(planned: list[Planned], also: tuple[str, ...] = ()) -> list[Planned]:
    """``planned`` with every build's configuration holding the requirements of all of
    them and ``also`` (``BuildConfig.shared_requirements``)."""
    wanted = tuple(dict.fromkeys((*requirements_of(p.recipe for p in planned), *also)))
    return [dataclasses.replace(p, config=dataclasses.replace(p.config,
                                                              shared_requirements=wanted))
            for p in planned]


def pool_for(config: BuildConfig) -> jobserver.Pool:
    """The compile slots of a command built with ``config``: MAX_JOBS x NVCC_THREADS."""
    return jobserver.Pool(config.jobs * config.nvcc_threads, lend=jobserver.lends())


def at_once(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a command's builds run at once: yes, unless WHEELFORGE_BUILDS_AT_ONCE=off
    (one after another, as before; for comparing, or a machine where it misbehaves)."""
    value = (os.environ if environ is None else environ).get(ENV, "on").strip().lower()
    if value in ("on", "1", "yes", ""):
        return True
    if value in ("off", "0", "no"):
        return False
    raise ConfigError(f"{ENV}={value!r} is neither on nor off",
                      fix=f"{ENV}=off builds one recipe after another; unset it (or on) to "
                          "build a command's recipes at once")


class _Build:
    """One running build's hand-offs: its key and its result, as futures."""

    def __init__(self, planned: Planned) -> None:
        self.planned = planned
        self.name = planned.recipe.name
        self.key: Future[str] = Future()
        self.version: Future[str] = Future()
        self.result: Future[BuildResult] = Future()
        self.blocked_by: str | None = None  # a companion whose failure stopped it

    def settle(self, outcome: BuildResult | BaseException) -> None:
        if isinstance(outcome, BaseException):
            for f in (self.key, self.version, self.result):
                if not f.done():
                    f.set_exception(outcome)
            return
        if not self.key.done():
            self.key.set_result(outcome.build_key)
        if not self.version.done():  # published already: nothing was built
            self.version.set_result(wheel_version(outcome.wheel))
        self.result.set_result(outcome)


def _needs(build: _Build, companion: _Build, future: Future[T]) -> Callable[[], T]:
    """What ``build`` calls to wait for ``future`` of its ``companion``: its value, or a
    BuildError saying that the companion failed."""
    def wait() -> T:
        try:
            return future.result()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            build.blocked_by = companion.name
            raise BuildError(f"{build.name} was not built: its companion {companion.name} "
                             "failed", why=getattr(exc, "what", str(exc)),
                             fix=f"see {companion.name}'s error; a fixed "
                                 f"{companion.name} builds both") from None
    return wait


def _together(planned: list[Planned], reporter: Reporter, inspections: buildenv.Inspections,
              pool: jobserver.Pool, warm: importcheck.WarmImports) -> list[BuildResult]:
    builds = {str(p.recipe.name): _Build(p) for p in planned}
    for p in planned:  # the longest compile last time starts its units first
        if p.recipe.build.kind != "extension":
            continue  # a pure build compiles nothing
        costs = unitcosts.recorded(p.config.cache_dir, p.recipe.name, p.config.arch_list,
                                   tree_id(p.recipe))
        if costs is not None:
            pool.expect(str(p.recipe.name), unitcosts.total_seconds(costs))
    reporter.info(f"{len(planned)} builds at once ({', '.join(builds)}), sharing "
                  f"{pool.size} compile slot(s)")

    def run(build: _Build) -> None:
        view = reporter.view(build.name)
        companions = {c: Pending(key=_needs(build, builds[c], builds[c].key),
                                 version=_needs(build, builds[c], builds[c].version),
                                 result=_needs(build, builds[c], builds[c].result),
                                 project=str(builds[c].planned.recipe.project_name))
                      for c in build.planned.companions}
        outcome: BuildResult | BaseException
        try:
            outcome = build_one(build.planned.recipe, build.planned.config, view,
                                companions, inspections, pool=pool, warm=warm,
                                on_key=build.key.set_result,
                                on_version=build.version.set_result)
        except BaseException as exc:  # reported by the caller, in its thread
            outcome = exc
        finally:
            pool.withdraw(build.name)
            view.done()
        build.settle(outcome)

    run_all([threading.Thread(target=run, args=(b,), name=f"wheelforge-build-{b.name}",
                              daemon=True) for b in builds.values()])
    return _outcome(list(builds.values()), reporter)


def run_all(threads: list[threading.Thread]) -> None:
    """Start ``threads`` (builds) and wait for them.  Ctrl-C (or SIGTERM, --timeout)
    stops every command they run and starts no new one (``_proc.stop_all``), gives them
    :data:`STOP_GRACE_S` to end, and raises KeyboardInterrupt."""
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # short waits: a signal reaches this thread between them
    except KeyboardInterrupt:
        _proc.stop_all()  # every build's commands, and no new ones
        deadline = time.monotonic() + STOP_GRACE_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if not any(t.is_alive() for t in threads):
            _proc.resume()
        raise


def _outcome(builds: list[_Build], reporter: Reporter) -> list[BuildResult]:
    """The results in plan order, or the first failure raised (after saying which builds
    were published, failed or not built)."""
    failed = [b for b in builds if b.result.exception() is not None]
    if not failed:
        return [b.result.result() for b in builds]
    for b in builds:
        exc = b.result.exception()
        if exc is None:
            r = b.result.result()
            state = ("reproduced (already published)" if r.reproduced else
                     "already published" if r.skipped else "published")
            reporter.info(f"{b.name}: {state}: {r.wheel.name}")
        elif isinstance(exc, KeyboardInterrupt):
            reporter.info(f"{b.name}: stopped")
        elif b.blocked_by is not None:
            reporter.info(f"{b.name}: not built (its companion {b.blocked_by} failed)")
        else:
            reporter.info(f"{b.name}: failed: {getattr(exc, 'what', exc)}")
    first = next((b for b in failed if b.blocked_by is None), failed[0])
    exc = first.result.exception()
    assert exc is not None
    raise exc
