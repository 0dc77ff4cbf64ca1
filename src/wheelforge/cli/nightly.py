"""The nightly commands: ``wheelforge nightly`` and its parts plan, run and publish.

Added to the ``wheelforge`` group by :mod:`.main`; thin
commands over :mod:`.nightly`, :mod:`.fanout` and :mod:`.rayexec`, like the rest of the
command line (whose ``main`` turns their errors into messages and exit codes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .. import __version__
from .._log import Reporter, clear_live
from ..builder.config import resolve
from ..errors import ConfigError, WheelforgeError
from ..index.health import summary_line
from ..recipe.format import RecipeBook
from ._options import EPILOG_SHORT, config_option, recipes_option
from ._options import book as _book
from .stack import deps_dir_option, gate_disabled, gate_forced

jobs_option = click.option(
    "-j", "--jobs", type=click.IntRange(min=1), help="Parallel compile jobs of each build "
    "(MAX_JOBS). Default: $MAX_JOBS, else from cores, memory and the source's translation "
    "units.")
sources_option = click.option(
    "--sources", "sources_dirs", multiple=True,
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    help="Directory holding source archives (air-gapped builds). Repeatable.")
cache_option = click.option(
    "--cache-dir", type=click.Path(path_type=Path, file_okay=False),
    help="Cache for sources, build environments, compile cache, logs and the recorded "
         "durations (default $WHEELFORGE_CACHE, else ~/.cache/wheelforge).")
work_option = click.option(
    "--work-dir", type=click.Path(path_type=Path, file_okay=False),
    help="Where sources are unpacked and built (default: CACHE/work).")
report_option = click.option(
    "--report-dir", type=click.Path(path_type=Path, file_okay=False),
    help="Where the nightly-<time>.json/.html reports go (default INDEX/reports, linked from "
         "the index's landing page).")
nightly_index_option = click.option(
    "--index", "index_dir", type=click.Path(path_type=Path, file_okay=False),
    help="The index (default: wheelforge.yaml, else ./index).")


def _matrix_and_settings(project_file: Path | None, recipes: Path | None,
                         index_dir: Path | None = None, cache_dir: Path | None = None,
                         work_dir: Path | None = None, sources_dirs: tuple[Path, ...] = (),
                         jobs: int | None = None) -> tuple[Any, RecipeBook, Any]:
    from .. import nightly as night
    from ..builder.config import PROJECT_FILE
    from ..recipe.matrix import load_matrix

    path = project_file or Path(PROJECT_FILE)
    if not path.is_file():
        raise ConfigError(f"no project file {path}", fix="run in the directory that holds "
                          "wheelforge.yaml, or pass --config")
    book = _book(recipes)
    matrix, base = _both_sections(
        path, lambda: load_matrix(path, known_recipes=book.names(), recipes=book.load),
        lambda: resolve(index_dir=index_dir, cache_dir=cache_dir, work_dir=work_dir,
                        sources_dirs=sources_dirs, jobs=jobs, project_file=path))
    settings = night.Settings(index_dir=base.index_dir, cache_dir=base.cache_dir,
                              work_dir=base.work_dir, sources_dirs=base.sources_dirs,
                              jobs=jobs, project_file=path, stack_check=_stack_check(),
                              stack_recheck=gate_forced())
    return matrix, book, settings


def _refuse_options_before(ctx: click.Context, name: str) -> None:
    """`nightly --config ci.yaml plan`: the options given before the subcommand, refused
    with the line to run instead (each option as it is spelled, with its value; one the
    subcommand does not take is named as such)."""
    import shlex

    sub = ctx.command.get_command(ctx, name) if isinstance(ctx.command, click.Group) else None
    takes = {o for p in (sub.params if sub else ()) for o in p.opts}
    moved: list[str] = []
    foreign: list[str] = []
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if not param.opts or value in (None, (), False) or (
                param.name == "executor" and value == "local"):
            continue
        flag = max(param.opts, key=len)  # --config, not -c
        values = value if isinstance(value, tuple) else (value,)
        words = [flag] if value is True else [w for v in values for w in (flag, str(v))]
        (moved if flag in takes else foreign).append(" ".join(shlex.quote(w) for w in words))
    if not moved and not foreign:
        return
    line = " ".join([f"wheelforge nightly {name}", *moved]) if moved else ""
    raise click.UsageError(
        f"options before '{name}' belong to the whole nightly run"
        + (f"; put them after it: {line}" if moved else "")
        + (f"; not options of `wheelforge nightly {name}`: {', '.join(foreign)} "
           f"(wheelforge nightly {name} --help lists its own)" if foreign else ""))


def _both_sections(path: Path, matrix: Callable[[], Any], settings: Callable[[], Any]
                   ) -> tuple[Any, Any]:
    """The project file's matrix: and its settings (defaults:), every problem of both in
    one error: a matrix: typo, once corrected, was followed by a defaults: typo."""
    out: list[Any] = []
    errors: list[ConfigError] = []
    for read in (matrix, settings):
        try:
            out.append(read())
        except ConfigError as exc:
            errors.append(exc)
    lists = [e.why for e in errors if e.why and e.why.startswith("\n")]
    if len(errors) == 2 and len(lists) == 2:  # two lists of problems, one per section
        count = len("".join(lists).strip().splitlines())
        raise ConfigError(f"{path} has {count} problem(s)", why="".join(lists),
                          fix="correct the keys above; docs/usage.md lists the settings of "
                              "defaults:, docs/nightly.md the matrix")
    if errors:
        raise errors[0]
    return out[0], out[1]


def _stack_check() -> bool:
    off = gate_disabled()
    if off:
        click.echo(f"stack: not checked ({off})", err=True)
    return off is None


def _raise_if_failed(report: Any, reports: Path) -> None:
    """Exit 1 for a night with failed cells, or whose stack check found a channel broken."""
    fix = f"see {reports / 'nightly-latest.html'}"
    if report.count("failed"):
        raise WheelforgeError(f"{report.count('failed')} of {len(report.results)} cell(s) "
                              "failed", fix=fix)
    broken = [s.channel or "simple/" for s in report.stacks if s.state == "broken"]
    if broken:
        raise WheelforgeError(f"the stack of {', '.join(broken)} is broken: its wheels, "
                              "installed together, do not import together", fix=fix)
    if report.failed:
        raise WheelforgeError(report.summary(), fix=fix)


def _echo_report(report: Any, reports: Path) -> None:
    clear_live()
    for r in report.results:
        target = "pure" if r.archs is None else f"{r.torch} cu{r.cuda} arch {r.archs}"
        click.echo(f"{r.status:8} {r.recipe} [{target}] {r.wheel or r.note or ''}".rstrip())
        if r.status == "failed" and r.error:  # why, on the console too (not only the report)
            for line in r.error.strip().splitlines()[:3]:
                click.echo(f"         {line.strip()}")
    for s in report.stacks:
        click.echo(f"stack {s.channel or 'simple/'}: {summary_line(s)}")
    for c in report.canaries:
        click.echo(c.line())
    click.echo(f"report: {reports / 'nightly-latest.html'}")
    click.echo(report.summary())
    broken = [c.recipe for c in report.canaries if c.state == "failed"]
    if broken:  # a warning: the pinned cells alone decide the exit status
        click.echo(f"warning: the newest upstream release of {', '.join(broken)} does not "
                   "pass its canary (see the canary lines above); the pinned cells are "
                   "unaffected", err=True)


@click.group(epilog=EPILOG_SHORT, invoke_without_command=True)
@config_option
@nightly_index_option
@report_option
@jobs_option
@sources_option
@cache_option
@work_option
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
              show_default=True, help="Where the cells build: in this process (up to four at "
              "once, sharing --jobs; WHEELFORGE_BUILDS_AT_ONCE=off: one after another), or as "
              "tasks on a Ray cluster (pip install 'wheelforge[ray]'; see "
              "docs/nightly.md).")
@click.option("--ray-address", metavar="ADDRESS", help="The Ray cluster to connect to (default "
              "$RAY_ADDRESS, else 'auto': the cluster `ray start` runs on this machine).")
@click.option("-v", "--verbose", is_flag=True, help="Stream the compiler output.")
@deps_dir_option
@recipes_option
@click.pass_context
def nightly(ctx: click.Context, project_file: Path | None, index_dir: Path | None,
            report_dir: Path | None, jobs: int | None, sources_dirs: tuple[Path, ...],
            cache_dir: Path | None, work_dir: Path | None, executor: str,
            ray_address: str | None, verbose: bool, deps_dir: Path | None,
            recipes: Path | None) -> None:
    """Build every out-of-date cell of the build matrix (matrix: in wheelforge.yaml).

    A cell whose build key is published is skipped without creating an environment; a
    failed cell is reported and the others still build. Two runs on one index never build
    a cell twice. Writes nightly-<time>.json and .html (and nightly-latest.*) to the report
    directory. Exits 1 when any cell failed.

    Then the stack check of each channel (wheelforge stack check), except where the
    channel's last check passed with exactly what it would install and import now (said
    on the console; WHEELFORGE_STACK_CHECK=always checks anyway, =off never).

    With a canary: section in the matrix, the newest upstream release of each canary
    recipe is then patched, built, verified and stack-checked in scratch (never published)
    and reported beside the cells; a failing canary is a warning, not part of the exit
    status.

    \b
    The same night in three parts, for engines that run one job per cell:
      wheelforge nightly plan --output plan.json --github-matrix matrix.json
      wheelforge nightly run --plan plan.json --cell 3 --stage-dir stage/   # on a builder
      wheelforge nightly publish --plan plan.json stage/                    # one writer
    """
    if ctx.invoked_subcommand is not None:
        _refuse_options_before(ctx, ctx.invoked_subcommand)
        return
    from .. import nightly as night

    matrix, book, settings = _matrix_and_settings(project_file, recipes, index_dir,
                                                  cache_dir, work_dir, sources_dirs, jobs)
    settings = dataclasses.replace(settings, deps_dir=deps_dir)
    reporter = Reporter(verbose=verbose)
    reporter.header(f"wheelforge {__version__}: nightly, matrix {matrix.path}"
                    + (" on a Ray cluster" if executor == "ray" else ""))
    reports = report_dir or settings.index_dir / night.REPORTS_DIR
    if executor == "ray":
        from ..nightly import fanout, rayexec

        if matrix.canary is not None:
            reporter.info("canary: not run on a Ray cluster (only with --executor local); "
                          "`wheelforge outdated` says whether the series applies")

        plan = fanout.make_plan(matrix, book, settings, reporter=reporter)
        reporter.info(f"plan: {len(plan.cells)} cell(s) to build, {len(plan.done)} done")
        report = rayexec.run_night(plan, matrix, settings, recipes_dir=book.recipes_dir,
                                   address=ray_address, reporter=reporter,
                                   report_dir=reports)
    else:
        report = night.run(matrix, book, settings, reporter=reporter, report_dir=reports)
    _echo_report(report, reports)
    _raise_if_failed(report, reports)


@nightly.command("plan", epilog=EPILOG_SHORT)
@config_option
@nightly_index_option
@cache_option
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the plan here (default: stdout).")
@click.option("--github-matrix", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the cells as a GitHub Actions strategy.matrix "
                   '({"include": [{"cells": "ID", "name": ...}]}, for fromJSON).')
@click.option("--github-output", type=click.Path(path_type=Path, dir_okay=False),
              help='Append "matrix=<json>" and "cells=<count>" to this file (pass '
                   '"$GITHUB_OUTPUT" in a workflow step).')
@click.option("--max-jobs", type=click.IntRange(1, 256), default=256, show_default=True,
              help="Most jobs in the matrix (GitHub's limit is 256): above it, cells are "
                   "packed into this many batches of about equal estimated time.")
@recipes_option
def nightly_plan(project_file: Path | None, index_dir: Path | None, cache_dir: Path | None,
                 output: Path | None, github_matrix: Path | None, github_output: Path | None,
                 max_jobs: int, recipes: Path | None) -> None:
    """Plan the night: the cells whose build key is not published, longest first (from
    the durations in CACHE/stats), as JSON. Nothing is built or created."""
    import json

    from ..nightly import fanout

    matrix, book, settings = _matrix_and_settings(project_file, recipes, index_dir, cache_dir)
    reporter = Reporter()
    plan = fanout.make_plan(matrix, book, settings, reporter=reporter)
    text = fanout.plan_to_json(plan)
    gh = fanout.github_matrix(plan, max_jobs)
    if output is None:
        click.echo(text, nl=False)
    else:
        fanout.write_plan(plan, output)
    if github_matrix is not None:
        from .._fs import atomic_write

        atomic_write(github_matrix, json.dumps(gh) + "\n")
    if github_output is not None:
        with open(github_output, "a", encoding="utf-8") as f:
            f.write(f"matrix={json.dumps(gh)}\ncells={len(plan.cells)}\n")
    batched = len(gh["include"]) < len(plan.cells)
    reporter.info(f"{len(plan.cells)} cell(s) to build"
                  + (f" in {len(gh['include'])} batches (more than {max_jobs})" if batched
                     else "")
                  + f", {sum(1 for r in plan.done if r.status == 'skipped')} up to date, "
                    f"{sum(1 for r in plan.done if r.status == 'failed')} failed to plan")


@nightly.command("run", epilog=EPILOG_SHORT)
@click.option("--plan", "plan_file", required=True,
              type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="The plan `wheelforge nightly plan` wrote.")
@click.option("--cell", "cell_ids", multiple=True, required=True, metavar="ID",
              help="The plan's cell to build (repeatable; a value may hold several ids, "
                   "space separated, as a batch of the GitHub matrix does).")
@click.option("--stage-dir", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Each cell goes into STAGE_DIR/cell-ID (created; must be empty).")
@config_option
@jobs_option
@sources_option
@cache_option
@work_option
@click.option("-v", "--verbose", is_flag=True, help="Stream the compiler output.")
@click.option("--signing-key", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              envvar="WHEELFORGE_SIGNING_KEY", show_envvar=True,
              help="Sign each stage with this builder's SSH key (ssh-keygen -Y sign, "
                   "namespace wheelforge-stage): a private key without a passphrase, or a "
                   ".pub whose key ssh-agent holds. The publisher counts signed stages as "
                   "builders for --require-reproduced (docs/trust.md).")
@recipes_option
def nightly_run(plan_file: Path, cell_ids: tuple[str, ...], stage_dir: Path,
                project_file: Path | None, jobs: int | None, sources_dirs: tuple[Path, ...],
                cache_dir: Path | None, work_dir: Path | None, verbose: bool,
                signing_key: Path | None, recipes: Path | None) -> None:
    """Build and verify cells of a plan into stage directories, on a builder; the index is
    not touched. Refuses a cell whose build key here is not the plan's (another toolchain).
    With --signing-key, each stage is signed (stage.manifest and stage.manifest.sig).
    Exits 1 when a cell failed (its stage then holds the error and the log)."""
    from ..nightly import fanout, signing

    plan = fanout.load_plan(plan_file)
    chosen = fanout.select(plan, cell_ids)
    if signing_key is not None:
        signing.check_key(signing_key)  # before hours of build, not after
    matrix, book, settings = _matrix_and_settings(project_file, recipes, None, cache_dir,
                                                  work_dir, sources_dirs, jobs)
    reporter = Reporter(verbose=verbose)
    failed = 0
    for c in chosen:
        reporter.header(f"cell {c.id}: {c.label}")
        rec = fanout.run_cell(c, matrix, book, settings, stage_dir / f"cell-{c.id}",
                              reporter=reporter)
        if signing_key is not None:
            signing.sign_stage(stage_dir / f"cell-{c.id}", signing_key)
        click.echo(f"{rec.status:8} cell {c.id} {c.label} -> {stage_dir / f'cell-{c.id}'}"
                   + (f" {rec.wheel}" if rec.wheel else ""))
        if rec.status == "failed":
            failed += 1
            click.echo(rec.error or "", err=True)
    if failed:
        raise WheelforgeError(f"{failed} of {len(chosen)} cell(s) failed",
                              fix=f"see {stage_dir}/cell-*/cell.json and build.log; the "
                                  "publish step reports them too")


@nightly.command("publish", epilog=EPILOG_SHORT)
@click.argument("stages", nargs=-1, type=click.Path(path_type=Path, exists=True,
                                                    file_okay=False))
@click.option("--plan", "plan_file", required=True,
              type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="The plan the stages were built from.")
@nightly_index_option
@report_option
@cache_option
@config_option
@click.option("--require-reproduced", "require_reproduced", type=click.IntRange(min=1),
              default=None, metavar="N",
              help="Publish a cell only when N builders the publisher trusts (distinct "
                   "signers verified against --allowed-signers; an unsigned stage counts "
                   "as none, whatever its host field says) staged byte-identical wheels; "
                   "else the cell fails, listing each stage's sha256 and signer. Needs "
                   "--allowed-signers. Default: not asked (any verified stage publishes).")
@click.option("--allowed-signers", type=click.Path(path_type=Path, dir_okay=False,
                                                   exists=True),
              envvar="WHEELFORGE_ALLOWED_SIGNERS", show_envvar=True,
              help="The builders the publisher trusts: an ssh-keygen allowed_signers file "
                   '(`NAME namespaces="wheelforge-stage" KEY` per line). Every signed stage '
                   "is verified against it; a stage changed after signing or signed by "
                   "another key is refused (docs/trust.md).")
@deps_dir_option
@recipes_option
def nightly_publish(stages: tuple[Path, ...], plan_file: Path, index_dir: Path | None,
                    report_dir: Path | None, cache_dir: Path | None,
                    project_file: Path | None, require_reproduced: int | None,
                    allowed_signers: Path | None, deps_dir: Path | None,
                    recipes: Path | None) -> None:
    """Publish the stage directories of a plan: the single writer of the index.

    Each decision is taken under the index lock: a build key already published is skipped
    (a retried job is a no-op), else the build number is chosen and the wheel published.
    STAGES are stage directories, or directories holding them (downloaded artifacts).
    Every stage is verified again before anything is published (no link or special file,
    the wheel's RECORD, tags, metadata and, for an extension, its SASS against the cell's
    archs; its signature, against --allowed-signers): a failure publishes nothing and
    exits 8.  Each stage's signer (or "unsigned") is in the report.  Writes the nightly
    report with every cell of the plan; exits 1 when a cell failed (not reproduced by
    --require-reproduced trusted builders, too) or did not run.
    """
    from .. import nightly as night
    from ..nightly import fanout, publishing

    plan = fanout.load_plan(plan_file)
    base = resolve(index_dir=index_dir, cache_dir=cache_dir, project_file=project_file)
    settings = night.Settings(index_dir=base.index_dir, cache_dir=base.cache_dir,
                              project_file=project_file, stack_check=_stack_check(),
                              deps_dir=deps_dir, stack_recheck=gate_forced())
    reporter = Reporter()
    reports = report_dir or settings.index_dir / night.REPORTS_DIR
    recipes_dir = recipes or Path("recipes")
    book = (RecipeBook(recipes_dir, recipes_dir.parent / "patches") if recipes_dir.is_dir()
            else None)
    report = publishing.publish(plan, publishing.stage_dirs(stages), settings,
                                reporter=reporter, report_dir=reports, book=book,
                                require_reproduced=require_reproduced,
                                allowed_signers=allowed_signers)
    _echo_report(report, reports)
    bad = report.count("failed") + report.count("interrupted") + report.count("not run")
    if bad:
        raise WheelforgeError(f"{bad} of {len(report.results)} cell(s) failed or did not run",
                              fix=f"see {reports / 'nightly-latest.html'}")
    _raise_if_failed(report, reports)
