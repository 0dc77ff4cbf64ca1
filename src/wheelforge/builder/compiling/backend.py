"""Run the PEP 517 build (pypa/build, no isolation) in the build environment."""

from __future__ import annotations

import contextlib
import re
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import build as pypa_build
from packaging.requirements import Requirement
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion

from ... import _proc
from ...errors import BuildError, ToolchainError, VerifyError
from ..env.buildenv import BuildEnv, missing_requirements
from . import _hookrun
from .diagnose import diagnose, first_error_line

NINJA_PROGRESS = re.compile(r"^\[(?P<done>\d+)/(?P<total>\d+)\]\s")

#: The script that runs pyproject_hooks' hook script in the build environment's
#: interpreter: ``_hookrun.py``'s text (see there why), written to a directory of its own
#: as ``hookrun.py``.  :data:`RUN_HOOK` is the same without the early ending
#: (bench/hook_exit.py runs it alone, for the interpreter's usual exit).
HOOK_RUNNER = Path(_hookrun.__file__).read_text(encoding="utf-8")
RUN_HOOK = HOOK_RUNNER.replace("\n    end_early()\n", "\n")


_ROUTES: dict[int, list[str]] = {}  # thread -> the warnings its build backend raised
_ROUTES_LOCK = threading.Lock()
_CALLERS: list[Any] = []  # the filters and showwarning to give back when no build runs


def _route(message: Warning | str, category: type[Warning], filename: str, lineno: int,
           file: TextIO | None = None, line: str | None = None) -> None:
    caught = _ROUTES.get(threading.get_ident())
    if caught is None:  # another thread's warning: shown as the caller would show it
        _CALLERS[1](message, category, filename, lineno, file, line)
        return
    caught.append(f"warning from the build backend ({category.__name__}): {message}\n")


@contextlib.contextmanager
def backend_warnings_to(log: Path | None) -> Iterator[None]:
    """The warnings a build backend raises (pyproject_hooks re-raises them here as
    BuildBackendWarning: setuptools' deprecation banners, torch's NumPy notice) go to the
    build's log, not between wheelforge's step lines.

    warnings.catch_warnings is one state for the whole process, which builds running at
    once in threads would restore out of order (and leave a recorder installed); so the
    hook is installed by the first build, routes each warning to the log of the thread
    that raised it, and goes when the last build is done."""
    me = threading.get_ident()
    caught: list[str] = []
    with _ROUTES_LOCK:
        if not _ROUTES:
            _CALLERS[:] = [list(warnings.filters), warnings.showwarning]
            warnings.simplefilter("always")
            # the garbage of any thread, not the backend's: ignored as Python does
            warnings.simplefilter("ignore", ResourceWarning)
            warnings.showwarning = _route
        _ROUTES[me] = caught
    try:
        yield
    finally:
        with _ROUTES_LOCK:
            del _ROUTES[me]
            if not _ROUTES:
                filters, show = _CALLERS
                warnings.filters[:] = filters  # type: ignore[index]
                warnings._filters_mutated()  # type: ignore[attr-defined]
                warnings.showwarning = show
        if log is not None and caught:
            with contextlib.suppress(OSError), log.open("a", encoding="utf-8") as f:
                f.writelines(caught)


def build_system_requires(tree: Path, env: BuildEnv, log: Path | None = None
                          ) -> tuple[str, ...]:
    with backend_warnings_to(log):
        return tuple(sorted(pypa_build.ProjectBuilder(tree, python_executable=str(env.python))
                            .build_system_requires))


def check_build_requires(tree: Path, env: BuildEnv, extra: tuple[str, ...], project: str,
                         log: Path | None = None) -> None:
    """Without isolation the build environment must already hold every requirement."""
    wanted: dict[str, str] = {}  # pyproject's and the recipe's: each requirement once
    for text in (*build_system_requires(tree, env, log), *extra):
        wanted.setdefault(str(Requirement(text)), text)
    require(env, list(wanted.values()), project)


def require(env: BuildEnv, requirements: list[str], project: str) -> None:
    """ToolchainError naming every requirement ``env`` lacks, with the pip command."""
    missing = missing_requirements(env, requirements)
    if missing:
        raise ToolchainError(
            f"the build environment lacks what {project} needs to build",
            why=f"{env.python} is missing: {', '.join(missing)}",
            fix=f"{env.python} -m pip install "
            + " ".join(f"'{m.split(' (')[0]}'" for m in missing),
        )


def build_wheel(
    *,
    tree: Path,
    env: BuildEnv,
    environ: Mapping[str, str],
    out_dir: Path,
    log: Path,
    on_line: Callable[[str], None] | None = None,
    jobs: int | None = None,
    stored: bool = False,
) -> Path:
    """Build one wheel from ``tree`` into ``out_dir``; the full output goes to ``log``.

    ``stored``: ask setuptools' bdist_wheel for a wheel without compression
    (``--compression=stored``) when the project builds with setuptools: the pipeline
    rewrites every member of the wheel when it relabels it, deflating it then, so the
    backend's deflating of a large extension (1-2 s of one core for a 50-100 MB ``.so``,
    at the end of the compile) was work thrown away."""

    def runner(cmd: Sequence[str], cwd: str | None = None,
               extra_environ: Mapping[str, str] | None = None) -> None:
        merged = dict(environ)
        merged.update(extra_environ or {})
        _proc.run([cmd[0], str(runner_script), *cmd[1:]], cwd=Path(cwd) if cwd else None,
                  env=merged, log=log, on_line=on_line, keep_output=False)

    out_dir.mkdir(parents=True, exist_ok=True)
    builder = pypa_build.ProjectBuilder(tree, python_executable=str(env.python), runner=runner)
    settings = {"--build-option": ["--compression=stored"]} if stored and any(
        Requirement(r).name == "setuptools" for r in builder.build_system_requires) else None
    with tempfile.TemporaryDirectory(prefix="wf-dist-", dir=out_dir.parent) as tmp:
        runner_script = Path(tmp) / "hook" / "hookrun.py"  # alone in its directory
        runner_script.parent.mkdir()
        runner_script.write_text(HOOK_RUNNER, encoding="utf-8")
        try:
            with backend_warnings_to(log):
                built = Path(builder.build("wheel", Path(tmp) / "dist",
                                           config_settings=settings))
        except _proc.CommandFailed as exc:
            raise failure(tree.name, exc, log, jobs) from exc
        except pypa_build.BuildBackendException as exc:
            # pypa/build wraps whatever the runner raised
            inner = exc.exception
            if isinstance(inner, _proc.CommandFailed):
                raise failure(tree.name, inner, log, jobs) from inner
            raise BuildError(f"the build backend of {tree.name} failed", why=str(exc),
                             fix="read the log", log=str(log)) from exc
        except pypa_build.BuildException as exc:
            raise BuildError(f"the build of {tree.name} failed", why=str(exc),
                             fix="check the project's pyproject.toml", log=str(log)) from exc
        check_wheel_name(built.name, tree.name, log)
        final = out_dir / built.name
        built.replace(final)
    return final


def check_wheel_name(name: str, what: str, log: Path | None = None) -> None:
    """A VerifyError (never a traceback) when a build backend named its wheel in a way
    :func:`packaging.utils.parse_wheel_filename` refuses."""
    try:
        parse_wheel_filename(name)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise VerifyError(f"the build backend of {what} wrote {name!r}, not a valid wheel "
                          "file name; nothing was published", why=str(exc),
                          fix="a wheel is NAME-VERSION(-BUILD)-PYTHON-ABI-PLATFORM.whl: fix "
                              "the project's build configuration (its name, version or tags) "
                              "with a patch in the recipe",
                          log=str(log) if log else None) from None


def failure(what: str, exc: _proc.CommandFailed, log: Path, jobs: int | None) -> BuildError:
    """A BuildError that names the known cause (failures.yaml) or the first error line."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = exc.tail
    if exc.returncode in (-9, 137):  # SIGKILL: on a build machine, the OOM killer
        # worded as the shell words it, which WF-D009's patterns know
        text += "\nwheelforge: the build backend was killed by SIGKILL (exit status 137)\n"
    found = diagnose(text, jobs=jobs)
    if found:
        d = found[0]
        return BuildError(
            f"the build of {what} failed: {d.title} [{d.id}]",
            why=f"{d.cause}\n  log line {d.line_no}: {d.line[:300]}",
            fix=d.fix, log=str(log))
    first = first_error_line(text)
    tail = "\n    ".join(exc.tail.rstrip().splitlines()[-15:])
    return BuildError(
        f"the build of {what} failed (exit status {exc.returncode})",
        why=(f"first error, log line {first[0]}: {first[1][:300]}" if first
             else "no error line recognized") + f"\n  last lines:\n    {tail}",
        fix="read the log; if this is an upstream problem, fix it with a patch in the recipe",
        log=str(log))
