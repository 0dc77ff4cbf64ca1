"""The index's commands: ``wheelforge index rebuild``, ``yank``, ``unyank``, ``serve``,
``consumer-config`` and ``prune``; added to the ``wheelforge`` group by :mod:`.main`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, get_args

import click

from ..consume.install import Format
from ..errors import INTERRUPT_EXIT_CODES, ConfigError, Interrupted
from ._options import EPILOG_SHORT, config_option
from ._options import existing_index as _existing_index
from ._options import install_lines as _install_lines
from ._options import instructions as _instructions
from ._options import repair_or_warn as _repair_or_warn

if TYPE_CHECKING:
    from ..index.records import WheelRecord

index_option = click.option(
    "--index", "index_dir", type=click.Path(path_type=Path, file_okay=False),
    help="The index directory (default: defaults.index of wheelforge.yaml, else ./index).")


@click.group("index")
def index_group() -> None:
    """Maintain the local package index (pages are generated from the files)."""


@index_group.command("rebuild")
@index_option
def index_rebuild(index_dir: Path | None) -> None:
    """Regenerate every page from files/ and the wheels' sidecar records."""
    from .. import index

    index_dir = _existing_index(index_dir)
    n = index.rebuild(index_dir)
    click.echo(f"rebuilt {index_dir}: {n} wheel(s)")


@click.command()
@click.argument("requirement", metavar="NAME==VERSION")
@click.option("--reason", default="", help="Shown to pip users (PEP 592).")
@index_option
def yank(requirement: str, reason: str, index_dir: Path | None) -> None:
    """Yank every file of NAME==VERSION: unpinned installs skip it, exact pins still work."""
    from .. import index

    name, version = _split_pin(requirement)
    index_dir = _existing_index(index_dir)
    _published(index_dir, name, version)
    for f in index.yank(index_dir, name, version, reason):
        click.echo(f"yanked {f}")


@click.command()
@click.argument("requirement", metavar="NAME==VERSION")
@index_option
def unyank(requirement: str, index_dir: Path | None) -> None:
    """Undo `wheelforge yank`."""
    from .. import index

    name, version = _split_pin(requirement)
    index_dir = _existing_index(index_dir)
    if not any(r.yanked is not None for r in _published(index_dir, name, version)):
        click.echo(f"{name}=={version} is not yanked: nothing to do")
        return
    for f in index.unyank(index_dir, name, version):
        click.echo(f"unyanked {f}")


def _published(index_dir: Path, name: str, version: str) -> list[WheelRecord]:
    """The records of NAME==VERSION; a usage error with a did-you-mean when there are
    none (a version without its local label, a misspelt project)."""
    import difflib

    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    from .. import index

    records = index.load_records(index_dir)
    project = canonicalize_name(name)
    mine = [r for r in records if canonicalize_name(r.project) == project]
    try:
        wanted = Version(version)
    except InvalidVersion:
        raise ConfigError(f"{version!r} is not a version", why="PEP 440 says how versions are "
                          "written", fix="copy the pin from the landing page") from None
    found = [r for r in mine if Version(r.version) == wanted]
    if found:
        return found
    if mine:
        same = sorted({r.version for r in mine if Version(r.version).public == wanted.public})
        others = sorted({r.version for r in mine}, key=Version)
        raise ConfigError(
            f"{index_dir} has no wheel of {name}=={version}",
            why=(f"its {name} {'versions are' if len(others) > 1 else 'version is'} "
                 f"{', '.join(others)}"),
            fix=(f"did you mean {name}=={same[-1]}? (the local label is part of the version)"
                 if same else "copy the pin from the landing page"))
    if any(_names_project(f.name, project) for f in (index_dir / "files").glob("*.whl")):
        return []  # its wheels' records are unreadable: the store says which and what to do
    close = difflib.get_close_matches(project, sorted({str(r.project) for r in records}), n=1)
    raise ConfigError(f"{index_dir} has no project {name!r}",
                      why=f"its projects are: {', '.join(sorted({r.project for r in records}))}",
                      fix=f"did you mean {close[0]}?" if close else "check the project name")


def _names_project(filename: str, project: str) -> bool:
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    try:
        return canonicalize_name(parse_wheel_filename(filename)[0]) == project
    except InvalidWheelFilename:
        return False


def _split_pin(requirement: str) -> tuple[str, str]:
    name, sep, version = requirement.partition("==")
    if not sep or not name.strip() or not version.strip():
        raise click.BadParameter(f"{requirement!r}: write NAME==VERSION, e.g. "
                                 "causal-conv1d==1.7.0+cu130torch2.14sm120")
    return name.strip(), version.strip()


@click.command()
@index_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; the default serves this machine only.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port; 0 takes a free one.")
@click.option("--log-requests", is_flag=True, help="Log each request to stderr.")
@click.option("--idle-timeout", default=10.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds a connection may take to send a complete request (idle keep-alive "
                   "and slow clients alike), and to take each 256 KiB of a response.")
@click.option("--max-connections", default=1024, show_default=True,
              type=click.IntRange(1, 1_000_000),
              help="Open connections at most; more wait in the listen queue.")
def serve(index_dir: Path | None, host: str, port: int, log_requests: bool, idle_timeout: float,
          max_connections: int) -> None:
    """Serve the index over HTTP, read-only (HTML and PEP 691 JSON, negotiated).

    Ctrl-C or SIGTERM stops it (exit 130 or 143, as the exit-code table says).  With
    --host 0.0.0.0 (or ::) the banner names this machine's name and addresses, which
    other machines reach, in place of 0.0.0.0.

    \b
    Examples:
      wheelforge serve                              # ./index at http://127.0.0.1:8765/
      wheelforge serve --index /srv/wheels --host 0.0.0.0 --port 8080
      # then, on a machine that reaches it (the banner prints this line, with its name):
      wheelforge install --index http://HOST:8080/cu130-torch2.14/ --python ~/venvs/stack
    """
    from .. import index

    index_dir = _existing_index(index_dir)
    _repair_or_warn(index_dir)
    limits = index.ServeLimits(idle_timeout=idle_timeout, max_connections=max_connections)
    server = index.make_server(index_dir, host, port, quiet=not log_requests, limits=limits)
    bound_port = server.server_address[1]
    url = f"http://{f'[{host}]' if ':' in host else host}:{bound_port}"
    try:  # from here on, Ctrl-C and SIGTERM are the normal way to stop
        banner = _serve_banner(index_dir, host, url, bound_port)

        def ready() -> None:  # printed once the server answers
            click.echo(banner, nl=False)
            sys.stdout.flush()

        server.on_ready = ready
        server.serve_forever()
    except KeyboardInterrupt as exc:  # stopped: said plainly, then the exit code of the
        reason = exc.reason if isinstance(exc, Interrupted) else "Ctrl-C"  # table
        click.echo(f"stopped serving {index_dir} ({reason})", err=True)
        sys.exit(exc.exit_code if isinstance(exc, Interrupted)
                 else INTERRUPT_EXIT_CODES["SIGINT"])
    finally:
        server.server_close()


def _serve_banner(index_dir: Path, host: str, url: str, port: int) -> str:
    """Where the index is served and the install lines, naming an address that other
    machines reach when it is bound to every address (0.0.0.0, ::); the lines' wheelforge
    and uv are this machine's, which the banner says."""
    from ..index.serve import WILDCARD_HOSTS, reachable_hosts

    head = f"serving {os.path.abspath(index_dir)} at {url}/ (read-only); Ctrl-C stops\n"
    if host not in WILDCARD_HOSTS:
        return head + _serve_install_text(index_dir, url)
    hosts = reachable_hosts(host)
    others = [f"http://{h}:{port}/" for h in hosts]
    shown = f"http://{hosts[0]}:{port}" if hosts else f"http://HOST:{port}"
    head += ("other machines reach it at " + " or ".join(others) + "\n" if others else
             f"other machines reach it at http://HOST:{port}/: in the lines below, replace "
             "HOST with this machine's name or address as they know it\n")
    return head + _serve_install_text(index_dir, shown, elsewhere=True)


def _serve_install_text(index_dir: Path, url: str, *, elsewhere: bool = False) -> str:
    """The banner's install lines: the one-command install per channel (the top-level
    pages when the index has no channel); ``elsewhere``: for other machines, whose
    wheelforge and uv are their own."""
    from .. import index
    from ..index.pins import channels

    found: list[str | None] = [*channels(index.load_records(index_dir))]
    text = ("# on another machine, run these with its own wheelforge (a checkout's "
            ".venv/bin/wheelforge) and uv in place of this machine's paths\n"
            if elsewhere else "")
    for channel in found or [None]:
        base = f"{url}/{channel}/" if channel else f"{url}/"
        try:
            body = _install_lines(index_dir, base, channel)
        except ConfigError as exc:  # an empty index is still served
            body = f"# {exc.what}\n"
        text += f"install {'channel ' + channel if channel else 'simple/'}, from any directory:\n"
        text += body
    return text


@click.command("consumer-config")
@index_option
@click.option("--channel", help="The pages of one build target, e.g. cu130-torch2.14 "
                                "(default: the top-level simple/, every wheel).")
@click.option("--url", help="The simple/ URL consumers use (default: file:// of --index); "
                            "e.g. http://HOST:8765/cu130-torch2.14/simple/ for "
                            "`wheelforge serve`.")
@click.option("--format", "fmt", type=click.Choice(get_args(Format)), default="all",
              show_default=True, help="pip (a venv pip.conf and a two-step install), uv "
                                      "(pyproject.toml and uv.toml), or all of them.")
def consumer_config(index_dir: Path | None, channel: str | None, url: str | None,
                    fmt: Format) -> None:
    """Print the pip and uv set-up that installs the local wheels and keeps them through
    later upgrades, even when a public index has the same names at higher versions or
    with other bytes (dependency confusion).  See docs/index.md for what it protects.

    \b
    Examples:
      wheelforge consumer-config                    # pip and uv, every wheel in ./index
      wheelforge consumer-config --format uv >> pyproject.toml
      wheelforge consumer-config --channel cu130-torch2.14 --url http://builder:8765/cu130-torch2.14/simple/
    """
    index_dir = _existing_index(index_dir)
    _repair_or_warn(index_dir)
    text = _instructions(index_dir, url, channel, fmt)
    for line in text.splitlines():
        if line.startswith("# not pinned: "):
            click.echo(f"warning: {line[2:]}", err=True)
    click.echo(text, nl=False)


@click.command(epilog=EPILOG_SHORT)
@click.option("--keep", type=click.IntRange(min=1), help="Builds kept per project and channel "
              "(default: matrix.retention.keep of wheelforge.yaml, else 5).")
@click.option("--index", "index_dir", type=click.Path(path_type=Path, file_okay=False),
              help="The index (default: wheelforge.yaml, else ./index).")
@config_option
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
def prune(keep: int | None, index_dir: Path | None, project_file: Path | None,
          dry_run: bool) -> None:
    """Remove all but the newest builds per project and channel, then regenerate the pages.

    A wheel that the newest build of a channel requires (Requires-Dist) is kept, e.g. the
    fla-core that flash-linear-attention pins. Pages are rewritten without the removed
    wheels before their files are deleted, so no page links a missing file.
    """
    from .. import nightly as night
    from ..recipe.matrix import retention_keep

    target = _existing_index(index_dir, project_file)
    n = keep or retention_keep(project_file)
    result = night.prune(target, n, dry_run=dry_run)
    for name in result.removed:
        click.echo(f"{'would remove' if dry_run else 'removed'} {name}")
    for name, by in result.protected:
        click.echo(f"kept {name} (required by {by})")
    click.echo(f"{'would prune' if dry_run else 'pruned'} {len(result.removed)} wheel(s), "
               f"keeping the newest {n} per project and channel")


INDEX_COMMANDS = (index_group, yank, unyank, serve, consumer_config, prune)
