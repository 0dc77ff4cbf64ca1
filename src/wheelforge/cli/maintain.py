"""The maintainer's commands: ``wheelforge patch NAME start|export|rebase`` and
``wheelforge outdated``.

Added to the ``wheelforge`` group by :mod:`.main`; thin commands over
:mod:`wheelforge.maintain`, whose errors :func:`.main.main` turns into messages and exit
codes.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import click

from .._log import Reporter, clear_live
from ..builder.config import resolve
from ..errors import ConfigError
from ..recipe.model import GitSource, Recipe, SdistSource
from ._options import EPILOG_SHORT, git_mirror_option, recipes_option
from ._options import book as _book

sources_option = click.option(
    "--sources", "sources_dirs", multiple=True,
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    help="Directory holding source archives (matched by file name, verified by sha256). "
         "Repeatable.")
cache_option = click.option(
    "--cache-dir", type=click.Path(path_type=Path, file_okay=False),
    help="Cache of verified sources (default ~/.cache/wheelforge or $WHEELFORGE_CACHE).")


def _fetch(recipe: Recipe, cache_dir: Path | None, sources_dirs: tuple[Path, ...],
           git_mirrors: tuple[str, ...], reporter: Reporter) -> Path:
    from ..builder.source.fetch import fetch

    config = resolve(cache_dir=cache_dir, sources_dirs=sources_dirs, git_mirrors=git_mirrors)
    fetched = fetch(recipe, config.cache_dir, config.sources_dirs, progress=reporter.info,
                    git_mirrors=dict(config.git_mirrors))
    return fetched.archive


@click.group("patch", epilog=EPILOG_SHORT)
@click.argument("name")
@click.pass_context
def patch_group(ctx: click.Context, name: str) -> None:
    """Work on recipe NAME's patch series as a git repository (like gbp-pq).

    \b
      wheelforge patch causal-conv1d start    # ./patch-work/causal-conv1d: upstream + patches
      cd patch-work/causal-conv1d             # edit, git commit, git rebase -i upstream ...
      wheelforge patch causal-conv1d export   # back into patches/causal-conv1d/ and the recipe
      wheelforge patch causal-conv1d rebase --onto 1.8.0 --sdist URL --sha256 HEX

    docs/patch-workflow.md describes the workflow.
    """
    ctx.obj = name


@patch_group.command("start", epilog=EPILOG_SHORT)
@click.option("--to", "dest", type=click.Path(path_type=Path, file_okay=False),
              help="The new repository (default ./patch-work/NAME); an existing directory "
                   "must be empty.")
@sources_option
@cache_option
@git_mirror_option
@recipes_option
@click.pass_obj
def patch_start(name: str, dest: Path | None, sources_dirs: tuple[Path, ...],
                cache_dir: Path | None, git_mirrors: tuple[str, ...],
                recipes: Path | None) -> None:
    """Unpack NAME's pinned source (verified like a build's) into a new git repository:
    the pristine tree committed and tagged 'upstream', then one commit per patch of the
    series, with the patch's author, date and message."""
    from ..maintain.patchwork import default_dir, start

    recipe = _book(recipes).load(name)
    dest = dest or default_dir(recipe.name)
    reporter = Reporter()
    archive = _fetch(recipe, cache_dir, sources_dirs, git_mirrors, reporter)
    started = start(recipe, archive, dest)
    clear_live()
    click.echo(f"{dest}: {recipe.name} {recipe.version} as commit {started.base[:12]} (tag "
               f"upstream), then {len(started.commits)} patch(es), one commit each:")
    for file, commit in started.commits:
        click.echo(f"  {commit[:12]}  {file}")
    click.echo(f"edit and commit there (git rebase -i upstream to reorder or amend), then: "
               f"wheelforge patch {recipe.name} export" +
               (f" --from {dest}" if dest != default_dir(recipe.name) else ""))


@patch_group.command("export", epilog=EPILOG_SHORT)
@click.option("--from", "repo", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="The repository 'patch start' made (default ./patch-work/NAME).")
@recipes_option
@click.pass_obj
def patch_export(name: str, repo: Path | None, recipes: Path | None) -> None:
    """Write the commits after the 'upstream' tag back as NAME's series: files
    NNNN-slug.patch in patches/NAME/ (git format-patch --zero-commit --no-signature; a
    patch whose commit did not change keeps its file byte for byte), the recipe's patches:
    list edited in place (comments kept), and the old series' files no longer in it
    removed. A series the patch rules refuse, or one that does not apply to the pinned
    source, is refused before anything is written (exit 5)."""
    from ..maintain.patchwork import default_dir, export

    book = _book(recipes)
    recipe = book.load(name)
    repo = repo or default_dir(recipe.name)
    if not repo.is_dir():
        raise ConfigError(f"no patch repository at {repo}",
                          fix=f"run 'wheelforge patch {recipe.name} start' first, or pass "
                              "--from DIR")
    done = export(repo, recipe, book.patches_dir)
    click.echo(f"{recipe.name}: {len(done.patches)} patch(es) in "
               f"{book.patches_dir / recipe.name}")
    for n in done.patches:
        click.echo(f"  {'unchanged' if n in done.kept else 'written  '}  {n}")
    for n in done.removed:
        click.echo(f"  removed    {n}")
    click.echo(f"{done.recipe_file}: " + ("patches: list updated" if done.recipe_changed
                                          else "unchanged"))


_HEX40 = re.compile(r"^[0-9a-f]{40}$")


@patch_group.command("rebase", epilog=EPILOG_SHORT)
@click.option("--onto", required=True, metavar="VERSION|COMMIT|TAG",
              help="sdist recipe: the new version (with --sdist and --sha256). git recipe: a "
                   "tag or a full commit id of the repository (its mirror when one is "
                   "configured).")
@click.option("--sdist", metavar="PATH_OR_URL",
              help="The new version's sdist: a local file or an https URL.")
@click.option("--sha256", metavar="HEX", help="The new sdist's sha256 (verified).")
@click.option("--version", "version", metavar="VERSION",
              help="git recipe: the version the new commit is (default: the tag without "
                   "'v', else the recipe's).")
@click.option("--from", "repo", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="The repository 'patch start' made (default ./patch-work/NAME).")
@sources_option
@cache_option
@git_mirror_option
@recipes_option
@click.pass_obj
def patch_rebase(name: str, onto: str, sdist: str | None, sha256: str | None,
                 version: str | None, repo: Path | None, sources_dirs: tuple[Path, ...],
                 cache_dir: Path | None, git_mirrors: tuple[str, ...],
                 recipes: Path | None) -> None:
    """Move the series onto a new upstream: its tree is committed on top of the old
    'upstream' (which stays as upstream-OLDVERSION) and the patches are replayed with git
    rebase. At the first patch that conflicts it stops and names the patch and the
    places; resolve there, git add, git rebase --continue (or --abort). Exit 5 on a
    conflict."""
    from ..errors import PatchError
    from ..maintain.patchwork import default_dir, rebase

    recipe = _book(recipes).load(name)
    repo = repo or default_dir(recipe.name)
    new_recipe, extra_dirs, pin = _new_pin(recipe, onto, sdist, sha256, version, git_mirrors)
    reporter = Reporter()
    archive = _fetch(new_recipe, cache_dir, sources_dirs + extra_dirs, git_mirrors, reporter)
    conflict = rebase(repo, recipe, archive, new_recipe.sources[0].identity,
                      str(new_recipe.version))
    clear_live()
    if conflict is not None:
        raise PatchError(
            f"patch {conflict.patch} ({conflict.subject}) conflicts with {recipe.name} "
            f"{new_recipe.version} at {', '.join(conflict.places) or 'its files'}",
            why="upstream changed the lines the patch edits; the rebase stopped there and "
                f"{repo} is left mid-rebase",
            fix=f"cd {repo}; resolve the conflict markers, git add the files, git rebase "
                "--continue (git rebase --skip drops the patch, git rebase --abort goes "
                "back); then pin the new source in the recipe and run 'wheelforge patch "
                f"{recipe.name} export'. The new pin:\n" + pin)
    click.echo(f"{repo}: the series applies to {recipe.name} {new_recipe.version}")
    click.echo(f"pin the new source in {recipe.path}:\n{pin}")
    click.echo(f"then: wheelforge patch {recipe.name} export" +
               (f" --from {repo}" if repo != default_dir(recipe.name) else ""))


def _new_pin(recipe: Recipe, onto: str, sdist: str | None, sha256: str | None,
             version: str | None, git_mirrors: tuple[str, ...]
             ) -> tuple[Recipe, tuple[Path, ...], str]:
    from packaging.version import InvalidVersion, Version

    from ..maintain.outdated import remote_refs

    src = recipe.sources[0]
    dirs: tuple[Path, ...] = ()
    if isinstance(src, SdistSource):
        if not sdist or not sha256 or not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise ConfigError("an sdist recipe is rebased onto a new sdist: --onto VERSION "
                              "--sdist PATH_OR_URL --sha256 HEX (64 lowercase hex digits)",
                              fix="e.g. --onto 1.8.0 --sdist https://files.pythonhosted.org/"
                                  "... --sha256 ... ('wheelforge outdated' lists them)")
        new_version = onto
        new_sdist: SdistSource
        if "://" in sdist:
            new_sdist = SdistSource(
                filename=sdist.rsplit("/", 1)[-1].split("#")[0], sha256=sha256, url=sdist)
        else:
            path = Path(sdist)
            if not path.is_file():
                raise ConfigError(f"--sdist {sdist}: no such file",
                                  fix="pass the new release's sdist: a file that exists, or "
                                      "its https URL (with --sha256)")
            new_sdist, dirs = SdistSource(filename=path.name, sha256=sha256), (path.parent,)
        new: GitSource | SdistSource = new_sdist
        pin = (f"  version: \"{new_version}\"\n  sources:\n    - sdist:\n"
               f"        filename: {new_sdist.filename}\n        sha256: {sha256}\n" +
               (f"        url: {new_sdist.url}\n" if new_sdist.url else ""))
    else:
        config = resolve(git_mirrors=git_mirrors)
        tag = None
        if _HEX40.match(onto):
            commit = onto
        else:
            refs = remote_refs(src.url, dict(config.git_mirrors))
            commit = refs.get(f"refs/tags/{onto}") or ""
            tag = onto
            if not commit:
                raise ConfigError(f"--onto {onto}: no such tag in {src.url}",
                                  why="a git recipe is rebased onto a tag or a full commit id",
                                  fix="give a tag the repository has, or a 40-digit commit")
        new_version = version or (tag[1:] if tag and tag[:1] in "vV" else tag) or \
            str(recipe.version)
        new = GitSource(url=src.url, commit=commit, tag=tag)
        pin = (f"  version: \"{new_version}\"\n  sources:\n    - git:\n        url: {src.url}\n"
               f"        commit: {commit}\n" + (f"        tag: {tag}\n" if tag else ""))
    try:
        parsed = Version(new_version)
    except InvalidVersion:
        raise ConfigError(f"{new_version!r} is not a PEP 440 version",
                          fix="give --onto (sdist) or --version (git) a version") from None
    return dataclasses.replace(recipe, version=parsed, sources=(new,)), dirs, pin


@click.command("outdated", epilog=EPILOG_SHORT)
@click.argument("names", nargs=-1)
@click.option("--index-url", default="https://pypi.org", show_default=True, metavar="URL",
              help="The package index asked for releases (its PyPI JSON API, /pypi/NAME/json; "
                   "also $WHEELFORGE_INDEX_URL).", envvar="WHEELFORGE_INDEX_URL")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout, for a "
                                                      "scheduled job.")
@click.option("--no-check", is_flag=True, help="Do not try the series on newer releases.")
@click.option("--timeout", type=float, default=30.0, show_default=True, metavar="SECONDS",
              help="Deadline of each request to the index, every byte of it (at most 3600); "
                   "an sdist tried gets ten times as long.")
@git_mirror_option
@recipes_option
def outdated(names: tuple[str, ...], index_url: str, as_json: bool, no_check: bool,
             timeout: float, git_mirrors: tuple[str, ...], recipes: Path | None) -> None:
    """What upstream has beyond each recipe's pin (all recipes, or NAMES): newer releases
    on the index and, for git recipes, newer tags and commits of the repository (its
    mirror when one is configured), and whether the patch series still applies to each
    newer release (a dry run in a scratch directory: recipes and the source cache are
    never touched). Exit 0 whatever it finds; an unreachable index or repository is
    reported per recipe."""
    from ..maintain.outdated import check_index_url, check_recipes, check_timeout

    check_index_url(index_url)
    check_timeout(timeout)
    book = _book(recipes, nonempty=True)
    loaded = [book.load(n) for n in names] if names else book.load_all()
    config = resolve(git_mirrors=git_mirrors)
    reporter = Reporter()
    reports = check_recipes(loaded, index_url=index_url, timeout=timeout,
                            git_mirrors=dict(config.git_mirrors), try_patches=not no_check,
                            progress=reporter.info)
    clear_live()
    if as_json:
        doc: dict[str, Any] = {"index_url": index_url,
                               "recipes": [r.as_json() for r in reports]}
        click.echo(json.dumps(doc, indent=1))
        return
    rows = [("recipe", "pinned", "upstream", "series")]
    for r in reports:
        rows += r.rows()
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        click.echo(("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) +
                    "  " + row[3]).rstrip())


@click.command("clean", epilog=EPILOG_SHORT)
@cache_option
@click.option("--work-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Where builds unpack and compile (default CACHE/work).")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
def clean(cache_dir: Path | None, work_dir: Path | None, dry_run: bool) -> None:
    """Remove what failed, stopped or killed runs left: build work directories (kept for
    reading after a failure), stack-check venvs and the compile-slot pools of killed
    commands (TMPDIR/wheelforge-jobs-*, or /tmp's where TMPDIR is too deep for their
    socket). A directory a running wheelforge holds is never touched, nor one wheelforge
    cannot prove it made: only your own directories marked by your run lock go (another
    user's, or one without the lock, is kept and named). No link is followed and
    --dry-run writes nothing. Sources, build environments, the compile cache and logs stay.

    \b
    Examples:
      wheelforge clean --dry-run
      wheelforge clean --work-dir /scratch/wf-work
    """
    from .. import workdirs
    from ..builder.compiling.jobserver import DIR_PREFIX, pools_dir

    config = resolve(cache_dir=cache_dir, work_dir=work_dir)
    places = [(config.work_dir, "*"), (config.cache_dir / "stack", "*"),
              (pools_dir(), f"{DIR_PREFIX}*")]
    swept = workdirs.sweep(places, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for path, size in swept.removed:
        click.echo(f"{verb} {path} ({size / 2**20:.1f} MiB)")
    for path, why in swept.kept:
        click.echo(f"kept {path}: {why}")
    total = sum(size for _, size in swept.removed) / 2**20
    named = [str(d if m == "*" else d / m) for d, m in places]
    where = ", ".join(named[:-1]) + f" and {named[-1]}"
    click.echo(f"{verb} {len(swept.removed)} director{'y' if len(swept.removed) == 1 else 'ies'}"
               f" ({total:.1f} MiB) under {where}; kept {len(swept.kept)}")
