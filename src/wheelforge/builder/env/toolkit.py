"""The managed CUDA toolkit: NVIDIA's ``cuda-toolkit`` wheels from PyPI, like torch's own.

``cuda-toolkit[nvcc,cudart,cccl,crt,nvvm]==13.0.*`` holds nvcc, cudafe++, fatbinary,
nvlink, ptxas, cicc, the CUDA headers, cub/thrust/libcu++ and cudart (271 MB), all under
``nvidia/cu13/``.  It is installed once per requirement (and pip configuration) with uv
into ``CACHE/toolkits/KEY/site`` (``uv pip install --target``, files hard-linked from
uv's cache: no second copy per toolkit directory), and ``CACHE/toolkits/KEY/cuda`` is laid
out as a toolkit at ``CUDA_HOME`` is for torch's extension builder and for nvcc's own
``nvcc.profile``: ``bin``, ``include``, ``nvvm`` and ``lib`` are links into the wheels'
tree, ``lib64`` a directory of links to ``lib``'s files with the ``libcudart.so`` the
linker's ``-lcudart`` needs (the wheel holds ``libcudart.so.13`` only).  The directory is
made under a temporary name and renamed into place complete, its marker naming the exact
versions installed: those go into the build key and the SBOM.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from ... import _proc
from ..._fs import ZIP_EPOCH, atomic_write, date_tree, locked
from ...errors import ToolchainError
from . import buildenv

#: The parts of NVIDIA's meta-package a build needs (the compiler drivers, the runtime,
#: the C++ core libraries, the front end's headers, cicc).
PARTS = ("nvcc", "cudart", "cccl", "crt", "nvvm")
MARKER = "toolkit.json"


def requirement(cuda: str) -> str:
    """PyPI's toolkit for a torch built for CUDA ``cuda`` (``13.0``)."""
    return f"cuda-toolkit[{','.join(PARTS)}]=={cuda}.*"


@dataclass(frozen=True)
class ManagedToolkit:
    """A managed toolkit: ``home`` (what ``CUDA_HOME`` is set to), the requirement it was
    installed from and the exact versions installed (name, version), sorted."""

    home: Path
    requirement: str
    versions: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        return ", ".join(f"{n} {v}" for n, v in self.versions)


def toolkit_key(req: str, pip_args: Sequence[str]) -> str:
    blob = json.dumps([req, list(pip_args), sys.platform])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure(cache_dir: Path, req: str, *, pip_args: Sequence[str] = (),
           say: Callable[[str], None] = lambda _m: None,
           log: Path | None = None) -> ManagedToolkit:
    """The toolkit of ``req`` under ``cache_dir``, installed (once) if it is not there."""
    root = cache_dir / "toolkits"
    root.mkdir(parents=True, exist_ok=True)
    key = toolkit_key(req, pip_args)
    final = root / key
    with locked(root / f"{key}.lock"):
        found = read(final)
        if found is not None:
            date_tree(final / "site", ZIP_EPOCH)  # one made before its files were dated
            return found
        if final.exists() or final.is_symlink():  # an unfinished one: never trusted
            _remove(final)
        temp = root / f".{key}.tmp-{os.getpid()}"
        _remove(temp)
        try:
            say(f"installing the CUDA toolkit {req} into {final}")
            _install(req, temp / "site", pip_args, say, log)
            # dated at the zip epoch, not when uv unpacked them here: nvcc's line tables
            # hold each header's date (docs/reproducible.md)
            date_tree(temp / "site", ZIP_EPOCH)
            versions = installed_versions(temp / "site")
            make_layout(temp / "site", temp / "cuda")
            atomic_write(temp / MARKER, json.dumps(
                {"requirement": req, "versions": [list(v) for v in versions]}, indent=1))
            os.rename(temp, final)
        finally:
            _remove(temp)
    done = read(final)
    assert done is not None
    return done


def read(directory: Path) -> ManagedToolkit | None:
    """The toolkit at ``directory``, or None when it is not a complete one, or not a
    directory of this user's own (a link put in its place is never followed: the
    build would run its nvcc)."""
    try:
        st = os.lstat(directory)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return None
    try:
        data = json.loads((directory / MARKER).read_text(encoding="utf-8"))
        versions = tuple((str(n), str(v)) for n, v in data["versions"])
        req = str(data["requirement"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    home = directory / "cuda"
    if not (os.access(home / "bin" / "nvcc", os.X_OK)
            and (home / "include" / "cuda_runtime.h").is_file()):
        return None
    return ManagedToolkit(home=home, requirement=req, versions=versions)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _install(req: str, target: Path, pip_args: Sequence[str], say: Callable[[str], None],
             log: Path | None) -> None:
    installer = buildenv.choose_installer(Path(sys.executable), pip_args)
    if installer.uv is not None and installer.uv_args is not None:
        argv = [str(installer.uv), "pip", "install", "--no-config", "--python",
                sys.executable, "--target", str(target), "--link-mode", "hardlink",
                *installer.uv_args.args, req]
        env: dict[str, str] | None = buildenv.uv_environ(installer)
    else:
        argv = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
                "--progress-bar", "off", *buildenv.PIP_NET_ARGS, *pip_args,
                "--target", str(target), req]
        env = None
    try:
        _proc.run(argv, env=env, log=log, on_line=lambda line: _progress(line, say))
    except _proc.CommandFailed as exc:
        raise ToolchainError(
            f"could not install the CUDA toolkit {req}",
            why=exc.tail.strip()[-800:],
            fix="check that PyPI (or the index in pip's configuration) is reachable and "
                "holds this toolkit; or build with a system toolkit: --toolkit system "
                "(CUDA_HOME=/usr/local/cuda-13.0)",
            log=str(log) if log else None) from exc


def _progress(line: str, say: Callable[[str], None]) -> None:
    text = line.strip()
    if text.startswith(("Resolved ", "Installed ", "Successfully installed")):
        say(text[:120])


def installed_versions(site: Path) -> tuple[tuple[str, str], ...]:
    """(name, version) of every distribution installed in ``site``, sorted."""
    out = []
    for info in site.glob("*.dist-info"):
        name, _, version = info.name.removesuffix(".dist-info").partition("-")
        out.append((str(canonicalize_name(name)), version))
    return tuple(sorted(out))


def wheel_tree(site: Path) -> Path:
    """``site/nvidia/cuNN``, the wheels' toolkit tree: the one with ``bin/nvcc``."""
    for tree in sorted((site / "nvidia").glob("cu[0-9]*")):
        if (tree / "bin" / "nvcc").is_file():
            return tree
    raise ToolchainError(f"the CUDA toolkit installed in {site} has no nvidia/cu*/bin/nvcc",
                         why="the installed wheels do not hold nvcc (a CUDA 12 toolkit from "
                             "PyPI holds only ptxas, libnvvm and libdevice)",
                         fix="use a CUDA 13 toolkit requirement, or a system toolkit: "
                             "--toolkit system with CUDA_HOME set")


def make_layout(site: Path, home: Path) -> None:
    """``home`` laid out as ``CUDA_HOME``, links (relative, so the directory can be
    renamed) into the wheels' tree under ``site``."""
    tree = wheel_tree(site)
    home.mkdir(parents=True)
    for part in ("bin", "include", "nvvm", "lib"):
        if (tree / part).is_dir():
            os.symlink(os.path.relpath(tree / part, home), home / part)
    lib64 = home / "lib64"
    lib64.mkdir()
    libs = tree / "lib"
    for entry in sorted(libs.iterdir()) if libs.is_dir() else ():
        os.symlink(os.path.relpath(entry, lib64), lib64 / entry.name)
    for so in sorted(libs.glob("lib*.so.[0-9]*")) if libs.is_dir() else ():
        plain = lib64 / (so.name.split(".so.")[0] + ".so")  # the linker's -lNAME
        if not plain.exists():
            os.symlink(so.name, plain)
