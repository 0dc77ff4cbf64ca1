"""Compiled bytecode for the build's imports of torch, where the caller's environment
says to write none.

Under ``PYTHONDONTWRITEBYTECODE=1`` (common in container images, and set on both of our
machines) an interpreter whose packages were installed without their ``.pyc`` files
(uv's default; the GPU machine's torch) compiles every module it imports from source,
every time: torch is ~1,000 modules, 1.8-2.0 s of each ``import torch`` (a build's
setup.py imports it before ninja starts; measured: docs/performance.md).  For the build
backend's process (setup.py), :func:`environ` lets the bytecode be written once:

* a **managed** environment is wheelforge's own: the variable is dropped, and Python
  writes each module's bytecode beside it on its first import, as it does by default;
* a **given** one (``--python``) is the user's: the variable is dropped and
  ``PYTHONPYCACHEPREFIX`` points at ``CACHE/pycache``, so the bytecode goes to
  wheelforge's cache (a mirror of the source paths), never into the user's environment
  or a source tree.  Where the environment already holds torch's bytecode
  (``torch/__pycache__``: pip compiles it when it installs) nothing changes: Python reads
  it under the variable too, and a prefix would make it compile everything once more.

A caller's own ``PYTHONPYCACHEPREFIX`` is kept as it is.  A wheel never holds bytecode
either way (bdist_wheel does not compile; tests/test_bytecode.py).

The import check's interpreters (builder/artifact/importcheck.py) run under the same environment:
``import mamba_ssm`` also imports triton and transformers, about 3 s of compiling from
source at every verify where their bytecode is never kept (measured: docs/performance.md).
The wheel's own modules are imported from a temporary directory; under a prefix their
bytecode would be left in the mirror of that directory, and :func:`forget` removes it
when the check is done.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

__all__ = ["PYCACHE", "environ", "forget"]

#: Where a given environment's bytecode goes, under the cache directory.
PYCACHE = "pycache"


def _has_torch_bytecode(python: Path) -> bool:
    """Whether the environment of ``python`` (PREFIX/bin/python) holds torch's bytecode
    beside its sources (PREFIX/lib/python*/site-packages/torch/__pycache__)."""
    prefix = Path(os.path.abspath(python)).parent.parent
    return any(prefix.glob("lib/python*/site-packages/torch/__pycache__"))


def environ(base: Mapping[str, str], *, python: Path, managed: bool,
            cache_dir: Path) -> dict[str, str]:
    """``base`` with what lets the interpreter ``python`` keep the bytecode it compiles
    (see the module's text); ``base`` itself when nothing needs to change."""
    out = dict(base)
    if not out.get("PYTHONDONTWRITEBYTECODE") or out.get("PYTHONPYCACHEPREFIX"):
        return out
    if managed:
        del out["PYTHONDONTWRITEBYTECODE"]
    elif not _has_torch_bytecode(python):
        del out["PYTHONDONTWRITEBYTECODE"]
        out["PYTHONPYCACHEPREFIX"] = str(cache_dir / PYCACHE)
    return out


def forget(environ: Mapping[str, str], directory: Path) -> None:
    """Remove the bytecode that interpreters run under ``environ`` wrote for the modules
    of ``directory`` (a temporary one) into the mirror under its ``PYTHONPYCACHEPREFIX``;
    nothing without a prefix (the bytecode is then inside ``directory``).  The mirror of
    both spellings of the path: an interpreter started in ``directory`` finds modules
    through its working directory, the resolved path."""
    prefix = environ.get("PYTHONPYCACHEPREFIX")
    if not prefix:
        return
    for spelling in {os.path.abspath(directory), os.path.realpath(directory)}:
        mirror = Path(prefix, spelling.lstrip(os.sep))
        if mirror != Path(prefix) and mirror.is_dir() and not mirror.is_symlink():
            shutil.rmtree(mirror, ignore_errors=True)
