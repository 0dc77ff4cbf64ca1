"""Put a channel's wheels into a venv the way :mod:`.install` tells users to, in one call:
``wheelforge install`` runs it in the user's venv, the stack gate (:mod:`.stack`) in a
fresh one, so what the gate proves is what users get.

With pip, three steps:

1. the venv's own ``pip.conf`` (pip's "site" file) keeps every later pip command there
   on the local wheels: the index's constraints (the exact local versions) and the local
   index as an extra source.  A local index on disk is given as ``find-links`` (its
   ``files/`` directory): pip then lists one directory instead of asking the index for
   every dependency's page, which printed one "Location ... is ignored" warning per
   dependency.  The settings that the user's and the machine's pip files already give
   for these keys are kept beside ours (pip takes one value per key: the venv's file
   would otherwise hide, say, a global torch cap).  The file is written directly, not
   with ``pip config --site set``, which crashes when ``PIP_CONFIG_FILE=/dev/null``;
2. the pins from the local index alone, without dependencies, whatever pip's
   configuration files say (``PIP_CONFIG_FILE=/dev/null --isolated``);
3. the pins again, pip resolving their dependencies from the usual index (the user's
   configuration), or from a directory of wheels (``deps_dir``, air-gapped).  For a
   scratch venv (the stack check, ``files_by="uv"``) pip resolves them in a dry run and
   uv writes exactly what pip chose, hard-linked from uv's cache (torch and its CUDA
   libraries are about 4 GB that pip unpacks on one core); pip writes them where uv
   cannot serve (no uv binary, a pip setting uv has no equivalent of,
   ``WHEELFORGE_INSTALLER=pip``).

With uv, one ``uv pip install``: the local index first (uv's default ``first-index``
strategy takes every name it holds from it alone) and the constraints.  uv keeps no
per-venv configuration, so later ``uv pip`` commands need the same two options, or a
``uv.toml`` (``wheelforge consumer-config --format uv``).
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .. import _proc
from .._fs import atomic_write
from ..builder.env import buildenv
from ..errors import ConfigError, InstallError
from .install import Plan

Installer = Literal["pip", "uv"]
INSTALLERS: tuple[Installer, ...] = ("pip", "uv")
Progress = Callable[[str], None]

#: pip's network deadlines (as the build environment's)
PIP_NET_ARGS = ("--timeout", "30", "--retries", "3")
#: an install of a channel with its dependencies (torch is large)
INSTALL_TIMEOUT_S = 45 * 60
#: what pip prints when an index cannot be reached at all (not a resolution failure)
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
    r"resolution|Name or service not known|Network is unreachable|No route to host|"
    r"ConnectTimeoutError|Connection refused|ProxyError|No matching distribution found for "
    r"\S+ \(from versions: none\)|Failed to fetch|dns error|error sending request")
#: variables that would point the child at another environment than the venv
FOREIGN_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV",
               "CONDA_PREFIX", "UV_PYTHON", "UV_PROJECT_ENVIRONMENT")
#: the pip.conf keys step 1 sets (the local source depends on the index's transport)
LASTING_KEYS = ("extra-index-url", "find-links", "constraint")


@dataclass(frozen=True, kw_only=True)
class Done:
    """What an install did: the venv's interpreter, its pip.conf (None with uv), and the
    pins installed."""

    python: Path
    pip_conf: Path | None
    pins: tuple[str, ...]
    installer: Installer


def child_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for pip or uv in a venv: the caller's, less what would point it at
    another environment."""
    env = dict(os.environ if environ is None else environ)
    for var in FOREIGN_ENV:
        env.pop(var, None)
    return env


def venv_python(target: Path) -> Path:
    """The interpreter of ``target``: a venv's directory or its interpreter.  ConfigError
    when it is neither."""
    target = Path(os.path.abspath(target.expanduser()))
    if target.is_dir():
        for candidate in (target / "bin" / "python", target / "Scripts" / "python.exe"):
            if candidate.exists():
                return candidate
        raise ConfigError(f"{target} is not a virtual environment (no bin/python in it)",
                          why="wheelforge install installs into a venv",
                          fix=f"make one (python3 -m venv {target}) or name a path that does "
                              "not exist yet: wheelforge install makes the venv there")
    if target.is_file() and os.access(target, os.X_OK):
        return target
    raise ConfigError(f"{target} is neither a venv nor a Python interpreter",
                      why="--python takes a venv's directory (made when it does not exist) "
                          "or its interpreter",
                      fix="pass e.g. --python ~/venvs/stack")


#: what an interpreter says of itself: its prefix and its base's (equal outside a venv)
_PREFIXES = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix]))"


def venv_prefix(python: Path, environ: Mapping[str, str] | None = None) -> Path:
    """The venv ``python`` runs in, as the interpreter itself says (``sys.prefix`` differs
    from ``sys.base_prefix`` only in a venv, whose prefix holds the ``pyvenv.cfg`` that made
    it one).  ConfigError, before anything is written,
    for an interpreter outside a venv (the system's, a conda base, a prefix install):
    wheelforge installs only into a venv, and writes nothing outside it."""
    done = _proc.run([str(python), "-I", "-c", _PREFIXES], env=child_env(environ),
                     check=False, timeout=60)
    try:
        prefix, base = json.loads(done.output.strip().splitlines()[-1])
    except (ValueError, IndexError, TypeError):
        raise ConfigError(f"{python} does not run as a Python interpreter",
                          why=last_error(done.output),
                          fix="pass --python a venv's directory or its interpreter") from None
    if (os.path.realpath(prefix) == os.path.realpath(base)
            or not (Path(prefix) / "pyvenv.cfg").is_file()):
        raise ConfigError(
            f"{python} is not in a virtual environment (its prefix is {prefix})",
            why="wheelforge install installs only into a venv: it writes the venv's pip.conf "
                f"and its packages, and would otherwise change {prefix} for every user of "
                "that interpreter",
            fix=f"make a venv ({python} -m venv ~/venvs/stack) and pass --python "
                "~/venvs/stack, or pass --python a path that does not exist yet: "
                "wheelforge install makes the venv there")
    return Path(prefix)


def make_venv(target: Path, installer: Installer, *, environ: Mapping[str, str] | None = None,
              say: Progress = lambda _: None) -> Path:
    """A new venv at ``target`` (which must not exist) from wheelforge's own interpreter
    (its Python version is the one the wheels were built for); its interpreter."""
    target = Path(os.path.abspath(target.expanduser()))
    if target.exists():
        raise ConfigError(f"{target} exists", why="a new venv is made only where nothing is",
                          fix="name a venv's directory, or a path that does not exist yet")
    base = getattr(sys, "_base_executable", sys.executable)
    say(f"install: a new venv at {target} ({installer}, Python "
        f"{sys.version_info.major}.{sys.version_info.minor})")
    argv = ([uv_binary(), "venv", "--quiet", "--python", base, str(target)]
            if installer == "uv" else [base, "-m", "venv", str(target)])
    done = _proc.run(argv, env=child_env(environ), check=False, timeout=300)
    if done.returncode != 0:
        raise InstallError(f"could not make a venv at {target}", why=last_error(done.output),
                           fix="check that the directory can be written, or make the venv "
                               "yourself and pass it to --python")
    return venv_python(target)


def uv_binary() -> str:
    """uv on PATH, else the one the ``uv`` package installed beside wheelforge."""
    found = shutil.which("uv")
    if found:
        return found
    beside = Path(sys.executable).with_name("uv")
    if beside.exists():
        return str(beside)
    raise ConfigError("uv is not installed", why="--installer uv runs uv pip install",
                      fix="pip install uv (or use --installer pip)")


def lasting_settings(p: Plan) -> dict[str, str]:
    """The venv's pip.conf [global] settings that keep later pip commands on the local
    wheels: the constraints, and the local wheels as find-links (an index on disk) or an
    extra index (a served one)."""
    if p.files_dir is not None:  # a file:// URL: pip splits values on white space
        return {"find-links": p.files_dir.as_uri(), "constraint": p.constraints}
    return {"extra-index-url": p.index_url, "constraint": p.constraints}


def pip_command(python: Path, env: Mapping[str, str]) -> list[str]:
    """pip for the venv of ``python``: its own, else (a venv made without pip, as uv makes
    them) wheelforge's, aimed at it with ``--python``; the venv's pip.conf is read either
    way."""
    has_pip = _proc.run([str(python), "-c", "import pip"], env=env, check=False, timeout=60)
    if has_pip.returncode == 0:
        return [str(python), "-m", "pip"]
    return [sys.executable, "-m", "pip", "--python", str(python)]


def _config_values(pip: Sequence[str], env: Mapping[str, str]) -> dict[str, list[str]]:
    """The values the user's and the machine's pip files (not the venv's, not PIP_*) give
    for :data:`LASTING_KEYS`, per key, in pip's order."""
    found: dict[str, list[str]] = {}
    env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
    for level in ("--global", "--user"):
        done = _proc.run([*pip, "config", level, "list"], env=env,
                         check=False, timeout=60)
        for line in done.output.splitlines():
            match = re.fullmatch(r"(?:global|install)\.([a-z-]+)='(.*)'", line.strip())
            if match and match.group(1) in LASTING_KEYS:
                for value in match.group(2).split():
                    found.setdefault(match.group(1), [])
                    if value not in found[match.group(1)]:
                        found[match.group(1)].append(value)
    return found


def write_pip_conf(venv: Path, settings: Mapping[str, str],
                   inherited: Mapping[str, Sequence[str]], *, root: str) -> Path:
    """Merge ``settings`` into ``venv``/pip.conf's [global] section (every other key and
    section kept; a value of ours first, the inherited ones after it; earlier values for
    the index at ``root``, e.g. another channel's, replaced)."""
    path = venv / "pip.conf"
    parser = configparser.ConfigParser(interpolation=None)
    try:
        if path.exists():
            parser.read_string(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, configparser.Error) as exc:
        raise ConfigError(f"cannot read {path}", why=str(exc).splitlines()[0],
                          fix=f"fix or remove {path}, then run wheelforge install again"
                          ) from None
    if not parser.has_section("global"):
        parser.add_section("global")
    for key, ours in settings.items():
        values = [ours]
        for value in [*parser.get("global", key, fallback="").split(), *inherited.get(key, ())]:
            if value not in values and not _same_index(value, root):
                values.append(value)
        parser.set("global", key, " ".join(values))
    lines: list[str] = []
    for section in parser.sections():
        lines.append(f"[{section}]")
        lines += [f"{k} = {v}" for k, v in parser.items(section, raw=True)]
        lines.append("")
    try:
        atomic_write(path, "\n".join(lines))
    except OSError as exc:
        raise ConfigError(f"cannot write {path}", why=exc.strerror or str(exc),
                          fix="install into a venv you can write (--python), or ask its "
                              "owner") from None
    return path


def _same_index(value: str, root: str) -> bool:
    """``value`` points into the index at ``root`` (a URL; a path for find-links)."""
    as_url = Path(value).as_uri() if value.startswith("/") else value
    return as_url.rstrip("/").startswith(root.rstrip("/"))


def install(p: Plan, python: Path, *, installer: Installer = "pip",
            deps_dir: Path | None = None, environ: Mapping[str, str] | None = None,
            log: Path | None = None, say: Progress = lambda _: None,
            files_by: Installer = "pip") -> Done:
    """Install ``p``'s pins with their dependencies into the venv of ``python``.
    ``files_by="uv"`` (pip only): uv writes the dependencies pip resolved (step 3).

    InstallError (``.stage``: "local" for the wheels themselves, "dependencies" for the
    rest, ``.unreachable`` when an index could not be reached) when pip or uv fail."""
    env = child_env(environ)
    prefix = venv_prefix(python, env)  # before anything is written
    if installer == "uv":
        return _with_uv(p, python, env=env, deps_dir=deps_dir, log=log, say=say)
    pip = pip_command(python, env)
    inherited = _config_values(pip, env)
    conf = write_pip_conf(prefix, lasting_settings(p), inherited, root=p.root)
    for key, value in lasting_settings(p).items():
        var = "PIP_" + key.upper().replace("-", "_")
        if env.get(var) and value not in env[var].split():
            say(f"note: {var} is set in this shell; it replaces the venv's {key} in later pip "
                f"commands there: add {value} to it to keep them on these wheels")
    say(f"install: {len(p.pins)} wheel(s) from the local index alone")
    local = _proc.run([*pip, "install", "--isolated",
                       "--disable-pip-version-check", "--progress-bar", "off", "--no-deps",
                       "--only-binary", ":all:", "--index-url", p.index_url, *p.pins],
                      env={**env, "PIP_CONFIG_FILE": os.devnull}, log=log, check=False,
                      timeout=INSTALL_TIMEOUT_S)
    if local.returncode != 0:
        raise _failed("local", "the local wheels did not install", local.output)
    say("install: their dependencies from " + (str(deps_dir) if deps_dir else
                                               "your usual index (pip's configuration)"))
    source = (["--no-index", "--find-links", str(deps_dir)] if deps_dir
              else list(PIP_NET_ARGS))
    if files_by == "uv" and _pip_resolution_by_uv(pip, p, python, prefix, env=env,
                                                  source=source, log=log, say=say):
        return Done(python=python, pip_conf=conf, pins=p.pins, installer="pip")
    deps = _proc.run([*pip, "install", "--disable-pip-version-check",
                      "--progress-bar", "off", *source, *p.pins], env=env, log=log,
                     check=False, timeout=INSTALL_TIMEOUT_S, on_line=_progress(say))
    if deps.returncode != 0:
        raise _failed("dependencies", "pip could not install their dependencies",
                      deps.output)
    return Done(python=python, pip_conf=conf, pins=p.pins, installer="pip")


def _pip_resolution_by_uv(pip: Sequence[str], p: Plan, python: Path, prefix: Path, *,
                          env: Mapping[str, str], source: Sequence[str],
                          log: Path | None, say: Progress) -> bool:
    """Step 3 with pip's resolution and uv's hands: ``pip install --dry-run --report``
    (what pip would install, with every setting pip reads), then ``uv pip install
    --no-deps`` of exactly those versions, with pip's configuration carried over
    (builder/env/pipconfig.py), then a check that the venv holds what pip chose.  False,
    having installed nothing, when uv cannot serve: pip installs them then."""
    installer = buildenv.choose_installer(python, list(source), environ=env)
    if installer.uv is None or installer.uv_args is None:
        say(f"install: pip writes the dependencies (uv cannot: {installer.why})")
        return False
    report = prefix / "wheelforge-pip-report.json"
    dry = _proc.run([*pip, "install", "--disable-pip-version-check", "--progress-bar", "off",
                     "--dry-run", "--report", str(report), *source, *p.pins],
                    env=env, log=log, check=False, timeout=INSTALL_TIMEOUT_S,
                    on_line=_progress(say))
    if dry.returncode != 0:
        raise _failed("dependencies", "pip could not resolve their dependencies",
                      dry.output)
    try:
        chosen = _report_requirements(report.read_text())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        say(f"install: pip writes the dependencies (its dry run's report is unreadable: "
            f"{exc})")
        return False
    finally:
        report.unlink(missing_ok=True)
    if not chosen:
        return True
    say(f"install: their dependencies as pip resolved them ({len(chosen)}), written by uv "
        "from its cache")
    done = _proc.run([str(installer.uv), "pip", "install", "--no-config", "--python",
                      str(python), "--no-deps", *installer.uv_args.args,
                      *(f"{name} @ {url}" if url else f"{name}=={version}"
                        for name, version, url in chosen)],
                     env={**buildenv.uv_environ(installer, env), "UV_NO_PROGRESS": "1"},
                     log=log, check=False, timeout=INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        raise _failed("dependencies", "uv could not install what pip resolved", done.output)
    listed = _proc.run([*pip, "list", "--format", "json", "--disable-pip-version-check"],
                       env=env, log=log, check=False, timeout=300)
    have = _listed_versions(listed.output)
    wrong = [f"{name}=={version} (venv: {have.get(str(canonicalize_name(name)), 'none')})"
             for name, version, _ in chosen
             if not _same_version(have.get(str(canonicalize_name(name))), version)]
    if wrong:
        err = InstallError("uv did not install what pip resolved",
                           why=", ".join(wrong[:5]),
                           fix=f"run it with {buildenv.INSTALLER_ENV}=pip, which lets pip "
                               "install them, and report the difference")
        err.stage, err.unreachable, err.output = "dependencies", False, done.output
        raise err
    return True


def _listed_versions(output: str) -> dict[str, str]:
    """name -> version from ``pip list --format json`` (its JSON line among any warnings);
    {} when there is none."""
    for line in reversed(output.splitlines()):
        if line.startswith("["):
            try:
                return {str(canonicalize_name(d["name"])): str(d["version"])
                        for d in json.loads(line)}
            except (ValueError, KeyError, TypeError):
                return {}
    return {}


def _same_version(have: str | None, want: str) -> bool:
    try:
        return have is not None and Version(have) == Version(want)
    except InvalidVersion:
        return have == want


def _report_requirements(text: str) -> list[tuple[str, str, str | None]]:
    """(name, version, URL of a direct reference or None) of each distribution a
    ``pip install --report`` says it would install."""
    out = []
    for item in json.loads(text)["install"]:
        meta = item["metadata"]
        url = item["download_info"]["url"] if item.get("is_direct") else None
        out.append((str(meta["name"]), str(meta["version"]), url))
    return out


def _with_uv(p: Plan, python: Path, *, env: Mapping[str, str], deps_dir: Path | None,
             log: Path | None, say: Progress) -> Done:
    source = ["--no-index", "--find-links", str(deps_dir)] if deps_dir else []
    say(f"install: {len(p.pins)} wheel(s) and their dependencies with uv")
    done = _proc.run([uv_binary(), "pip", "install", "--python", str(python),
                      "--index", f"wheelforge={p.index_url}", "--constraint", p.constraints,
                      *source, *p.pins], env={**env, "UV_NO_PROGRESS": "1"}, log=log,
                     check=False, timeout=INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        raise _failed("dependencies", "uv could not install the wheels", done.output)
    return Done(python=python, pip_conf=None, pins=p.pins, installer="uv")


def _progress(say: Progress) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        if line.startswith("Collecting "):
            say(f"install: pip: {line.strip()[:100]}")
    return on_line


def last_error(output: str) -> str:
    """The line of pip's or uv's output that says what went wrong."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(("ERROR", "error:", "×", "╰─▶"))]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:300]


def _failed(stage: str, what: str, output: str) -> InstallError:
    unreachable = bool(UNREACHABLE.search(output))
    fix = ("check the network or proxy settings, or pass --deps-dir with the dependencies' "
           "wheels" if unreachable else "see pip's message above; the venv may hold some "
           "of the wheels: run the command again once the cause is fixed")
    err = InstallError(what, why=last_error(output), fix=fix)
    err.stage = stage
    err.unreachable = unreachable
    err.output = output
    return err
