"""The build environment: an existing interpreter, or a cached managed venv.

A managed environment is created once per (base interpreter, torch
requirement, build requirements) and reused; it is complete only once its
marker file exists, so an interrupted creation is redone, never trusted.

It is made by uv (``uv venv``, then ``uv pip install --link-mode hardlink``: the files
of torch and its CUDA libraries are hard links into uv's cache, not a copy per
environment) with the pip configuration carried over (:mod:`.pipconfig`), and
by ``venv`` + pip where uv cannot serve: no uv binary, or a pip setting or
torch-pip-args option uv has no equivalent for (the progress line says which).  Either
installer resolves the same requirements against the same indexes and constraints (uv
with pip's index strategy), so the environment's key, and the build key, do not
depend on which one made it; the marker records it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:  # a dependency of wheelforge; without it (a partial install) pip makes environments
    import uv as uv_package
except ImportError:  # pragma: no cover
    uv_package = None  # type: ignore[assignment]

from ... import _proc
from ..._fs import ZIP_EPOCH, atomic_write, date_tree, locked
from ...errors import ToolchainError
from . import _probe, envlock, pipconfig

Progress = Callable[[str], None]

#: Always installed into a managed environment besides torch.
BASE_REQUIREMENTS = ("setuptools>=70", "wheel", "ninja", "packaging")
#: pip's network deadlines: seconds per connect or stalled read, and retries of a failed
#: request.  First on pip's command line, so a torch-pip-args of the user's overrides them.
PIP_NET_ARGS = ("--timeout", "30", "--retries", "5")
MARKER = ".wheelforge-env.json"
#: ``WHEELFORGE_INSTALLER``: ``uv`` (the default: pip where uv cannot serve) or ``pip``.
INSTALLER_ENV = "WHEELFORGE_INSTALLER"
#: uv's own variables kept in its environment; the others (UV_INDEX_URL, UV_CONSTRAINT, ...)
#: would make uv resolve differently from pip and are dropped: pip's settings decide.
_UV_KEPT = ("UV_CACHE_DIR", "UV_OFFLINE", "UV_NATIVE_TLS", "UV_SYSTEM_CERTS",
            "UV_CONCURRENT_DOWNLOADS", "UV_CONCURRENT_INSTALLS", "UV_NO_PROGRESS")

#: The probe of an interpreter, run by its file path (only the standard library).
PROBE = os.path.abspath(_probe.__file__)


@dataclass(frozen=True, kw_only=True)
class BuildEnv:
    python: Path
    managed: bool
    python_version: str
    python_tag: str
    torch_version: str | None
    torch_cuda: str | None
    distributions: tuple[tuple[str, str], ...]

    @property
    def bin_dir(self) -> Path:
        return self.python.parent

    @property
    def torch_major_minor(self) -> str | None:
        if self.torch_version is None:
            return None
        return ".".join(self.torch_version.split("+")[0].split(".")[:2])

    def describe(self) -> str:
        """One line; a pure recipe's answer (torch not asked) names the torch installed."""
        installed = dict(self.distributions).get("torch")
        torch = (f"torch {self.torch_version} (CUDA {self.torch_cuda or 'none'})"
                 if self.torch_version else
                 f"torch {installed}, not needed by this build" if installed else "no torch")
        kind = "managed" if self.managed else "given"
        return f"{kind} env {self.python} (Python {self.python_version}, {torch})"


def inspect_env(python: Path, *, with_torch: bool = True, managed: bool = False,
                import_torch: bool = True) -> BuildEnv:
    """Ask ``python`` about itself and its torch: importing it (a ToolchainError names
    a torch that cannot be imported), or with ``import_torch=False`` reading its
    ``torch/version.py`` alone (a ToolchainError only when there is none)."""
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise ToolchainError(f"{python} is not an executable Python interpreter",
                             fix="pass --python the path of your environment's python, "
                                 "e.g. ~/venvs/train/bin/python")
    argv = [str(python), PROBE] + (
        [] if not with_torch else ["--torch"] if import_torch else ["--torch-version"])
    try:
        out = _proc.run(argv).output
    except _proc.CommandFailed as exc:
        raise ToolchainError(f"cannot run {python}", why=exc.tail.strip()[-500:],
                             fix="check that the interpreter works") from exc
    info = json.loads(out.strip().splitlines()[-1])
    if with_torch and info["torch"] is None:
        raise ToolchainError(
            f"torch cannot be imported in {python}" if import_torch else
            f"torch is not installed in {python} (no torch/version.py)",
            why=info["torch_error"] or "torch is not installed",
            fix=f"install torch into that environment ({python} -m pip install torch), or leave "
                "out --python to let wheelforge create a managed environment",
        )
    return BuildEnv(
        python=python, managed=managed, python_version=info["version"], python_tag=info["tag"],
        torch_version=info["torch"], torch_cuda=info["torch_cuda"],
        distributions=tuple(sorted(info["dists"].items())),
    )


Inspect = Callable[..., BuildEnv]


class Inspections:
    """:func:`inspect_env` once per interpreter in one command, for the builds: a build of
    several recipes (and their companions) against one interpreter asks it once, not
    twice per recipe.  torch's version and CUDA are read from its ``torch/version.py``,
    without importing it (3-4 s the builds waited for): the compile's setup.py imports it,
    and a compile that fails asks again with an import (:func:`check_torch_imports`), so a
    broken torch is still named as such.  An answer is reused while the interpreter's
    site-packages directories are unchanged (an install adds or removes entries there, so
    it is asked again); an answer with torch serves a question without.  Owns the
    answers, hence a class."""

    def __init__(self) -> None:
        self._answers: dict[tuple[str, bool, tuple[int, ...], bool], BuildEnv] = {}
        self.asked = 0  # how many times an interpreter was really run
        self._lock = threading.Lock()  # builds running at once ask one at a time

    def inspect(self, python: Path, *, with_torch: bool = True,
                managed: bool = False) -> BuildEnv:
        where = os.path.abspath(python)  # not realpath: a venv's python links to its base
        with self._lock:
            stamp = site_stamp(python)
            for torch in (True,) if with_torch else (True, False):
                found = self._answers.get((where, managed, stamp, torch))
                if found is not None:
                    return found
            env = inspect_env(python, with_torch=with_torch, managed=managed,
                              import_torch=False)
            return self._remember((where, managed, stamp, with_torch), env)

    def installed(self, python: Path, before: BuildEnv) -> BuildEnv:
        """``before``, the answer of a managed environment, once wheelforge installed more
        requirements into it with its torch pinned (:func:`managed_env`): its
        distributions are asked again, its torch is not imported again (the pin kept it
        as it was), and the answer serves the builds beside this one."""
        where = os.path.abspath(python)
        with self._lock:
            light = inspect_env(python, with_torch=False, managed=before.managed)
            env = replace(light, torch_version=before.torch_version,
                          torch_cuda=before.torch_cuda)
            return self._remember((where, before.managed, site_stamp(python),
                                   before.torch_version is not None), env)

    def _remember(self, key: tuple[str, bool, tuple[int, ...], bool], env: BuildEnv
                  ) -> BuildEnv:
        """``env``, the answer of one real run of an interpreter, kept under ``key``
        (where, managed, its site-packages stamp, with torch); the lock held."""
        self.asked += 1
        self._answers[key] = env
        return env


def check_torch_imports(python: Path) -> None:
    """A ToolchainError when ``python`` cannot import its torch (why: the import's
    error); asked after a compile failed, since the builds read torch's version without
    importing it."""
    inspect_env(python, with_torch=True)


def site_stamp(python: Path) -> tuple[int, ...]:
    """The modification times of the site-packages directories of the environment whose
    interpreter is ``python`` (PREFIX/bin/python: PREFIX/lib/python*/site-packages)."""
    prefix = Path(os.path.abspath(python)).parent.parent
    stamps = []
    for site in sorted(prefix.glob("lib/python*/site-packages")):
        with contextlib.suppress(OSError):
            stamps.append(site.stat().st_mtime_ns)
    return tuple(stamps)


def python_tag(python: Path) -> str:
    """``cp311`` for an interpreter, without importing anything heavy."""
    if os.path.realpath(python) in (os.path.realpath(sys.executable),
                                    os.path.realpath(getattr(sys, "_base_executable", ""))):
        return f"cp{sys.version_info[0]}{sys.version_info[1]}"
    out = _proc.run([str(python), "-c", "import sys; print('cp%d%d' % sys.version_info[:2])"])
    return out.output.strip()


def missing_requirements(env: BuildEnv, requirements: Sequence[str]) -> list[str]:
    """The requirements ``env`` does not satisfy (name missing or version outside)."""
    installed = dict(env.distributions)
    missing = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        have = installed.get(str(canonicalize_name(req.name)))
        if have is None or (req.specifier and not req.specifier.contains(have, prereleases=True)):
            missing.append(text if have is None else f"{text} (have {have})")
    return missing


def env_key(base_python: Path, torch_req: str, requirements: Sequence[str],
            pip_args: Sequence[str]) -> str:
    base = os.path.realpath(base_python)
    blob = json.dumps([base, sys.platform, torch_req, sorted(requirements), list(pip_args)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class Installer:
    """What installs a managed environment: ``uv`` (its binary and the options that carry
    the pip configuration over) or ``pip``, and why."""

    kind: str  # "uv" or "pip"
    why: str
    uv: Path | None = None
    uv_args: pipconfig.UvArgs | None = None

    def describe(self) -> str:
        return f"{self.kind} ({self.why})"


def find_uv() -> Path | None:
    """uv's binary: the one the ``uv`` package (a dependency of wheelforge) installed,
    else ``uv`` on PATH."""
    found: str | None = None
    if uv_package is not None:
        with contextlib.suppress(FileNotFoundError):
            found = uv_package.find_uv_bin()
    found = found or shutil.which("uv")
    return Path(found) if found else None


def choose_installer(base_python: Path, pip_args: Sequence[str],
                     environ: Mapping[str, str] | None = None) -> Installer:
    """uv, unless ``WHEELFORGE_INSTALLER=pip``, no uv binary is found, or the pip
    configuration or ``pip_args`` hold a setting uv cannot honour (pip then)."""
    env = os.environ if environ is None else environ
    wanted = env.get(INSTALLER_ENV, "").strip().lower() or "uv"
    if wanted not in ("uv", "pip"):
        raise ToolchainError(f"{INSTALLER_ENV}={wanted!r} is not an installer",
                             fix=f"use uv or pip, or unset {INSTALLER_ENV}")
    if wanted == "pip":
        return Installer(kind="pip", why=f"{INSTALLER_ENV}=pip")
    uv = find_uv()
    if uv is None:
        return Installer(kind="pip", why="no uv binary: pip install uv")
    config = pipconfig.read_pip_config(base_python, Path(sys.executable), environ=env)
    if config is None:
        return Installer(kind="pip", why="pip's configuration could not be read (no pip in "
                         f"{base_python} nor in {sys.executable})")
    mapped = pipconfig.to_uv(config, [*PIP_NET_ARGS, *pip_args])
    if mapped.unsupported:
        return Installer(kind="pip", why="uv has no equivalent of pip's "
                         + ", ".join(mapped.unsupported))
    carried = sorted(k for k in config if "--" + k in pipconfig.CARRIED)
    return Installer(kind="uv", uv=uv, uv_args=mapped,
                     why="pip configuration carried over: " + (", ".join(carried) or "none"))


def managed_env(
    cache_dir: Path,
    *,
    base_python: Path,
    torch_req: str,
    requirements: Sequence[str],
    pip_args: Sequence[str] = (),
    progress: Progress | None = None,
    log: Path | None = None,
    with_torch: bool = True,
    installer: Installer | None = None,
    inspections: Inspections | None = None,
    hold: envlock.Hold | None = None,
) -> BuildEnv:
    """Return the cached venv for (interpreter, torch), creating it if needed.

    One environment serves every recipe built with the same interpreter and
    torch; a recipe's extra requirements are installed into it when missing.
    ``with_torch=False`` (a pure recipe that neither pins torch nor names it in its
    local version) skips reading torch's version when an existing environment is reused.
    ``installer``: chosen by :func:`choose_installer` when None and one is needed;
    ``inspections``: the command's answers (:class:`Inspections`: each environment is
    asked once per command, torch's version read without importing it; after an install
    into it, only its distributions are asked again).
    ``hold``: the build's hold on the environment's use lock, taken here (shared: the
    build releases it when it ends; :mod:`.envlock`).  A change to the environment
    (creating it again, an install) waits until no other process's build holds it.
    """
    say = progress or (lambda _m: None)
    inspections = inspections or Inspections()
    key = env_key(base_python, torch_req, BASE_REQUIREMENTS, pip_args)
    root = cache_dir / "envs" / key
    lock = cache_dir / "envs" / f"{key}.lock"  # who creates or changes it, one at a time
    use = cache_dir / "envs" / f"{key}.use"  # who builds with it (builder/env/envlock.py)
    waited = said_at = 0.0
    while True:
        with locked(lock):
            env: BuildEnv | None = None
            missing: list[str] = []
            if (root / MARKER).is_file() and (root / "bin" / "python").exists():
                if not waited:
                    say(f"reusing build environment {root}")
                env = inspections.inspect(root / "bin" / "python", managed=True,
                                          with_torch=with_torch)
                missing = [m.split(" (")[0] for m in missing_requirements(env, requirements)]
            ready = env is not None and not missing
            if not ready:
                with envlock.changing(use) as ready:
                    if ready:
                        env = _change(root, env, missing, base_python=base_python,
                                      torch_req=torch_req, requirements=requirements,
                                      pip_args=pip_args, say=say, log=log,
                                      installer=installer, inspections=inspections)
            if ready:
                assert env is not None
                date_headers(root)
                if waited:
                    say(f"the build environment is free: waited {waited:.0f}s")
                if hold is not None:
                    hold.take(lock, use)
                return env
        if waited >= said_at:  # at once, then every _SAY_S: whom it waits for, again
            what = (f"install {', '.join(missing)} into" if missing else "create")
            who = ", ".join(envlock.others(use)) or "pid unknown"
            so_far = f"; waiting {waited:.0f}s so far" if waited else ""
            say(f"waiting to {what} the build environment {root}: another wheelforge "
                f"process is building with it ({who}){so_far}; a change now would change "
                f"files under its imports")
            said_at = waited + _SAY_S
        _proc.pause(_WAIT_S)  # Ctrl-C, --timeout: the command stops, and this wait
        waited += _WAIT_S


def date_headers(root: Path) -> int:
    """Date torch's headers in the managed environment at ``root`` at the zip epoch
    (once: later calls find nothing newer).  nvcc's ``-lineinfo`` line tables hold each
    header's date, and uv's hard links carry the date uv unpacked torch on this machine;
    dated so, two machines' environments give the same device code.  The links share
    their files with uv's cache, whose copies take the same date (uv reads none)."""
    return sum(date_tree(include, ZIP_EPOCH)
               for include in sorted(root.glob("lib/python*/site-packages/torch/include")))


#: seconds between a waiting change's looks at the environment's use lock
_WAIT_S = 2.0
#: seconds between a waiting change's lines saying whom it waits for
_SAY_S = 30.0


def _change(root: Path, env: BuildEnv | None, missing: Sequence[str], *, base_python: Path,
            torch_req: str, requirements: Sequence[str], pip_args: Sequence[str],
            say: Progress, log: Path | None, installer: Installer | None,
            inspections: Inspections) -> BuildEnv:
    """Create the environment at ``root`` (``env`` None) or install ``missing`` into it;
    with its creation lock and its use lock held."""
    python = root / "bin" / "python"
    if env is None:
        if root.exists():
            shutil.rmtree(root)
        installer = installer or choose_installer(base_python, pip_args)
        say(f"creating build environment {root} ({torch_req}; with "
            f"{installer.describe()})")
        # the recipe's own requirements in the same install: one resolve, one inspection
        extra = [r for r in requirements if Requirement(r).name.lower() != "torch"]
        try:
            _create(installer, base_python, root, log)
            _install(installer, python, pip_args,
                     [torch_req, *BASE_REQUIREMENTS, *extra], say, log)
        except ToolchainError:
            shutil.rmtree(root, ignore_errors=True)
            raise
        except _proc.CommandFailed as exc:
            shutil.rmtree(root, ignore_errors=True)
            raise ToolchainError(f"cannot create a venv from {base_python}",
                                 why=exc.tail.strip()[-500:],
                                 fix="check that the interpreter has the venv module") from exc
        env = inspections.inspect(python, managed=True)
        atomic_write(root / MARKER, json.dumps({
            "torch": torch_req, "pip_args": list(pip_args),
            "torch_version": env.torch_version,
            "installer": _installer_version(installer)}, indent=1))
        missing = [m.split(" (")[0] for m in missing_requirements(env, requirements)]
    if missing:
        installer = installer or choose_installer(base_python, pip_args)
        say(f"installing {', '.join(missing)} into the build environment (with "
            f"{installer.kind})")
        _install(installer, python, pip_args, [torch_req, *missing], say, log)
        env = inspections.installed(python, env)
    return env


def _installer_version(installer: Installer) -> str:
    if installer.uv is None:
        return installer.kind
    try:
        return _proc.run([str(installer.uv), "--version"], timeout=30).output.strip()
    except _proc.CommandFailed:
        return "uv"


def uv_environ(installer: Installer,
               base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (the process's environment) for uv: its own variables but those in
    :data:`_UV_KEPT` dropped, pip's carried-over settings added."""
    environ = {k: v for k, v in (os.environ if base is None else base).items()
               if not k.startswith("UV_") or k in _UV_KEPT}
    environ.update(installer.uv_args.environ if installer.uv_args else ())
    return environ


def _create(installer: Installer, base_python: Path, root: Path, log: Path | None) -> None:
    if installer.uv is None:
        _proc.run([str(base_python), "-m", "venv", str(root)], log=log)
        return
    _proc.run([str(installer.uv), "venv", "--no-config", "--no-project",
               "--no-python-downloads", "--python", str(base_python), str(root)],
              env=uv_environ(installer), log=log)


def _install(installer: Installer, python: Path, pip_args: Sequence[str],
             requirements: Sequence[str], say: Progress, log: Path | None) -> None:
    """Install ``requirements`` into the environment of ``python`` with ``installer``;
    ``pip_args``: the torch-pip-args (uv got their equivalent in ``installer``)."""
    if installer.uv is None or installer.uv_args is None:
        if not (python.parent / "pip").exists():  # an environment uv made has no pip
            _proc.run([str(python), "-m", "ensurepip", "--default-pip"], log=log)
        _pip_install(python, [*pip_args, *requirements], say, log)
        return
    try:
        _proc.run([str(installer.uv), "pip", "install", "--no-config", "--python", str(python),
                   "--link-mode", "hardlink", *installer.uv_args.args, *requirements],
                  env=uv_environ(installer), log=log, on_line=_uv_progress(say))
    except _proc.CommandFailed as exc:
        raise ToolchainError(
            f"uv could not install {' '.join(requirements)} into the build environment "
            f"{python.parent.parent}",
            why=exc.tail.strip()[-800:],
            fix="check the torch requirement and its index (torch / torch-pip-args in "
                "wheelforge.yaml, pip's configuration) and that the package index is "
                f"reachable; {INSTALLER_ENV}=pip installs with pip instead",
            log=str(log) if log else None,
        ) from exc


def _uv_progress(say: Progress) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        text = line.strip()
        if text.startswith(("Resolved ", "Prepared ", "Installed ")):
            say("uv: " + text[:120])
    return on_line


def _pip_install(python: Path, args: Sequence[str], say: Progress, log: Path | None) -> None:
    try:
        _proc.run([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                   "--progress-bar", "off", *PIP_NET_ARGS, *args], log=log,
                  on_line=_pip_progress(say))
    except _proc.CommandFailed as exc:
        raise ToolchainError(
            f"pip could not install {' '.join(a for a in args if not a.startswith('-'))} into "
            f"the build environment {python.parent.parent}",
            why=exc.tail.strip()[-800:],
            fix="check the torch requirement and its index (torch / torch-pip-args in "
                "wheelforge.yaml) and that the package index is reachable",
            log=str(log) if log else None,
        ) from exc


def _pip_progress(say: Progress) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        if line.startswith(("Collecting ", "Successfully installed")):
            say("pip: " + line.strip()[:120])
    return on_line
