"""Find the CUDA toolkit and check it can build what was asked, before compiling.

Compatibility rules are data (the tables below), not code paths.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from ... import _proc
from ...arch import Arch, min_cuda
from ...errors import ToolchainError
from ..env import toolkit

#: Where nvcc may live, in search order, besides CUDA_HOME / CUDA_PATH / PATH.
STANDARD_PREFIXES = ("/usr/local/cuda",)


@dataclass(frozen=True)
class Cuda:
    """A CUDA toolkit: ``home`` holds ``bin/nvcc`` and ``include/cuda_runtime.h``."""

    home: Path
    nvcc: Path
    version: Version
    origin: str
    #: a managed toolkit's exact distributions (name, version); () for a system toolkit
    toolkit: tuple[tuple[str, str], ...] = ()
    #: why this toolkit (the ``toolkit`` setting, and what ``auto`` found)
    choice: str = "toolkit: system"

    def describe_toolkit(self) -> str:
        """The toolkit's exact versions, for the build key, the SBOM and the printed
        inputs: the managed wheels', else ``system nvcc X.Y at PATH``."""
        if self.toolkit:
            return "managed " + ", ".join(f"{n} {v}" for n, v in self.toolkit)
        return f"system nvcc {self.version} at {self.home}"


def _candidates(environ: Mapping[str, str]) -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if environ.get(var):
            out.append((f"${var}", Path(environ[var])))
    nvcc = shutil.which("nvcc", path=environ.get("PATH"))
    if nvcc:
        out.append(("nvcc on PATH", Path(nvcc).parent.parent))
        real = Path(os.path.realpath(nvcc))
        if str(real) != nvcc:
            out.append(("nvcc on PATH (resolved)", real.parent.parent))
        wrapped = _wrapped_nvcc(Path(nvcc))
        if wrapped:
            out.append(("nvcc on PATH (wrapper target)", wrapped.parent.parent))
    out.extend(("standard prefix", Path(p)) for p in STANDARD_PREFIXES)
    return out


def _wrapped_nvcc(script: Path) -> Path | None:
    """A tiny shell wrapper like ``exec /usr/local/cuda-13.0/bin/nvcc "$@"``."""
    try:
        if script.stat().st_size > 4096:
            return None
        text = script.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = re.search(r"exec\s+(\S+/bin/nvcc)\b", text)
    return Path(m.group(1)) if m else None


def find_cuda(environ: Mapping[str, str] | None = None) -> Cuda:
    """Locate nvcc; raise ToolchainError listing every place searched."""
    env = os.environ if environ is None else environ
    # torch's extension builder takes $CUDA_HOME, else $CUDA_PATH, as given: one that is not
    # a toolkit is an error, never a reason to build with another toolkit found elsewhere
    var = next((v for v in ("CUDA_HOME", "CUDA_PATH") if env.get(v)), None)
    if var is not None and not _is_toolkit(Path(env[var])):
        home = Path(env[var])
        why = (f"{home} does not exist" if not home.exists()
               else f"{home} has no bin/nvcc" if not os.access(home / "bin" / "nvcc", os.X_OK)
               else f"{home} has no include/cuda_runtime.h")
        raise ToolchainError(
            f"{var}={home} is not a CUDA toolkit",
            why=why + " (a toolkit is a directory with bin/nvcc and include/cuda_runtime.h; "
                f"torch's extension builder would use ${var} as given)",
            fix=f"point {var} at a toolkit (e.g. {var}=/usr/local/cuda-13.0), or unset it to "
                "use the nvcc on PATH")
    searched: list[str] = []
    for origin, home in _candidates(env):
        nvcc = home / "bin" / "nvcc"
        if _is_toolkit(home):
            return Cuda(home=home, nvcc=nvcc, version=nvcc_version(nvcc), origin=origin)
        searched.append(f"{origin}: {home}")
    raise ToolchainError(
        "nvcc, the CUDA compiler, was not found",
        why="searched " + "; ".join(searched) + " (a toolkit is a directory with bin/nvcc and "
            "include/cuda_runtime.h)",
        fix="install the CUDA toolkit (12.8 or newer for Blackwell) and set CUDA_HOME, e.g. "
            "CUDA_HOME=/usr/local/cuda-13.0",
    )


def _is_toolkit(home: Path) -> bool:
    return os.access(home / "bin" / "nvcc", os.X_OK) and (home / "include" /
                                                          "cuda_runtime.h").is_file()


def nvcc_version(nvcc: Path) -> Version:
    try:
        out = _proc.run([str(nvcc), "--version"]).output
    except _proc.CommandFailed as exc:
        raise ToolchainError(f"{nvcc} --version failed", why=exc.tail.strip(),
                             fix="check the CUDA installation") from exc
    m = re.search(r"release (\d+\.\d+)", out)
    if not m:
        raise ToolchainError(f"cannot read the CUDA version from {nvcc} --version",
                             why=out.strip()[:200], fix="check the CUDA installation")
    return Version(m.group(1))


def host_compiler(environ: Mapping[str, str] | None = None) -> str:
    """The first line of ``$CXX --version`` (default ``c++``, what torch's extension
    builder runs), e.g. ``g++ (Ubuntu 13.3.0-6ubuntu2~24.04) 13.3.0``; "" when there is
    none.  It decides which glibc and libstdc++ symbol versions a wheel needs."""
    environ = os.environ if environ is None else environ
    cxx = environ.get("CXX") or "c++"
    found = shutil.which(cxx, path=environ.get("PATH"))
    if found is None:
        return ""
    result = _proc.run([found, "--version"], check=False, timeout=60)
    first = result.output.strip().splitlines()[:1]
    return first[0].strip() if result.returncode == 0 and first else ""


def nvcc_help(nvcc: Path) -> str:
    """``nvcc --help`` ("" when it fails), asked once per nvcc binary and process: the
    options a build gives nvcc are those it lists (builder/artifact/reproducible.py's,
    builder/compiling/jobserver.py's)."""
    try:
        st = nvcc.stat()
    except OSError:
        return ""
    key = (str(nvcc), st.st_mtime_ns, st.st_size)
    with _HELP_LOCK:
        if key not in _HELP:
            try:
                _HELP[key] = _proc.run([str(nvcc), "--help"], timeout=60).output
            except _proc.CommandFailed:
                _HELP[key] = ""
        return _HELP[key]


_HELP: dict[tuple[str, int, int], str] = {}
_HELP_LOCK = threading.Lock()


def supported_sass(nvcc: Path) -> frozenset[str]:
    """Ask nvcc which real architectures it can compile for (``sm_120`` ...)."""
    try:
        out = _proc.run([str(nvcc), "--list-gpu-code"]).output
    except _proc.CommandFailed:
        return frozenset()
    return frozenset(line.strip() for line in out.split() if line.strip().startswith("sm_"))


def check_archs(cuda: Cuda, archs: tuple[Arch, ...]) -> None:
    """Fail before compiling if nvcc cannot emit code for an arch."""
    problems, needs, unlisted = [], [], []
    known = supported_sass(cuda.nvcc)
    for arch in archs:
        base = f"sm_{arch.major}{arch.minor}"
        need = min_cuda(arch)
        if need is not None and cuda.version < Version(need):
            problems.append(f"{arch} needs CUDA {need} or newer, nvcc is {cuda.version}")
            needs.append(Version(need))
        elif known and base not in known:
            problems.append(f"{arch}: nvcc {cuda.version} does not list {base} in --list-gpu-code")
            unlisted.append(str(arch))
    if problems:
        fixes = []
        if needs:
            fixes.append(f"install CUDA {max(needs)} or newer and point CUDA_HOME at it (e.g. "
                         f"CUDA_HOME=/usr/local/cuda-{max(needs)})")
        if unlisted:
            fixes.append(f"use a toolkit whose nvcc --list-gpu-code lists {', '.join(unlisted)}")
        raise ToolchainError(
            f"nvcc at {cuda.nvcc} cannot compile for the requested architectures",
            why="; ".join(problems),
            fix=", or ".join(fixes) + ", or change --arch",
        )


def check_torch_cuda(cuda: Cuda, torch_cuda: str | None, torch_version: str) -> None:
    """torch and nvcc must share the CUDA major version."""
    if torch_cuda is None:
        raise ToolchainError(
            f"torch {torch_version} in the build environment is a CPU-only build",
            why="a CUDA extension must be built against a CUDA build of torch",
            fix="install a CUDA build of torch (e.g. from the cu130 index) or use the managed "
                "environment (leave out --python)",
        )
    if Version(torch_cuda).major != cuda.version.major:
        raise ToolchainError(
            f"torch {torch_version} is built for CUDA {torch_cuda} but nvcc is CUDA {cuda.version}",
            why="an extension built with a different CUDA major than torch's fails to build or "
                "to load",
            fix=f"point CUDA_HOME at a CUDA {Version(torch_cuda).major}.x toolkit, or use a torch "
                f"build for CUDA {cuda.version.major}",
        )


def find_toolkit(mode: str, *, cache_dir: Path, requirement: str,
                 pip_args: tuple[str, ...] = (), environ: Mapping[str, str] | None = None,
                 say: Callable[[str], None] = lambda _m: None,
                 log: Path | None = None) -> Cuda:
    """The toolkit a build compiles with, its ``origin`` saying which and why.

    ``system``: :func:`find_cuda`'s.  ``managed``: PyPI's ``requirement``
    (builder/env/toolkit.py), installed once under ``cache_dir``.  ``auto``: a system
    toolkit where :func:`find_cuda` finds one (a ``CUDA_HOME`` that is not a toolkit stays
    an error), else the managed one."""
    env = os.environ if environ is None else environ
    if mode == "system":
        return dataclasses.replace(find_cuda(env), choice="toolkit: system")
    why = "toolkit: managed"
    if mode == "auto":
        try:
            found = find_cuda(env)
        except ToolchainError as exc:
            if any(env.get(v) for v in ("CUDA_HOME", "CUDA_PATH")):
                raise
            why = f"toolkit: auto, and no system toolkit ({exc.what}: {exc.why})"
        else:
            return dataclasses.replace(
                found, choice="toolkit: auto, and a system toolkit was found; --toolkit "
                              "managed compiles with PyPI's")
    managed = toolkit.ensure(cache_dir, requirement, pip_args=pip_args, say=say, log=log)
    nvcc = managed.home / "bin" / "nvcc"
    return Cuda(home=managed.home, nvcc=nvcc, version=nvcc_version(nvcc),
                origin=f"managed {requirement}", toolkit=managed.versions, choice=why)
