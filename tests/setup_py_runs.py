"""Running an upstream project's setup.py against a stand-in torch: the helpers of the patch
tests (tests/test_*_patches.py), which reproduce each upstream failure on the unpatched
tree and show the fix on the patched one.

The stand-in torch (tests/packages/faketorch) records what setup.py asked of
``torch.utils.cpp_extension`` (sources, compile arguments, the CUDA home it saw) in a JSON
file instead of compiling; a fake toolkit answers ``nvcc --version``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from conftest import PACKAGES, REPO
from wheelforge.builder.source.fetch import extract
from wheelforge.builder.source.patch import apply_series
from wheelforge.recipe.format import RecipeBook
from wheelforge.recipe.model import ExtractLimits, Recipe

FAKE_TORCH = PACKAGES / "faketorch"
BOOK = RecipeBook(REPO / "recipes", REPO / "patches")
#: variables of this shell that would change what setup.py sees: cleared for every run
TOOLKIT_VARS = ("CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "NVCC_THREADS")

Recorded = dict[str, object] | None


def patched_trees(recipe: Recipe, archive: Path, base: Path,
                  limits: ExtractLimits | None = None) -> dict[str, Path]:
    """``{"unpatched": tree, "patched": tree}``: the recipe's source extracted twice under
    ``base``, its patch series applied to the second."""
    trees = {}
    for kind in ("unpatched", "patched"):
        trees[kind] = (extract(archive, base / kind) if limits is None
                       else extract(archive, base / kind, limits))
    apply_series(trees["patched"], recipe.patches, project=recipe.name)
    return trees


def make_fake_cuda(home: Path) -> Path:
    """A toolkit at ``home`` whose nvcc says release 13.0 and compiles nothing."""
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "include" / "cuda_runtime.h").write_text("")
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    return home


def pip_toolkit(tmp_path: Path, fake_cuda: Path) -> dict[str, str]:
    """Move the fake toolkit where NVIDIA's pip wheels put one (user site), hide
    /usr/local/cuda; the environment that makes setup.py see it so."""
    userbase = tmp_path / "userbase"
    site = userbase / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / \
        "site-packages" / "nvidia" / "cu13"
    site.parent.mkdir(parents=True)
    fake_cuda.rename(site)
    return {"PYTHONUSERBASE": str(userbase), "FAKE_HIDE_PREFIX": "/usr/local/cuda"}


def run_setup(tree: Path, tmp_path: Path, args: list[str], env: Mapping[str, str], *,
              clear: Iterable[str] = (), clear_prefixes: tuple[str, ...] = (),
              pythonpath: Iterable[Path] = (), timeout: float = 120,
              ) -> tuple[subprocess.CompletedProcess[str], Recorded]:
    """``python setup.py ARGS`` in ``tree`` with the stand-in torch; returns the process and
    what it recorded (None when setup.py never reached ``CUDAExtension``).  This shell's
    toolkit variables, ``clear`` and the variables starting with ``clear_prefixes`` are
    removed before ``env`` is applied."""
    record = tmp_path / "record.json"
    dropped = {*TOOLKIT_VARS, *clear}
    base = {k: v for k, v in os.environ.items()
            if k not in dropped and not (clear_prefixes and k.startswith(clear_prefixes))}
    base.update(PYTHONPATH=os.pathsep.join([str(FAKE_TORCH), *map(str, pythonpath)]),
                FAKE_TORCH_RECORD=str(record), PATH="/usr/bin:/bin",
                PYTHONDONTWRITEBYTECODE="1")
    base.update(env)
    proc = subprocess.run([sys.executable, "setup.py", *args], cwd=tree, env=base,
                          capture_output=True, text=True, timeout=timeout)
    data = json.loads(record.read_text()) if record.exists() else None
    if record.exists():
        record.unlink()
    return proc, data


def nvcc_flags(data: Recorded) -> list[str]:
    assert data is not None
    return list(data["extra_compile_args"]["nvcc"])  # type: ignore[index]


def cxx_flags(data: Recorded) -> list[str]:
    assert data is not None
    return list(data["extra_compile_args"]["cxx"])  # type: ignore[index]


def gencodes(data: Recorded) -> list[str]:
    """The ``-gencode`` values of the nvcc arguments."""
    args = nvcc_flags(data)
    return [args[i + 1] for i, a in enumerate(args) if a == "-gencode"]


def threads(data: Recorded) -> str:
    """The value of nvcc's ``--threads``."""
    args = nvcc_flags(data)
    return str(args[args.index("--threads") + 1])


def std_flags(data: Recorded) -> tuple[str, str]:
    """The one ``-std=`` of g++ and of nvcc."""
    cxx = [a for a in cxx_flags(data) if a.startswith("-std=")]
    nvcc = [a for a in nvcc_flags(data) if a.startswith("-std=")]
    assert len(cxx) == len(nvcc) == 1
    return cxx[0], nvcc[0]
