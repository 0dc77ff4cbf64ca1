"""wheelforge's probe of an interpreter (builder/env/buildenv.py: inspect_env), run by its
file path in that interpreter; only the standard library (it may lack wheelforge).  Its
first act puts ``''`` where the interpreter put this file's directory, as ``python -c``
has it.

``python _probe.py [--torch | --torch-version]``: prints one JSON line: the interpreter,
its version and tag, its distributions and, with ``--torch``, torch's version and CUDA
(imported), with ``--torch-version`` the same read from ``torch/version.py`` alone.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not getattr(sys.flags, "safe_path", False):  # 3.11+: -P
    sys.path[0] = ""

import importlib.metadata as md  # noqa: E402  (after the path is python -c's)
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from typing import Any  # noqa: E402


def torch_imported(info: dict[str, Any]) -> None:
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
    except Exception as exc:
        info["torch_error"] = f"{type(exc).__name__}: {exc}"


def torch_version_read(info: dict[str, Any]) -> None:
    """torch/version.py alone: torch is not imported."""
    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("No module named 'torch'")
        path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
        found: dict[str, Any] = {}
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), found)
        info["torch"] = str(found["__version__"])
        info["torch_cuda"] = found.get("cuda")
    except Exception as exc:
        info["torch_error"] = f"{type(exc).__name__}: {exc}"


def main(argv: list[str]) -> None:
    info: dict[str, Any] = {
        "python": sys.executable,
        "version": ".".join(str(n) for n in sys.version_info[:3]),
        "tag": "cp{}{}".format(*sys.version_info[:2]),
        "dists": {},
        "torch": None, "torch_cuda": None, "torch_error": None,
    }
    for d in md.distributions():
        name = d.metadata["Name"]
        if name:
            info["dists"][name.lower().replace("_", "-").replace(".", "-")] = d.version
    if "--torch" in argv:
        torch_imported(info)
    elif "--torch-version" in argv:
        torch_version_read(info)
    print(json.dumps(info))


if __name__ == "__main__":
    main(sys.argv[1:])
