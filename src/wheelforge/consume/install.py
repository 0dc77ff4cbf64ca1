"""What consumers run to install wheelforge's wheels and keep them, even when a public
index offers the same names at higher versions or with other bytes (dependency
confusion).  :func:`render` is the one place the install instructions come from: the
last lines of ``build``, ``serve``'s banner, the landing page and ``consumer-config``.

Three things together protect an install, also the commands users run later:

* every published wheel carries a local version label (``1.7.0+cu130torch2.14sm120``,
  ``0.6.0+wf`` for pure wheels).  PyPI accepts no local versions, so no public upload
  can carry the exact version, while ``fla-core==0.6.0`` in a dependent's metadata still
  matches ``0.6.0+wf`` (PEP 440 ignores the label when the specifier has none);
* the index publishes ``constraints.txt`` (and ``<channel>/constraints.txt``) with the
  exact newest version of each project, regenerated with the pages.  pip reads it from
  the venv's ``pip.conf`` (``constraint = ...``) on every command; uv projects get the
  same pins as ``constraint-dependencies``, which bind transitive dependencies and
  extras too (``[tool.uv.sources]`` binds direct dependencies only);
* the first install sees the local index alone: ``PIP_CONFIG_FILE=/dev/null`` skips
  every pip configuration file (``--isolated`` skips only the user's file and the
  ``PIP_*`` variables), and for uv the local index comes first, where uv's default
  ``first-index`` strategy takes a name it holds from it alone.

This module renders text only; it never reads the index (the records come in). The pins
and the constraints text the index's own pages show are :mod:`wheelforge.index.pins`'.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import ConfigError
from ..index import WheelRecord
from ..index.pins import CONSTRAINTS_FILE, channels, first_command, newest, pin

Format = Literal["pip", "uv", "all"]
FORMATS: tuple[Format, ...] = ("pip", "uv", "all")
UV_INDEX_NAME = "wheelforge"


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Everything the instructions name: where the index is, its constraints, the pins."""

    index_url: str  # the simple/ URL, with a trailing slash
    constraints: str  # the URL (file:// for a local index) of the matching constraints.txt
    pins: tuple[str, ...]  # NAME==VERSION, the newest non-yanked version per project
    dropped: tuple[str, ...] = ()  # "project: why" for each project left out of the pins
    root: str = ""  # the URL of the index's top (file:// for a local index)
    files_dir: Path | None = None  # a local index's files/ (None when served)


def plan(records: Sequence[WheelRecord], *, index_dir: Path, url: str | None,
         channel: str | None) -> Plan:
    """The plan for the pages of ``channel`` (None: the top-level ``simple/``), served at
    ``url`` (None: the ``file://`` URL of ``index_dir``).  ConfigError for a channel the
    index does not have, an index without wheels, or a URL that is not a ``simple/``."""
    known = channels(records)
    if channel is not None and channel not in known:
        raise ConfigError(
            f"{index_dir} has no channel {channel!r}",
            why=f"its channels are: {', '.join(known) or 'none (only channel-less wheels)'}",
            fix="pass one of those to --channel, or leave --channel out for the top-level "
                "simple/")
    chosen, dropped = newest(records, channel)
    if not chosen:
        raise ConfigError(f"{index_dir} holds no installable wheels"
                          + (f" for channel {channel}" if channel else ""),
                          why="; ".join(dropped) or "the index is empty",
                          fix="build and publish a wheel first (wheelforge build NAME)")
    root = index_dir.resolve() / channel if channel else index_dir.resolve()
    if not (root / CONSTRAINTS_FILE).is_file():
        raise ConfigError(f"{root / CONSTRAINTS_FILE} does not exist",
                          why="the index was written by an older wheelforge",
                          fix=f"run wheelforge index rebuild --index {index_dir}")
    if url:
        index_url = url.rstrip("/") + "/"
        base, _, simple = index_url.rstrip("/").rpartition("/")
        if simple != "simple" or "://" not in index_url:
            raise ConfigError(f"--url {url} is not the URL of an index's simple/ pages",
                              why="the constraints file lies beside simple/, so the URL must "
                                  "end in /simple/",
                              fix="pass e.g. http://HOST:8765/simple/ or "
                                  "http://HOST:8765/cu130-torch2.14/simple/")
        constraints = f"{base}/{CONSTRAINTS_FILE}"
        top = base[: -len(channel) - 1] if channel and base.endswith("/" + channel) else base
        files_dir = None
    else:
        index_url = (root / "simple").as_uri() + "/"
        constraints = (root / CONSTRAINTS_FILE).as_uri()  # pip splits paths on spaces
        top = index_dir.resolve().as_uri()
        files_dir = index_dir.resolve() / "files"
    return Plan(index_url=index_url, constraints=constraints,
                pins=tuple(pin(r.project, r.version) for r in chosen), dropped=tuple(dropped),
                root=top, files_dir=files_dir)


def pip_lines(p: Plan) -> list[str]:
    """The pip commands, in order: the venv's configuration, then the install."""
    q = shlex.quote
    pins = " ".join(q(x) for x in p.pins)
    return [
        "# pip, in the venv you install into (python: that venv's interpreter).",
        "# 1. Its pip.conf keeps every later pip command there (pip install -U, installing a",
        "#    package that needs these) on the local wheels: the constraints pin their exact",
        "#    local versions, and the local index stays reachable.  pip takes one value",
        "#    per setting: an extra-index-url or constraint of your user or global pip",
        "#    config is replaced in this venv, so add it to the value, space-separated",
        "#    (python -m pip config list shows them).",
        f"python -m pip config --site set global.extra-index-url {q(p.index_url)}",
        f"python -m pip config --site set global.constraint {q(p.constraints)}",
        "# 2. The local wheels from the local index alone, whatever pip's configuration files",
        "#    say (--isolated alone would still read them):",
        first_command(p.index_url, p.pins),
        "# 3. Their dependencies (torch, ...) from your usual index; the installed pins stay:",
        f"python -m pip install {pins}",
    ]


def _toml_list(items: Sequence[str], indent: str) -> list[str]:
    # a JSON string is a valid TOML basic string
    return [f"{indent}{json.dumps(x)}," for x in items]


def uv_lines(p: Plan) -> list[str]:
    """A pyproject.toml fragment (valid TOML) and, commented, the uv.toml and command for
    ``uv pip``."""
    url = json.dumps(p.index_url)
    pins = " ".join(shlex.quote(x) for x in p.pins)
    return [
        "# uv projects, in pyproject.toml.  The local index comes before the default one, and",
        "# uv's default first-index strategy takes every name it holds from it alone; the",
        "# constraints pin the exact local versions for every dependency, direct, transitive",
        "# or through an extra, in uv lock, uv lock --upgrade and uv sync.  Run",
        "# wheelforge consumer-config again after publishing new versions.",
        "[tool.uv]",
        "constraint-dependencies = [",
        *_toml_list(p.pins, "    "),
        "]",
        "",
        "[[tool.uv.index]]",
        f'name = "{UV_INDEX_NAME}"',
        f"url = {url}",
        "",
        "# uv pip: the same settings, without the `tool.uv.` prefix, in a uv.toml: the one in",
        "# ~/.config/uv/ applies to every uv command of this user, one in the directory you",
        "# run uv from to that directory:",
        "#   constraint-dependencies = [",
        *_toml_list(p.pins, "#       "),
        "#   ]",
        "#   [[index]]",
        f'#   name = "{UV_INDEX_NAME}"',
        f"#   url = {url}",
        "# The first install, safe with or without that file:",
        f"# uv pip install --index {shlex.quote(f'{UV_INDEX_NAME}={p.index_url}')} "
        f"--constraint {shlex.quote(p.constraints)} {pins}",
    ]


#: the venv the printed one-command install names (made when it does not exist)
EXAMPLE_VENV = "~/venvs/stack"


def one_command(p: Plan, *, wheelforge: str, index: str, channel: str | None,
                python_version: str | None, venv: str = EXAMPLE_VENV,
                uv: str | None = None) -> list[str]:
    """The install as users paste it, from any directory, again after a new build:
    ``wheelforge install`` (pip, with the lasting venv settings) and uv's one line (the venv
    made when missing; project names: the constraints pin them).
    ``wheelforge``: how to run wheelforge (an absolute path); ``uv``: uv's binary (an
    absolute path; None: not found, the line says how to get it); ``index``: the --index
    argument (an absolute path or the served channel's URL); ``python_version``: "3.11"
    for cp311 wheels (None: any)."""
    q = shlex.quote
    args = f" --index {q(index)}" + (f" --channel {q(channel)}" if channel else "")
    uv_python = f" --python {python_version}" if python_version else ""
    how_uv = ([] if uv else ["# (uv is not installed here: pip install uv, or see "
                             "https://docs.astral.sh/uv/; then run it as uv)"])
    uv = uv or "uv"
    return [
        "# install every wheel with its dependencies into a venv (made if missing); its",
        "# pip.conf keeps these wheels in later pip commands there (pip install -U):",
        f"{wheelforge} install{args} --python {venv}",
        "# or with uv alone; uv keeps no per-venv settings: later uv pip commands in that",
        "# venv need the same --index and --constraint (wheelforge consumer-config --format uv):",
        *how_uv,
        # `uv venv` refuses a venv that exists (the pip line's, or this line's pasted
        # again after a new build): made only when missing, as `wheelforge install` does
        f"test -d {venv} || {uv} venv{uv_python} {venv} && {uv} pip install --python {venv} "
        f"--index {q(f'{UV_INDEX_NAME}={p.index_url}')} --constraint {q(p.constraints)} "
        + " ".join(q(x.split("==", 1)[0]) for x in p.pins),
    ]


def render(p: Plan, fmt: Format = "all") -> str:
    """The install instructions: pip's, uv's or both, and the projects left out."""
    lines = [f"# not pinned: {why}" for why in p.dropped]
    if fmt in ("pip", "all"):
        lines += pip_lines(p)
    if fmt == "all":
        lines.append("")
    if fmt in ("uv", "all"):
        lines += uv_lines(p)
    return "\n".join(lines) + "\n"
