"""The command line: thin click commands over the pipeline.

This is the only module that prints results or turns a WheelforgeError into a
message and an exit status.  Results go to stdout, progress to stderr.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import click

from .. import __version__
from .._log import Reporter, clear_live
from ..builder.config import resolve
from ..errors import (
    INTERNAL_ERROR_EXIT_CODE,
    INTERRUPT_EXIT_CODES,
    ConfigError,
    Interrupted,
    WheelforgeError,
)
from ..recipe.model import SdistSource
from ..recipe.subsets import describe_subsets, parse_subset_entries, select_subset
from ._options import (
    EPILOG,
    EPILOG_SHORT,
    git_mirror_option,
    recipes_option,
)
from ._options import (
    book as _book,
)
from ._options import (
    existing_index as _existing_index,
)
from ._options import install_lines as _install_lines
from ._options import repair_or_warn as _repair_or_warn
from .index import INDEX_COMMANDS
from .install import install
from .maintain import clean, outdated, patch_group
from .nightly import nightly
from .stack import (
    deps_dir_option,
    early_venv_pays,
    gate_disabled,
    gate_forced,
    raise_if_broken,
    run_gate,
    stack_group,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog=EPILOG)
@click.version_option(__version__, prog_name="wheelforge")
def cli() -> None:
    """Build CUDA PyTorch extensions from pinned, patched sources into verified wheels,
    published to a local package index that pip and uv install from.

    \b
    Typical use:
      wheelforge build causal-conv1d              # sm_120 wheel into ./index
      wheelforge build causal-conv1d --arch '10.0;12.0'
      wheelforge build causal-conv1d --python ~/venvs/train/bin/python
      wheelforge install --python ~/venvs/stack   # the wheels and their dependencies
      wheelforge serve                            # the index over HTTP
    """


@cli.command(epilog=EPILOG_SHORT)
@click.argument("names", nargs=-1, required=True)
@click.option("--arch", help="CUDA architectures, as TORCH_CUDA_ARCH_LIST spells them: '12.0', "
              "'10.0;12.0' (or spaces between), '9.0a', '12.0+PTX', torch's names "
              "('Hopper'). Default: $TORCH_CUDA_ARCH_LIST, else wheelforge.yaml, else 12.0.")
@click.option("--python", "python", type=click.Path(dir_okay=True),
              help="Build against this interpreter and its installed torch, as-is (your "
                   "training venv): a path, a venv directory, or a name looked up on PATH "
                   "(python3); the managed toolkit is that torch's CUDA (torch.version.cuda: "
                   "cuda-toolkit[...]==13.0.* for a CUDA 13.0 torch; a CUDA 12 torch needs "
                   "--cuda-home). Default: a managed, cached venv with the configured torch.")
@click.option("--torch", help="torch requirement for the managed venv (default from "
                              "wheelforge.yaml, else torch==2.14.1).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Parallel compile jobs "
              "(MAX_JOBS). Default: $MAX_JOBS, else from cores and available memory, shared "
              "with nvcc --threads (NVCC_THREADS) when the source has fewer units than cores.")
@click.option("--index", "index_dir", type=click.Path(path_type=Path, file_okay=False),
              help="Index directory to publish into (default ./index).")
@click.option("--sources", "sources_dirs", multiple=True,
              type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="Directory holding source archives (matched by file name, verified by "
                   "sha256) for air-gapped builds. Repeatable.")
@click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Cache for sources, build environments and logs (default "
                   "~/.cache/wheelforge or $WHEELFORGE_CACHE).")
@click.option("--work-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Where sources are unpacked and built (default: CACHE/work).")
@click.option("--force", is_flag=True, help="Build even if a wheel with the same build key is "
                                            "already published; the same bytes publish "
                                            "nothing new (reproduced), other bytes go "
                                            "under the next build number.")
@click.option("--config", "project_file", type=click.Path(path_type=Path, dir_okay=False,
                                                          exists=True),
              help="Project file with defaults (default ./wheelforge.yaml if present).")
@click.option("--timeout", type=click.IntRange(min=1), metavar="SECONDS",
              help="Stop the whole build (every compiler process) after SECONDS; exit 124.")
@click.option("-v", "--verbose", is_flag=True, help="Stream the compiler output.")
@click.option("--subset", "subset", multiple=True, metavar="KEY=VALUE[,VALUE]",
              help="Build a kernel subset of the recipes named that declare one (wheelforge "
                   "show NAME lists the keys), e.g. --subset hdim=128 --subset dtype=bf16 "
                   "--subset bwd=no. Part of the build key and of the version label "
                   "(+cu130torch2.14sm120hd128bf16fwd). Repeatable. Default: the full build.")
@click.option("--stack-check/--no-stack-check", default=True, show_default=True,
              help="After publishing, install the channel's wheels together with their "
                   "dependencies into a fresh venv and import them (wheelforge stack check); "
                   "also off with WHEELFORGE_STACK_CHECK=off.")
@click.option("--toolkit", type=click.Choice(["auto", "managed", "system"]),
              help="CUDA toolkit to compile with: managed (PyPI's cuda-toolkit wheels, "
                   "installed once into uv's cache), system ($CUDA_HOME, nvcc on PATH, "
                   "/usr/local/cuda) or auto (system where found, else managed). Default: "
                   "$WHEELFORGE_TOOLKIT, else toolkit: in wheelforge.yaml, else auto.")
@click.option("--cuda-home", "cuda_home", type=click.Path(file_okay=False), metavar="PATH",
              help="Compile with the system CUDA toolkit at PATH (its CUDA_HOME, e.g. "
                   "/usr/local/cuda-12.8): what a CUDA 12 torch needs, since PyPI has no "
                   "CUDA 12 nvcc. Same as toolkit: {cuda-home: PATH} in wheelforge.yaml.")
@deps_dir_option
@git_mirror_option
@recipes_option
def build(names: tuple[str, ...], arch: str | None, python: str | None, torch: str | None,
          jobs: int | None, index_dir: Path | None, sources_dirs: tuple[Path, ...],
          cache_dir: Path | None, work_dir: Path | None, force: bool,
          project_file: Path | None, timeout: int | None, verbose: bool,
          subset: tuple[str, ...], stack_check: bool,
          deps_dir: Path | None, git_mirrors: tuple[str, ...], recipes: Path | None,
          toolkit: str | None = None, cuda_home: str | None = None) -> None:
    """Build, verify and publish the wheels of recipe NAMES.

    A recipe's companions (mamba-ssm: causal-conv1d) are built first for the same target,
    or reused when published. Prints the resolved inputs first; at the end, each wheel, its
    CUDA architectures and the pip command that installs it. A build of a build key that
    another build (or the nightly) is building waits for it, then finds the wheel published
    and skips.

    Then the stack check (wheelforge stack check) of the channel built for: every wheel of
    the channel installed together, with its dependencies, and imported together. A broken
    stack leaves the wheels published, marks the channel broken on the landing page and
    exits 13. A channel whose last check passed with exactly what it would install and
    import now (nothing published there) is not checked again: the build says so
    (WHEELFORGE_STACK_CHECK=always checks anyway).
    """
    from ..builder.scheduler import build_with_companions

    book = _book(recipes)
    loaded = [book.load(n) for n in names]
    chosen = parse_subset_entries(subset)
    if chosen:  # every mistake before anything is fetched; recipes without subsets: whole
        with_subsets = [r for r in loaded if r.subsets]
        if not with_subsets:
            raise ConfigError(f"--subset: {', '.join(r.name for r in loaded)} declare(s) no "
                              "kernel subsets", fix="build without --subset; `wheelforge show "
                              "NAME` says whether a recipe has subsets")
        for r in with_subsets:
            select_subset(r, chosen)
    config = resolve(arch=arch, python=python, torch=torch, jobs=jobs, index_dir=index_dir,
                     cache_dir=cache_dir, work_dir=work_dir, sources_dirs=sources_dirs,
                     force=force, project_file=project_file, git_mirrors=git_mirrors,
                     subset=chosen, toolkit=toolkit, cuda_home=cuda_home)
    reporter = Reporter(verbose=verbose)
    if timeout:
        import signal

        signal.alarm(timeout)
    reporter.header(f"wheelforge {__version__}: building {', '.join(r.name for r in loaded)}")
    for line in config.summary():
        reporter.info(line)
    off = gate_disabled() or (None if stack_check else "--no-stack-check")
    gate_python = config.python or config.base_python
    with contextlib.ExitStack() as held:
        early = None
        if not off and (gate_forced() or early_venv_pays(
                config.index_dir, python=gate_python, recipes_dir=book.recipes_dir,
                deps_dir=deps_dir)):  # the stack check's venv is made while the builds run
            from ..consume.stack import EarlyVenv

            early = held.enter_context(EarlyVenv(gate_python, config.cache_dir / "stack"))
        results = build_with_companions(loaded, book, config, reporter)
        clear_live()
        for res in results:
            state = ("reproduced (already published)" if res.reproduced else
                     "already published" if res.skipped else "published")
            archs = ", ".join(res.sass) if res.sass else "pure Python"
            click.echo(f"{state}: {res.wheel.name}  [{archs}]")
        built = {r.channel for r in results if r.channel is not None}
        statuses = []
        if off:
            click.echo(f"stack: not checked ({off})")
        else:
            from .. import index

            known = {r.channel for r in index.load_records(config.index_dir) if r.channel}
            channels: list[str | None] = [*sorted(built or known)] or [None]
            statuses = run_gate(config.index_dir, channels, python=gate_python,
                                cache_dir=config.cache_dir, recipes_dir=book.recipes_dir,
                                deps_dir=deps_dir, reporter=reporter, early=early,
                                skip_unchanged=not gate_forced())
    channel = built.pop() if len(built) == 1 else None
    click.echo(f"install (the index's {'channel ' + channel if channel else 'simple/'}), "
               "from any directory:")
    try:
        click.echo(_install_lines(config.index_dir, None, channel), nl=False)
    except ConfigError as exc:  # e.g. every built version yanked: the build still succeeded
        click.echo(f"# none: {exc.what} ({exc.why})")
    raise_if_broken(statuses)


@cli.command("list")
@recipes_option
def list_(recipes: Path | None) -> None:
    """List the recipes: name, version, kind.  A broken recipe does not hide the others:
    they are listed, then the broken ones with their problems (exit 3, as `check`)."""
    from ..recipe.format import broken_recipes

    good, broken = _book(recipes, nonempty=True).load_each()
    for r in good:
        click.echo(f"{r.name:28} {str(r.version):12} {r.build.kind}")
    if broken:
        raise broken_recipes(broken)


@cli.command()
@click.argument("name")
@recipes_option
def show(name: str, recipes: Path | None) -> None:
    """Show one recipe as wheelforge understands it."""
    r = _book(recipes).load(name)
    click.echo(f"name:      {r.name}")
    click.echo(f"version:   {r.version}")
    if r.summary:
        click.echo(f"summary:   {r.summary}")
    click.echo(f"recipe:    {r.path}")
    for i, s in enumerate(r.sources):
        click.echo(f"source {i}:  {s.identity}")
        if isinstance(s, SdistSource) and s.url:
            click.echo(f"           {s.url}")
        elif not isinstance(s, SdistSource) and s.release_tag:
            click.echo(f"           after release {s.release_tag} ({s.release_commit}); "
                       f"label g{s.commit[:12]}")
    for c in r.companions:
        click.echo(f"companion: {c} (built for the same target, required exactly)")
    for p in r.patches:
        click.echo(f"patch:     {p}")
    click.echo(f"build:     kind={r.build.kind} requires={', '.join(r.build.requires) or '-'}")
    for k, v in r.build.env:
        click.echo(f"env:       {k}={v}")
    click.echo(f"label:     {r.build.local_version or '(none)'}  pin-torch={r.build.pin_torch}")
    if r.project:
        click.echo(f"project:   {r.project} (the wheel's name; this recipe is a variant)")
    if r.build.stable_abi:
        click.echo("abi:       torch's stable ABI, audited; channel cuN-stable "
                   "(docs/stable-abi.md)")
    if r.build.drop_requires:
        click.echo(f"drops:     {', '.join(r.build.drop_requires)}")
    if r.build.job_memory_gib is not None:
        click.echo(f"job mem:   {r.build.job_memory_gib:g} GiB a compile job (sizes the jobs)")
    click.echo(f"imports:   {', '.join(r.verify.imports) or '-'}")
    if r.verify.top_level:
        click.echo(f"ships:     {', '.join(r.verify.top_level)} only"
                   + (f"; never {', '.join(r.verify.excluded)}" if r.verify.excluded else ""))
    if r.subsets:
        click.echo(f"subsets:   --subset {describe_subsets(r)}")
    lim = r.extract
    click.echo(f"extract:   at most {lim.max_bytes:,} bytes, {lim.max_members:,} members, "
               f"{lim.max_member_bytes:,} bytes a member")


@cli.command()
@recipes_option
def check(recipes: Path | None) -> None:
    """Lint every recipe; report all problems at once."""
    loaded = _book(recipes, nonempty=True).load_all()
    click.echo(f"{len(loaded)} recipe(s) OK: {', '.join(r.name for r in loaded)}")


@cli.command()
@click.argument("wheel", type=click.Path(path_type=Path, dir_okay=False, exists=True))
def inspect(wheel: Path) -> None:
    """Print WHEEL's version, tags, torch pin and size, then per shared object its SASS and
    PTX architectures (read from the ELF .nv_fatbin section; no GPU needed), then its SBOM
    (PEP 770): upstream source, patch count, toolchain, archs and build key.

    \b
    Examples:
      wheelforge inspect index/files/causal_conv1d-1.7.0+cu130torch2.14sm120-*.whl
      wheelforge inspect dist/tinyext-0.1.0-cp311-cp311-linux_x86_64.whl   # any wheel
    """
    import email.parser
    import re

    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import InvalidWheelFilename

    from ..builder.artifact.fatbin import FatbinError
    from ..builder.artifact.sbom import read_sbom, summary_lines
    from ..builder.artifact.verify import shared_object_archs
    from ..errors import VerifyError
    from ..wheel import inspect_wheel, read_metadata

    if not wheel.name.endswith(".whl"):
        hint = (" (a .metadata file is the index's PEP 658 copy of a wheel's METADATA: give "
                "the .whl beside it)" if wheel.name.endswith(".metadata") else "")
        raise ConfigError(f"{wheel} is not a wheel", why="wheelforge inspect reads .whl files"
                          + hint, fix="give the path of a wheel (.whl) file")
    try:
        info = inspect_wheel(wheel)  # a malformed or unsafe wheel: VerifyError naming the member
        meta = email.parser.BytesParser().parsebytes(read_metadata(wheel), headersonly=True)
        found = shared_object_archs(wheel)
        bom = read_sbom(wheel)
    except (InvalidWheelFilename, FatbinError, OSError, KeyError, ValueError) as exc:
        raise VerifyError(f"cannot read {wheel}", why=str(exc),
                          fix="give the path of a wheel (.whl) file") from exc
    pins: list[str] = []
    extras: list[str] = []
    for text in meta.get_all("Requires-Dist") or []:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name != "torch":
            continue
        extra = re.search(r'extra == "([^"]+)"', str(req.marker or ""))
        if extra:  # a requirement under an extra is no pin of the wheel
            extras.append(f"[{extra.group(1)}] torch{req.specifier}")
        else:
            pins.append(str(req))
    click.echo(f"wheel:     {wheel.name}")
    click.echo(f"project:   {info.name}")
    click.echo(f"version:   {info.version}")
    click.echo(f"tags:      {', '.join(info.tags)}")
    click.echo(f"torch pin: {', '.join(pins) if pins else 'none (no torch requirement)'}")
    if extras:
        click.echo(f"torch in extras: {', '.join(extras)}")
    click.echo(f"size:      {_size(wheel.stat().st_size)}")
    if not found:
        click.echo("shared objects: none")
    for name, archs in found:
        sass = ", ".join(sorted(archs.sass)) or "none"
        ptx = ", ".join(sorted(archs.ptx)) or "none"
        click.echo(f"{name}: SASS {sass}; PTX {ptx}")
    for line in summary_lines(bom):
        click.echo(line)


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


@cli.command(epilog=EPILOG_SHORT)
@click.option("--arch", help="CUDA architectures to check nvcc against (default as for build).")
@click.option("--python", "python", type=click.Path(dir_okay=True),
              help="Check this interpreter's torch against nvcc: a path, a venv directory, or "
                   "a name looked up on PATH (python3). Default: the managed environment a "
                   "build would use.")
@click.option("--torch", help="torch requirement of the managed environment (default as for "
                              "build: wheelforge.yaml, else torch==2.14.1).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Job count to size memory for "
              "(default as for build).")
@click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Cache whose free disk is checked (default ~/.cache/wheelforge or "
                   "$WHEELFORGE_CACHE).")
@click.option("--work-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Work directory whose free disk is checked (default: CACHE/work).")
@click.option("--config", "project_file", type=click.Path(path_type=Path, dir_okay=False,
                                                          exists=True),
              help="Project file with defaults (default ./wheelforge.yaml if present).")
@click.option("--toolkit", type=click.Choice(["auto", "managed", "system"]),
              help="CUDA toolkit to compile with: managed (PyPI's cuda-toolkit wheels, "
                   "installed once into uv's cache), system ($CUDA_HOME, nvcc on PATH, "
                   "/usr/local/cuda) or auto (system where found, else managed). Default: "
                   "$WHEELFORGE_TOOLKIT, else toolkit: in wheelforge.yaml, else auto.")
@click.option("--cuda-home", "cuda_home", type=click.Path(file_okay=False), metavar="PATH",
              help="Check the system CUDA toolkit at PATH, as build --cuda-home uses it.")
def doctor(arch: str | None, python: str | None, torch: str | None, jobs: int | None,
           cache_dir: Path | None, work_dir: Path | None, project_file: Path | None,
           toolkit: str | None = None, cuda_home: str | None = None) -> None:
    """Check the toolchain before a build: nvcc and the archs it can compile, torch's CUDA
    against nvcc's, the host compiler, ninja, git, free disk, memory per compile job.

    Each line is OK, WARN, FAIL (with the fix) or SKIP (could not be checked, and why).
    Exits 6 when anything FAILs. The same checks run before every build, before any compile
    starts. Without --python, the torch of the managed environment is checked: inspected
    when the environment exists, else judged from its requirement.
    """
    from dataclasses import replace

    from ..builder.checks import doctor as doc
    from ..builder.compiling.torchtoolkit import for_python, toolkit_environ

    config = resolve(arch=arch, python=python, torch=torch, jobs=jobs, cache_dir=cache_dir,
                     work_dir=work_dir, project_file=project_file, toolkit=toolkit,
                     cuda_home=cuda_home)
    if config.python is not None and str(config.python) != str(python):
        click.echo(f"python: {config.python} [{config.origin('python')}]")
    if config.python is not None:  # the toolkit a build for that torch takes
        choice = for_python(config.python, config.toolkit, config.cuda_toolkit,
                            config.cuda_home)
        config = replace(config, toolkit=choice.mode, cuda_toolkit=choice.requirement)
        if choice.why:
            click.echo(f"toolkit: {choice.why}")
    findings = doc.run_checks(archs=config.archs, python=config.python,
                              work_dir=config.work_dir, cache_dir=config.cache_dir,
                              jobs=jobs, managed_torch=config.torch,
                              managed_torch_pip_args=config.torch_pip_args,
                              managed_python=config.base_python,
                              gib_per_job=config.gib_per_job, toolkit=config.toolkit,
                              cuda_toolkit=config.cuda_toolkit,
                              environ=toolkit_environ(os.environ, config.cuda_home))
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    colors = {"OK": "green", "WARN": "yellow", "FAIL": "red", "SKIP": "blue"}
    for f in findings:
        text = doc.render([f])
        click.echo(click.style(text, fg=colors[f.status]) if color else text)
    failed = doc.failures(findings)
    if failed:
        from ..errors import ToolchainError

        raise ToolchainError(f"{len(failed)} check(s) failed",
                             fix="fix the FAIL lines above; each says how")


@cli.command(epilog=EPILOG_SHORT)
@click.argument("name", required=False)
@click.option("--stack", is_flag=True, help="Test the whole channel instead of NAME: every "
              "wheel installed together into one venv over --python, every recipe's GPU test "
              "there, tiny hybrid models (gputests/stack/) checked for the fast path by "
              "the CUDA kernels that ran, and, when the channel holds flash-attn, a small "
              "Llama with flash_attention_2 against sdpa (gputests/flash-attn/).")
@click.option("--channel", help="With --stack: the channel (default: the index's only one).")
@click.option("--report", "report_file", type=click.Path(path_type=Path, dir_okay=False),
              help="With --stack: also write the result as JSON to this file.")
@deps_dir_option
@click.option("--index", "index_dir", type=click.Path(path_type=Path, file_okay=False),
              help="The index to install from (default: defaults.index of wheelforge.yaml, "
                   "else ./index).")
@click.option("--python", "python", type=click.Path(dir_okay=True),
              help="Interpreter whose torch (and GPU) the test uses (a path, a venv directory "
                   "or a name looked up on PATH); the wheel is installed into a fresh venv "
                   "layered on it. "
                   "Default: defaults.python of wheelforge.yaml, else the python3 on PATH.")
@click.option("--sources", "sources_dirs", multiple=True,
              type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="Directory holding source archives (for tests that live in the source).")
@click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Cache for sources and logs (default ~/.cache/wheelforge or "
                   "$WHEELFORGE_CACHE).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="pytest-xdist processes sharing the GPU (default: min(8, cores) when "
                   "pytest-xdist is installed, else 1).")
@git_mirror_option
@recipes_option
def test(name: str | None, stack: bool, channel: str | None, report_file: Path | None,
         deps_dir: Path | None, index_dir: Path | None, python: str | None,
         sources_dirs: tuple[Path, ...], cache_dir: Path | None, workers: int | None,
         git_mirrors: tuple[str, ...], recipes: Path | None) -> None:
    """Prove a published wheel on this machine's GPU.

    Installs NAME from the index into a fresh environment, runs the recipe's GPU test
    (causal-conv1d: upstream's test file; fla: numerical checks against reference
    implementations) and records the result with the wheel, shown in the index. A recipe's
    companions are installed with it, from the same index (the wheel pins them). Exits 10
    when there is no GPU, 12 when the wheel has no code for this GPU, 11 when tests fail.
    """
    import time as _time

    from ..builder.config import default_cache_dir, find_python, project_python
    from ..consume.gputest import run_test

    if stack or name is None:
        if name is not None or not stack:
            raise ConfigError("wheelforge test takes a recipe NAME, or --stack without one",
                              why=f"got {'NAME and --stack' if stack else 'neither'}",
                              fix="wheelforge test causal-conv1d, or wheelforge test --stack")
        _test_stack(channel, report_file, deps_dir, index_dir, python, sources_dirs, cache_dir,
                    workers, git_mirrors, recipes)
        return
    recipe = _book(recipes).load(name)
    index_dir = _existing_index(index_dir)
    _repair_or_warn(index_dir)
    interp = project_python(python) or find_python("python3", "the default interpreter")
    mirrors = dict(resolve(git_mirrors=git_mirrors).git_mirrors)
    cache = cache_dir or default_cache_dir()
    log = cache / "logs" / f"test-{recipe.name}-{_time.strftime('%Y%m%dT%H%M%S')}.log"
    reporter = Reporter()
    reporter.info(f"python {interp}" + (f"  [--python {python}]" if python else ""))
    with reporter.step(f"test {recipe.name} from {index_dir}"):
        record, outcome = run_test(recipe, index_dir=index_dir,
                                   python=interp, cache_dir=cache, sources_dirs=sources_dirs,
                                   progress=reporter.info, log=log, git_mirrors=mirrors,
                                   workers=workers or min(8, os.cpu_count() or 1))
    clear_live()
    click.echo(f"{outcome.status}: {record.filename} on {outcome.gpu} (sm {outcome.capability}): "
               f"{outcome.passed} passed, {outcome.failed} failed, {outcome.skipped} skipped, "
               f"{outcome.errors} errors in {outcome.duration_s:.0f}s  [log {log}]")
    if outcome.status != "passed":
        from ..errors import GpuTestError

        raise GpuTestError(f"the GPU test of {record.filename} failed",
                           why=f"{outcome.failed} failed, {outcome.errors} errors",
                           fix="read the log; the index marks the wheel as failed", log=str(log))


def _test_stack(channel: str | None, report_file: Path | None, deps_dir: Path | None,
                index_dir: Path | None, python: str | None, sources_dirs: tuple[Path, ...],
                cache_dir: Path | None, workers: int | None, git_mirrors: tuple[str, ...],
                recipes: Path | None) -> None:
    """wheelforge test --stack: the channel whole, on this machine's GPU."""
    import time as _time

    from .. import index
    from ..builder.config import default_cache_dir, find_python, project_python
    from ..consume.gpustack import run_stack_test, write_report
    from ..errors import GpuTestError

    book = _book(recipes)
    index_dir = _existing_index(index_dir)
    _repair_or_warn(index_dir)
    known = sorted({r.channel for r in index.load_records(index_dir) if r.channel})
    if channel is None and len(known) > 1:
        raise ConfigError(f"{index_dir} has {len(known)} channels", why=", ".join(known),
                          fix="pass one with --channel")
    channel = channel or (known[0] if known else None)
    interp = project_python(python) or find_python("python3", "the default interpreter")
    cache = cache_dir or default_cache_dir()
    log = cache / "logs" / f"test-stack-{_time.strftime('%Y%m%dT%H%M%S')}.log"
    reporter = Reporter()
    reporter.info(f"python {interp}" + (f"  [--python {python}]" if python else ""))
    hybrids = book.recipes_dir.parent / "gputests" / "stack" / "hybrid_models.py"
    attention = book.recipes_dir.parent / "gputests" / "flash-attn" / "attention_model.py"
    with reporter.step(f"stack of {channel or 'simple/'} from {index_dir}"):
        report = run_stack_test(
            index_dir, channel, book, python=interp, cache_dir=cache,
            sources_dirs=sources_dirs, git_mirrors=dict(resolve(git_mirrors=git_mirrors)
                                                        .git_mirrors),
            deps_dir=deps_dir, workers=workers or min(8, os.cpu_count() or 1),
            hybrids=hybrids if hybrids.is_file() else None,
            attention=attention if attention.is_file() else None, log=log, say=reporter.info)
    clear_live()
    for line in report.lines():
        click.echo(line)
    if report_file is not None:
        write_report(report, report_file)
    click.echo(f"{'passed' if report.passed else 'failed'}: the stack of "
               f"{channel or 'simple/'} on {report.gpu}  [log {log}]")
    if not report.passed:
        raise GpuTestError(f"the stack of {channel or 'simple/'} failed on {report.gpu}",
                           why="see the lines above", fix="read the log", log=str(log))


cli.add_command(nightly)  # the nightly commands: their own module, nightly.py
for _command in INDEX_COMMANDS:  # index rebuild, yank, unyank, serve, consumer-config, prune
    cli.add_command(_command)
cli.add_command(stack_group)  # wheelforge stack check: stack.py
cli.add_command(install)  # wheelforge install: install.py
cli.add_command(patch_group)  # the maintainer's commands: maintain.py
cli.add_command(outdated)
cli.add_command(clean)


def _install_signal_handlers() -> None:
    """SIGTERM and SIGALRM (--timeout) interrupt like Ctrl-C does."""
    import signal

    def on_term(signum: int, _frame: object) -> None:
        raise Interrupted("SIGTERM", INTERRUPT_EXIT_CODES["SIGTERM"])

    def on_alarm(signum: int, _frame: object) -> None:
        raise Interrupted("timeout", INTERRUPT_EXIT_CODES["timeout"])

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGALRM, on_alarm)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: object = None, line: str | None = None) -> None:
    """Python warnings of wheelforge's own process: on a line of their own; the index's
    (a change finished after a crash, a file quarantined) as ``warning: ...`` lines."""
    import warnings

    from ..errors import IndexWarning

    clear_live()
    if issubclass(category, IndexWarning):
        click.echo(f"warning: {message}", err=True)
        return
    click.echo(warnings.formatwarning(message, category, filename, lineno, line).rstrip(),
               err=True)


def main() -> None:
    import warnings

    _install_signal_handlers()
    from ..errors import IndexWarning

    warnings.showwarning = _show_warning
    warnings.simplefilter("always", IndexWarning)  # every one of them
    try:
        try:
            cli.main(standalone_mode=False)
        except click.exceptions.Abort as exc:  # click wraps KeyboardInterrupt in Abort
            if isinstance(exc.__cause__, KeyboardInterrupt):
                raise exc.__cause__ from None
            if isinstance(exc.__cause__, EOFError):  # and EOFError: a bug here, not Ctrl-C
                raise exc.__cause__ from None
            raise KeyboardInterrupt from None
    except click.ClickException as exc:
        clear_live()
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        clear_live()
        reason = exc.reason if isinstance(exc, Interrupted) else "SIGINT"
        click.echo(f"interrupted ({reason})", err=True)
        sys.exit(exc.exit_code if isinstance(exc, Interrupted) else
                 INTERRUPT_EXIT_CODES["SIGINT"])
    except WheelforgeError as exc:
        clear_live()
        click.echo(exc.render(), err=True)
        sys.exit(exc.exit_code)
    except Exception:  # a bug: keep the traceback, and say it is one
        import traceback

        clear_live()
        traceback.print_exc()
        click.echo("internal error: this is a wheelforge bug; please report it with the "
                   "traceback above", err=True)
        sys.exit(INTERNAL_ERROR_EXIT_CODE)
