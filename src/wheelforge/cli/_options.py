"""Options and look-ups that several commands share: the exit-code epilog, the recipes
directory, the index a command reads, and the click options of those."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..consume.install import Format
from ..errors import ConfigError, WheelforgeError, exit_code_table
from ..recipe.format import RecipeBook

#: The exit-code table of errors.py, as --help shows it (\b keeps click from rewrapping).
EPILOG = "\b\nExit codes:\n" + "\n".join(f"  {code:<4} {meaning}"
                                          for code, meaning in exit_code_table())
#: What a subcommand's --help says instead: the table once, in `wheelforge --help`.
EPILOG_SHORT = "Exit codes: 0 success; the others are listed by `wheelforge --help`."


def book(recipes: Path | None, *, nonempty: bool = False) -> RecipeBook:
    """The recipes: --recipes, else $WHEELFORGE_RECIPES, else ./recipes; the directory must
    exist (and, with ``nonempty``, hold a recipe): never an empty answer to a typo."""
    env = os.environ.get("WHEELFORGE_RECIPES")
    rdir, how = ((recipes, "--recipes") if recipes else (Path(env), "$WHEELFORGE_RECIPES")
                 if env else (Path("recipes"), "the default, ./recipes"))
    book = RecipeBook(rdir, rdir.parent / "patches")
    where = os.path.abspath(rdir)
    fix = ("run wheelforge in the directory that holds recipes/, or point at one with "
           "--recipes DIR or WHEELFORGE_RECIPES=DIR")
    if not rdir.is_dir():
        raise ConfigError(f"no recipes directory at {where}", why=f"looked there ({how})",
                          fix=fix)
    if nonempty and not book.names():
        raise ConfigError(f"no recipes in {where}", why=f"looked for *.yaml there ({how})",
                          fix=fix + "; docs/recipe-format.md describes a recipe")
    return book


def existing_index(index_dir: Path | None, project_file: Path | None = None) -> Path:
    """The index a command reads: --index, else defaults.index of wheelforge.yaml, else
    ./index.  It must hold an index: a typo is an error, and nothing is created."""
    from ..builder.config import project_index

    path = project_index(index_dir, project_file)
    if not ((path / "files").is_dir() or (path / "simple").is_dir()):
        why = (f"{path} does not exist" if not path.exists() else
               f"{path} is not a directory" if not path.is_dir() else
               f"{path} holds neither files/ nor simple/")
        inner = next((p for p in (path.parent, path.parent.parent)
                      if (p / "files").is_dir() and p != path), None)
        fix = (f"that is inside the index {inner}: pass --index {inner}" if inner else
               "pass --index the directory `wheelforge build` publishes into (default "
               "./index, or defaults.index in wheelforge.yaml)")
        raise ConfigError(f"no index at {path}", why=why, fix=fix)
    return path


git_mirror_option = click.option(
    "--git-mirror", "git_mirrors", multiple=True, metavar="URL=PATH",
    help="Fetch the git repository URL from the local mirror PATH (a git bundle or a "
         "repository), never the network; the pinned commit is verified in it. Repeatable; "
         "also $WHEELFORGE_GIT_MIRRORS and git-mirrors in wheelforge.yaml.")

recipes_option = click.option(
    "--recipes", type=click.Path(path_type=Path, file_okay=False), default=None,
    help="Recipes directory (default: ./recipes or $WHEELFORGE_RECIPES); patches are read "
         "from the 'patches' directory beside it.")



config_option = click.option(
    "--config", "project_file", type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Project file with the matrix: section (default ./wheelforge.yaml).")


def instructions(index_dir: Path, url: str | None, channel: str | None, fmt: Format) -> str:
    """consumer.render for the index's current records (the one source of install text)."""
    from .. import index
    from ..consume import install as consumer

    return consumer.render(consumer.plan(index.load_records(index_dir), index_dir=index_dir,
                                         url=url, channel=channel), fmt)


def wheelforge_command() -> str:
    """How to run this wheelforge from any directory: its console script's absolute path
    (beside the interpreter, as a venv has it), else ``PYTHON -m wheelforge``."""
    import shlex
    import sys

    script = Path(sys.executable).with_name("wheelforge")
    if script.is_file():
        return shlex.quote(os.path.abspath(script))
    return f"{shlex.quote(sys.executable)} -m wheelforge"


def uv_command() -> str | None:
    """uv's binary as the install lines name it: the one wheelforge itself runs (its
    ``uv`` dependency, beside the interpreter), an absolute path; None when none is found."""
    import shlex

    from ..builder.env.buildenv import find_uv

    found = find_uv()
    return shlex.quote(os.path.abspath(found)) if found else None


def install_lines(index_dir: Path, url: str | None, channel: str | None) -> str:
    """The one-command install for the index's channel (None: its only channel, or the
    top-level pages), pasteable from any directory: served at ``url`` (a channel's base
    URL, http://HOST:PORT/CHANNEL/) or read from ``index_dir``.  ConfigError when the
    index has nothing to install."""
    from packaging.utils import parse_wheel_filename

    from .. import index
    from ..consume import install as consumer
    from ..index.pins import channels, is_pure

    records = index.load_records(index_dir)
    known = channels(records)
    if channel is None and len(known) == 1:
        channel = known[0]
    simple = f"{url.rstrip('/')}/simple/" if url else None
    p = consumer.plan(records, index_dir=index_dir, url=simple, channel=channel)
    tags = {t.interpreter for r in records if f"{r.project}=={r.version}" in p.pins
            and not is_pure(r.filename) for t in parse_wheel_filename(r.filename)[3]}
    version = None
    if len(tags) == 1 and (tag := tags.pop()).startswith("cp") and tag[2:].isdigit():
        version = f"{tag[2]}.{tag[3:]}"
    where = url.rstrip("/") + "/" if url else os.path.abspath(index_dir)
    lines = consumer.one_command(p, wheelforge=wheelforge_command(), index=where,
                                 channel=None if url else channel, python_version=version,
                                 uv=uv_command())
    dropped = [f"# not pinned: {why}" for why in p.dropped]
    return "\n".join([*dropped, *lines]) + "\n"


def repair_or_warn(index_dir: Path) -> None:
    """Before a read-only command: finish a change a killed writer left in the index; when
    the index cannot be written here, say so and go on with the pages as they are."""
    from .. import index

    try:
        index.repair(index_dir)
    except WheelforgeError as exc:
        click.echo(f"warning: {exc.what}: {exc.why}; going on with the pages as they are "
                   f"({exc.fix})", err=True)
