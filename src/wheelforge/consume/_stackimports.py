"""The stack gate's importer (consume/stack.py: check; consume/gpustack.py), run by its file
path in the stack's scratch venv; only the standard library (that venv lacks wheelforge).
Its first act puts ``''`` where the interpreter put this file's directory, as ``python -c``
has it: the working directory is first on the path, and nothing beside this file shadows a
module.

``python _stackimports.py MODULES_JSON``: imports each module of the JSON list in this one
interpreter (``torch`` left out where no torch is installed) and prints one line: ``MARK``
and a JSON object, ``{"imports": [...], "dists": {...}}``: each import's outcome (a failed
one with its error, its traceback and the distributions its traceback went through, in
order) and each installed distribution's version and requirements.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not getattr(sys.flags, "safe_path", False):  # 3.11+: -P
    sys.path[0] = ""

import contextlib  # noqa: E402  (after the path is python -c's)
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import traceback  # noqa: E402
from importlib import metadata as md  # noqa: E402
from typing import Any  # noqa: E402

#: The answer's line starts with this.
MARK = "WHEELFORGE-STACK "


def norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def installed() -> tuple[dict[str, str], dict[str, Any]]:
    """Which distribution owns each installed .py and .so file (by real path), and each
    distribution's version and requirements."""
    files: dict[str, str] = {}
    dists: dict[str, Any] = {}
    for d in md.distributions():
        name = norm(d.metadata["Name"] or "")
        if not name:
            continue
        dists[name] = {"version": d.version, "requires": list(d.requires or [])}
        for f in d.files or []:
            if str(f).endswith((".py", ".so")):
                with contextlib.suppress(Exception):
                    files[os.path.realpath(str(d.locate_file(f)))] = name
    return files, dists


def failed(module: str, exc: BaseException, files: dict[str, str]) -> dict[str, Any]:
    """A failed import's outcome: the distributions its traceback went through (this
    file's own frames left out), its error and the traceback's end."""
    own = os.path.realpath(__file__)
    through: list[str] = []
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.realpath(frame.filename)
        owner = files.get(path) if path != own else None
        if owner and (not through or through[-1] != owner):
            through.append(owner)
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"module": module, "ok": False, "through": through,
            "error": f"{type(exc).__name__}: {exc}"[:600], "traceback": text[-6000:]}


def main(argv: list[str]) -> None:
    files, dists = installed()
    out = []
    for module in json.loads(argv[0]):
        if module == "torch" and "torch" not in dists:
            continue  # a stack without torch (pure test fixtures)
        try:
            importlib.import_module(module)
            out.append({"module": module, "ok": True})
        except BaseException as exc:
            out.append(failed(module, exc, files))
    print(MARK + json.dumps({"imports": out, "dists": dists}))


if __name__ == "__main__":
    main(sys.argv[1:])
