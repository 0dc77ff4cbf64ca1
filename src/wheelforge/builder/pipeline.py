"""The ordered build steps with typed hand-offs.

fetch -> patch -> preflight -> build key (skip if published) -> build env ->
compile -> relabel -> SBOM (PEP 770) -> verify -> publish.  A build holds its build key's lock
(``CACHE/locks/KEY.lock``, the nightly's too) from before the fetch to the end of the
publish, in a work directory of its own; the directory is removed after a successful
publish and kept (and named) after a failure.  The source is compiled at a fixed path with
the source's date and a fixed umask, so a build key gives the same bytes on every builder
(builder/artifact/reproducible.py, docs/reproducible.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from .. import index, workdirs
from .._fs import owned_lock
from .._log import Reporter
from ..errors import BuildError, RecipeError, ToolchainError, WheelforgeError, attach_log
from ..recipe.model import Recipe
from ..recipe.subsets import subset_environment, subset_label
from ..wheel import labeled_version, relabel, relabeled_name, wheel_version
from .artifact import importcheck, platform, reproducible, sbom
from .artifact.identity import (
    build_key,
    key_lock_path,
    local_label,
    next_build_tag,
    published_with_key,
    recipe_subset,
    toolchain_identity,
    tree_id,
)
from .artifact.platform import PlatformTag
from .artifact.verify import verify_wheel
from .checks import doctor, preflight
from .compiling import compilecache, jobserver, toolchain, unitcosts
from .compiling.backend import NINJA_PROGRESS, build_wheel, check_build_requires, require
from .compiling.compilecache import CacheStats
from .config import BuildConfig, compile_units, jobs_for, record_gib_per_job
from .env import buildenv, bytecode, envlock
from .env.buildenv import BuildEnv
from .source.fetch import extract, fetch
from .source.patch import apply_series


@dataclass(frozen=True)
class BuildResult:
    recipe: Recipe
    wheel: Path
    sass: tuple[str, ...]
    channel: str | None
    build_key: str
    skipped: bool = False
    reproduced: bool = False  # a --force rebuild that gave the published wheel's bytes
    log: Path | None = None
    cache: CacheStats | None = None
    platform: PlatformTag | None = None  # the manylinux analysis (extensions built here)


def _environment(recipe: Recipe, config: BuildConfig, env: BuildEnv,
                 cuda: toolchain.Cuda | None,
                 cache: compilecache.CompileCache | None = None,
                 epoch: int | None = None, tmpdir: Path | None = None) -> dict[str, str]:
    environ = dict(os.environ)
    if epoch is not None:  # the source's, whatever the caller's environment says
        environ["SOURCE_DATE_EPOCH"] = str(epoch)
    if tmpdir is not None:  # the fixed path's: what a stopped nvcc leaves goes with it
        environ["TMPDIR"] = str(tmpdir)
    path = [str(env.bin_dir)]
    if cuda is not None:
        path.append(str(cuda.home / "bin"))
        environ["CUDA_HOME"] = str(cuda.home)
        environ["TORCH_CUDA_ARCH_LIST"] = config.arch_list
    environ["PATH"] = os.pathsep.join([*path, environ.get("PATH", "")])
    environ["MAX_JOBS"] = str(config.jobs)
    environ["NVCC_THREADS"] = str(config.nvcc_threads)
    environ.pop("PYTHONPATH", None)
    environ.update(cache.environ if cache else compilecache.OFF_ENVIRONMENT)
    if cuda is not None:  # torch's nvcc command: the cache's (or the toolkit's) + options
        flags = reproducible.nvcc_flags(cuda.nvcc)
        if cache is None or cache.backend != "sccache":  # (builder/compiling/jobserver.py: why)
            flags += jobserver.nvcc_flags(cuda.nvcc)
        if flags:
            nvcc = environ.get("PYTORCH_NVCC") or shlex.quote(str(cuda.nvcc))
            environ["PYTORCH_NVCC"] = " ".join([nvcc, *flags])
    environ["PYTHONUNBUFFERED"] = "1"  # the backend's output arrives as it is written
    environ = bytecode.environ(environ, python=env.python, managed=env.managed,
                               cache_dir=config.cache_dir)
    environ.update(dict(recipe.build.env))
    environ.update(subset_environment(recipe, recipe_subset(recipe, config)))
    return environ


def _get_env(recipe: Recipe, config: BuildConfig, reporter: Reporter, log: Path,
             inspections: buildenv.Inspections,
             hold: envlock.Hold | None = None) -> BuildEnv:
    # torch's version is read only when the wheel depends on what it is
    torch = recipe.build.needs_torch
    if config.python is not None:
        return inspections.inspect(config.python, with_torch=torch)
    backend = config.compile_cache.backend if recipe.build.kind == "extension" else None
    tools = (compilecache.REQUIREMENTS[backend],) if backend else ()
    return buildenv.managed_env(
        config.cache_dir,
        base_python=config.base_python,
        torch_req=config.torch,
        # the builds beside this one's too (config.shared_requirements): installed
        # before any of them compiles, never while one's setup.py imports torch (and
        # with it numpy, half-installed)
        requirements=tuple(dict.fromkeys((*recipe.build.requires, *recipe.verify.requires,
                                          *tools, *config.shared_requirements))),
        pip_args=config.torch_pip_args,
        progress=reporter.info,
        log=log,
        with_torch=torch,
        inspections=inspections,
        # held until the build ends: another process's install into it waits
        hold=hold,
    )


def _doctor(config: BuildConfig, env: BuildEnv, reporter: Reporter) -> None:
    """The checks of `wheelforge doctor`, before any compile: FAIL stops the build."""
    findings = doctor.run_checks(archs=config.archs, python=env.python,
                                 work_dir=config.work_dir, cache_dir=config.cache_dir,
                                 jobs=config.jobs, check_torch=False,
                                 gib_per_job=config.gib_per_job)
    for f in findings:
        if f.status == "WARN":
            reporter.info(f"WARN {f.check}: {f.detail}" + (f" ({f.fix})" if f.fix else ""))
    failed = doctor.failures(findings)
    if failed:
        raise ToolchainError(
            f"preflight found {len(failed)} problem(s); nothing was compiled",
            why="\n" + doctor.render(failed),
            fix="fix the problems above (each line says how); `wheelforge doctor` re-checks")


@dataclass(frozen=True)
class Pending:
    """A companion built beside the build that needs it (builder/scheduler.py): ``key()``
    waits for its build key (known after its preflight), ``version()`` for the exact
    version its wheel will have (known once its build environment is), ``result()`` for
    its published wheel; each raises what stopped it."""
    key: Callable[[], str]
    version: Callable[[], str]
    result: Callable[[], BuildResult]


def build_one(recipe: Recipe, config: BuildConfig, reporter: Reporter,
              companions: Mapping[str, BuildResult | Pending] | None = None,
              inspections: buildenv.Inspections | None = None, *,
              pool: jobserver.Pool | None = None,
              warm: importcheck.WarmImports | None = None,
              on_key: Callable[[str], None] | None = None,
              on_version: Callable[[str], None] | None = None) -> BuildResult:
    """Build one recipe.  ``companions`` are the builds of the recipe's companions for this
    configuration, done or :class:`Pending`: their build keys go into this one's, their
    exact versions (local label included) into the wheel's requirements.
    ``inspections``: the interpreters the command inspected already (one import of torch
    per interpreter and command).  ``pool``: the command's compile slots, shared with the
    builds beside this one (builder/compiling/jobserver.py).  ``warm``: the command's warm
    interpreters, one per interpreter: started when an extension's compile starts, they
    serve its import check (builder/artifact/importcheck.py); without, it runs cold.  ``on_key``
    hears the build key as soon as it is known, ``on_version`` the wheel's exact version
    (the recipe's, its local label) once the build environment is: a build that pins this
    one post-processes and verifies its wheel while this one compiles, and waits for this
    one's published wheel only before its own publish."""
    inspections = inspections or buildenv.Inspections()
    inspect = inspections.inspect
    companions = companions or {}
    missing = sorted(set(recipe.companions) - set(companions))
    if missing:
        raise RecipeError(f"{recipe.name} needs its companion(s) {', '.join(missing)} built first",
                          fix=f"run 'wheelforge build {recipe.name}' (it builds them too)")

    # this build's hold on its managed environment (builder/env/envlock.py), let go while it
    # waits for a companion's build, which might wait for another process's install
    env_hold = envlock.Hold()

    def companion_version(name: str) -> str:
        found = companions[name]
        if isinstance(found, BuildResult):
            return wheel_version(found.wheel)
        with env_hold.paused():
            return found.version()

    def companion_published(name: str, pinned: str) -> None:
        found = companions[name]
        if isinstance(found, Pending):
            reporter.info(f"waiting for its companion {name}")
            with env_hold.paused():
                found = found.result()
        if wheel_version(found.wheel) != pinned:
            raise BuildError(f"{recipe.name}'s wheel pins {name}=={pinned}, but {name} "
                             f"was published as {found.wheel.name}",
                             why="the companion's version changed during its build",
                             fix="run the command again; if it recurs, report it with "
                                 "both recipes")

    companion_keys = {str(n): (c.build_key if isinstance(c, BuildResult) else c.key())
                      for n, c in ((n, companions[n]) for n in recipe.companions)}
    reporter.header(f"{recipe.name} {recipe.version}")
    extension = recipe.build.kind == "extension"
    work: Path | None = None
    fixed: reproducible.FixedPaths | None = None
    stamp = time.strftime("%Y%m%dT%H%M%S")
    log = config.cache_dir / "logs" / f"{recipe.name}-{recipe.version}-{stamp}-{os.getpid()}.log"
    held = contextlib.ExitStack()  # the build key's lock, from before the fetch to the end
    held.enter_context(env_hold)
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        cuda = None
        with reporter.step("preflight"):
            if extension:
                cuda = toolchain.find_cuda()
                reporter.info(f"nvcc {cuda.version} at {cuda.nvcc} ({cuda.origin})")
                toolchain.check_archs(cuda, config.archs)
            key = build_key(recipe, config, toolchain_identity(recipe, config, cuda, inspect),
                            companion_keys)
            reporter.info(f"build key {key[:16]}")
            if on_key is not None:
                on_key(key)
            subset = recipe_subset(recipe, config)
            if subset:
                reporter.info("kernel subset " + " ".join(
                    f"{k}={','.join(v)}" for k, v in subset) + " (label "
                    f"{subset_label(recipe, subset)})")
            preflight.check_writable(config, recipe.name)
            index.repair(config.index_dir)  # a change a killed writer left: finished first
            env: BuildEnv | None = None
            if config.python is not None and recipe.build.requires:
                # your interpreter, as it is: what the recipe names is known before the
                # fetch (pyproject's build-system.requires only after it)
                env = _get_env(recipe, config, reporter, log, inspections)
                require(env, list(recipe.build.requires), recipe.name)

        def waiting(holder: str) -> None:
            reporter.info(f"waiting for build key {key[:16]}: another build holds it, "
                          f"{holder}")

        held.enter_context(owned_lock(key_lock_path(config.cache_dir, key), on_busy=waiting))
        if not config.force:
            done = published_with_key(config.index_dir, key)
            if done is not None:
                reporter.info(f"already published: {done.filename} (same build key)")
                return BuildResult(recipe, config.index_dir / "files" / done.filename,
                                   tuple(done.archs), done.channel, key, skipped=True)
        config.work_dir.mkdir(parents=True, exist_ok=True)
        # one directory per run: never shared with, nor removed by, another run
        work = Path(tempfile.mkdtemp(prefix=f"{recipe.name}-{recipe.version}-{key[:12]}-",
                                     dir=config.work_dir))
        held.enter_context(workdirs.claim(work))  # `wheelforge clean` leaves it alone
        with reporter.step("fetch source"):
            fetched = fetch(recipe, config.cache_dir, config.sources_dirs, reporter.info,
                            git_mirrors=dict(config.git_mirrors))
            reporter.info(f"{fetched.source.identity} ({fetched.origin})")
            # reproducible bytes (docs/reproducible.md): the source's date, a fixed path
            epoch = reproducible.source_date_epoch(fetched.archive)
            reporter.info(f"SOURCE_DATE_EPOCH={epoch} ({reproducible.describe_epoch(epoch)}, "
                          "the source's newest file)")

        def taking_turns(holder: str) -> None:
            reporter.info(f"waiting for the fixed build path of {recipe.name} "
                          f"{recipe.version}: another build holds it, {holder}")

        fixed = held.enter_context(reproducible.fixed_paths(
            f"{recipe.name}-{recipe.version}", on_busy=taking_turns))
        with reporter.step(f"extract and apply {len(recipe.patches)} patch(es)"):
            tree = extract(fetched.archive, fixed.src, recipe.extract)
            reporter.info(f"building at {tree} (a fixed path)")
            apply_series(tree, recipe.patches, project=f"{recipe.name} {recipe.version}")
            for p in recipe.patches:
                reporter.info(f"applied {p.name}")
        with reporter.step("build environment"):
            env = env or _get_env(recipe, config, reporter, log, inspections, env_hold)
            reporter.info(env.describe())
            if extension:
                assert cuda is not None
                toolchain.check_torch_cuda(cuda, env.torch_cuda, env.torch_version or "?")
                _doctor(config, env, reporter)
            check_build_requires(tree, env, recipe.build.requires, recipe.name, log)
            if on_version is not None:  # what a build that pins this one pins
                on_version(str(Version(labeled_version(Version(str(recipe.version)).public,
                                                       local_label(recipe, env, config)))))
        jobs, threads, why_jobs = jobs_for(config, recipe.name,
                                           compile_units(tree) if extension else None,
                                           recipe.build.job_memory_gib)
        if (jobs, threads) != (config.jobs, config.nvcc_threads):
            reporter.info(f"MAX_JOBS={jobs} NVCC_THREADS={threads} ({why_jobs})")
            config = dataclasses.replace(config, jobs=jobs, nvcc_threads=threads)
        what = f"compile ({'TORCH_CUDA_ARCH_LIST=' + config.arch_list + ', ' if extension else ''}"\
               f"MAX_JOBS={config.jobs})"
        # the import check's interpreters keep their bytecode as setup.py's does
        checks = bytecode.environ(os.environ, python=env.python, managed=env.managed,
                                  cache_dir=config.cache_dir)
        if warm is not None and extension and recipe.verify.imports:
            warm.start(env.python, checks)  # torch imported once, while the compile runs
        with reporter.step(what):
            def on_line(line: str) -> None:
                reporter.line(line)
                m = NINJA_PROGRESS.match(line)
                if m:
                    reporter.progress(int(m["done"]), int(m["total"]))

            # the environment through the fixed link: torch's include paths are fixed too
            fixed_env = dataclasses.replace(env, python=fixed.link_env(env.python))
            with contextlib.ExitStack() as stack:
                cache = _compile_cache(stack, extension, fixed_env, config, cuda, log,
                                       reporter)
                stack.enter_context(reproducible.umask())
                environ = _environment(recipe, config, fixed_env, cuda, cache, epoch,
                                       fixed.tmp)
                tree_key = tree_id(recipe)  # the record's: which source tree it measured
                costs = unitcosts.recorded(config.cache_dir, recipe.name, config.arch_list,
                                           tree_key) if extension else None
                if costs is not None:
                    environ[unitcosts.ENV] = str(costs)
                    reporter.info(f"unit costs recorded by an earlier build: {costs}")
                slots = contextlib.nullcontext() if not extension else \
                    _compile_slots(pool, config, fixed_env, environ, reporter, costs)
                with slots, reporter.heartbeat("building"):  # a pure build compiles nothing
                    try:
                        raw = build_wheel(tree=tree, env=fixed_env, environ=environ,
                                          out_dir=work / "dist", log=log, on_line=on_line,
                                          jobs=config.jobs, stored=extension)
                    except BuildError as exc:
                        if env.torch_version is not None:  # read, not imported: name a
                            try:                           # torch that cannot be imported
                                buildenv.check_torch_imports(env.python)
                            except ToolchainError as broken:
                                raise broken from exc
                        raise
                stats = _cache_stats(cache, reporter)
            reporter.info(f"built {raw.name}")
            if extension and (stats is None or stats.hits == 0):
                # a cold compile: what each unit took, for the packing of the next build
                units = unitcosts.read_ninja_costs(tree)
                if unitcosts.record(config.cache_dir, recipe.name, tree=tree_key,
                                    arch_list=config.arch_list, jobs=config.jobs,
                                    threads=config.nvcc_threads, costs=units):
                    reporter.info(f"unit costs recorded: {len(units)} units, longest "
                                  f"{units[0].seconds:.1f} s ({units[0].source}), sum "
                                  f"{sum(u.seconds for u in units):.0f} s")
            if extension and (stats is None or stats.misses > 0):
                # the largest child (a cicc or cc1plus) so far: the memory one job needs;
                # a build served from the compile cache compiled nothing and says nothing,
                # one served in part may not have run its heaviest unit: it only raises
                peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / (1024 * 1024)
                served = stats.hits if stats is not None else 0
                recorded = record_gib_per_job(config.cache_dir, recipe.name, peak,
                                              keep_higher=served > 0)
                reporter.info(f"peak memory of one compile job {peak:.1f} GiB " + (
                    "(recorded)" if recorded == peak else
                    f"({recorded:.1f} GiB kept: the compile cache served {served} unit(s), "
                    "which did not run)"))
        pins = {str(n): companion_version(str(n)) for n in recipe.companions}
        with reporter.step("post-process wheel"):
            pin = f"=={env.torch_major_minor}.*" if recipe.build.pin_torch and \
                env.torch_major_minor else None
            local = local_label(recipe, env, config)

            plat = platform.platform_tag(raw) if extension else None
            if plat is not None:
                reporter.info(f"platform tag {plat.tag}" + (
                    f" (highest symbol versions {', '.join(plat.symbols)})" if plat.symbols
                    else "") + (f": {plat.note}" if plat.note else ""))
            made_by = sbom.Toolchain(
                python=env.python_version, nvcc=str(cuda.version) if cuda else None,
                cxx=(toolchain.host_compiler() or None) if extension else None,
                torch=env.torch_version if extension else None,
                torch_cuda=env.torch_cuda if extension else None)
            manylinux = plat.tag if plat is not None and plat.manylinux else None

            def relabeled(tag: str | None) -> Path:
                """The raw wheel relabeled, with its SBOM, in one pass (one deflate)."""
                name, version, _build, _tags = parse_wheel_filename(
                    relabeled_name(raw.name, local, tag, manylinux))
                bom = sbom.make_sbom(name=str(name), version=str(version), recipe=recipe,
                                     archs=tuple(config.arch_list.split(";")) if extension
                                     else (), build_key=key, toolchain=made_by, epoch=epoch,
                                     platform=plat)
                return relabel(raw, work / f"final-{tag or 0}", local=local, torch_pin=pin,
                               drop_requires=recipe.build.drop_requires, build_tag=tag,
                               pins=pins, platform=manylinux, files={sbom.SBOM_PATH: bom},
                               epoch=epoch)

            # a name published with another build key gets the next build number; the
            # number is decided again under the index lock at the publish
            final = relabeled(next_build_tag(config.index_dir,
                                             relabeled_name(raw.name, local, None, manylinux)))
            reporter.info(final.name)
            for cname, cversion in pins.items():
                reporter.info(f"requires its companion {cname}=={cversion}")
        with reporter.step("verify"):
            verified = verify_wheel(final, recipe, archs=config.archs, env=env, log=log,
                                    warm=warm, environ=checks)
            for so, found in verified.archs:
                reporter.info(f"{so}: SASS {', '.join(sorted(found.sass)) or 'none'}; "
                              f"PTX {', '.join(sorted(found.ptx)) or 'none'}")
        channel = None
        if extension and env.torch_cuda and env.torch_version:
            channel = index.channel_name(env.torch_cuda, env.torch_version)
        for cname, cversion in pins.items():  # a wheel is published after what it pins
            companion_published(cname, cversion)
        with reporter.step(f"publish to {config.index_dir}"):
            published = index.publish_build(
                config.index_dir, final, relabel=relabeled, build_key=key, channel=channel,
                cuda=env.torch_cuda if extension else None,
                torch=env.torch_version if extension else None,
                archs=verified.sass + verified.ptx, force=config.force)
            if not published.published:
                reporter.info(
                    f"rebuilt byte for byte: {published.path.name} (same build key) is "
                    "this build's wheel; nothing written" if published.reproduced else
                    f"already published by another run: {published.path.name} "
                    "(same build key); nothing written")
                shutil.rmtree(work, ignore_errors=True)
                return BuildResult(recipe, published.path, tuple(published.record.archs),
                                   published.record.channel, key, skipped=True,
                                   reproduced=published.reproduced, log=log,
                                   cache=stats)
            if published.differs_from:
                reporter.info(f"this rebuild differs from {published.differs_from}, published "
                              "with the same build key: not reproduced byte for byte here "
                              "(docs/reproducible.md); published under the next build number")
            if published.noop:
                reporter.info("identical file already published")
            elif published.path.name != final.name:
                reporter.info(f"published as {published.path.name} (another build took "
                              f"{final.name} meanwhile)")
    except WheelforgeError as exc:
        if fixed is not None and work is not None:
            fixed.keep(work)
        if exc.log is None and log.exists():
            exc.log = str(log)
        if work is not None and work.exists():
            exc.fix = ((exc.fix + "; " if exc.fix else "") + f"work directory kept at {work} "
                       "(wheelforge clean removes it)")
        raise
    except OSError as exc:  # a full disk, a read-only or unwritable directory
        if fixed is not None and work is not None:
            fixed.keep(work)
        err = index.store.disk_error(exc, f"the build of {recipe.name} {recipe.version} "
                                          "could not write its files", work or config.work_dir)
        if work is not None and work.exists():
            err.fix += f"; work directory kept at {work} (wheelforge clean removes it)"
        err.log = str(log) if log.exists() else None
        raise err from None
    except KeyboardInterrupt as exc:
        if fixed is not None and work is not None:
            fixed.keep(work)
        kept = f"; work directory kept at {work}" if work is not None and work.exists() else ""
        logged = f"; log {log}" if log.exists() else ""
        if log.exists():  # the nightly report links an interrupted cell's log
            attach_log(exc, str(log))
        reporter.info(f"stopped; nothing was published{kept}{logged}")
        raise
    finally:
        held.close()
    shutil.rmtree(work, ignore_errors=True)
    return BuildResult(recipe, published.path, verified.sass, channel, key, log=log,
                       cache=stats, platform=plat)


def _gated(env: BuildEnv, environ: dict[str, str]) -> bool:
    """Whether this compile takes its slots unit by unit through the pool's gate (torch
    runs each nvcc of its ninja file as ``$PYTORCH_NVCC``) rather than all of them before
    it starts (no ninja: setuptools runs nvcc itself)."""
    return ((env.bin_dir / "ninja").exists()
            and ("PYTORCH_NVCC" in environ or "CUDA_HOME" in environ))


@contextlib.contextmanager
def _compile_slots(pool: jobserver.Pool | None, config: BuildConfig, env: BuildEnv,
                   environ: dict[str, str], reporter: Reporter,
                   costs: Path | None) -> Iterator[None]:
    """The compile's slots of the command's pool: each unit's, taken as it starts and
    given back as it ends (the gate), or all of its MAX_JOBS x NVCC_THREADS before it
    starts.  The units of the compile that took longest last time (``costs``, its
    recorded unit costs) go first.  ``environ`` is completed for the compile.

    Without a command's pool (one build), a gated compile gets a pool of its own: its
    jobserver serves the threads of its ptxas (see builder/compiling/jobserver.py)."""
    environ.pop("MAKEFLAGS", None)  # a make's jobserver of the caller: not ours to join
    gated = _gated(env, environ)
    if pool is None:
        if not gated:
            yield
            return
        with jobserver.Pool(config.jobs * config.nvcc_threads) as own, \
                _compile_slots(own, config, env, environ, reporter, costs):
            yield
        return
    priority = unitcosts.total_seconds(costs) if costs is not None else 0.0
    if gated:
        nvcc = environ.get("PYTORCH_NVCC") or shlex.quote(
            str(Path(environ["CUDA_HOME"]) / "bin" / "nvcc"))
        lends = any(jobserver.NVCC_JOBSERVER[-1] in word for word in shlex.split(nvcc))
        if lends:  # each unit's host compile beside its ptxas, on a lent slot
            nvcc = jobserver.steps_in_front(nvcc, environ, config.cache_dir / "nvcc-steps")
        environ["PYTORCH_NVCC"] = pool.gate(nvcc, config.nvcc_threads, priority)
        reporter.info(f"compile slots: {config.nvcc_threads} of the command's {pool.size} "
                      f"for each CUDA unit as it starts (at most {config.jobs} units of "
                      "this build at once)" + (
                          ", and the free ones to ptxas's parts (--split-compile "
                          f"{jobserver.SPLIT_COMPILE}) and each unit's host compile "
                          "through the pool's jobserver"
                          if lends else ""))
        yield
        return

    def waiting() -> None:
        reporter.info("waiting for compile slots (the command's other builds hold them)")

    with pool.slots(config.jobs * config.nvcc_threads, on_wait=waiting,
                    priority=priority) as held:
        reporter.info(f"compile slots: {held} of {pool.size}, held for the compile")
        yield


def _compile_cache(stack: contextlib.ExitStack, extension: bool, env: BuildEnv,
                   config: BuildConfig, cuda: toolchain.Cuda | None, log: Path,
                   reporter: Reporter) -> compilecache.CompileCache | None:
    """The compile cache of this build (see compilecache), or None: turned off, nothing
    to compile, or the tool missing from an as-is environment.

    No base directories: the tree and the environment are at fixed paths
    (builder/artifact/reproducible.py), so command lines are the same on every builder as they
    are, and a cached object is what the compiler writes for exactly that command line."""
    settings = config.compile_cache
    backend = settings.backend
    if not extension or backend is None:
        return None
    try:
        cache = stack.enter_context(compilecache.session(
            env.bin_dir, config.cache_dir, backend=backend,
            nvcc=cuda.nvcc if cuda else None, base_dir=None, log=log,
            env_root=None, remote=settings.remote,
            read_only=settings.read_only))
    except WheelforgeError as exc:
        reporter.info(f"WARN compile cache off: {exc.what}" + (f" ({exc.fix})" if exc.fix else ""))
        return None
    reporter.info(f"compile cache: {settings.describe()} ({cache.tool})")
    return cache


def _cache_stats(cache: compilecache.CompileCache | None,
                 reporter: Reporter) -> CacheStats | None:
    if cache is None:
        return None
    try:
        stats = cache.stats()
    except WheelforgeError as exc:
        reporter.info(f"WARN {exc.what}: {exc.why}")
        return None
    reporter.info(str(stats))
    return stats
