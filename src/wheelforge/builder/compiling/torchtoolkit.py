"""The CUDA toolkit a torch needs: the managed one of that torch's CUDA, or a system one.

``wheelforge build --python VENV`` reads the CUDA of that venv's torch (``torch.version.cuda``
from ``torch/version.py``, without importing torch or its CUDA libraries) and compiles with
PyPI's ``cuda-toolkit[...]==MAJOR.MINOR.*`` of it (where the toolkit setting lets the
managed one be used).  PyPI has no CUDA 12 nvcc (``nvidia-cuda-nvcc-cu12`` holds only
ptxas, libnvvm and libdevice), so a CUDA 12 torch (PyPI's torch 2.9.1 and 2.10.0 are
CUDA 12.8 builds) needs a system CUDA 12 toolkit, named with ``--cuda-home PATH`` or
``toolkit: {cuda-home: PATH}``; without one the error says so.

A toolkit named by its directory is trusted only as far as its owner: its directory,
``bin`` and ``bin/nvcc`` (links resolved) must belong to root or to you and be writable by
no one else, or another local user could put a compiler of theirs into your builds.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ...errors import ToolchainError
from ..env import buildenv, toolkit
from . import toolchain

#: The first CUDA major whose nvcc is on PyPI.
MANAGED_MIN_MAJOR = 13


def has_managed(cuda: str) -> bool:
    """Whether PyPI holds a whole toolkit (nvcc, cicc, fatbinary) for CUDA ``cuda``."""
    try:
        return Version(cuda).major >= MANAGED_MIN_MAJOR
    except InvalidVersion:
        return False


def major_minor(cuda: str) -> str:
    release = (*Version(cuda).release, 0)
    return f"{release[0]}.{release[1]}"


def system_toolkit_fix(cuda: str) -> str:
    """What to do for a torch of CUDA ``cuda`` that no managed toolkit serves."""
    mm = major_minor(cuda)
    home = f"/usr/local/cuda-{mm}"
    return (f"install a CUDA {mm} toolkit on this builder (NVIDIA's cuda-toolkit-"
            f"{mm.replace('.', '-')} package or runfile, which installs {home}) and pass "
            f"--cuda-home {home}, or set toolkit: {{cuda-home: {home}}} (defaults of "
            f"wheelforge.yaml, or the matrix pin); or use a CUDA {MANAGED_MIN_MAJOR} torch "
            f"(PyPI's torch 2.11.0 and newer)")


def no_managed_toolkit(what: str, cuda: str) -> ToolchainError:
    major = Version(cuda).major
    return ToolchainError(
        what,
        why=f"the managed toolkit comes from PyPI, and PyPI has no CUDA {major} nvcc: "
            f"nvidia-cuda-nvcc-cu{major} holds only ptxas, libnvvm and libdevice (no nvcc, "
            "cicc or fatbinary)",
        fix=system_toolkit_fix(cuda))


@dataclass(frozen=True)
class Choice:
    """The toolkit setting for one torch: ``mode`` (auto, managed, system), the managed
    requirement, and why ("" when the setting was taken as it was)."""

    mode: str
    requirement: str
    why: str = ""


def for_torch(mode: str, requirement: str, torch_cuda: str | None, torch: str,
              cuda_home: Path | None = None) -> Choice:
    """The toolkit setting for ``torch`` (``torch 2.10.0 in /venv/bin/python``, a matrix
    pin): the managed requirement of its CUDA; a system toolkit alone for a CUDA 12
    torch; ``cuda_home``, a system toolkit named by its directory."""
    check_cuda_text(torch_cuda, torch)
    if cuda_home is not None:
        return Choice("system", requirement)
    if torch_cuda is None or mode == "system":
        return Choice(mode, requirement)  # a CPU torch, or a system toolkit: checked after
    if not has_managed(torch_cuda):
        if mode == "managed":
            raise no_managed_toolkit(f"{torch} is a CUDA {torch_cuda} build: there is no "
                                     "managed toolkit for it", torch_cuda)
        return Choice("system", requirement, f"{torch} is a CUDA {torch_cuda} build; PyPI has "
                                             "no CUDA 12 nvcc: a system toolkit")
    req = toolkit.requirement(major_minor(torch_cuda))
    return Choice(mode, req, f"{req} where managed: the CUDA {torch_cuda} of {torch}")


def for_python(python: Path, mode: str, requirement: str,
               cuda_home: Path | None = None) -> Choice:
    """:func:`for_torch` of the torch installed in the interpreter ``python`` (read from
    its torch/version.py); the setting as it is when it holds no torch (`doctor` says
    so in its torch line)."""
    try:
        env = buildenv.inspect_env(python, import_torch=False)
    except ToolchainError:
        return Choice(mode, requirement)
    return for_torch(mode, requirement, env.torch_cuda,
                     f"torch {env.torch_version} in {python}", cuda_home)


def check_cuda_text(torch_cuda: object, torch: str) -> None:
    """A ToolchainError when a torch's ``torch.version.cuda`` is not ``MAJOR.MINOR``."""
    if torch_cuda is None:
        return
    if not isinstance(torch_cuda, str) or not re.fullmatch(r"\d{1,3}\.\d{1,3}(\.\d{1,4})?",
                                                           torch_cuda):
        raise ToolchainError(f"{torch} says its CUDA is {str(torch_cuda)[:80]!r}",
                             why="torch.version.cuda of a CUDA build is MAJOR.MINOR (13.0)",
                             fix="reinstall torch in that environment")


def toolkit_environ(environ: Mapping[str, str], cuda_home: Path | None) -> dict[str, str]:
    """``environ`` with ``CUDA_HOME`` at ``cuda_home`` (checked: :func:`check_cuda_home`)."""
    out = dict(environ)
    if cuda_home is not None:
        check_cuda_home(cuda_home)
        out.pop("CUDA_PATH", None)
        out["CUDA_HOME"] = str(cuda_home)
    return out


def check_cuda_home(home: Path) -> None:
    """A ToolchainError when another user could change the toolkit at ``home``: its
    directory, ``bin`` and ``bin/nvcc`` (links resolved), and every directory above
    them, which another user could otherwise rename away and replace after this check
    (a sticky directory such as /tmp lets no one rename another's entries)."""
    real_home = Path(os.path.realpath(home))
    above = [d for d in real_home.parents if d != Path(d.anchor)]
    for path in (home, home / "bin", home / "bin" / "nvcc", *above):
        real = Path(os.path.realpath(path))
        try:
            st = os.stat(real)
        except OSError:
            continue  # not there: find_cuda says what is missing
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if real in above and st.st_mode & stat.S_ISVTX:
            writable = 0  # sticky: others may add entries, never move yours
        if st.st_uid not in (0, os.geteuid()) or writable:
            raise ToolchainError(
                f"the CUDA toolkit at {home} is not trusted: {real} belongs to uid "
                f"{st.st_uid} with mode {stat.filemode(st.st_mode)}",
                why="a toolkit that another user owns or may write could run their "
                    "programs as your builds' compiler",
                fix="use a toolkit owned by root or by you and writable by no one else (e.g. "
                    "the /usr/local/cuda-X.Y NVIDIA's packages install)")


def find(choice: Choice, *, cache_dir: Path, cuda_home: Path | None,
         torch_cuda: str | None, torch: str, environ: Mapping[str, str],
         say: Callable[[str], None] = lambda _m: None, log: Path | None = None,
         finder: Callable[..., toolchain.Cuda] | None = None) -> toolchain.Cuda:
    """The toolkit of ``choice`` (toolchain.find_toolkit, or ``finder`` with its
    arguments), its CUDA major checked against the torch's (known beforehand:
    ``--python``, a matrix pin) before anything compiles."""
    check_cuda_text(torch_cuda, torch)
    env = toolkit_environ(environ, cuda_home)
    try:
        cuda = (finder or toolchain.find_toolkit)(
            choice.mode, cache_dir=cache_dir, requirement=choice.requirement, environ=env,
            say=say, log=log)
    except ToolchainError as exc:
        if torch_cuda is None or has_managed(torch_cuda) or cuda_home is not None:
            raise
        err = no_managed_toolkit(f"{torch} is a CUDA {torch_cuda} build and no CUDA toolkit "
                                 f"was found ({exc.what})", torch_cuda)
        err.why += f"; {exc.why}" if exc.why else ""
        raise err from None
    if choice.why:
        cuda = dataclasses.replace(cuda, choice=f"{cuda.choice}; {choice.why}")
    check_major(cuda, torch_cuda, torch)
    return cuda


def check_major(cuda: toolchain.Cuda, torch_cuda: str | None, torch: str) -> None:
    """A ToolchainError when ``torch`` (of CUDA ``torch_cuda``) and the toolkit differ in
    their CUDA major, saying which toolkit that torch needs."""
    if torch_cuda is not None and Version(torch_cuda).major != cuda.version.major:
        fix = (system_toolkit_fix(torch_cuda) if not has_managed(torch_cuda) else
               f"leave the toolkit to wheelforge (--toolkit managed: PyPI's "
               f"{toolkit.requirement(major_minor(torch_cuda))}), or point --cuda-home at a "
               f"CUDA {Version(torch_cuda).major}.x toolkit")
        raise ToolchainError(
            f"{torch} is built for CUDA {torch_cuda} but the toolkit at {cuda.home} is CUDA "
            f"{cuda.version}",
            why="torch's extension builder refuses an nvcc of another CUDA major than "
                "torch's, and such an extension would not load",
            fix=fix)
