"""The import check of a built wheel: the build environment's interpreter imports the
wheel's modules from its unpacked files, torch first for an extension (the extension
links against torch's libraries).

Cold, :func:`cold_problems`: a fresh interpreter per check (the program
``_imports.py``, run by its file path).

Warm, :class:`WarmImports`: importing torch takes 2-4 s of one core, and a command
imported it once per extension it verified, at the end of each build, where a build's
last step runs with the other cores idle.  A command's warm interpreter imports torch once
per interpreter, while the compiles run, and then forks one child per check: the child
puts the wheel's directory first on its path, imports the wheel's modules as the cold
check does and reports on its connection; its own imports die with it, so each check
starts from the same state (an interpreter that imported torch and nothing of the
wheel's), as a fresh one would after its ``import torch``.  Forking after ``import torch``
is what torch's own DataLoader workers do: the import starts no threads and no CUDA.
The one difference from a fresh interpreter: torch is imported before the wheel's
directory is on the path, so a wheel that shipped a module torch imports (a top-level
``typing_extensions``) would not shadow it; a recipe's ``verify.top-level`` refuses such
wheels.

A warm interpreter serves only while its environment's site-packages directories are as
they were when it started (after an install into it, the next compile starts another), and any
check it cannot serve (it did not start, it died, the environment changed) runs cold.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from ... import _proc
from ..env.buildenv import site_stamp
from . import _imports

__all__ = ["WarmImports", "cold_problems"]

MARK = "wheelforge-import-check: "

#: The check, run by its file path: cold (``check``) and warm (``serve``), only the
#: standard library (the build environment may lack wheelforge).
PROGRAM = os.path.abspath(_imports.__file__)


def _check_args(modules: tuple[str, ...], extension: bool) -> list[str]:
    return [PROGRAM, "check", *(["--torch"] if extension else []), *modules]


def _problems(returncode: int, output: str) -> list[str]:
    if returncode == 0:
        return []
    lines = [ln for ln in output.splitlines() if ln.startswith("import ")]
    return lines or [f"the import check exited with {returncode}: {output.strip()[-300:]}"]


def _environ(where: Path | None, base: Mapping[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k != "PYTHONPATH"}
    env["PYTHONNOUSERSITE"] = "1"
    if where is not None:
        env["PYTHONPATH"] = str(where)
    return env


def cold_problems(python: Path, where: Path, modules: tuple[str, ...], extension: bool,
                  log: Path | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """A fresh ``python`` imports ``modules`` from the unpacked wheel at ``where``
    (``PYTHONPATH``, the working directory); the problems, one line per failed import.
    ``environ``: the interpreter's environment (default: this process's), as
    builder/env/bytecode.py makes it."""
    result = _proc.run([str(python), *_check_args(modules, extension)], cwd=where,
                       env=_environ(where, environ), check=False, log=log)
    return _problems(result.returncode, result.output)


class _Server:
    """One warm interpreter: its thread (the one subprocess helper runs it), its socket,
    and what it said until it was ready."""

    def __init__(self, python: Path, preload: str, environ: Mapping[str, str] | None) -> None:
        self.python = python
        self._environ = environ
        self._dir = Path(tempfile.mkdtemp(prefix="wf-imports-"))
        self.socket = self._dir / "s"
        self.pid: int | None = None  # once serving
        self.group: int | None = None  # once started: its process group (its session's)
        self.started = threading.Event()  # set when started, or when it ended without
        self.ready = threading.Event()  # set when serving, or when it ended without
        self.said: collections.deque[str] = collections.deque(maxlen=20)
        self._thread = threading.Thread(target=self._run, args=(preload,), daemon=True,
                                        name=f"wheelforge-imports-{python}")
        self._thread.start()

    def _run(self, preload: str) -> None:
        def on_line(line: str) -> None:
            answer = _proc.marked(line, MARK)
            if isinstance(answer, dict) and isinstance(answer.get("started"), int):
                self.group = answer["started"]
                self.started.set()
            elif isinstance(answer, dict) and isinstance(answer.get("ready"), int):
                self.pid = answer["ready"]
                self.ready.set()
            elif not line.startswith(MARK):
                self.said.append(line)

        try:
            _proc.run([str(self.python), PROGRAM, "serve", str(self.socket), preload, MARK],
                      cwd=self._dir, env=_environ(None, self._environ), on_line=on_line,
                      check=False, keep_output=False)
        except BaseException:  # stopped with the command: the checks run cold
            pass
        finally:
            self.pid = self.group = None
            self.started.set()
            self.ready.set()
            with contextlib.suppress(OSError):
                self.socket.unlink()
            with contextlib.suppress(OSError):
                self._dir.rmdir()

    def ask(self, where: Path, modules: tuple[str, ...]) -> tuple[int | None, str] | None:
        """The child's exit status (None: it died before answering, as a crash in an
        extension's import does) and output, or None when this interpreter cannot answer
        (it did not start or it has ended)."""
        self.ready.wait()
        if self.pid is None:
            return None
        request = json.dumps({"dir": str(where), "modules": list(modules)}) + "\n"
        chunks = []
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(str(self.socket))
                conn.sendall(request.encode("utf-8"))
                while chunk := conn.recv(65536):
                    chunks.append(chunk)
        except OSError:
            return None
        output = b"".join(chunks).decode("utf-8", errors="replace")
        answer = _proc.marked(output, MARK)
        if isinstance(answer, dict) and isinstance(answer.get("exit"), int):
            return answer["exit"], "\n".join(ln for ln in output.splitlines()
                                             if not ln.startswith(MARK))
        if _proc.stopping():
            raise KeyboardInterrupt
        return None, output  # the child died before its answer

    def stop(self) -> None:
        """Kill it, still importing or serving (its teardown would take a second, and
        nothing of it needs tidying): its process group, with any check's child."""
        self.started.wait(timeout=10)
        group = self.group
        if group is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        self._thread.join(timeout=10)


class WarmImports:
    """The warm interpreters of one command, one per interpreter (and state of its
    environment): :meth:`start` when a build's compile starts, :meth:`problems` at its
    verify, :meth:`close` at the end of the command.  Owns processes, hence a class."""

    def __init__(self, preload: str = "torch") -> None:
        self._preload = preload  # what every check imports first
        self._servers: dict[tuple[str, tuple[int, ...]], _Server] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> WarmImports:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _key(self, python: Path) -> tuple[str, tuple[int, ...]]:
        return os.path.abspath(python), site_stamp(python)

    def start(self, python: Path, environ: Mapping[str, str] | None = None) -> None:
        """Start ``python``'s warm interpreter unless it runs already; returns at once.
        ``environ``: its environment (default: this process's), as builder/env/bytecode.py
        makes it; the checks' children inherit it."""
        key = self._key(python)
        with self._lock:
            if not self._closed and key not in self._servers:
                self._servers[key] = _Server(python, self._preload, environ)

    def problems(self, python: Path, where: Path, modules: tuple[str, ...],
                 log: Path | None) -> list[str] | None:
        """The import check of the unpacked wheel at ``where`` in a child of ``python``'s
        warm interpreter (its output to ``log``), or None when none can serve it: then the
        caller checks cold."""
        with self._lock:
            server = self._servers.get(self._key(python))
        if server is None:
            return None
        answer = server.ask(where, modules)
        if answer is None:
            if log is not None:
                said = server.said[-1] if server.said else "it ended"
                with open(log, "a", encoding="utf-8", errors="replace") as f:
                    f.write(f"(the command's warm interpreter {python} could not serve the "
                            f"import check: {said}; it runs in a fresh interpreter)\n")
            return None
        code, output = answer
        if log is not None:
            with open(log, "a", encoding="utf-8", errors="replace") as f:
                f.write(f"$ import {', '.join(modules)} (from {where}) in a child of the "
                        f"command's warm interpreter {python} (pid {server.pid}, "
                        f"{self._preload} imported once)\n{output}"
                        + ("" if output.endswith("\n") or not output else "\n"))
        if code is None:
            return ["the import check's process died before it answered (a crash in an "
                    f"import?): {output.strip()[-300:]}"]
        return _problems(code, output)

    def running(self) -> Iterator[int]:
        """The process ids of the warm interpreters now serving."""
        with self._lock:
            servers = list(self._servers.values())
        return iter([s.pid for s in servers if s.pid is not None])

    def close(self) -> None:
        """Stop every warm interpreter (at the end of the command: no check runs)."""
        with self._lock:
            self._closed = True
            servers = list(self._servers.values())
            self._servers.clear()
        for server in servers:
            server.stop()
