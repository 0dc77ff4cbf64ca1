"""The stack gate: a channel's wheels installed together, with their dependencies, the way
the printed pip install does, then imported together in one interpreter.

Each wheel is verified alone when it is built; users install the whole channel into one
venv, where one package's dependencies can break another's import (mamba-ssm's
requirements once brought a tilelang that took ``import fla`` down).  :func:`check` makes
a fresh venv from the given interpreter and installs the channel into it with
:func:`wheelforge.consume.venv.install`, the steps ``wheelforge install`` runs in a user's
venv (the venv's ``pip.conf``, the pins from the local index alone, then their
dependencies from the usual index or ``deps_dir``, as pip resolves them: in this scratch
venv uv writes the files pip chose, from its cache, where it can), then ``pip check``,
and one
interpreter that imports ``torch`` and every recipe's ``verify.imports`` and
``verify.stack-imports`` (and each wheel's top-level packages).
A failing import is traced to the distributions its traceback went through, and the
first dependency among them is named with the requirement chain that installed it.

Where the dependencies cannot be reached (no network and no ``deps_dir``) the status is
"not checked" with the reason: never "good" for what could not be checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from packaging.markers import UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from .. import _proc, index, workdirs
from ..errors import InstallError
from ..index import health
from ..index.health import ImportOutcome, StackStatus
from ..index.pins import is_pure
from ..recipe.format import RecipeBook
from ..wheel import interpreter_fits
from . import _stackimports, stackinputs
from . import venv as into
from .install import plan as install_plan
from .stackinputs import modules_to_import

Progress = Callable[[str], None]

#: The importer, run by its file path in the stack's venv, and its answer line's mark.
IMPORTER = os.path.abspath(_stackimports.__file__)
MARK = _stackimports.MARK


#: How long the imports may take: a module that blocks at import is stopped then, and the
#: stack is broken ("the import check did not finish: ... timed out after 900 s")
IMPORT_TIMEOUT_S = 900.0


@dataclass(frozen=True, kw_only=True)
class StackOptions:
    python: Path  # the interpreter the venv is made from
    work_dir: Path  # the venv goes under it, and is removed after
    log_dir: Path  # the check's log (pip's output, the import tracebacks) is kept there
    deps_dir: Path | None = None  # dependency wheels (air-gapped): pip --no-index from it
    environ: Mapping[str, str] | None = None


def requirement_chains(dists: Mapping[str, Mapping[str, object]], roots: Iterable[str],
                       target: str) -> list[str]:
    """"a -> b -> target" for each shortest path from a root to ``target`` through the
    installed distributions' unconditional requirements (extras not requested are left
    out, as pip leaves them)."""
    graph: dict[str, list[str]] = {}
    for name, info in dists.items():
        deps: list[str] = []
        requires = info.get("requires", [])
        for text in requires if isinstance(requires, list) else []:
            try:
                req = Requirement(str(text))
                if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                    continue
            except (InvalidRequirement, UndefinedComparison, UndefinedEnvironmentName):
                continue
            deps.append(canonicalize_name(req.name))
        graph[name] = deps
    chains = []
    for root in roots:
        frontier: list[list[str]] = [[root]]
        seen = {root}
        found = None
        while frontier and found is None:
            nxt = []
            for path in frontier:
                for dep in graph.get(path[-1], []):
                    if dep == target:
                        found = [*path, dep]
                        break
                    if dep not in seen:
                        seen.add(dep)
                        nxt.append([*path, dep])
                if found:
                    break
            frontier = nxt
        if found:
            chains.append(" -> ".join(found))
    return chains


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class EarlyVenv:
    """A check's fresh venv, made before the check is asked for: a command that builds and
    then checks its stack starts one with its builds, so that ``python -m venv`` (3-5 s of
    one core, most of it ensurepip installing pip) runs beside the compiles instead of at
    the end.  The venv is the one :func:`check` would make (the same command, in a
    directory under the same work directory, claimed for this run); a check that takes it
    owns it from then on, and :meth:`close` removes one nobody took.  Where it could not
    be made (or from another interpreter) the check makes its own as before, and a
    failure is reported from there.  Owns a thread and a directory, hence a class."""

    def __init__(self, python: Path, work_dir: Path,
                 environ: Mapping[str, str] | None = None) -> None:
        self.python = python
        work_dir.mkdir(parents=True, exist_ok=True)
        self._work = Path(tempfile.mkdtemp(prefix="stack-", dir=work_dir))
        self._claimed: contextlib.ExitStack | None = contextlib.ExitStack()
        self._claimed.enter_context(workdirs.claim(self._work))
        self._made: _proc.Completed | BaseException | None = None
        self._thread = threading.Thread(target=self._make, args=(into.child_env(environ),),
                                        daemon=True, name="wheelforge-stack-venv")
        self._thread.start()

    def _make(self, env: Mapping[str, str]) -> None:
        try:
            self._made = _proc.run([str(self.python), "-m", "venv", str(self._work / "venv")],
                                   env=env, check=False, timeout=300)
        except BaseException as exc:  # the command stops: the check is not asked for
            self._made = exc

    def __enter__(self) -> EarlyVenv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def take(self, python: Path) -> tuple[Path, contextlib.ExitStack, str] | None:
        """Wait for the venv; its directory (with the venv in ``venv``), what holds it (the
        caller closes that, then removes the directory) and what ``python -m venv`` said;
        None when it was made from another interpreter, failed or was taken."""
        self._thread.join()
        made, claimed = self._made, self._claimed
        if claimed is None or python != self.python or not isinstance(made, _proc.Completed) \
                or made.returncode != 0:
            return None
        self._claimed = None
        return self._work, claimed, made.output

    def close(self) -> None:
        """Remove the venv unless a check took it."""
        self._thread.join()
        if self._claimed is not None:
            self._claimed.close()
            self._claimed = None
            shutil.rmtree(self._work, ignore_errors=True)


def check(index_dir: Path, channel: str | None, book: RecipeBook | None,
          options: StackOptions, *, say: Progress = lambda _: None,
          early: EarlyVenv | None = None) -> StackStatus:
    """Install the channel's newest wheels together into a fresh venv and import them;
    the status is returned, not recorded (:func:`record`).  ``early``: a venv made
    beforehand from ``options.python`` (:class:`EarlyVenv`), used when it is ready."""
    records = index.load_records(index_dir)
    p = install_plan(records, index_dir=index_dir, url=None, channel=channel)
    pinned = {str(canonicalize_name(x.split("==", 1)[0])) for x in p.pins}
    chosen = [r for r in records if f"{r.project}=={r.version}" in p.pins]
    deps_from = (str(options.deps_dir) if options.deps_dir else
                 "the usual index (pip's configuration)")
    inputs = stackinputs.digest(index_dir, channel, book, options.python, options.deps_dir,
                                into.child_env(options.environ))
    make = _Maker(channel=channel, pins=p.pins, checked_at=_now(), python=str(options.python),
                  dependencies_from=deps_from, inputs=inputs)

    def not_checked(why: str) -> StackStatus:
        return make.status("not checked", why)

    try:
        tag = _proc.run([str(options.python), "-c",
                         "import sys; print('cp%d%d' % sys.version_info[:2])"],
                        timeout=60, env=options.environ).output.strip().splitlines()[-1]
    except (_proc.CommandFailed, IndexError) as exc:
        return not_checked(f"the interpreter {options.python} does not run ({exc})")
    misfits = [r for r in chosen if not is_pure(r.filename)
               and not interpreter_fits(r.filename, tag)]  # a cp310-abi3 wheel fits cp311
    if misfits:
        wanted = sorted({f"{t.interpreter}-{t.abi}" if t.abi == "abi3" else t.interpreter
                         for r in misfits for t in parse_wheel_filename(r.filename)[3]})
        return not_checked(f"the channel's wheels are for {', '.join(wanted)}, the interpreter "
                           f"{options.python} is {tag}: pass --python for a matching one")

    log = options.log_dir / f"stack-{channel or 'simple'}-{_now().replace(':', '')}.log"
    env = into.child_env(options.environ)
    ready = early.take(options.python) if early is not None else None
    if ready is not None:
        work, claimed, said = ready
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8", errors="replace") as f:
            f.write(f"$ {options.python} -m venv {work / 'venv'}  (made while the builds ran)\n"
                    + said)
    else:
        options.work_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="stack-", dir=options.work_dir))
        claimed = contextlib.ExitStack()  # a killed check's venv: `wheelforge clean` removes it
        claimed.enter_context(workdirs.claim(work))
    try:
        venv = work / "venv"
        if ready is not None:
            say(f"stack {channel or 'simple/'}: a fresh venv from {options.python} "
                "(made while the builds ran)")
        else:
            say(f"stack {channel or 'simple/'}: a fresh venv from {options.python}")
            _proc.run([str(options.python), "-m", "venv", str(venv)], env=env, log=log,
                      timeout=300)
        vpy = venv / "bin" / "python"
        # the steps of `wheelforge install`: the venv's pip.conf, the local wheels from the
        # local index alone, then their dependencies resolved by pip (written by uv from
        # its cache where it can: the venv is a scratch one)
        try:
            into.install(p, vpy, deps_dir=options.deps_dir, environ=env, log=log,
                         say=lambda text: say(f"stack {channel or 'simple/'}: {text}"),
                         files_by="uv")
        except InstallError as exc:
            if exc.stage == "local":
                return make.status("broken", f"the channel's own wheels did not install: "
                                             f"{exc.why}")
            if options.deps_dir is None and exc.unreachable:
                return not_checked(f"the dependencies could not be reached ({exc.why}); "
                                   "pass --deps-dir with their wheels to check offline")
            return make.status("broken", f"pip could not install the dependencies: {exc.why}")
        wheels = [index_dir / index.FILES_DIR / r.filename for r in chosen]
        modules = modules_to_import(book, wheels)
        say(f"stack {channel or 'simple/'}: importing {', '.join(modules)} in one interpreter"
            ", pip check beside it")
        # both only read the venv: pip check (1-2 s) runs while the imports do; its output
        # goes to the log after theirs
        checked: list[_proc.Completed | BaseException] = []
        checking = threading.Thread(target=_pip_check, args=(vpy, env, checked), daemon=True,
                                    name="wheelforge-pip-check")
        checking.start()
        try:
            imported = _proc.run([str(vpy), IMPORTER, json.dumps(modules)], env=env,
                                 log=log, check=False, timeout=IMPORT_TIMEOUT_S,
                                 cwd=work)
        finally:
            checking.join()
        if isinstance(checked[0], BaseException):
            raise checked[0]
        pip_check = checked[0]
        with open(log, "a", encoding="utf-8", errors="replace") as f:
            f.write(f"$ {vpy} -m pip check --disable-pip-version-check  (beside the imports)\n"
                    + pip_check.output)
        data = _proc.marked(imported.output, MARK)
        if not isinstance(data, dict):
            return make.status("broken", "the import check did not finish: "
                                      + into.last_error(imported.output))
        return _judge(data, pinned, pip_check, make, log, exited=imported.returncode)
    except _proc.CommandFailed as exc:
        return make.status("broken", f"{exc}: {into.last_error(exc.tail)}")
    finally:
        claimed.close()
        shutil.rmtree(work, ignore_errors=True)


def unchanged(index_dir: Path, channel: str | None, book: RecipeBook | None,
              options: StackOptions) -> StackStatus | None:
    """The channel's recorded status when it passed a check of exactly what :func:`check`
    would install and import now (:mod:`.stackinputs`), else None: a caller that published
    nothing may skip the check then, and says so (``stackinputs.skip_line``)."""
    inputs = stackinputs.digest(index_dir, channel, book, options.python, options.deps_dir,
                                into.child_env(options.environ))
    return stackinputs.unchanged(index_dir, channel, inputs)


def _pip_check(python: Path, env: Mapping[str, str],
               out: list[_proc.Completed | BaseException]) -> None:
    try:
        out.append(_proc.run([str(python), "-m", "pip", "check", "--disable-pip-version-check"],
                             env=env, check=False, timeout=300))
    except BaseException as exc:  # the caller raises it
        out.append(exc)


@dataclass(frozen=True, kw_only=True)
class _Maker:
    """The fields every status of one check shares."""

    channel: str | None
    pins: tuple[str, ...]
    checked_at: str
    python: str
    dependencies_from: str
    inputs: str = ""

    def status(self, state: health.StackState, reason: str = "", **kw: object) -> StackStatus:
        return StackStatus(channel=self.channel, pins=self.pins, checked_at=self.checked_at,
                           python=self.python, dependencies_from=self.dependencies_from,
                           inputs=self.inputs, state=state, reason=reason,
                           **kw)  # type: ignore[arg-type]


def _judge(data: Mapping[str, object], pinned: set[str], pip_check: _proc.Completed,
           make: _Maker, log: Path, exited: int = 0) -> StackStatus:
    """The status the import check's answer ``data`` and pip check's give; ``exited``:
    the exit status of the interpreter that imported (it answers before it ends, and a
    crash as it ends, in a library's teardown, ends a user's script the same way)."""
    dists = data.get("dists", {})
    assert isinstance(dists, dict)
    resolved = {name: str(info.get("version")) for name, info in sorted(dists.items())
                if name not in pinned and name not in ("pip", "setuptools", "wheel")}
    outcomes = []
    raw = data.get("imports", [])
    for item in raw if isinstance(raw, list) else []:
        outcomes.append(ImportOutcome(module=item["module"], ok=bool(item["ok"]),
                                      error=item.get("error", ""),
                                      through=tuple(item.get("through", []))))
    failed = [o for o in outcomes if not o.ok]
    reason, chains = "", []
    if failed:
        first = failed[0]
        culprit = next((d for d in first.through if d not in pinned), None)
        where = (f" in {first.through[-1]} {resolved.get(first.through[-1], '')}".rstrip()
                 if first.through else "")
        reason = f"import {first.module} failed: {first.error}{where}"
        if culprit is not None:
            chains = requirement_chains(dists, sorted(pinned), culprit)
            reason += (f"; through {' -> '.join(first.through)}; {culprit} is installed "
                       f"because {'; '.join(chains) or 'the user asked for it'}")
        if len(failed) > 1:
            reason += f" (and {len(failed) - 1} more failed import(s))"
    if exited != 0 and not reason:
        name = _proc.signal_name(exited)
        how = (f"was killed by {name}" if name else f"was killed by signal {-exited}"
               if exited < 0 else f"exited with status {exited}")
        reason = (f"every import succeeded, but the interpreter that imported them {how} "
                  "as it ended (a library's teardown: a user's script ends the same way)")
    check_text = "" if pip_check.returncode == 0 else pip_check.output.strip()[-2000:]
    if check_text and not reason:
        reason = "pip check: " + check_text.splitlines()[0][:300]
    state: health.StackState = "broken" if reason else "good"
    if reason:
        reason += f" (log: {log})"
    return make.status(state, reason, resolved=resolved, imports=tuple(outcomes),
                       pip_check=check_text, culprit_chains=tuple(chains))


def record(index_dir: Path, status: StackStatus) -> StackStatus | None:
    """Record ``status`` in the index and refresh the landing page, under the index lock;
    return the status it replaces (None when there was none)."""
    return index.record_stack(index_dir, status)


def changed_dependencies(before: StackStatus | None, after: StackStatus) -> list[str]:
    """"tilelang 0.1.8 -> 0.1.9" for each dependency whose resolved version moved since the
    last check (the nightly names them when a stack breaks)."""
    if before is None:
        return []
    out = []
    for name in sorted(set(before.resolved) | set(after.resolved)):
        old, new = before.resolved.get(name), after.resolved.get(name)
        if old != new:
            out.append(f"{name} {old or '(none)'} -> {new or '(none)'}")
    return out
