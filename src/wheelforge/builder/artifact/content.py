"""What a wheel installs, and the recipe's content rules on it.

Every member of a wheel is mapped to where an installer puts it (the wheel spec's
``NAME.data/`` schemes included: ``purelib`` and ``platlib`` into site-packages,
``scripts`` onto PATH, ``data`` under the prefix, ``headers`` into include/), and the rules
are applied to that place, not to the name in the zip:

* ``verify.top-level``: the modules and packages at the top of site-packages, all of them;
* ``verify.excluded``: paths in site-packages the wheel must not hold;
* always, for every recipe: what runs without being imported is refused unless the
  recipe's ``verify.allow`` names it: a ``.pth`` file at the top of site-packages (site.py
  runs its ``import`` lines at every interpreter start), a ``sitecustomize`` or
  ``usercustomize`` module in any form (also run at start), a command (a console or gui
  script of ``entry_points.txt``, a file of ``.data/scripts`` or a prefix ``bin/``: on
  PATH it may shadow ``python``, ``pip`` or ``sh``); also refused, never allowed: another
  distribution's metadata in site-packages (``*.dist-info``, ``*.egg-info``: its entry
  points would load as plugins), files into the interpreter's standard library, and an
  unknown ``.data`` scheme.
"""

from __future__ import annotations

import configparser
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ...wheel import reading

__all__ = ["ContentRules", "Installed", "content_problems", "installed"]

Where = Literal["site", "command", "prefix", "header"]
SITE_SCHEMES = ("purelib", "platlib")
#: modules the interpreter imports at start by itself (site.py)
STARTUP_MODULES = ("sitecustomize", "usercustomize")
#: commands every Python environment has: a wheel's script of that name replaces them
SHADOWED = frozenset({"python", "python3", "pip", "pip3", "sh", "bash", "env", "ls", "git",
                      "uv", "sudo", "ssh", "nvcc", "gcc", "cc", "ld", "wheelforge"})
_MODULE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyi", ".so", ".pyd")
_METADATA_DIRS = (".dist-info", ".egg-info", ".egg-link", ".egg")
# a prefix path into a Python's library: lib/python3.11/..., local/lib64/python3/...
_PYLIB = re.compile(r"^(?:.*/)?lib(?:64)?/python[0-9][^/]*/(.*)$")
_MAX_ENTRY_POINTS = 1 << 20
_SITE = re.compile(r"^(?:site|dist)-packages/(.+)$")


@dataclass(frozen=True)
class ContentRules:
    """A recipe's ``verify.top-level``, ``verify.excluded`` and ``verify.allow``."""

    top_level: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()


@dataclass(frozen=True)
class Installed:
    """One member of a wheel and where it lands: ``site`` (``path`` relative to
    site-packages), ``command`` (``path`` is the command's name), ``prefix`` (relative to
    the environment's prefix) or ``header``."""

    member: str
    where: Where
    path: str


def installed(names: Iterable[str], dist_info: str) -> tuple[list[Installed], list[str]]:
    """Where each member of a wheel (``names``, its own ``dist_info`` left out) is
    installed, and the problems of members that have no safe place."""
    out: list[Installed] = []
    problems: list[str] = []
    for name in names:
        if name.endswith("/"):
            continue
        first, _, rest = name.partition("/")
        if first == dist_info:
            continue
        if not first.endswith(".data") or not rest:
            out.append(Installed(name, "site", name))
            continue
        scheme, _, path = rest.partition("/")
        if not path:
            problems.append(f"{name}: a file at the top of {first}/, outside any scheme")
        elif scheme in SITE_SCHEMES:
            out.append(Installed(name, "site", path))
        elif scheme == "scripts":
            out.append(Installed(name, "command", path))
        elif scheme == "headers":
            out.append(Installed(name, "header", path))
        elif scheme == "data":
            placed = _prefix_place(name, path)
            if isinstance(placed, str):
                problems.append(placed)
            else:
                out.append(placed)
        else:
            problems.append(f"{name}: an unknown .data scheme {scheme!r} (the wheel format "
                            "knows purelib, platlib, scripts, data, headers)")
    return out, problems


def _prefix_place(name: str, path: str) -> Installed | str:
    """A ``.data/data/`` file: into site-packages, onto PATH, or elsewhere under the
    prefix; a problem (str) for the standard library."""
    lib = _PYLIB.match(path)
    if lib:
        site = _SITE.match(lib.group(1))
        if site:
            return Installed(name, "site", site.group(1))
        return (f"{name}: installs into the interpreter's standard library "
                f"({path}); a wheel never does")
    parts = path.split("/")
    if len(parts) >= 2 and parts[-2] in ("bin", "sbin", "Scripts"):
        return Installed(name, "command", parts[-1])
    return Installed(name, "prefix", path)


def _commands_of_entry_points(text: str, member: str) -> tuple[list[Installed], list[str]]:
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        return [], [f"{member}: not an entry points file ({str(exc).splitlines()[0]})"]
    out = [Installed(member, "command", key.strip())
           for group in ("console_scripts", "gui_scripts") if parser.has_section(group)
           for key in parser[group]]
    return out, []


def _module_of(first: str, is_dir: bool) -> str:
    """The module a top-level entry of site-packages defines (``x.cpython-311.so``: x); a
    file that is no module is named whole."""
    if is_dir:
        return first
    if first.endswith(_MODULE_SUFFIXES) or ".so." in first:
        return first.split(".", 1)[0]
    return first


def _startup_problem(i: Installed, allow: set[str]) -> str | None:
    parts = i.path.split("/")
    top = parts[0]
    if len(parts) == 1 and top.endswith(".pth"):
        if top in allow:
            return None
        return (f"{i.member}: {top} is a .pth file at the top of site-packages: its import "
                "lines run at every interpreter start (allow it by name in verify.allow)")
    candidates = [_module_of(top, len(parts) > 1)]
    if top == "__pycache__" and len(parts) == 2:
        candidates.append(parts[1].split(".", 1)[0])
    for module in candidates:
        hook = next((m for m in STARTUP_MODULES if module.casefold() == m), None)
        if hook is not None and hook not in allow:
            return (f"{i.member}: installs the module {hook}, which the interpreter imports "
                    f"at every start (allow it by name in verify.allow)")
    return None


def _command_problem(i: Installed, allow: set[str]) -> str | None:
    if i.path in allow:
        return None
    what = (f"shadows the {i.path!r} every environment has" if i.path in SHADOWED else
            "a command the recipe does not declare")
    return (f"{i.member}: installs the command {i.path!r} on PATH: {what} (allow it by name "
            "in verify.allow)")


def _site_problems(site: list[Installed], rules: ContentRules) -> list[str]:
    allow = set(rules.allow)
    issues = [p for i in site if (p := _startup_problem(i, allow))]
    for i in site:
        top = i.path.split("/", 1)[0]
        if "/" in i.path and top.endswith(_METADATA_DIRS):
            issues.append(f"{i.member}: installs {top}, another distribution's metadata "
                          "(its entry points would load as plugins)")
    if rules.top_level:
        mods = {_module_of(i.path.split("/", 1)[0], "/" in i.path) for i in site
                if not ("/" not in i.path and i.path.endswith(".pth"))}
        foreign = sorted(mods - set(rules.top_level) - set(STARTUP_MODULES))
        if foreign:
            issues.append(f"top-level module(s) or package(s) the recipe does not ship: "
                          f"{', '.join(foreign)} (verify.top-level: "
                          f"{', '.join(sorted(rules.top_level))})")
    for path in rules.excluded:
        hits = [i.member for i in site if i.path == path or i.path.startswith(path + "/")]
        if hits:
            issues.append(f"{path} is in the wheel ({len(hits)} file(s), e.g. {hits[0]}): "
                          "the recipe excludes it (verify.excluded)")
    return issues


def content_problems(wheel: Path, rules: ContentRules) -> list[str]:
    """Every problem of what ``wheel`` installs against ``rules``, one line each."""
    with reading(wheel) as zf:
        names = zf.namelist()
        dist_infos = sorted({n.split("/", 1)[0] for n in names
                             if n.split("/", 1)[0].endswith(".dist-info")})
        dist_info = dist_infos[0] if len(dist_infos) == 1 else ""
        entry = f"{dist_info}/entry_points.txt"
        size = zf.getinfo(entry).file_size if entry in names else 0
        text = zf.read(entry).decode("utf-8", "replace") if 0 < size <= _MAX_ENTRY_POINTS \
            else ""
    members, issues = installed(names, dist_info)
    if size > _MAX_ENTRY_POINTS:
        issues.append(f"{entry}: {size} bytes, more than an entry points file holds "
                      f"({_MAX_ENTRY_POINTS})")
    commands, bad = _commands_of_entry_points(text, entry)
    issues += bad
    site = [i for i in members if i.where == "site"]
    issues += _site_problems(site, rules)
    allow = set(rules.allow)
    issues += [p for i in [*members, *commands] if i.where == "command"
               and (p := _command_problem(i, allow))]
    return issues
