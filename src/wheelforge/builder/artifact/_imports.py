"""wheelforge's import check, run by its file path in the build environment's interpreter
(builder/artifact/importcheck.py; only the standard library: that environment may lack
wheelforge).  Its first act puts ``''`` where the interpreter put this file's directory,
as ``python -c`` has it: the working directory (the unpacked wheel) is first on the path,
and nothing beside this file shadows a module.

``python _imports.py check [--torch] MODULE...``: imports the modules (torch first with
``--torch``: an extension links against torch's libraries); prints one line per failed
import, exits 1 if any failed.

``python _imports.py serve SOCKET PRELOAD MARK``: the warm interpreter.  It imports PRELOAD
(torch) once and serves one JSON line per connection on SOCKET: ``{"dir": ...,
"modules": [...]}`` forks a child that answers on the connection (its output, then a MARK
line with its exit status).  It says when it started and when it is ready.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not getattr(sys.flags, "safe_path", False):  # 3.11+: -P
    sys.path[0] = ""

import importlib  # noqa: E402  (after the path is python -c's)
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from typing import Any  # noqa: E402


def check(modules: list[str]) -> int:
    bad = []
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as exc:
            bad.append(f"import {m} failed: {type(exc).__name__}: {exc}")
    print("\n".join(bad))
    return 1 if bad else 0


def child(conn: Any, request: dict[str, Any], mark: str) -> None:
    """A forked child's check of one request, answered on ``conn``; it never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the imports may wait for processes
    os.dup2(conn.fileno(), 1)
    os.dup2(conn.fileno(), 2)
    conn.close()
    import faulthandler
    faulthandler.enable()  # a crash in an extension's import says where
    where = request["dir"]
    os.environ["PYTHONPATH"] = where
    os.chdir(where)  # '' (the first path entry) is now the wheel's directory
    sys.path.insert(1 if sys.path[:1] == [""] else 0, where)  # as PYTHONPATH puts it
    importlib.invalidate_caches()
    code = 2
    try:
        code = check(request["modules"])
    finally:
        print(mark + json.dumps({"exit": code}))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def read_line(conn: Any) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return bytes(data)


def serve(path: str, preload: str, mark: str) -> None:
    import socket
    print(mark + json.dumps({"started": os.getpid()}), flush=True)
    importlib.import_module(preload)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the children reap themselves
    print(mark + json.dumps({"ready": os.getpid()}), flush=True)
    while True:
        conn, _ = server.accept()
        conn.settimeout(30)
        try:
            request = json.loads(read_line(conn) or b"null")
        except (OSError, ValueError):
            request = None
        conn.settimeout(None)
        if not isinstance(request, dict):
            conn.close()
            continue
        if os.fork() == 0:
            server.close()
            child(conn, request, mark)
        conn.close()


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        serve(argv[1], argv[2], argv[3])
        return 0
    modules = argv[1:]
    if modules[:1] == ["--torch"]:
        importlib.import_module("torch")  # the extension links against torch's libraries
        modules = modules[1:]
    return check(modules)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
