"""``wheelforge install``: a channel's wheels, with their dependencies, into a venv in one
command, from any directory; the steps are :mod:`wheelforge.consume.venv`'s."""

from __future__ import annotations

import difflib
import os
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .._log import Reporter
from ..consume.venv import Installer
from ..errors import ConfigError, SourceError
from ._options import EPILOG_SHORT, existing_index

if TYPE_CHECKING:
    from packaging.tags import Tag
from .stack import deps_dir_option

#: seconds a served index's constraints file may take, all of it; the most it may hold
FETCH_TIMEOUT_S = 30
CONSTRAINTS_MAX_BYTES = 1 << 20


@click.command("install", epilog=EPILOG_SHORT)
@click.argument("projects", nargs=-1)
@click.option("--python", "target", type=click.Path(path_type=Path),
              help="The venv to install into: its directory (made when it does not exist) or "
                   "its interpreter; an interpreter outside a venv (/usr/bin/python3) is "
                   "refused. Default: the active venv ($VIRTUAL_ENV).")
@click.option("--index", "index", metavar="PATH|URL",
              help="The index: its directory (default: defaults.index of wheelforge.yaml, "
                   "else ./index) or a channel's in it (INDEX/CHANNEL/), or the URL of a "
                   "served channel (http://HOST:8765/CHANNEL/), as the landing page and "
                   "`wheelforge serve` print them.")
@click.option("--channel", help="The channel of a directory index (default: its only "
                                "channel; an error names them when there are several).")
@click.option("--installer", type=click.Choice(["pip", "uv"]), default="pip",
              show_default=True, help="pip writes the venv's pip.conf so that later pip "
                                      "commands keep the wheels; uv installs in one command.")
@deps_dir_option
def install(projects: tuple[str, ...], target: Path | None, index: str | None,
            channel: str | None, installer: str, deps_dir: Path | None) -> None:
    """Install the index's wheels (all of a channel's projects, or PROJECTS) and their
    dependencies into a venv.

    A venv that already holds torch gets the channel built for that torch (its CUDA and
    torch version: cu130-torch2.11 for torch 2.11.0 of CUDA 13.0), so that its torch stays;
    with no such channel, the error names the build command that makes one. --channel
    picks another one (which replaces the venv's torch).

    The wheels come from the index alone and are pinned to their exact local versions
    (1.7.0+cu130torch2.14sm120), so no public index can replace them, now or in later
    `pip install -U` runs in that venv; their dependencies (torch, ...) come from your
    usual index.

    \b
    Examples:
      wheelforge install --python ~/venvs/stack          # every project; venv made if missing
      wheelforge install mamba-ssm --python ~/venvs/stack
      wheelforge install --index /srv/wheelforge/index --channel cu130-torch2.14
      wheelforge install --index http://builder:8765/cu130-torch2.14/ --installer uv
    """
    from ..consume import venv as into

    chosen: Installer = "uv" if installer == "uv" else "pip"
    held = _held_torch(target)
    p, where = _plan(index, channel, held, projects)
    p = _select(p, projects)
    python = _target(target, chosen, Reporter())
    _check_python(python, p.pins, where)

    reporter = Reporter()
    done = into.install(p, python, installer=chosen, deps_dir=deps_dir, say=reporter.info)
    venv = python.parent.parent
    click.echo(f"installed into {venv}: {' '.join(done.pins)}")
    if done.pip_conf is not None:
        click.echo(f"later pip commands in that venv keep these wheels ({done.pip_conf})")
    else:
        click.echo("later uv pip commands need the same --index and --constraint (uv keeps "
                   "no per-venv settings): wheelforge consumer-config --format uv")


def _held_torch(target: Path | None):  # type: ignore[no-untyped-def]
    """The torch of an existing target venv (None: no venv yet, no torch in it, or an
    interpreter that is not a venv's or does not answer the probe)."""
    from ..consume import channelmatch
    from ..consume import venv as into

    if target is None:
        active = os.environ.get("VIRTUAL_ENV")
        if not active or Path(active).resolve() == Path(sys.prefix).resolve():
            return None  # _target says which venv is missing
        target = Path(active)
    if not target.expanduser().exists():
        return None
    try:
        return channelmatch.venv_torch(into.venv_python(target))
    except ConfigError:
        return None  # no venv, or no answer: the checks before the install refuse it


def _plan(index: str | None, channel: str | None, held=None,  # type: ignore[no-untyped-def]
          projects: tuple[str, ...] = ()):
    """The plan and a name for the index, from a directory or a served channel's URL; the
    channel built for ``held`` (the target venv's torch) unless --channel names one."""
    from .. import index as idx
    from ..consume import install as consumer

    if index and index.lower().startswith("file://"):  # a directory, as a URL
        index = urllib.request.url2pathname(urllib.parse.urlsplit(index).path)
    if index and "://" in index:
        if channel:
            raise ConfigError("--channel goes with a directory index",
                              why="a served index's URL names its channel",
                              fix=f"pass --index {index.rstrip('/')}/{channel}/")
        _warn_other_torch(index.rstrip("/").removesuffix("/simple").rsplit("/", 1)[-1], held)
        return _served_plan(index), index
    given = Path(index).expanduser() if index else None
    if (given is not None and (given / "simple").is_dir() and not (given / "files").is_dir()
            and (given.parent / "files").is_dir()):  # a channel's directory, as pages name it
        if channel not in (None, given.name):
            raise ConfigError(f"--index {index} is channel {given.name}, --channel says "
                              f"{channel}", fix="pass one of them")
        given, channel = given.parent, given.name
    index_dir = existing_index(given)
    records = idx.load_records(index_dir)
    if channel is None and held is not None:
        from ..consume import channelmatch

        known = sorted({r.channel for r in records if r.channel})
        names = projects or tuple(sorted({r.project for r in records if r.channel}))
        channel = channelmatch.choose(known, held, names, os.path.abspath(index_dir))
        click.echo(f"channel {channel}: built for the venv's {held.describe()} (kept; "
                   "--channel picks another)", err=True)
    elif channel is not None:
        _warn_other_torch(channel, held)
    if channel is None:
        known = sorted({r.channel for r in records if r.channel})
        if len(known) > 1:
            raise ConfigError(f"{os.path.abspath(index_dir)} has {len(known)} channels",
                              why=f"its channels are: {', '.join(known)}",
                              fix="pass --channel with the one your torch and CUDA match")
        channel = known[0] if known else None
    return (consumer.plan(records, index_dir=index_dir, url=None, channel=channel),
            os.path.abspath(index_dir))


def _warn_other_torch(channel: str, held) -> None:  # type: ignore[no-untyped-def]
    import re

    if not re.match(r"^cu\d+-torch\d+\.\d+$", channel):
        return  # a served index's top, not a channel
    if held is not None and held.channel is not None and held.channel != channel:
        click.echo(f"note: channel {channel} is built for another torch than the venv's "
                   f"{held.describe()} (channel {held.channel}): installing it replaces that "
                   "torch", err=True)


def _served_plan(url: str):  # type: ignore[no-untyped-def]
    """The plan of a served channel: its constraints file, read within a deadline and a
    size cap and parsed as requirements only (an option line is refused, never handed to
    pip)."""
    from ..builder.source.fetch import NetLimits, check_url, fetch_bytes
    from ..consume.install import Plan
    from ..index.pins import CONSTRAINTS_FILE, parse_constraints

    problem = check_url(url)
    if problem:
        raise ConfigError(f"--index {url} cannot be used", why=problem,
                          fix="pass the URL wheelforge serve printed for a channel, e.g. "
                              "http://HOST:8765/cu130-torch2.14/, or the index's directory")
    base = url.rstrip("/")
    if base.endswith("/simple"):
        base = base[: -len("/simple")]
    where = f"{base}/{CONSTRAINTS_FILE}"
    limits = NetLimits(connect_timeout=FETCH_TIMEOUT_S, stall_timeout=FETCH_TIMEOUT_S,
                       deadline=FETCH_TIMEOUT_S, retries=1, max_bytes=CONSTRAINTS_MAX_BYTES)
    try:
        text = fetch_bytes(where, limits, fix=(
            f"check that {url} is the URL wheelforge serve printed for a channel (e.g. "
            f"http://HOST:8765/cu130-torch2.14/) and that the server answers within "
            f"{FETCH_TIMEOUT_S} s")).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where} is not UTF-8 text", why=str(exc),
                          fix="point --index at a wheelforge index") from None
    except SourceError as exc:
        raise ConfigError(f"cannot read {where}", why=exc.why, fix=exc.fix) from None
    pins = tuple(str(r) for r in parse_constraints(text, where)
                 if [s.operator for s in r.specifier] == ["=="])
    if not pins:
        raise ConfigError(f"{where} pins nothing", why="the index holds no installable wheels",
                          fix="build and publish wheels first")
    return Plan(index_url=f"{base}/simple/", constraints=where, pins=pins,
                root=base, files_dir=None)


def _select(p, projects: tuple[str, ...]):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from packaging.utils import canonicalize_name

    if not projects:
        return p
    by_name = {str(canonicalize_name(x.split("==", 1)[0])): x for x in p.pins}
    out = []
    for name in projects:
        key = str(canonicalize_name(name.split("==", 1)[0]))
        if key not in by_name:
            close = difflib.get_close_matches(key, sorted(by_name), n=1)
            raise ConfigError(f"the index has no {name}",
                              why=f"it pins: {', '.join(sorted(by_name))}",
                              fix=f"did you mean {close[0]}?" if close else
                              "leave the projects out to install all of them")
        out.append(by_name[key])
    return replace(p, pins=tuple(out))


def _target(target: Path | None, installer: Installer, reporter: Reporter) -> Path:
    from ..consume import venv as into

    if target is None:
        active = os.environ.get("VIRTUAL_ENV")
        if not active or Path(active).resolve() == Path(sys.prefix).resolve():
            raise ConfigError("which venv?", why="no --python, and no venv is active (other "
                              "than wheelforge's own)",
                              fix="pass --python ~/venvs/stack (made if it does not exist)")
        target = Path(active)
    if not target.expanduser().exists():
        return into.make_venv(target, installer, say=reporter.info)
    return into.venv_python(target)


def _check_python(python: Path, pins: tuple[str, ...], where: str) -> None:
    """The venv's Python must be one the wheels were built for (cp311 wheels: 3.11; a
    cpXY-abi3 wheel: X.Y or later)."""
    from .. import _proc
    from ..wheel import tag_runs_on

    done = _proc.run([str(python), "-c", "import sys; print('cp%d%d' % sys.version_info[:2])"],
                     check=False, timeout=60)
    tag = done.output.strip().splitlines()[-1] if done.output.strip() else "?"
    if done.returncode != 0:
        raise ConfigError(f"{python} does not run", why=tag, fix="pass a working venv")
    wanted = _python_tags(where, pins)
    if wanted and not all(any(tag_runs_on(t, tag) for t in tags) for tags in wanted):
        said = sorted({f"{t.interpreter}-abi3 (or newer)" if t.abi == "abi3" else t.interpreter
                       for tags in wanted for t in tags})
        raise ConfigError(f"{python} is {tag}; the wheels are for {', '.join(said)}",
                          why="a compiled wheel works only with the Python it was built for",
                          fix="make the venv with that Python (python3.X -m venv DIR), or "
                              "build the wheels with --python for this one")


def _python_tags(where: str, pins: tuple[str, ...]) -> list[frozenset[Tag]]:
    """The tags of each pinned compiled wheel of a directory index."""
    from .. import index as idx
    from ..index.pins import is_pure

    if "://" in where:
        return []  # a served index: pip says it when nothing matches
    from packaging.utils import parse_wheel_filename

    tags: list[frozenset[Tag]] = []
    for r in idx.load_records(Path(where)):
        if f"{r.project}=={r.version}" in pins and not is_pure(r.filename):
            tags.append(parse_wheel_filename(r.filename)[3])
    return tags
