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
from .._fs import date_tree, owned_lock
from .._log import Reporter
from ..errors import BuildError, RecipeError, ToolchainError, WheelforgeError, attach_log
from ..recipe.model import Recipe
from ..recipe.subsets import subset_environment, subset_label
from ..wheel import labeled_version, relabel, relabeled_name, wheel_version
from .artifact import importcheck, platform, reproducible, sbom
from .artifact.identity import (
    Identity,
    identify,
    local_label,
    next_build_tag,
    recipe_subset,
    tree_id,
)
from .artifact.platform import PlatformTag
from .artifact.verify import Verified, verify_wheel
from .checks import doctor, preflight
from .compiling import compilecache, jobserver, toolchain, torchtoolkit, unitcosts
from .compiling.backend import NINJA_PROGRESS, build_wheel, check_build_requires, require
from .compiling.compilecache import CacheStats
from .config import UNIT_JOBS, BuildConfig, compile_units, jobs_for, record_gib_per_job, unit_jobs
from .env import buildenv, bytecode, envlock
from .env.buildenv import BuildEnv
from .source.fetch import FetchedSource, extract, fetch
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
    environ[UNIT_JOBS] = str(unit_jobs(config))  # the units' grouping: no history in it
    environ["NVCC_THREADS"] = str(config.nvcc_threads)
    environ.pop("PYTHONPATH", None)
    environ.update(cache.environ if cache else compilecache.OFF_ENVIRONMENT)
    if cuda is not None:  # torch's nvcc command: the cache's (or the toolkit's) + options
        flags = reproducible.nvcc_flags(cuda.nvcc) + jobserver.lent_flags(
            cuda.nvcc, config.compile_cache.backend)  # (builder/compiling/jobserver.py: why)
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
                                 gib_per_job=config.gib_per_job, toolkit=config.toolkit,
                                 cuda_toolkit=config.cuda_toolkit,
                                 environ=torchtoolkit.toolkit_environ(os.environ,
                                                                      config.cuda_home))
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
    its published wheel; each raises what stopped it.  ``project``: the project name its
    wheel carries, which the pin names (None: the recipe's name; a variant such as
    causal-conv1d-stable carries causal-conv1d)."""
    key: Callable[[], str]
    version: Callable[[], str]
    result: Callable[[], BuildResult]
    project: str | None = None


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
    build = _Build(recipe, config, reporter, companions or {},
                   inspections or buildenv.Inspections(), pool, warm)
    try:
        with build.kept_on_failure():
            result = _steps(build, on_key, on_version)
    finally:
        build.held.close()  # the build key's lock, the fixed path, the environment's hold
    if not result.skipped:  # published: the work directory has served
        assert build.work is not None
        shutil.rmtree(build.work, ignore_errors=True)
    return result


def _steps(b: _Build, on_key: Callable[[str], None] | None,
           on_version: Callable[[str], None] | None) -> BuildResult:
    """The steps of one build, in order; each hands the next what it found."""
    b.log.parent.mkdir(parents=True, exist_ok=True)
    cuda, ident, env = b.preflight(on_key)
    b.hold_key(ident)
    done = b.already_published(ident)
    if done is not None:
        return done
    b.make_work_dir(ident)
    fetched, epoch = b.fetch_source()
    tree = b.extract_and_patch(fetched, epoch)
    env = b.build_environment(tree, env, cuda, on_version)
    b.fit_jobs(tree)
    raw, stats = b.compile(tree, env, cuda, epoch)
    pins = {str(n): b.companion_version(str(n)) for n in b.recipe.companions}
    final, relabeling = b.post_process(raw, env, cuda, epoch, ident, pins)
    verified = b.verify(final, env)
    return b.publish(final, relabeling, verified, env, ident, stats)


@dataclass(frozen=True)
class _Relabeling:
    """The raw wheel relabeled, with its SBOM, in one pass (one deflate), for a build tag:
    called once before the verify and again by the publish if the number was taken."""
    raw: Path
    work: Path
    recipe: Recipe
    local: str
    torch_pin: str | None
    pins: dict[str, str]  # companion recipe -> exact version
    requires: dict[str, str]  # the same pins by the project names the wheels carry
    manylinux: str | None
    archs: tuple[str, ...]
    key: str
    made_by: sbom.Toolchain
    epoch: int
    plat: PlatformTag | None

    def __call__(self, tag: str | None) -> Path:
        name, version, _build, _tags = parse_wheel_filename(self.filename(tag))
        bom = sbom.make_sbom(name=str(name), version=str(version), recipe=self.recipe,
                             archs=self.archs, build_key=self.key, toolchain=self.made_by,
                             epoch=self.epoch, platform=self.plat)
        return relabel(self.raw, self.work / f"final-{tag or 0}", local=self.local,
                       torch_pin=self.torch_pin, drop_requires=self.recipe.build.drop_requires,
                       build_tag=tag, pins=self.requires, platform=self.manylinux,
                       files={sbom.SBOM_PATH: bom}, epoch=self.epoch)

    def filename(self, tag: str | None = None) -> str:
        """The relabeled wheel's file name with build tag ``tag`` (None: none)."""
        return relabeled_name(self.raw.name, self.local, tag, self.manylinux)


class _Build:
    """One build's state: what it was given, the resources it holds (``held``: the
    environment's hold, the build key's lock, the work directory's claim, the fixed path;
    released when the build ends) and its work directory and log.  Its methods are the
    build's steps; what a step finds it returns to the next."""

    def __init__(self, recipe: Recipe, config: BuildConfig, reporter: Reporter,
                 companions: Mapping[str, BuildResult | Pending],
                 inspections: buildenv.Inspections, pool: jobserver.Pool | None,
                 warm: importcheck.WarmImports | None) -> None:
        missing = sorted(set(recipe.companions) - set(companions))
        if missing:
            raise RecipeError(f"{recipe.name} needs its companion(s) {', '.join(missing)} "
                              "built first",
                              fix=f"run 'wheelforge build {recipe.name}' (it builds them too)")
        self.recipe, self.config, self.reporter = recipe, config, reporter
        self.companions, self.inspections = companions, inspections
        self.pool, self.warm = pool, warm
        self.extension = recipe.build.kind == "extension"
        # this build's hold on its managed environment (builder/env/envlock.py), let go while
        # it waits for a companion's build, which might wait for another process's install
        self.env_hold = envlock.Hold()
        self.companion_keys = {str(n): (c.build_key if isinstance(c, BuildResult) else c.key())
                               for n, c in ((n, companions[n]) for n in recipe.companions)}
        reporter.header(f"{recipe.name} {recipe.version}")
        stamp = time.strftime("%Y%m%dT%H%M%S")
        self.log = (config.cache_dir / "logs" /
                    f"{recipe.name}-{recipe.version}-{stamp}-{os.getpid()}.log")
        self.work: Path | None = None
        self.fixed: reproducible.FixedPaths | None = None
        self.checks: dict[str, str] = {}  # the import check's environment
        self.held = contextlib.ExitStack()  # from before the fetch to the end of the publish
        self.held.enter_context(self.env_hold)

    @contextlib.contextmanager
    def kept_on_failure(self) -> Iterator[None]:
        """The one place a failed or stopped build keeps its work directory (the source
        tree moved into it) and names it, with its log."""
        try:
            yield
        except WheelforgeError as exc:
            kept = self._keep_work()
            if exc.log is None and self.log.exists():
                exc.log = str(self.log)
            if kept:
                exc.fix = (exc.fix + "; " if exc.fix else "") + kept
            raise
        except OSError as exc:  # a full disk, a read-only or unwritable directory
            kept = self._keep_work()
            err = index.store.disk_error(exc, f"the build of {self.recipe.name} "
                                              f"{self.recipe.version} could not write its files",
                                         self.work or self.config.work_dir)
            if kept:
                err.fix += f"; {kept}"
            err.log = str(self.log) if self.log.exists() else None
            raise err from None
        except KeyboardInterrupt as exc:
            kept = self._keep_work().removesuffix(" (wheelforge clean removes it)")
            logged = f"; log {self.log}" if self.log.exists() else ""
            if self.log.exists():  # the nightly report links an interrupted cell's log
                attach_log(exc, str(self.log))
            self.reporter.info(f"stopped; nothing was published{'; ' + kept if kept else ''}"
                               f"{logged}")
            raise

    def _keep_work(self) -> str:
        """The failed build's source tree moved into its work directory; what to tell of
        the directory ("" when there is none)."""
        if self.fixed is not None and self.work is not None:
            self.fixed.keep(self.work)
        if self.work is not None and self.work.exists():
            return f"work directory kept at {self.work} (wheelforge clean removes it)"
        return ""

    def preflight(self, on_key: Callable[[str], None] | None
                  ) -> tuple[toolchain.Cuda | None, Identity, BuildEnv | None]:
        """The toolchain, the build's identity, the places it writes; your interpreter as
        it is (``--python``), with what the recipe names installed in it."""
        recipe, config, reporter = self.recipe, self.config, self.reporter
        with reporter.step("preflight"):
            cuda = None
            if self.extension:
                cuda = self.find_toolkit()
                config = self.config
                reporter.info(f"nvcc {cuda.version} at {cuda.nvcc} ({cuda.origin})")
                reporter.info(f"CUDA toolkit {cuda.describe_toolkit()} ({cuda.choice})")
                toolchain.check_archs(cuda, config.archs)
            ident = identify(recipe, config, cuda, self.companion_keys,
                             self.inspections.inspect)
            reporter.info(f"build key {ident.label}")
            if on_key is not None:
                on_key(ident.key)
            subset = recipe_subset(recipe, config)
            if subset:
                reporter.info("kernel subset " + " ".join(
                    f"{k}={','.join(v)}" for k, v in subset) + " (label "
                    f"{subset_label(recipe, subset)})")
            preflight.check_writable(config, recipe.name)
            index.repair(config.index_dir)  # a change a killed writer left: finished first
            env = None
            if config.python is not None and recipe.build.requires:
                # your interpreter, as it is: what the recipe names is known before the
                # fetch (pyproject's build-system.requires only after it)
                env = _get_env(recipe, config, reporter, self.log, self.inspections)
                require(env, list(recipe.build.requires), recipe.name)
        return cuda, ident, env

    def find_toolkit(self) -> toolchain.Cuda:
        """The toolkit for the torch the build uses: with ``--python``, its torch's CUDA
        (read from torch/version.py, not imported) picks the managed toolkit's version,
        and the build's settings say which toolkit it took (the preflight's doctor too)."""
        config = self.config
        torch_cuda, torch = None, ""
        if config.python is not None:
            found = self.inspections.inspect(config.python)
            torch_cuda, torch = found.torch_cuda, f"torch {found.torch_version} in {found.python}"
        choice = torchtoolkit.for_torch(config.toolkit, config.cuda_toolkit, torch_cuda,
                                        torch, config.cuda_home)
        self.config = dataclasses.replace(config, toolkit=choice.mode,
                                          cuda_toolkit=choice.requirement)
        return torchtoolkit.find(choice, cache_dir=config.cache_dir,
                                 cuda_home=config.cuda_home, torch_cuda=torch_cuda,
                                 torch=torch, environ=os.environ,
                                 say=self.reporter.info, log=self.log)

    def hold_key(self, ident: Identity) -> None:
        """The build key's lock, held until the build ends: one build of a key at a time."""
        def waiting(holder: str) -> None:
            self.reporter.info(f"waiting for build key {ident.label}: another build holds "
                               f"it, {holder}")

        self.held.enter_context(owned_lock(ident.lock, on_busy=waiting))

    def already_published(self, ident: Identity) -> BuildResult | None:
        """The published wheel of this build key (asked under its lock), unless --force."""
        if self.config.force:
            return None
        done = ident.published()
        if done is None:
            return None
        self.reporter.info(f"already published: {done.filename} (same build key)")
        return BuildResult(self.recipe, self.config.index_dir / "files" / done.filename,
                           tuple(done.archs), done.channel, ident.key, skipped=True)

    def make_work_dir(self, ident: Identity) -> None:
        """One directory per run: never shared with, nor removed by, another run."""
        recipe, config = self.recipe, self.config
        config.work_dir.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(
            prefix=f"{recipe.name}-{recipe.version}-{ident.key[:12]}-", dir=config.work_dir))
        self.held.enter_context(workdirs.claim(self.work))  # `wheelforge clean` leaves it alone

    def fetch_source(self) -> tuple[FetchedSource, int]:
        """The pinned source, and its date (reproducible bytes, docs/reproducible.md)."""
        with self.reporter.step("fetch source"):
            fetched = fetch(self.recipe, self.config.cache_dir, self.config.sources_dirs,
                            self.reporter.info, git_mirrors=dict(self.config.git_mirrors))
            self.reporter.info(f"{fetched.source.identity} ({fetched.origin})")
            epoch = reproducible.source_date_epoch(fetched.archive)
            self.reporter.info(f"SOURCE_DATE_EPOCH={epoch} "
                               f"({reproducible.describe_epoch(epoch)}, the source's newest file)")
        return fetched, epoch

    def extract_and_patch(self, fetched: FetchedSource, epoch: int) -> Path:
        """The source tree at its fixed path (held until the build ends), patched, its
        files dated no later than the source (nvcc's line tables hold their dates)."""
        recipe, reporter = self.recipe, self.reporter

        def taking_turns(holder: str) -> None:
            reporter.info(f"waiting for the fixed build path of {recipe.name} "
                          f"{recipe.version}: another build holds it, {holder}")

        self.fixed = self.held.enter_context(reproducible.fixed_paths(
            f"{recipe.name}-{recipe.version}", on_busy=taking_turns))
        with reporter.step(f"extract and apply {len(recipe.patches)} patch(es)"):
            tree = extract(fetched.archive, self.fixed.src, recipe.extract)
            reporter.info(f"building at {tree} (a fixed path)")
            apply_series(tree, recipe.patches, project=f"{recipe.name} {recipe.version}")
            for p in recipe.patches:
                reporter.info(f"applied {p.name}")
            if dated := date_tree(tree, epoch):
                reporter.info(f"{dated} file(s) newer than the source dated at "
                              f"SOURCE_DATE_EPOCH")
        return tree

    def build_environment(self, tree: Path, env: BuildEnv | None, cuda: toolchain.Cuda | None,
                          on_version: Callable[[str], None] | None) -> BuildEnv:
        """The build environment (the one preflight found, or the managed one), checked
        against the toolchain and the tree's build requirements."""
        recipe, config, reporter = self.recipe, self.config, self.reporter
        with reporter.step("build environment"):
            env = env or _get_env(recipe, config, reporter, self.log, self.inspections,
                                  self.env_hold)
            reporter.info(env.describe())
            if self.extension:
                assert cuda is not None
                toolchain.check_torch_cuda(cuda, env.torch_cuda, env.torch_version or "?")
                _doctor(config, env, reporter)
            check_build_requires(tree, env, recipe.build.requires, recipe.name, self.log)
            if on_version is not None:  # what a build that pins this one pins
                on_version(str(Version(labeled_version(Version(str(recipe.version)).public,
                                                       local_label(recipe, env, config)))))
        return env

    def fit_jobs(self, tree: Path) -> None:
        """MAX_JOBS and NVCC_THREADS for the tree's units and the memory one job needs."""
        config = self.config
        jobs, threads, why_jobs = jobs_for(config, self.recipe.name,
                                           compile_units(tree) if self.extension else None,
                                           self.recipe.build.job_memory_gib)
        if (jobs, threads) != (config.jobs, config.nvcc_threads):
            self.reporter.info(f"MAX_JOBS={jobs} NVCC_THREADS={threads} ({why_jobs})")
            self.config = dataclasses.replace(config, jobs=jobs, nvcc_threads=threads)

    def compile(self, tree: Path, env: BuildEnv, cuda: toolchain.Cuda | None,
                epoch: int) -> tuple[Path, CacheStats | None]:
        """The raw wheel, compiled at the fixed path; what it cost, recorded."""
        config, extension = self.config, self.extension
        what = f"compile ({'TORCH_CUDA_ARCH_LIST=' + config.arch_list + ', ' if extension else ''}"\
               f"MAX_JOBS={config.jobs})"
        # the import check's interpreters keep their bytecode as setup.py's does
        self.checks = bytecode.environ(os.environ, python=env.python, managed=env.managed,
                                       cache_dir=config.cache_dir)
        if self.warm is not None and extension and self.recipe.verify.imports:
            self.warm.start(env.python, self.checks)  # torch imported once, while it compiles
        with self.reporter.step(what):
            raw, stats, tree_key = self._compile_wheel(tree, env, cuda, epoch)
            self.reporter.info(f"built {raw.name}")
            if extension and (stats is None or stats.hits == 0):
                self._record_unit_costs(tree, tree_key)
            if extension and (stats is None or stats.misses > 0):
                self._record_peak_memory(stats)
        return raw, stats

    def _compile_wheel(self, tree: Path, env: BuildEnv, cuda: toolchain.Cuda | None,
                       epoch: int) -> tuple[Path, CacheStats | None, str]:
        """The backend's build of the raw wheel, in its compile slots and compile cache;
        the cache's figures and the tree's identity (for the unit-cost record)."""
        config, reporter, extension = self.config, self.reporter, self.extension
        assert self.fixed is not None and self.work is not None

        def on_line(line: str) -> None:
            reporter.line(line)
            m = NINJA_PROGRESS.match(line)
            if m:
                reporter.progress(int(m["done"]), int(m["total"]))

        # the environment through the fixed link: torch's include paths are fixed too
        fixed_env = dataclasses.replace(env, python=self.fixed.link_env(env.python))
        with contextlib.ExitStack() as stack:
            cache = _compile_cache(stack, extension, fixed_env, config, cuda, self.log,
                                   reporter)
            stack.enter_context(reproducible.umask())
            environ = _environment(self.recipe, config, fixed_env, cuda, cache, epoch,
                                   self.fixed.tmp)
            tree_key = tree_id(self.recipe)  # the record's: which source tree it measured
            costs = unitcosts.recorded(config.cache_dir, self.recipe.name, config.arch_list,
                                       tree_key) if extension else None
            # an earlier build's record orders the command's compiles (the pool's
            # priority), never what is compiled: the setup.py never sees it (issue 53)
            if costs is not None:
                reporter.info(f"unit costs recorded by an earlier build (the compile "
                              f"slots' order only): {costs}")
            slots = contextlib.nullcontext() if not extension else \
                _compile_slots(self.pool, config, fixed_env, environ, reporter, costs)
            with slots, reporter.heartbeat("building"):  # a pure build compiles nothing
                raw = _build_raw(tree, fixed_env, environ, self.work / "dist", self.log,
                                 on_line, config.jobs, extension, named=env)
            stats = _cache_stats(cache, reporter)
        return raw, stats, tree_key

    def _record_unit_costs(self, tree: Path, tree_key: str) -> None:
        """A cold compile: what each unit took, for the order of the next command's compiles."""
        config = self.config
        units = unitcosts.read_ninja_costs(tree)
        if unitcosts.record(config.cache_dir, self.recipe.name, tree=tree_key,
                            arch_list=config.arch_list, jobs=config.jobs,
                            threads=config.nvcc_threads, costs=units):
            self.reporter.info(f"unit costs recorded: {len(units)} units, longest "
                               f"{units[0].seconds:.1f} s ({units[0].source}), sum "
                               f"{sum(u.seconds for u in units):.0f} s")

    def _record_peak_memory(self, stats: CacheStats | None) -> None:
        """The largest child (a cicc or cc1plus) so far: the memory one job needs.  A build
        served from the compile cache compiled nothing and says nothing; one served in
        part may not have run its heaviest unit: it only raises."""
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / (1024 * 1024)
        served = stats.hits if stats is not None else 0
        recorded = record_gib_per_job(self.config.cache_dir, self.recipe.name, peak,
                                      keep_higher=served > 0)
        self.reporter.info(f"peak memory of one compile job {peak:.1f} GiB " + (
            "(recorded)" if recorded == peak else
            f"({recorded:.1f} GiB kept: the compile cache served {served} unit(s), "
            "which did not run)"))

    def companion_version(self, name: str) -> str:
        """The exact version of the companion ``name``'s wheel (waiting for it to be known)."""
        found = self.companions[name]
        if isinstance(found, BuildResult):
            return wheel_version(found.wheel)
        with self.env_hold.paused():
            return found.version()

    def companion_project(self, name: str) -> str:
        """The project name the companion ``name``'s wheel carries (a variant recipe's
        project, causal-conv1d for causal-conv1d-stable): what this wheel's pin names."""
        found = self.companions[name]
        if isinstance(found, BuildResult):
            return str(found.recipe.project_name)
        return found.project or name

    def post_process(self, raw: Path, env: BuildEnv, cuda: toolchain.Cuda | None, epoch: int,
                     ident: Identity, pins: dict[str, str]) -> tuple[Path, _Relabeling]:
        """The raw wheel relabeled (its local label, its pins, its platform tag, its SBOM)
        under the build number its name takes now, and how to relabel it again."""
        with self.reporter.step("post-process wheel"):
            relabeling = self._relabeling(raw, env, cuda, epoch, ident, pins)
            # a name published with another build key gets the next build number; the
            # number is decided again under the index lock at the publish
            final = relabeling(next_build_tag(self.config.index_dir, relabeling.filename()))
            self.reporter.info(final.name)
            for cname, cversion in relabeling.requires.items():
                self.reporter.info(f"requires its companion {cname}=={cversion}")
        return final, relabeling

    def _relabeling(self, raw: Path, env: BuildEnv, cuda: toolchain.Cuda | None, epoch: int,
                    ident: Identity, pins: dict[str, str]) -> _Relabeling:
        """What the relabel writes: the local label, the torch pin, the platform tag (the
        manylinux analysis, reported) and the SBOM's toolchain."""
        recipe, config, extension = self.recipe, self.config, self.extension
        assert self.work is not None
        pin = f"=={env.torch_major_minor}.*" if recipe.build.pin_torch and \
            env.torch_major_minor else None
        local = local_label(recipe, env, config)
        plat = platform.platform_tag(raw) if extension else None
        if plat is not None:
            self.reporter.info(f"platform tag {plat.tag}" + (
                f" (highest symbol versions {', '.join(plat.symbols)})" if plat.symbols
                else "") + (f": {plat.note}" if plat.note else ""))
        made_by = sbom.Toolchain(
            python=env.python_version, nvcc=str(cuda.version) if cuda else None,
            cuda_toolkit=cuda.toolkit if cuda else (),
            cxx=(toolchain.host_compiler() or None) if extension else None,
            torch=env.torch_version if extension else None,
            torch_cuda=env.torch_cuda if extension else None)
        return _Relabeling(
            raw=raw, work=self.work, recipe=recipe, local=local, torch_pin=pin, pins=pins,
            requires={self.companion_project(n): v for n, v in pins.items()},
            manylinux=plat.tag if plat is not None and plat.manylinux else None,
            archs=tuple(config.arch_list.split(";")) if extension else (), key=ident.key,
            made_by=made_by, epoch=epoch, plat=plat)

    def verify(self, final: Path, env: BuildEnv) -> Verified:
        """The wheel checked as a user would get it: its architectures, its imports."""
        with self.reporter.step("verify"):
            verified = verify_wheel(final, self.recipe, archs=self.config.archs, env=env,
                                    log=self.log, warm=self.warm, environ=self.checks)
            for so, found in verified.archs:
                self.reporter.info(f"{so}: SASS {', '.join(sorted(found.sass)) or 'none'}; "
                                   f"PTX {', '.join(sorted(found.ptx)) or 'none'}")
        return verified

    def companion_published(self, name: str, pinned: str) -> None:
        """The companion ``name`` published (waiting for it) with the version pinned."""
        found = self.companions[name]
        if isinstance(found, Pending):
            self.reporter.info(f"waiting for its companion {name}")
            with self.env_hold.paused():
                found = found.result()
        if wheel_version(found.wheel) != pinned:
            raise BuildError(f"{self.recipe.name}'s wheel pins {name}=={pinned}, but {name} "
                             f"was published as {found.wheel.name}",
                             why="the companion's version changed during its build",
                             fix="run the command again; if it recurs, report it with "
                                 "both recipes")

    def publish(self, final: Path, relabeling: _Relabeling, verified: Verified, env: BuildEnv,
                ident: Identity, stats: CacheStats | None) -> BuildResult:
        """The wheel into the index, after what it pins; a wheel of the same build key
        published meanwhile (or the same bytes, rebuilt with --force) is the result."""
        config, extension, reporter = self.config, self.extension, self.reporter
        channel = None
        if extension and env.torch_cuda and env.torch_version:
            channel = index.stable_channel_name(env.torch_cuda) if \
                self.recipe.build.stable_abi else \
                index.channel_name(env.torch_cuda, env.torch_version)
        for cname, cversion in relabeling.pins.items():  # published after what it pins
            self.companion_published(cname, cversion)
        with reporter.step(f"publish to {config.index_dir}"):
            published = index.publish_build(
                config.index_dir, final, relabel=relabeling, build_key=ident.key,
                channel=channel, cuda=env.torch_cuda if extension else None,
                torch=env.torch_version if extension else None,
                archs=verified.sass + verified.ptx, force=config.force)
            if not published.published:
                reporter.info(
                    f"rebuilt byte for byte: {published.path.name} (same build key) is "
                    "this build's wheel; nothing written" if published.reproduced else
                    f"already published by another run: {published.path.name} "
                    "(same build key); nothing written")
                assert self.work is not None
                shutil.rmtree(self.work, ignore_errors=True)
                return BuildResult(self.recipe, published.path, tuple(published.record.archs),
                                   published.record.channel, ident.key, skipped=True,
                                   reproduced=published.reproduced, log=self.log,
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
        return BuildResult(self.recipe, published.path, verified.sass, channel, ident.key,
                           log=self.log, cache=stats, platform=relabeling.plat)


def _build_raw(tree: Path, env: BuildEnv, environ: dict[str, str], out_dir: Path, log: Path,
               on_line: Callable[[str], None], jobs: int, extension: bool, *,
               named: BuildEnv) -> Path:
    """The backend's build of the raw wheel in ``env`` (through the fixed link); a failed
    build whose torch cannot be imported names that instead (its version was read, not
    imported), in ``named``, the environment as the user knows it."""
    try:
        return build_wheel(tree=tree, env=env, environ=environ, out_dir=out_dir, log=log,
                           on_line=on_line, jobs=jobs, stored=extension)
    except BuildError as exc:
        if named.torch_version is not None:
            try:
                buildenv.check_torch_imports(named.python)
            except ToolchainError as broken:
                raise broken from exc
        raise


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
        with jobserver.Pool(config.jobs * config.nvcc_threads,
                            lend=jobserver.lends()) as own, \
                _compile_slots(own, config, env, environ, reporter, costs):
            yield
        return
    priority = unitcosts.total_seconds(costs) if costs is not None else 0.0
    if gated:
        nvcc = environ.get("PYTORCH_NVCC") or shlex.quote(
            str(Path(environ["CUDA_HOME"]) / "bin" / "nvcc"))
        lends = any(jobserver.NVCC_JOBSERVER[-1] in word for word in shlex.split(nvcc))
        steps = lends and jobserver.runs_steps()  # WHEELFORGE_NVCC_STEPS=1
        if steps:  # each unit's host compile beside its ptxas, on a lent slot
            nvcc = jobserver.steps_in_front(nvcc, environ, config.cache_dir / "nvcc-steps")
        environ["PYTORCH_NVCC"] = pool.gate(nvcc, config.nvcc_threads, priority)
        reporter.info(f"compile slots: {config.nvcc_threads} of the command's {pool.size} "
                      f"for each CUDA unit as it starts (at most {config.jobs} units of "
                      "this build at once)" + (
                          ", and the free ones to ptxas's parts (--split-compile "
                          f"{jobserver.SPLIT_COMPILE})" + (
                              " and each unit's host compile" if steps else "")
                          + " through the pool's jobserver"
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
